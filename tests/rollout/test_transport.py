"""The real HTTP transport against a tiny aiohttp server on loopback."""

import asyncio

import aiohttp.connector
from aiohttp import web

from arealite.rollout.transport import Transport


def test_a_connection_idle_through_a_training_step_is_reused(monkeypatch):
    """After 20 s without requests (longer than aiohttp's default keep-alive of 15 s) the next
    request goes over the pooled connection instead of opening a new one."""

    async def main() -> None:
        async def peer(request: web.Request) -> web.Response:
            return web.json_response({"port": request.transport.get_extra_info("peername")[1]})

        app = web.Application()
        app.router.add_get("/peer", peer)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        address = f"127.0.0.1:{runner.addresses[0][1]}"
        transport = Transport()
        await transport.open()
        try:
            status, first = await transport.request("GET", address, "/peer", timeout=10)
            assert status == 200
            now = aiohttp.connector.monotonic()
            monkeypatch.setattr(aiohttp.connector, "monotonic", lambda: now + 20.0)  # the pool's clock
            _, second = await transport.request("GET", address, "/peer", timeout=10)
            assert second["port"] == first["port"]
        finally:
            await transport.close()
            await runner.cleanup()

    asyncio.run(main())
