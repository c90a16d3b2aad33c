"""Process-group setup: a plain process becomes a world of one; a half-configured torchrun
environment fails naming what is missing."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time

import psutil
import pytest

from arealite import world
from arealite.utils.net import free_ports
from tests.train.helpers import PYTHON, subprocess_env


def test_single_process_world():
    assert world.init_distributed() == (0, 1)
    assert world.init_distributed() == (0, 1)  # idempotent
    assert world.is_main() and world.device().type in ("cpu", "cuda")


def test_world_size_without_rendezvous_is_a_clear_error():
    env = subprocess_env(WORLD_SIZE="2")
    for var in ("RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    code = "from arealite.world import init_distributed; init_distributed()"
    proc = subprocess.run([PYTHON, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "WORLD_SIZE=2" in proc.stderr and "MASTER_ADDR" in proc.stderr and "torchrun" in proc.stderr


def test_more_local_ranks_than_gpus_is_refused_naming_both(monkeypatch):
    # Simulates one visible GPU; the check runs before any CUDA call.
    monkeypatch.setattr(world, "visible_gpu_count", lambda: 1)
    monkeypatch.delenv("AREALITE_TRAIN_DEVICE", raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    with pytest.raises(RuntimeError, match=r"2 trainer ranks on this node but only 1 visible GPU.*n_trainers=1"):
        world._init(None, 10.0)
    monkeypatch.setenv("AREALITE_TRAIN_DEVICE", "cpu")
    assert world.device_type() == "cpu" and world.default_backend() == "gloo"
    monkeypatch.setenv("AREALITE_TRAIN_DEVICE", "tpu")
    with pytest.raises(ValueError, match="AREALITE_TRAIN_DEVICE='tpu'"):
        world.device_type()


STALLING_RANKS = """
import os, signal, sys, time
from pathlib import Path
import torch
from arealite import world
ready = Path(sys.argv[3])  # every rank has imported torch before any starts the rendezvous, whose
(ready / os.environ["RANK"]).touch()  # store waits are held to dist_timeout too, on a busy machine as well
while len(list(ready.iterdir())) < int(os.environ["WORLD_SIZE"]):
    time.sleep(0.05)
world.init_distributed(backend="gloo", timeout=float(sys.argv[1]))
t = torch.ones(4)
for step in range(6):
    if world.rank() == int(sys.argv[2]) and step == 3:
        print(f"rank stops at {time.time():.3f}", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)  # hangs as a wedged rank or a silent host does
    world.all_reduce(t)
"""


def test_a_stalled_rank_is_named_within_dist_timeout_and_the_window(tmp_path):
    """Three ranks under torchrun; rank 1 stops in the middle of the job. The others' next
    all-reduce times out after dist_timeout; each then names rank 1 and its host, by
    dist_timeout + LOST_RANK_WINDOW + a margin for the check-in, never the healthy ranks."""
    script = tmp_path / "stall.py"
    script.write_text(STALLING_RANKS)
    dist_timeout, lost = 3.0, 1
    cmd = [PYTHON, "-m", "torch.distributed.run", "--nproc-per-node", "3", f"--master-port={free_ports(1)[0]}",
           str(script), str(dist_timeout), str(lost), str(tmp_path / "ready")]  # fmt: skip
    (tmp_path / "ready").mkdir()
    env = subprocess_env(AREALITE_TRAIN_DEVICE="cpu")  # gloo ranks, however many GPUs are visible
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # fmt: skip
    lines, stopped_at, named_at = [], None, []
    try:
        deadline = time.monotonic() + 180
        while len(named_at) < 2 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if found := re.search(r"rank stops at ([\d.]+)", line):
                stopped_at = float(found.group(1))
            if "[arealite] lost trainer rank" in line:
                named_at.append(time.time())
    finally:
        # torchrun puts its ranks in sessions of their own, and the stopped rank would keep it
        # waiting 30 s more: kill the whole tree, each rank by pid.
        tree = [proc.pid] + [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
        for pid in tree:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(timeout=30)
        _, alive = psutil.wait_procs([p for p in map(_process, tree) if p is not None], timeout=30)
        assert not alive, f"ranks left behind: {alive}"
    out = "".join(lines)
    named = re.findall(r"lost trainer rank (\d+) \(host ([^)]*)\)", out)
    assert stopped_at is not None and len(named) == 2, out[-4000:]  # ranks 0 and 2 each name it
    assert set(named) == {(str(lost), socket.gethostname())}, out[-4000:]
    took = max(named_at) - stopped_at
    window = world.LOST_RANK_WINDOW
    print(f"rank {lost} named {took:.1f}s after it stopped (dist_timeout {dist_timeout}s, window {window}s)")
    assert took <= dist_timeout + world.LOST_RANK_WINDOW + 10, out[-4000:]


def _process(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None
