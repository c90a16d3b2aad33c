"""examples/gsm8k_grpo.py for 2 steps through the Ray and Slurm launchers (issue 7 acceptance).

Same outcomes as a local-launcher run: exit code 0, one stats record per step, the run's logs
and config in its run directory, and no process of the run left afterwards.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from arealite.config import GRPOConfig, load_config
from arealite.launcher.process import with_package_path
from tests.launcher.conftest import pid_alive

pytestmark = pytest.mark.timeout(420)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(REPO_ROOT, "examples", "gsm8k_grpo.py")
CONFIG = os.path.join(REPO_ROOT, "configs", "tiny_cpu.yaml")


def _require(kind: str) -> None:
    if kind == "ray":
        pytest.importorskip("ray", reason="the Ray launcher needs the 'ray' extra: pip install -e .[ray]")
    if kind == "slurm":
        if shutil.which("sbatch") is None and not os.environ.get("CI"):
            pytest.skip("Slurm is not installed (no sbatch); run .ci/slurm_setup.sh as root to install and start it")
        ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True)
        if "is UP" not in ping.stdout:
            pytest.fail(f"slurmctld is not answering ({ping.stdout.strip()}); run .ci/slurm_setup.sh as root")


# Both run in `-m heavy` only: tests/multinode/test_{ray,slurm}.py run the same example through
# the same launchers on a three-host Ray cluster and two Slurm nodes in the default command, and
# check more (learning, no process left behind, a lost host).
@pytest.mark.parametrize("kind", [pytest.param(k, marks=pytest.mark.heavy) for k in ("ray", "slurm")])
def test_example_runs_two_steps(kind, tmp_path, tiny_model_dir):
    _require(kind)
    overrides = [
        f"fileroot={tmp_path}", "trial_name=example", f"actor.path={tiny_model_dir}", "launcher.setup_commands=[]",
        "total_train_steps=2", "launcher.n_servers=2", "launcher.n_trainers=2", "evaluator.freq_steps=0",
    ]  # fmt: skip
    env = dict(with_package_path(None), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", f"arealite.launcher.{kind}", EXAMPLE, "--config", CONFIG, *overrides]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400, cwd=REPO_ROOT)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"

    config = load_config(["--config", CONFIG, *overrides], GRPOConfig)
    run_dir = config.run_dir
    steps = [json.loads(line)["step"] for line in open(os.path.join(run_dir, "stats.jsonl"))]
    assert steps == [0, 1]
    saved = load_config(["--config", os.path.join(run_dir, "config.yaml")], GRPOConfig)
    assert saved.total_train_steps == 2 and saved.launcher.n_trainers == 2
    logs = os.listdir(os.path.join(run_dir, "logs"))
    assert {"server-0.log", "server-1.log"} <= set(logs)
    assert any(name.startswith(("trainer", "slurm-trainer")) for name in logs)
    pids = [json.loads(line)["pid"] for line in open(os.path.join(run_dir, "processes.jsonl"))]
    assert len(pids) >= 4 and not [p for p in pids if pid_alive(p)]
