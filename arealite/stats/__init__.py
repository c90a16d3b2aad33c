"""Statistics of a run: one reducer over ranks (`StatsTracker`), the batch statistics of a
step (`batch_stats`), phase timings (`StepTimer`), the per-step log (`StatsLogger`, writing
`stats.jsonl`) and its plots (`python -m arealite.stats.plots RUN_DIR`).

Names load on first use, so reading a run's `stats.jsonl` (plots) does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from arealite.utils.imports import lazy_exports

_EXPORTS = {
    "StatsTracker": "arealite.stats.tracker",
    "batch_stats": "arealite.stats.batch",
    "StepTimer": "arealite.stats.timer",
    "StatsLogger": "arealite.stats.logger",
    "read_stats": "arealite.stats.jsonl",
}
__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:
    from arealite.stats.batch import batch_stats
    from arealite.stats.jsonl import read_stats
    from arealite.stats.logger import StatsLogger
    from arealite.stats.timer import StepTimer
    from arealite.stats.tracker import StatsTracker
