"""`LockstepRollout`: a deterministic asynchronous schedule (`rollout.schedule=lockstep`).

With lookahead k (`rollout.max_head_offpolicyness`), batch b holds exactly the b-th batch
of prompts and is generated entirely by weights max(0, b - k): while the trainer trains on
batch b, the servers generate batches b + 1 .. b + k on the weights they hold, and before the
next weight sync `drain()` lets those finish, so no request is ever interrupted or resumed on
other weights. Which prompts, which weights and (with seeded sampling) which draws make
each batch is then fixed by the seed alone, not by timing; with a server whose numerics do
not depend on its batch (`server.deterministic`) two runs write the same statistics.

The price against the interruptible mode (prepare_batch): the sync waits for the batches in
flight, and a batch waits for its slowest sample (benchmarks/README.md, `lockstep_vs_interruptible`).
Dynamic sampling is not offered here: topping a batch up would make its content depend on timing.
"""

from __future__ import annotations

import concurrent.futures
from collections import deque
from collections.abc import Iterator
from typing import Any

from arealite.interfaces import Batch, RolloutRunner, RolloutWorkflow


class LockstepRollout:
    """`next_batch()` for each training step; `drain()` before each weight sync."""

    def __init__(
        self, engine: RolloutRunner, batches: Iterator[list[dict[str, Any]]], workflow: RolloutWorkflow, k: int
    ) -> None:
        if k < 1:
            raise ValueError(
                f"rollout.schedule=lockstep needs rollout.max_head_offpolicyness >= 1 (the lookahead), got {k}; "
                "use 0 with the default schedule for synchronous training"
            )
        self.engine, self.batches, self.workflow, self.k = engine, batches, workflow, k
        self._in_flight: deque[concurrent.futures.Future] = deque()

    def next_batch(self) -> Batch:
        """The next batch, in prompt order; then start the ones up to k ahead on the current weights."""
        if not self._in_flight:
            self._launch()
        batch = self._in_flight.popleft().result()
        while len(self._in_flight) < self.k:
            self._launch()
        return batch

    def drain(self) -> None:
        """Wait until every batch in flight is generated (call before the servers' weights change)."""
        for future in self._in_flight:
            future.exception()  # waits; a failure is raised by the next_batch that takes it

    def _launch(self) -> None:
        self._in_flight.append(self.engine.submit_batch(next(self.batches), self.workflow))
