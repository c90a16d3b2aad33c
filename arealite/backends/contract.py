"""What every server backend adapter is (`Backend`, a `typing.Protocol`) and the values it trades in.

The rollout client (rollout/client.py), the teacher (rollout/teacher.py) and the launchers use a
backend only through this contract: request bodies and reply parsing, pause / resume, disk and
distributed weight-sync calls, the version read, the start-up check, prompt logprobs for a
teacher, and `refuse(config)`, every setting the backend cannot honour with its fix.
docs/backends.md describes the seam; sglang.py and vllm.py are the two adapters.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from arealite.config import GenerationHyperparameters
from arealite.types import WeightUpdateMeta

# The only finish types that end a request; "abort" without an error status means "interrupted".
FINAL_STOP_REASONS = ("stop", "length")

# Seconds an idle kept-alive connection stays open: the rollout client's pool (rollout/transport.py)
# and the servers arealite starts (vllm_launch.py) use this one value, so neither closes the other's.
KEEPALIVE_S = 600

Call = tuple[str, dict[str, Any] | None]  # (path, JSON body or None) of one POST
Get = Callable[[str, str], Awaitable[tuple[int, Any]]]  # get(address, path) -> (status, reply)


@dataclass
class GenerateChunk:
    """What one generate call returned (one segment of a possibly interrupted request)."""

    tokens: list[int]
    logprobs: list[float]
    finish_type: str  # stop | length | abort
    server_version: int | None  # weight version reported by the server, if it is an integer
    version_spans: list[tuple[int, int, int]] = field(default_factory=list)  # (version, start, end)
    error_status: int | None = None  # an abort carrying an error status (>= 400)
    message: str = ""
    processed_logprobs: bool = False  # the server says its logprobs are the truncated ones (protocol.md §1.6)


@dataclass
class DistributedCalls:
    """One server's calls of a distributed sync: `before` in order, then `buckets[i]` while the
    trainer broadcasts bucket i, then `after` in order."""

    before: list[Call]
    buckets: list[Call]
    after: list[Call]


class Backend(Protocol):
    """The contract of a server backend's adapter (module docstring; docs/backends.md)."""

    name: str  # for messages: "SGLang", "vLLM"
    generate_path: str
    liveness_path: str  # answers while paused
    version_path: str
    resume_call: Call
    sends_seeds: bool  # whether generate bodies carry gconfig.sampling_seed (the start-up check may turn it off)

    def generate_body(
        self,
        input_ids: list[int],
        gconfig: GenerationHyperparameters,
        max_new_tokens: int,
        produced: int = 0,
        lora_name: str | None = None,
        version: int = 0,
    ) -> dict[str, Any]:
        """One generate call's JSON body; ValueError names a setting this backend refuses."""
        ...

    def parse_generate(self, reply: Any) -> GenerateChunk: ...

    def pause_call(self, mode: str) -> Call: ...

    def disk_update_calls(self, path: str, version: int, keep_requests: bool, paused: bool) -> list[Call]: ...

    def group_join_call(self, meta: WeightUpdateMeta, rank_offset: int, world_size: int) -> Call: ...

    def group_leave_call(self, group_name: str) -> Call: ...

    def distributed_calls(self, meta: WeightUpdateMeta, keep_requests: bool, paused: bool) -> DistributedCalls: ...

    def read_version(self, reply: Any) -> str: ...

    def unsupported(self, weight_update: str) -> str | None:
        """Why this backend cannot sync weights by `weight_update`; None: it can."""
        ...

    async def check_server(self, get: Get, address: str) -> None:
        """Refuse (ValueError naming the flag) a server started without what the client relies on."""
        ...

    def prompt_logprobs_call(self, rows: list[tuple[list[int], int]], gconfig: GenerationHyperparameters) -> Call:
        """A teacher's request: for each (tokens, start), the logprobs of tokens[start:] given what precedes."""
        ...

    def parse_prompt_logprobs(self, reply: Any, rows: list[tuple[list[int], int]]) -> list[list[float]]:
        """The logprob lists of `prompt_logprobs_call`'s reply (entry 0 kept as 0); ValueError if malformed."""
        ...

    def model_info_call(self) -> str:
        """The GET path that names the served model's files (`model_path`, `tokenizer_path`)."""
        ...

    def tokenize_call(self, text: str) -> Call:
        """A request whose reply says how the server tokenizes `text` (a teacher's tokenizer check)."""
        ...

    def parse_tokenized(self, reply: Any) -> list[int]: ...

    def refuse(self, config: Any) -> list[str]:
        """Every setting of an experiment config (GRPOConfig) this backend cannot honour, each with its fix."""
        ...


def token_versions(chunk: GenerateChunk, sent_version: int) -> list[int]:
    """The weight version of each token in `chunk`, never newer than the weights that made it.

    The server's `weight_versions` spans are exact. Without them, a call kept across a weight
    update (in_place / retract pause) mixes versions while `weight_version` is only the server's
    version at reply time, so the other tokens get min(server's version, `sent_version`), the
    client's version when the call was sent (the servers already held it: a lower bound for
    every token of the call). An older label only makes the staleness check stricter.
    """
    base = sent_version if chunk.server_version is None else min(chunk.server_version, sent_version)
    versions = [base] * len(chunk.tokens)
    for v, start, end in chunk.version_spans:
        start, end = max(0, start), min(end, len(versions))
        if end > start:
            versions[start:end] = [v] * (end - start)
    return versions


def clamp_max_new_tokens(budget: int, prompt_len: int, context_length: int | None) -> int:
    """Servers reject prompt + max_new_tokens beyond the context (protocol.md §1.5); clamp instead."""
    if context_length is None:
        return budget
    return max(0, min(budget, context_length - prompt_len - 1))


def error_message(body: Any) -> str:
    """A short error text from any of the servers' error envelopes (protocol.md §6)."""
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict):
            return str(err.get("message", err))[:500]
        if err is not None:
            return str(err)[:500]
        if "message" in body:
            return str(body["message"])[:500]
        if body.get("error_message"):  # the LoRA endpoints' replies
            return str(body["error_message"])[:500]
        if "detail" in body:
            return str(body["detail"])[:500]
    return str(body)[:500]


def group_fields(meta: WeightUpdateMeta, rank_offset: int, world_size: int) -> dict[str, Any]:
    """What a server needs to join the trainer's weight-update group (protocol.md §3.3) as `rank_offset`."""
    return {
        "master_address": meta.master_address,
        "master_port": int(meta.master_port),
        "rank_offset": int(rank_offset),
        "world_size": int(world_size),
        "group_name": meta.group_name,
        "backend": meta.backend,
        "timeout": float(meta.timeout),  # arealite's field (SGLang ignores it): bounds the server's waits
    }


def bucket_spec(bucket: list[tuple[str, Any, Any]]) -> tuple[list[str], list[str], list[list[int]]]:
    """(names, torch dtype names, shapes) of one bucket of `WeightUpdateMeta.buckets`."""
    names = [name for name, _, _ in bucket]
    dtypes = [str(dtype).removeprefix("torch.") for _, dtype, _ in bucket]
    return names, dtypes, [[int(d) for d in shape] for _, _, shape in bucket]
