"""Trainer SIGKILL + recover, the way a user runs it: through the local launcher.

The trainer is killed with SIGKILL right after a weight sync; the launcher must stop its
servers and exit non-zero, and running the same command again must resume from the last
checkpoint and finish the run with every step logged exactly once and no prompt trained
twice. (tests/e2e/test_recover.py checks bit-exact weights against an uninterrupted run.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[2]
STEPS = 4
KILL_AFTER = "[weight-sync] version 2 confirmed"
pytestmark = pytest.mark.timeout(300)


def _launch(run_root: Path, model: str) -> subprocess.Popen:
    env = {
        **os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
    }  # fmt: skip
    cmd = [
        sys.executable, "-m", "arealite.launcher.local", str(REPO / "examples" / "gsm8k_grpo.py"),
        "--config", str(REPO / "configs" / "tiny_cpu.yaml"),
        f"fileroot={run_root}", "experiment_name=killed", "trial_name=t0", f"actor.path={model}",
        "launcher.setup_commands=[]", f"total_train_steps={STEPS}", "recover.mode=auto", "recover.freq_steps=1",
        "train_dataset.batch_size=2", "train_dataset.num_samples=32", "gconfig.group_size=2",
        "gconfig.max_new_tokens=4", "evaluator.freq_steps=0", "stats_logger.plot=false",
        "stats_logger.progress_bar=false", "server.extra_args=[--skip-server-warmup,--torch-threads,1]",
    ]  # fmt: skip
    return subprocess.Popen(cmd, cwd=run_root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _trainer_pid(run_dir: Path) -> int:
    entries = [json.loads(line) for line in (run_dir / "processes.jsonl").read_text().splitlines() if line.strip()]
    return next(e["pid"] for e in entries if e["name"] == "trainer")


def test_trainer_sigkill_then_relaunch_resumes(tmp_path, tiny_model_dir):
    run_dir = tmp_path / "killed" / "t0"
    first = _launch(tmp_path, tiny_model_dir)
    seen: list[str] = []
    try:
        for line in first.stdout:  # type: ignore[union-attr]
            seen.append(line)
            if line.startswith(KILL_AFTER):
                os.kill(_trainer_pid(run_dir), signal.SIGKILL)
                break
        out, _ = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    log = "".join(seen) + out
    assert KILL_AFTER in log, log[-4000:]
    assert first.returncode != 0, "the launcher reported success for a killed trainer"
    assert "trainer was killed by SIGKILL" in log, log[-2000:]
    servers = [json.loads(line) for line in (run_dir / "processes.jsonl").read_text().splitlines() if "server" in line]
    time.sleep(1)
    assert not any(
        psutil.pid_exists(s["pid"]) and psutil.Process(s["pid"]).status() != psutil.STATUS_ZOMBIE for s in servers
    ), "a server outlived its launcher"

    second = _launch(tmp_path, tiny_model_dir)
    out, _ = second.communicate(timeout=200)
    assert second.returncode == 0, out[-4000:]
    rows = [json.loads(line) for line in (run_dir / "stats.jsonl").read_text().splitlines() if line.strip()]
    steps = [r["step"] for r in rows if "step" in r]
    assert steps == list(range(STEPS)), steps
    prompt_ids = [i for r in rows for i in r.get("prompt_ids", [])]
    assert len(prompt_ids) == STEPS * 2 and len(set(prompt_ids)) == len(prompt_ids), prompt_ids
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == f"step_{STEPS - 1}"
    assert f"[weight-sync] version {STEPS} confirmed" in out
