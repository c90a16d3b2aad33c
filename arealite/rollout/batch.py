"""Padded trajectory batches (docs/architecture.md §5): building them from token lists and stacking them.

A batch is a dict of tensors. Per-token tensors are `[B, T]`, right-padded; per-sequence
tensors are `[B]`. `versions` pads with -1 (no policy produced a pad), everything else with 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

# Pad value of each per-token key that does not pad with 0.
PAD_VALUES = {"versions": -1}


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
) -> dict[str, torch.Tensor]:
    """Build `input_ids, attention_mask, loss_mask, logprobs, versions` `[B, T]` from per-sample
    prompt and output token lists. `output_loss_mask` (default all ones) lets a workflow mark
    output tokens it did not generate, such as tool or feedback text, with 0."""
    rows = len(prompt_ids)
    width = max(len(p) + len(o) for p, o in zip(prompt_ids, output_ids))
    # built as padded Python lists, then one tensor per key: far cheaper than per-row tensor ops
    ids, attn, mask, logp, vers = [], [], [], [], []
    for b in range(rows):
        p, o = len(prompt_ids[b]), len(output_ids[b])
        if len(output_logprobs[b]) != o or len(output_versions[b]) != o:
            raise ValueError(
                f"sample {b}: {o} output tokens but {len(output_logprobs[b])} logprobs "
                f"and {len(output_versions[b])} versions; they must align one to one"
            )
        m = [1] * o if output_loss_mask is None else [int(x) for x in output_loss_mask[b]]
        if len(m) != o:
            raise ValueError(f"sample {b}: {o} output tokens but a loss mask of {len(m)}")
        pad = width - p - o
        ids.append(list(prompt_ids[b]) + list(output_ids[b]) + [0] * pad)
        attn.append([True] * (p + o) + [False] * pad)
        mask.append([0] * p + m + [0] * pad)
        logp.append([0.0] * p + [lp if k else 0.0 for lp, k in zip(output_logprobs[b], m)] + [0.0] * pad)
        vers.append([-1] * p + [v if k else -1 for v, k in zip(output_versions[b], m)] + [-1] * pad)
    return {
        "input_ids": torch.tensor(ids, dtype=torch.long),  # [B, T]
        "attention_mask": torch.tensor(attn, dtype=torch.bool),  # [B, T]
        "loss_mask": torch.tensor(mask, dtype=torch.int32),  # [B, T]
        "logprobs": torch.tensor(logp, dtype=torch.float32),  # [B, T], aligned to the token itself
        "versions": torch.tensor(vers, dtype=torch.long),  # [B, T], -1 on prompt and pad
    }
