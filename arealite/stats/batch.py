"""Statistics of a trajectory batch (docs/architecture.md §5) over all trainer ranks, for the stats row."""

from __future__ import annotations

import torch

from arealite.stats.tracker import StatsTracker


def batch_stats(tracker: StatsTracker, batch: dict[str, torch.Tensor], version: int | None = None) -> dict[str, float]:
    """What the batch's responses look like, over every rank's sequences; collective.

    `reward`, `response_len` and `prompt_len` (means, with `_max`/`_min`); `truncated_frac`,
    the fraction of responses that ran out of `max_new_tokens` (when the workflow reports
    `truncated`); and with the trainer's weight `version`, `staleness`: how many versions
    behind it the policy that sampled each trained token is (0 when synchronous); with the
    reference model's `ref_logp`, `kl_ref`: the sampled tokens' mean `logprobs - ref_logp`
    (an estimate of KL(behaviour policy || reference)). Call it before `compute_advantages`,
    which may drop truncated responses from `loss_mask`.
    """
    attn = batch["attention_mask"].bool()  # [B, T]
    loss_mask = batch["loss_mask"].bool()  # [B, T]
    response_len = loss_mask.sum(-1).float()  # [B]
    tracker.masked_mean("reward", batch["rewards"].float())
    tracker.masked_mean("response_len", response_len)
    tracker.masked_mean("prompt_len", (attn.sum(-1) - response_len).float())
    if "truncated" in batch:
        cut = batch["truncated"].float()
        tracker.scalar("truncated_frac", float(cut.mean()), float(cut.numel()))  # weighted: the global fraction
    if version is not None and "versions" in batch:
        produced = loss_mask & (batch["versions"] >= 0)
        tracker.masked_mean("staleness", (version - batch["versions"]).float(), produced)
    if "ref_logp" in batch:
        tracker.masked_mean("kl_ref", batch["logprobs"].float() - batch["ref_logp"].float(), loss_mask)
    return tracker.export()
