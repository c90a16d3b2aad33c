"""Process-group setup: a plain process becomes a world of one; a half-configured torchrun
environment fails naming what is missing."""

from __future__ import annotations

import subprocess

import pytest

from arealite import world
from tests.train.helpers import PYTHON, subprocess_env


def test_single_process_world():
    assert world.init_distributed() == (0, 1)
    assert world.init_distributed() == (0, 1)  # idempotent
    assert world.is_main() and world.device().type in ("cpu", "cuda")


def test_world_size_without_rendezvous_is_a_clear_error():
    env = subprocess_env(WORLD_SIZE="2")
    for var in ("RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    code = "from arealite.world import init_distributed; init_distributed()"
    proc = subprocess.run([PYTHON, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "WORLD_SIZE=2" in proc.stderr and "MASTER_ADDR" in proc.stderr and "torchrun" in proc.stderr


def test_more_local_ranks_than_gpus_is_refused_naming_both(monkeypatch):
    # Simulates one visible GPU; the check runs before any CUDA call.
    monkeypatch.setattr(world, "visible_gpu_count", lambda: 1)
    monkeypatch.delenv("AREALITE_TRAIN_DEVICE", raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    with pytest.raises(RuntimeError, match=r"2 trainer ranks on this node but only 1 visible GPU.*n_trainers=1"):
        world._init(None, 10.0)
    monkeypatch.setenv("AREALITE_TRAIN_DEVICE", "cpu")
    assert world.device_type() == "cpu" and world.default_backend() == "gloo"
    monkeypatch.setenv("AREALITE_TRAIN_DEVICE", "tpu")
    with pytest.raises(ValueError, match="AREALITE_TRAIN_DEVICE='tpu'"):
        world.device_type()
