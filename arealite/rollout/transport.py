"""`Transport`: every HTTP call of the rollout client to a server, mapped onto typed errors.

Connection errors, timeouts and 5xx become TransientServerError (worth a retry, perhaps on
another server); other statuses are returned to the caller, who knows what they mean for
its endpoint. The transport owns the client's one connection pool (`http1.ConnectionPool`);
the parts of the client (generation, health, weight updates, the watchdog) receive the
transport and never the pool, so tests of HTTP shapes can hand them a fake
(tests/rollout/fakes.py).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from arealite.rollout.errors import TransientServerError
from arealite.rollout.http1 import ConnectionPool
from arealite.rollout.protocol import error_message

# Seconds an idle pooled connection is kept (aiohttp's client: 15). Between two rollout
# batches the client idles for a training step, often longer than that; with the default
# every request of the next batch then opens a new connection, which at 1,024 requests in
# flight nearly doubled the client's CPU per trajectory (0.28 -> 0.51 ms with a 20 s pause
# before each batch; scale.py (c)'s stubs and workflow). The server may still close them
# sooner: a connection it closed is seen as such when taken from the pool, and replaced.
KEEPALIVE_S = 600.0


class Transport:
    """The client's connection pool, opened and closed on the rollout event loop."""

    def __init__(self) -> None:
        self._pool: ConnectionPool | None = None

    async def open(self) -> None:
        self._pool = ConnectionPool(KEEPALIVE_S)

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    def abandon(self, address: str, reason: str) -> None:
        """Fail every request in flight to `address` now (TransientServerError naming `reason`)."""
        if self._pool is not None:
            self._pool.abandon(address, f"left the rotation: {reason}")

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
        """Send one request; return (status, parsed JSON or text). Raises TransientServerError.

        `setting` names the config field `timeout` comes from, so a timeout says what to raise.
        """
        if self._pool is None:
            raise RuntimeError("the rollout client is not initialized; call initialize() or use it in a with block")
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        try:
            status, raw = await self._pool.request(method, address, path, data, timeout)
        except asyncio.TimeoutError as e:
            hint = f"; raise {setting} if the server is only slow" if setting else ""
            raise TransientServerError(f"{method} {path} timed out after {timeout}s{hint}", address, rid) from e
        except OSError as e:
            raise TransientServerError(f"{method} {path} failed: {type(e).__name__}: {e}", address, rid) from e
        try:
            parsed: Any = json.loads(raw) if raw else None
        except ValueError:
            parsed = raw.decode("utf-8", "replace")
        if status >= 500:
            raise TransientServerError(f"{method} {path} returned {status}: {error_message(parsed)}", address, rid)
        return status, parsed
