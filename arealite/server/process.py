"""Start the built-in server as a subprocess from Python (tests, notebooks, benchmarks).

    with launch_server_process(model_dir) as server:
        requests.post(f"http://{server.address}/generate", json=...)

The server binds a free loopback port, its output goes to a log file (`server.log_path`),
and `launch_server_process` returns once `/health` answers 200. Leaving the `with` block
stops the server, also on an error; a server never stopped is stopped when this Python
process exits (a notebook kernel shutting down or restarting), and stops itself within a
second when this process dies without stopping it (SIGKILL included). A log file it chose
itself (no `log_path`: a temporary file) is removed when `stop()` stops a running server,
and kept when the server had died on its own or failed to start (the error names it).
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence

from arealite.utils.net import free_ports, probe
from arealite.utils.parent_watch import PARENT_PID_ENV


class ServerStartError(RuntimeError):
    """The server process died or never became healthy; the message ends with its log tail."""


class ServerProcess:
    """A running `python -m arealite.server` subprocess."""

    def __init__(self, proc: subprocess.Popen, host: str, port: int, log_path: str, temporary_log: bool = False):
        self.proc = proc
        self.host = host
        self.port = port
        self.log_path = log_path
        self.temporary_log = temporary_log  # removed by stop() unless the server died on its own

    @property
    def address(self) -> str:
        """`host:port`, the form AREAL_LLM_SERVER_ADDRS and the rollout client use."""
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def request(
        self, method: str, path: str, body=None, headers: Mapping[str, str] | None = None, timeout: float = 60.0
    ):
        """Plain blocking HTTP call; returns (status, parsed JSON, or text when not JSON)."""
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        req = urllib.request.Request(
            f"{self.url}{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json", **(headers or {})},
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                status, raw = r.status, r.read()
        except urllib.error.HTTPError as e:
            status, raw = e.code, e.read()
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw.decode(errors="replace")

    def post(self, path: str, body=None, **kw):
        return self.request("POST", path, {} if body is None else body, **kw)

    def get(self, path: str, **kw):
        return self.request("GET", path, **kw)

    def log_tail(self, n_chars: int = 4000) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()[-n_chars:]
        except OSError:
            return "(no log)"

    def is_alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after `timeout` seconds; removes a temporary log unless the
        server had already died on its own."""
        _RUNNING.discard(self)
        died_on_its_own = self.proc.poll() not in (None, 0)
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.temporary_log and not died_on_its_own:
            try:
                os.unlink(self.log_path)
            except FileNotFoundError:
                pass
            self.temporary_log = False

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


# Servers not stopped yet. A notebook kernel that shuts down (or a script that ends) with a
# server still running stops it on the way out instead of leaving it behind.
_RUNNING: set[ServerProcess] = set()


@atexit.register
def _stop_running() -> None:
    for server in list(_RUNNING):
        server.stop(timeout=5.0)


def launch_server_process(
    model_path: str,
    port: int | None = None,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    timeout: float = 120,
    log_path: str | None = None,
    host: str = "127.0.0.1",
) -> ServerProcess:
    """Spawn the built-in server on `host:port` (a free port if None) and wait for /health.

    `env` entries are added to the current environment (OMP_NUM_THREADS defaults to 1).
    Raises ServerStartError with the log tail if the process exits or `timeout` passes.
    """
    port = port or free_ports(1, host)[0]
    temporary_log = log_path is None
    if temporary_log:
        fd, log_path = tempfile.mkstemp(prefix=f"arealite_server_{port}_", suffix=".log")
        os.close(fd)
    full_env = {
        **os.environ,
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        "TOKENIZERS_PARALLELISM": "false",
    }
    # Run the same checkout as the caller, whatever the cwd and whether or not it is installed.
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    full_env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)
    full_env[PARENT_PID_ENV] = str(os.getpid())  # the server stops once this process is gone, even SIGKILLed
    full_env.update(env or {})
    cmd = [
        sys.executable,
        "-m",
        "arealite.server",
        "--model-path",
        model_path,
        "--host",
        host,
        "--port",
        str(port),
        *extra_args,
    ]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=full_env)
    server = ServerProcess(proc, host, port, log_path, temporary_log)
    _RUNNING.add(server)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if not server.is_alive():
                raise ServerStartError(
                    f"server exited with code {proc.returncode}; log {log_path}:\n{server.log_tail()}"
                )
            if probe(server.address, timeout=2.0):
                return server
            time.sleep(0.2)
        raise ServerStartError(f"server not healthy after {timeout} s; log {log_path}:\n{server.log_tail()}")
    except BaseException:  # also Ctrl-C / a notebook's interrupt while waiting
        server.temporary_log = False  # the error names the log
        server.stop()
        raise
