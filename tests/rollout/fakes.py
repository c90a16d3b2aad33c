"""`FakeTransport`: records the rollout client's HTTP calls and replays scripted replies.

For tests of request shapes only (bodies, which servers are called, what a transport error
does to the rotation). Behaviour that depends on a server (generation, interruption, weight
loading) is tested against real built-in servers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from arealite.rollout.errors import TransientServerError


@dataclass
class Call:
    method: str
    address: str
    path: str
    body: dict[str, Any] | None
    timeout: float | None


Reply = tuple[int, Any] | Exception | Callable[["Call"], tuple[int, Any]]


class FakeTransport:
    """Same `request` signature as `arealite.rollout.transport.Transport`.

    `replies[(address, path)]` (or `replies[path]` for every server) is a `(status, body)`,
    an exception to raise, or a function of the call; unscripted calls answer `(200, {})`.
    """

    def __init__(self, replies: dict[Any, Reply] | None = None) -> None:
        self.replies: dict[Any, Reply] = dict(replies or {})
        self.calls: list[Call] = []
        self.abandoned: list[str] = []  # addresses `abandon` was called for (a fake has nothing in flight)

    def abandon(self, address: str, reason: str) -> None:
        self.abandoned.append(address)

    async def open(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def request(
        self,
        method: str,
        address: str,
        path: str,
        body: dict[str, Any] | None = None,
        timeout: float | None = None,
        rid: str = "",
        setting: str = "",
    ) -> tuple[int, Any]:
        call = Call(method, address, path, body, timeout)
        self.calls.append(call)
        reply = self.replies.get((address, path), self.replies.get(path, (200, {})))
        if isinstance(reply, Exception):
            if isinstance(reply, TransientServerError):
                raise TransientServerError(str(reply), address, rid)
            raise reply
        return reply(call) if callable(reply) else reply

    def to(self, path: str) -> list[Call]:
        return [c for c in self.calls if c.path == path]
