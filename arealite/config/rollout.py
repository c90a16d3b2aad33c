"""The rollout client (`InferenceEngineConfig`: staleness, pause mode, timeouts) and the
inference servers it generates on (`ServerConfig`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from arealite.config.fields import check_choices, check_positive, setting
from arealite.config.loading import ConfigError

PauseMode = Literal["abort", "in_place", "retract"]  # SGLang's /pause_generation modes (0.5.6+)
Schedule = Literal["interruptible", "lockstep"]
ServerBackend = Literal["auto", "builtin", "sglang", "vllm"]
# How each backend's sampler truncates, which the trainer replays (arealite/algo/truncation.py):
# joint, all three tests on one distribution (SGLang's protocol); sequential, min_p then top_k then
# top_p on the renormalised remainder. The backends' adapters read their rule here.
TRUNCATION_RULE_OF_BACKEND = {"auto": "joint", "builtin": "joint", "sglang": "joint", "vllm": "sequential"}
ServerDtype = Literal["auto", "float32", "bfloat16", "float16"]


@dataclass
class InferenceEngineConfig:
    """The rollout client (`RemoteSGLangEngine`) and its workflow executor."""

    max_concurrent_rollouts: int | None = setting(None, "in-flight trajectories; None: the batch size")
    max_head_offpolicyness: int = setting(0, "staleness bound in versions; 0 is synchronous")
    dynamic_sampling: bool = setting(
        False,
        "DAPO: drop groups whose rewards are all equal (no learning signal) and keep sampling until the batch is full",
    )
    request_timeout: float = setting(3600.0, "seconds for one /generate call (includes pause windows)")
    request_retries: int = setting(3, "attempts on connection errors and 5xx, with backoff")
    setup_timeout: float = setting(
        300.0,
        "seconds to wait for servers to become healthy: at start, and for one to come back while all are down "
        "(a launcher's restart: at least launcher.server_start_timeout, with a resync, after it)",
    )
    health_check_interval: float = setting(5.0, "seconds between probes of servers out of rotation")
    pause_grace_period: float = setting(0.0, "seconds to sleep after pausing before a weight upload")
    health_check_timeout: float = setting(5.0, "seconds one /health probe may take before the server counts as down")
    consumer_batch_size: int | None = setting(
        None, "trajectories per trained batch (the staleness unit); None: the dataloader's batch size"
    )
    control_timeout: float = setting(60.0, "seconds one pause / continue / version-check call to a server may take")
    weight_update_timeout: float = setting(
        45.0,
        "distributed weight update: seconds the group may take to form, one broadcast may wait and one "
        "server's update call may take; a server past it is excluded (a killed one within a second)",
    )
    stall_timeout: float = setting(
        600.0,
        "seconds rollout_batch / prepare_batch may go without progress before a diagnostic is logged; raised "
        "after twice that; 0 disables",
    )
    pause_mode: PauseMode = setting(
        "abort",
        "weight sync: abort (interrupt, resubmit with partial output; any SGLang) | in_place (stay, continue "
        "on new weights over kept KV; >= 0.5.6) | retract (stay queued, KV recomputed on resume; >= 0.5.6)",
    )
    schedule: Schedule = setting(
        "interruptible",
        "with max_head_offpolicyness = k >= 1: interruptible (AReaL's: episodes start within the staleness "
        "bound, weight syncs interrupt them) | lockstep (batch b is exactly the b-th prompt batch, generated "
        "entirely by weights b - k while batch b - 1 trains; never interrupted, reproducible; no dynamic "
        "sampling)",
    )
    dump_dir: str = setting(
        "",
        "write each trained step's samples (prompt and completion text, token ids, logprobs, versions, "
        "reward, advantages) to <dump_dir>/step_<n>/rank<r>.jsonl, one line per sample "
        "(`arealite.replay.RolloutDump`); `python -m arealite.replay <dump_dir> --step <n>` re-runs that "
        "step's update; empty: no dump",
    )
    dump_keep_steps: int = setting(20, "steps kept in dump_dir (older ones are deleted); 0 keeps every step")

    def __post_init__(self) -> None:
        check_choices(self, "rollout")
        if self.schedule == "lockstep" and (self.max_head_offpolicyness < 1 or self.dynamic_sampling):
            raise ConfigError(
                "rollout.schedule=lockstep needs rollout.max_head_offpolicyness >= 1 (how many batches ahead it "
                f"generates; got {self.max_head_offpolicyness}) and rollout.dynamic_sampling=false (got "
                f"{self.dynamic_sampling}); set them, or use schedule=interruptible"
            )
        check_positive("rollout", "max_head_offpolicyness", self.max_head_offpolicyness, allow_zero=True)
        if self.max_concurrent_rollouts is not None:
            check_positive("rollout", "max_concurrent_rollouts", self.max_concurrent_rollouts)
        check_positive("rollout", "request_timeout", self.request_timeout)
        for name in ("control_timeout", "weight_update_timeout", "setup_timeout", "health_check_timeout"):
            check_positive("rollout", name, getattr(self, name))
        check_positive("rollout", "stall_timeout", self.stall_timeout, allow_zero=True)
        check_positive("rollout", "dump_keep_steps", self.dump_keep_steps, allow_zero=True)


@dataclass
class ServerConfig:
    """Inference servers: the built-in CPU server, SGLang or vLLM."""

    backend: ServerBackend = setting(
        "auto",
        "auto (SGLang with CUDA, built-in otherwise) | builtin | sglang | vllm (vLLM's RL routes, from its own "
        "environment, see vllm_python; the trainer script's client is then `RemoteVLLMEngine`, which "
        "`arealite.rollout_client(config)` picks; weight_update=disk or distributed). Unlike verl, OpenRLHF and "
        "SkyRL, which run vLLM inside their trainer's processes, arealite runs it as a server and talks HTTP "
        "to its own routes, as AReaL, SkyRL's HTTP mode and prime-rl do",
    )
    vllm_python: str = setting(
        "",
        "with backend=vllm: the interpreter of vLLM's environment; empty: $AREALITE_VLLM_PYTHON, else "
        "~/.venvs/arealite-vllm/bin/python (the README's install)",
    )
    model_path: str = setting("", "defaults to actor.path")
    dtype: ServerDtype = setting("auto", "--dtype of the server")
    context_length: int | None = setting(None, "defaults to the model's max_position_embeddings")
    max_running_requests: int = setting(64, "sequences a server decodes at once (--max-running-requests); more wait")
    random_seed: int = setting(1, "the server's --random-seed (sampling without a per-request seed)")
    extra_args: list[str] = setting(factory=list, help="appended to the server command line")
    deterministic: bool = setting(
        False,
        "--enable-deterministic-inference (SGLang's flag, both backends): a sequence's numerics do not depend "
        "on what shares its batch, so same-seed runs repeat exactly; slower (benchmarks/README.md)",
    )

    def __post_init__(self) -> None:
        check_choices(self, "server")
