"""SGLang's native protocol (real SGLang and arealite's built-in server): the `Backend` adapter,
its launch argv, and what it refuses (the seam: docs/backends.md; wire format: docs/protocol.md §1-§7).

Bodies and parsing are pure functions, tolerant of the differences between SGLang 0.5.5 and
0.5.23 (protocol.md §7): token ids come from `meta_info.output_token_logprobs` when `output_ids`
is absent, every `meta_info` key except `id` and `finish_reason` is optional, unknown keys are
ignored, and no `null` value is ever sent.
"""

from __future__ import annotations

import math
import sys
from typing import Any

from arealite.backends.contract import Call, DistributedCalls, GenerateChunk, Get, bucket_spec, group_fields
from arealite.config import ConfigError, GenerationHyperparameters
from arealite.config.rollout import TRUNCATION_RULE_OF_BACKEND
from arealite.types import WeightUpdateMeta

TRUNCATION_RULE = TRUNCATION_RULE_OF_BACKEND["sglang"]  # the built-in server: all three tests on one distribution


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


class SGLangProtocol:
    """The `Backend` adapter of SGLang-protocol servers (module docstring)."""

    name = "SGLang"
    generate_path = "/generate"
    liveness_path = "/get_model_info"  # answers while paused (SGLang's /health generates, which blocks)
    version_path = "/get_model_info"
    resume_call: Call = ("/continue_generation", {})
    sends_seeds = True

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
        if body.get("processed_logprobs") and gconfig.truncation_rule not in (None, TRUNCATION_RULE):
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

    async def check_server(self, get: Get, address: str) -> None:
        """SGLang needs nothing beyond /health."""

    def prompt_logprobs_call(self, rows: list[tuple[list[int], int]], gconfig: GenerationHyperparameters) -> Call:
        """Prompt logprobs with nothing generated, at the student's temperature (the teacher's request);
        ValueError where the student's logprobs are truncated (the server scores the full distribution)."""
        if gconfig.truncates_logprobs:
            raise ValueError(TEACHER_TRUNCATION)
        temperature = gconfig.logprob_temperature
        return self.generate_path, {
            "input_ids": [tokens for tokens, _ in rows],
            "sampling_params": {"max_new_tokens": 0, "temperature": temperature},
            "return_logprob": True,
            "logprob_start_len": [start for _, start in rows],
        }

    def parse_prompt_logprobs(self, reply: Any, rows: list[tuple[list[int], int]]) -> list[list[float]]:
        results = reply if isinstance(reply, list) else [reply]
        out = []
        for result, (tokens, start) in zip(results, rows, strict=True):
            try:  # entry 0 (null in SGLang) is kept as 0
                entries = result["meta_info"]["input_token_logprobs"]
                values = [0.0 if k == 0 else float(e[0]) for k, e in enumerate(entries)]
            except (KeyError, TypeError, IndexError, ValueError) as e:
                raise ValueError(f"no prompt logprobs in the reply: {type(e).__name__}: {e}") from e
            if len(values) != len(tokens) - start:
                raise ValueError(
                    f"{len(values)} prompt logprobs where {len(tokens) - start} were asked (from logprob_start_len "
                    "on); does the server support logprob_start_len with max_new_tokens 0?"
                )
            out.append(values)
        return out

    def model_info_call(self) -> str:
        return "/get_model_info"

    def tokenize_call(self, text: str) -> Call:
        return self.generate_path, {
            "text": text,
            "sampling_params": {"max_new_tokens": 0},
            "return_logprob": True,
            "logprob_start_len": 0,
        }

    def parse_tokenized(self, reply: Any) -> list[int]:
        result = reply[0] if isinstance(reply, list) else reply
        return [int(e[1]) for e in result["meta_info"]["input_token_logprobs"]]

    def refuse(self, config: Any) -> list[str]:
        return refuse(config)


TEACHER_TRUNCATION = (
    "distill with top_p / top_k / min_p truncating and gconfig.truncated_logprobs=true: a teacher's prompt "
    "logprobs are of the full distribution at the student's temperature, the behaviour logprobs of the "
    "truncated one, so the two would not be compared under one rule; set gconfig.truncated_logprobs=false "
    "(full-vocabulary logprobs on both sides) or drop the truncation"
)


def refuse(config: Any) -> list[str]:
    """What an SGLang-protocol backend (`server.backend` builtin / sglang / auto) cannot honour."""
    out = []
    gconfig, backend = config.gconfig, config.server.backend
    if config.distill is not None and gconfig.truncates_logprobs:
        out.append(TEACHER_TRUNCATION)
    if config.distill is not None and backend == "sglang" and gconfig.logprob_temperature != 1.0:
        out.append(
            f"distill with server.backend=sglang at gconfig.temperature={gconfig.temperature}: real SGLang's "
            "prompt logprobs are at temperature 1, not the student's; set gconfig.temperature=1.0 or "
            "server.backend=builtin"
        )
    return out


def launch_argv(config: Any, model: str, host: str, port: int, backend: str, python: str | None = None) -> list[str]:
    """The argv of one SGLang (`backend="sglang"`) or built-in server of `model` on `host:port`,
    with the servers' shared settings (docs/protocol.md §5); not `server.extra_args`."""
    server, python = config.server, python or sys.executable
    if backend == "sglang":
        cmd = [python, "-m", "sglang.launch_server", "--tp-size", str(config.launcher.gpus_per_server)]
    elif backend == "builtin":
        cmd = [python, "-m", "arealite.server"]
    else:
        raise ConfigError(f"server backend {backend!r} is not supported; choose 'builtin', 'sglang' or 'vllm'")
    cmd += ["--model-path", model, "--host", host, "--port", str(port)]
    if server.dtype != "auto":
        cmd += ["--dtype", server.dtype]
    return cmd


def policy_flags(config: Any) -> list[str]:
    """The flags only the policy servers take (weights and adapters arrive at run time)."""
    server, cmd = config.server, []
    if server.context_length is not None:
        cmd += ["--context-length", str(server.context_length)]
    cmd += shared_flags(config)
    if server.deterministic:
        cmd += ["--enable-deterministic-inference"]
    lora = config.actor.lora
    if config.weight_update == "lora" and lora is not None:
        # adapters are loaded at run time: the server must reserve their rank and layers up front
        cmd += ["--enable-lora", "--max-lora-rank", str(lora.rank), "--lora-target-modules", *lora.target_modules]
    return cmd


def shared_flags(config: Any) -> list[str]:
    server = config.server
    return ["--random-seed", str(server.random_seed), "--max-running-requests", str(server.max_running_requests)]
