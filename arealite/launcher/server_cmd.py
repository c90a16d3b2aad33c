"""Inference-server command lines, one builder for every launcher, on arealite/backends/.

On GPUs the launchers run real SGLang (`python -m sglang.launch_server`); everywhere else the
built-in server (`python -m arealite.server`, SGLang's protocol on transformers); or the backend
`server.backend` names. Each backend's argv lives beside its adapter (backends/); this module
adds what every launcher shares: the GPUs it sees (from CUDA_VISIBLE_DEVICES, else
`nvidia-smi -L`, without importing torch), 'auto', the model, and `server.extra_args`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from arealite import backends
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
    """`server.backend`, with 'auto' meaning SGLang iff CUDA is visible, else the built-in server."""
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
    runs the server (default: this one). The backend's refusals ran when the config loaded
    (`backends.check`, launch_args.py).
    """
    argv = backends.launch_argv(config, model_path(config), host, port, backend, visible_gpus(), python)
    return argv + list(config.server.extra_args)


def judge_server_command(config: GRPOConfig, host: str, port: int, python: str | None = None) -> list[str]:
    """The argv of the built-in server that serves `judge.path` (docs/reward_models.md): no
    weight updates ever reach it, so it takes only the server's shared settings."""
    if config.judge is None or not config.judge.path:
        raise ConfigError("no judge model to serve: set judge.path=DIR, or judge.address=host:port of a running one")
    server = config.server
    cmd = [python or sys.executable, "-m", "arealite.server", "--model-path", config.judge.path]
    cmd += ["--host", host, "--port", str(port), "--random-seed", str(server.random_seed)]
    return cmd + ["--max-running-requests", str(max(server.max_running_requests, config.judge.max_batch_size))]


def n_teachers(config: GRPOConfig) -> int:
    """Teacher servers a launcher starts: `distill.n_servers` when it serves `distill.teacher_path`
    (none when the teacher runs elsewhere, at `distill.address`)."""
    distill = config.distill
    return distill.n_servers if distill is not None and distill.teacher_path and not distill.address else 0


def teacher_server_command(
    config: GRPOConfig, host: str, port: int, backend: str, python: str | None = None
) -> list[str]:
    """The argv of a server of `distill.teacher_path` (on-policy distillation): the policy
    servers' backend and shared settings, never a LoRA adapter or a weight update; a backend
    that cannot serve a teacher is refused (ConfigError), never replaced by another."""
    if config.distill is None or not config.distill.teacher_path:
        raise ConfigError(
            "no teacher model to serve: set distill.teacher_path=DIR, or distill.address=host:port of a running one"
        )
    argv = backends.teacher_argv(config, config.distill.teacher_path, host, port, backend, visible_gpus(), python)
    return argv + list(config.server.extra_args)
