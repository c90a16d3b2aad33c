"""The local launcher end to end: built-in servers on the tiny model, trainers under torchrun."""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import pytest
import torch

from arealite.config import GRPOConfig, load_config
from arealite.launcher.launch_args import parse_launch_args
from arealite.launcher.local import LocalRun, main
from arealite.launcher.process import ManagedProcess
from arealite.utils.parent_watch import PARENT_PID_ENV, POLL_INTERVAL
from tests.devices import train_device_env
from tests.launcher.conftest import pid_alive
from tests.launcher.trainer_script import generate
from tests.tolerance import tolerance

pytestmark = pytest.mark.timeout(240)
HIDDEN = 64  # the tiny model's hidden size: the longest dot product behind a logit


def test_two_servers_two_trainers(launch, tiny_model_dir):
    run = launch(
        "local",
        [f"actor.path={tiny_model_dir}", "launcher.n_servers=2", "launcher.n_trainers=2"],
        env=train_device_env(2),
    )
    code, out, err = run.finish()
    assert code == 0, err
    ranks = [json.loads((run.run_dir / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [(r["rank"], r["world_size"], r["local_rank"]) for r in ranks] == [(0, 2, 0), (1, 2, 1)]
    addrs = ranks[0]["addrs"]
    assert len(set(addrs)) == 2 and all(a.startswith("127.0.0.1:") for a in addrs)
    assert all(len(o) == 2 for o in ranks[0]["outputs"])  # max_new_tokens=2 from each server
    for name in ("server-0.log", "server-1.log", "trainer.log"):
        assert (run.run_dir / "logs" / name).stat().st_size > 0
    assert "rank 1/2 talked to 2 server(s)" in (run.run_dir / "logs" / "trainer.log").read_text()
    saved = load_config(["--config", str(run.run_dir / "config.yaml")], GRPOConfig)
    assert saved.launcher.n_servers == 2 and saved.actor.path == tiny_model_dir
    assert not run.alive_pids()


def test_trainer_exit_status_is_returned(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    run = LocalRun(parse_launch_args([str(script), f"fileroot={tmp_path}"], "local"))
    for code, expected in (
        ("raise SystemExit(3)", 3),
        ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", 137),
    ):
        run.trainer = ManagedProcess("trainer", [sys.executable, "-c", code], str(tmp_path / "trainer.log"))
        run.trainer.start()
        assert run.supervise() == expected  # no servers: only the trainer is watched


def test_killed_server_without_restarts_stops_everything(launch, tiny_model_dir):
    run = launch(
        "local", [f"actor.path={tiny_model_dir}", "launcher.n_trainers=2"], mode="wait", env=train_device_env(2)
    )
    run.wait_for(run.trainers_started(2), what="two trainer ranks")
    pid = run.kill_first_server()
    code, _, err = run.finish()
    assert code != 0
    assert f"server-0 (pid {pid}" in err and "was killed by SIGKILL" in err and "restarts used: 0 of 0" in err
    assert not run.alive_pids()


def test_killed_server_is_restarted_catches_up_and_run_completes(launch, tiny_model_dir):
    """A real trainer syncs new weights (version 1), the server is killed and restarted by the
    launcher on the initial weights; back in rotation it must serve the trainer's weights."""
    overrides = [f"actor.path={tiny_model_dir}", "launcher.max_server_restarts=1", "server.dtype=float32"]
    run = launch("local", overrides, mode="resync")
    run.wait_for(lambda: (run.run_dir / "synced").exists(), what="the trainer's first weight sync")
    old_pid = run.kill_first_server()
    run.wait_for(lambda: len([p for p in run.processes() if p["name"] == "server-0"]) == 2, what="a restart")
    code, out, err = run.finish()
    assert code == 0, f"{out}\n{err}"
    assert "restarting on the same address (1 of 1)" in err
    servers = [p for p in run.processes() if p["name"] == "server-0"]
    assert servers[0]["addr"] == servers[1]["addr"] and servers[1]["pid"] != old_pid
    assert not run.alive_pids()
    record = json.loads((run.run_dir / "resync.json").read_text())
    assert record["server_version"] == "1"
    mask = torch.tensor(record["loss_mask"]).bool()
    server, trainer = torch.tensor(record["server"])[mask], torch.tensor(record["trainer"])[mask]
    bound = tolerance(torch.float32, HIDDEN) * float(server.abs().max())  # fp32 both sides
    assert float((server - trainer).abs().max()) <= bound, (server, trainer)


def test_sigterm_stops_every_child(launch, tiny_model_dir):
    run = launch(
        "local", [f"actor.path={tiny_model_dir}", "launcher.n_trainers=2"], mode="wait", env=train_device_env(2)
    )
    run.wait_for(run.trainers_started(2), what="two trainer ranks")
    run.proc.send_signal(signal.SIGTERM)
    code, _, err = run.finish()
    assert code == 128 + signal.SIGTERM, err
    assert "SIGTERM received" in err
    assert len(run.all_pids()) >= 4  # server, torchrun, two ranks
    assert not run.alive_pids()


def test_server_that_fails_to_start_reports_its_log(launch, tmp_path):
    run = launch("local", [f"actor.path={tmp_path}/no-such-model"])
    code, _, err = run.finish()
    assert code != 0
    assert "server-0 failed to start" in err and "--- last lines of" in err and "no-such-model" in err
    assert not (run.run_dir / "trainer-pids").exists()


def test_bad_arguments_fail_with_a_clear_message(tmp_path, capsys):
    assert main([]) == 2
    assert main([str(tmp_path / "missing.py")]) == 2
    assert "missing.py' does not exist" in capsys.readouterr().err
    script = tmp_path / "s.py"
    script.write_text("")
    assert main([str(script), "launcher.n_servrs=2"]) == 2
    assert "did you mean launcher.n_servers" in capsys.readouterr().err


def _one_visible_gpu(monkeypatch) -> None:
    # The launcher counts GPUs from CUDA_VISIBLE_DEVICES (else nvidia-smi), without torch.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.delenv("AREALITE_TRAIN_DEVICE", raising=False)


def test_more_trainer_ranks_than_gpus_is_refused_at_launch(tmp_path, capsys, monkeypatch):
    _one_visible_gpu(monkeypatch)
    script = tmp_path / "s.py"
    script.write_text("raise SystemExit('the trainer must not start')")
    argv = [str(script), f"fileroot={tmp_path}", "server.backend=builtin", "launcher.n_trainers=2"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "2 trainer ranks" in err and "only 1 visible GPU" in err and "launcher.n_trainers=1" in err, err
    assert "AREALITE_TRAIN_DEVICE=cpu" in err
    assert not any(tmp_path.rglob("processes.jsonl"))  # refused before anything started


def test_distributed_weight_update_beside_a_builtin_server_on_one_gpu_is_refused(tmp_path, capsys, monkeypatch):
    _one_visible_gpu(monkeypatch)
    script = tmp_path / "s.py"
    script.write_text("raise SystemExit('the trainer must not start')")
    assert main([str(script), f"fileroot={tmp_path}", "server.backend=builtin", "weight_update=distributed"]) == 2
    err = capsys.readouterr().err
    assert "weight_update=distributed" in err and "GPU 0" in err and "weight_update=disk" in err, err


def test_gpu_placement_allows_what_works(tmp_path, monkeypatch):
    from arealite.launcher.local import check_gpu_placement

    def config(*overrides: str) -> GRPOConfig:
        return load_config([f"fileroot={tmp_path}", *overrides], GRPOConfig)

    monkeypatch.delenv("AREALITE_TRAIN_DEVICE", raising=False)
    check_gpu_placement(config("launcher.n_trainers=2"), "builtin", ["0", "1"])  # a GPU per rank
    check_gpu_placement(config("launcher.n_trainers=4", "weight_update=distributed"), "builtin", [])  # CPU machine
    check_gpu_placement(config("weight_update=distributed", "server.extra_args=[--device,cpu]"), "builtin", ["0"])
    monkeypatch.setenv("AREALITE_TRAIN_DEVICE", "cpu")  # trainer ranks on the CPU: any number, no NCCL
    check_gpu_placement(config("launcher.n_trainers=2", "weight_update=distributed"), "builtin", ["0"])


def test_judge_server_is_served_and_dies_with_a_killed_launcher(launch, tiny_model_dir):
    """The judge's server runs beside the policy's, survives an AREALITE_PARENT_PID inherited
    from the launcher's own environment (which names a process that is not its parent), and
    stops with every other child once the launcher is SIGKILLed (no cleanup runs then)."""
    judge = [f"judge.path={tiny_model_dir}", "judge.timeout=5"]
    run = launch("local", [f"actor.path={tiny_model_dir}", *judge], mode="wait", env={PARENT_PID_ENV: str(os.getpid())})
    run.wait_for(run.trainers_started(1), what="the trainer")
    judge_server = next(p for p in run.processes() if p["name"] == "judge-0")
    time.sleep(3 * POLL_INTERVAL)  # a server watching the wrong parent would have stopped by now
    assert len(generate(judge_server["addr"])["output_ids"]) == 2
    pids = set(run.alive_pids(run.descendants()))
    assert judge_server["pid"] in pids and len(pids) >= 3  # judge, policy server, trainer
    run.proc.send_signal(signal.SIGKILL)
    run.proc.communicate(timeout=30)
    deadline = time.monotonic() + 30
    while [p for p in pids if pid_alive(p)] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in pids if pid_alive(p)]
