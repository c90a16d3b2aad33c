"""Server supervision shared by the launchers: restart a dead server on the same address.

A server that exits is restarted on its own host and port up to `max_restarts` times (the
rollout client takes it out of rotation meanwhile and probes it back in). When the budget is
used up, or a (re)start does not become healthy in time, `check()` raises `LaunchError`
naming the process, its exit status and the tail of its log; the launcher then stops the run.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Callable

from arealite.config import GRPOConfig, save_config
from arealite.launcher.process import LaunchError, ManagedProcess, describe_exit, tail
from arealite.utils import net


def log(msg: str) -> None:
    print(f"[launcher] {msg}", file=sys.stderr, flush=True)


def prepare_run_dir(run_dir: str, config: GRPOConfig, subdirs: tuple[str, ...] = ("logs",)) -> None:
    """Create `run_dir` and its `subdirs`, start this launch's empty process record, and save
    the resolved config as `<run_dir>/config.yaml`."""
    for d in subdirs:
        os.makedirs(os.path.join(run_dir, d), exist_ok=True)
    open(os.path.join(run_dir, "processes.jsonl"), "w").close()  # this launch's processes only
    save_config(config, os.path.join(run_dir, "config.yaml"))


def record_process(run_dir: str, name: str, pid: int, addr: str = "") -> None:
    """Append one started process to `<run_dir>/processes.jsonl` (for operators and tests)."""
    os.makedirs(run_dir, exist_ok=True)
    entry = {"name": name, "pid": pid, "host": socket.gethostname(), "addr": addr, "time": time.time()}
    with open(os.path.join(run_dir, "processes.jsonl"), "a") as f:
        f.write(json.dumps(entry) + "\n")


class SupervisedServer:
    """One inference server process on a fixed `host:port`, restarted when it dies."""

    def __init__(
        self,
        name: str,
        cmd: list[str],
        host: str,
        port: int,
        log_path: str,
        max_restarts: int,
        start_timeout: float,
        env: dict[str, str] | None = None,
        on_start: Callable[[str, int, str], None] | None = None,
    ) -> None:
        self.name = name
        self.host = host
        self.port = port
        self.max_restarts = max_restarts
        self.start_timeout = start_timeout
        self.restarts = 0
        self.healthy = False
        self.ever_healthy = False
        self._deadline = 0.0
        self._on_start = on_start
        self._proc = ManagedProcess(name, cmd, log_path, env)

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    @property
    def log_path(self) -> str:
        return self._proc.log_path

    @property
    def process(self) -> ManagedProcess:
        return self._proc

    def start(self) -> None:
        """Start the process (non-blocking); it counts as starting until `/health` answers."""
        if not net.wait_port_free(self.host, self.port, timeout=10.0):
            raise LaunchError(f"{self.name}: port {self.addr} is in use by another process; cannot start here")
        self._proc.start()
        self.healthy = False
        self._deadline = time.monotonic() + self.start_timeout
        if self._on_start is not None:
            self._on_start(self.name, self._proc.pid, self.addr)

    def wait_healthy(self) -> None:
        """Block until healthy; LaunchError (with the log tail) if it dies or times out."""
        while not self.healthy:
            self.check()
            if not self.healthy:
                time.sleep(0.3)

    def check(self) -> None:
        """One supervision step: restart a dead server, or raise when that is no longer allowed."""
        code = self._proc.poll()
        if code is not None:
            what = f"{self.name} (pid {self._proc.pid}, {self.addr}) {describe_exit(code)}"
            if not self.ever_healthy:  # a broken command or model: restarting would fail the same way
                raise LaunchError(self._failure(f"{self.name} failed to start: {what}"))
            if self.restarts >= self.max_restarts:
                raise LaunchError(self._failure(what + f"; restarts used: {self.restarts} of {self.max_restarts}"))
            self.restarts += 1
            log(f"{what}; restarting on the same address ({self.restarts} of {self.max_restarts})")
            self.start()
            return
        if self.healthy:
            return
        if net.probe(self.addr, timeout=2.0):
            self.healthy = self.ever_healthy = True
            log(f"{self.name} is healthy at {self.addr} (pid {self._proc.pid})")
        elif time.monotonic() > self._deadline:
            raise LaunchError(
                self._failure(
                    f"{self.name} (pid {self._proc.pid}) did not answer GET http://{self.addr}/health within "
                    f"{self.start_timeout:.0f}s (raise launcher.server_start_timeout if it is only slow)"
                )
            )

    def _failure(self, what: str) -> str:
        return f"{what}\n--- last lines of {self.log_path} ---\n{tail(self.log_path)}"

    def stop(self) -> None:
        self._proc.stop()
