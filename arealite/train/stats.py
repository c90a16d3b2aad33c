"""Accumulating per-micro-batch statistics into one dict per optimizer step, across ranks.

Keys ending in `_max` / `_min` are reduced by max / min; every other key is a mean weighted
by the micro-batch's loss weight (its token or sequence count), so the result equals the
statistic over the whole batch on all ranks.
"""

from __future__ import annotations

import torch

from arealite import world


class StatsAccumulator:
    """Weighted means and extrema of scalar stats, reduced over all trainer ranks."""

    def __init__(self) -> None:
        self._sums: dict[str, float] = {}
        self._weights: dict[str, float] = {}
        self._max: dict[str, float] = {}
        self._min: dict[str, float] = {}

    def add(self, stats: dict[str, torch.Tensor | float], weight: float) -> None:
        for k, v in stats.items():
            x = float(v)
            if k.endswith("_max"):
                self._max[k] = max(self._max.get(k, -float("inf")), x)
            elif k.endswith("_min"):
                self._min[k] = min(self._min.get(k, float("inf")), x)
            else:
                self._sums[k] = self._sums.get(k, 0.0) + x * weight
                self._weights[k] = self._weights.get(k, 0.0) + weight

    def reduce(self) -> dict[str, float]:
        """Collective over ranks: every rank must call it with the same keys added."""
        out: dict[str, float] = {}
        keys = sorted(self._sums)
        if keys:
            t = torch.tensor([[self._sums[k], self._weights[k]] for k in keys], dtype=torch.float64)
            world.all_reduce(t, "sum")
            for k, (s, w) in zip(keys, t.tolist()):
                out[k] = s / w if w > 0 else 0.0
        for table, op in ((self._max, "max"), (self._min, "min")):
            names = sorted(table)
            if names:
                t = torch.tensor([table[k] for k in names], dtype=torch.float64)
                world.all_reduce(t, op)
                out.update(zip(names, t.tolist()))
        return out
