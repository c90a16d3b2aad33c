"""Two runs of the main example with the same seed write the same stats.jsonl, timings aside:
same prompts, same samples, same losses, rewards, gradient norms and logprob mismatches to the
last digit. Here with `rollout.schedule=lockstep` (batch b generated entirely by weights b - 1
while batch b - 1 trains); the synchronous pair is tests/e2e/test_recover.py's uninterrupted run
and its crashed twin before the kill, so no run is paid for twice. The servers run
`--enable-deterministic-inference`, so a request's logprobs do not depend on what shares its
batch (without it they differ in the 7th to 10th digit from run to run)."""

from __future__ import annotations

import re

import pytest

from tests.e2e.example_run import run_example

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
TIMING = re.compile(r"^time/|_s$|seconds|latency")  # wall-clock figures: never reproducible


def without_timings(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if not TIMING.search(k)} for row in rows]


def test_two_same_seed_lockstep_runs_write_identical_stats(tmp_path, tiny_model_dir):
    overrides = ["rollout.schedule=lockstep", "rollout.max_head_offpolicyness=1",
        "seed=3", "total_train_steps=3", "reward_fn=tests.e2e.varied_reward:even_token_fraction",
        "rollout.dynamic_sampling=false", "gconfig.max_new_tokens=6", "gconfig.group_size=4",
        "train_dataset.batch_size=4", "train_dataset.num_samples=64",
    ]  # fmt: skip
    det = ["--enable-deterministic-inference"]
    first = run_example(tmp_path / "a", tiny_model_dir, "repro", overrides, server_args=det)
    second = run_example(tmp_path / "b", tiny_model_dir, "repro", overrides, server_args=det)
    assert len(first) == 3 and all("logprob_mismatch" in row for row in first), first
    a, b = without_timings(first), without_timings(second)
    differ = sorted({k for ra, rb in zip(a, b) for k in ra.keys() | rb.keys() if ra.get(k) != rb.get(k)})
    assert a == b, f"stats differ in {differ}"
    # batch b came entirely from weights b - 1 (batch 0 from the initial ones)
    assert [row["staleness"] for row in first] == [0.0, 1.0, 1.0], first
