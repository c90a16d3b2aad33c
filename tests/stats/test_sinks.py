"""The optional sinks of StatsLogger: TensorBoard event files read back with TensorBoard's own
reader, and an offline W&B run read back from its transaction log, hold the same scalars as
stats.jsonl, and the completions shown by log_samples."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

from arealite.stats.jsonl import read_stats
from arealite.stats.logger import StatsLogger

ROWS = [
    {"loss": 0.5, "reward": 1 / 3, "eval/pass@1": 0.25, "note": "text", "not_finite": float("nan")},
    {"loss": -0.125, "reward": 2 / 3, "grad_norm": 3.0e-7, "ids": [1, 2]},
    {"loss": 1.0e6, "reward": 0.7, "version": 3},
]
SAMPLES = [{"prompt": "1+2=", "completion": "3|<eos>\nok", "reward": 1.0, "advantage": 0.5}]


def _log(run_dir: str, **sinks) -> list[dict]:
    with StatsLogger(run_dir, progress_bar=False, run_name="sinks/test", **sinks) as logger:
        for step, row in enumerate(ROWS):
            if step == 1:
                logger.log_samples(step, SAMPLES)
            logger.commit(step, row)
    return read_stats(run_dir)


def _scalars(row: dict) -> dict[str, float]:
    """What stats.jsonl holds as a number (not the step itself, not text, lists or nulls)."""
    return {k: v for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step"}


def test_tensorboard_event_files_hold_the_scalars_of_stats_jsonl(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    rows = _log(str(tmp_path), tensorboard=True)
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    expected = {(r["step"], k): v for r in rows for k, v in _scalars(r).items()}
    found = {(e.step, tag): e.value for tag in events.Tags()["scalars"] for e in events.Scalars(tag)}
    assert found.keys() == expected.keys()
    for key, value in expected.items():  # TensorBoard stores scalars as float32
        assert found[key] == float(np.float32(value)), key
    (text,) = events.Tensors("samples/text_summary")
    table = text.tensor_proto.string_val[0].decode()
    assert text.step == 1 and "3\\|<eos><br>ok" in table and "1+2=" in table


def test_wandb_offline_run_holds_the_scalars_of_stats_jsonl(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from tests.stats.wandb_log import wandb_history

    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "config"))
    rows = _log(str(tmp_path), wandb_mode="offline")
    history = wandb_history(str(tmp_path))
    assert sorted(history) == [r["step"] for r in rows]
    for row in rows:
        logged = {k: v for k, v in history[row["step"]].items() if not k.startswith(("_", "samples/"))}
        assert logged == _scalars(row)  # exactly: W&B keeps doubles
    assert math.isnan(ROWS[0]["not_finite"]) and "not_finite" not in history[0]
    table_file = os.path.join(os.path.dirname(_run_file(tmp_path)), "files", history[1]["samples/path"])
    with open(table_file) as f:
        table = json.load(f)
    assert table["columns"] == ["step", *SAMPLES[0]] and table["data"] == [[1, *SAMPLES[0].values()]]


def _run_file(tmp_path) -> str:
    import glob

    (path,) = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "run-*.wandb"))
    return path
