"""Padded trajectory batches (docs/architecture.md §5): building them from token lists and stacking them.

A batch is a dict of tensors. Per-token tensors are `[B, T]`, right-padded; per-sequence
tensors are `[B]`. `versions` pads with -1 (no policy produced a pad), everything else with 0.
"""

from __future__ import annotations

from array import array
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


def _repeat(values: array, value: int, n: int) -> None:
    """Append `value` n times, as bytes: no list of n Python ints to convert one by one."""
    values.frombytes(array(values.typecode, [value]).tobytes() * n)


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
    plens = [len(p) for p in prompt_ids]
    lens = [p + len(o) for p, o in zip(plens, output_ids)]
    width = max(lens)
    # Filled row by row into flat typed arrays (C-speed extends), then viewed as [B, T] tensors
    # without a per-element conversion: this runs once per trajectory on the rollout client's
    # event loop, where its cost adds to every sample (benchmarks/rollout_overhead.py). The
    # masks too: building them with tensor ops (arange, comparisons, torch.tensor of the
    # lengths) cost more than all the rest for short samples, op dispatch being most of it.
    ids, logp, vers = array("q"), array("f"), array("q")
    attention, mask = array("B"), array("i")
    for b in range(rows):
        p, o = plens[b], lens[b] - plens[b]
        if len(output_logprobs[b]) != o or len(output_versions[b]) != o:
            raise ValueError(
                f"sample {b}: {o} output tokens but {len(output_logprobs[b])} logprobs "
                f"and {len(output_versions[b])} versions; they must align one to one"
            )
        pad = width - p - o
        ids.extend(prompt_ids[b])
        ids.extend(output_ids[b])
        _repeat(ids, 0, pad)
        attention.frombytes(b"\x01" * (p + o) + bytes(pad))
        _repeat(logp, 0, p)
        _repeat(vers, -1, p)
        _repeat(mask, 0, p)
        if output_loss_mask is None:  # every output token
            _repeat(mask, 1, o)
            logp.extend(output_logprobs[b])
            vers.extend(output_versions[b])
        else:
            m = [int(x) for x in output_loss_mask[b]]
            if len(m) != o:
                raise ValueError(f"sample {b}: {o} output tokens but a loss mask of {len(m)}")
            mask.extend(m)
            logp.extend([lp if k else 0.0 for lp, k in zip(output_logprobs[b], m)])
            vers.extend([v if k else -1 for v, k in zip(output_versions[b], m)])
        _repeat(mask, 0, pad)
        _repeat(logp, 0, pad)
        _repeat(vers, -1, pad)
    # All [B, T]: logprobs aligned to the token itself, versions -1 on prompt and pad.
    return {
        "input_ids": torch.frombuffer(ids, dtype=torch.long).view(rows, width),
        "attention_mask": torch.frombuffer(attention, dtype=torch.bool).view(rows, width),
        "loss_mask": torch.frombuffer(mask, dtype=torch.int32).view(rows, width),
        "logprobs": torch.frombuffer(logp, dtype=torch.float32).view(rows, width),
        "versions": torch.frombuffer(vers, dtype=torch.long).view(rows, width),
    }
