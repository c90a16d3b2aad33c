"""vLLM's RL routes as the rollout client uses them (vLLM 0.32): the `Backend` adapter and what
it refuses (docs/backends.md; wire format: docs/vllm.md §1). Its launch argv: vllm_launch.py.

- generation: `POST /inference/v1/generate` (`--enable-scale-out`) with `token_ids` and vLLM's
  `sampling_params`; the reply's `choices[0]` carries `token_ids`, `logprobs.content[].logprob`
  (minus infinity sent as -9999.0), `finish_reason` and `weight_versions` spans;
- pause / resume: `POST /pause?mode=...&clear_cache=...`, `POST /resume` (dev mode);
- weight sync (docs/vllm.md §4): disk through arealite's worker extension (`vllm_ext/`) then
  `/update_weight_version`; distributed through vLLM's weight-transfer routes served by arealite's
  engine; the version check reads `GET /weight_info`;
- the start-up check (`check_server`) reads `/server_info` once: dev mode, the worker extension,
  processed logprobs, and chunked prefill off on a CPU when seeds are sent.
"""

from __future__ import annotations

import math
from typing import Any

from arealite.backends.contract import Call, DistributedCalls, GenerateChunk, Get, bucket_spec, group_fields
from arealite.config import GREEDY_TEMPERATURE, GenerationHyperparameters
from arealite.config.rollout import TRUNCATION_RULE_OF_BACKEND
from arealite.types import WeightUpdateMeta

# the reload on arealite's worker extension: vLLM's own `reload_weights` leaves a tied head on a CPU
# on the old weights (vllm_ext/arealite_vllm_worker.py)
RELOAD_METHOD = "arealite_reload_weights"
CLOSE_UPDATE_METHOD = "arealite_close_weight_update"  # finishes a streamed update a dead trainer left open
WORKER_EXTENSION = "arealite_vllm_worker.ArealiteWorker"  # registered by vllm_ext (vLLM's own environment)
TRANSFER_ENGINE = "arealite"  # the weight-transfer engine vllm_ext registers
MAX_TEMPERATURE = 2.0  # vLLM refuses a higher temperature
MIN_TEMPERATURE = 0.01  # vLLM 0.32 raises a temperature in (0, 0.01) to this (SamplingParams)
TRUNCATION_RULE = TRUNCATION_RULE_OF_BACKEND["vllm"]  # min_p, then top_k, then top_p
_NEG_INF_SENTINEL = -9999.0  # vLLM's JSON for a minus-infinity logprob
# arealite's pause modes as vLLM's: abort = abort in-flight requests (partial output comes back);
# in_place = freeze them with their KV cache; retract = freeze them, free their KV (recomputed on resume)
PAUSE_QUERIES = {
    "abort": "mode=abort&clear_cache=true",
    "in_place": "mode=keep&clear_cache=false",
    "retract": "mode=keep&clear_cache=true",
}


def gconfig_refusals(gconfig: GenerationHyperparameters) -> list[str]:
    """Sampling settings a vLLM server would refuse or answer with logprobs the trainer does not
    reproduce, each naming its fix (checked at config load and on every request)."""
    out = []
    if gconfig.temperature > MAX_TEMPERATURE:
        out.append(f"gconfig.temperature={gconfig.temperature} is above vLLM's limit {MAX_TEMPERATURE}; lower it")
    if 0.0 < gconfig.temperature < MIN_TEMPERATURE:
        out.append(
            f"gconfig.temperature={gconfig.temperature} is raised to {MIN_TEMPERATURE} by vLLM, which the trainer "
            f"would not know; set 0 (greedy) or at least {MIN_TEMPERATURE}"
        )
    truncating = gconfig.top_p < 1.0 or gconfig.top_k > 0 or gconfig.min_p > 0.0
    if gconfig.truncates_logprobs and gconfig.truncation_rule != TRUNCATION_RULE:
        # the trainer replays gconfig's rule (None: joint, the built-in server's), whatever built the objects
        out.append(
            f"gconfig.truncation_rule={gconfig.truncation_rule!r}: a vLLM server truncates sequentially "
            "(min_p, then top_k, then top_p), and the trainer's logprobs replay gconfig.truncation_rule; "
            f"set gconfig.truncation_rule={TRUNCATION_RULE!r} (an experiment config with server.backend=vllm does)"
        )
    if truncating and not gconfig.truncated_logprobs:
        out.append(
            "gconfig.truncated_logprobs=false with top_p / top_k / min_p truncating: a vLLM server reports the "
            "truncated distribution's logprobs (--logprobs-mode processed_logprobs), the trainer would compute "
            "full-vocabulary ones; set gconfig.truncated_logprobs=true"
        )
    return out


def sampling_params(
    gconfig: GenerationHyperparameters, max_tokens: int, produced: int, seed: bool = True
) -> dict[str, Any]:
    """vLLM `sampling_params` for one call; only keys vLLM knows, none at null. `seed`: send
    gconfig.sampling_seed (if set)."""
    greedy = gconfig.temperature < GREEDY_TEMPERATURE
    params: dict[str, Any] = {
        "max_tokens": int(max_tokens),
        "temperature": 0.0 if greedy else float(gconfig.temperature),
        "logprobs": 0,  # the sampled token's logprob only
        "detokenize": bool(gconfig.stop),  # text is needed only to match stop strings
    }
    if not greedy:  # vLLM forces these off for greedy rows
        if gconfig.top_p < 1.0:
            params["top_p"] = float(gconfig.top_p)
        if gconfig.top_k > 0:  # arealite's -1 (whole vocabulary) is vLLM's 0
            params["top_k"] = int(gconfig.top_k)
        if gconfig.min_p:
            params["min_p"] = float(gconfig.min_p)
    min_left = min(max(0, gconfig.min_new_tokens - produced), max_tokens)  # earlier segments count
    if min_left:
        params["min_tokens"] = int(min_left)
    if gconfig.stop_token_ids:
        params["stop_token_ids"] = list(map(int, gconfig.stop_token_ids))
    if gconfig.stop:
        params["stop"] = list(gconfig.stop)
    if gconfig.frequency_penalty:
        params["frequency_penalty"] = float(gconfig.frequency_penalty)
    if seed and gconfig.sampling_seed is not None:
        params["seed"] = int(gconfig.sampling_seed)
    return params


def parse_generate_reply(reply: Any) -> GenerateChunk:
    """Parse a non-streamed `/inference/v1/generate` reply; ValueError names what is missing."""
    choices = reply.get("choices") if isinstance(reply, dict) else None
    if not choices or not isinstance(choices[0], dict):
        raise ValueError("/inference/v1/generate reply has no 'choices'")
    choice = choices[0]
    finish = choice.get("finish_reason")
    if finish not in ("stop", "length", "abort"):
        raise ValueError(f"/inference/v1/generate reply has unknown finish_reason {finish!r}")
    tokens = list(map(int, choice.get("token_ids") or []))
    content = (choice.get("logprobs") or {}).get("content")
    if content is None:
        raise ValueError("/inference/v1/generate reply has no logprobs.content; send sampling_params.logprobs=0")
    logprobs = [-math.inf if e["logprob"] <= _NEG_INF_SENTINEL else float(e["logprob"]) for e in content]
    if len(tokens) != len(logprobs):
        raise ValueError(f"/inference/v1/generate reply has {len(tokens)} token_ids but {len(logprobs)} logprobs")
    spans = []
    for span in choice.get("weight_versions") or []:
        try:  # "default" (no version set yet) is not one: those tokens get the client's version
            spans.append((int(str(span["version"])), int(span["start"]), int(span["end"])))
        except (KeyError, TypeError, ValueError):
            continue
    return GenerateChunk(
        tokens=tokens,
        logprobs=logprobs,
        finish_type=finish,
        server_version=None,  # vLLM reports spans only
        version_spans=spans,
        processed_logprobs=True,  # the server's mode, checked once by VLLMProtocol.check_server
    )


class VLLMProtocol:
    """The `Backend` adapter of vLLM servers (module docstring)."""

    name = "vLLM"
    generate_path = "/inference/v1/generate"
    liveness_path = "/health"  # vLLM's /health never generates, so it answers while paused
    version_path = "/weight_info"
    resume_call: Call = ("/resume", None)

    def __init__(self) -> None:
        self.seed_hazard: str | None = None  # why seeds would crash a server (set by check_server)

    @property
    def sends_seeds(self) -> bool:
        return self.seed_hazard is None

    def generate_body(
        self,
        input_ids: list[int],
        gconfig: GenerationHyperparameters,
        max_new_tokens: int,
        produced: int = 0,
        lora_name: str | None = None,
        version: int = 0,
    ) -> dict[str, Any]:
        if lora_name:
            raise ValueError("LoRA adapters are not supported with a vLLM server; use weight_update=disk")
        refused = gconfig_refusals(gconfig)
        if refused:
            raise ValueError("; ".join(refused))
        if gconfig.sampling_seed is not None and self.seed_hazard is not None:
            raise ValueError(f"gconfig.sampling_seed={gconfig.sampling_seed}: {self.seed_hazard}")
        return {
            "token_ids": list(map(int, input_ids)),
            "sampling_params": sampling_params(gconfig, max_new_tokens, produced),
            # the prefix cache is salted by weight version: KV computed by older weights is never reused
            "cache_salt": f"v{version}",
        }

    def parse_generate(self, reply: Any) -> GenerateChunk:
        return parse_generate_reply(reply)

    def pause_call(self, mode: str) -> Call:
        return f"/pause?{PAUSE_QUERIES[mode]}", None

    def disk_update_calls(self, path: str, version: int, keep_requests: bool, paused: bool) -> list[Call]:
        # vLLM does not serialize a reload with generation: a server that is not paused is paused first
        reload = {"method": RELOAD_METHOD, "kwargs": {"weights_path": path}}
        calls: list[Call] = [("/collective_rpc", reload), ("/update_weight_version", {"new_version": str(version)})]
        if not paused:
            calls = [self.pause_call("abort"), *calls, self.resume_call]
        return calls

    def group_join_call(self, meta: WeightUpdateMeta, rank_offset: int, world_size: int) -> Call:
        # arealite's engine takes SGLang's group fields as its init_info (vllm_ext/arealite_vllm_transfer.py)
        return "/init_weight_transfer_engine", {"init_info": group_fields(meta, rank_offset, world_size)}

    def group_leave_call(self, group_name: str) -> Call:
        return "/shutdown_weight_transfer_engine", None

    def distributed_calls(self, meta: WeightUpdateMeta, keep_requests: bool, paused: bool) -> DistributedCalls:
        # Between start and finish the model is half loaded (vLLM's layer-wise reload), and vLLM does not
        # serialize that with generation: a server that is not paused is paused first, resumed after.
        buckets = []
        for bucket in meta.buckets:
            names, dtypes, shapes = bucket_spec(bucket)
            buckets.append(
                ("/update_weights", {"update_info": {"names": names, "dtype_names": dtypes, "shapes": shapes}})
            )
        close = ("/collective_rpc", {"method": CLOSE_UPDATE_METHOD})  # else vLLM refuses the start
        before: list[Call] = [close, ("/start_weight_update", None)]
        after: list[Call] = [("/finish_weight_update", {"weight_version": str(meta.version)})]
        if not paused:
            before, after = [self.pause_call("abort"), *before], [*after, self.resume_call]
        return DistributedCalls(before, buckets, after)

    def read_version(self, reply: Any) -> str:
        return str(reply.get("weight_version")) if isinstance(reply, dict) else str(reply)

    def unsupported(self, weight_update: str) -> str | None:
        if weight_update in ("disk", "distributed"):
            return None
        return (
            f"weight_update={weight_update} is not supported with a vLLM server yet; set weight_update=disk "
            "or distributed"
        )

    async def check_server(self, get: Get, address: str) -> None:
        status, info = await get(address, "/server_info?config_format=json")
        if status != 200:
            raise ValueError(
                f"vLLM server {address} does not serve /server_info ({status}): start it with "
                "VLLM_SERVER_DEV_MODE=1 (arealite's launchers do), which also turns on pause, resume and reloads"
            )
        if WORKER_EXTENSION not in str(info):
            raise ValueError(
                f"vLLM server {address} runs without arealite's worker extension: start it as "
                "arealite.backends.vllm_launch.vllm_command does (--worker-extension-cls "
                f"{WORKER_EXTENSION}, its folder on the path), or weight syncs cannot reach it"
            )
        if "processed_logprobs" not in str(info):
            raise ValueError(
                f"vLLM server {address} does not report processed logprobs: start it with --logprobs-mode "
                "processed_logprobs, or the logprobs are at temperature 1, not those of the sampled distribution"
            )
        status, _ = await get(address, self.generate_path)  # a POST route: 405 to a GET, 404 when it is off
        if status == 404:
            raise ValueError(
                f"vLLM server {address} does not serve {self.generate_path} (token-in/token-out generation): "
                "start it with --enable-scale-out (arealite's launchers do)"
            )
        config = info.get("vllm_config") if isinstance(info, dict) else None
        config = config if isinstance(config, dict) else {}
        on_cpu = "cpu" in str(config.get("device_config") or "").lower()
        if on_cpu and (config.get("scheduler_config") or {}).get("enable_chunked_prefill"):
            self.seed_hazard = (
                f"vLLM server {address} runs on a CPU with chunked prefill on (vLLM's default), where a seeded "
                "request whose prompt is split across prefill chunks kills the engine; start it with "
                "--no-enable-chunked-prefill (arealite's launchers do), or set gconfig.sampling_seed=null"
            )

    def prompt_logprobs_call(self, rows: list[tuple[list[int], int]], gconfig: GenerationHyperparameters) -> Call:
        raise ValueError(refusals_teacher())

    def parse_prompt_logprobs(self, reply: Any, rows: list[tuple[list[int], int]]) -> list[list[float]]:
        raise ValueError(refusals_teacher())

    def model_info_call(self) -> str:
        raise ValueError(refusals_teacher())

    def tokenize_call(self, text: str) -> Call:
        raise ValueError(refusals_teacher())

    def parse_tokenized(self, reply: Any) -> list[int]:
        raise ValueError(refusals_teacher())

    def refuse(self, config: Any) -> list[str]:
        return refuse(config)


def refusals_teacher() -> str:
    return (
        "distill with server.backend=vllm: vLLM serves no teacher yet (its prompt logprobs skip the sampling "
        "processors: temperature 1, untruncated, not the student's), and no other server stands in for it; "
        "distil with server.backend=builtin, or serve the teacher on an SGLang-protocol server and set "
        "distill.address"
    )


def refuse(config: Any) -> list[str]:
    """Every setting of an experiment config that a vLLM backend cannot honour, each with its fix."""
    out = gconfig_refusals(config.gconfig)
    if config.distill is not None and config.distill.teacher_path and not config.distill.address:
        out.append(refusals_teacher())
    if config.server.deterministic:
        out.append(
            "server.deterministic=true is not supported with server.backend=vllm (vLLM's batch invariance needs "
            "a GPU build with Triton); set server.deterministic=false"
        )
    if config.weight_update not in ("disk", "distributed"):
        out.append(VLLMProtocol().unsupported(config.weight_update) or "")
    if config.weight_update == "distributed" and config.launcher.gpus_per_server > 1:
        out.append(
            f"weight_update=distributed gives each server one rank of the trainer's group, so it needs "
            f"launcher.gpus_per_server=1 with server.backend=vllm (got {config.launcher.gpus_per_server}); "
            "set weight_update=disk for tensor-parallel servers"
        )
    return out
