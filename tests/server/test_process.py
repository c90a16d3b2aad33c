"""The server helper releases its process: on leaving a `with` block (errors included), and,
for a server never stopped, when the Python process that started it exits (a notebook kernel
shutting down) or is SIGKILLed (the server's own parent watch). A temporary log it chose goes
with a server it stops; a log the caller named, or one of a server that died, stays."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from arealite.launcher.process import with_package_path
from arealite.server.process import launch_server_process
from arealite.utils.parent_watch import parent_from_env

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
        assert os.path.isfile(server.log_path)
        raise RuntimeError("a failing cell")
    assert not server.is_alive()
    assert not os.path.exists(server.log_path), "the temporary log outlived the server it was made for"


def test_a_named_log_and_the_log_of_a_dead_server_are_kept(tiny_model_dir, tmp_path):
    named = tmp_path / "server.log"
    with launch_server_process(tiny_model_dir, extra_args=ARGS, log_path=str(named)) as server:
        assert server.is_alive()
    assert named.is_file() and named.stat().st_size > 0
    server = launch_server_process(tiny_model_dir, extra_args=ARGS)
    os.kill(server.proc.pid, signal.SIGKILL)
    server.proc.wait(timeout=30)
    server.stop()
    assert os.path.isfile(server.log_path), "the log of a server that died on its own is what explains it"
    os.unlink(server.log_path)


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


def test_server_stops_itself_when_its_starter_is_sigkilled(tiny_model_dir):
    """No atexit runs after a SIGKILL: the server's own parent watch (AREALITE_PARENT_PID, set by
    launch_server_process) must end it. Interrupted test runs once left such servers behind."""
    script = textwrap.dedent(
        """
        import os, signal, sys
        from arealite.server.process import launch_server_process
        server = launch_server_process(sys.argv[1], extra_args=sys.argv[2:])
        print("PID", server.proc.pid, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, tiny_model_dir, *ARGS],
        env=with_package_path(None),
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    pid = int(proc.stdout.split("PID", 1)[1].split()[0])
    try:
        assert _gone(pid), f"server {pid} outlived the SIGKILLed process that started it"
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.parametrize("value", ["abc", "1", "0", "-5"])
def test_a_malformed_parent_pid_is_named(value):
    with pytest.raises(ValueError, match=f"AREALITE_PARENT_PID={value!r}"):
        parent_from_env({"AREALITE_PARENT_PID": value})


def test_parent_watch_fires_once_the_parent_is_gone():
    """A child whose parent exits is reparented; the watch then calls its callback (here: exit),
    long before the child would end by itself (60 s)."""
    child = textwrap.dedent(
        """
        import os, time
        from arealite.utils.parent_watch import watch_parent
        watch_parent(os.getppid(), lambda: os._exit(0))
        print("WATCHING", flush=True)
        time.sleep(60)
        """
    )
    middle = textwrap.dedent(
        """
        import subprocess, sys
        child = subprocess.Popen([sys.executable, "-c", sys.argv[1]], stdout=subprocess.PIPE, text=True)
        assert child.stdout.readline().strip() == "WATCHING"
        print(child.pid, flush=True)
        """
    )  # exits at once, leaving the child behind
    out = subprocess.run(
        [sys.executable, "-c", middle, child], env=with_package_path(None), capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr[-3000:]
    pid = int(out.stdout.split()[0])
    try:
        assert _gone(pid, within=10.0), f"the watch did not end the orphaned child {pid}"
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
