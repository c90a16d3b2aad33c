"""The Slurm launcher against a real single-node Slurm (.ci/slurm_setup.sh starts one).

A full 2-server, 2-rank run of examples/gsm8k_grpo.py is in test_examples.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from arealite.launcher.slurm import main

pytestmark = pytest.mark.timeout(300)


def _slurm_ready() -> None:
    """Skip without Slurm binaries outside CI; in CI (or with binaries) fail if Slurm is not up."""
    if shutil.which("sbatch") is None and not os.environ.get("CI"):
        pytest.skip("Slurm is not installed (no sbatch); run .ci/slurm_setup.sh as root to install and start it")
    ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True)
    if "is UP" not in ping.stdout:
        pytest.fail(f"slurmctld is not answering ({ping.stdout.strip()}); run .ci/slurm_setup.sh as root")


@pytest.fixture
def slurm():
    _slurm_ready()


def test_dry_run_prints_both_scripts_without_submitting(tmp_path, capsys):
    script = tmp_path / "train.py"
    script.write_text("")
    argv = [f"fileroot={tmp_path}", "actor.path=/m", "launcher.n_servers=3", "launcher.n_trainers=4"]
    argv += ["launcher.trainer_nodes=2", "launcher.slurm_partition=gpu", "launcher.slurm_sbatch_args=[--account=rl]"]
    assert main(["--dry-run", str(script), *argv]) == 0
    out = capsys.readouterr().out
    assert out.count("#!/bin/bash") == 2 and "--dry-run" not in out
    assert "#SBATCH --ntasks=3" in out and "#SBATCH --nodes=2" in out and "--nproc-per-node=2" in out
    assert out.count("#SBATCH --partition=gpu") == 2 and out.count("#SBATCH --account=rl") == 2
    assert "srun --kill-on-bad-exit=1" in out and "-m arealite.launcher.serve" in out
    assert (tmp_path / "arealite" / "trial0" / "slurm" / "trainer.sbatch").is_file()


def test_killed_server_without_restarts_cancels_everything(slurm, launch, tiny_model_dir):
    """With a distillation teacher, started as the local launcher starts one (the rank reaches it),
    and cancelled with everything else."""
    run = launch("slurm", [f"actor.path={tiny_model_dir}", f"distill.teacher_path={tiny_model_dir}"], mode="wait")
    run.wait_for(run.trainers_started(1), timeout=180, what="the trainer rank")
    run.wait_for(lambda: (run.run_dir / "teachers0.json").exists(), what="the rank's call to the teacher")
    teachers = json.loads((run.run_dir / "teachers0.json").read_text())
    assert [p["addr"] for p in run.processes() if p["name"] == "teacher-0"] == teachers["addrs"]
    pid = run.kill_first_server()
    code, _, err = run.finish(timeout=180)
    assert code != 0
    assert f"server-0 (pid {pid}" in err and "restarts used: 0 of 0" in err and "cancelled every job" in err
    assert len(run.all_pids()) >= 6  # supervisors, server, teacher, torchrun, rank
    assert not run.alive_pids()


def test_killed_server_is_restarted_and_run_completes(slurm, launch, tiny_model_dir):
    run = launch("slurm", [f"actor.path={tiny_model_dir}", "launcher.max_server_restarts=1"], mode="wait")
    run.wait_for(run.trainers_started(1), timeout=180, what="the trainer rank")
    old_pid = run.kill_first_server()
    run.wait_for(lambda: len([p for p in run.processes() if p["name"] == "server-0"]) == 2, what="a restart")
    (run.run_dir / "stop").touch()
    code, _, err = run.finish(timeout=180)
    assert code == 0, err
    assert "restarting on the same address (1 of 1)" in err
    servers = [p for p in run.processes() if p["name"] == "server-0"]
    assert servers[0]["addr"] == servers[1]["addr"] and servers[1]["pid"] != old_pid
    assert not run.alive_pids()
