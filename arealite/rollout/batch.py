"""Padded trajectory batches (docs/architecture.md §5): building them from token lists and stacking them.

A batch is a dict of tensors. Per-token tensors are `[B, T]`, right-padded; per-sequence
tensors are `[B]`. `versions` pads with -1 (no policy produced a pad), everything else with 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

# Pad value of each per-token key that does not pad with 0.
PAD_VALUES = {"versions": -1, "turn_ids": -1}


def pad_value(key: str) -> int:
    return PAD_VALUES.get(key, 0)


def concat_padded(items: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Stack trajectory dicts along the batch dim, right-padding `[b, t]` tensors to the longest t.

    Every item must have the same keys; 1-D tensors are concatenated as they are.
    """
    if not items:
        raise ValueError("concat_padded needs at least one trajectory dict")
    keys = list(items[0].keys())
    for i, item in enumerate(items):
        if set(item.keys()) != set(keys):
            raise ValueError(f"trajectory {i} has keys {sorted(item)}, but trajectory 0 has {sorted(keys)}")
    out: dict[str, torch.Tensor] = {}
    for key in keys:
        tensors = [item[key] for item in items]
        if tensors[0].dim() >= 2:
            width = max(t.shape[1] for t in tensors)
            tensors = [
                torch.nn.functional.pad(t, (0, width - t.shape[1]), value=pad_value(key)) if t.shape[1] < width else t
                for t in tensors
            ]
        out[key] = torch.cat(tensors, dim=0)
    return out


def trajectory_from_tokens(
    prompt_ids: Sequence[Sequence[int]],
    output_ids: Sequence[Sequence[int]],
    output_logprobs: Sequence[Sequence[float]],
    output_versions: Sequence[Sequence[int]],
    output_loss_mask: Sequence[Sequence[int]] | None = None,
    output_turn_ids: Sequence[Sequence[int]] | None = None,
    turn_rewards: Sequence[Mapping[int, float]] | None = None,
    output_stop_banned: Sequence[Sequence[bool]] | None = None,
) -> dict[str, torch.Tensor]:
    """Build `input_ids, attention_mask, loss_mask, logprobs, versions` `[B, T]` from per-sample
    prompt and output token lists. `output_loss_mask` (default all ones) lets a workflow mark
    output tokens it did not generate, such as tool or feedback text, with 0: such a token gets
    logprob 0 and version -1, as a prompt token does.

    With `output_turn_ids` (the episode's turn index of each output token, -1 on tokens the
    model did not generate) also `turn_ids` [B, T] (-1 on the prompt and padding) and
    `turn_rewards` [B, T]: `turn_rewards[b][k]` on the last token of turn k in row b
    (`arealite.algo.turns`); a turn with no token in the row adds its reward to the nearest
    earlier turn's last token there (else the first later one), so every reward reaches the
    turns before it.

    With `output_stop_banned` (`ModelResponse.output_stop_banned`: sampled while
    `gconfig.min_new_tokens` banned the stop tokens) also `stop_banned` [B, T] bool, False off
    the loss mask: the tokens whose log-probs the trainer takes without the stop tokens."""
    if not prompt_ids:
        raise ValueError("trajectory_from_tokens needs at least one sample")
    width = max(len(p) + len(o) for p, o in zip(prompt_ids, output_ids))
    rows: dict[str, list[list]] = {
        key: [] for key in ("input_ids", "attention_mask", "loss_mask", "logprobs", "versions")
    }
    for b, (prompt, output) in enumerate(zip(prompt_ids, output_ids)):
        n, logprobs, versions = len(output), list(output_logprobs[b]), list(output_versions[b])
        if len(logprobs) != n or len(versions) != n:
            raise ValueError(
                f"sample {b}: {n} output tokens but {len(logprobs)} logprobs "
                f"and {len(versions)} versions; they must align one to one"
            )
        mask = [1] * n if output_loss_mask is None else [int(x) for x in output_loss_mask[b]]
        if len(mask) != n:
            raise ValueError(f"sample {b}: {n} output tokens but a loss mask of {len(mask)}")
        if output_stop_banned is not None and len(output_stop_banned[b]) != n:
            raise ValueError(f"sample {b}: {n} output tokens but {len(output_stop_banned[b])} stop_banned flags")
        p, pad = len(prompt), width - len(prompt) - n
        # logprobs aligned to the token itself; prompt, pad and untrained tokens: logprob 0, version -1
        rows["input_ids"].append([*prompt, *output] + [0] * pad)
        rows["attention_mask"].append([1] * (p + n) + [0] * pad)
        rows["loss_mask"].append([0] * p + mask + [0] * pad)
        rows["logprobs"].append([0.0] * p + [lp if m else 0.0 for lp, m in zip(logprobs, mask)] + [0.0] * pad)
        rows["versions"].append([-1] * p + [v if m else -1 for v, m in zip(versions, mask)] + [-1] * pad)
    dtypes = {"attention_mask": torch.bool, "loss_mask": torch.int32, "logprobs": torch.float32}
    out = {key: torch.tensor(value, dtype=dtypes.get(key, torch.long)) for key, value in rows.items()}
    if output_turn_ids is not None:
        out.update(_turn_tensors(prompt_ids, output_turn_ids, turn_rewards or [{}] * len(prompt_ids), width))
    if output_stop_banned is not None:
        out["stop_banned"] = _stop_banned(prompt_ids, output_stop_banned, out["loss_mask"])
    return out


def _stop_banned(prompt_ids, output_stop_banned, loss_mask: torch.Tensor) -> torch.Tensor:
    banned = torch.zeros(loss_mask.shape, dtype=torch.bool)
    for b, (prompt, flags) in enumerate(zip(prompt_ids, output_stop_banned)):
        banned[b, len(prompt) : len(prompt) + len(flags)] = torch.tensor([bool(f) for f in flags], dtype=torch.bool)
    return banned & loss_mask.bool()


def _turn_tensors(
    prompt_ids: Sequence[Sequence[int]],
    output_turn_ids: Sequence[Sequence[int]],
    turn_rewards: Sequence[Mapping[int, float]],
    width: int,
) -> dict[str, torch.Tensor]:
    ids = torch.full((len(prompt_ids), width), -1, dtype=torch.long)
    rewards = torch.zeros(len(prompt_ids), width, dtype=torch.float32)
    for b, (prompt, turns) in enumerate(zip(prompt_ids, output_turn_ids)):
        p = len(prompt)
        ids[b, p : p + len(turns)] = torch.tensor(list(turns), dtype=torch.long)
        last: dict[int, int] = {}  # turn -> position of its last token in this row
        for i, k in enumerate(turns):
            if k >= 0:
                last[int(k)] = p + i
        for k, r in turn_rewards[b].items():
            if not r:
                continue
            pos = last.get(k)
            if pos is None and last:  # a turn without tokens here: the nearest earlier turn, else a later one
                earlier = [t for t in last if t < k]
                pos = last[max(earlier)] if earlier else last[min(last)]
            if pos is not None:
                rewards[b, pos] += float(r)
    return {"turn_ids": ids, "turn_rewards": rewards}
