"""`<run_dir>/stats.jsonl`: one JSON object per step, read by the plots and by recovery.

Non-finite floats are written as null (JSON has no NaN or inf; a null stands out when read
back). Kept apart from the logger so that reading a run (plots, analysis) needs neither the
logger nor its optional sinks.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

FILE_NAME = "stats.jsonl"


def stats_path(run_dir: str) -> str:
    return os.path.join(run_dir, FILE_NAME)


def plain(value: Any) -> Any:
    """A JSON-ready scalar: tensors and numpy scalars as Python numbers, NaN/inf as None."""
    if hasattr(value, "item") and callable(value.item):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def read_stats(run_dir: str) -> list[dict[str, Any]]:
    """The rows written by a StatsLogger, in order."""
    with open(stats_path(run_dir)) as f:
        return [json.loads(line) for line in f if line.strip()]


def truncate_after(run_dir: str, step: int) -> None:
    """Drop the rows of steps after `step` (written by a crashed attempt after its checkpoint)."""
    rows = read_stats(run_dir) if os.path.isfile(stats_path(run_dir)) else []
    with open(stats_path(run_dir), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows if r.get("step", -1) <= step)
