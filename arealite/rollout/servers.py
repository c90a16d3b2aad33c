"""Server rotation for the rollout client: health, load and group affinity.

All samples of a group go to one server so its prompt prefix is computed once (prefix
cache); new groups go to the healthy server with the least outstanding work (tokens of
generation budget in flight). A server that fails is taken out of rotation and its groups
are re-routed; the client probes it and it rejoins when healthy (health.py).

The pool also knows each server's context length, and abandons what is in flight to a server
the moment it leaves the rotation, so a hung server does not hold it until its timeout: calls
wrapped in `unless_left`, and through `on_take_out` every HTTP request (the transport's
`abandon`). Used only from the rollout event loop, so it needs no locks.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")
_MAX_AFFINITIES = 100_000  # groups remembered for routing; the oldest are forgotten first


class ServerPool:
    """Which servers are in rotation, how busy each is, and which server each group uses."""

    def __init__(self, addresses: list[str]) -> None:
        if not addresses:
            raise ValueError(
                "no inference server addresses; pass addresses=['host:port', ...] or set "
                "AREAL_LLM_SERVER_ADDRS=host:port,host:port"
            )
        self.addresses = list(addresses)
        self._healthy = set(self.addresses)
        self._outstanding = dict.fromkeys(self.addresses, 0)
        self._affinity: OrderedDict[str, str] = OrderedDict()
        self._tiebreak = itertools.count()
        self._context_length: dict[str, int | None] = {}
        self._waiters: dict[str, set[asyncio.Future]] = {}  # one per `unless_left` call in flight, by server
        self.on_take_out: list[Callable[[str, str], None]] = []  # called with (address, reason) by take_out
        self.failovers = 0  # servers taken out of rotation so far

    @property
    def healthy(self) -> list[str]:
        return [a for a in self.addresses if a in self._healthy]

    @property
    def down(self) -> list[str]:
        return [a for a in self.addresses if a not in self._healthy]

    def is_healthy(self, address: str) -> bool:
        return address in self._healthy

    def outstanding(self, address: str) -> int:
        return self._outstanding[address]

    def pick(self, group: str, work: int) -> str | None:
        """Reserve `work` on the server for `group` (sticky), or None if none is healthy."""
        address = self._affinity.get(group)
        if address is None or address not in self._healthy:
            if not self._healthy:
                return None
            start = next(self._tiebreak)  # rotate ties so equal servers share new groups
            order = self.addresses[start % len(self.addresses) :] + self.addresses[: start % len(self.addresses)]
            address = min((a for a in order if a in self._healthy), key=lambda a: self._outstanding[a])
            self._affinity[group] = address
        self._affinity.move_to_end(group)
        while len(self._affinity) > _MAX_AFFINITIES:
            self._affinity.popitem(last=False)
        self._outstanding[address] += work
        return address

    def release(self, address: str, work: int) -> None:
        self._outstanding[address] -= work

    def forget(self, group: str) -> None:
        self._affinity.pop(group, None)

    def mark_down(self, address: str) -> None:
        """Take `address` out of rotation; its groups are routed elsewhere on their next call."""
        self._healthy.discard(address)
        for group in [g for g, a in self._affinity.items() if a == address]:
            del self._affinity[group]

    def mark_up(self, address: str) -> None:
        self._healthy.add(address)

    def take_out(self, address: str, reason: str) -> None:
        """Take `address` out of rotation (counted, logged) and abandon the requests in flight to it."""
        if not self.is_healthy(address):
            return
        logger.warning("taking server %s out of rotation: %s", address, reason)
        self.mark_down(address)
        self.failovers += 1
        for waiter in self._waiters.pop(address, ()):
            _wake(waiter)
        for hook in self.on_take_out:
            hook(address, reason)

    async def unless_left(self, address: str, call: Awaitable[T]) -> T | None:
        """`call`'s result, or None (the call cancelled) once `address` leaves the rotation first:
        a server cut off mid-call would otherwise hold it until the call's own timeout.

        Each call waits on a future of its own that `take_out` resolves, not on one future
        per server: a future's done callbacks are a list that every removal scans, so
        thousands of calls in flight to one server would each pay for all the others."""
        task = asyncio.ensure_future(call)
        if not self.is_healthy(address):
            task.cancel()
            return None
        waiter = asyncio.get_running_loop().create_future()
        waiters = self._waiters.setdefault(address, set())
        waiters.add(waiter)
        task.add_done_callback(functools.partial(_wake, waiter))
        try:
            await waiter
        finally:  # also when the caller is cancelled: the call must not outlive it
            waiters.discard(waiter)
            if not task.done():
                task.cancel()
        if not task.done() or task.cancelled():  # cancel() only takes effect at the task's next step
            return None
        return task.result()

    def context_length(self, address: str) -> int | None:
        """The server's context length as it reported it (None: unknown, no clamping)."""
        return self._context_length.get(address)

    def set_context_length(self, address: str, length: int | None) -> None:
        self._context_length[address] = length


def _wake(waiter: asyncio.Future, _: object = None) -> None:
    if not waiter.done():
        waiter.set_result(None)
