"""Samples of a trajectory batch as plain rows: what the model wrote, and with what numbers.

`sample_rows(batch, tokenizer)` gives one JSON-ready dict per sample: `prompt` (the tokens
before the first trained token) and `completion` (from it to the end, tool results and
feedback included) as text with special tokens kept, and every per-sample tensor of the
batch, per-token ones cut to the sample's length. The rollout dump writes them all;
`shown_samples` picks a few, evenly spread, for the stats logger.
"""

from __future__ import annotations

from typing import Any

import torch


def per_sample_tensors(batch: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The `[B]` and `[B, T]` tensors of a padded batch (B = its number of samples)."""
    rows = batch["attention_mask"].shape[0]
    return {k: v for k, v in batch.items() if isinstance(v, torch.Tensor) and v.dim() in (1, 2) and v.shape[0] == rows}


def sample_rows(batch: dict[str, Any], tokenizer: Any, indices: list[int] | None = None) -> list[dict[str, Any]]:
    """One dict per sample (those of `indices`, default all) of a padded batch."""
    tensors = {k: v.detach().cpu() for k, v in per_sample_tensors(batch).items()}
    lengths = tensors["attention_mask"].sum(-1).tolist()
    out = []
    for b in range(len(lengths)) if indices is None else indices:
        n = int(lengths[b])
        ids = tensors["input_ids"][b, :n].tolist()
        trained = tensors.get("response_mask", tensors["loss_mask"])[b, :n].nonzero()  # the completion's tokens
        start = int(trained[0, 0]) if len(trained) else n
        row: dict[str, Any] = {
            "prompt": tokenizer.decode(ids[:start], skip_special_tokens=False),
            "completion": tokenizer.decode(ids[start:], skip_special_tokens=False),
        }
        for key, t in tensors.items():
            row[key] = t[b, :n].tolist() if t.dim() == 2 else t[b].item()
        out.append(row)
    return out


def shown_samples(batch: dict[str, Any], tokenizer: Any, n: int) -> list[dict[str, Any]]:
    """`n` samples spread evenly over the batch: prompt, completion, reward and, once computed,
    the mean advantage over the trained tokens."""
    size = batch["attention_mask"].shape[0]
    picked = sorted({i * size // n for i in range(min(n, size))}) if n > 0 else []
    out = []
    for row in sample_rows(batch, tokenizer, picked):
        shown = {"prompt": row["prompt"], "completion": row["completion"], "reward": row.get("rewards")}
        if "advantages" in row:
            trained = [a for a, m in zip(row["advantages"], row["loss_mask"]) if m]
            shown["advantage"] = sum(trained) / len(trained) if trained else 0.0
        out.append(shown)
    return out
