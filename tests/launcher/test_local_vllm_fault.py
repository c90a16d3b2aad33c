"""A vLLM server SIGKILLed mid-batch under the local launcher (`server.backend=vllm`, set in the
config as a user sets it): the launcher restarts it, the rollout client waits for it within its
bounds, resyncs it to the trainer's current weights before it takes requests, and the run
finishes with every prompt trained exactly once, every trained answer whole.

The example script runs on the vLLM test model (tests/vllm/conftest.py) for two steps with one
server. After the first weight sync the server holds the trainer's version 1, then the next
batch goes out; the test freezes vLLM's engine, waits until its API server has received a
request of that batch (its request log), and SIGKILLs the server's processes. The
answers in flight never come back (vLLM replies once, whole); the client re-generates them on
the restarted server, which must first load version 1 (a restart comes up on the initial
weights): the step's behaviour logprobs must equal the trainer's within the vLLM bounds. That the
resync's calls all come before the server is back in rotation: tests/rollout/test_parts.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest

from arealite.backends.vllm_launch import vllm_python
from arealite.launcher.process import with_package_path
from tests.vllm.conftest import INSTALL_HINT, LOGPROB_BOUND_LONG, _vllm_importable, build_vllm_tiny_model

REPO = Path(__file__).resolve().parents[2]
STEPS, PROMPTS, GROUP = 2, 2, 2
MAX_NEW_TOKENS = 960  # near the test model's context: the second step's answers outlast a slow test's look
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _servers(run_dir: Path) -> list[dict]:
    path = run_dir / "processes.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line) for line in lines if line.strip() and json.loads(line)["name"] == "server-0"]


def _wait_for(proc: subprocess.Popen, predicate, timeout: float, what: str, err_path: Path) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None or time.monotonic() > deadline:
            how = f"exited ({proc.returncode})" if proc.poll() is not None else f"still ran after {timeout:.0f} s"
            pytest.fail(f"the launcher {how} while the test waited for {what}:\n{err_path.read_text()[-3000:]}")
        time.sleep(0.05)


def _group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group `pgid`: a launcher's server and its helpers."""
    members = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry))
    return members


def _received(server_log: Path) -> int:
    """Requests vLLM's API server has received (`--enable-log-requests`: one line each, as it takes one)."""
    return server_log.read_text(errors="replace").count("Received request") if server_log.exists() else 0


def _answered(server_log: Path) -> int:
    """Generation requests vLLM's API server has answered (its access log: one line each, as it replies)."""
    text = server_log.read_text(errors="replace") if server_log.exists() else ""
    return text.count('"POST /inference/v1/generate HTTP/1.1" 200')


def _kill_mid_batch(proc: subprocess.Popen, run_dir: Path, dump_dir: Path, err_path: Path) -> tuple[int, int]:
    """SIGKILL server-0 (its API server and the engine below it) with the second step's answers in
    flight; returns its pid and the requests it had received but not answered at the kill.

    vLLM's API server logs each request it takes and each answer it sends. The first step sends
    one request per answer; the second step's go out only after the weight sync. Once the sync is
    confirmed the engine is frozen (SIGSTOP), and the kill comes once a request of the second
    step has arrived: that answer is then in flight, and none can finish. Received minus
    answered at the kill is the count the caller requires to be above 0."""
    server_log = run_dir / "logs" / "server-0.log"
    trained = dump_dir / "step_0" / "rank0.jsonl"  # written after the first update, before the sync
    _wait_for(proc, trained.exists, 600, "the first step's update", err_path)
    # the first step's requests, one per answer, all received before it trained; the second step's go
    # out after the sync (counted, not read now: on a busy machine they may have arrived already)
    before = PROMPTS * GROUP
    assert _received(server_log) >= before, server_log.read_text(errors="replace")[-3000:]
    log = run_dir / "logs" / "trainer.log"
    synced = lambda: log.exists() and "[weight-sync] version 1 confirmed" in log.read_text()  # noqa: E731
    _wait_for(proc, synced, 300, "the first weight sync", err_path)
    server = _servers(run_dir)[0]
    tree = [server["pid"], *(p.pid for p in psutil.Process(server["pid"]).children(recursive=True))]
    for pid in tree[1:]:  # the engine stops generating: nothing it has not answered yet will be
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
    _wait_for(proc, lambda: _received(server_log) > before, 120, "the second step's requests at vLLM", err_path)
    time.sleep(0.5)  # the rest of the step's requests arrive too (not required: one unanswered is the point)
    in_flight = _received(server_log) - _answered(server_log)
    for pid in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return server["pid"], in_flight


def test_killed_vllm_server_is_restarted_resynced_and_every_prompt_trained_once(tmp_path):
    if not _vllm_importable(vllm_python()):
        pytest.skip(f"vLLM is not installed for {vllm_python()}; {INSTALL_HINT}")
    model = build_vllm_tiny_model(str(tmp_path / "model"))
    cmd = [
        sys.executable, "-m", "arealite.launcher.local", str(REPO / "examples" / "gsm8k_grpo.py"),
        "--config", str(REPO / "configs" / "tiny_cpu.yaml"), "launcher.setup_commands=[]",
        f"fileroot={tmp_path}", "experiment_name=vllm_fault", "trial_name=t", f"actor.path={model}",
        "server.backend=vllm", "weight_update=disk", "launcher.max_server_restarts=1",
        f"total_train_steps={STEPS}", f"train_dataset.batch_size={PROMPTS}", "train_dataset.num_samples=16",
        f"gconfig.group_size={GROUP}", f"gconfig.max_new_tokens={MAX_NEW_TOKENS}", "rollout.dynamic_sampling=false",
        "reward_fn=tests.e2e.varied_reward:even_token_fraction", f"rollout.dump_dir={tmp_path / 'dump'}",
        "rollout.health_check_interval=1", "server.extra_args=[--enable-log-requests]",
        "evaluator.freq_steps=0", "recover.mode=disabled", "stats_logger.plot=false",
        "stats_logger.progress_bar=false",
    ]  # fmt: skip
    # vLLM-CPU and a CPU trainer also where a GPU is visible: the bound is for fp32 CPU kernels on both sides
    env = dict(with_package_path(None), OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    run_dir = tmp_path / "vllm_fault" / "t"
    err_path = tmp_path / "launcher.err"  # a file, not a pipe: nothing reads it while the test waits
    with open(err_path, "w") as err_file:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=err_file)
    try:
        killed_pid, in_flight = _kill_mid_batch(proc, run_dir, tmp_path / "dump", err_path)
        proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    err = err_path.read_text()
    log = (run_dir / "logs" / "trainer.log").read_text()
    assert proc.returncode == 0, f"{err[-3000:]}\n--- trainer.log ---\n{log[-3000:]}"
    print(f"requests received and not answered at the kill: {in_flight}")
    assert in_flight > 0, "no answer was in flight at the kill: the test proves nothing"
    assert "restarting on the same address (1 of 1)" in err, err[-3000:]
    servers = _servers(run_dir)
    assert len(servers) == 2 and servers[1]["addr"] == servers[0]["addr"] and servers[1]["pid"] != killed_pid
    for server in servers:  # each server leads its process group (vLLM's engine core in it): nothing is left
        assert not _group_members(server["pid"]), f"processes of {server} outlived the launcher"

    rows = [json.loads(line) for line in (run_dir / "stats.jsonl").read_text().splitlines() if line.strip()]
    print(f"logprob_mismatch_max per step: {[r['logprob_mismatch_max'] for r in rows]}")
    assert [r["step"] for r in rows] == list(range(STEPS)), rows
    ids = [i for r in rows for i in r["prompt_ids"]]
    assert len(ids) == len(set(ids)) == STEPS * PROMPTS, f"a prompt was trained twice or not at all: {ids}"
    # The step the kill interrupted ran on the restarted server: its behaviour logprobs are the
    # trainer's at the weights it trained (prox_logp), within the vLLM bound (fp32 both sides,
    # temperature 1). A server left on the initial weights misses it by orders of magnitude.
    for r in rows:
        assert r["logprob_mismatch_max"] <= LOGPROB_BOUND_LONG, f"step {r['step']}: vLLM vs trainer {r}"
    eos = json.loads((Path(model) / "config.json").read_text())["eos_token_id"]
    for step in range(STEPS):
        samples = [json.loads(line) for line in (tmp_path / "dump" / f"step_{step}" / "rank0.jsonl").open()]
        groups = Counter(s["prompt_index"] for s in samples)
        assert len(groups) == PROMPTS and set(groups.values()) == {GROUP}, f"step {step}: samples per prompt {groups}"
        for s in samples:  # every trained answer whole: ended by EOS or by the budget, once, on this step's weights
            answer = [t for t, m in zip(s["input_ids"], s["loss_mask"]) if m]
            versions = {v for v, m in zip(s["versions"], s["loss_mask"]) if m}
            assert answer and versions == {step}, f"step {step}: answer of {len(answer)} tokens, versions {versions}"
            assert eos not in answer[:-1] and len(answer) <= MAX_NEW_TOKENS, f"step {step}: {answer}"
            assert answer[-1] == eos or len(answer) == MAX_NEW_TOKENS, f"step {step}: a half-finished answer {answer}"
