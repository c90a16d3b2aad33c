"""The Ray launcher on a real local Ray cluster: server supervision, teardown, existing clusters.

A full 2-server, 2-rank run of examples/gsm8k_grpo.py is in test_examples.py.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

pytest.importorskip("ray", reason="the Ray launcher needs the 'ray' extra: pip install -e .[ray]")

from arealite.utils import net

pytestmark = pytest.mark.timeout(300)


def _session_members(sid: int) -> list[int]:
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[3]) == sid:  # state ppid pgrp session
                        members.append(int(entry))
            except (OSError, ValueError, IndexError):
                pass
    return members


# Head, workers and driver must agree on these, so every process of these tests gets them.
# Ray maps 127.0.0.1 to the machine's network address unless told this is a one-machine
# cluster. Ray 2.60 turns token auth on by default and a client that disagrees with the head
# retries silently; on a loopback-only test cluster it is off for all.
LOOPBACK_CLUSTER_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled"}


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    """An existing Ray cluster on loopback (`ray start --head`), shared by this module's tests."""
    port = net.free_ports(1)[0]
    ray_cli = os.path.join(os.path.dirname(sys.executable), "ray")
    # A private temp dir: Ray records the cluster in <temp-dir>/ray_current_cluster, where a
    # bare ray.init() elsewhere on this machine would otherwise find and join it.
    temp_dir = tempfile.mkdtemp(prefix="rt")  # short: Ray's socket paths must stay < 108 bytes
    cmd = [ray_cli, "start", "--head", "--block", f"--port={port}", "--num-cpus=8", "--node-ip-address=127.0.0.1"]
    cmd += ["--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp_dir}"]
    log = open(tmp_path_factory.mktemp("ray") / "head.log", "w")
    env = dict(os.environ, **LOOPBACK_CLUSTER_ENV)
    head = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    try:
        deadline = time.monotonic() + 120
        while net.port_is_free("127.0.0.1", port):
            if head.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"ray start --head did not come up; see {log.name}")
            time.sleep(0.3)
        yield f"127.0.0.1:{port}"
    finally:
        # SIGKILL the whole session: workers sit in their own process groups, and SIGTERM
        # makes the head drain for 30 s.
        for pid in _session_members(head.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        head.wait(timeout=30)
        log.close()
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_killed_server_without_restarts_tears_everything_down(launch, tiny_model_dir):
    # The launcher starts its own local cluster here, so Ray's daemons count as the run's processes.
    run = launch("ray", [f"actor.path={tiny_model_dir}", "launcher.n_trainers=2"], mode="wait")
    run.wait_for(run.trainers_started(2), timeout=180, what="two trainer ranks")
    below = run.descendants()
    pid = run.kill_first_server()
    code, _, err = run.finish(timeout=180)
    assert code != 0, err
    assert f"server-0 (pid {pid}" in err and "restarts used: 0 of 0" in err
    assert not run.alive_pids(extra=below), "a process of the run (server, rank, Ray daemon or worker) outlived it"


# heavy, for the suite's time (the default command must stay under 25 minutes on 2 cores):
# the same restart is run through the local and Slurm launchers
@pytest.mark.heavy
def test_killed_server_is_restarted_and_run_completes(launch, tiny_model_dir, ray_cluster):
    # An existing cluster (launcher.ray_address), as a user's would be.
    overrides = [
        f"actor.path={tiny_model_dir}",
        "launcher.max_server_restarts=1",
        f"launcher.ray_address={ray_cluster}",
    ]
    run = launch("ray", overrides, mode="wait", env=LOOPBACK_CLUSTER_ENV)
    run.wait_for(run.trainers_started(1), timeout=180, what="the trainer rank")
    old_pid = run.kill_first_server()
    run.wait_for(lambda: len([p for p in run.processes() if p["name"] == "server-0"]) == 2, what="a restart")
    (run.run_dir / "stop").touch()
    code, _, err = run.finish(timeout=180)
    assert code == 0, err
    assert "server-0 died and was restarted on its address (1 of 1)" in err
    servers = [p for p in run.processes() if p["name"] == "server-0"]
    assert servers[0]["addr"] == servers[1]["addr"] and servers[1]["pid"] != old_pid
    assert not run.alive_pids()


def test_sigterm_stops_every_actor_and_child_teacher_included(launch, tiny_model_dir, ray_cluster):
    """A distillation teacher is started as the local launcher starts one (its address reaches the
    rank, which it answers), and stopped with everything else."""
    # ray.init replaces SIGTERM with a handler that aborts the driver; the launcher takes it back.
    overrides = [f"actor.path={tiny_model_dir}", f"launcher.ray_address={ray_cluster}"]
    overrides.append(f"distill.teacher_path={tiny_model_dir}")
    run = launch("ray", overrides, mode="wait", env=LOOPBACK_CLUSTER_ENV)
    run.wait_for(run.trainers_started(1), timeout=180, what="the trainer rank")
    run.wait_for(lambda: (run.run_dir / "teachers0.json").exists(), what="the rank's call to the teacher")
    teachers = json.loads((run.run_dir / "teachers0.json").read_text())
    assert len(teachers["addrs"]) == 1 and len(teachers["outputs"][0]) >= 1
    assert [p["addr"] for p in run.processes() if p["name"] == "teacher-0"] == teachers["addrs"]
    run.proc.send_signal(signal.SIGTERM)
    code, _, err = run.finish(timeout=180)
    assert code == 128 + signal.SIGTERM, err
    assert "SIGTERM received; stopped everything" in err
    assert len(run.all_pids()) >= 6  # three actors, the server, the teacher, the rank
    assert not run.alive_pids()


def test_allocation_that_does_not_fit_is_reported(launch, ray_cluster):
    overrides = ["actor.path=/unused", "launcher.cpus_per_server=64", "launcher.server_start_timeout=3"]
    run = launch("ray", [*overrides, f"launcher.ray_address={ray_cluster}"], env=LOOPBACK_CLUSTER_ENV)
    code, _, err = run.finish(timeout=120)
    assert code == 1
    assert "cannot place [{'CPU': 64}, {'CPU': 1}]" in err and "Lower launcher.cpus_per_*" in err
