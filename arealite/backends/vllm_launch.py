"""How a vLLM server is started for arealite's client (docs/vllm.md §1, docs/backends.md):
its interpreter (`vllm_python`), its argv (`vllm_command`, `launch_argv`). vLLM pins torch and
transformers, so it runs from its own environment beside arealite's; its server-side extension
is `vllm_ext/`, put on that interpreter's path by `VLLM_BOOT`.
"""

from __future__ import annotations

import json
import os
from typing import Any

from arealite.backends.contract import KEEPALIVE_S
from arealite.backends.vllm import TRANSFER_ENGINE, WORKER_EXTENSION

# The interpreter of vLLM's environment: this variable, else the README's install location.
VLLM_PYTHON_ENV = "AREALITE_VLLM_PYTHON"
DEFAULT_VLLM_VENV = "~/.venvs/arealite-vllm"
# vLLM's server module run as `python -I -m` would, with arealite's worker extension importable
VLLM_BOOT = (
    "import runpy, sys; sys.path.append(sys.argv.pop(1)); "
    "runpy.run_module('vllm.entrypoints.openai.api_server', run_name='__main__', alter_sys=True)"
)
VLLM_EXTENSION_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vllm_ext")


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
    """The argv of one vLLM server for arealite's client (docs/vllm.md §1).

    It starts with `env VARS...`, which execs the server (same pid, same signals), so every
    launcher runs it with its settings and no launcher-specific code:
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
      (contract.KEEPALIVE_S, vLLM's own is 5 s; a value in the environment wins);
    - on a CPU: `--enforce-eager` (no compile warm-up: a faster start), no chunked prefill (see
      below), and vLLM's threads left to OpenMP's defaults instead of one core per server.
    """
    keepalive = os.environ.get("VLLM_HTTP_TIMEOUT_KEEP_ALIVE", str(KEEPALIVE_S))
    env = ["env", "VLLM_SERVER_DEV_MODE=1", f"VLLM_HTTP_TIMEOUT_KEEP_ALIVE={keepalive}"]
    if cpu:
        # vLLM pins its compute to a single core per server unless told; the launcher reserves the cores
        kv_gib = os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")  # vLLM's CPU default (4 GiB) is more than a test needs
        env += ["VLLM_CPU_OMP_THREADS_BIND=nobind", f"VLLM_CPU_KVCACHE_SPACE={kv_gib}"]
    cmd = env + [python, "-I", "-c", VLLM_BOOT, VLLM_EXTENSION_DIR, "--model", model]
    cmd += ["--worker-extension-cls", WORKER_EXTENSION]
    cmd += ["--weight-transfer-config", json.dumps({"backend": TRANSFER_ENGINE})]
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


def launch_argv(config: Any, model: str, host: str, port: int, gpus: list[str]) -> list[str]:
    """One vLLM server of `model` with an experiment's server settings in vLLM's flags (`gpus`:
    the GPUs visible to the launcher; none: vLLM-CPU); not `server.extra_args`."""
    server = config.server
    dtype = server.dtype if server.dtype != "auto" or gpus else "float32"  # vLLM's auto is bf16 even on a CPU
    cmd = vllm_command(
        vllm_python(server.vllm_python),
        model,
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
    return cmd
