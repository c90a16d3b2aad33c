"""Server health for the rollout client: who is in rotation, and noticing when that changes.

Two ways a server leaves the rotation:
- a request to it fails (connection error, timeout, 5xx) and a /health probe confirms it;
- it stops answering the periodic /health probes (`MISSES_TO_LEAVE` in a row), e.g. a hung
  process whose connections stay open, or a host cut off the network. While the client is
  paused the probe is /get_model_info instead: SGLang's /health runs a generation, which
  blocks while generation is paused. Control and weight-update calls to a server that leaves
  are abandoned (`ServerPool.unless_left`), so a sync is held up by the probes, not by
  `rollout.control_timeout`.

Requests in flight to a server that leaves fail at once (`ServerPool.on_take_out` ->
`Transport.abandon`) and are resubmitted elsewhere by `agenerate`. Servers out of rotation
are probed every `health_check_interval` seconds; one that answers first receives the
weights it missed, then rejoins (after a broadcast it missed: at the next weight sync, see
weight_update.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from arealite.config import InferenceEngineConfig
from arealite.rollout.errors import RolloutError, ServerUnavailable, TransientServerError
from arealite.rollout.gate import VersionGate
from arealite.rollout.servers import ServerPool
from arealite.rollout.transport import Transport

logger = logging.getLogger(__name__)

MISSES_TO_LEAVE = 3  # consecutive failed probes before a server in rotation is taken out


class HealthMonitor:
    """Probes the servers and moves them in and out of the ServerPool.

    `rejoin(address) -> bool` gives a server that answers again the weights it missed and
    puts it back into rotation (the weight updater's, which orders it with weight updates);
    False means not yet.
    """

    def __init__(
        self,
        transport: Transport,
        pool: ServerPool,
        gate: VersionGate,
        config: InferenceEngineConfig,
        rejoin: Callable[[str], Awaitable[bool]],
        liveness_path: str = "/get_model_info",
    ) -> None:
        self._liveness_path = liveness_path
        self._transport = transport
        self._pool = pool
        self._gate = gate
        self._config = config
        self._rejoin = rejoin
        self._misses: dict[str, int] = {}
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._watch())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _get_ok(self, address: str, path: str) -> bool:
        timeout = self._config.health_check_timeout
        try:
            status, _ = await self._transport.request(
                "GET", address, path, None, timeout, setting="rollout.health_check_timeout"
            )
        except TransientServerError:
            return False
        return status == 200

    async def probe(self, address: str) -> bool:
        """True if `address` answers GET /health with 200 within health_check_timeout."""
        return await self._get_ok(address, "/health")

    async def wait_until_up(self, what: str = "servers", setting: str = "setup_timeout") -> None:
        """Probe every server of the pool until all answer; ServerUnavailable after setup_timeout."""
        deadline = time.monotonic() + self._config.setup_timeout
        waiting = list(self._pool.addresses)
        while waiting:
            results = await asyncio.gather(*(self.probe(a) for a in waiting))
            waiting = [a for a, ok in zip(waiting, results) if not ok]
            if waiting and time.monotonic() > deadline:
                raise ServerUnavailable(
                    f"{what} {waiting} did not answer /health within {setting}="
                    f"{self._config.setup_timeout}s; check their logs or raise rollout.setup_timeout"
                )
            if waiting:
                await asyncio.sleep(0.5)

    async def alive(self, address: str) -> bool:
        """True if `address` answers its backend's liveness route within health_check_timeout:
        the liveness check while the servers are paused, when SGLang's /health (a generation)
        blocks."""
        return await self._get_ok(address, self._liveness_path)

    async def context_length(self, address: str) -> int | None:
        """The server's context length, from /v1/models (max_model_len) or /get_server_info."""
        for path, read in (
            ("/v1/models", lambda r: r["data"][0]["max_model_len"]),
            ("/get_server_info", lambda r: r["context_length"]),
        ):
            try:
                status, reply = await self._transport.request(
                    "GET", address, path, None, self._config.health_check_timeout,
                    setting="rollout.health_check_timeout",
                )  # fmt: skip
                if status == 200 and read(reply) is not None:
                    return int(read(reply))
            except (TransientServerError, KeyError, IndexError, TypeError, ValueError):
                continue
        return None

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self._config.health_check_interval)
            try:
                paused = self._gate.paused  # then liveness only: SGLang's /health blocks while paused
                await asyncio.gather(*(self._check_in_rotation(a, paused) for a in self._pool.healthy))
                await asyncio.gather(*(self._try_rejoin(a) for a in self._pool.down))
            except Exception:  # the watcher must outlive any one bad probe
                logger.exception("health check round failed; retrying next interval")

    async def _check_in_rotation(self, address: str, paused: bool = False) -> None:
        if await (self.alive(address) if paused else self.probe(address)):
            self._misses[address] = 0
            return
        self._misses[address] = self._misses.get(address, 0) + 1
        if self._misses[address] >= MISSES_TO_LEAVE:
            timeout = self._config.health_check_timeout
            self._pool.take_out(
                address,
                f"{MISSES_TO_LEAVE} health probes in a row failed "
                f"(each may take rollout.health_check_timeout={timeout}s)",
            )

    async def _try_rejoin(self, address: str) -> None:
        if not await self.probe(address):
            return
        try:
            await self._rejoin(address)
        except RolloutError as e:
            logger.warning("server %s is back but could not be given current weights: %s", address, e)

    async def bring_back(self, address: str) -> None:
        """Put `address`, which holds the current weights, back into rotation."""
        self._pool.set_context_length(address, await self.context_length(address))
        self._misses[address] = 0
        self._pool.mark_up(address)
        logger.info("server %s is healthy again; back in rotation", address)
