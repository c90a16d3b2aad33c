"""RL learns through vLLM: the example script with `server.backend=vllm` (so its client is
`RemoteVLLMEngine`, and every step's weights reach the server by a disk sync) raises the reward
of the session's tiny random model on the even-token task of tests/e2e/test_learning.py.

A flipped policy-gradient sign, or a weight sync that never lands on the vLLM server, leaves the
reward flat or pushes it down. Robust as that test is: seeded sampling, a margin far below the
gain a working loop reaches, no timing assertion.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STEPS = 16
WINDOW = 4  # steps averaged at each end
MARGIN = 0.15  # required rise of the mean batch reward
pytestmark = pytest.mark.timeout(900)


def test_grpo_through_vllm_raises_the_reward(vllm_server, tmp_path):
    env = {
        **os.environ, "OMP_NUM_THREADS": "1", "AREAL_LLM_SERVER_ADDRS": vllm_server.address,
        "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }  # fmt: skip
    cmd = [
        sys.executable, str(REPO / "examples" / "gsm8k_grpo.py"), "--config", str(REPO / "configs" / "tiny_cpu.yaml"),
        f"fileroot={tmp_path}", "experiment_name=learn", "trial_name=t", f"actor.path={vllm_server.model_dir}",
        "server.backend=vllm", "weight_update=disk", "recover.mode=disabled", "evaluator.freq_steps=0",
        "stats_logger.plot=false", "stats_logger.progress_bar=false",
        f"total_train_steps={STEPS}", "reward_fn=tests.e2e.varied_reward:even_token_fraction",
        "gconfig.sampling_seed=5", "gconfig.max_new_tokens=8", "gconfig.group_size=8",
        "train_dataset.batch_size=8", "train_dataset.num_samples=256", "actor.ppo_n_minibatches=1",
        "actor.optimizer.lr=0.01", "actor.optimizer.lr_scheduler_type=constant",
        "rollout.max_head_offpolicyness=0", "rollout.dynamic_sampling=false",
    ]  # fmt: skip
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=800)
    finally:
        vllm_server.restore()
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    rows = [json.loads(line) for line in (tmp_path / "learn" / "t" / "stats.jsonl").read_text().splitlines()]
    rewards = [r["reward"] for r in rows if "reward" in r]
    assert len(rewards) == STEPS
    first, last = sum(rewards[:WINDOW]) / WINDOW, sum(rewards[-WINDOW:]) / WINDOW
    print(f"through vLLM, mean batch reward: first {WINDOW} steps {first:.3f}, last {WINDOW} steps {last:.3f}")
    assert last >= first + MARGIN, f"RL did not learn through vLLM: {first:.3f} -> {last:.3f} ({rewards})"
