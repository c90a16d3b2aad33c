"""`StalenessBudget`: how many queued episodes may start now, under the off-policyness bound.

With `k = max_head_offpolicyness`, batch size `B` and current version `v`, an episode may
start only while `accepted + running < (k + (v - v0) + 1) * B` (`v0`: the version when
counting began), so batch n (trained at version `v0 + n`) holds episodes started at version
`>= v0 + n - k` (docs/architecture.md §3.2, as in AReaL). Pure counting: no I/O, no clock,
no event loop; the executor calls it under its lock.
"""

from __future__ import annotations

from dataclasses import dataclass

UNBOUNDED = 1 << 30  # the room when no batch size is known yet


@dataclass
class StalenessBudget:
    k: int  # max_head_offpolicyness
    batch_size: int | None = None
    base_version: int | None = None  # v0, fixed by the first `room` call
    accepted: int = 0  # accepted since counting began (trained ones included)
    running: int = 0  # started from the queue and not finished

    def room(self, version: int) -> int:
        """How many more episodes may start at `version` (<= 0: none)."""
        if self.batch_size is None:
            return UNBOUNDED
        if self.base_version is None:
            self.base_version = version
        return (self.k + version - self.base_version + 1) * self.batch_size - self.accepted - self.running

    def start(self) -> None:
        self.running += 1

    def finish(self, accepted: bool) -> None:
        """A started episode ended: accepted (its trajectory counts) or rejected/failed (it does not)."""
        self.running -= 1
        self.accepted += accepted

    def is_stale(self, oldest_version: int | None, version: int) -> bool:
        """Whether a ready trajectory whose oldest token has `oldest_version` is too old to train at `version`."""
        return oldest_version is not None and oldest_version < version - self.k

    def requeue(self) -> None:
        """A stale accepted trajectory goes back to the queue: its slot is free again."""
        self.accepted -= 1
