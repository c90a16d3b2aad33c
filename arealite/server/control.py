"""Pause, continue, abort and cache-flush endpoints (docs/protocol.md §2, §3.8).

Bodies follow 0.5.23: `/pause_generation` and `/continue_generation` REQUIRE a JSON body
(`{}` is fine; an empty body is a 400, as FastAPI's "Field required"), so a client that
works here also works on real 0.5.6+ servers. `/abort_request` also needs a JSON body.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from arealite.server.errors import BadBody, json_body, json_response
from arealite.server.state import ServerState

PAUSE_MODES = ("abort", "retract", "in_place")
ABORT_REPEAT_S = 1.0  # SGLang re-sends abort_all every second until the server drains


@json_body
async def handle_pause(request: web.Request, body: dict) -> web.Response:
    state: ServerState = request.app["state"]
    mode = body.get("mode", "abort")
    if mode not in PAUSE_MODES:
        raise BadBody(f"1 validation error: mode Input should be 'abort', 'retract' or 'in_place', got {mode!r}")
    async with state.pause_lock:
        await state.gate.set_paused(True)
        if mode == "abort":
            # Returns only once every in-flight request has been answered (0.5.6+).
            while True:
                state.scheduler.abort(abort_all=True)
                if await state.gate.wait_drained(ABORT_REPEAT_S):
                    break
        else:
            await asyncio.wrap_future(state.scheduler.pause(mode))
    return json_response({"message": "Generation paused successfully.", "status": "ok"})


@json_body
async def handle_continue(request: web.Request, body: dict) -> web.Response:
    state: ServerState = request.app["state"]
    async with state.pause_lock:
        state.scheduler.resume()
        await state.gate.set_paused(False)
    return json_response({"message": "Generation continued successfully.", "status": "ok"})


@json_body
async def handle_abort(request: web.Request, body: dict) -> web.Response:
    state: ServerState = request.app["state"]
    rid, abort_all = body.get("rid", ""), body.get("abort_all", False)
    if not isinstance(rid, str) or not isinstance(abort_all, bool):
        raise BadBody("1 validation error: rid must be a string and abort_all a boolean")
    if abort_all or rid:
        state.scheduler.abort(rid, abort_all)
    return web.Response(status=200)


FLUSH_OK = (
    "Cache flushed.\nPlease check backend logs for more details. "
    "(When there are running or waiting requests, the operation will not be performed.)\n"
)


async def handle_flush_cache(request: web.Request) -> web.Response:
    """Nothing is cached across requests here, but the refusal rule is SGLang's."""
    state: ServerState = request.app["state"]
    if state.gate.readers > 0 or state.scheduler.num_requests > 0:
        return web.Response(status=400, text="Cache not flushed: requests are still running or waiting.\n")
    return web.Response(status=200, text=FLUSH_OK)
