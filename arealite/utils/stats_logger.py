"""Per-step statistics: one jsonl line per step in the run directory, and a console line.

Only the main process (rank 0) writes. Values are plain floats: reduce across ranks before
calling `commit` (the actor's stats already are).
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any


def _plain(value: Any) -> Any:
    if hasattr(value, "item") and callable(value.item):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN/inf; a null stands out when read back
    return value


class StatsLogger:
    """Writes `<run_dir>/stats.jsonl` and prints a one-line summary per step."""

    def __init__(self, run_dir: str, rank: int = 0, jsonl: bool = True, tensorboard: bool = False):
        self.run_dir = run_dir
        self.rank = rank
        self._start = time.monotonic()
        self._file = None
        self._tb = None
        if rank != 0:
            return
        os.makedirs(run_dir, exist_ok=True)
        if jsonl:
            self._file = open(os.path.join(run_dir, "stats.jsonl"), "a", buffering=1)
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(os.path.join(run_dir, "tensorboard"))

    def commit(self, step: int, stats: dict[str, Any]) -> None:
        """Record the stats of one finished step."""
        if self.rank != 0:
            return
        row = {"step": step, "elapsed_s": round(time.monotonic() - self._start, 3)}
        row.update({k: _plain(v) for k, v in stats.items()})
        if self._file is not None:
            self._file.write(json.dumps(row) + "\n")
        if self._tb is not None:
            for k, v in row.items():
                if isinstance(v, (int, float)) and k != "step":
                    self._tb.add_scalar(k, v, step)
        shown = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items())
        print(f"[stats] {shown}", flush=True)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None


def read_stats(run_dir: str) -> list[dict[str, Any]]:
    """The rows written by a StatsLogger, in order."""
    with open(os.path.join(run_dir, "stats.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]
