"""GPU self-check, end to end: a few steps of the main job (examples/gsm8k_grpo.py through the
local launcher) on CUDA with the built-in server beside the trainer on one GPU; the step
stats say the advantages ran in Triton and every step updated the weights, and disk weight
sync keeps only the newest versions. Skipped without CUDA.

The model is the random tiny one (no warm start), so the reward is the even-token fraction
of each completion (tests/e2e/varied_reward.py): every group has reward variance from the
first step, where the arithmetic reward of a random model is 0 everywhere and no update
would have a gradient.

    python -m pytest -m cuda -q -s
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.cuda, pytest.mark.timeout(420)]
REPO = Path(__file__).resolve().parents[2]
STEPS = 4


def test_main_job_few_steps_on_cuda_with_the_builtin_server(tmp_path, tiny_model_dir):
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.pop("AREALITE_TRAIN_DEVICE", None)  # the trainer takes the GPU
    cmd = [
        sys.executable, "-m", "arealite.launcher.local", str(REPO / "examples" / "gsm8k_grpo.py"),
        "--config", str(REPO / "configs" / "tiny_cpu.yaml"),
        f"fileroot={tmp_path}", "experiment_name=gpu", "trial_name=t", f"actor.path={tiny_model_dir}",
        "launcher.setup_commands=[]", "server.backend=builtin", f"total_train_steps={STEPS}",
        "evaluator.freq_steps=0", "weight_keep_versions=2", "stats_logger.plot=false",
        "reward_fn=tests.e2e.varied_reward:even_token_fraction",
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    run_dir = tmp_path / "gpu" / "t"
    log = (run_dir / "logs" / "trainer.log").read_text() if (run_dir / "logs" / "trainer.log").exists() else ""
    assert proc.returncode == 0, f"{proc.stderr[-3000:]}\n--- trainer.log ---\n{log[-3000:]}"
    rows = [json.loads(line) for line in (run_dir / "stats.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in rows if "reward" in r]
    assert [r["step"] for r in steps] == list(range(STEPS))
    for r in steps:
        assert r["advantages/backend_triton"] == 1.0 and r["time/advantages"] > 0, r
        assert r["grad_norm"] > 0 and not r["update_skipped"], r
    print(
        "main job on CUDA: time/advantages per step (ms):",
        [round(r["time/advantages"] * 1e3, 2) for r in steps],
        "| logprob_mismatch:",
        [f"{r['logprob_mismatch']:.1e}" for r in steps],
    )
    assert sorted(os.listdir(run_dir / "weights")) == [f"v{STEPS - 1}", f"v{STEPS}"]
