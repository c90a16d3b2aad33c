"""Process-group setup: a plain process becomes a world of one; a half-configured torchrun
environment fails naming what is missing."""

from __future__ import annotations

import subprocess

from arealite import distributed as dist_utils
from tests.train.helpers import PYTHON, subprocess_env


def test_single_process_world():
    assert dist_utils.init_distributed() == (0, 1)
    assert dist_utils.init_distributed() == (0, 1)  # idempotent
    assert dist_utils.is_main() and dist_utils.device().type in ("cpu", "cuda")


def test_world_size_without_rendezvous_is_a_clear_error():
    env = subprocess_env(WORLD_SIZE="2")
    for var in ("RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    code = "from arealite.distributed import init_distributed; init_distributed()"
    proc = subprocess.run([PYTHON, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "WORLD_SIZE=2" in proc.stderr and "MASTER_ADDR" in proc.stderr and "torchrun" in proc.stderr
