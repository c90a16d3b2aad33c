"""The one failover rule of every client of a server pool (the rollout client's `SampleGenerator`
and the distillation `TeacherClient`): a failed call is retried with exponential backoff on a live
server; a server that also fails a health probe leaves the rotation and the call moves elsewhere
without using a retry; with every server down, a call waits up to `rollout.setup_timeout` for one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from arealite.config import InferenceEngineConfig
from arealite.rollout.errors import ServerUnavailable, TransientServerError
from arealite.rollout.servers import ServerPool

MAX_BACKOFF = 5.0  # seconds, the cap of the exponential backoff between retries


def backoff(failures: int) -> float:
    """Seconds to wait before retry number `failures` (1, 2, ...)."""
    return min(MAX_BACKOFF, 0.2 * 2 ** (failures - 1))


class Failover:
    """`pick` a server and decide `after_failure`, for the pool's calls (module docstring).
    `what` names the calls in messages ("a request", "a teacher request"); `stats[key]` counts retries."""

    def __init__(
        self,
        pool: ServerPool,
        config: InferenceEngineConfig,
        probe: Callable[[str], Awaitable[bool]],
        stats: dict[str, int],
        key: str = "retries",
        what: str = "a request",
    ) -> None:
        self.pool, self.config, self.probe = pool, config, probe
        self.stats, self.key, self.what = stats, key, what

    async def pick(self, group: str, work: int, rid: str = "", servers: str = "server") -> str:
        """A server for `group`, waiting up to setup_timeout for one to come back if all are down."""
        deadline = time.monotonic() + self.config.setup_timeout
        while (address := self.pool.pick(group, work)) is None:
            if time.monotonic() > deadline:
                raise ServerUnavailable(
                    f"no {servers} in rotation for rollout.setup_timeout={self.config.setup_timeout}s "
                    f"(all of {self.pool.addresses} are down)",
                    rid=rid,
                )
            await asyncio.sleep(min(0.5, self.config.health_check_interval))
        return address

    async def after_failure(self, address: str, error: TransientServerError, failures: int) -> int:
        """A dead server leaves the rotation (the call moves on without using a retry); a live one
        is retried with backoff; past `rollout.request_retries` failures, ServerUnavailable."""
        if self.pool.is_healthy(address) and not await self.probe(address):
            self.pool.take_out(address, f"{self.what} failed ({error}) and so did a health probe")
            return failures
        if not self.pool.is_healthy(address):  # another call already took it out
            return failures
        failures += 1
        if failures > self.config.request_retries:
            raise ServerUnavailable(
                f"{self.what} gave up after {failures} failed attempts "
                f"(rollout.request_retries={self.config.request_retries}): {error}",
                address,
                error.rid,
            ) from error
        self.stats[self.key] += 1
        await asyncio.sleep(backoff(failures))
        return failures
