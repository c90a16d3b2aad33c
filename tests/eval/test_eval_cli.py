"""`python -m arealite.eval` on a checkpoint reproduces the number the training run logged for it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.e2e.shared_runs import EVAL_SETTINGS
from tests.tolerance import close

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(400)


def test_standalone_eval_reproduces_in_training_eval(dumped_run, tiny_model_dir, tmp_path):
    """On the shared run of tests/e2e/shared_runs.py (evaluated at versions 0, 2 and 3)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.pop("AREAL_LLM_SERVER_ADDRS", None)
    common = ["--config", str(REPO / "configs" / "tiny_cpu.yaml"), f"actor.path={tiny_model_dir}", *EVAL_SETTINGS]
    assert dumped_run.stdout.strip().splitlines()[-1].startswith("eval_accuracy_before=")
    logged = {r["eval/version"]: r for r in dumped_run.rows if "eval/version" in r}
    assert sorted(logged) == [0, 2, 3]  # every evaluator.freq_steps, and after the last step

    weights = dumped_run.run_dir / "weights" / "v2"
    cli = [sys.executable, "-m", "arealite.eval", "--model", str(weights), *common]
    out = subprocess.run(cli, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    metrics = json.loads(out.stdout.strip().splitlines()[-1])
    assert metrics["version"] == 2
    for key in ("eval/pass@1", "eval/pass@4", "eval/maj@4"):
        assert close(metrics[key], logged[2][key], torch.float64), (key, metrics, logged[2])  # the same samples
    assert 0.0 < metrics["eval/pass@1"] < 1.0, "a constant score would not show reproduction"
