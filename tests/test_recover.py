"""Recover: a checkpoint restores weights, optimizer, lr schedule, data position and RNG; a
half-written checkpoint is never loaded; old ones are pruned; a damaged newest one (a file
truncated, altered or deleted) is skipped for the previous good one."""

from __future__ import annotations

import os
import random

import pytest
import torch

from arealite.config import OptimizerConfig, RecoverConfig, TrainEngineConfig
from arealite.data.arithmetic import make_arithmetic_dataset
from arealite.data.loader import create_dataloader
from arealite.recover import Recover, RecoverError
from arealite.stats.jsonl import read_stats
from arealite.stats.logger import StatsLogger
from arealite.train.engine import FSDPEngine

pytestmark = pytest.mark.timeout(180)


def _engine(path: str) -> FSDPEngine:
    opt = OptimizerConfig(lr=1e-2, lr_scheduler_type="linear", warmup_steps_proportion=0.2)
    return FSDPEngine(
        TrainEngineConfig(path=path, dtype="float32", optimizer=opt), total_optimizer_steps=10
    ).initialize()


def _step(engine: FSDPEngine, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 500, (2, 6), generator=g)
    batch = {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids, dtype=torch.bool),
        "loss_mask": torch.ones_like(ids),
    }
    engine.train_batch(
        batch, lambda logits, mb: (logits.float().pow(2).mean(), {}), lambda mb: float(mb["loss_mask"].sum())
    )


def _params(engine: FSDPEngine) -> dict[str, torch.Tensor]:
    return {
        k: v.full_tensor().clone() if hasattr(v, "full_tensor") else v.clone()
        for k, v in engine.model.state_dict().items()
    }


def _ids(batch) -> list[str]:
    return [r["id"] for r in batch]


def test_save_then_load_continues_exactly(tmp_path, tiny_model_dir):
    records = make_arithmetic_dataset(40, seed=0)
    loader = create_dataloader(records, 4, shuffle=True, seed=3)
    engine = _engine(tiny_model_dir)
    logger = StatsLogger(str(tmp_path), jsonl=True)
    recover = Recover(RecoverConfig(freq_steps=1), str(tmp_path))
    it = iter(loader)
    for step in range(2):
        next(it)
        _step(engine, step)
        logger.commit(step, {"reward": 0.0})
    recover.save(1, version=2, actor=engine, dataloader=loader, stats_logger=logger, extra={"accuracy": {"0": 0.25}})
    random.seed(5)
    torch.manual_seed(5)
    # what the uninterrupted run does next
    expected_batches = [_ids(next(it)) for _ in range(3)]
    expected_rand = (random.random(), torch.rand(3))
    _step(engine, 2)
    logger.commit(2, {"reward": 1.0})
    expected_params, expected_lr = _params(engine), engine.optimizer.param_groups[0]["lr"]
    logger.close()

    # a fresh process: new engine, new loader, then load
    engine2 = _engine(tiny_model_dir)
    loader2 = create_dataloader(records, 4, shuffle=True, seed=3)
    logger2 = StatsLogger(str(tmp_path), jsonl=True)
    info = Recover(RecoverConfig(), str(tmp_path)).load(engine2, loader2, logger2)
    assert (info.step, info.version, info.extra) == (1, 2, {"accuracy": {"0": 0.25}})
    it2 = iter(loader2)
    assert [_ids(next(it2)) for _ in range(3)] == expected_batches
    random.seed(5)  # RNG restored to the checkpoint, then the same seeding as above
    torch.manual_seed(5)
    assert (random.random(), torch.rand(3)) == (expected_rand[0], pytest.approx(expected_rand[1]))
    _step(engine2, 2)
    got = _params(engine2)
    assert all(torch.equal(got[k], expected_params[k]) for k in got), "weights/optimizer/lr differ after recovery"
    assert engine2.optimizer.param_groups[0]["lr"] == expected_lr
    logger2.close()
    assert [r["step"] for r in read_stats(str(tmp_path))] == [0, 1], "rows after the checkpoint are dropped"
    engine.destroy()
    engine2.destroy()


def test_partial_checkpoints_are_ignored_and_old_ones_pruned(tmp_path, tiny_model_dir):
    engine = _engine(tiny_model_dir)
    recover = Recover(RecoverConfig(freq_steps=1, keep_last=2), str(tmp_path))
    for step in range(3):
        recover.save(step, step + 1, engine, None)
    root = tmp_path / "checkpoints"
    assert sorted(os.listdir(root)) == ["latest", "step_1", "step_2"]
    # a crash while writing step 3: its folder is still .partial and `latest` was not moved
    (root / "step_3.partial").mkdir()
    assert recover.latest() == str(root / "step_2")
    engine.destroy()


def test_modes_and_schedule(tmp_path):
    with pytest.raises(RecoverError, match="recover.mode=auto"):
        Recover(RecoverConfig(mode="resume"), str(tmp_path)).load(None, None)
    assert Recover(RecoverConfig(mode="auto"), str(tmp_path)).load(None, None) is None
    r = Recover(RecoverConfig(freq_steps=3), str(tmp_path))
    assert [s for s in range(10) if r.should_save(s, 10)] == [2, 5, 8, 9]
    assert not Recover(RecoverConfig(mode="disabled"), str(tmp_path)).should_save(9, 10)


def _damage(folder, how: str) -> str:
    """Damage one file of the checkpoint in `folder` as a full disk, a bad copy or a stray
    delete would; returns the file's name relative to the folder."""
    data = folder / "train_state" / "__0_0.distcp"
    if how == "truncate":
        data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
        return "train_state/__0_0.distcp"
    if how == "flip_bytes":  # same size: only the checksum tells
        raw = bytearray(data.read_bytes())
        raw[len(raw) // 2 : len(raw) // 2 + 8] = bytes(b ^ 0xFF for b in raw[len(raw) // 2 : len(raw) // 2 + 8])
        data.write_bytes(bytes(raw))
        return "train_state/__0_0.distcp"
    if how == "delete":
        (folder / "rank0.pt").unlink()
        return "rank0.pt"
    (folder / "meta.json").write_text('{"step": 2, "vers')  # "bad_meta": cut mid-write
    return "meta.json"


@pytest.fixture(scope="module")
def three_checkpoints(tmp_path_factory, tiny_model_dir):
    """A run dir with checkpoints after steps 0, 1 and 2, and the parameters saved at step 1."""
    run_dir = tmp_path_factory.mktemp("three_checkpoints")
    engine = _engine(tiny_model_dir)
    recover = Recover(RecoverConfig(freq_steps=1, keep_last=3), str(run_dir))
    saved = {}
    for step in range(3):
        _step(engine, step)
        recover.save(step, step + 1, engine, None)
        saved[step] = _params(engine)
    engine.destroy()
    return run_dir, saved


@pytest.mark.parametrize("how", ["truncate", "flip_bytes", "delete", "bad_meta"])
def test_damaged_latest_checkpoint_falls_back_to_the_previous_one(
    three_checkpoints, tmp_path, tiny_model_dir, how, caplog
):
    import shutil

    source, saved = three_checkpoints
    shutil.copytree(source, tmp_path / "run")
    damaged = _damage(tmp_path / "run" / "checkpoints" / "step_2", how)
    engine = _engine(tiny_model_dir)
    with caplog.at_level("WARNING", logger="arealite.recover"):
        info = Recover(RecoverConfig(mode="resume"), str(tmp_path / "run")).load(engine, None)
    assert (info.step, info.version) == (1, 2)
    got = _params(engine)
    assert all(torch.equal(got[k], saved[1][k]) for k in got), "not the parameters saved at step 1"
    assert "step_2" in caplog.text and damaged in caplog.text and "falling back" in caplog.text, caplog.text
    engine.destroy()


def test_every_checkpoint_damaged_is_an_error_naming_each(three_checkpoints, tmp_path):
    import shutil

    source, _ = three_checkpoints
    shutil.copytree(source, tmp_path / "run")
    for step, how in zip(range(3), ["truncate", "delete", "flip_bytes"]):
        _damage(tmp_path / "run" / "checkpoints" / f"step_{step}", how)
    with pytest.raises(
        RecoverError,
        match=r"every checkpoint .* is damaged \(step_2: .*SHA-256.*; step_1: rank0.pt is missing; step_0: .*truncated",
    ):
        Recover(RecoverConfig(), str(tmp_path / "run")).load(None, None)
