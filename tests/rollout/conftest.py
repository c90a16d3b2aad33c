"""Built-in inference servers for rollout tests: real processes on free loopback ports."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class BuiltinServer:
    """`python -m arealite.server` on 127.0.0.1, one torch thread, logs under `log_dir`."""

    def __init__(self, model_path: str, log_dir: Path, port: int | None = None) -> None:
        self.model_path = model_path
        self.port = port or free_port()
        self.address = f"127.0.0.1:{self.port}"
        self._log = open(log_dir / f"server-{self.port}.log", "ab")
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=str(REPO_ROOT))
        cmd = [sys.executable, "-m", "arealite.server", "--model-path", model_path, "--port", str(self.port),
               "--torch-threads", "1", "--log-level", "warning"]
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT)

    def wait_healthy(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server {self.address} exited with {self.proc.returncode}; see {self._log.name}")
            try:
                with urllib.request.urlopen(f"http://{self.address}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.3)
        raise TimeoutError(f"server {self.address} not healthy after {timeout}s")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)
        self._log.close()


def start_servers(model_path: str, log_dir: Path, n: int) -> list[BuiltinServer]:
    servers = [BuiltinServer(model_path, log_dir) for _ in range(n)]
    try:
        for s in servers:
            s.wait_healthy()
    except BaseException:
        for s in servers:
            s.stop()
        raise
    return servers


@pytest.fixture(scope="session")
def two_servers(tiny_model_dir, tmp_path_factory):
    """Shared by the rollout tests; each test module resets the servers' weight version."""
    servers = start_servers(tiny_model_dir, tmp_path_factory.mktemp("server-logs"), 2)
    yield servers
    for s in servers:
        s.stop()
