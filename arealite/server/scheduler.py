"""Continuous batching: a thread that prefills newcomers and decodes the running batch.

Each loop iteration (1) applies queued commands (submit, abort, pause, resume), (2) admits
waiting requests while `max_running_requests` and the token budget allow and prefills them
in one forward, then (3) runs one decode step for every running row. Finished rows leave
the KV batch right away, so new requests join between decode steps. Every sampled token is
tagged with the weight version that produced it.

Pause modes (SGLang 0.5.6+): `in_place` stops stepping and keeps the KV cache; `retract`
moves running requests back to the front of the queue and drops their KV — on resume they
are prefilled again from prompt + output so far. `abort` mode is the app's job: it calls
`abort(abort_all=True)` and waits for every request to be answered.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass

import torch

from arealite.server.model_runner import ModelRunner
from arealite.server.prefill_plan import CPU_OVERHEAD_TOKENS, plan_groups
from arealite.server.request import ABORT_RUNNING, ABORT_WAITING, Req
from arealite.server.sampling import apply_penalties, sample

logger = logging.getLogger("arealite.server")


# The commands the HTTP thread queues for the scheduler thread.
@dataclass(frozen=True)
class _Submit:
    req: Req


@dataclass(frozen=True)
class _Abort:
    rid: str
    abort_all: bool


@dataclass(frozen=True)
class _Pause:
    mode: str  # in_place | retract
    done: Future  # resolved once applied


@dataclass(frozen=True)
class _Resume:
    pass


@dataclass(frozen=True)
class _Stop:
    pass


_Command = _Submit | _Abort | _Pause | _Resume | _Stop


@dataclass
class SchedulerLimits:
    max_running_requests: int = 64
    max_total_tokens: int = 1 << 20  # sum of prompt + max_new_tokens over running requests
    max_prefill_tokens: int = 16384  # padded tokens in one prefill forward
    prefill_group_overhead: float = CPU_OVERHEAD_TOKENS  # a prefill forward's fixed cost, in tokens (prefill_plan.py)


class Scheduler:
    """Owns the running batch; every public method is thread-safe (it only enqueues)."""

    def __init__(self, runner: ModelRunner, tokenizer, eos_ids: set[int], limits: SchedulerLimits, weight_version: str):
        self.runner = runner
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self.limits = limits
        self.weight_version = weight_version
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        self.kv = runner.new_batch()  # row i is running[i]
        self.paused = False
        self.last_beat = time.monotonic()
        self.decode_steps = 0
        self._commands: queue.Queue[_Command] = queue.Queue()
        self._stop = False
        self._admitting: list[Req] = []  # popped from `waiting`, not yet in `running`
        self._thread = threading.Thread(target=self._loop, name="arealite-scheduler", daemon=True)

    # ---- thread-safe API -------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._commands.put(_Stop())
        self._thread.join(timeout=10)

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def submit(self, req: Req) -> None:
        self._commands.put(_Submit(req))

    def abort(self, rid: str = "", abort_all: bool = False) -> None:
        self._commands.put(_Abort(rid, abort_all))

    def pause(self, mode: str) -> Future:
        """Stop stepping (`in_place`) or also drop KV (`retract`); the future resolves once applied."""
        done: Future = Future()
        self._commands.put(_Pause(mode, done))
        return done

    def resume(self) -> None:
        self._commands.put(_Resume())

    @property
    def num_requests(self) -> int:
        """Queued or running requests not yet answered; safe to read from the HTTP thread.

        A request is answered (`finish`) a moment before the scheduler thread drops it from
        its lists, so counting list lengths could see an already answered request.
        """
        return sum(1 for req in (*self.waiting, *self.running) if req.finish_reason is None)

    # ---- scheduler thread ----------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop:
            idle = self.paused or not (self.waiting or self.running)
            self._apply_commands(block=idle)
            self.last_beat = time.monotonic()
            if self._stop or self.paused:
                continue
            try:
                with torch.inference_mode():
                    self._admit()
                    if self.running:
                        self._decode_step()
            except Exception as e:  # a failed step must not leave clients hanging forever
                logger.exception("scheduler step failed; aborting the running batch")
                reason = {
                    "type": "abort",
                    "message": f"Internal error in the model step: {e}",
                    "status_code": 500,
                    "err_type": "InternalServerError",
                }
                for req in self.running + self._admitting:
                    if req.finish_reason is None:
                        req.finish(reason)
                self.running = []
                self.kv.clear()
            self._admitting = []
        for req in list(self.waiting) + self.running:
            req.finish(ABORT_WAITING if not req.started else ABORT_RUNNING)

    def _apply_commands(self, block: bool) -> None:
        try:
            cmd = self._commands.get(timeout=0.5) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        while True:
            self._apply(cmd)
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return

    def _apply(self, cmd: _Command) -> None:
        match cmd:
            case _Submit(req):
                self.waiting.append(req)
            case _Abort(rid, abort_all):
                self._abort(rid, abort_all)
            case _Pause(mode, done):
                self.paused = True
                if mode == "retract":
                    self._retract_all()
                if not done.done():  # the waiting HTTP call may have gone away
                    done.set_result(None)
            case _Resume():
                self.paused = False
            case _Stop():
                self._stop = True

    def _abort(self, rid: str, abort_all: bool) -> None:
        keep_waiting = deque()
        for req in self.waiting:
            if abort_all or req.rid == rid:
                req.finish(ABORT_WAITING)
            else:
                keep_waiting.append(req)
        self.waiting = keep_waiting
        gone = [i for i, r in enumerate(self.running) if abort_all or r.rid == rid]
        for i in gone:
            self.running[i].finish(ABORT_RUNNING)
        self._drop_rows(set(gone))

    def _retract_all(self) -> None:
        for req in reversed(self.running):
            req.num_retractions += 1
            self.waiting.appendleft(req)
        self.running = []
        self.kv.clear()

    def _drop_rows(self, rows: set[int]) -> None:
        if not rows:
            return
        order = self.kv.drop(rows)  # the batch may reorder rows (the lean cache moves its last rows into holes)
        self.running = [self.running[i] for i in order]

    def _reserved(self, req: Req) -> int:
        return len(req.prompt) + req.max_new_tokens

    def _admit(self) -> None:
        """Move waiting requests into the batch (FIFO) and prefill them in length-sorted groups
        (prefill_plan.py); the batch's rows follow the groups' order."""
        if not self.waiting:
            return
        batch: list[Req] = []
        reserved = sum(self._reserved(r) for r in self.running)
        longest = 0
        while self.waiting and len(self.running) + len(batch) < self.limits.max_running_requests:
            req = self.waiting[0]
            longest_if = max(longest, len(req.tokens))
            over_budget = reserved + self._reserved(req) > self.limits.max_total_tokens
            over_prefill = longest_if * (len(batch) + 1) > self.limits.max_prefill_tokens
            if (batch or self.running) and (over_budget or over_prefill):
                break
            batch.append(self.waiting.popleft())
            self._admitting.append(req)
            reserved += self._reserved(req)
            longest = longest_if
        scored = [r for r in batch if r.max_new_tokens == 0]
        if any(r.logprob_start_len >= 0 for r in scored):  # prompt logprobs only: a teacher's scoring call
            self._score([r for r in scored if r.logprob_start_len >= 0])
        for req in scored:
            req.started = True
            req.finish({"type": "length", "length": 0})
        batch = [r for r in batch if r.max_new_tokens > 0]
        lengths = [len(r.tokens) for r in batch]
        for group in plan_groups(lengths, self.limits.prefill_group_overhead):
            self._prefill([batch[i] for i in group])

    def _prefill(self, batch: list[Req]) -> None:
        """Prefill `batch` in one forward as the batch's next rows; sample their first tokens."""
        want_input = [r for r in batch if r.logprob_start_len >= 0 and not r.started]
        first = len(self.running)
        logits = self.runner.prefill(
            self.kv, [r.tokens for r in batch], all_logits=bool(want_input), adapters=[r.lora for r in batch]
        )
        self.running.extend(batch)  # they are the batch's rows first, first + 1, ...
        if want_input:
            self._input_logprobs(batch, logits)
            logits = logits[:, -1]
        for r in batch:
            r.started = True
        finished = self._sample_and_advance(batch, logits)
        self._drop_rows({first + i for i in finished})

    def _score(self, reqs: list[Req]) -> None:
        """Prompt logprobs of requests that generate nothing (`max_new_tokens` 0, as SGLang
        answers them): a prefill whose rows leave the batch at once, nothing sampled."""
        lengths = [len(r.tokens) for r in reqs]
        for group in plan_groups(lengths, self.limits.prefill_group_overhead):
            part = [reqs[i] for i in group]
            first = len(self.running)
            logits = self.runner.prefill(
                self.kv, [r.tokens for r in part], all_logits=True, adapters=[r.lora for r in part]
            )
            self._input_logprobs(part, logits)
            order = self.kv.drop(set(range(first, first + len(part))))  # survivors are the running rows
            self.running = [self.running[i] for i in order]

    def _input_logprobs(self, batch: list[Req], logits: torch.Tensor) -> None:
        """Prompt logprobs from position `logprob_start_len` on; the first entry is None (SGLang)."""
        length = logits.shape[1]
        for i, req in enumerate(batch):
            if req.logprob_start_len < 0 or req.input_logprobs:
                continue
            n = len(req.prompt)
            offset = length - n  # left padding
            temp = 1.0 if req.params.greedy else req.params.temperature
            lp = torch.log_softmax(logits[i, offset : offset + n - 1] / temp, dim=-1)
            values = lp.gather(1, torch.tensor(req.prompt[1:], device=lp.device)[:, None])[:, 0].tolist()
            req.input_logprobs = ([None] + values)[req.logprob_start_len :]

    def _decode_step(self) -> None:
        tokens = torch.tensor([r.output_ids[-1] for r in self.running], dtype=torch.long)
        logits = self.runner.decode(self.kv, tokens, adapters=[r.lora for r in self.running])
        self.decode_steps += 1
        finished = self._sample_and_advance(self.running, logits)
        self._drop_rows(finished)

    def _stop_ids(self, req: Req) -> list[int]:
        ids = list(req.params.stop_token_ids)
        return ids if req.params.ignore_eos else ids + sorted(self.eos_ids)

    def _mask_logits(self, reqs: list[Req], logits: torch.Tensor) -> None:
        """Penalties, logit bias and the min_new_tokens ban on stop tokens, in place."""
        vocab = logits.shape[-1]
        for i, req in enumerate(reqs):
            p = req.params
            if not p.changes_logits:
                continue
            if p.needs_penalties:
                if req.counts is None:
                    dev = logits.device
                    req.counts = torch.zeros(vocab, device=dev)
                    req.counts.index_add_(
                        0,
                        torch.tensor(req.output_ids, dtype=torch.long, device=dev),
                        torch.ones(len(req.output_ids), device=dev),
                    )
                    req.seen = torch.zeros(vocab, dtype=torch.bool, device=dev)
                    req.seen[torch.tensor(req.tokens, dtype=torch.long, device=dev)] = True
                apply_penalties(logits[i : i + 1], req.counts[None], req.seen[None], [p])
            if p.logit_bias:
                for tok, bias in p.logit_bias.items():
                    logits[i, int(tok)] += bias
            if len(req.output_ids) < p.min_new_tokens:
                logits[i, self._stop_ids(req)] = float("-inf")

    def _sample_and_advance(self, reqs: list[Req], logits: torch.Tensor) -> set[int]:
        """Sample one token per row, record it, and return the rows that finished."""
        self._mask_logits(reqs, logits)
        k = max(r.top_logprobs_num for r in reqs)
        processed = [r.processed_logprobs for r in reqs]
        out = sample(logits, [r.params for r in reqs], [r.uniforms for r in reqs], k, processed)
        tokens, logprobs = out.tokens.tolist(), out.logprobs.tolist()
        tops = (out.top_logprobs.tolist(), out.top_ids.tolist()) if k else None
        finished = set()
        version = self.weight_version
        for i, req in enumerate(reqs):
            token = tokens[i]
            req.output_ids.append(token)
            req.output_logprobs.append(logprobs[i])
            req.output_versions.append(version)
            if req.top_logprobs_num:
                n = req.top_logprobs_num
                req.output_top.append(list(zip(tops[0][i][:n], tops[1][i][:n])))
            if req.counts is not None:
                req.counts[token] += 1
                req.seen[token] = True
            reason = self._finish_reason(req, token)
            if reason is not None:
                finished.add(i)
                req.finish(reason)
            elif req.stream:
                req.emit(False)
        return finished

    def _finish_reason(self, req: Req, token: int) -> dict | None:
        """SGLang's check order: length, then stop token, then stop string."""
        if len(req.output_ids) >= req.max_new_tokens:
            return {"type": "length", "length": req.max_new_tokens}
        if len(req.output_ids) <= req.params.min_new_tokens - 1:
            return None
        if token in req.params.stop_token_ids or (not req.params.ignore_eos and token in self.eos_ids):
            return {"type": "stop", "matched": token}
        if req.params.stop:
            text = self.tokenizer.decode(req.output_ids, skip_special_tokens=req.params.skip_special_tokens)
            for s in req.params.stop:
                if s in text:
                    return {"type": "stop", "matched": s}
        return None
