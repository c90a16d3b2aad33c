"""examples/openai_agent_grpo.py through the local launcher for 2 steps: every sample is a run of
examples/openai_agent.py (the `openai` package in a subprocess) against the endpoint; it trains,
logs its steps with the agent failure counters and prints the accuracy line. The model is the
tool-calling test model, which answers the memorized 12*34 through the calculator."""

import json
import os
import re
import subprocess
import sys

import pytest

from arealite.config import GRPOConfig, load_config
from arealite.launcher.process import with_package_path

pytestmark = [pytest.mark.heavy, pytest.mark.slow, pytest.mark.timeout(300)]
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(REPO_ROOT, "configs", "tiny_cpu_openai_agent.yaml")


def test_openai_agent_example_runs_two_steps(tmp_path, tool_model_dir):
    overrides = [
        f"fileroot={tmp_path}", f"actor.path={tool_model_dir}", "launcher.setup_commands=[]", "total_train_steps=2",
        "train_dataset.num_samples=64", "train_dataset.batch_size=2", "gconfig.group_size=2",
        "evaluator.num_samples=2", "stats_logger.plot=false",
    ]  # fmt: skip
    env = dict(with_package_path(None), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "arealite.launcher.local", "examples/openai_agent_grpo.py", "--config", CONFIG]
    proc = subprocess.run([*cmd, *overrides], env=env, capture_output=True, text=True, timeout=280, cwd=REPO_ROOT)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    line = re.search(r"eval_accuracy_before=([\d.]+) eval_accuracy_after=([\d.]+)", proc.stdout)
    assert line and all(0.0 <= float(x) <= 1.0 for x in line.groups()), proc.stdout[-2000:]
    run_dir = load_config(["--config", CONFIG, *overrides], GRPOConfig).run_dir
    rows = [json.loads(x) for x in open(os.path.join(run_dir, "stats.jsonl"))]
    assert [r["step"] for r in rows] == [0, 1] and all(r["version"] == r["step"] + 1 for r in rows)
    assert rows[-1]["agent/samples"] >= 2 * 2 * 2 and rows[-1]["agent/agent_timeouts"] == 0  # programs ran
    assert all(r["response_len"] > 0 and 0.0 <= r["reward"] <= 1.0 for r in rows)
