"""SGLang's native /generate protocol: building request bodies and parsing replies.

Pure functions, tolerant of the differences between SGLang 0.5.5 and 0.5.23 listed in
docs/protocol.md §7: token ids come from `meta_info.output_token_logprobs` when the
top-level `output_ids` is absent, every `meta_info` key except `id` and `finish_reason` is
optional, unknown keys are ignored, and no `null` value is ever sent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from arealite.config import GenerationHyperparameters
from arealite.types import WeightUpdateMeta

# The only finish types that end a request; "abort" without an error status means "interrupted".
FINAL_STOP_REASONS = ("stop", "length")


@dataclass
class GenerateChunk:
    """What one /generate call returned (one segment of a possibly interrupted request)."""

    tokens: list[int]
    logprobs: list[float]
    finish_type: str  # stop | length | abort
    server_version: int | None  # weight version reported by the server, if it is an integer
    version_spans: list[tuple[int, int, int]] = field(default_factory=list)  # (version, start, end)
    error_status: int | None = None  # an abort carrying an error status (>= 400)
    message: str = ""
    processed_logprobs: bool = False  # the server says its logprobs are of the truncated distribution (§1.6)


def sampling_params(gconfig: GenerationHyperparameters) -> dict[str, Any]:
    """SGLang `sampling_params` for one request; a setting at its default is left out, so no
    null is ever sent and older servers see only keys they know."""
    params: dict[str, Any] = {
        "max_new_tokens": gconfig.max_new_tokens,
        "temperature": gconfig.temperature,
        "top_p": gconfig.top_p,
        "top_k": gconfig.top_k,
    }
    # Each optional setting in turn, not a dict of them filtered: this runs for every request.
    if gconfig.min_new_tokens:
        params["min_new_tokens"] = gconfig.min_new_tokens
    if gconfig.stop_token_ids:
        params["stop_token_ids"] = list(gconfig.stop_token_ids)
    if gconfig.stop:
        params["stop"] = list(gconfig.stop)
    if gconfig.frequency_penalty:
        params["frequency_penalty"] = gconfig.frequency_penalty
    if gconfig.sampling_seed is not None:
        params["sampling_seed"] = int(gconfig.sampling_seed)
    if gconfig.min_p:
        params["min_p"] = gconfig.min_p
    return params


def generate_body(
    input_ids: list[int] | list[str],
    gconfig: GenerationHyperparameters,
    max_new_tokens: int,
    produced: int = 0,
    lora_name: str | None = None,
    top_logprobs: int = 0,
) -> dict[str, Any]:
    """The JSON body for one non-streamed /generate call with logprobs. `input_ids`: one
    prompt's token ids, or a batch of prompt texts (SGLang's `text` list: one result each).
    `produced` is how many tokens earlier (interrupted) calls of the same sample returned: they
    count towards `min_new_tokens`. `lora_name`: the loaded LoRA adapter to generate with
    (SGLang's `lora_path`, which takes the adapter's name); None: the base model.
    `top_logprobs`: also the most likely tokens at each step, with their text."""
    params = sampling_params(gconfig)
    params["max_new_tokens"] = int(max_new_tokens)
    if "min_new_tokens" in params:
        min_left = min(max(0, params["min_new_tokens"] - produced), max_new_tokens)
        if min_left:
            params["min_new_tokens"] = int(min_left)
        else:
            del params["min_new_tokens"]
    texts = bool(input_ids) and isinstance(input_ids[0], str)
    body: dict[str, Any] = {
        **({"text": list(input_ids)} if texts else {"input_ids": list(map(int, input_ids))}),  # 0.5.22+ rejects floats
        "sampling_params": params,
        "return_logprob": True,
        "stream": False,
    }
    if top_logprobs:
        body["top_logprobs_num"] = int(top_logprobs)
        body["return_text_in_logprobs"] = True
    if lora_name:
        body["lora_path"] = lora_name
    if gconfig.logprob_truncation is not None:
        # arealite's extension (§1.6): unknown top-level keys are ignored by every SGLang release.
        body["processed_logprobs"] = True
    return body


def clamp_max_new_tokens(budget: int, prompt_len: int, context_length: int | None) -> int:
    """SGLang rejects prompt + max_new_tokens beyond the context (§1.5); clamp instead."""
    if context_length is None:
        return budget
    return max(0, min(budget, context_length - prompt_len - 1))


def _as_int_version(value: Any) -> int | None:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return None


def parse_generate_reply(reply: Any) -> GenerateChunk:
    """Parse a non-streamed /generate reply (a dict; a one-item list is unwrapped).

    Raises ValueError when a required key is missing, naming it.
    """
    if isinstance(reply, list):
        if len(reply) != 1:
            raise ValueError(f"expected one /generate result, got a list of {len(reply)}")
        reply = reply[0]
    if not isinstance(reply, dict) or not isinstance(reply.get("meta_info"), dict):
        raise ValueError("/generate reply has no 'meta_info' object")
    meta = reply["meta_info"]
    finish = meta.get("finish_reason") or {}
    finish_type = finish.get("type") if isinstance(finish, dict) else str(finish)
    if finish_type not in ("stop", "length", "abort"):
        raise ValueError(f"/generate reply has unknown finish_reason {finish!r}")
    triples = meta.get("output_token_logprobs")
    if triples is None:
        raise ValueError("/generate reply has no meta_info.output_token_logprobs; send return_logprob=true")
    # orjson writes -inf as null (§1.6); one comprehension: this runs for every generated token
    logprobs = [-math.inf if t[0] is None else float(t[0]) for t in triples]
    tokens = reply.get("output_ids")
    if tokens is None:  # <= 0.4.10 omits output_ids (§7)
        tokens = [int(t[1]) for t in triples]
    tokens = list(map(int, tokens))
    if len(tokens) != len(logprobs):
        raise ValueError(f"/generate reply has {len(tokens)} output_ids but {len(logprobs)} logprobs")
    spans = []
    for span in meta.get("weight_versions") or []:  # 0.5.20+
        v = _as_int_version(span.get("version")) if isinstance(span, dict) else None
        if v is not None:
            spans.append((v, int(span.get("start", 0)), int(span.get("end", len(tokens)))))
    status = finish.get("status_code") if isinstance(finish, dict) else None
    return GenerateChunk(
        tokens=tokens,
        logprobs=logprobs,
        finish_type=finish_type,
        server_version=_as_int_version(meta.get("weight_version")),
        version_spans=spans,
        error_status=int(status) if finish_type == "abort" and status is not None and int(status) >= 400 else None,
        message=str(finish.get("message", "")) if isinstance(finish, dict) else "",
        processed_logprobs=meta.get("processed_logprobs") is True,
    )


def token_versions(chunk: GenerateChunk, sent_version: int) -> list[int]:
    """The weight version of each token in `chunk`, never newer than the weights that made it.

    The server's `weight_versions` spans (0.5.20+) are exact. Without them, a call kept across
    a weight update (in_place / retract pause) mixes versions while `weight_version` is only
    the server's version at reply time, so the other tokens get
    min(server's version, `sent_version`). `sent_version` is the client's version when the
    call was sent; the servers already held it (the client moves to a version only after
    they confirm it), so it is a lower bound for every token of the call. An older label only
    makes the executor's staleness check (oldest token) stricter, never looser.
    """
    base = sent_version if chunk.server_version is None else min(chunk.server_version, sent_version)
    versions = [base] * len(chunk.tokens)
    for v, start, end in chunk.version_spans:
        start, end = max(0, start), min(end, len(versions))
        if end > start:
            versions[start:end] = [v] * (end - start)
    return versions


def error_message(body: Any) -> str:
    """A short error text from any of SGLang's error envelopes (§6)."""
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


Call = tuple[str, dict[str, Any] | None]  # (path, JSON body or None) of one POST


@dataclass
class DistributedCalls:
    """One server's calls of a distributed sync: `before` in order, then `buckets[i]` while the
    trainer broadcasts bucket i, then `after` in order."""

    before: list[Call]
    buckets: list[Call]
    after: list[Call]


def group_fields(meta: WeightUpdateMeta, rank_offset: int, world_size: int) -> dict[str, Any]:
    """What a server needs to join the trainer's weight-update group (§3.3) as `rank_offset`."""
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


class SGLangProtocol:
    """What the shared client core (generation, pausing, weight updates, health) sends to and reads
    from an SGLang-protocol server; `vllm_protocol.VLLMProtocol` is the same for vLLM's RL routes."""

    name = "SGLang"
    generate_path = "/generate"
    liveness_path = "/get_model_info"  # answers while paused (SGLang's /health generates, which blocks)
    version_path = "/get_model_info"
    resume_call: Call = ("/continue_generation", {})

    def generate_body(
        self,
        input_ids: list[int],
        gconfig: GenerationHyperparameters,
        max_new_tokens: int,
        produced: int = 0,
        lora_name: str | None = None,
        version: int = 0,
    ) -> dict[str, Any]:
        body = generate_body(input_ids, gconfig, max_new_tokens, produced, lora_name)
        if body.get("processed_logprobs") and gconfig.truncation_rule not in (None, "joint"):
            raise ValueError(
                f"gconfig.truncation_rule={gconfig.truncation_rule!r}: an SGLang-protocol server truncates jointly "
                "(top_k, top_p and min_p on one distribution), and the trainer's logprobs replay "
                "gconfig.truncation_rule; set gconfig.truncation_rule='joint' or leave it unset"
            )
        return body

    def parse_generate(self, reply: Any) -> GenerateChunk:
        return parse_generate_reply(reply)

    def pause_call(self, mode: str) -> Call:
        # A JSON body is required from 0.5.6; <= 0.5.5 ignores it and always aborts (§2.1), which
        # the resubmission path in generation.py absorbs.
        return "/pause_generation", {"mode": mode}

    def disk_update_calls(self, path: str, version: int, keep_requests: bool, paused: bool) -> list[Call]:
        """The calls that load the weights in folder `path` as `version`. `keep_requests`: paused
        requests stay (pause_mode in_place / retract); `paused`: the server is paused (a server
        that rejoins the rotation is not)."""
        fields = {"flush_cache": False} if keep_requests else {"abort_all_requests": True}
        return [("/update_weights_from_disk", {"model_path": path, "weight_version": str(version), **fields})]

    def group_join_call(self, meta: WeightUpdateMeta, rank_offset: int, world_size: int) -> Call:
        """The call that has a server join `meta`'s group; it returns once every member joined."""
        return "/init_weights_update_group", group_fields(meta, rank_offset, world_size)

    def group_leave_call(self, group_name: str) -> Call:
        return "/destroy_weights_update_group", {"group_name": group_name}

    def distributed_calls(self, meta: WeightUpdateMeta, keep_requests: bool, paused: bool) -> DistributedCalls:
        """One server's calls to receive `meta.buckets` as `meta.version` (§3.4): one per bucket,
        the version and the cache flush with the last (`keep_requests`: never flush, §3.9).
        SGLang serializes an update with generation, so a server that is not paused needs nothing more."""
        fields = {"flush_cache": False} if keep_requests else {"abort_all_requests": True}
        calls = []
        for i, bucket in enumerate(meta.buckets):
            names, dtypes, shapes = bucket_spec(bucket)
            body = {"names": names, "dtypes": dtypes, "shapes": shapes, "group_name": meta.group_name}
            body.update(weight_version=str(meta.version), flush_cache=i == len(meta.buckets) - 1)  # flush once
            body.update(fields)  # in_place / retract: never flush
            calls.append(("/update_weights_from_distributed", body))
        return DistributedCalls([], calls, [])

    def read_version(self, reply: Any) -> str:
        return str(reply.get("weight_version")) if isinstance(reply, dict) else str(reply)

    def unsupported(self, weight_update: str) -> str | None:
        """Why this backend cannot sync weights by `weight_update` (disk, distributed, lora); None: it can."""
        return None

    async def check_server(self, get: Any, address: str) -> None:
        """Refuse a server started without what the client relies on (`get(address, path) -> (status,
        reply)`); SGLang needs nothing beyond /health."""
