"""What a training step prints, set where a user sets it (`stats_logger.*` overrides on the
main job's config, read by `StatsLogger.from_config`): one progress bar with a handful of
numbers by default, one short line per step without the bar, every key with `print_stats`;
stats.jsonl holds every key in each mode."""

from __future__ import annotations

import pytest

from arealite.config import GRPOConfig, load_config
from arealite.stats import console
from arealite.stats.jsonl import read_stats
from arealite.stats.logger import StatsLogger
from tests.test_docs import REPO

STEPS = 3
ROWS = [
    {"reward": 0.5, "loss": -0.125, "grad_norm": 0.75, "time/step": 1.5, "eval/pass@1": 0.25},
    {"reward": 0.625, "loss": 0.0625, "grad_norm": 0.5, "time/step": 1.25},
    {"reward": 0.875, "loss": 0.25, "grad_norm": 0.25, "time/step": 1.0},
]


def _run(tmp_path, capsys, *overrides: str) -> tuple[str, str, list[dict]]:
    argv = ["--config", str(REPO / "configs" / "tiny_cpu.yaml"), f"fileroot={tmp_path}", f"total_train_steps={STEPS}"]
    config = load_config([*argv, *overrides], GRPOConfig)
    with StatsLogger.from_config(config, rank=0) as logger:
        for step, row in enumerate(ROWS):
            logger.commit(step, row)
        rows = read_stats(config.run_dir)
    out, err = capsys.readouterr()
    return out, err, rows


def _every_key_in_jsonl(rows: list[dict]) -> None:
    assert len(rows) == len(ROWS)
    for written, row in zip(rows, ROWS):
        assert {k: written.get(k) for k in row} == row


def test_by_default_a_step_is_the_progress_bar_alone(tmp_path, capsys):
    pytest.importorskip("tqdm")
    out, err, rows = _run(tmp_path, capsys)
    assert out == "", out  # nothing per step on stdout: no [stats] line
    last = err.replace("\r", "\n").strip().splitlines()[-1]
    assert f"{STEPS}/{STEPS}" in last, last
    for shown in ("step=2", "reward=0.875", "held_out=0.250", "s/step=1.00"):
        assert shown in last, last  # held-out pass@1 is the latest evaluation's, kept after it
    assert "loss" not in last and "grad_norm" not in last, last
    _every_key_in_jsonl(rows)


def test_without_the_bar_a_step_prints_one_short_line(tmp_path, capsys):
    out, err, rows = _run(tmp_path, capsys, "stats_logger.progress_bar=false")
    assert out.splitlines() == [
        "[step 0/3] step=0 reward=0.500 held_out=0.250 s/step=1.50",
        "[step 1/3] step=1 reward=0.625 held_out=0.250 s/step=1.25",
        "[step 2/3] step=2 reward=0.875 held_out=0.250 s/step=1.00",
    ]
    assert "%" not in err, err  # and no bar
    _every_key_in_jsonl(rows)


def test_print_stats_prints_every_key_of_every_step(tmp_path, capsys):
    out, _, rows = _run(tmp_path, capsys, "stats_logger.progress_bar=false", "stats_logger.print_stats=true")
    full = [line for line in out.splitlines() if line.startswith("[stats] ")]
    assert len(full) == STEPS, out
    for line, row in zip(full, ROWS):
        assert all(f"{k}=" in line for k in row), line
    assert full[0].startswith("[stats] step=0 elapsed_s="), full[0]
    _every_key_in_jsonl(rows)


@pytest.mark.parametrize(
    "overrides, shown",
    [((), False), (("stats_logger.print_stats=true",), True), (("stats_logger.progress_bar=false",), True)],
)
def test_step_events_print_without_the_bar_or_with_print_stats(tmp_path, capsys, overrides, shown):
    pytest.importorskip("tqdm")
    argv = ["--config", str(REPO / "configs" / "tiny_cpu.yaml"), f"fileroot={tmp_path}", f"total_train_steps={STEPS}"]
    with StatsLogger.from_config(load_config([*argv, *overrides], GRPOConfig), rank=0):
        console.event("[weight-sync] version 1 confirmed by a")  # what WeightSync.sync prints
    assert ("[weight-sync] version 1 confirmed by a" in capsys.readouterr().out) is shown
    console.event("[weight-sync] version 2 confirmed by a")  # the bar is gone: events print again
    assert "version 2" in capsys.readouterr().out
