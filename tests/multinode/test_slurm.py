"""The Slurm launcher across hosts: slurmctld on one namespaced host (the login node, where
the launcher runs), one slurmd per compute host (NodeName = the host's name); the trainer job
spans both compute hosts (torchrun, gloo across hosts) and the example run learns."""

from __future__ import annotations

import json
import shutil
import sys
import time

import pytest

from tests.multinode.cluster import SlurmCluster
from tests.multinode.netns import Network
from tests.multinode.test_ray import LEARN, MARGIN, REPO, STEPS, WINDOW

pytestmark = [pytest.mark.multinode, pytest.mark.slow, pytest.mark.timeout(420)]


@pytest.fixture(scope="module")
def slurm_cluster(netns_ready, tmp_path_factory):
    if not all(shutil.which(d) for d in ("slurmctld", "slurmd", "munged", "sbatch")):
        pytest.skip("Slurm is not installed (slurmctld, slurmd, munged, sbatch); .ci/slurm_setup.sh installs it")
    with Network(3) as net:
        cluster = SlurmCluster(net.hosts, tmp_path_factory.mktemp("slurm"))
        try:
            yield cluster.start()
        finally:
            cluster.close()


def test_example_learns_with_a_two_node_trainer_job(slurm_cluster, tmp_path, tiny_model_dir):
    cmd = [
        sys.executable, "-m", "arealite.launcher.slurm", str(REPO / "examples" / "gsm8k_grpo.py"),
        "--config", str(REPO / "configs" / "tiny_cpu.yaml"), f"fileroot={tmp_path}", "experiment_name=mn",
        "trial_name=t", f"actor.path={tiny_model_dir}", "launcher.setup_commands=[]", "launcher.n_servers=1",
        "launcher.n_trainers=2", "launcher.trainer_nodes=2", "server.backend=builtin", "evaluator.freq_steps=0",
        "recover.mode=disabled", "stats_logger.plot=false", "stats_logger.progress_bar=false",
        "weight_update=distributed", *LEARN,
    ]  # fmt: skip
    env = dict(slurm_cluster.env, PYTHONPATH=str(REPO))
    proc = slurm_cluster.ctl.run(cmd, timeout=360, env=env, cwd=REPO)
    run_dir = tmp_path / "mn" / "t"
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    processes = [json.loads(line) for line in (run_dir / "processes.jsonl").read_text().splitlines()]
    torchruns = {p["host"] for p in processes if p["name"].startswith("torchrun-node-")}
    assert torchruns == {"node1", "node2"}, processes  # one trainer task per compute host
    server = next(p for p in processes if p["name"].startswith("server-0"))
    assert server["addr"].split(":")[0] in {h.addr for h in slurm_cluster.nodes}

    rows = [json.loads(line) for line in (run_dir / "stats.jsonl").read_text().splitlines()]
    rewards = [r["reward"] for r in rows if "reward" in r]
    assert len(rewards) == STEPS
    first, last = sum(rewards[:WINDOW]) / WINDOW, sum(rewards[-WINDOW:]) / WINDOW
    print(f"slurm: mean batch reward first {WINDOW} steps {first:.3f}, last {WINDOW} {last:.3f}")
    assert last >= first + MARGIN, f"no learning across hosts: reward {first:.3f} -> {last:.3f} ({rewards})"
    for host, slurmd in zip(slurm_cluster.nodes, slurm_cluster.slurmds):  # the job's processes are gone
        assert wait_until(lambda h=host, d=slurmd: h.pids() == [d.pid], 30), f"{host.hostname} keeps {host.pids()}"


def wait_until(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True
