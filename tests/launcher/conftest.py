"""Helpers for launcher tests: run a launcher as a child process and inspect its run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from arealite.launcher.process import with_package_path

REPO_ROOT = Path(__file__).resolve().parents[2]
TRAINER = str(Path(__file__).with_name("trainer_script.py"))


def pid_alive(pid: int) -> bool:
    """True if `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


class LaunchedRun:
    """A launcher process started by a test, and the run directory it writes."""

    def __init__(self, proc: subprocess.Popen, run_dir: Path) -> None:
        self.proc = proc
        self.run_dir = run_dir

    def processes(self) -> list[dict]:
        path = self.run_dir / "processes.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def wait_for(self, predicate, timeout: float = 120.0, what: str = "condition") -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if self.proc.poll() is not None:
                out, err = self.proc.communicate()
                pytest.fail(f"launcher exited ({self.proc.returncode}) while waiting for {what}:\n{out}\n{err}")
            if time.monotonic() > deadline:
                pytest.fail(f"timed out waiting for {what}")
            time.sleep(0.3)

    def trainers_started(self, n: int):
        """A predicate for `wait_for`: at least `n` trainer ranks have written their pid files."""
        pid_dir = self.run_dir / "trainer-pids"
        return lambda: pid_dir.is_dir() and len(os.listdir(pid_dir)) >= n

    def kill_first_server(self) -> int:
        """SIGKILL server-0 of the run; returns its pid."""
        pid = next(p["pid"] for p in self.processes() if p["name"] == "server-0")
        os.kill(pid, signal.SIGKILL)
        return pid

    def all_pids(self) -> list[int]:
        pids = [p["pid"] for p in self.processes()]
        pid_dir = self.run_dir / "trainer-pids"
        if pid_dir.is_dir():
            pids += [int(p.name) for p in pid_dir.iterdir()]
        return pids

    def descendants(self) -> set[int]:
        """Pids of every process below the launcher now (servers, ranks, Ray's daemons)."""
        try:
            return {p.pid for p in psutil.Process(self.proc.pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            return set()

    def alive_pids(self, extra: set[int] = frozenset()) -> list[int]:
        """Every recorded process of the run (and of `extra`) that still exists; [] once it ended."""
        return [p for p in set(self.all_pids()) | set(extra) if pid_alive(p)]

    def finish(self, timeout: float = 120.0) -> tuple[int, str, str]:
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
            pytest.fail(f"launcher did not exit in {timeout}s:\n{out}\n{err}")
        return self.proc.returncode, out, err


@pytest.fixture
def launch(tmp_path):
    """Start `python -m arealite.launcher.<kind> [options] trainer_script.py key=value ...`."""
    started: list[LaunchedRun] = []

    def _launch(
        kind: str, overrides: list[str], mode: str = "ok", options: tuple[str, ...] = (), env: dict | None = None
    ) -> LaunchedRun:
        env = dict(with_package_path(None), OMP_NUM_THREADS="1", AREAL_TEST_TRAINER_MODE=mode, **(env or {}))
        # the built-in server also on a GPU machine (server.backend=auto would pick SGLang there)
        args = [f"fileroot={tmp_path}", "experiment_name=launch", "trial_name=t", "server.backend=builtin", *overrides]
        cmd = [sys.executable, "-m", f"arealite.launcher.{kind}", *options, TRAINER, *args]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        run = LaunchedRun(proc, tmp_path / "launch" / "t")
        started.append(run)
        return run

    yield _launch
    for run in started:  # a failed test must not leave its launcher behind
        if run.proc.poll() is None:
            run.proc.send_signal(signal.SIGTERM)
            try:
                run.proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                run.proc.kill()
