"""`python -m arealite.eval` on a checkpoint reproduces the number the training run logged for it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from arealite.server.process import launch_server_process
from tests.tolerance import close

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(400)


def test_standalone_eval_reproduces_in_training_eval(tmp_path, tiny_model_dir):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.pop("AREAL_LLM_SERVER_ADDRS", None)
    common = [
        "--config", str(REPO / "configs" / "tiny_cpu.yaml"), f"actor.path={tiny_model_dir}",
        "reward_fn=tests.e2e.varied_reward:even_token_fraction", "gconfig.max_new_tokens=6",
        "evaluator.k=4", "evaluator.num_samples=12", "evaluator.temperature=1.0",
    ]  # fmt: skip
    server = launch_server_process(tiny_model_dir, extra_args=["--skip-server-warmup"])
    try:
        train = [
            sys.executable, str(REPO / "examples" / "gsm8k_grpo.py"), *common, f"fileroot={tmp_path}",
            "experiment_name=ev", "trial_name=t", "total_train_steps=2", "evaluator.freq_steps=1",
            "train_dataset.batch_size=4", "train_dataset.num_samples=32", "stats_logger.progress_bar=false",
            "stats_logger.plot=false",
        ]  # fmt: skip
        proc = subprocess.run(train, cwd=REPO, env={**env, "AREAL_LLM_SERVER_ADDRS": server.address},
                              capture_output=True, text=True, timeout=300)  # fmt: skip
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    finally:
        server.stop()
    assert proc.stdout.strip().splitlines()[-1].startswith("eval_accuracy_before=")
    rows = [json.loads(line) for line in (tmp_path / "ev" / "t" / "stats.jsonl").read_text().splitlines()]
    logged = {r["eval/version"]: r for r in rows if "eval/version" in r}
    assert sorted(logged) == [0, 1, 2]

    weights = tmp_path / "ev" / "t" / "weights" / "v2"
    cli = [sys.executable, "-m", "arealite.eval", "--model", str(weights), *common]
    out = subprocess.run(cli, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    metrics = json.loads(out.stdout.strip().splitlines()[-1])
    assert metrics["version"] == 2
    for key in ("eval/pass@1", "eval/pass@4", "eval/maj@4"):
        assert close(metrics[key], logged[2][key], torch.float64), (key, metrics, logged[2])  # the same samples
    assert 0.0 < metrics["eval/pass@1"] < 1.0, "a constant score would not show reproduction"
