"""The real HTTP transport (`Transport` over `http1.ConnectionPool`) against real servers on
loopback: a tiny aiohttp app, and raw asyncio servers for the replies an app does not send."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import pytest
from aiohttp import web

from arealite.rollout.errors import TransientServerError
from arealite.rollout.http1 import ConnectionPool, HTTPProtocolError, RequestAbandoned, split_address
from arealite.rollout.transport import KEEPALIVE_S, Transport

pytestmark = pytest.mark.timeout(60)


async def start_app() -> tuple[web.AppRunner, str]:
    """/peer: the client's port (tells connections apart); /echo: the JSON body back;
    /chunked: a streamed (chunked) JSON reply; /fail: 503; /slow: answers after 5 s."""

    async def peer(request: web.Request) -> web.Response:
        return web.json_response({"port": request.transport.get_extra_info("peername")[1]})

    async def echo(request: web.Request) -> web.Response:
        return web.json_response({"got": await request.json(), "method": request.method})

    async def chunked(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for part in (b'{"parts": [', b"1, 2,", b" 3]}"):
            await resp.write(part)
            await asyncio.sleep(0.01)
        await resp.write_eof()
        return resp

    async def fail(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "overloaded"}}, status=503)

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.json_response({})

    app = web.Application()
    app.router.add_get("/peer", peer)
    app.router.add_post("/echo", echo)
    app.router.add_get("/chunked", chunked)
    app.router.add_get("/fail", fail)
    app.router.add_get("/slow", slow)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"127.0.0.1:{runner.addresses[0][1]}"


async def start_raw(handler) -> tuple[asyncio.AbstractServer, str]:
    """A raw TCP server: `handler(writer, path, n)` for the n-th request on a connection, which
    answers (or not) and says whether to read the next one."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        n = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (
                        int(v)
                        for k, _, v in (h.partition(b":") for h in head.split(b"\r\n"))
                        if k.lower() == b"content-length"
                    ),
                    0,
                )
                await reader.readexactly(length)
                if not await handler(writer, head.split(b" ")[1], n):
                    break
                n += 1
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, f"127.0.0.1:{server.sockets[0].getsockname()[1]}"


def ok_reply(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), extra, body)


def run(coro) -> None:
    asyncio.run(coro)


def test_json_round_trip_and_statuses():
    async def main() -> None:
        runner, address = await start_app()
        transport = Transport()
        await transport.open()
        try:
            status, reply = await transport.request("POST", address, "/echo", {"ids": [1, 2, 3], "s": "é"}, timeout=10)
            assert (status, reply) == (200, {"got": {"ids": [1, 2, 3], "s": "é"}, "method": "POST"})
            status, reply = await transport.request("GET", address, "/chunked", timeout=10)
            assert (status, reply) == (200, {"parts": [1, 2, 3]})
            status, reply = await transport.request("GET", address, "/nowhere", timeout=10)
            assert status == 404
            with pytest.raises(TransientServerError, match="returned 503: overloaded"):
                await transport.request("GET", address, "/fail", timeout=10)
        finally:
            await transport.close()
            await runner.cleanup()

    run(main())


def test_a_connection_idle_through_a_training_step_is_reused_until_the_keepalive():
    """After 20 s without requests (longer than aiohttp's client keeps one, 15 s) the next request
    goes over the pooled connection; after KEEPALIVE_S it goes over a new one."""

    async def main() -> None:
        runner, address = await start_app()
        pool = ConnectionPool(KEEPALIVE_S)
        now = [time.monotonic()]
        pool.clock = lambda: now[0]
        try:
            port = lambda raw: json.loads(raw[1])["port"]  # noqa: E731
            first = port(await pool.request("GET", address, "/peer", None, 10))
            now[0] += 20.0
            assert port(await pool.request("GET", address, "/peer", None, 10)) == first
            now[0] += KEEPALIVE_S + 1
            assert port(await pool.request("GET", address, "/peer", None, 10)) != first
        finally:
            await pool.close()
            await runner.cleanup()

    run(main())


def test_concurrent_requests_each_get_their_own_reply():
    async def main() -> None:
        runner, address = await start_app()
        pool = ConnectionPool(KEEPALIVE_S)
        try:
            bodies = [json.dumps({"i": i, "pad": "x" * (i * 997 % 20000)}).encode() for i in range(200)]
            replies = await asyncio.gather(*(pool.request("POST", address, "/echo", b, 10) for b in bodies))
            assert [json.loads(r[1])["got"] for r in replies] == [json.loads(b) for b in bodies]
        finally:
            await pool.close()
            await runner.cleanup()

    run(main())


def test_a_pooled_connection_the_server_closed_is_replaced_once():
    """The server answers the first request of each connection and drops the second unanswered
    (a keep-alive close racing the next request): the client sends it again on a new connection.
    On a new connection the same drop is an error, not another try."""

    async def main() -> None:
        async def first_only(writer, path, n) -> bool:
            if n == 0:
                writer.write(ok_reply(b'{"n": 0}'))
                await writer.drain()
                return True
            return False

        server, address = await start_raw(first_only)
        pool = ConnectionPool(KEEPALIVE_S)
        try:
            for _ in range(3):
                assert await pool.request("GET", address, "/", None, 10) == (200, b'{"n": 0}')

            async def never(writer, path, n) -> bool:
                return False

            server2, address2 = await start_raw(never)
            with pytest.raises(ConnectionError, match="closed the connection"):
                await pool.request("GET", address2, "/", None, 10)
            server2.close()
        finally:
            await pool.close()
            server.close()

    run(main())


def test_timeouts_cancellation_and_bad_replies_drop_the_connection():
    async def main() -> None:
        replies = {
            b"/slow": None,  # never answered
            b"/garbage": b"SSH-2.0-OpenSSH\r\n\r\n",
            b"/short": b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc",
            b"/close": b"HTTP/1.0 200 OK\r\n\r\nto the end",
        }

        async def by_path(writer, path, n) -> bool:
            reply = replies.get(path, ok_reply(b'{"path": "%s"}' % path))
            if reply is None:
                await asyncio.sleep(30)
                return False
            writer.write(reply)
            await writer.drain()
            return path not in (b"/short", b"/close", b"/garbage")  # keep-alive for the ordinary paths

        server, address = await start_raw(by_path)
        pool = ConnectionPool(KEEPALIVE_S)
        try:
            start = time.monotonic()
            with pytest.raises(asyncio.TimeoutError):
                await pool.request("GET", address, "/slow", None, 0.3)
            assert 0.25 < time.monotonic() - start < 5
            with pytest.raises(HTTPProtocolError, match="not an HTTP/1.x status line"):
                await pool.request("GET", address, "/garbage", None, 10)
            with pytest.raises(ConnectionError, match="7 bytes short"):
                await pool.request("GET", address, "/short", None, 10)
            assert await pool.request("GET", address, "/close", None, 10) == (200, b"to the end")
            # a request cancelled while waiting for its reply: its late reply must not reach the next one
            task = asyncio.ensure_future(pool.request("GET", address, "/slow", None, 10))
            await asyncio.sleep(0.2)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert await pool.request("GET", address, "/a", None, 10) == (200, b'{"path": "/a"}')
            assert await pool.request("GET", address, "/b", None, 10) == (200, b'{"path": "/b"}')
        finally:
            await pool.close()
            server.close()

    run(main())


def test_connection_refused_and_a_closed_client_are_clear_errors():
    async def main() -> None:
        transport = Transport()
        with pytest.raises(RuntimeError, match="not initialized"):
            await transport.request("GET", "127.0.0.1:1", "/health", timeout=5)
        await transport.open()
        try:
            with pytest.raises(TransientServerError, match="GET /health failed: ConnectionRefusedError"):
                await transport.request("GET", "127.0.0.1:1", "/health", timeout=5)
        finally:
            await transport.close()

    run(main())
    with pytest.raises(ValueError, match="'localhost' is not host:port"):
        split_address("localhost")
    assert split_address("[::1]:30000") == ("::1", 30000)


def test_abandon_fails_requests_in_flight_to_that_server_at_once():
    """A request waiting for a reply and one whose connection the peer never accepts (its accept
    queue is full) both fail within a second of `abandon`; a request to another server goes on."""

    async def main() -> None:
        async def silent(writer, path, n) -> bool:
            await asyncio.sleep(30)
            return False

        server, address = await start_raw(silent)
        runner, other = await start_app()
        full = socket.socket()
        full.bind(("127.0.0.1", 0))
        full.listen(0)
        fillers = [socket.create_connection(full.getsockname(), timeout=5)]  # the queue holds one
        unaccepted = f"127.0.0.1:{full.getsockname()[1]}"
        pool = ConnectionPool(KEEPALIVE_S)
        try:
            waiting = asyncio.ensure_future(pool.request("GET", address, "/", None, 30))
            connecting = asyncio.ensure_future(pool.request("GET", unaccepted, "/", None, 30))
            elsewhere = asyncio.ensure_future(pool.request("POST", other, "/echo", b"[1]", 30))
            await asyncio.sleep(0.3)
            assert not waiting.done() and not connecting.done()
            start = time.monotonic()
            pool.abandon(address, "the test took it out")
            pool.abandon(unaccepted, "the test took it out")
            for task in (waiting, connecting):
                with pytest.raises(RequestAbandoned, match="the test took it out"):
                    await asyncio.wait_for(task, 1.0)
            assert time.monotonic() - start < 1.0
            assert (await elsewhere)[0] == 200
        finally:
            await pool.close()
            server.close()
            await runner.cleanup()
            for s in fillers + [full]:
                s.close()

    run(main())


def test_h11_server_framing_and_its_keepalive_close():
    """Against h11, the HTTP/1.1 library under uvicorn (SGLang's server): JSON with
    Content-Length and chunked, and connections the server closes after 0.3 s idle (uvicorn's
    `timeout_keep_alive` does the same after 5 s) are replaced without an error."""
    import h11

    ports: list[int] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER)
        ports.append(writer.get_extra_info("peername")[1])
        try:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    try:
                        data = await asyncio.wait_for(reader.read(65536), 0.3)  # the idle timeout
                    except asyncio.TimeoutError:
                        return
                    conn.receive_data(data)
                    continue
                if isinstance(event, h11.ConnectionClosed):
                    return
                if isinstance(event, h11.Request):
                    body = b""
                    while not isinstance(event := conn.next_event(), h11.EndOfMessage):
                        if event is h11.NEED_DATA:
                            conn.receive_data(await reader.read(65536))
                        elif isinstance(event, h11.Data):
                            body += event.data
                    payload = json.dumps({"got": json.loads(body or b"null")}).encode()
                    chunked = body == b'"chunked"'
                    headers = [("content-type", "application/json")]
                    headers.append(
                        ("transfer-encoding", "chunked") if chunked else ("content-length", str(len(payload)))
                    )
                    out = conn.send(h11.Response(status_code=200, headers=headers))
                    for part in (payload[:5], payload[5:]) if chunked else (payload,):
                        out += conn.send(h11.Data(data=part))
                    out += conn.send(h11.EndOfMessage())
                    writer.write(out)
                    await writer.drain()
                    conn.start_next_cycle()
        finally:
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
        transport = Transport()
        await transport.open()
        try:
            for body in ([1, 2], "chunked", {"a": "é"}):
                assert await transport.request("POST", address, "/generate", body, timeout=10) == (200, {"got": body})
            assert len(ports) == 1  # one kept-alive connection so far
            await asyncio.sleep(0.6)  # the server closes it
            assert (await transport.request("POST", address, "/generate", [3], timeout=10))[1]["got"] == [3]
            assert len(ports) == 2
        finally:
            await transport.close()
            server.close()

    run(main())


def test_replies_arriving_a_byte_at_a_time():
    """Every split of a reply into reads parses the same: sent one byte per write, with
    chunk extensions and trailers, then a Content-Length reply on the same connection."""
    chunked = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4;ext=1\r\n[1, \r\n3\r\n2]\n\r\n0\r\nX-T: 1\r\n\r\n"
    )

    async def bytewise(writer, path, n) -> bool:
        for i in range(len(reply := chunked if n == 0 else ok_reply(b'{"n": 1}'))):
            writer.write(reply[i : i + 1])
            await writer.drain()
            await asyncio.sleep(0)
        return True

    async def main() -> None:
        server, address = await start_raw(bytewise)
        pool = ConnectionPool(KEEPALIVE_S)
        try:
            assert await pool.request("GET", address, "/", None, 10) == (200, b"[1, 2]\n")
            assert await pool.request("GET", address, "/", None, 10) == (200, b'{"n": 1}')
        finally:
            await pool.close()
            server.close()

    run(main())
