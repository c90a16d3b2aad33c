"""`SampleGenerator`: one sample through interruptions, retries and failovers (docs/protocol.md).

An `abort` reply (a pause for a weight sync) has its partial output appended to the prompt
and is resubmitted with the remaining budget once the client resumes. A failed call is
retried with backoff on a live server; a server that also fails a health probe leaves the
rotation and the request moves elsewhere without using a retry. Every output token carries
the weight version that produced it (never a newer one, see `token_versions`).

The generator receives what it uses: the transport, the server pool, the version gate, the
config, a health probe and a progress callback (the executor's watchdog).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from arealite.backends.contract import Backend, GenerateChunk, clamp_max_new_tokens, error_message, token_versions
from arealite.backends.sglang import SGLangProtocol
from arealite.config import InferenceEngineConfig
from arealite.rollout.errors import GenerationError, TransientServerError
from arealite.rollout.failover import Failover
from arealite.rollout.gate import VersionGate
from arealite.rollout.servers import ServerPool
from arealite.rollout.transport import Transport
from arealite.types import ModelRequest, ModelResponse


class SampleGenerator:
    """Generates samples on the pool's servers; counts requests, interruptions and retries."""

    def __init__(
        self,
        transport: Transport,
        pool: ServerPool,
        gate: VersionGate,
        config: InferenceEngineConfig,
        probe: Callable[[str], Awaitable[bool]],
        on_progress: Callable[[], None],
        server_protocol: Backend | None = None,
    ) -> None:
        self._protocol = server_protocol or SGLangProtocol()
        self._transport = transport
        self._pool = pool
        self._gate = gate
        self.config = config
        self._probe = probe
        self._on_progress = on_progress
        self.stats: dict[str, int] = {"requests": 0, "interruptions": 0, "retries": 0}
        self._failover = Failover(pool, config, probe, self.stats)

    async def agenerate(self, req: ModelRequest) -> ModelResponse:
        """One sample for `req`, on the event loop."""
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
            await self._gate.wait_unpaused()  # resubmissions wait out a weight update client-side
            address = await self._failover.pick(group, remaining, req.rid)
            sent_version = self._gate.version  # the servers hold at least this version (see token_versions)
            lora_name = self._gate.lora_name  # the adapter of that version (weight_update=lora)
            prompt = resp.input_tokens + resp.output_tokens
            context = self._pool.context_length(address)
            now_budget = clamp_max_new_tokens(remaining, len(prompt), context)
            if now_budget <= 0:
                self._pool.release(address, remaining)
                if resp.output_len == 0:
                    raise GenerationError(
                        f"prompt of {len(prompt)} tokens leaves no room in the server's context length "
                        f"{context}; filter long prompts (dataset.max_prompt_tokens)",
                        address,
                        req.rid,
                    )
                resp.stop_reason = "length"  # the context is full
                break
            try:
                # a server taken out of rotation meanwhile fails the request at once (ServerPool.on_take_out)
                chunk = await self._generate_once(
                    address, prompt, req, now_budget, resp.output_len, lora_name, sent_version
                )
            except TransientServerError as e:
                failures = await self._failover.after_failure(address, e, failures)
                continue
            finally:
                self._pool.release(address, remaining)
            self._on_progress()
            # the servers ban the stop tokens while fewer than min_new_tokens are out (the
            # adapters carry the count over segments): the trainer replays it on these tokens
            produced = resp.output_len
            resp.output_stop_banned += [produced + i < req.gconfig.min_new_tokens for i in range(len(chunk.tokens))]
            resp.output_tokens += chunk.tokens
            resp.output_logprobs += chunk.logprobs
            resp.output_versions += token_versions(chunk, sent_version)
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

    async def _generate_once(
        self,
        address: str,
        prompt: list[int],
        req: ModelRequest,
        max_new_tokens: int,
        produced: int,
        lora_name: str | None = None,
        version: int = 0,
    ) -> GenerateChunk:
        server = self._protocol
        try:
            body = server.generate_body(prompt, req.gconfig, max_new_tokens, produced, lora_name, version)
        except ValueError as e:  # a setting this backend refuses
            raise GenerationError(str(e), address, req.rid) from e
        path = server.generate_path
        status, reply = await self._transport.request(
            "POST", address, path, body, self.config.request_timeout, req.rid, "rollout.request_timeout"
        )
        if status != 200:
            raise GenerationError(f"{path} returned {status}: {error_message(reply)}", address, req.rid)
        try:
            chunk = server.parse_generate(reply)
        except ValueError as e:
            raise GenerationError(f"malformed {path} reply: {e}", address, req.rid) from e
        if chunk.error_status is not None:
            raise GenerationError(f"{path} aborted with status {chunk.error_status}: {chunk.message}", address, req.rid)
        if chunk.tokens and body.get("processed_logprobs") and not chunk.processed_logprobs:
            raise GenerationError(
                "the server did not report processed (truncated-distribution) logprobs, which "
                "gconfig.truncated_logprobs=true needs with top_p/top_k/min_p truncating; real SGLang never does "
                "(docs/protocol.md §1.6): use the built-in server or set gconfig.truncated_logprobs=false",
                address,
                req.rid,
            )
        if len(chunk.tokens) > max_new_tokens:
            raise GenerationError(
                f"server returned {len(chunk.tokens)} tokens for max_new_tokens={max_new_tokens}", address, req.rid
            )
        return chunk
