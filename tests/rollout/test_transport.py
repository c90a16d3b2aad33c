"""The real HTTP transport (`Transport`, over aiohttp's client) against real servers on
loopback: a tiny aiohttp app, an h11 server (uvicorn's HTTP library), and raw asyncio servers
for the replies an app does not send."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import time

import aiohttp.connector
import pytest
from aiohttp import web

from arealite.rollout.errors import TransientServerError
from arealite.rollout.transport import KEEPALIVE_S, Transport, base_url

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
            # an address with a scheme is a URL base, as given
            status, reply = await transport.request("POST", f"http://{address}", "/echo", [1], timeout=10)
            assert (status, reply["got"]) == (200, [1])
        finally:
            await transport.close()
            await runner.cleanup()

    run(main())
    assert (base_url("10.0.0.1:30000"), base_url("https://judge.example:443/")) == (
        "http://10.0.0.1:30000",
        "https://judge.example:443",
    )


def test_a_connection_idle_through_a_training_step_is_reused_until_the_keepalive(monkeypatch):
    """After 20 s without requests (longer than aiohttp's default keep-alive, 15 s) the next
    request goes over the kept connection; after KEEPALIVE_S over a new one. The clock aiohttp's
    connector reads is advanced instead of waiting."""
    now = [time.monotonic()]
    monkeypatch.setattr(aiohttp.connector, "monotonic", lambda: now[0])

    async def main() -> None:
        runner, address = await start_app()
        try:
            async with Transport() as transport:
                first = (await transport.request("GET", address, "/peer", timeout=10))[1]["port"]
                now[0] += 20.0
                assert (await transport.request("GET", address, "/peer", timeout=10))[1]["port"] == first
                now[0] += KEEPALIVE_S + 1
                assert (await transport.request("GET", address, "/peer", timeout=10))[1]["port"] != first
        finally:
            await runner.cleanup()

    run(main())


def test_concurrent_requests_each_get_their_own_reply():
    async def main() -> None:
        runner, address = await start_app()
        try:
            async with Transport() as transport:
                bodies = [{"i": i, "pad": "x" * (i * 997 % 20000)} for i in range(200)]
                replies = await asyncio.gather(*(transport.request("POST", address, "/echo", b, 10) for b in bodies))
                assert [r[1]["got"] for r in replies] == bodies
        finally:
            await runner.cleanup()

    run(main())


def test_timeouts_cancellation_and_bad_replies_are_transient_errors():
    """A reply cut short after its first bytes is an error and the request is not sent again
    (a POST /generate may already be running on the server)."""
    hits: dict[bytes, int] = {}

    async def main() -> None:
        replies = {
            b"/slow": None,  # never answered
            b"/garbage": b"SSH-2.0-OpenSSH\r\n\r\n",
            b"/short": b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc",
            b"/close": b"HTTP/1.0 200 OK\r\n\r\nto the end",
        }

        async def by_path(writer, path, n) -> bool:
            hits[path] = hits.get(path, 0) + 1
            reply = replies.get(path, ok_reply(b'{"path": "%s"}' % path))
            if reply is None:
                await asyncio.sleep(30)
                return False
            writer.write(reply)
            await writer.drain()
            return path not in (b"/short", b"/close", b"/garbage")  # keep-alive for the ordinary paths

        server, address = await start_raw(by_path)
        try:
            async with Transport() as transport:
                start = time.monotonic()
                with pytest.raises(TransientServerError, match="timed out after 0.3s; raise rollout.x if"):
                    await transport.request("GET", address, "/slow", timeout=0.3, setting="rollout.x")
                assert 0.25 < time.monotonic() - start < 5
                with pytest.raises(TransientServerError, match="GET /garbage failed"):
                    await transport.request("GET", address, "/garbage", timeout=10)
                with pytest.raises(TransientServerError, match="POST /short failed"):
                    await transport.request("POST", address, "/short", {}, timeout=10)
                assert hits[b"/short"] == 1
                assert await transport.request("GET", address, "/close", timeout=10) == (200, "to the end")
                # cancelled while waiting for its reply: its late reply must not reach the next request
                task = asyncio.ensure_future(transport.request("GET", address, "/slow", timeout=10))
                await asyncio.sleep(0.2)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                assert await transport.request("GET", address, "/a", timeout=10) == (200, {"path": "/a"})
                assert await transport.request("GET", address, "/b", timeout=10) == (200, {"path": "/b"})
        finally:
            server.close()

    run(main())


def test_a_request_on_a_connection_the_server_dropped_after_answering_goes_once_more_on_a_new_one():
    """uvicorn closes a connection right after a 500 from an escaped exception, without saying
    so (vLLM's failed weight-transfer routes): the next request, a POST (aiohttp retries only
    idempotent methods), is sent again on a new connection, not on another kept one (the pool
    may hold several closed ones, as after a weight sync on vLLM). Not retried: a disconnect on a
    new connection, and a reply cut short (the server had read the request)."""
    hits: dict[bytes, int] = {}
    dropped: set = set()  # connections that answered /boom: closed at their next request, unanswered
    connections: set = set()

    async def handler(writer, path, n) -> bool:
        connections.add(writer)
        hits[path] = hits.get(path, 0) + 1
        if writer in dropped or path == b"/drop":
            return False
        if path == b"/boom":
            dropped.add(writer)
            writer.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\n\r\nboom")
        elif path == b"/short":
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
            return False
        else:
            writer.write(ok_reply(b'{"path": "%s"}' % path))
        await writer.drain()
        return True

    async def main() -> None:
        server, address = await start_raw(handler)
        try:
            async with Transport() as transport:
                # three kept connections, each closed by the server once it is used again
                booms = [transport.request("POST", address, "/boom", {}, timeout=10) for _ in range(3)]
                for error in await asyncio.gather(*booms, return_exceptions=True):
                    assert isinstance(error, TransientServerError) and "POST /boom returned 500: boom" in str(error)
                assert len(connections) == 3
                assert await transport.request("POST", address, "/resume", {}, timeout=10) == (200, {"path": "/resume"})
                # read and dropped on a kept connection, then answered on a new one (not on another kept one)
                assert (hits[b"/resume"], len(connections)) == (2, 4)
                for _ in range(3):  # the other two closed ones, then a new kept one
                    assert await transport.request("POST", address, "/ok", {}, timeout=10) == (200, {"path": "/ok"})
                assert (hits[b"/ok"], len(connections)) == (5, 7)
                with pytest.raises(TransientServerError, match="POST /short failed"):  # a reply cut short, kept
                    await transport.request("POST", address, "/short", {}, timeout=10)
                assert (hits[b"/short"], len(connections)) == (1, 7)
            async with Transport() as transport:  # nothing kept: a new connection, not retried
                n = len(connections)
                with pytest.raises(TransientServerError, match="POST /drop failed: ServerDisconnectedError"):
                    await transport.request("POST", address, "/drop", {}, timeout=10)
                assert (hits[b"/drop"], len(connections)) == (1, n + 1)
        finally:
            server.close()

    run(main())


def test_connection_refused_and_a_closed_client_are_clear_errors():
    async def main() -> None:
        transport = Transport()
        with pytest.raises(RuntimeError, match="not initialized"):
            await transport.request("GET", "127.0.0.1:1", "/health", timeout=5)
        async with transport:
            with pytest.raises(TransientServerError, match="GET /health failed: ClientConnectorError"):
                await transport.request("GET", "127.0.0.1:1", "/health", timeout=5)

    run(main())


def test_a_proxy_named_in_the_environment_carries_the_requests(monkeypatch):
    """HTTP_PROXY is honoured: the request for an address nothing listens on reaches the proxy,
    in absolute form."""
    seen: list[bytes] = []

    async def proxy(writer, path, n) -> bool:
        seen.append(path)
        writer.write(ok_reply(b'{"via": "proxy"}'))
        await writer.drain()
        return True

    async def main() -> None:
        server, address = await start_raw(proxy)
        for name in ("NO_PROXY", "no_proxy", "http_proxy", "ALL_PROXY", "all_proxy"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HTTP_PROXY", f"http://{address}")
        try:
            async with Transport() as transport:
                assert await transport.request("GET", "192.0.2.1:30000", "/health", timeout=10) == (
                    200,
                    {"via": "proxy"},
                )
        finally:
            server.close()

    run(main())
    assert seen == [b"http://192.0.2.1:30000/health"]


def test_abandon_fails_requests_in_flight_to_that_server_at_once():
    """A request waiting for a reply and one whose connection the peer never accepts (its accept
    queue is full) both fail within a second of `abandon`; a request to another server goes on,
    and the abandoned caller's task is not left cancelled (its next request works)."""

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
        transport = Transport()
        await transport.open()

        async def then_elsewhere(target: str) -> tuple[str, int]:
            try:
                await transport.request("GET", target, "/", timeout=30)
                return "answered", 0
            except TransientServerError as e:
                assert "left the rotation: the test took it out" in str(e) and e.address == target
                if sys.version_info >= (3, 11):  # the abandonment's cancel() is withdrawn, not left counted
                    assert asyncio.current_task().cancelling() == 0
                await asyncio.sleep(0.05)  # a cancel left pending on this task would land here
                return "abandoned", (await transport.request("GET", other, "/peer", timeout=10))[0]

        try:
            waiting = asyncio.ensure_future(then_elsewhere(address))
            connecting = asyncio.ensure_future(then_elsewhere(unaccepted))
            elsewhere = asyncio.ensure_future(transport.request("POST", other, "/echo", [1], 30))
            await asyncio.sleep(0.3)
            assert not waiting.done() and not connecting.done()
            start = time.monotonic()
            transport.abandon(address, "the test took it out")
            transport.abandon(unaccepted, "the test took it out")
            assert await asyncio.wait_for(asyncio.gather(waiting, connecting), 2.0) == [("abandoned", 200)] * 2
            assert time.monotonic() - start < 1.5
            assert (await elsewhere)[0] == 200
        finally:
            await transport.close()
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
