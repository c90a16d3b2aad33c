"""One HTTP call to an inference server, mapped onto the typed rollout errors.

Connection errors, timeouts and 5xx become TransientServerError (worth a retry, perhaps on
another server); other statuses are returned to the caller, who knows what they mean for
its endpoint.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp

from arealite.rollout.errors import TransientServerError
from arealite.rollout.protocol import error_message


def make_session() -> aiohttp.ClientSession:
    """A session for thousands of concurrent requests (aiohttp's default caps at 100)."""
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, ttl_dns_cache=300, force_close=False)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None))


async def request(
    session: aiohttp.ClientSession,
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
    url = f"http://{address}{path}"
    client_timeout = aiohttp.ClientTimeout(total=timeout)
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
