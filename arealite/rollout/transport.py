"""`Transport`: every HTTP call of the rollout client to a server, mapped onto typed errors.

One aiohttp `ClientSession` per transport, opened and closed on the event loop that uses it.
Connection errors, timeouts and 5xx become TransientServerError (worth a retry, perhaps on
another server); other statuses are returned to the caller, who knows what they mean for
its endpoint. The parts of the client (generation, health, weight updates, the watchdog)
receive the transport and never the session, so tests of HTTP shapes can hand them a fake
(tests/rollout/fakes.py); the LLM judge sends through a transport of its own.

An address is `host:port` (plain HTTP) or a URL base such as `https://host:port`; proxies
named by the usual environment variables (`HTTP_PROXY`, `NO_PROXY`, ...) are honoured, read
once per address (aiohttp's `trust_env` reads them on every request, in a worker thread).
`abandon(address)` cancels the requests in flight to a server at once (the rollout client's
`ServerPool` calls it when the server leaves the rotation): they raise TransientServerError.

A request that finds its kept-alive connection closed before any reply is sent once more on a
new connection, whatever its method (servers may close one right after answering on it, as
a server does after a failed weight-transfer route: docs/protocol.md §1.10).
"""

from __future__ import annotations

import asyncio
import json
import sys
import urllib.parse
import urllib.request
from typing import Any

from arealite.backends.contract import KEEPALIVE_S, error_message
from arealite.rollout.errors import TransientServerError

# KEEPALIVE_S: seconds an idle connection is kept (aiohttp's default: 15). Between two rollout
# batches the client idles for a training step, often longer than that; with the default every
# request of the next batch would open a new connection. A server may close one sooner (uvicorn
# after 5 s): aiohttp sees the close and connects anew. The servers arealite starts keep it as long.


def base_url(address: str) -> str:
    """`http://host:port` for a bare `host:port`; an address with a scheme as given."""
    return address.rstrip("/") if "://" in address else f"http://{address}"


class Transport:
    """The client's HTTP session (module docstring); also an async context manager."""

    def __init__(self) -> None:
        self._session: Any = None  # aiohttp.ClientSession once open
        self._fresh: Any = None  # one that never reuses a connection: for the retry below
        self._flight: dict[str, set[asyncio.Task]] = {}  # by address: the tasks waiting on a reply
        self._abandoned: dict[asyncio.Task, str] = {}  # cancelled by abandon(), with the reason
        self._proxies: dict[str, str | None] = {}  # by address: its proxy from the environment, if any

    async def open(self) -> None:
        import aiohttp

        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S)  # limit=0: no cap in flight
        reuse = aiohttp.TraceConfig()  # marks a request sent on a kept-alive connection (module docstring)
        reuse.on_connection_reuseconn.append(_mark_reused)
        reuse.on_connection_create_end.append(_mark_new)
        self._session = aiohttp.ClientSession(connector=connector, trace_configs=[reuse])
        self._fresh = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=True))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            await self._fresh.close()
            self._session = self._fresh = None

    async def __aenter__(self) -> Transport:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def abandon(self, address: str, reason: str) -> None:
        """Cancel every request in flight to `address` now; each raises TransientServerError naming `reason`."""
        for task in self._flight.get(address, ()):
            if task not in self._abandoned:
                self._abandoned[task] = reason
                task.cancel()

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
        import aiohttp

        if self._session is None:
            raise RuntimeError("the rollout client is not initialized; call initialize() or use it in a with block")
        what = f"{method} {path}"
        task = asyncio.current_task()
        flight = self._flight.setdefault(address, set())
        flight.add(task)
        try:
            status, raw = await self._send(method, address, base_url(address) + path, body, timeout)
        except asyncio.CancelledError:
            if (abandoned := self._abandoned_error(task, what, address, rid)) is None:
                raise
            raise abandoned from None
        except asyncio.TimeoutError as e:
            hint = f"; raise {setting} if the server is only slow" if setting else ""
            raise TransientServerError(f"{what} timed out after {timeout}s{hint}", address, rid) from e
        except (aiohttp.ClientError, OSError) as e:
            raise TransientServerError(f"{what} failed: {type(e).__name__}: {e}", address, rid) from e
        finally:
            self._land(task, flight)
        return _checked_reply(status, raw, what, address, rid)

    async def _send(
        self, method: str, address: str, url: str, body: dict[str, Any] | None, timeout: float | None
    ) -> tuple[int, bytes]:
        """One exchange on a pooled connection; once more on a connection of its own when the pooled one
        was kept alive and found closed before any reply (module docstring)."""
        import aiohttp

        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        proxy = self._proxies[address] if address in self._proxies else self._proxy_for(address, url)
        sent: dict[str, bool] = {}
        try:
            return await self._exchange(self._session, method, url, data, proxy, timeout, sent)
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
            # the server closed the kept-alive connection without reading this request (uvicorn does so
            # after an escaped exception's 500; a server's pooled connections after a weight sync): safe to
            # send again, as aiohttp does only for idempotent methods; not when the connection was new
            # or a reply began. The retry opens a connection of its own: the pool may hold more closed ones
            if not sent.get("reused") or sent.get("answered"):
                raise
        return await self._exchange(self._fresh, method, url, data, proxy, timeout, {})

    @staticmethod
    async def _exchange(
        session: Any, method: str, url: str, data: bytes | None, proxy: str | None, timeout: float | None, sent: dict
    ) -> tuple[int, bytes]:
        """The request on `session` and its whole reply; `sent` records whether the connection was
        kept alive (`reused`) and whether a reply began (`answered`)."""
        import aiohttp

        headers = None if data is None else {"Content-Type": "application/json"}
        async with session.request(
            method,
            url,
            data=data,
            headers=headers,
            proxy=proxy,
            timeout=aiohttp.ClientTimeout(timeout),
            trace_request_ctx=sent,
        ) as response:
            sent["answered"] = True
            return response.status, await response.read()

    def _abandoned_error(self, task: Any, what: str, address: str, rid: str) -> Exception | None:
        """The error a request cancelled by `abandon` raises; None when its caller cancelled it (too)."""
        reason = self._abandoned.pop(task, None)
        if reason is None or _uncancel(task) > 0:
            return None
        return TransientServerError(f"{what} abandoned: left the rotation: {reason}", address, rid)

    def _land(self, task: Any, flight: set[asyncio.Task]) -> None:
        """The request is no longer in flight; one abandoned as its reply came is not an error."""
        flight.discard(task)
        if self._abandoned.pop(task, None) is not None:
            _uncancel(task)

    def _proxy_for(self, address: str, url: str) -> str | None:
        parts = urllib.parse.urlsplit(url)
        bypass = urllib.request.proxy_bypass(parts.hostname or "")
        proxy = None if bypass else urllib.request.getproxies().get(parts.scheme)
        self._proxies[address] = proxy
        return proxy


def _checked_reply(status: int, raw: bytes, what: str, address: str, rid: str) -> tuple[int, Any]:
    """(status, the body as JSON, else as text); a 5xx is a TransientServerError."""
    try:
        parsed: Any = json.loads(raw) if raw else None
    except ValueError:
        parsed = raw.decode("utf-8", "replace")
    if status >= 500:
        raise TransientServerError(f"{what} returned {status}: {error_message(parsed)}", address, rid)
    return status, parsed


async def _mark_reused(session: Any, context: Any, params: Any) -> None:
    if isinstance(context.trace_request_ctx, dict):
        context.trace_request_ctx["reused"] = True


async def _mark_new(session: Any, context: Any, params: Any) -> None:  # aiohttp's own retry of a GET
    if isinstance(context.trace_request_ctx, dict):
        context.trace_request_ctx["reused"] = False


def _uncancel(task: asyncio.Task) -> int:
    """Withdraw one cancel() request of `task`; the number left (Python 3.10 does not count them: 0)."""
    return task.uncancel() if sys.version_info >= (3, 11) else 0
