"""Runs of the example script that several tests read, so that no two tests pay for the same
run (session fixtures, registered in tests/conftest.py; the tests that use one run on one
xdist worker, tests/conftest.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.example_run import run_example_output

# what the run's evaluation used: the standalone eval (tests/eval/test_eval_cli.py) must be given the same
EVAL_SETTINGS = [
    "reward_fn=tests.e2e.varied_reward:even_token_fraction", "gconfig.max_new_tokens=6",
    "evaluator.k=4", "evaluator.num_samples=12", "evaluator.temperature=1.0",
]  # fmt: skip


@dataclass
class ExampleRun:
    run_dir: Path  # <fileroot>/<experiment>/t
    dump: Path  # rollout.dump_dir
    rows: list[dict]  # stats.jsonl
    stdout: str


@pytest.fixture(scope="session")
def dumped_run(tmp_path_factory, tiny_model_dir) -> ExampleRun:
    """3 synchronous steps of the main example on the tiny model (batch 4, group 4, two minibatches):
    every trained sample dumped (`rollout.dump_dir`), a checkpoint after step 1, held-out evaluation
    at versions 0 and 2 (two samples shown each time) and after the last step. Read by
    tests/replay/test_replay.py (the dump and its replay) and tests/eval/test_eval_cli.py (the
    standalone eval of version 2 reproduces the run's own)."""
    root = tmp_path_factory.mktemp("dumped_run")
    dump = root / "dump"
    rows, stdout = run_example_output(
        root, tiny_model_dir, "replay",
        [
            *EVAL_SETTINGS, "total_train_steps=3", "train_dataset.batch_size=4", "gconfig.group_size=4",
            "rollout.dynamic_sampling=false", f"rollout.dump_dir={dump}",
            "recover.mode=auto", "recover.freq_steps=2", "evaluator.freq_steps=2",
            "stats_logger.samples_shown=2", "actor.ppo_n_minibatches=2",
        ],
    )  # fmt: skip
    return ExampleRun(root / "replay" / "t", dump, rows, stdout)
