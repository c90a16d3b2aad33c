"""How each launcher maps the allocation in `launcher.*` to GPUs, Ray bundles and sbatch options."""

from __future__ import annotations

import pytest

from arealite.config import ConfigError, GRPOConfig, load_config
from arealite.launcher.local import allocate_gpus
from arealite.launcher.sbatch import servers_script, trainer_script


def _config(*overrides: str) -> GRPOConfig:
    return load_config(["actor.path=/m", *overrides], GRPOConfig)


def test_local_gives_servers_then_trainer_disjoint_gpus(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,4,5,6,7")
    cfg = _config("launcher.n_servers=2", "launcher.gpus_per_server=2", "launcher.n_trainers=1")
    assert allocate_gpus(cfg, "sglang") == ([["3", "4"], ["5", "6"]], ["7"])
    assert allocate_gpus(cfg, "builtin") is None  # CPU servers: the environment is left alone


def test_local_names_the_shortfall_of_gpus(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    cfg = _config("launcher.n_servers=2", "launcher.n_trainers=1")
    with pytest.raises(ConfigError, match="need 3 GPUs, but 2 are visible"):
        allocate_gpus(cfg, "sglang")


def test_ray_bundles_request_gpus_only_for_sglang():
    pytest.importorskip("ray", reason="the Ray launcher needs the 'ray' extra")
    from arealite.launcher.ray import placement_bundles

    cfg = _config(
        "launcher.n_servers=1", "launcher.n_trainers=2", "launcher.gpus_per_server=4", "launcher.cpus_per_trainer=3"
    )
    assert placement_bundles(cfg, "sglang") == [{"CPU": 1, "GPU": 4}, {"CPU": 3, "GPU": 1}, {"CPU": 3, "GPU": 1}]
    assert placement_bundles(cfg, "builtin") == [{"CPU": 1}, {"CPU": 3}, {"CPU": 3}]


def test_sbatch_scripts_request_gpus_for_sglang_and_split_ranks_over_nodes():
    cfg = _config(
        "launcher.n_servers=2", "launcher.gpus_per_server=2", "launcher.n_trainers=8", "launcher.trainer_nodes=2"
    )
    servers = servers_script(cfg, "sglang", "/runs/x", "/proj")
    trainer = trainer_script(cfg, "sglang", "/runs/x", "/proj", "/proj/train.py", ["--config", "c.yaml"])
    assert "#SBATCH --gpus-per-task=2" in servers and "--backend sglang" in servers
    assert "#SBATCH --nodes=2" in trainer and "#SBATCH --gpus-per-node=4" in trainer
    assert "--nnodes=2 --nproc-per-node=4" in trainer and '--node-rank="$SLURM_NODEID"' in trainer
    assert "gpus" not in servers_script(cfg, "builtin", "/runs/x", "/proj")


def test_uneven_trainer_split_is_rejected():
    with pytest.raises(ConfigError, match="n_trainers=3 does not split evenly"):
        _config("launcher.n_trainers=3", "launcher.trainer_nodes=2")
