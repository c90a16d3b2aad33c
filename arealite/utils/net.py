"""Addresses, free ports and the blocking health probe (stdlib only, so launchers stay light).

`GET /health` is the readiness probe: SGLang answers 200 only after its warmup generate
(docs/protocol.md §4, §5). A server without `/health` (404) is probed on `/v1/models`.
The rollout client has its own asynchronous probe, through its transport (rollout/health.py).

    python -m arealite.utils.net free-port [--host H]   # prints a free port (sbatch scripts use it)
"""

from __future__ import annotations

import argparse
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable

# The environment variable a launcher sets for the training script: `host:port,host:port`.
SERVER_ADDRS_ENV = "AREAL_LLM_SERVER_ADDRS"
# The same for the judge servers (arealite.reward.judge), which no weight sync reaches.
JUDGE_ADDRS_ENV = "AREAL_JUDGE_SERVER_ADDRS"
# The same for the distillation teacher's servers (arealite.rollout.teacher), never weight-synced either.
TEACHER_ADDRS_ENV = "AREAL_TEACHER_SERVER_ADDRS"


def host_address() -> str:
    """This host's address as other hosts reach it: what its hostname resolves to
    (docs/multinode.md §1), or 127.0.0.1 where the hostname does not resolve."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def port_is_free(host: str, port: int) -> bool:
    """True if nothing listens on (or holds) `host:port`, tested by binding to it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # SO_REUSEADDR: a port in TIME_WAIT after a server exits is free for a new listener.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_ports(n: int, host: str = "127.0.0.1", exclude: set[int] | None = None) -> list[int]:
    """`n` distinct ports that are free on `host` now, chosen by the kernel (`free_ports(1)[0]` for one)."""
    chosen: list[int] = []
    taken = set(exclude or ())
    while len(chosen) < n:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = sock.getsockname()[1]
        if port not in taken and port_is_free(host, port):
            chosen.append(port)
            taken.add(port)
    return chosen


def wait_port_free(host: str, port: int, timeout: float) -> bool:
    """Wait up to `timeout` seconds for `host:port` to become free (a dead server's socket)."""
    deadline = time.monotonic() + timeout
    while not port_is_free(host, port):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def probe(addr: str, timeout: float = 5.0) -> bool:
    """True if the server at `host:port` answers healthy now."""
    for route in ("/health", "/v1/models"):
        try:
            with urllib.request.urlopen(f"http://{addr}{route}", timeout=timeout) as resp:
                return resp.status == 200
        except urllib.error.HTTPError as e:
            if e.code != 404:
                return False  # 503 while starting: not ready yet
        except (urllib.error.URLError, OSError):
            return False
    return False


def wait_healthy(addr: str, timeout: float, alive: Callable[[], bool] = lambda: True, interval: float = 0.5) -> bool:
    """Poll `addr` until healthy (True), `timeout` seconds pass or `alive()` turns False (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive():
            return False
        if probe(addr, timeout=min(5.0, max(0.5, deadline - time.monotonic()))):
            return True
        time.sleep(interval)
    return False


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m arealite.utils.net")
    sub = parser.add_subparsers(dest="command", required=True)
    port = sub.add_parser("free-port", help="print a port free on HOST now")
    port.add_argument("--host", default="0.0.0.0", help="interface to check (default: all, as torchrun's master binds)")
    args = parser.parse_args(argv)
    if args.command == "free-port":
        print(free_ports(1, args.host)[0])


if __name__ == "__main__":
    main()
