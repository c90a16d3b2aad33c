"""Retries with backoff on 5xx and typed errors, using a server that fails on purpose.

The built-in server cannot be made to return a 5xx on demand, so this failure-injection
server (a few lines of aiohttp, run in the engine's own test process) answers /generate
with 503 a set number of times before a well-formed SGLang reply.
"""

from __future__ import annotations

import asyncio
import threading

import pytest
from aiohttp import web

from arealite.config import GenerationHyperparameters, InferenceEngineConfig
from arealite.rollout import GenerationError, RemoteSGLangEngine, ServerUnavailable
from arealite.types import ModelRequest
from arealite.utils.net import free_ports

pytestmark = pytest.mark.timeout(60)


class FlakyServer:
    def __init__(self, failures: int, status: int = 503) -> None:
        self.failures, self.status, self.calls = failures, status, 0
        self.port = free_ports(1)[0]
        self.address = f"127.0.0.1:{self.port}"
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        self._started.wait(10)

    async def _generate(self, request: web.Request) -> web.Response:
        self.calls += 1
        if self.calls <= self.failures:
            return web.json_response({"error": {"message": "overloaded"}}, status=self.status)
        meta = {
            "id": "x",
            "finish_reason": {"type": "length", "length": 2},
            "output_token_logprobs": [[-0.5, 9, None], [-0.25, 10, None]],
        }
        return web.json_response({"meta_info": meta})  # no output_ids: tokens come from the logprobs

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({})

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_post("/generate", self._generate)
        app.router.add_get("/health", self._health)
        self._runner = web.AppRunner(app)
        self._loop.run_until_complete(self._runner.setup())
        self._loop.run_until_complete(web.TCPSite(self._runner, "127.0.0.1", self.port).start())
        self._started.set()
        self._loop.run_forever()

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def generate(failures: int, retries: int, status: int = 503):
    server = FlakyServer(failures, status)
    engine = RemoteSGLangEngine(InferenceEngineConfig(request_retries=retries, setup_timeout=10), [server.address])
    try:
        engine.initialize()
        request = ModelRequest(input_ids=[1, 2], gconfig=GenerationHyperparameters(max_new_tokens=2), rid="req-7")
        return asyncio.run(engine.agenerate(request)), engine, server
    finally:
        engine.destroy()
        server.close()


def test_5xx_is_retried_with_backoff():
    resp, engine, server = generate(failures=2, retries=3)
    assert resp.output_tokens == [9, 10] and resp.output_logprobs == [-0.5, -0.25]
    assert engine.stats["retries"] == 2 and server.calls == 3


def test_retries_exhausted_is_typed_and_names_server_and_request():
    with pytest.raises(ServerUnavailable, match="request_retries=1") as info:
        generate(failures=5, retries=1)
    assert info.value.rid == "req-7" and info.value.address.startswith("127.0.0.1:")
    assert "overloaded" in str(info.value)


def test_4xx_is_not_retried():
    with pytest.raises(GenerationError, match="returned 400: overloaded"):
        generate(failures=5, retries=3, status=400)


def test_unreachable_server_at_startup_is_named():
    address = f"127.0.0.1:{free_ports(1)[0]}"  # nothing listens there
    engine = RemoteSGLangEngine(InferenceEngineConfig(setup_timeout=1.0, health_check_timeout=0.5), [address])
    with pytest.raises(
        ServerUnavailable, match=rf"servers \['{address}'\] did not answer /health within setup_timeout=1.0s"
    ):
        engine.initialize()
    assert not engine.loop.running  # a failed initialize cleans up its thread
