"""Fixtures of the reliability suite: a real built-in server, and a deliberately faulty one.

The faulty server is a few lines of aiohttp on loopback. It is the component under test's
counterpart — a server that answers 500, garbage, or never — so it is real HTTP, not a mock
of the client.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

from arealite.server.process import ServerProcess, launch_server_process
from arealite.utils.net import free_ports

# Reward worker processes (spawned; they inherit sys.path) import `tests.reliability.rewards`.
REPO_ROOT = str(Path(__file__).resolve().parents[2])
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

SERVER_ARGS = ("--torch-threads", "1", "--log-level", "warning", "--skip-server-warmup")


def start_builtin(model_dir: str, log_dir: Path, extra_args: tuple[str, ...] = ()) -> ServerProcess:
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"server-{len(list(log_dir.iterdir()))}.log"
    return launch_server_process(model_dir, extra_args=SERVER_ARGS + extra_args, log_path=str(log))


@pytest.fixture(scope="session")
def builtin_server(tiny_model_dir, tmp_path_factory) -> Iterator[ServerProcess]:
    """One built-in server shared by the suite (context length 128, to test long prompts)."""
    server = start_builtin(tiny_model_dir, tmp_path_factory.mktemp("reliability-logs"), ("--context-length", "128"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


class FaultyServer:
    """An HTTP server on loopback whose /generate answers 500, garbage, or never.

    `health` chooses whether /health answers (200) or hangs too; `pause` whether
    /pause_generation does; `resume` whether /continue_generation answers 200 or 400. Runs
    its own event loop in a daemon thread; `hits` counts /generate calls.
    """

    def __init__(self, mode: str, health: str = "ok") -> None:
        self.mode, self.health = mode, health
        self.pause = "ok"  # or "never": /pause_generation hangs
        self.resume = "ok"  # or "400": /continue_generation refuses (a 5xx would take the server out of rotation)
        self.port = free_ports(1)[0]
        self.hits = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def _hang(self) -> None:
        await asyncio.sleep(3600)

    async def _health(self, request: web.Request) -> web.Response:
        if self.health == "never":
            await self._hang()
        return web.json_response({})

    async def _ok(self, request: web.Request) -> web.Response:
        return web.json_response({})

    async def _pause(self, request: web.Request) -> web.Response:
        if self.pause == "never":
            await self._hang()
        return web.json_response({})

    async def _continue(self, request: web.Request) -> web.Response:
        if self.resume == "400":
            return web.json_response({"error": {"message": "cannot continue"}}, status=400)
        return web.json_response({})

    async def _generate(self, request: web.Request) -> web.Response:
        self.hits += 1
        if self.mode == "500":
            return web.json_response({"error": {"message": "internal failure"}}, status=500)
        if self.mode == "garbage":
            return web.Response(text="<html>this is not the protocol</html>", status=200)
        if self.mode == "bad_json":  # JSON, but not a /generate reply
            return web.json_response({"text": "hello", "meta_info": {"finish_reason": {"type": "exploded"}}})
        await self._hang()  # "never"
        return web.json_response({})

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_post("/generate", self._generate)
        app.router.add_post("/pause_generation", self._pause)
        app.router.add_post("/continue_generation", self._continue)
        # handlers that hang are dropped after 1 s at shutdown instead of aiohttp's 60 s
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    def start(self) -> FaultyServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@pytest.fixture
def faulty_server(request) -> Iterator[FaultyServer]:
    """Parametrize indirectly with (mode, health)."""
    mode, health = request.param
    server = FaultyServer(mode, health).start()
    yield server
    server.stop()
