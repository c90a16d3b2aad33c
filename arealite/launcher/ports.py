"""Free TCP ports on a host, checked by binding before use."""

from __future__ import annotations

import socket
import time


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
    """`n` distinct ports that are free on `host` now, chosen by the kernel."""
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
