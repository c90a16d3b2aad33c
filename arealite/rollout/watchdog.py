"""The rollout's no-progress watchdog: a stalled `rollout_batch` / `prepare_batch` says why.

Progress is an episode starting or finishing, or a /generate call returning. Once a caller
has waited `rollout.stall_timeout` seconds without any, a diagnostic is logged; after a
second such period RolloutStalledError is raised with it (0 disables both). Only time
spent waiting counts: a long training step between batches is not a stall.

The diagnostic names what usually causes a stall (AReaL issues #137, #171, #232, #240):
every server's state as the client sees it (in rotation, out, awaiting weights) and as it
reports itself (paused, running, waiting, weight version), the executor's queues, the
staleness capacity (0: no episode may start until the trainer consumes a batch and bumps
the version with set_version, or max_head_offpolicyness is raised), and the oldest running
episode (a workflow stuck in its own code).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Any

from arealite.config import InferenceEngineConfig
from arealite.rollout.errors import TransientServerError
from arealite.rollout.gate import VersionGate
from arealite.rollout.servers import ServerPool
from arealite.rollout.transport import Transport

logger = logging.getLogger(__name__)


class RolloutStalledError(RuntimeError):
    """rollout_batch / prepare_batch made no progress for twice rollout.stall_timeout."""


class Watchdog:
    """The clock: when the last progress was, and what a waiting caller should do now."""

    def __init__(self, stall_timeout: float) -> None:
        self.limit = stall_timeout
        self.last_progress = time.monotonic()
        self._warned_for: float | None = None  # the idle period already warned about

    def progress(self) -> None:
        self.last_progress = time.monotonic()

    def _start(self, waiting_since: float) -> float:
        return max(self.last_progress, waiting_since)

    def due(self, waiting_since: float) -> float:
        """The monotonic time of the next verdict for a caller waiting since `waiting_since`."""
        if not self.limit:
            return math.inf
        start = self._start(waiting_since)
        return start + (2 if self._warned_for == start else 1) * self.limit

    def verdict(self, waiting_since: float) -> str | None:
        """None, "warn" (once per idle period, always before its "raise") or "raise"; the idle seconds via `idle()`."""
        if not self.limit:
            return None
        start = self._start(waiting_since)
        idle = time.monotonic() - start
        if idle >= self.limit and self._warned_for != start:
            # warned first even when the check comes late (a busy machine): the raise follows at the next check
            self._warned_for = start
            return "warn"
        if idle >= 2 * self.limit:
            return "raise"
        return None

    def idle(self, waiting_since: float) -> float:
        return time.monotonic() - self._start(waiting_since)


def report_stall(verdict: str, diagnostic: str) -> None:
    """Act on a `Watchdog.verdict`: "warn" logs the diagnostic, "raise" raises it."""
    if verdict == "raise":
        raise RolloutStalledError(diagnostic + "\n(raised after twice rollout.stall_timeout; 0 disables the watchdog)")
    logger.warning("%s\n(raised if nothing moves for another rollout.stall_timeout)", diagnostic)


class Diagnosis:
    """What the stall diagnostic reads: the servers' states as the client and they see them."""

    def __init__(
        self, transport: Transport, pool: ServerPool, gate: VersionGate, config: InferenceEngineConfig,
        awaiting: set[str],
    ) -> None:  # fmt: skip
        self.transport, self.pool, self.gate, self.config = transport, pool, gate, config
        self.awaiting = awaiting  # servers back after a broadcast they missed (the weight updater's set)

    async def __call__(self, snapshot: dict[str, Any], idle: float) -> str:
        return await adiagnose(self, snapshot, idle)


async def _server_line(d: Diagnosis, address: str) -> str:
    pool = d.pool
    if pool.is_healthy(address):
        state = f"in rotation, {pool.outstanding(address)} tokens outstanding"
    elif address in d.awaiting:
        state = "out of rotation, awaiting weights (rejoins at the next weight sync)"
    else:
        state = "out of rotation (failed; probed every rollout.health_check_interval)"
    timeout = d.config.health_check_timeout
    try:
        status, info = await d.transport.request("GET", address, "/get_server_info", None, timeout)
        own = (info or {}).get("internal_states", [{}])[0] if status == 200 and isinstance(info, dict) else {}
        reported = ", ".join(
            f"{k}={own[k]}" for k in ("paused", "num_running", "num_waiting", "weight_version") if k in own
        )
        reported = f"reports {reported or f'HTTP {status}'}"
    except (TransientServerError, AttributeError, IndexError, TypeError) as e:
        reported = f"no answer to /get_server_info ({e})"
    return f"  server {address}: {state}; {reported}"


async def adiagnose(d: Diagnosis, snapshot: dict[str, Any], idle: float) -> str:
    """The stall diagnostic; `snapshot` is WorkflowExecutor.snapshot()."""
    lines = [f"rollout made no progress for {idle:.0f}s (rollout.stall_timeout={d.config.stall_timeout}s):"]
    lines += await asyncio.gather(*(_server_line(d, a) for a in d.pool.addresses))
    if d.gate.paused:
        lines.append("  client: paused (a weight sync is under way, or resume() was not called after pause())")
    s = snapshot
    lines.append(f"  queues: {s['queued']} queued for capacity, {s['sync_waiting']} rollout_batch episodes waiting for "
                 f"concurrency, {s['running']} running, {s['ready']} ready (accepted, not yet consumed)")  # fmt: skip
    if s["batch_size"] is None:
        lines.append(f"  staleness: unbounded (no batch size yet); free concurrency slots {s['free']}")
    else:
        lines.append(
            f"  staleness capacity: {s['capacity']} = min(free concurrency slots {s['free']}, (max_head_offpolicyness "
            f"{s['k']} + version {s['version']} - base version {s['base']} + 1) x batch size {s['batch_size']} - "
            f"accepted {s['accepted']} - running {s['running_queued']})"
        )
        if s["capacity"] <= 0 and s["queued"]:
            lines.append("    no queued episode may start until the trainer consumes a batch and calls set_version "
                         "(after its weight sync), or rollout.max_head_offpolicyness is raised")  # fmt: skip
    oldest = s["oldest"]
    if oldest is not None:
        lines.append(f"  oldest running episode: data id={oldest[0]!r} of {oldest[1]}, running for {oldest[2]:.0f}s")
    return "\n".join(lines)
