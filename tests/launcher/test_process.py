"""Child processes: whole-tree stop, and no orphans when the launcher itself is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from arealite.launcher.process import ManagedProcess, describe_exit, exit_status
from tests.launcher.conftest import pid_alive


def _wait_gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not pid_alive(pid)


def test_stop_reaches_grandchildren(tmp_path):
    # The child starts a grandchild and ignores SIGTERM: stop() must SIGKILL the whole group.
    script = "import subprocess, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    script += "p = subprocess.Popen(['sleep', '60']); print(p.pid, flush=True); time.sleep(60)"
    proc = ManagedProcess("child", [sys.executable, "-c", script], str(tmp_path / "child.log"))
    proc.start()
    deadline = time.monotonic() + 30
    while not (tmp_path / "child.log").read_text().strip().splitlines()[1:] and time.monotonic() < deadline:
        time.sleep(0.1)
    grandchild = int((tmp_path / "child.log").read_text().strip().splitlines()[-1])
    proc.stop(grace=1.0)
    assert _wait_gone(proc.pid) and _wait_gone(grandchild)


def test_children_die_with_a_killed_launcher(tmp_path):
    code = (
        "import sys, time\n"
        "from arealite.launcher.process import ManagedProcess\n"
        f"p = ManagedProcess('sleeper', ['sleep', '60'], {str(tmp_path / 's.log')!r})\n"
        "p.start(); print(p.pid, flush=True); time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    assert pid_alive(child)
    os.kill(parent.pid, signal.SIGKILL)  # no cleanup runs: only PR_SET_PDEATHSIG can stop the child
    parent.wait()
    assert _wait_gone(child)


def test_exit_status_and_description():
    assert exit_status(3) == 3 and exit_status(-9) == 137
    assert describe_exit(-9) == "was killed by SIGKILL" and describe_exit(2) == "exited with code 2"


def test_a_signal_a_library_turned_into_its_own_error_still_exits_128_plus_n(capsys):
    """SIGTERM while Ray's `ray.get` deserializes a reply: Ray catches the launcher's Interrupted
    and raises its own RaySystemError. The launcher still exits 143 and says why; an error with
    no signal behind it still propagates."""
    import pytest

    from arealite.launcher.launch_args import exit_code
    from arealite.launcher.signals import Interrupted

    def wrapped_by_a_library() -> int:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(10)  # the handler raises Interrupted here
        except Interrupted as e:
            raise RuntimeError(f"System error: {e}") from None
        return 0

    assert exit_code(wrapped_by_a_library, "run failed", "{} received; stopping") == 128 + signal.SIGTERM
    assert "SIGTERM (as RuntimeError) received; stopping" in capsys.readouterr().err
    with pytest.raises(ValueError, match="no signal"):  # a later block starts clean
        exit_code(lambda: (_ for _ in ()).throw(ValueError("no signal")), "run failed", "{} received")
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler is put back
