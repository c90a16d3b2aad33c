"""Run examples/gsm8k_grpo.py against a fresh built-in server and read its step stats."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from arealite.server.process import launch_server_process

REPO = Path(__file__).resolve().parents[2]


def run_example(
    tmp_path: Path,
    model: str,
    experiment: str,
    overrides: list[str],
    timeout: float = 280,
    config: str = "tiny_cpu.yaml",
    server_args: tuple[str, ...] = (),
) -> list[dict]:
    """The example script on `configs/<config>` with `overrides`, one server of `model` (with
    `server_args`), one trainer thread; fails with the run's output tail unless it exits 0.
    Returns stats.jsonl rows."""
    return run_example_output(tmp_path, model, experiment, overrides, timeout, config, server_args)[0]


def run_example_output(
    tmp_path: Path,
    model: str,
    experiment: str,
    overrides: list[str],
    timeout: float = 280,
    config: str = "tiny_cpu.yaml",
    server_args: tuple[str, ...] = (),
) -> tuple[list[dict], str]:
    """`run_example`, and what the script printed (stdout)."""
    server = launch_server_process(model, extra_args=["--skip-server-warmup", *server_args], timeout=300)
    env = {
        **os.environ, "OMP_NUM_THREADS": "1", "AREAL_LLM_SERVER_ADDRS": server.address,
        "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }  # fmt: skip
    cmd = [
        sys.executable, str(REPO / "examples" / "gsm8k_grpo.py"), "--config", str(REPO / "configs" / config),
        f"fileroot={tmp_path}", f"experiment_name={experiment}", "trial_name=t", f"actor.path={model}",
        "recover.mode=disabled", "evaluator.freq_steps=0", "stats_logger.plot=false",
        "stats_logger.progress_bar=false", *overrides,
    ]  # fmt: skip
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    finally:
        server.stop()
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    rows = [json.loads(line) for line in (tmp_path / experiment / "t" / "stats.jsonl").read_text().splitlines()]
    return rows, proc.stdout
