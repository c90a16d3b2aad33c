"""`StatsTracker`: masked means, sums and extrema of a step, reduced over trainer ranks.

Each rank adds what it saw — e.g. `tracker.masked_mean("reward", rewards, mask)` — and
`export()` all-reduces the numerators and denominators, so the result is the statistic over
the whole global batch, not an average of per-rank averages (ranks hold unequal shares).
"""

from __future__ import annotations

import torch

from arealite import world


class StatsTracker:
    """Accumulates named statistics for one step; `export()` reduces over ranks and resets."""

    def __init__(self) -> None:
        self._sum: dict[str, float] = {}
        self._count: dict[str, float] = {}
        self._max: dict[str, float] = {}
        self._min: dict[str, float] = {}

    def masked_mean(self, name: str, values: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        """Add `values` (any shape) where `mask` is true to the mean `name`; extrema go to `name_max`/`name_min`."""
        v = values.detach().float().reshape(-1)
        if mask is not None:
            if mask.shape != values.shape:
                raise ValueError(f"mask shape {tuple(mask.shape)} must equal values shape {tuple(values.shape)} for {name!r}")
            v = v[mask.reshape(-1).bool()]
        self._sum[name] = self._sum.get(name, 0.0) + float(v.sum())
        self._count[name] = self._count.get(name, 0.0) + float(v.numel())
        if v.numel():
            self._max[name + "_max"] = max(self._max.get(name + "_max", -float("inf")), float(v.max()))
            self._min[name + "_min"] = min(self._min.get(name + "_min", float("inf")), float(v.min()))

    def scalar(self, name: str, value: float, weight: float = 1.0) -> None:
        """Add one value (weighted) to the mean `name`."""
        self._sum[name] = self._sum.get(name, 0.0) + float(value) * weight
        self._count[name] = self._count.get(name, 0.0) + weight

    def export(self) -> dict[str, float]:
        """Means and extrema over all ranks; collective (every rank must track the same names)."""
        out: dict[str, float] = {}
        names = sorted(self._sum)
        if names:
            t = torch.tensor([[self._sum[n], self._count[n]] for n in names], dtype=torch.float64)
            world.all_reduce(t, "sum")
            out.update({n: (s / c if c > 0 else float("nan")) for n, (s, c) in zip(names, t.tolist())})
        for table, op, empty in ((self._max, "max", -float("inf")), (self._min, "min", float("inf"))):
            keys = sorted({n + ("_max" if op == "max" else "_min") for n in names})
            if keys:
                t = torch.tensor([table.get(k, empty) for k in keys], dtype=torch.float64)
                world.all_reduce(t, op)
                out.update({k: v for k, v in zip(keys, t.tolist()) if abs(v) != float("inf")})
        for table in (self._sum, self._count, self._max, self._min):
            table.clear()
        return out
