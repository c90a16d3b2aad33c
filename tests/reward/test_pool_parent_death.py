"""Reward workers die with their parent: a trainer SIGKILLed from outside (no launcher to clean
up after it) leaves no pool worker and no multiprocessing resource tracker behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from arealite.launcher.process import with_package_path
from tests.launcher.conftest import pid_alive

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(120)

# A stand-in trainer: scores through a RewardPool from a rollout thread, as the workflows do,
# then reports the pool's processes and waits to be killed.
TRAINER = """
import json, threading, time
from multiprocessing import resource_tracker
from arealite.reward.pool import RewardPool
from arealite.reward.math import gsm8k_reward_fn

pool = RewardPool(max_workers=2, timeout=60)
def rollout():
    assert pool.score(gsm8k_reward_fn, "p", "#### 7", [1], [2], answer="7") == 1.0
thread = threading.Thread(target=rollout)
thread.start(); thread.join()  # the thread that started the workers is gone, as rollout threads may be
workers = [p.pid for p in pool._pool._processes.values()]
print(json.dumps({"workers": workers, "tracker": resource_tracker._resource_tracker._pid}), flush=True)
time.sleep(600)
"""


def test_sigkilled_trainer_leaves_no_reward_worker_or_resource_tracker():
    env = dict(with_package_path(None), OMP_NUM_THREADS="1")
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER], stdout=subprocess.PIPE, text=True, env=env, cwd=REPO)
    try:
        line = trainer.stdout.readline()
        assert line, f"the stand-in trainer exited ({trainer.wait()}) before reporting its pool"
        pool = json.loads(line)
        pids = [*pool["workers"], pool["tracker"]]
        assert len(pool["workers"]) == 2 and pool["tracker"] is not None
        time.sleep(1.0)  # the workers outlive the thread that started them
        assert all(pid_alive(p) for p in pids), "a reward worker died with the thread that started it"
        trainer.send_signal(signal.SIGKILL)
        trainer.wait(timeout=10)
        deadline = time.monotonic() + 15
        while alive := [p for p in pids if pid_alive(p)]:
            if time.monotonic() > deadline:
                for pid in alive:
                    os.kill(pid, signal.SIGKILL)
                pytest.fail(f"processes {alive} of the killed trainer's reward pool are still running")
            time.sleep(0.1)
    finally:
        trainer.kill()
        trainer.wait()
