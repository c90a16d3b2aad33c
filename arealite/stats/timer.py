"""Wall-clock timing of the phases of a training step, for the stats row (`time/<phase>`)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


class StepTimer:
    """`with timer("rollout"): ...` adds the elapsed seconds to `time/rollout`; `pop()` returns and resets."""

    def __init__(self) -> None:
        self._times: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            key = f"time/{phase}"
            self._times[key] = self._times.get(key, 0.0) + time.perf_counter() - started

    def pop(self) -> dict[str, float]:
        out, self._times = self._times, {}
        return out
