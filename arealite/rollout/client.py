"""The rollout client: `RolloutClient`, one class for every server backend, which it reaches
only through the backend's adapter (arealite/backends/, docs/backends.md); `rollout_client(config)`
builds it for `server.backend`. AReaL's names stay as aliases: `RemoteSGLangEngine` (SGLang's
protocol: real SGLang and the built-in server) and `RemoteVLLMEngine` (vLLM's RL routes).

An event loop in a background thread serves `agenerate(req)` (one sample that survives
interruptions and server failures, every token tagged with the weight version that produced
it), the workflow executor (`submit / wait / rollout_batch / prepare_batch`) and the server
side of a weight sync (`pause / resume / update_weights / set_version`, per
`config.pause_mode`). What it sends and tolerates: docs/protocol.md §7-8; it does not stream,
send `rid`s or use `n > 1` (§1.4).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
from typing import Any

from arealite import backends
from arealite.backends.contract import Backend, error_message
from arealite.config import InferenceEngineConfig
from arealite.interfaces import AcceptFn, Batch, RolloutWorkflow
from arealite.rollout.errors import RolloutError, TransientServerError
from arealite.rollout.executor import WorkflowExecutor
from arealite.rollout.gate import VersionGate
from arealite.rollout.generation import SampleGenerator
from arealite.rollout.health import HealthMonitor
from arealite.rollout.loop import EventLoopThread
from arealite.rollout.servers import ServerPool
from arealite.rollout.transport import Transport
from arealite.rollout.watchdog import Diagnosis
from arealite.rollout.weight_update import WeightUpdater
from arealite.types import ModelRequest, ModelResponse, WeightUpdateMeta

ADDRS_ENV = "AREAL_LLM_SERVER_ADDRS"


def addresses_from_env() -> list[str]:
    """Server addresses from AREAL_LLM_SERVER_ADDRS (comma-separated host:port)."""
    raw = os.environ.get(ADDRS_ENV, "")
    return [a.strip() for a in raw.split(",") if a.strip()]


def _check_address(address: str) -> str:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"server address {address!r} is not host:port (e.g. 127.0.0.1:30000)")
    return address


class RolloutClient:
    """Client of a fleet of inference servers of one `backend`. See the module docstring.

    It builds its parts, each given what it uses and never the client itself: the transport
    (the HTTP session), the server pool, the version gate, the health monitor, the weight
    updater, the sample generator and the workflow executor (which hands the client to the
    workflows as their InferenceEngine).
    """

    backend = "sglang"  # server.backend's name; `backends.adapter` turns it into the wire format

    def __init__(
        self,
        config: InferenceEngineConfig,
        addresses: list[str] | None = None,
        transport: Transport | None = None,
        backend: str | None = None,
    ) -> None:
        """`addresses`: default $AREAL_LLM_SERVER_ADDRS; `transport`: default a real HTTP one (tests of
        request shapes pass a fake); `backend`: server.backend (default the class's)."""
        self.backend = backend or self.backend
        self.protocol: Backend = backends.adapter(self.backend)
        addresses = addresses_from_env() if addresses is None else list(addresses)
        self.config = config
        self.pool = ServerPool([_check_address(a) for a in addresses])
        self._loop = EventLoopThread()
        self.transport = transport or Transport()
        self.gate = VersionGate()
        self.pool.on_take_out.append(self.transport.abandon)  # requests in flight to it fail at once
        self.health = HealthMonitor(
            self.transport, self.pool, self.gate, config, rejoin=self._rejoin, liveness_path=self.protocol.liveness_path
        )
        self.weights = WeightUpdater(self.transport, self.pool, config, self.health, self.protocol)
        diagnose = Diagnosis(self.transport, self.pool, self.gate, config, self.weights.awaiting)
        self.executor = WorkflowExecutor(config, self.gate, self._loop, self, diagnose)
        self._control = asyncio.Lock()  # pause and resume reach the servers in the order they were called
        self._resuming: concurrent.futures.Future | None = None  # the last resume(wait=False)
        self.generator = SampleGenerator(
            self.transport,
            self.pool,
            self.gate,
            config,
            self.health.probe,
            self.executor.watchdog.progress,
            self.protocol,
        )

    async def _rejoin(self, address: str) -> bool:
        return await self.weights.arejoin(address)

    @property
    def stats(self) -> dict[str, int]:
        """Counters of the client: requests, interruptions, retries, failovers."""
        return {**self.generator.stats, "failovers": self.pool.failovers}

    # ---- lifecycle -------------------------------------------------------------------------

    def initialize(self) -> None:
        """Start the event loop thread and wait until every server answers /health."""
        self._loop.start()
        try:
            self._loop.run(self._ainitialize())
        except BaseException:
            self.destroy()
            raise

    async def _ainitialize(self) -> None:
        await self.transport.open()
        self.gate.open()
        await self.health.wait_until_up()
        for address in self.pool.addresses:
            try:
                await self.protocol.check_server(self._get, address)
            except ValueError as e:
                raise RolloutError(str(e), address) from e
            self.pool.set_context_length(address, await self.health.context_length(address))
        self.health.start()

    async def _get(self, address: str, path: str) -> tuple[int, Any]:
        timeout = self.config.control_timeout
        return await self.transport.request("GET", address, path, None, timeout, setting="rollout.control_timeout")

    def destroy(self) -> None:
        """Cancel running workflows, close the HTTP session and stop the loop thread."""
        if not self._loop.running:
            return
        try:
            if self._resuming is not None:  # let it reach the servers (bounded by rollout.control_timeout)
                concurrent.futures.wait([self._resuming])
            self._loop.run(self._adestroy(), timeout=30)
        finally:
            self._loop.stop()

    async def _adestroy(self) -> None:
        await self.executor.acancel_all()
        self.health.stop()
        await self.transport.close()

    def __enter__(self) -> RolloutClient:
        """`with RemoteSGLangEngine(config) as rollout:` initializes, and destroys on exit (errors included)."""
        self.initialize()
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    @property
    def loop(self) -> EventLoopThread:
        return self._loop

    # ---- versions and pausing -------------------------------------------------------------

    def set_version(self, version: int) -> None:
        """Set the client's weight version (the trainer bumps it after each weight sync)."""
        self.gate.version = version
        if self._loop.running:
            self._loop.call_soon(self.executor.schedule)

    def get_version(self) -> int:
        return self.gate.version

    def set_lora_adapter(self, name: str | None) -> None:
        """Generate with the LoRA adapter the servers loaded as `name` (None: the base model).
        Called by the weight sync on every trainer rank, while the client is paused."""
        self.gate.lora_name = name

    @property
    def lora_adapter(self) -> str | None:
        return self.gate.lora_name

    @property
    def paused(self) -> bool:
        return self.gate.paused

    def pause(self) -> None:
        """Stop starting new workflows and pause generation on every server.

        `pause_mode="abort"`: in-flight requests come back as `abort` with partial output and
        their resubmissions wait client-side until `resume()`. `in_place` / `retract`: they stay
        on the servers, their HTTP calls open, and continue after `resume()`. Runs after a
        `resume(wait=False)` still under way has finished.
        """
        self._loop.run(self._apause())

    async def _apause(self) -> None:
        async with self._control:  # after a resume still under way, so the servers see them in order
            self.gate.pause()
            await self._post_all(*self.protocol.pause_call(self.config.pause_mode))
            if self.config.pause_grace_period > 0:
                await asyncio.sleep(self.config.pause_grace_period)

    def resume(self, wait: bool = True) -> None:
        """Let the servers and the client generate again.

        `wait=False` returns at once (the weight sync's last step, so the trainer goes on to its
        next batch instead of waiting for the servers' replies on a busy core): the servers are
        told in order with any later `pause`, the client starts new workflows once they
        answered, and a failure is raised by the next `wait` / `prepare_batch` / `rollout_batch`.
        """
        done = self._loop.submit(self._aresume(report=not wait))
        if wait:
            done.result()
        else:
            self._resuming = done  # destroy() waits for it: servers are never left paused

    async def _aresume(self, report: bool = False) -> None:
        async with self._control:
            try:
                await self._post_all(*self.protocol.resume_call)
            except Exception as e:
                if report:  # nobody waits on this call: the consumer's next wait raises it
                    self.executor.report(e)
                raise
            self.gate.unpause()
            self.executor.schedule()

    async def _post_all(self, path: str, body: dict[str, Any] | None) -> None:
        """POST to every server in rotation; a server that cannot be reached leaves it."""

        async def one(address: str) -> None:
            call = self.transport.request(
                "POST", address, path, body, self.config.control_timeout, setting="rollout.control_timeout"
            )
            try:
                answer = await self.pool.unless_left(address, call)  # the health watcher may take it out
            except TransientServerError as e:
                self.pool.take_out(address, str(e))
                return
            if answer is None:
                return
            status, reply = answer
            if status != 200:
                raise RolloutError(f"POST {path} returned {status}: {error_message(reply)}", address)

        await asyncio.gather(*(one(a) for a in self.pool.healthy))

    # ---- weight updates -------------------------------------------------------------------

    def update_weights(self, meta: WeightUpdateMeta) -> concurrent.futures.Future:
        """Load new weights on every server (non-blocking; `.result()` raises WeightUpdateError).

        disk: /update_weights_from_disk with `meta.path`; distributed: one
        /update_weights_from_distributed per bucket in `meta.buckets`, while the trainer's
        rank 0 broadcasts the same tensors; lora: /load_lora_adapter with the adapter folder
        `meta.path` as `meta.lora_name` (then `set_lora_adapter`). The servers report
        `meta.version` afterwards.
        """
        return self._loop.submit(self.weights.aupdate(meta))

    def init_weights_update_group(
        self, meta: WeightUpdateMeta, members: list[str] | None = None
    ) -> concurrent.futures.Future:
        """Have server i of `members` (default: every server) join the trainer's process group
        as rank 1 + i (non-blocking)."""
        return self._loop.submit(self.weights.ainit_group(meta, members))

    # The distributed weight sync's view of the servers (arealite.weight_sync.distributed); blocking.

    def current_weight_group(self) -> tuple[WeightUpdateMeta | None, list[str]]:
        """The weight-update group the servers last joined (None if none) and its members."""
        return self.weights.group, list(self.weights.members)

    def weight_group_candidates(self) -> list[str]:
        """Servers a new weight-update group should hold: in rotation or awaiting weights, alive now."""
        return self._loop.run(self.weights.acandidates())

    def leave_weights_update_group(self) -> None:
        """Forget the current weight-update group and have its members destroy it (best effort)."""
        self._loop.run(self.weights.aleave_group())

    def exclude_dead(self, addresses: list[str]) -> list[str]:
        """Take the servers of `addresses` that are not alive (GET /get_model_info) out of rotation; returns them."""
        return self._loop.run(self.weights.aexclude_dead(addresses))

    def confirm_version(self, version: int) -> dict[str, str]:
        """{server: weight_version} of the servers in rotation; raises if one reports another version."""
        return self._loop.run(self.weights.aconfirm(version))

    # ---- generation -----------------------------------------------------------------------

    async def agenerate(self, req: ModelRequest) -> ModelResponse:
        """Generate one sample for `req`, resubmitting after interruptions and failures."""
        if not self._loop.in_loop():  # called from another loop: run on ours, await from theirs
            return await asyncio.wrap_future(self._loop.submit(self.generator.agenerate(req)))
        return await self.generator.agenerate(req)

    def export_stats(self) -> dict[str, int]:
        """Counters of the client and its executor, prefixed for a stats logger."""
        out = {f"rollout/{k}": v for k, v in self.stats.items()}
        out.update({f"rollout/{k}": v for k, v in self.executor.stats.items()})
        out["rollout/servers_down"] = len(self.pool.down)
        return out

    # ---- workflows (delegated to the executor) -------------------------------------------

    def submit(self, data: dict[str, Any], workflow: RolloutWorkflow, should_accept: AcceptFn | None = None) -> None:
        """Queue one episode of `workflow` on `data`; it starts when the staleness bound allows."""
        self.executor.submit(data, workflow, should_accept)

    def wait(self, count: int, timeout: float | None = None) -> Batch:
        """Block until `count` accepted trajectories are ready; return them as one padded batch."""
        return self.executor.wait(count, timeout)

    def rollout_batch(
        self, data: list[dict[str, Any]], workflow: RolloutWorkflow, should_accept: AcceptFn | None = None
    ) -> Batch:
        """Run `workflow` on every item of `data` now and return their trajectories in order."""
        return self.executor.rollout_batch(data, workflow, should_accept)

    def submit_batch(
        self, data: list[dict[str, Any]], workflow: RolloutWorkflow, should_accept: AcceptFn | None = None
    ) -> concurrent.futures.Future:
        """`rollout_batch` without waiting for it: a future of the batch (rollout/lockstep.py)."""
        return self.executor.submit_batch(data, workflow, should_accept)

    def prepare_batch(self, dataloader: Any, workflow: RolloutWorkflow, should_accept: AcceptFn | None = None) -> Batch:
        """The next training batch, generated asynchronously within the staleness bound."""
        return self.executor.prepare_batch(dataloader, workflow, should_accept)


RemoteInferenceEngine = RolloutClient  # the client core's former name, kept for one release
RemoteSGLangEngine = RolloutClient  # AReaL's name for the client of SGLang-protocol servers


class RemoteVLLMEngine(RolloutClient):
    """AReaL's name for the client of vLLM servers: `RolloutClient(config, addresses, backend="vllm")`."""

    backend = "vllm"


def rollout_client(config: Any, addresses: list[str] | None = None) -> RolloutClient:
    """The rollout client of an experiment's servers (`config.server.backend`), after refusing,
    in one error, every setting that backend cannot honour (`backends.check`)."""
    backends.check(config)
    return RolloutClient(config.rollout, addresses, backend=config.server.backend)
