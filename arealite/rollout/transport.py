"""`Transport`: every HTTP call of the rollout client to a server, mapped onto typed errors.

Connection errors, timeouts and 5xx become TransientServerError (worth a retry, perhaps on
another server); other statuses are returned to the caller, who knows what they mean for
its endpoint. The transport owns the one aiohttp session of the client; the parts of the
client (generation, health, weight updates, the watchdog) receive the transport and never
the session, so tests of HTTP shapes can hand them a fake (tests/rollout/fakes.py). This is
the only module of the client that imports aiohttp.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp

from arealite.rollout.errors import TransientServerError
from arealite.rollout.protocol import error_message

# Seconds an idle pooled connection is kept (aiohttp's default: 15). Between two rollout
# batches the client idles for a training step, often longer than that; with the default
# every request of the next batch then opens a new connection, which at 1,024 requests in
# flight nearly doubled the client's CPU per trajectory (0.28 -> 0.51 ms with a 20 s pause
# before each batch; scale.py (c)'s stubs and workflow). The server may still close them
# sooner: a connection it closed is seen as such when taken from the pool, and replaced.
KEEPALIVE_S = 600.0


def make_session() -> aiohttp.ClientSession:
    """A session for thousands of concurrent requests (aiohttp's default caps at 100) whose
    connections outlive a training step between batches (KEEPALIVE_S)."""
    connector = aiohttp.TCPConnector(
        limit=0, limit_per_host=0, ttl_dns_cache=300, force_close=False, keepalive_timeout=KEEPALIVE_S
    )
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None))


class Transport:
    """The client's HTTP session, opened and closed on the rollout event loop."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None
        self._timeouts: dict[float | None, aiohttp.ClientTimeout] = {}  # immutable, so built once per value

    async def open(self) -> None:
        self._session = make_session()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

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
        if self._session is None:
            raise RuntimeError("the rollout client is not initialized; call initialize() or use it in a with block")
        session = self._session
        url = f"http://{address}{path}"
        client_timeout = self._timeouts.get(timeout)
        if client_timeout is None:
            client_timeout = self._timeouts[timeout] = aiohttp.ClientTimeout(total=timeout)
        try:
            async with session.request(method, url, json=body, timeout=client_timeout) as resp:
                raw = await resp.read()
                status = resp.status
        except asyncio.TimeoutError as e:
            hint = f"; raise {setting} if the server is only slow" if setting else ""
            raise TransientServerError(f"{method} {path} timed out after {timeout}s{hint}", address, rid) from e
        except aiohttp.ClientError as e:
            raise TransientServerError(f"{method} {path} failed: {type(e).__name__}: {e}", address, rid) from e
        try:
            parsed: Any = json.loads(raw) if raw else None
        except ValueError:
            parsed = raw.decode("utf-8", "replace")
        if status >= 500:
            raise TransientServerError(f"{method} {path} returned {status}: {error_message(parsed)}", address, rid)
        return status, parsed
