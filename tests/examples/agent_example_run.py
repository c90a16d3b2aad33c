"""Run examples/openai_agent_grpo.py through the local launcher and read what it wrote."""

import json
import os
import re
import subprocess
import sys

from arealite.config import GRPOConfig, load_config
from arealite.launcher.process import with_package_path

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(REPO_ROOT, "configs", "tiny_cpu_openai_agent.yaml")


def run_agent_example(overrides: list[str], timeout: float) -> tuple[tuple[float, float], list[dict]]:
    """The example on `configs/tiny_cpu_openai_agent.yaml` with `overrides` (the repository on
    PYTHONPATH, for test reward functions); fails unless it exits 0 and prints its accuracy line.
    Returns (accuracy before, after) and the stats.jsonl rows."""
    env = dict(with_package_path(None), OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = f"{REPO_ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}"
    cmd = [sys.executable, "-m", "arealite.launcher.local", "examples/openai_agent_grpo.py", "--config", CONFIG]
    proc = subprocess.run([*cmd, *overrides], env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO_ROOT)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    line = re.search(r"eval_accuracy_before=([\d.]+) eval_accuracy_after=([\d.]+)", proc.stdout)
    assert line, proc.stdout[-2000:]
    run_dir = load_config(["--config", CONFIG, *overrides], GRPOConfig, script_sections=True).run_dir
    rows = [json.loads(x) for x in open(os.path.join(run_dir, "stats.jsonl"))]
    return (float(line[1]), float(line[2])), rows
