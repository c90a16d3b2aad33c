"""vLLM's RL routes as the rollout client uses them (docs/protocol.md §11; vLLM 0.32).

The client core is the SGLang client's (generation.py, weight_update.py, health.py); this is
the small adapter that builds vLLM's request bodies and reads its replies:
- generation: `POST /inference/v1/generate` (a server with `--enable-scale-out`) with
  `token_ids` and vLLM's `sampling_params`; the reply's `choices[0]` carries `token_ids`,
  per-token `logprobs.content[].logprob` (minus infinity sent as -9999.0), `finish_reason`
  (stop | length | abort) and `weight_versions` spans;
- pause / resume: `POST /pause?mode=...&clear_cache=...` and `POST /resume` (dev mode);
- weight sync (§11.4): disk, `POST /collective_rpc` `arealite_reload_weights` (arealite's worker
  extension) then `/update_weight_version`; distributed, vLLM's weight-transfer routes served by
  arealite's engine over the trainer's group; the version check reads `GET /weight_info`.

Gaps against SGLang and how they are closed: no scalar weight version on a reply (the spans
are exact; tokens outside them get the client's version at submission, protocol.token_versions);
a server-wide logprob mode instead of a per-request echo (checked once, `check_server`);
unknown sampling keys are ignored rather than refused (only known keys are sent, and values
vLLM would refuse are refused here first, naming the setting).
"""

from __future__ import annotations

import math
from typing import Any

from arealite.config import GREEDY_TEMPERATURE, GenerationHyperparameters
from arealite.rollout.protocol import Call, DistributedCalls, GenerateChunk, SGLangProtocol, bucket_spec, group_fields
from arealite.types import WeightUpdateMeta

# the reload on arealite's worker extension: vLLM's own `reload_weights` leaves a tied head on a CPU
# on the old weights (arealite/launcher/vllm_ext/arealite_vllm_worker.py)
RELOAD_METHOD = "arealite_reload_weights"
CLOSE_UPDATE_METHOD = "arealite_close_weight_update"  # finishes a streamed update a dead trainer left open
WORKER_EXTENSION = "arealite_vllm_worker.ArealiteWorker"
MAX_TEMPERATURE = 2.0  # vLLM refuses a higher temperature
TRUNCATION_RULE = "sequential"  # how vLLM combines min_p, top_k and top_p (arealite/algo/truncation.py)
_NEG_INF_SENTINEL = -9999.0  # vLLM's JSON for a minus-infinity logprob
# arealite's pause modes as vLLM's: abort = abort in-flight requests (partial output comes back);
# in_place = freeze them with their KV cache; retract = freeze them, free their KV (recomputed on resume)
PAUSE_QUERIES = {
    "abort": "mode=abort&clear_cache=true",
    "in_place": "mode=keep&clear_cache=false",
    "retract": "mode=keep&clear_cache=true",
}


def check_gconfig(gconfig: GenerationHyperparameters) -> None:
    """Raise ValueError, naming the setting, for sampling settings a vLLM server would refuse or
    answer with logprobs the trainer does not reproduce."""
    if gconfig.temperature > MAX_TEMPERATURE:
        raise ValueError(f"gconfig.temperature={gconfig.temperature} is above vLLM's limit {MAX_TEMPERATURE}")
    truncating = gconfig.top_p < 1.0 or gconfig.top_k > 0 or gconfig.min_p > 0.0
    replayed = truncating and gconfig.truncated_logprobs and gconfig.temperature >= GREEDY_TEMPERATURE
    if replayed and gconfig.truncation_rule != TRUNCATION_RULE:
        # the trainer replays gconfig's rule (None: joint, the built-in server's), whatever built the objects
        raise ValueError(
            f"gconfig.truncation_rule={gconfig.truncation_rule!r}: a vLLM server truncates sequentially "
            "(min_p, then top_k, then top_p), and the trainer's logprobs replay gconfig.truncation_rule; "
            f"set gconfig.truncation_rule={TRUNCATION_RULE!r} (an experiment config with server.backend=vllm does)"
        )
    if truncating and not gconfig.truncated_logprobs:
        raise ValueError(
            "a vLLM server reports logprobs of the truncated distribution it samples from (--logprobs-mode "
            "processed_logprobs), so with top_p / top_k / min_p truncating set gconfig.truncated_logprobs=true "
            "for the trainer to match them (got false)"
        )


def sampling_params(gconfig: GenerationHyperparameters, max_tokens: int, produced: int) -> dict[str, Any]:
    """vLLM `sampling_params` for one call; only keys vLLM knows, none at null."""
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
    if gconfig.sampling_seed is not None:
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


class VLLMProtocol(SGLangProtocol):
    """The vLLM adapter of the rollout client (module docstring)."""

    name = "vLLM"
    generate_path = "/inference/v1/generate"
    liveness_path = "/health"  # vLLM's /health never generates, so it answers while paused
    version_path = "/weight_info"
    resume_call: Call = ("/resume", None)

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
        check_gconfig(gconfig)
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

    def unsupported(self, weight_update: str) -> str | None:
        if weight_update in ("disk", "distributed"):
            return None
        return (
            f"weight_update={weight_update} is not supported with a vLLM server yet; set weight_update=disk "
            "or distributed"
        )

    async def check_server(self, get: Any, address: str) -> None:
        status, info = await get(address, "/server_info?config_format=json")
        if status != 200:
            raise ValueError(
                f"vLLM server {address} does not serve /server_info ({status}): start it with "
                "VLLM_SERVER_DEV_MODE=1 (arealite's launchers do), which also turns on pause, resume and reloads"
            )
        if WORKER_EXTENSION not in str(info):
            raise ValueError(
                f"vLLM server {address} runs without arealite's worker extension: start it as "
                "arealite.launcher.server_cmd.vllm_command does (--worker-extension-cls "
                f"{WORKER_EXTENSION}, its folder on the path), or weight syncs cannot reach it"
            )
        if "processed_logprobs" not in str(info):
            raise ValueError(
                f"vLLM server {address} does not report processed logprobs: start it with --logprobs-mode "
                "processed_logprobs, or the logprobs are at temperature 1, not those of the sampled distribution"
            )
