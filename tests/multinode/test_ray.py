"""The Ray launcher across hosts: a head in one namespaced host, a worker node in each other;
the example run learns with its server and its two trainer ranks on three different hosts
(FSDP2 over gloo across hosts), for `weight_update=distributed` and `disk`."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from arealite.config import LauncherConfig
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


def example_command(cluster: RayCluster, tmp_path: Path, model: str, overrides: list[str]) -> list[str]:
    """`python -m arealite.launcher.ray examples/gsm8k_grpo.py`, to run on the head's host."""
    return [
        sys.executable, "-m", "arealite.launcher.ray", str(REPO / "examples" / "gsm8k_grpo.py"),
        "--config", str(REPO / "configs" / "tiny_cpu.yaml"), f"fileroot={tmp_path}", "experiment_name=mn",
        "trial_name=t", f"actor.path={model}", "launcher.setup_commands=[]", "launcher.n_servers=1",
        "launcher.n_trainers=2", f"launcher.ray_address={cluster.address}", "server.backend=builtin",
        "evaluator.freq_steps=0", "stats_logger.plot=false",
        "stats_logger.progress_bar=false", *overrides,
    ]  # fmt: skip


def launch_example(cluster: RayCluster, tmp_path: Path, model: str, overrides: list[str], timeout: float = 360):
    env = dict(cluster.env, PYTHONPATH=str(REPO))
    cmd = example_command(cluster, tmp_path, model, overrides)
    return cluster.hosts[0].run(cmd, timeout=timeout, env=env, cwd=REPO)


# disk: heavy, for the suite's time; tests/e2e/test_gsm8k_grpo.py runs it with two ranks and two servers
@pytest.mark.parametrize("weight_update", ["distributed", pytest.param("disk", marks=pytest.mark.heavy)])
def test_example_learns_with_server_and_ranks_on_three_hosts(ray_cluster, tmp_path, tiny_model_dir, weight_update):
    overrides = [*LEARN, f"weight_update={weight_update}", "recover.mode=disabled"]
    proc = launch_example(ray_cluster, tmp_path, tiny_model_dir, overrides)
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


def _rows(run_dir: Path) -> list[dict]:
    path = run_dir / "stats.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_lost_trainer_host_fails_naming_it_and_relaunch_resumes(ray_cluster, tmp_path, tiny_model_dir):
    """Runs last in this module: it powers a host off, then brings it back as a new Ray node."""
    dist_timeout, steps = 120, 5  # the launcher notices a lost node sooner (Ray heartbeats, a poll timeout)
    # launcher.ray_call_timeout, a quarter of its default: the poll's timeout is what fires, and the
    # stop of the lost rank's actor in the teardown waits at most as long again
    call_timeout = 15
    overrides = [*LEARN, f"total_train_steps={steps}", "recover.mode=auto", "recover.freq_steps=1"]
    overrides += [f"dist_timeout={dist_timeout}", f"launcher.ray_call_timeout={call_timeout}"]
    cmd = example_command(ray_cluster, tmp_path, tiny_model_dir, overrides)
    env = dict(ray_cluster.env, PYTHONPATH=str(REPO))
    run_dir = tmp_path / "mn" / "t"
    log = tmp_path / "first.log"
    first = ray_cluster.hosts[0].popen(cmd, log, env=env, cwd=REPO)
    deadline = time.monotonic() + 300
    while len(_rows(run_dir)) < 3:
        assert first.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.2)
    processes = [json.loads(line) for line in (run_dir / "processes.jsonl").read_text().splitlines()]
    head = ray_cluster.hosts[0].hostname  # runs the launcher: the lost host must be another
    ranks = {int(p["name"].split("-")[1]): p["host"] for p in processes if p["name"].startswith("trainer-")}
    rank = next(r for r, host in sorted(ranks.items()) if host != head)
    lost = next(h for h in ray_cluster.hosts if h.hostname == ranks[rank])
    lost.power_off()
    lost_at = time.monotonic()
    code = first.wait(timeout=dist_timeout + 120)
    failed_after = time.monotonic() - lost_at
    out = log.read_text()
    print(f"run failed {failed_after:.1f}s after trainer rank {rank}'s host was lost (dist_timeout {dist_timeout}s)")
    assert code != 0, out[-3000:]
    assert f"lost trainer rank {rank} on node {lost.addr}" in out, out[-3000:]
    assert failed_after <= dist_timeout, f"the run took {failed_after:.0f}s to fail (dist_timeout {dist_timeout}s)"
    # the setting reached the launcher's poll: with the default, the poll alone waits this long
    default = LauncherConfig().ray_call_timeout
    assert failed_after < default, f"the run took {failed_after:.0f}s to fail (call timeout {call_timeout}s)"

    lost.restore()
    ray_cluster.rejoin(lost)  # the host is back (or replaced): the relaunch needs three nodes again
    again = ray_cluster.hosts[0].run(cmd, timeout=360, env=env, cwd=REPO)
    assert again.returncode == 0, (again.stdout + again.stderr)[-4000:]
    rows = _rows(run_dir)
    assert [r["step"] for r in rows] == list(range(steps)), [r["step"] for r in rows]
    trained = [p for r in rows for p in r["prompt_ids"]]
    assert len(trained) == len(set(trained)) == steps * 8, "a prompt was lost or trained twice"
