"""Ctrl-C and SIGTERM for launchers: turn them into an exception, and shield the cleanup.

Children run in their own sessions, so a terminal's Ctrl-C reaches only the launcher; it
raises `Interrupted` in the main thread, and the launcher's `finally` stops every child with
further signals ignored, so a second Ctrl-C cannot leave orphans behind.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(Exception):
    """SIGINT or SIGTERM reached the launcher."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


_received: list[int] = []  # the signals `_raise_interrupted` turned into Interrupted, in this block


def _raise_interrupted(signum: int, frame: object) -> None:
    _received.append(signum)
    raise Interrupted(signum)


def received() -> int | None:
    """The last signal raised as `Interrupted` inside the current `raising_on_signals` block.
    A library can catch Interrupted where it lands and raise its own error instead (Ray does,
    when the signal arrives while `ray.get` deserializes a reply); the launcher reads this."""
    return _received[-1] if _received else None


@contextlib.contextmanager
def _handlers(handler) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield  # signals reach only the main thread; whoever owns it handles them
        return
    previous = {s: signal.signal(s, handler) for s in _SIGNALS}
    try:
        yield
    finally:
        for s, old in previous.items():
            signal.signal(s, old)


def raising_on_signals() -> contextlib.AbstractContextManager[None]:
    """Within the block, SIGINT/SIGTERM raise `Interrupted`."""
    _received.clear()
    return _handlers(_raise_interrupted)


def reclaim_signals() -> None:
    """Inside `raising_on_signals`: take SIGINT/SIGTERM back from a library that replaced our
    handlers (ray.init installs one that aborts the process, skipping all cleanup)."""
    if threading.current_thread() is threading.main_thread():
        for s in _SIGNALS:
            signal.signal(s, _raise_interrupted)


def signals_ignored() -> contextlib.AbstractContextManager[None]:
    """Within the block (cleanup), SIGINT/SIGTERM are ignored."""
    return _handlers(signal.SIG_IGN)
