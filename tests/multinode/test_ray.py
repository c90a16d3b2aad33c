"""The Ray launcher across hosts: a head in one namespaced host, a worker node in each other;
the example run learns with its server and its two trainer ranks on three different hosts
(FSDP2 over gloo across hosts), for `weight_update=distributed` and `disk`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.launcher.conftest import pid_alive
from tests.multinode.cluster import RayCluster
from tests.multinode.netns import Network

pytest.importorskip("ray", reason="the Ray launcher needs the 'ray' extra: pip install -e .[ray]")
pytestmark = [pytest.mark.multinode, pytest.mark.slow, pytest.mark.timeout(420)]

REPO = Path(__file__).resolve().parents[2]
STEPS = 12
WINDOW = 4  # steps averaged at each end (one step's batch reward is noisy)
MARGIN = 0.1  # required rise of the mean batch reward; a working loop gains far more
LEARN = [
    f"total_train_steps={STEPS}", "reward_fn=tests.e2e.varied_reward:even_token_fraction",
    "gconfig.sampling_seed=5", "gconfig.max_new_tokens=8", "gconfig.group_size=8",
    "train_dataset.batch_size=8", "train_dataset.num_samples=256", "actor.ppo_n_minibatches=1",
    "actor.optimizer.lr=0.01", "actor.optimizer.lr_scheduler_type=constant",
    "rollout.max_head_offpolicyness=0", "rollout.dynamic_sampling=false",
]  # fmt: skip


@pytest.fixture(scope="module")
def ray_cluster(netns_ready, tmp_path_factory):
    """Three hosts, one CPU each: the launcher's three bundles (a server, two ranks) land one per host."""
    with Network(3) as net:
        cluster = RayCluster(net.hosts, tmp_path_factory.mktemp("ray"), cpus=1)
        try:
            yield cluster.start()
        finally:
            cluster.close()


def launch_example(cluster: RayCluster, tmp_path: Path, model: str, overrides: list[str], timeout: float = 360):
    """`python -m arealite.launcher.ray examples/gsm8k_grpo.py` run from the head's host."""
    cmd = [
        sys.executable, "-m", "arealite.launcher.ray", str(REPO / "examples" / "gsm8k_grpo.py"),
        "--config", str(REPO / "configs" / "tiny_cpu.yaml"), f"fileroot={tmp_path}", "experiment_name=mn",
        "trial_name=t", f"actor.path={model}", "launcher.setup_commands=[]", "launcher.n_servers=1",
        "launcher.n_trainers=2", f"launcher.ray_address={cluster.address}", "server.backend=builtin",
        "evaluator.freq_steps=0", "recover.mode=disabled", "stats_logger.plot=false",
        "stats_logger.progress_bar=false", *overrides,
    ]  # fmt: skip
    env = dict(cluster.env, PYTHONPATH=str(REPO))
    return cluster.hosts[0].run(cmd, timeout=timeout, env=env, cwd=REPO)


@pytest.mark.parametrize("weight_update", ["distributed", "disk"])
def test_example_learns_with_server_and_ranks_on_three_hosts(ray_cluster, tmp_path, tiny_model_dir, weight_update):
    proc = launch_example(ray_cluster, tmp_path, tiny_model_dir, [*LEARN, f"weight_update={weight_update}"])
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    run_dir = tmp_path / "mn" / "t"
    processes = [json.loads(line) for line in (run_dir / "processes.jsonl").read_text().splitlines()]
    host_of = {p["name"]: p["host"] for p in processes}
    assert {host_of["server-0"], host_of["trainer-0"], host_of["trainer-1"]} == {"node0", "node1", "node2"}
    server_ip = next(p["addr"] for p in processes if p["name"] == "server-0").split(":")[0]
    assert server_ip in {h.addr for h in ray_cluster.hosts}  # a host's own address, not loopback

    rows = [json.loads(line) for line in (run_dir / "stats.jsonl").read_text().splitlines()]
    rewards = [r["reward"] for r in rows if "reward" in r]
    assert len(rewards) == STEPS
    first, last = sum(rewards[:WINDOW]) / WINDOW, sum(rewards[-WINDOW:]) / WINDOW
    print(f"{weight_update}: mean batch reward first {WINDOW} steps {first:.3f}, last {WINDOW} {last:.3f}")
    assert last >= first + MARGIN, f"no learning across hosts: reward {first:.3f} -> {last:.3f} ({rewards})"
    assert not [p["pid"] for p in processes if pid_alive(p["pid"])], "a process of the run outlived it"
