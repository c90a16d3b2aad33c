"""The trainer's console: at most one progress bar, and the lines printed beside it.

A training step shows one line, the bar (`StatsLogger`). Lines about what happened inside a
step (a weight version confirmed by the servers) would add a line per step under the bar, so
they are printed only where no bar is shown (a log without one, `stats_logger.progress_bar=false`)
or when `stats_logger.print_stats` asks for everything; either way they go above the bar, never
into it. Process-wide, as the terminal is.
"""

from __future__ import annotations

import sys
from typing import Any

_bar: Any = None  # the active tqdm bar of this process, if any
_events_under_bar = False


def attach(bar: Any, events: bool) -> None:
    """`bar` is now the console's progress bar; with `events`, step events still print."""
    global _bar, _events_under_bar
    _bar, _events_under_bar = bar, events


def detach(bar: Any) -> None:
    global _bar
    if _bar is bar:
        _bar = None


def write(line: str) -> None:
    """Print `line` on stdout; with a bar shown, above it (tqdm clears and redraws the bar)."""
    if _bar is not None:
        _bar.write(line, file=sys.stdout)
    else:
        print(line, flush=True)


def event(line: str) -> None:
    """A per-step event: printed without a bar, or under one only when asked for."""
    if _bar is None or _events_under_bar:
        write(line)
