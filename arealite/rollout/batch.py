"""Padded trajectory batches (DESIGN.md §5): building them from token lists and stacking them.

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
    lengths = [len(p) + len(o) for p, o in zip(prompt_ids, output_ids)]
    width = max(lengths)
    input_ids = torch.zeros(rows, width, dtype=torch.long)
    attention_mask = torch.zeros(rows, width, dtype=torch.bool)
    loss_mask = torch.zeros(rows, width, dtype=torch.int32)
    logprobs = torch.zeros(rows, width, dtype=torch.float32)
    versions = torch.full((rows, width), -1, dtype=torch.long)
    for b in range(rows):
        p, o = len(prompt_ids[b]), len(output_ids[b])
        if len(output_logprobs[b]) != o or len(output_versions[b]) != o:
            raise ValueError(
                f"sample {b}: {o} output tokens but {len(output_logprobs[b])} logprobs "
                f"and {len(output_versions[b])} versions; they must align one to one"
            )
        if output_loss_mask is None:
            mask = torch.ones(o, dtype=torch.int32)
        else:
            mask = torch.tensor(output_loss_mask[b], dtype=torch.int32)
        input_ids[b, : p + o] = torch.tensor(list(prompt_ids[b]) + list(output_ids[b]), dtype=torch.long)
        attention_mask[b, : p + o] = True
        loss_mask[b, p : p + o] = mask
        logprobs[b, p : p + o] = torch.where(mask.bool(), torch.tensor(output_logprobs[b], dtype=torch.float32), 0.0)
        versions[b, p : p + o] = torch.where(mask.bool(), torch.tensor(output_versions[b], dtype=torch.long), -1)
    return {
        "input_ids": input_ids,  # [B, T]
        "attention_mask": attention_mask,  # [B, T]
        "loss_mask": loss_mask,  # [B, T]
        "logprobs": logprobs,  # [B, T], aligned to the token itself
        "versions": versions,  # [B, T], -1 on prompt and pad
    }
