"""The Ray launcher on a local Ray cluster it starts itself: actors, placement group, supervision."""

from __future__ import annotations

import json
import os
import signal

import pytest

pytest.importorskip("ray", reason="the Ray launcher needs the 'ray' extra: pip install -e .[ray]")

pytestmark = pytest.mark.timeout(300)


def _trainers_started(run, n: int):
    return lambda: (run.run_dir / "trainer-pids").is_dir() and len(os.listdir(run.run_dir / "trainer-pids")) >= n


def _kill_first_server(run) -> int:
    pid = next(p["pid"] for p in run.processes() if p["name"] == "server-0")
    os.kill(pid, signal.SIGKILL)
    return pid


def test_two_servers_two_ranks_as_actors(launch, tiny_model_dir):
    run = launch("ray", [f"actor.path={tiny_model_dir}", "launcher.n_servers=2", "launcher.n_trainers=2"])
    code, _, err = run.finish(timeout=240)
    assert code == 0, err
    ranks = [json.loads((run.run_dir / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [(r["rank"], r["world_size"], r["local_rank"]) for r in ranks] == [(0, 2, 0), (1, 2, 1)]
    assert ranks[0]["master"] == ranks[1]["master"]
    assert len(set(ranks[0]["addrs"])) == 2 and all(len(o) == 2 for o in ranks[1]["outputs"])
    names = {p["name"] for p in run.processes()}
    assert {"actor:server-0", "actor:server-1", "actor:trainer-0", "actor:trainer-1", "server-1"} <= names
    for name in ("server-0.log", "server-1.log", "trainer-0.log", "trainer-1.log"):
        assert (run.run_dir / "logs" / name).stat().st_size > 0
    assert not run.alive_pids()


def test_killed_server_without_restarts_tears_everything_down(launch, tiny_model_dir):
    run = launch("ray", [f"actor.path={tiny_model_dir}"], mode="wait")
    run.wait_for(_trainers_started(run, 1), timeout=180, what="the trainer rank")
    below = run.descendants()
    pid = _kill_first_server(run)
    code, _, err = run.finish(timeout=180)
    assert code != 0
    assert f"server-0 (pid {pid}" in err and "restarts used: 0 of 0" in err
    assert not run.alive_pids(extra=below), "a process of the run (server, rank, Ray daemon or worker) outlived it"


def test_killed_server_is_restarted_and_run_completes(launch, tiny_model_dir):
    run = launch("ray", [f"actor.path={tiny_model_dir}", "launcher.max_server_restarts=1"], mode="wait")
    run.wait_for(_trainers_started(run, 1), timeout=180, what="the trainer rank")
    old_pid = _kill_first_server(run)
    run.wait_for(lambda: len([p for p in run.processes() if p["name"] == "server-0"]) == 2, what="a restart")
    (run.run_dir / "stop").touch()
    code, _, err = run.finish(timeout=180)
    assert code == 0, err
    assert "server-0 died and was restarted on its address (1 of 1)" in err
    servers = [p for p in run.processes() if p["name"] == "server-0"]
    assert servers[0]["addr"] == servers[1]["addr"] and servers[1]["pid"] != old_pid
    assert not run.alive_pids()

