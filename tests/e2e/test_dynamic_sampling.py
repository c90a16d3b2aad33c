"""`rollout.dynamic_sampling=true` through the example script, synchronous and asynchronous:
groups whose rewards are all equal are never trained, every step still trains a full batch,
and the dropped prompts are retired (none comes back, none is trained twice).

The reward (tests/e2e/varied_reward.py) is constant for prompts with an even answer, so
those groups carry no signal and must all be dropped; the others vary with the tokens. With a
reward constant for every prompt, the search is bounded: each step fills its batch with
equal-reward groups after a bounded search, instead of sampling forever.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from arealite.data.arithmetic import make_arithmetic_dataset
from arealite.server.process import launch_server_process

REPO = Path(__file__).resolve().parents[2]
STEPS, BATCH, SAMPLES = 3, 4, 128
pytestmark = pytest.mark.timeout(300)


def _run(tmp_path: Path, model: str, reward: str, offpolicyness: int) -> list[dict]:
    server = launch_server_process(model, extra_args=["--skip-server-warmup"])
    env = {
        **os.environ, "OMP_NUM_THREADS": "1", "AREAL_LLM_SERVER_ADDRS": server.address,
        "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }  # fmt: skip
    cmd = [
        sys.executable, str(REPO / "examples" / "gsm8k_grpo.py"), "--config", str(REPO / "configs" / "tiny_cpu.yaml"),
        f"fileroot={tmp_path}", "experiment_name=ds", "trial_name=t", f"actor.path={model}", "seed=1",
        f"total_train_steps={STEPS}", "recover.mode=disabled", "evaluator.freq_steps=0",
        f"reward_fn=tests.e2e.varied_reward:{reward}", "rollout.dynamic_sampling=true",
        f"rollout.max_head_offpolicyness={offpolicyness}", "gconfig.max_new_tokens=6", "gconfig.group_size=4",
        f"train_dataset.batch_size={BATCH}", f"train_dataset.num_samples={SAMPLES}",
        "stats_logger.plot=false", "stats_logger.progress_bar=false",
    ]  # fmt: skip
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=280)
    finally:
        server.stop()
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return [json.loads(line) for line in (tmp_path / "ds" / "t" / "stats.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("offpolicyness", [0, 1])
def test_dynamic_sampling_trains_only_groups_whose_rewards_differ(tmp_path, tiny_model_dir, offpolicyness):
    rows = _run(tmp_path, tiny_model_dir, "constant_for_even_answers", offpolicyness)
    answers = {r["id"]: int(r["answer"]) for r in make_arithmetic_dataset(SAMPLES, seed=1, max_operand=9, ops="+")}
    trained = [r["prompt_ids"] for r in rows]
    assert [len(ids) for ids in trained] == [BATCH] * STEPS, "every step trains a full batch"
    flat = [i for ids in trained for i in ids]
    assert len(flat) == len(set(flat)), "a prompt was trained twice"
    assert all(answers[i] % 2 == 1 for i in flat), "a group with equal rewards was trained"
    assert rows[-1]["dropped_groups"] >= 1
    assert all(r["reward_min"] < r["reward_max"] for r in rows)


def test_a_constant_reward_fills_the_batch_instead_of_sampling_forever(tmp_path, tiny_model_dir):
    rows = _run(tmp_path, tiny_model_dir, "constant", 0)
    assert [len(r["prompt_ids"]) for r in rows] == [BATCH] * STEPS
    assert rows[-1]["filler_groups"] == STEPS * BATCH and rows[-1]["dropped_groups"] >= 1
    flat = [i for r in rows for i in r["prompt_ids"]]
    assert len(flat) == len(set(flat)), "a prompt was trained twice"
