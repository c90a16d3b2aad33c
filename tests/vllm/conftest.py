"""A stand-in for the `vllm_server` session fixture of the vLLM client's branch (same contract:
`.address`, `.model_dir`, `.python`; skips without vLLM), so the tests here run on their own.

vLLM lives in its own environment: its interpreter is $AREALITE_VLLM_PYTHON, else
`~/.venvs/arealite-vllm/bin/python`. The server serves a tiny Qwen2 built on the spot (head
size 64, which vLLM's CPU attention supports), in fp32, with processed logprobs; its process
group dies with pytest (arealite/launcher/process.py).
"""

from __future__ import annotations

import os
import subprocess
import time
import urllib.request
from dataclasses import dataclass

import pytest

from arealite.launcher.process import ManagedProcess
from arealite.utils import net

START_TIMEOUT_S = 600.0  # a cold start on a busy 2-core machine


@dataclass
class VLLMServer:
    address: str
    model_dir: str
    python: str


def _python() -> str:
    return os.environ.get("AREALITE_VLLM_PYTHON") or os.path.expanduser("~/.venvs/arealite-vllm/bin/python")


def _healthy(address: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{address}/health", timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory):
    python = _python()
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
    if not os.path.exists(python) or subprocess.run([python, "-c", probe], capture_output=True).returncode:
        pytest.skip(f"vLLM is not installed for {python}; set AREALITE_VLLM_PYTHON to its interpreter")
    from arealite.tools.tiny_model import build_tiny_model

    root = tmp_path_factory.mktemp("vllm")
    model_dir = build_tiny_model(str(root / "model"), hidden=128, heads=2, kv_heads=1, intermediate=256, seed=0)
    port = net.free_ports(1)[0]
    env = dict(os.environ, VLLM_SERVER_DEV_MODE="1", VLLM_CPU_OMP_THREADS_BIND="nobind", VLLM_CPU_KVCACHE_SPACE="1")
    env.setdefault("OMP_NUM_THREADS", "2")
    env.pop("PYTHONPATH", None)  # vLLM's environment, not ours
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir, "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--dtype", "float32", "--seed", "1", "--max-model-len", "512", "--enforce-eager"]
    cmd += ["--enable-scale-out", "--logprobs-mode", "processed_logprobs", "--generation-config", "vllm"]
    proc = ManagedProcess("vllm", cmd, str(root / "vllm.log"), env=env)
    proc.start()
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _healthy(f"127.0.0.1:{port}"):
            if proc.poll() is not None or time.monotonic() > deadline:
                with open(root / "vllm.log", errors="replace") as f:
                    pytest.fail(f"the vLLM server did not start:\n{''.join(f.readlines()[-40:])}")
            time.sleep(1.0)
        yield VLLMServer(f"127.0.0.1:{port}", model_dir, python)
    finally:
        proc.stop()
