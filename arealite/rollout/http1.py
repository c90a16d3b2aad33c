"""`ConnectionPool`: a minimal HTTP/1.1 client for the rollout client's JSON calls.

One request at a time per connection, keep-alive connections pooled per address (no cap;
idle ones closed after `keepalive_s`), bodies framed by Content-Length or chunked, or read
to the close (docs/protocol.md §1.10). Plain `http://host:port` only: no TLS, proxies,
redirects, cookies or compression (nothing is asked for, so a server sends none). Every
request is bounded by one deadline over connecting, sending and the whole reply. A request
that fails on a pooled connection before any byte of a reply (the server closed it while
idle) is sent once more on a new connection. `abandon(address)` fails every request in flight to a server at once (the
rollout client's `ServerPool` calls it when the server leaves the rotation). Errors are
`OSError`s (`ConnectionError` for a lost connection, `HTTPProtocolError` for a malformed
reply, `RequestAbandoned`) or `asyncio.TimeoutError`.

Why not aiohttp's client: with it a rollout request in flight held 95 objects the garbage
collector tracks (its request, response, headers, timers and their closures), with this
pool 59 (one future and one timer of the pool's own), and each is scanned again and again
while thousands are in flight; the client's CPU per trajectory fell by 40%
(benchmarks/README.md, `scale.py` (c)).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import deque

MAX_HEAD_BYTES = 65536  # status line and headers together


class HTTPProtocolError(OSError):
    """The peer's reply is not HTTP/1.x as this client reads it."""


def split_address(address: str) -> tuple[str, int]:
    """`host:port` or `[v6]:port` -> (host, port); ValueError naming the address otherwise."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"server address {address!r} is not host:port")
    return host.strip("[]"), int(port)


class _Connection(asyncio.Protocol):
    """One TCP connection; `reply` is the future of the response being read, if any."""

    __slots__ = ("address", "transport", "reply", "buf", "head", "received", "closed", "idle_since")

    def __init__(self, address: str) -> None:
        self.address = address
        self.transport: asyncio.Transport | None = None
        self.reply: asyncio.Future | None = None
        self.buf = bytearray()
        self.head: tuple[int, int, bool, bool] | None = None  # status, length (-1: none), chunked, keep-alive
        self.received = False  # any byte of the current reply
        self.closed = False
        self.idle_since = 0.0

    # ---- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.reply is None or self.reply.done():
            self._fail(HTTPProtocolError(f"{self.address} sent {len(data)} bytes outside a reply"))
            return
        self.received = True
        self.buf += data
        try:
            self._parse(eof=False)
        except OSError as e:  # a malformed reply
            self._fail(e)

    def eof_received(self) -> bool:
        if self.reply is not None and not self.reply.done():
            try:
                self._parse(eof=True)
            except OSError as e:  # a malformed or cut-short reply
                self._fail(e)
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        reply = self.reply
        if reply is not None and not reply.done():
            reply.set_exception(ConnectionError(f"{self.address} closed the connection" + (f": {exc}" if exc else "")))

    # ---- the client side

    def send(self, data: bytes, reply: asyncio.Future) -> None:
        self.reply, self.head, self.received = reply, None, False
        self.buf.clear()
        self.transport.write(data)  # type: ignore[union-attr]

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def _fail(self, error: Exception) -> None:
        reply = self.reply
        if reply is not None and not reply.done():
            reply.set_exception(error)
        self.abort()

    def _parse(self, eof: bool) -> None:
        buf = self.buf
        if self.head is None:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEAD_BYTES:
                    raise HTTPProtocolError(f"{self.address} sent a reply head over {MAX_HEAD_BYTES} bytes")
                if eof:
                    raise ConnectionError(f"{self.address} closed the connection inside a reply head")
                return
            self.head = _parse_head(bytes(buf[:end]), self.address)
            del buf[: end + 4]
        status, length, chunked, keep = self.head
        if chunked:
            body = _dechunk(buf, self.address)
            if body is None:
                if eof:
                    raise ConnectionError(f"{self.address} closed the connection inside a chunked body")
                return
        elif length >= 0:
            if len(buf) < length:
                if eof:
                    raise ConnectionError(f"{self.address} closed the connection {length - len(buf)} bytes short")
                return
            body = bytes(buf[:length])
            keep = keep and len(buf) == length
        elif eof:
            body, keep = bytes(buf), False
        else:
            return
        buf.clear()
        self.reply.set_result((status, body, keep))  # type: ignore[union-attr]


def _parse_head(head: bytes, address: str) -> tuple[int, int, bool, bool]:
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise HTTPProtocolError(f"{address} sent {lines[0][:80]!r}, not an HTTP/1.x status line")
    status, keep = int(parts[1]), parts[0] == b"HTTP/1.1"
    length, chunked = -1, False
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            raise HTTPProtocolError(f"{address} sent a malformed header line {line[:80]!r}")
        name = name.strip().lower()
        if name == b"content-length":
            value = value.strip()
            if not value.isdigit():
                raise HTTPProtocolError(f"{address} sent Content-Length {value[:40]!r}")
            length = int(value)
        elif name == b"transfer-encoding":
            chunked = value.strip().lower().endswith(b"chunked")
        elif name == b"connection":
            tokens = value.strip().lower()
            keep = b"close" not in tokens and (keep or b"keep-alive" in tokens)
    if status in (204, 304) or 100 <= status < 200:
        length, chunked = 0, False
    return status, length, chunked, keep


def _dechunk(buf: bytearray, address: str) -> bytes | None:
    """The body of a complete chunked encoding in `buf`, or None while it is incomplete."""
    out, pos = bytearray(), 0
    while True:
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            return None
        size_field = bytes(buf[pos:eol]).split(b";", 1)[0].strip()
        try:
            size = int(size_field, 16)
        except ValueError:
            raise HTTPProtocolError(f"{address} sent a chunk size {size_field[:20]!r}") from None
        pos = eol + 2
        if size == 0:
            end = buf.find(b"\r\n\r\n", pos - 2)  # trailers, if any, end with an empty line
            return bytes(out) if end >= 0 else None
        if len(buf) < pos + size + 2:
            return None
        out += buf[pos : pos + size]
        pos += size + 2


class ConnectionPool:
    """Pooled HTTP/1.1 connections on the running event loop; see the module docstring."""

    def __init__(self, keepalive_s: float) -> None:
        self.keepalive_s = keepalive_s
        self.clock = time.monotonic  # replaceable in tests
        self._idle: dict[str, deque[_Connection]] = {}
        self._all: set[_Connection] = set()
        self._flight: dict[str, set[asyncio.Future]] = {}  # by address: what its requests in flight wait on
        self._closed = False

    async def request(
        self, method: str, address: str, path: str, body: bytes | None, timeout: float | None
    ) -> tuple[int, bytes]:
        """(status, body) of one request; OSError or asyncio.TimeoutError (see the module docstring)."""
        if self._closed:
            raise RuntimeError("the connection pool is closed")
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        head = f"{method} {path} HTTP/1.1\r\nHost: {address}\r\n"
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        data = (head + "\r\n").encode("latin-1") + (body or b"")
        flight = self._flight.get(address)
        if flight is None:
            flight = self._flight[address] = set()
        for attempt in (0, 1):
            conn = self._take(address)
            pooled = conn is not None
            if conn is None:
                conn = await self._connect(loop, address, deadline, flight)
            reply = loop.create_future()
            timer = None if deadline is None else loop.call_at(deadline, _expire, reply)
            flight.add(reply)
            try:
                conn.send(data, reply)
                status, payload, keep = await reply
            except ConnectionError:
                self._drop(conn)
                if pooled and not conn.received and attempt == 0 and not self._closed:
                    continue  # closed by the server while idle: once more, on a new connection
                raise
            except BaseException:  # a timeout, abandonment, a malformed reply, a cancellation: state unknown
                self._drop(conn)
                raise
            finally:
                flight.discard(reply)
                if timer is not None:
                    timer.cancel()
            if keep and not conn.closed and not self._closed:
                conn.reply = None
                conn.idle_since = self.clock()
                self._idle.setdefault(address, deque()).append(conn)
            else:
                self._drop(conn)
            return status, payload
        raise AssertionError("unreachable")

    def abandon(self, address: str, reason: str) -> None:
        """Fail every request in flight to `address` now with RequestAbandoned(reason), connecting
        or waiting for its reply (their connections are closed)."""
        for waiter in list(self._flight.get(address, ())):
            if not waiter.done():
                waiter.set_exception(RequestAbandoned(f"{address}: {reason}"))

    async def close(self) -> None:
        self._closed = True
        for conn in list(self._all):
            conn.abort()
        self._all.clear()
        self._idle.clear()

    def _take(self, address: str) -> _Connection | None:
        idle = self._idle.get(address)
        now = self.clock()
        while idle:
            conn = idle.pop()
            if not conn.closed and now - conn.idle_since < self.keepalive_s:
                return conn
            self._drop(conn)
        return None

    async def _connect(
        self, loop: asyncio.AbstractEventLoop, address: str, deadline: float | None, flight: set[asyncio.Future]
    ) -> _Connection:
        host, port = split_address(address)
        ready = loop.create_future()  # what abandon() and the deadline fail; the connect task may finish later
        task = loop.create_task(loop.create_connection(lambda: _Connection(address), host, port))
        task.add_done_callback(functools.partial(_connected, ready))
        timer = None if deadline is None else loop.call_at(deadline, _expire, ready)
        flight.add(ready)
        try:
            conn = await ready
        except BaseException:
            task.cancel()
            raise
        finally:
            flight.discard(ready)
            if timer is not None:
                timer.cancel()
        if self._closed:
            conn.abort()
            raise RuntimeError("the connection pool is closed")
        self._all.add(conn)
        return conn

    def _drop(self, conn: _Connection) -> None:
        conn.abort()
        self._all.discard(conn)


class RequestAbandoned(OSError):
    """`ConnectionPool.abandon` gave up on the request (its server left the rotation)."""


def _connected(ready: asyncio.Future, task: asyncio.Task) -> None:
    if task.cancelled():
        return
    error = task.exception()
    if ready.done():  # given up meanwhile: a connection made anyway is closed
        if error is None:
            task.result()[1].abort()
    elif error is not None:
        ready.set_exception(error)
    else:
        ready.set_result(task.result()[1])


def _expire(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_exception(asyncio.TimeoutError())
