"""Statistics of a trajectory batch (docs/architecture.md §5) over all trainer ranks, for the stats row."""

from __future__ import annotations

import torch

from arealite import world
from arealite.stats.tracker import StatsTracker


def batch_stats(tracker: StatsTracker, batch: dict[str, torch.Tensor], version: int | None = None) -> dict[str, float]:
    """What the batch's responses look like, over every rank's sequences; collective.

    `reward`, `response_len` and `prompt_len` (means, with `_max`/`_min`); `response_len_p50`
    and `response_len_p95` (nearest-rank percentiles over every rank's responses); `truncated_frac`,
    the fraction of responses that ran out of `max_new_tokens` (when the workflow reports
    `truncated`); and with the trainer's weight `version`, `staleness`: how many versions
    behind it the policy that sampled each trained token is (0 when synchronous); with per-token
    `versions`, `mixed_version_frac`: the fraction of responses whose tokens come from two or
    more weight versions (a weight sync landed mid-answer and generation went on); with the
    reference model's `ref_logp`, `kl_ref`: the sampled tokens' mean `logprobs - ref_logp`
    (an estimate of KL(behaviour policy || reference)); with the distillation teacher's
    `teacher_logp`, `kl_teacher`: the same against the teacher, the per-token reverse KL that
    distillation lowers (arealite/algo/distill.py). It reads the responses as the workflow
    made them (`response_mask`, which `compute_advantages` keeps when it drops truncated
    responses from `loss_mask`), so it may run before or after `compute_advantages`.
    """
    attn = batch["attention_mask"].bool()  # [B, T]
    loss_mask = response_mask(batch)  # [B, T]
    response_len = loss_mask.sum(-1).float()  # [B]
    tracker.masked_mean("reward", batch["rewards"].float())
    tracker.masked_mean("response_len", response_len)
    tracker.masked_mean("prompt_len", (attn.sum(-1) - response_len).float())
    p50, p95 = _quantiles(response_len.long(), (0.5, 0.95))
    tracker.scalar("response_len_p50", p50)
    tracker.scalar("response_len_p95", p95)
    if "truncated" in batch:
        cut = batch["truncated"].float()
        tracker.scalar("truncated_frac", float(cut.mean()), float(cut.numel()))  # weighted: the global fraction
    if version is not None and "versions" in batch:
        produced = loss_mask & (batch["versions"] >= 0)
        tracker.masked_mean("staleness", (version - batch["versions"]).float(), produced)
    if "versions" in batch:
        tracker.scalar("mixed_version_frac", float(_mixed_versions(batch).float().mean()), float(loss_mask.shape[0]))
    if "ref_logp" in batch:
        tracker.masked_mean("kl_ref", batch["logprobs"].float() - batch["ref_logp"].float(), loss_mask)
    if "teacher_logp" in batch:  # on-policy distillation: what its advantage lowers
        tracker.masked_mean("kl_teacher", batch["logprobs"].float() - batch["teacher_logp"].float(), loss_mask)
    return tracker.export()


def _quantiles(values: torch.Tensor, qs: tuple[float, ...]) -> list[float]:
    """Nearest-rank quantiles of non-negative integers `values` [N] over all ranks; collective.

    Every rank adds its counts to one histogram (all ranks end with the same result)."""
    size = torch.tensor([int(values.max()) + 1 if values.numel() else 0], dtype=torch.long)
    world.all_reduce(size, "max")
    counts = torch.bincount(values, minlength=int(size)).double()  # [max + 1]
    world.all_reduce(counts, "sum")
    if counts.numel() == 0 or counts.sum() == 0:
        return [float("nan")] * len(qs)
    cum = counts.cumsum(0)
    return [float(torch.searchsorted(cum, torch.tensor([q * float(cum[-1])], dtype=cum.dtype))) for q in qs]


def response_mask(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """[B, T] bool: the tokens the workflow marked as the model's (before any training cut)."""
    return batch.get("response_mask", batch["loss_mask"]).bool()


def _mixed_versions(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """[B] bool: the row's generated tokens carry two or more weight versions."""
    versions = batch["versions"].long()  # [B, T], -1 where no token was generated
    produced = response_mask(batch) & (versions >= 0)
    newest = versions.masked_fill(~produced, -1).amax(-1)
    oldest = versions.masked_fill(~produced, torch.iinfo(torch.long).max).amin(-1)
    return produced.any(-1) & (newest > oldest)
