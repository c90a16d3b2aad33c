"""`TeacherClient`: a teacher model's logprobs of the student's sampled tokens (on-policy distillation).

The teacher's servers are asked, through their backend's adapter (`prompt_logprobs_call`,
arealite/backends/), for the prompt logprobs of each sequence from one token before its first
loss token, at the student's temperature, up to `distill.max_batch_size` sequences per request,
spread over the servers by least outstanding work; a backend or a truncation it cannot score
under is refused at construction. Failures are handled by the rollout client's rule
(failover.py) with its parts and settings (`rollout.request_retries`, `rollout.setup_timeout`,
`rollout.health_check_*`); a server rejoins once healthy (it never needs weights). At start the
teacher's tokenizer is compared with the student's.
The advantage it feeds: arealite/algo/distill.py; the config: arealite/config/distill.py.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from typing import Any

import torch

from arealite import backends
from arealite.algo.distill import distill_advantages
from arealite.backends.contract import error_message
from arealite.config import DistillConfig, GenerationHyperparameters, GRPOConfig, InferenceEngineConfig
from arealite.rollout.errors import GenerationError, TransientServerError
from arealite.rollout.failover import Failover
from arealite.rollout.gate import VersionGate
from arealite.rollout.health import HealthMonitor
from arealite.rollout.loop import EventLoopThread
from arealite.rollout.servers import ServerPool
from arealite.rollout.transport import Transport
from arealite.utils.net import TEACHER_ADDRS_ENV

Batch = dict[str, Any]


def teacher_addresses(config: DistillConfig) -> list[str]:
    """`distill.address`, else the launcher's `AREAL_TEACHER_SERVER_ADDRS`; ValueError naming the fix."""
    raw = config.address or os.environ.get(TEACHER_ADDRS_ENV, "")
    addrs = [a.strip().removeprefix("http://") for a in raw.split(",") if a.strip()]
    if not addrs:
        raise ValueError(
            f"no teacher server: set distill.address=host:port, or launch with `python -m arealite.launcher.local`, "
            f"which serves distill.teacher_path={config.teacher_path!r} and exports {TEACHER_ADDRS_ENV}"
        )
    return addrs


class TeacherClient:
    """Scores trajectory batches with the teacher servers (module docstring). A context manager."""

    def __init__(
        self,
        config: DistillConfig,
        failure: InferenceEngineConfig,
        gconfig: GenerationHyperparameters,
        student_tokenizer: str,
        addresses: list[str] | None = None,
        backend: str = "sglang",
    ) -> None:
        """`backend`: the teacher servers' (server.backend when the launcher serves the teacher; an
        SGLang-protocol server at distill.address otherwise). ValueError, naming the fix, where that
        backend cannot score under the student's temperature and truncation, or with
        `gconfig.min_new_tokens`, whose stop-token ban the student's logprobs carry and the teacher's
        prompt logprobs cannot."""
        if gconfig.min_new_tokens > 0:
            raise ValueError(
                f"distillation with gconfig.min_new_tokens={gconfig.min_new_tokens}: the student's first answer "
                "tokens are sampled, and their logprobs taken, without the stop tokens, and a teacher's prompt "
                "logprobs cannot replay that ban, so the reverse KL would be off by -log(1 - p(stop)) on those "
                "tokens; set gconfig.min_new_tokens=0"
            )
        self.server = backends.adapter(backend)
        self.server.prompt_logprobs_call([], gconfig)  # refuses here what it cannot score
        self.config, self.failure, self.gconfig = config, failure, gconfig
        self.student_tokenizer = student_tokenizer
        self.pool = ServerPool(addresses or teacher_addresses(config))
        self.transport = Transport()
        self.pool.on_take_out.append(self.transport.abandon)
        self.health = HealthMonitor(self.transport, self.pool, VersionGate(), failure, rejoin=self._rejoin)
        self._loop = EventLoopThread("arealite-teacher")
        self._chunks = itertools.count()
        self.stats = {"teacher_requests": 0, "teacher_retries": 0}
        self._failover = Failover(
            self.pool, failure, self.health.probe, self.stats, "teacher_retries", "a teacher request"
        )

    @classmethod
    def from_config(cls, config: GRPOConfig) -> TeacherClient:
        """The client of an experiment's `distill:` section (its teacher servers from the launcher)."""
        if config.distill is None:
            raise ValueError("the config has no distill: section; add one (distill.teacher_path=DIR) to distil")
        student = config.tokenizer_path or config.actor.path
        backend = "sglang" if config.distill.address else config.server.backend
        return cls(config.distill, config.rollout, config.gconfig, student, backend=backend)

    async def _rejoin(self, address: str) -> bool:
        await self.health.bring_back(address)  # a teacher's weights never change: nothing to catch up
        return True

    # ---- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> TeacherClient:
        self.initialize()
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    def initialize(self) -> None:
        """Wait for every teacher server's /health, then refuse a teacher with another tokenizer."""
        self._loop.start()
        try:
            self._loop.run(self._ainitialize())
        except BaseException:
            self.destroy()
            raise

    async def _ainitialize(self) -> None:
        await self.transport.open()
        await self.health.wait_until_up("teacher servers", "rollout.setup_timeout")
        await self._check_tokenizer(self.pool.addresses[0])
        self.health.start()

    def destroy(self) -> None:
        if not self._loop.running:
            return
        try:
            self._loop.run(self._adestroy(), timeout=30)
        finally:
            self._loop.stop()

    async def _adestroy(self) -> None:
        self.health.stop()
        await self.transport.close()

    # ---- scoring ---------------------------------------------------------------------------
    def compute_logp(self, batch: Batch) -> torch.Tensor:
        """The teacher's logprobs [B, T] (fp32) of each loss token given what precedes it, at
        `gconfig.temperature`; 0 off the loss mask. Aligned as `batch["logprobs"]`. Scores the
        workflow's `response_mask` where `compute_advantages` cut truncated answers from the mask,
        so the statistics see every answer."""
        ids, mask = batch["input_ids"].cpu(), batch.get("response_mask", batch["loss_mask"]).cpu().bool()
        lengths = batch["attention_mask"].cpu().sum(-1).tolist()
        out = torch.zeros(ids.shape, dtype=torch.float32)
        rows = []  # (row, tokens, logprob_start_len): start one token before the first loss token
        for b, n in enumerate(lengths):
            scored = mask[b, :n].nonzero()
            if len(scored):
                rows.append((b, ids[b, :n].tolist(), max(int(scored[0]) - 1, 0)))
        size = self.config.max_batch_size
        chunks = [rows[i : i + size] for i in range(0, len(rows), size)]
        for chunk, replies in zip(chunks, self._loop.run(self._ascore_all(chunks))):
            for (b, tokens, start), values in zip(chunk, replies):
                out[b, start + 1 : len(tokens)] = torch.tensor(values[1:], dtype=torch.float32)
        return torch.where(mask, out, torch.zeros_like(out)).to(batch["loss_mask"].device)

    def distill(self, batch: Batch) -> Batch:
        """After `actor.compute_advantages(batch)`: `batch["teacher_logp"]` (scored here unless
        set) and the advantages replaced by the distillation mix (`distill_advantages`)."""
        if "teacher_logp" not in batch:
            batch["teacher_logp"] = self.compute_logp(batch)
        c = self.config
        batch["advantages"] = distill_advantages(
            batch["advantages"],
            batch["logprobs"],
            batch["teacher_logp"],
            batch["loss_mask"],
            c.kl_coef,
            c.reward_weight,
        )
        return batch

    async def _ascore_all(self, chunks: list[list[tuple[int, list[int], int]]]) -> list[list[list[float]]]:
        return await asyncio.gather(*(self._ascore(chunk) for chunk in chunks))

    async def _ascore(self, chunk: list[tuple[int, list[int], int]]) -> list[list[float]]:
        """One request's logprob lists (entry k: token start + k), retried and failed over as a rollout's."""
        rows = [(tokens, start) for _, tokens, start in chunk]
        path, body = self.server.prompt_logprobs_call(rows, self.gconfig)
        group, work = f"teacher-{next(self._chunks)}", sum(len(t) for _, t, _ in chunk)
        failures = 0
        self.stats["teacher_requests"] += 1
        while True:
            address = await self._failover.pick(group, work, servers="teacher server")
            try:
                status, reply = await self.transport.request(
                    "POST", address, path, body, self.config.request_timeout, group, "distill.request_timeout"
                )
            except TransientServerError as e:
                failures = await self._failover.after_failure(address, e, failures)
                continue
            finally:
                self.pool.release(address, work)
            self.pool.forget(group)
            if status != 200:
                raise GenerationError(f"teacher {path} returned {status}: {error_message(reply)}", address)
            try:
                return self.server.parse_prompt_logprobs(reply, rows)
            except ValueError as e:
                raise GenerationError(f"malformed teacher reply: {e}", address) from e

    async def _check_tokenizer(self, address: str) -> None:
        """Refuse a teacher whose tokenizer differs from the student's, naming both (ValueError)."""
        timeout, setting = self.failure.health_check_timeout, "rollout.health_check_timeout"
        info_path = self.server.model_info_call()
        status, info = await self.transport.request("GET", address, info_path, None, timeout, setting=setting)
        info = info if status == 200 and isinstance(info, dict) else {}
        teacher_path = info.get("tokenizer_path") or info.get("model_path") or ""
        student = _load_tokenizer(self.student_tokenizer)
        if teacher_path and os.path.isdir(teacher_path):  # the teacher's files are here: compare vocabularies
            detail = vocab_difference(student, _load_tokenizer(teacher_path))
        else:  # a teacher elsewhere: compare how it tokenizes a probe text with how the student does
            path, body = self.server.tokenize_call(PROBE_TEXT)
            status, reply = await self.transport.request("POST", address, path, body, self.config.request_timeout)
            if status != 200:
                raise GenerationError(f"teacher {path} returned {status}: {error_message(reply)}", address)
            got = self.server.parse_tokenized(reply)
            want = student.encode(PROBE_TEXT)
            detail = (
                None
                if got == want
                else f"the probe text {PROBE_TEXT!r} encodes to {got[:12]}... there, {want[:12]}... here"
            )
        if detail:
            raise ValueError(
                f"the teacher (tokenizer {teacher_path or '?'} served at {address}) and the student (tokenizer "
                f"{self.student_tokenizer}) do not share a tokenizer: {detail}. Distillation compares the two models' "
                "logprobs token by token; pick a teacher with the student's tokenizer (distill.teacher_path / "
                "distill.address) or a student with the teacher's (actor.path, tokenizer_path)"
            )


PROBE_TEXT = "Distil 12 + 345 = 357, then <|im_end|> Ünïcode and\n  spaces."


def _load_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer  # here: the launchers import arealite.rollout without transformers

    return AutoTokenizer.from_pretrained(path)


def vocab_difference(student: Any, teacher: Any) -> str | None:
    """None if the two tokenizers map the same strings to the same ids, else what differs."""
    a, b = student.get_vocab(), teacher.get_vocab()
    if a == b:
        return None
    moved = sorted(t for t in a.keys() & b.keys() if a[t] != b[t])
    only = sorted(a.keys() ^ b.keys())
    example = f"e.g. {moved[0]!r} is id {a[moved[0]]} here and {b[moved[0]]} there" if moved else f"e.g. {only[0]!r}"
    counts = f"vocabularies of {len(a)} and {len(b)} tokens, {len(moved)} at other ids and {len(only)} in one only"
    return f"{counts} ({example})"
