"""The server helper releases its process: on leaving a `with` block (errors included), and,
for a server never stopped, when the Python process that started it exits (a notebook kernel
shutting down)."""

import os
import subprocess
import sys
import textwrap
import time

import pytest

from arealite.launcher.process import with_package_path
from arealite.server.process import launch_server_process

pytestmark = pytest.mark.timeout(180)
ARGS = ["--torch-threads", "1", "--skip-server-warmup", "--log-level", "warning"]


def _gone(pid: int, within: float = 15.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


def test_with_block_stops_the_server_on_error(tiny_model_dir):
    with (
        pytest.raises(RuntimeError, match="a failing cell"),
        launch_server_process(tiny_model_dir, extra_args=ARGS) as server,
    ):
        assert server.is_alive()
        raise RuntimeError("a failing cell")
    assert not server.is_alive()


def test_server_left_running_is_stopped_at_exit(tiny_model_dir):
    script = textwrap.dedent(
        """
        import sys
        from arealite.server.process import launch_server_process
        server = launch_server_process(sys.argv[1], extra_args=sys.argv[2:])
        print("PID", server.proc.pid, flush=True)
        """
    )  # exits without stopping the server
    env = with_package_path(None)
    proc = subprocess.run(
        [sys.executable, "-c", script, tiny_model_dir, *ARGS], env=env, capture_output=True, text=True, timeout=150
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    pid = int(proc.stdout.split("PID", 1)[1].split()[0])
    assert _gone(pid), f"server {pid} outlived the process that started it"
