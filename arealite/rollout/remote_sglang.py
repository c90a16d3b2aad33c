"""`RemoteSGLangEngine`: the rollout client for servers speaking SGLang's native HTTP protocol.

It runs an event loop in a background thread (one aiohttp session for every request) and
offers:
- `agenerate(req)`: one sample, surviving interruptions (an `abort` reply has its partial
  output appended to the prompt and is resubmitted with the remaining budget) and server
  failures (retries with backoff; a server that fails its health checks leaves the rotation,
  the request moves elsewhere, and the server rejoins once healthy, see health.py). Every
  output token carries the weight version that produced it (never a newer one, see
  `protocol.token_versions`).
- `submit / wait / rollout_batch / prepare_batch`: workflows run by a `WorkflowExecutor`
  under the staleness bound (see executor.py).
- `pause / resume / update_weights / init_weights_update_group / set_version`: the server
  side of a weight sync. `config.pause_mode` decides what happens to requests in flight:
  `abort` interrupts them (they are resubmitted after `resume`); `in_place` and `retract`
  (SGLang 0.5.6+, §2.1) keep them on the server, where they continue with the new weights.

Works against the built-in server and real SGLang 0.5.5-0.5.23 (SGLANG_PROTOCOL.md §7).
It deliberately does not stream, send `rid`s, or use `n > 1` (§1.4: n>1 reassigns rids).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
import time
from typing import Any

from arealite.config import InferenceEngineConfig
from arealite.rollout import protocol
from arealite.rollout.errors import GenerationError, RolloutError, ServerUnavailable, TransientServerError
from arealite.rollout.executor import WorkflowExecutor
from arealite.rollout.health import HealthMonitor
from arealite.rollout.loop import EventLoopThread
from arealite.rollout.servers import ServerPool
from arealite.rollout.transport import make_session, request
from arealite.rollout.weight_update import WeightUpdater
from arealite.interfaces import AcceptFn, Batch, RolloutWorkflow
from arealite.types import ModelRequest, ModelResponse, WeightUpdateMeta

ADDRS_ENV = "AREAL_LLM_SERVER_ADDRS"
_MAX_BACKOFF = 5.0  # seconds, the cap of the exponential backoff between retries


def addresses_from_env() -> list[str]:
    """Server addresses from AREAL_LLM_SERVER_ADDRS (comma-separated host:port)."""
    raw = os.environ.get(ADDRS_ENV, "")
    return [a.strip() for a in raw.split(",") if a.strip()]


def _check_address(address: str) -> str:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"server address {address!r} is not host:port (e.g. 127.0.0.1:30000)")
    return address


class RemoteSGLangEngine:
    """Client of a fleet of SGLang-protocol inference servers. See the module docstring."""

    def __init__(self, config: InferenceEngineConfig, addresses: list[str] | None = None) -> None:
        addresses = addresses_from_env() if addresses is None else list(addresses)
        self.config = config
        self.pool = ServerPool([_check_address(a) for a in addresses])
        self._loop = EventLoopThread()
        self._session: Any = None
        self._version = 0
        self._version_lock = threading.Lock()
        self._lora_name: str | None = None  # the adapter every /generate asks for (weight_update=lora)
        self._paused = False
        self._unpaused: asyncio.Event | None = None
        self._context_length: dict[str, int | None] = {}
        self.executor = WorkflowExecutor(config, self)
        self.weights = WeightUpdater(self)
        self.health = HealthMonitor(self)
        # counters for the stats logger
        self.stats: dict[str, int] = {"requests": 0, "interruptions": 0, "retries": 0, "failovers": 0}

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
        self._session = make_session()
        self._unpaused = asyncio.Event()
        self._unpaused.set()
        deadline = time.monotonic() + self.config.setup_timeout
        waiting = list(self.pool.addresses)
        while waiting:
            results = await asyncio.gather(*(self.health.probe(a) for a in waiting))
            waiting = [a for a, ok in zip(waiting, results) if not ok]
            if waiting and time.monotonic() > deadline:
                raise ServerUnavailable(
                    f"servers {waiting} did not answer /health within setup_timeout="
                    f"{self.config.setup_timeout}s; check their logs or raise rollout.setup_timeout"
                )
            if waiting:
                await asyncio.sleep(0.5)
        for address in self.pool.addresses:
            self._context_length[address] = await self.health.context_length(address)
        self.health.start()

    def destroy(self) -> None:
        """Cancel running workflows, close the HTTP session and stop the loop thread."""
        if not self._loop.running:
            return
        try:
            self._loop.run(self._adestroy(), timeout=30)
        finally:
            self._loop.stop()

    async def _adestroy(self) -> None:
        await self.executor.acancel_all()
        self.health.stop()
        if self._session is not None:
            await self._session.close()

    def __enter__(self) -> RemoteSGLangEngine:
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
        with self._version_lock:
            self._version = int(version)
        if self._loop.running:
            self._loop.call_soon(self.executor.schedule)

    def get_version(self) -> int:
        with self._version_lock:
            return self._version

    def set_lora_adapter(self, name: str | None) -> None:
        """Generate with the LoRA adapter the servers loaded as `name` (None: the base model).
        Called by the weight sync on every trainer rank, while the client is paused."""
        with self._version_lock:
            self._lora_name = name or None

    @property
    def lora_adapter(self) -> str | None:
        with self._version_lock:
            return self._lora_name

    @property
    def paused(self) -> bool:
        return self._paused

    def pause(self) -> None:
        """Stop starting new workflows and pause generation on every server.

        `pause_mode="abort"`: in-flight requests come back as `abort` with partial output and
        their resubmissions wait client-side until `resume()`. `in_place` / `retract`: they stay
        on the servers, their HTTP calls open, and continue after `resume()`.
        """
        self._loop.run(self._apause())

    async def _apause(self) -> None:
        self._paused = True
        assert self._unpaused is not None
        self._unpaused.clear()
        # A JSON body is required from 0.5.6; <= 0.5.5 ignores it and always aborts (§2.1), which
        # the resubmission path in _agenerate absorbs.
        await self._post_all("/pause_generation", {"mode": self.config.pause_mode})
        if self.config.pause_grace_period > 0:
            await asyncio.sleep(self.config.pause_grace_period)

    def resume(self) -> None:
        """Let the servers and the client generate again."""
        self._loop.run(self._aresume())

    async def _aresume(self) -> None:
        await self._post_all("/continue_generation", {})
        self._paused = False
        assert self._unpaused is not None
        self._unpaused.set()
        self.executor.schedule()

    async def _post_all(self, path: str, body: dict[str, Any]) -> None:
        """POST to every server in rotation; a server that cannot be reached leaves it."""

        async def one(address: str) -> None:
            try:
                status, reply = await request(
                    self._session, "POST", address, path, body, self.config.control_timeout, setting="rollout.control_timeout"
                )
            except TransientServerError as e:
                self.health.take_out(address, str(e))
                return
            if status != 200:
                raise RolloutError(f"POST {path} returned {status}: {protocol.error_message(reply)}", address)

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

    def init_weights_update_group(self, meta: WeightUpdateMeta, members: list[str] | None = None) -> concurrent.futures.Future:
        """Have server i of `members` (default: every server) join the trainer's process group
        as rank 1 + i (non-blocking)."""
        return self._loop.submit(self.weights.ainit_group(meta, members))

    # The distributed weight sync's view of the servers (arealite.utils.distributed_sync); blocking.

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
            return await asyncio.wrap_future(self._loop.submit(self._agenerate(req)))
        return await self._agenerate(req)

    async def _agenerate(self, req: ModelRequest) -> ModelResponse:
        if not req.input_ids:
            raise ValueError(f"request {req.rid} has an empty prompt; input_ids must hold at least one token")
        budget = req.gconfig.max_new_tokens
        group = req.group_id or req.rid
        resp = ModelResponse(input_tokens=list(req.input_ids))
        started = time.monotonic()
        failures = 0
        self.stats["requests"] += 1
        while True:
            remaining = budget - resp.output_len
            assert self._unpaused is not None
            await self._unpaused.wait()  # resubmissions wait out a weight update client-side
            address = await self._pick(group, remaining, req.rid)
            sent_version = self.get_version()  # the servers hold at least this version (see token_versions)
            lora_name = self.lora_adapter  # the adapter of that version (weight_update=lora)
            prompt = resp.input_tokens + resp.output_tokens
            now_budget = protocol.clamp_max_new_tokens(remaining, len(prompt), self._context_length.get(address))
            if now_budget <= 0:
                self.pool.release(address, remaining)
                if resp.output_len == 0:
                    raise GenerationError(
                        f"prompt of {len(prompt)} tokens leaves no room in the server's context length "
                        f"{self._context_length.get(address)}; filter long prompts (dataset.max_prompt_tokens)",
                        address,
                        req.rid,
                    )
                resp.stop_reason = "length"  # the context is full
                break
            try:
                chunk = await self._call_server(address, prompt, req, now_budget, resp.output_len, lora_name)
            except TransientServerError as e:
                failures = await self._after_failure(address, e, failures)
                continue
            finally:
                self.pool.release(address, remaining)
            self.executor.watchdog.progress()
            resp.output_tokens += chunk.tokens
            resp.output_logprobs += chunk.logprobs
            resp.output_versions += protocol.token_versions(chunk, sent_version)
            resp.server = address
            if chunk.finish_type != "abort":
                resp.stop_reason = chunk.finish_type
                break
            resp.n_interruptions += 1
            self.stats["interruptions"] += 1
            if resp.output_len >= budget:  # interrupted exactly at the end of the budget
                resp.stop_reason = "length"
                break
            if not chunk.tokens:
                await asyncio.sleep(0.05)  # aborted while queued: don't spin
        resp.latency = time.monotonic() - started
        return resp

    async def _call_server(
        self, address: str, prompt: list[int], req: ModelRequest, max_new_tokens: int, produced: int, lora_name: str | None = None
    ) -> protocol.GenerateChunk:
        """One /generate call, abandoned as a transient failure if the server leaves the
        rotation meanwhile (a hung server never closes the connection)."""
        left = self.health.left_rotation(address)
        call = asyncio.ensure_future(self._generate_once(address, prompt, req, max_new_tokens, produced, lora_name))
        try:
            await asyncio.wait((call, left), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not call.done():
                call.cancel()
        if not call.done() or call.cancelled():  # cancel() only takes effect at the task's next step
            raise TransientServerError("server left the rotation during the request", address, req.rid)
        return call.result()

    async def _generate_once(
        self, address: str, prompt: list[int], req: ModelRequest, max_new_tokens: int, produced: int, lora_name: str | None = None
    ) -> protocol.GenerateChunk:
        body = protocol.generate_body(prompt, req.gconfig, max_new_tokens, produced, lora_name)
        status, reply = await request(
            self._session, "POST", address, "/generate", body, self.config.request_timeout, req.rid, "rollout.request_timeout"
        )
        if status != 200:
            raise GenerationError(f"/generate returned {status}: {protocol.error_message(reply)}", address, req.rid)
        try:
            chunk = protocol.parse_generate_reply(reply)
        except ValueError as e:
            raise GenerationError(f"malformed /generate reply: {e}", address, req.rid) from e
        if chunk.error_status is not None:
            raise GenerationError(f"/generate aborted with status {chunk.error_status}: {chunk.message}", address, req.rid)
        if len(chunk.tokens) > max_new_tokens:
            raise GenerationError(f"server returned {len(chunk.tokens)} tokens for max_new_tokens={max_new_tokens}", address, req.rid)
        return chunk

    async def _pick(self, group: str, work: int, rid: str) -> str:
        """A server for `group`, waiting up to setup_timeout for one to come back if all are down."""
        deadline = time.monotonic() + self.config.setup_timeout
        while True:
            address = self.pool.pick(group, work)
            if address is not None:
                return address
            if time.monotonic() > deadline:
                raise ServerUnavailable(
                    f"no server in rotation for {self.config.setup_timeout}s (all of {self.pool.addresses} are down)",
                    rid=rid,
                )
            await asyncio.sleep(min(0.5, self.config.health_check_interval))

    async def _after_failure(self, address: str, error: TransientServerError, failures: int) -> int:
        """Decide what a failed call means: a dead server leaves the rotation (the request moves
        on without using a retry); a live one is retried with exponential backoff."""
        if self.pool.is_healthy(address) and not await self.health.probe(address):
            self.health.take_out(address, f"a request failed ({error}) and so did a health probe")
            return failures
        if not self.pool.is_healthy(address):  # another request already took it out
            return failures
        failures += 1
        if failures > self.config.request_retries:
            raise ServerUnavailable(
                f"gave up after {failures} failed attempts (rollout.request_retries={self.config.request_retries}): {error}",
                address,
                error.rid,
            ) from error
        self.stats["retries"] += 1
        await asyncio.sleep(min(_MAX_BACKOFF, 0.2 * 2 ** (failures - 1)))
        return failures

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

    def prepare_batch(
        self, dataloader: Any, workflow: RolloutWorkflow, should_accept: AcceptFn | None = None
    ) -> Batch:
        """The next training batch, generated asynchronously within the staleness bound."""
        return self.executor.prepare_batch(dataloader, workflow, should_accept)
