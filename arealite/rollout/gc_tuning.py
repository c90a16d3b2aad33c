"""Rarer full garbage collections while a rollout client runs (`rollout.gc_full_threshold`).

CPython starts a full collection, which scans every tracked object of the process, after
`threshold2` collections of the middle generation (10 by default). A request in flight holds
some fifty tracked objects (its coroutines, task, futures, request and response) that
live long enough to reach the oldest generation, so with thousands in flight full
collections come often and each scans them all, beside the trainer's own heap: they were
about a third of the client's CPU at 256 requests in flight and half at 4,096
(benchmarks/README.md, `scale.py` (c)). Raising `threshold2` makes them rarer; cycles that
reach the oldest generation are freed later, nothing else changes. Process-wide, so it is
reference-counted over the clients alive in the process: each raises the threshold if lower
(never lowers it), the last restores it unless someone else changed it meanwhile.
"""

from __future__ import annotations

import gc
import threading

_lock = threading.Lock()
_holders = 0
_saved: tuple[int, int, int] | None = None  # the thresholds before the first holder
_ours: tuple[int, int, int] | None = None  # the thresholds as the holders left them


def hold(full_threshold: int) -> bool:
    """Raise CPython's third GC threshold to at least `full_threshold` (0: leave it); True if
    this call holds the tuning and must `release()` it. Every hold re-checks the threshold, so
    a change made while another client held it is raised again."""
    global _holders, _saved, _ours
    if full_threshold <= 0:
        return False
    with _lock:
        current = gc.get_threshold()
        if _holders == 0:
            _saved = _ours = current
        if current[2] < full_threshold:
            _ours = (current[0], current[1], full_threshold)
            gc.set_threshold(*_ours)
        _holders += 1
    return True


def release() -> None:
    """Undo one `hold`; the last one restores the thresholds it found, if they are still ours."""
    global _holders, _saved, _ours
    with _lock:
        if _holders == 0:
            return
        _holders -= 1
        if _holders == 0:
            if _saved is not None and gc.get_threshold() == _ours:
                gc.set_threshold(*_saved)
            _saved = _ours = None
