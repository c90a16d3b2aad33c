"""`StatsTracker`: the one reducer of statistics over trainer ranks.

Each rank adds what it saw and `export()` all-reduces numerators and denominators, so a
result is the statistic over the whole global batch, not an average of per-rank averages
(ranks hold unequal shares):

- `masked_mean(name, values, mask)`: the mean of the selected values, with their extrema as
  `name_max` / `name_min` (the loop's batch statistics);
- `scalar(name, value, weight)`: one weighted value of the mean `name`;
- `add(stats, weight)`: a dict of scalars from one micro-batch (the train engine's loss
  statistics): keys ending in `_max` / `_min` are reduced by max / min, every other key is a
  mean weighted by `weight` (the micro-batch's loss weight: its token or sequence count).

A mean with no weight anywhere is NaN (written as null), never a made-up 0.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from arealite import world

_SUFFIX_OP = {"_max": "max", "_min": "min"}
_EMPTY = {"max": -float("inf"), "min": float("inf")}


class StatsTracker:
    """Accumulates named statistics; `export()` reduces over ranks and resets."""

    def __init__(self) -> None:
        self._sum: dict[str, float] = {}
        self._weight: dict[str, float] = {}
        # extrema by op; a key is registered even when a rank saw no value, so that every rank
        # reduces the same keys
        self._extrema: dict[str, dict[str, float]] = {"max": {}, "min": {}}

    def _extremum(self, op: str, key: str, value: float | None) -> None:
        table = self._extrema[op]
        old = table.get(key, _EMPTY[op])
        table[key] = old if value is None else (max if op == "max" else min)(old, value)

    def masked_mean(self, name: str, values: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        """Add `values` (any shape) where `mask` is true to the mean `name`; extrema go to `name_max`/`name_min`."""
        v = values.detach().float().reshape(-1)
        if mask is not None:
            if mask.shape != values.shape:
                raise ValueError(
                    f"mask shape {tuple(mask.shape)} must equal values shape {tuple(values.shape)} for {name!r}"
                )
            v = v[mask.reshape(-1).bool()]
        self._sum[name] = self._sum.get(name, 0.0) + float(v.sum())
        self._weight[name] = self._weight.get(name, 0.0) + float(v.numel())
        self._extremum("max", name + "_max", float(v.max()) if v.numel() else None)
        self._extremum("min", name + "_min", float(v.min()) if v.numel() else None)

    def scalar(self, name: str, value: float, weight: float = 1.0) -> None:
        """Add one value (weighted) to the mean `name`."""
        self._sum[name] = self._sum.get(name, 0.0) + float(value) * weight
        self._weight[name] = self._weight.get(name, 0.0) + weight

    def add(self, stats: Mapping[str, torch.Tensor | float], weight: float) -> None:
        """Add one micro-batch's scalars: `*_max` / `*_min` keys are extrema, the rest weighted means."""
        for key, value in stats.items():
            op = _SUFFIX_OP.get(key[-4:])
            if op is not None:
                self._extremum(op, key, float(value))
            else:
                self.scalar(key, float(value), weight)

    def export(self) -> dict[str, float]:
        """Means and extrema over all ranks; collective (every rank must track the same names)."""
        out: dict[str, float] = {}
        names = sorted(self._sum)
        if names:
            t = torch.tensor([[self._sum[n], self._weight[n]] for n in names], dtype=torch.float64)
            world.all_reduce(t, "sum")
            out.update({n: (s / w if w > 0 else float("nan")) for n, (s, w) in zip(names, t.tolist())})
        for op, table in self._extrema.items():
            keys = sorted(table)
            if keys:
                t = torch.tensor([table[k] for k in keys], dtype=torch.float64)
                world.all_reduce(t, op)
                out.update({k: v for k, v in zip(keys, t.tolist()) if v != _EMPTY[op]})  # no rank saw a value
        self._sum.clear()
        self._weight.clear()
        for table in self._extrema.values():
            table.clear()
        return out
