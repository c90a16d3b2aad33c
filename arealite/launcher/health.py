"""Server health probes over HTTP (stdlib only, so launchers stay light).

`GET /health` is the readiness probe: SGLang answers 200 only after its warmup generate
(docs/protocol.md §4, §5). A server without `/health` (404) is probed on `/v1/models`.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Callable


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
