"""`rollout.dynamic_sampling=true` through the example script, synchronous and asynchronous:
groups whose rewards are all equal are never trained, every step still trains a full batch,
and the dropped prompts are retired (none comes back, none is trained twice).

The reward (tests/e2e/varied_reward.py) is constant for prompts with an even answer, so
those groups carry no signal and must all be dropped; the others vary with the tokens. With a
reward constant for every prompt, the search is bounded: each step fills its batch with
equal-reward groups after a bounded search, instead of sampling forever.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from arealite.data.arithmetic import make_arithmetic_dataset
from tests.e2e.example_run import run_example

STEPS, BATCH, SAMPLES = 3, 4, 128
pytestmark = pytest.mark.timeout(300)


def _run(tmp_path: Path, model: str, reward: str, offpolicyness: int) -> list[dict]:
    return run_example(tmp_path, model, "ds", [
        "seed=1", f"total_train_steps={STEPS}", f"reward_fn=tests.e2e.varied_reward:{reward}",
        "rollout.dynamic_sampling=true", f"rollout.max_head_offpolicyness={offpolicyness}",
        "gconfig.max_new_tokens=6", "gconfig.group_size=4",
        f"train_dataset.batch_size={BATCH}", f"train_dataset.num_samples={SAMPLES}",
    ])  # fmt: skip


# 0 (synchronous): heavy, for the suite's time; the filter is the same code at either staleness,
# and the constant-reward test below runs synchronously
@pytest.mark.parametrize("offpolicyness", [pytest.param(0, marks=pytest.mark.heavy), 1])
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
