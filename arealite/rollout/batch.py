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


def _fill(typecode: str, value: int) -> bytes:
    """One item of `typecode` holding `value`, as bytes: `_fill(...) * n` is n of them, made in C."""
    return array(typecode, [value]).tobytes()


_ZERO_I32, _ONE_I32, _NO_VERSION = _fill("i", 0), _fill("i", 1), _fill("q", -1)


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
    # Built without a per-element Python step: this runs once per trajectory on the rollout
    # client's event loop, where its cost adds to every sample (benchmarks/rollout_overhead.py).
    # Ids and logprobs are gathered into flat lists (list += list copies pointers) and converted
    # once: array(typecode, list) is twice as fast as array.extend(list), which grows the array
    # item by item. Masks, pads and a sample's single version are repeated byte patterns. Tensor
    # ops (arange, comparisons) cost more than all the rest for short samples, op dispatch
    # being most of it.
    ids: list[int] = []
    logp: list[float] = []
    vers, attention, mask = bytearray(), bytearray(), bytearray()
    for b in range(rows):
        p, o = plens[b], lens[b] - plens[b]
        out_logp, out_vers = output_logprobs[b], output_versions[b]
        if len(out_logp) != o or len(out_vers) != o:
            raise ValueError(
                f"sample {b}: {o} output tokens but {len(out_logp)} logprobs "
                f"and {len(out_vers)} versions; they must align one to one"
            )
        pad = width - p - o
        ids += prompt_ids[b]
        ids += output_ids[b]
        ids += [0] * pad
        attention += b"\x01" * (p + o)
        attention += bytes(pad)
        logp += [0.0] * p
        vers += _NO_VERSION * p
        mask += _ZERO_I32 * p
        if output_loss_mask is None:  # every output token
            mask += _ONE_I32 * o
            logp += out_logp
            if isinstance(out_vers, list) and o and out_vers.count(out_vers[0]) == o:  # one version: the usual case
                vers += _fill("q", out_vers[0]) * o
            else:
                vers += array("q", out_vers).tobytes()
        else:
            m = [int(x) for x in output_loss_mask[b]]
            if len(m) != o:
                raise ValueError(f"sample {b}: {o} output tokens but a loss mask of {len(m)}")
            mask += array("i", m).tobytes()
            logp += [lp if k else 0.0 for lp, k in zip(out_logp, m)]
            vers += array("q", [v if k else -1 for v, k in zip(out_vers, m)]).tobytes()
        mask += _ZERO_I32 * pad
        logp += [0.0] * pad
        vers += _NO_VERSION * pad
    # All [B, T]: logprobs aligned to the token itself, versions -1 on prompt and pad.
    return {
        "input_ids": torch.frombuffer(array("q", ids), dtype=torch.long).view(rows, width),
        "attention_mask": torch.frombuffer(attention, dtype=torch.bool).view(rows, width),
        "loss_mask": torch.frombuffer(mask, dtype=torch.int32).view(rows, width),
        "logprobs": torch.frombuffer(array("f", logp), dtype=torch.float32).view(rows, width),
        "versions": torch.frombuffer(vers, dtype=torch.long).view(rows, width),
    }
