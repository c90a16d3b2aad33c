"""Inference-server command lines, one builder for every launcher.

On GPUs the launchers run real SGLang (`python -m sglang.launch_server`); everywhere else the
built-in server (`python -m arealite.server`, SGLang's protocol on transformers). Both take
the same flag names for what they share (docs/protocol.md §5). CUDA is detected without
importing torch: from CUDA_VISIBLE_DEVICES, else from `nvidia-smi -L`.
"""

from __future__ import annotations

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
    python = python or sys.executable
    if backend == "sglang":
        cmd = [python, "-m", "sglang.launch_server", "--tp-size", str(config.launcher.gpus_per_server)]
    elif backend == "builtin":
        cmd = [python, "-m", "arealite.server"]
    else:
        raise ConfigError(f"server backend {backend!r} is not supported; choose 'builtin' or 'sglang'")
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
