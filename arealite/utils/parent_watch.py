"""Children that end when the process that started them is gone, even after a SIGKILL.

`watch_parent(pid, on_orphaned)` starts a daemon thread that polls `os.getppid()` and calls
`on_orphaned()` once the process is reparented (its parent died). Polling rather than
PR_SET_PDEATHSIG: that signal fires when the parent *thread* that forked the child exits,
and servers and reward pools are started from threads that may end long before the process.

`PARENT_PID_ENV` carries the parent's pid into a child started with `subprocess`: the
built-in server reads it at start (`arealite.server.cli`).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

PARENT_PID_ENV = "AREALITE_PARENT_PID"
POLL_INTERVAL = 0.5  # seconds between checks that the parent is alive


def _watch(parent: int, on_orphaned: Callable[[], None]) -> None:
    while os.getppid() == parent:
        time.sleep(POLL_INTERVAL)
    on_orphaned()


def watch_parent(parent: int, on_orphaned: Callable[[], None]) -> threading.Thread:
    """Call `on_orphaned()` in a daemon thread once `parent` is no longer this process's parent.

    If `parent` is already not the parent (it died before the watch started), it is called at
    the first check."""
    thread = threading.Thread(target=_watch, args=(parent, on_orphaned), name="parent-watch", daemon=True)
    thread.start()
    return thread


def parent_from_env(env: dict[str, str] | None = None) -> int | None:
    """The pid in `PARENT_PID_ENV` (None when unset); a malformed value is a ValueError naming it."""
    value = (os.environ if env is None else env).get(PARENT_PID_ENV)
    if not value:
        return None
    try:
        pid = int(value)
    except ValueError:
        raise ValueError(f"{PARENT_PID_ENV}={value!r} is not a process id; unset it or set the parent's pid") from None
    if pid <= 1:
        raise ValueError(f"{PARENT_PID_ENV}={value!r} is not a parent to watch; unset it or set the parent's pid")
    return pid
