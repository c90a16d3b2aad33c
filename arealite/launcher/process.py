"""A child process in its own process group, with its output in a log file.

Every child starts in a new session so that stopping it reaches its whole tree (torchrun
workers, a server's helper processes) with one `killpg`, and so that a terminal's Ctrl-C
reaches only the launcher, which then stops the children in order. On Linux each child also
gets SIGTERM if the launcher dies without cleaning up (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time

_PR_SET_PDEATHSIG = 1
try:  # loaded now: the child must not dlopen between fork and exec (other threads may hold locks)
    _LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
except OSError:
    _LIBC = None


def _die_with_parent() -> None:  # runs in the child between fork and exec
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))


class LaunchError(RuntimeError):
    """A process of the run failed; the message names it and says why."""


def tail(path: str, n_lines: int = 30) -> str:
    """The last `n_lines` lines of a text file ('' if it does not exist)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            data = f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-n_lines:])


def with_package_path(env: dict[str, str] | None) -> dict[str, str]:
    """`env` (default: ours) with this arealite first on PYTHONPATH, so that children run
    `-m arealite.server` from the same checkout as the launcher, whatever their cwd."""
    env = dict(os.environ if env is None else env)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in parts if p != root])
    return env


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ManagedProcess:
    """One named child process; output goes to `log_path` (appended across restarts)."""

    def __init__(
        self, name: str, cmd: list[str], log_path: str, env: dict[str, str] | None = None, cwd: str | None = None
    ) -> None:
        self.name = name
        self.cmd = list(cmd)
        self.log_path = log_path
        self.env = env
        self.cwd = cwd
        self.proc: subprocess.Popen | None = None
        self._tee: threading.Thread | None = None

    def start(self, echo: bool = False) -> None:
        """Start the process; with `echo`, its output also goes to this process's stdout."""
        os.makedirs(os.path.dirname(self.log_path) or ".", exist_ok=True)
        log = open(self.log_path, "ab")
        log.write(f"[launcher] starting {self.name}: {' '.join(self.cmd)}\n".encode())
        log.flush()
        self.proc = subprocess.Popen(
            self.cmd,
            stdout=subprocess.PIPE if echo else log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=with_package_path(self.env),
            cwd=self.cwd,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        if echo:
            self._tee = threading.Thread(target=_copy_lines, args=(self.proc.stdout, log), daemon=True)
            self._tee.start()
        else:
            log.close()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def poll(self) -> int | None:
        """The exit code if the process has exited, else None."""
        return self.proc.poll() if self.proc else None

    def terminate(self) -> None:
        """Send SIGTERM to the whole process group (no wait)."""
        if self.proc is not None and _group_alive(self.proc.pid):
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)  # session leader: pgid == pid
            except ProcessLookupError:
                pass

    def finish_stop(self, deadline: float) -> None:
        """Wait until the group is gone or `deadline` (monotonic) passes, then SIGKILL what is left."""
        if self.proc is None:
            return
        pgid = self.proc.pid
        while time.monotonic() < deadline:
            self.proc.poll()  # reap the leader, or it lingers as a zombie member of the group
            if not _group_alive(pgid):
                break
            time.sleep(0.1)
        if _group_alive(pgid):
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        if self._tee is not None:
            self._tee.join(timeout=5)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM the whole process group, then SIGKILL what is left after `grace` seconds."""
        stop_all([self], grace)


def stop_all(processes: list[ManagedProcess], grace: float = 10.0) -> None:
    """Stop several processes in parallel: SIGTERM to all, one shared grace period, SIGKILL."""
    for p in processes:
        p.terminate()
    deadline = time.monotonic() + grace
    for p in processes:
        p.finish_stop(deadline)


def _copy_lines(pipe, log) -> None:
    """Copy a child's output to its log file and to our stdout until the pipe closes."""
    with log:
        for line in iter(pipe.readline, b""):
            log.write(line)
            log.flush()
            try:
                binary = getattr(sys.stdout, "buffer", None)  # absent when a caller swapped stdout
                binary.write(line) if binary is not None else sys.stdout.write(line.decode("utf-8", "replace"))
                sys.stdout.flush()
            except (ValueError, OSError):
                pass  # our stdout is gone; keep the log complete
        pipe.close()


def run_setup_commands(commands: list[str], log_dir: str) -> None:
    """Run shell `commands` in order (output to `<log_dir>/setup.log`); LaunchError naming a failing one."""
    for i, command in enumerate(commands):
        proc = ManagedProcess(f"setup-{i}", ["bash", "-c", command], os.path.join(log_dir, "setup.log"))
        proc.start()
        assert proc.proc is not None
        code = proc.proc.wait()
        if code != 0:
            raise LaunchError(
                f"setup command {command!r} failed: it {describe_exit(code)}\n"
                f"--- last lines of {proc.log_path} ---\n{tail(proc.log_path)}"
            )


def exit_status(returncode: int) -> int:
    """A shell-style exit status: 128+N for a child killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def describe_exit(returncode: int) -> str:
    """'exited with code N' or 'was killed by SIGNAME'."""
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with code {returncode}"
