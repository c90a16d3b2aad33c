"""Server health for the rollout client: who is in rotation, and noticing when that changes.

Two ways a server leaves the rotation:
- a request to it fails (connection error, timeout, 5xx) and a /health probe confirms it;
- it stops answering the periodic /health probes (`MISSES_TO_LEAVE` in a row), e.g. a hung
  process whose connections stay open. Probes of servers in rotation pause while the client
  is paused: SGLang's /health runs a generation, which blocks while generation is paused.

Requests in flight to a server that leaves are abandoned (`left_rotation` resolves) and
resubmitted elsewhere by `agenerate`. Servers out of rotation are probed every
`health_check_interval` seconds; one that answers first receives the weights it missed,
then rejoins (after a broadcast it missed: at the next weight sync, see weight_update.py).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from arealite.rollout.errors import RolloutError, TransientServerError
from arealite.rollout.transport import request

if TYPE_CHECKING:
    from arealite.rollout.remote_sglang import RemoteSGLangEngine

logger = logging.getLogger(__name__)

MISSES_TO_LEAVE = 3  # consecutive failed probes before a server in rotation is taken out


class HealthMonitor:
    """Probes the engine's servers and moves them in and out of its ServerPool."""

    def __init__(self, engine: RemoteSGLangEngine) -> None:
        self._engine = engine
        self._left: dict[str, asyncio.Future] = {}
        self._misses: dict[str, int] = {}
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._watch())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def probe(self, address: str) -> bool:
        """True if `address` answers GET /health with 200 within health_check_timeout."""
        config = self._engine.config
        try:
            status, _ = await request(
                self._engine._session, "GET", address, "/health", None, config.health_check_timeout, setting="rollout.health_check_timeout"
            )
        except TransientServerError:
            return False
        return status == 200

    async def alive(self, address: str) -> bool:
        """True if `address` answers GET /get_model_info within health_check_timeout: the
        liveness check while the servers are paused, when SGLang's /health (a generation)
        blocks."""
        config = self._engine.config
        try:
            status, _ = await request(
                self._engine._session, "GET", address, "/get_model_info", None, config.health_check_timeout,
                setting="rollout.health_check_timeout",
            )
        except TransientServerError:
            return False
        return status == 200

    async def context_length(self, address: str) -> int | None:
        """The server's context length, from /v1/models (max_model_len) or /get_server_info."""
        for path, read in (
            ("/v1/models", lambda r: r["data"][0]["max_model_len"]),
            ("/get_server_info", lambda r: r["context_length"]),
        ):
            try:
                status, reply = await request(
                    self._engine._session, "GET", address, path, None, self._engine.config.health_check_timeout,
                    setting="rollout.health_check_timeout",
                )
                if status == 200 and read(reply) is not None:
                    return int(read(reply))
            except (TransientServerError, KeyError, IndexError, TypeError, ValueError):
                continue
        return None

    def left_rotation(self, address: str) -> asyncio.Future:
        """A future that resolves when `address` leaves the rotation (already, if it has)."""
        future = self._left.get(address)
        if future is None:
            future = self._left[address] = asyncio.get_running_loop().create_future()
            if not self._engine.pool.is_healthy(address):
                future.set_result(None)
        return future

    def take_out(self, address: str, reason: str) -> None:
        """Remove `address` from the rotation and abandon the requests in flight to it."""
        if not self._engine.pool.is_healthy(address):
            return
        logger.warning("taking server %s out of rotation: %s", address, reason)
        self._engine.pool.mark_down(address)
        self._engine.stats["failovers"] += 1
        future = self._left.pop(address, None)
        if future is not None and not future.done():
            future.set_result(None)

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self._engine.config.health_check_interval)
            try:
                if not self._engine.paused:
                    await asyncio.gather(*(self._check_in_rotation(a) for a in self._engine.pool.healthy))
                await asyncio.gather(*(self._try_rejoin(a) for a in self._engine.pool.down))
            except Exception:  # the watcher must outlive any one bad probe
                logger.exception("health check round failed; retrying next interval")

    async def _check_in_rotation(self, address: str) -> None:
        if await self.probe(address):
            self._misses[address] = 0
            return
        self._misses[address] = self._misses.get(address, 0) + 1
        if self._misses[address] >= MISSES_TO_LEAVE:
            timeout = self._engine.config.health_check_timeout
            self.take_out(address, f"{MISSES_TO_LEAVE} health probes in a row failed (each may take rollout.health_check_timeout={timeout}s)")

    async def _try_rejoin(self, address: str) -> None:
        if not await self.probe(address):
            return
        try:
            ready = await self._engine.weights.aresync(address)
        except RolloutError as e:
            logger.warning("server %s is back but could not be given current weights: %s", address, e)
            return
        if ready:
            await self.bring_back(address)

    async def bring_back(self, address: str) -> None:
        """Put `address`, which holds the current weights, back into rotation."""
        self._engine._context_length[address] = await self.context_length(address)
        self._misses[address] = 0
        self._left.pop(address, None)
        self._engine.pool.mark_up(address)
        logger.info("server %s is healthy again; back in rotation", address)
