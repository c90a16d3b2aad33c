"""One real vLLM server for every test under tests/vllm (package fixture `vllm_server`).

vLLM lives in its own environment (it pins torch and transformers): its interpreter is
$AREALITE_VLLM_PYTHON, else the README's `~/.venvs/arealite-vllm` (what `.ci/run` installs).
Without it the tests here are skipped, naming the install line. The server runs a tiny Qwen2
model (tied embeddings) built on the spot, with the flags the launchers use (`backends.vllm_launch.vllm_command`); its
process group is killed at session end and dies with pytest (PR_SET_PDEATHSIG, see
arealite/launcher/process.py). Every test here is in the xdist group "vllm" (tests/conftest.py),
so one worker owns the server.

Tests that change the server's weights or version put them back (`restore`), so the tests
pass in any order on the shared server.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

import pytest
import torch

from arealite.backends.vllm import RELOAD_METHOD
from arealite.backends.vllm_launch import VLLM_PYTHON_ENV, vllm_command, vllm_python
from arealite.launcher.process import ManagedProcess
from arealite.utils import net

INSTALL_HINT = f"install it as the README says (section vLLM), or point {VLLM_PYTHON_ENV} at its python"
START_TIMEOUT_S = 600.0  # a cold start on a busy 2-core machine; a warm one takes far less
MAX_MODEL_LEN = 1024  # the tiny model's positions: long answers, so a weight sync lands mid-answer

# Bounds on max |vLLM - trainer| logprob per answer token on this model at temperature 1, fp32 on
# both sides, for answers of up to 24 tokens and of about 1,000, before or after a disk or
# distributed sync: 3x the largest benchmarks/vllm_parity.py measured for that length
# (benchmarks/README.md). They hold with `min_new_tokens`'s ban on the stop tokens replayed on the
# trainer's side (`trainer_logprobs`): the server samples without them and reports that
# distribution's logprobs. Logits scaled by s (a temperature 1/s, a head scaled by s) scale their
# rounding by s: tests divide by the temperature and multiply by a head's scale. Weights rounded
# to bf16 on the way exceed both (test_logprob_bounds.py); a sync to other weights moves the
# logprobs by more than MOVED_NATS on average.
LOGPROB_BOUND_SHORT = 1.7e-6
LOGPROB_BOUND_LONG = 2.3e-6
MOVED_NATS = 0.3


@dataclass
class VLLMServer:
    """A running vLLM server: `address` ("127.0.0.1:PORT"), the model it serves, vLLM's Python."""

    address: str
    model_dir: str
    python: str
    log_path: str
    pid: int = 0  # the API server's (session leader); vLLM's engine core runs in a child process

    def call(self, method: str, path: str, body: dict | None = None, timeout: float = 120.0) -> tuple[int, object]:
        """One plain HTTP call (status, parsed JSON), for tests that talk to the server directly."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"http://{self.address}{path}", data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                status, raw = r.status, r.read()
        except urllib.error.HTTPError as e:
            status, raw = e.code, e.read()
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw.decode("utf-8", "replace")

    def restore(self) -> None:
        """Back to the start state: resumed, the original weights, version "0"."""
        self.call("POST", "/resume")
        status, reply = self.call(
            "POST",
            "/collective_rpc",
            {"method": RELOAD_METHOD, "kwargs": {"weights_path": self.model_dir}},
            timeout=300,
        )
        assert status == 200, f"reloading the original weights failed: {status} {reply}"
        self.call("POST", "/update_weight_version", {"new_version": "0"})

    def helper_pids(self) -> list[int]:
        """The processes under the API server: vLLM's engine core (which generates) and its helpers."""
        children: dict[int, list[int]] = {}
        for entry in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
        found, todo = [], [self.pid]
        while todo:
            for child in children.get(todo.pop(), []):
                found.append(child)
                todo.append(child)
        return found

    @contextlib.contextmanager
    def engine_stopped(self):
        """The engine core and its helpers SIGSTOPped (no token is generated) while the API server
        still takes requests and forwards them; SIGCONT on leaving. Yields their pids."""
        pids = self.helper_pids()
        assert pids, f"no engine process under the vLLM server's pid {self.pid}"
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            yield pids
        finally:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)

    def log_tail(self, n: int = 40) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""


@functools.cache
def _model(model_dir: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)


def trainer_logprobs(
    model_dir: str, tokens: list[int], n_out: int, temperature: float, gconfig=None, banned: int = 0
) -> torch.Tensor:
    """What the trainer computes for the last `n_out` tokens of `tokens` with the weights in
    `model_dir` (its fp32 forward and `packed_token_logprobs`; with `gconfig`, its truncation as
    PPOActor replays it), the stop tokens banned for the first `banned` of them as
    `min_new_tokens` bans them on the server."""
    from arealite.train.logprobs import packed_token_logprobs
    from arealite.utils.stop_ids import banned_stop_ids

    ids = torch.tensor(tokens)
    with torch.no_grad():
        logits = _model(model_dir)(ids[None]).logits[0]
    first = len(tokens) - n_out - 1  # the logits row that predicts the first answer token
    logits[first : first + banned, banned_stop_ids(model_dir, [])] = float("-inf")
    truncation = None if gconfig is None else gconfig.logprob_truncation
    return packed_token_logprobs(logits, ids, torch.tensor([0, len(tokens)]), temperature, truncation)[-n_out:]


def _vllm_importable(python: str) -> bool:
    if not os.path.exists(python):
        return False
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
    return subprocess.run([python, "-c", probe], capture_output=True, timeout=60).returncode == 0


def build_vllm_tiny_model(out_dir: str) -> str:
    """The repo's tiny random Qwen2 with a head size vLLM's CPU attention supports (64; the
    default tiny model's 16 is not one), its output layer tied to the input embedding as in
    small instruct models (SmolLM2, Qwen2.5-0.5B/1.5B): a reload must refresh the tied head too."""
    from arealite.tools.tiny_model import build_tiny_model

    return build_tiny_model(out_dir, hidden=128, heads=2, kv_heads=1, intermediate=256, seed=0, tie=True)


def _wait_healthy(proc: ManagedProcess, server: VLLMServer) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the vLLM server exited with {proc.poll()} while starting:\n{server.log_tail()}")
        try:
            if server.call("GET", "/health", timeout=5)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(1.0)
    pytest.fail(f"the vLLM server did not answer /health within {START_TIMEOUT_S}s:\n{server.log_tail()}")


def start_vllm_server(root, model_dir: str, python: str, flags=lambda cmd: cmd):
    """A vLLM server of `model_dir` started as the launchers start it (`flags` may change its argv);
    a generator that yields the healthy `VLLMServer` and stops it after."""
    port = net.free_ports(1, "127.0.0.1")[0]
    cmd = flags(vllm_command(python, model_dir, "127.0.0.1", port, max_model_len=MAX_MODEL_LEN, max_num_seqs=32))
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("AREALITE_VLLM_THREADS", "2"))
    env.pop("PYTHONPATH", None)  # vLLM's environment, not ours
    # cwd: Python puts it first on the path of vLLM's helper processes; a stray module there would shadow vLLM's
    proc = ManagedProcess("vllm", cmd, str(root / "vllm.log"), env=env, cwd=str(root))
    server = VLLMServer(f"127.0.0.1:{port}", model_dir, python, str(root / "vllm.log"))
    started = time.monotonic()
    proc.start()
    server.pid = proc.pid
    try:
        _wait_healthy(proc, server)
        print(f"vLLM server healthy after {time.monotonic() - started:.0f} s at {server.address}")
        server.call("POST", "/update_weight_version", {"new_version": "0"})
        yield server
    finally:
        proc.stop(grace=10.0)


def installed_vllm_python() -> str:
    python = vllm_python()
    if not _vllm_importable(python):
        pytest.skip(f"vLLM is not installed for {python}; {INSTALL_HINT}")
    return python


# package scope: the server stops after the last test here (tests/vllm is a package for that), so
# it does not idle beside the rest of the suite; xdist runs this directory's tests in one go.
@pytest.fixture(scope="package")
def vllm_server(tmp_path_factory):
    """Starts ONE vLLM server for the tests under tests/vllm; yields a `VLLMServer`."""
    python = installed_vllm_python()
    root = tmp_path_factory.mktemp("vllm")
    yield from start_vllm_server(root, build_vllm_tiny_model(str(root / "model")), python)
