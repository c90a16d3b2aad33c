"""The aiohttp application: routes, API-key check, health and info endpoints, warmup.

Health: `/health` answers 200 once warmup has finished and the scheduler thread is alive and
not stuck (like SGLang with SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=false, so a long pause
does not make a launcher think the server died); `/health_generate` runs a real one-token
generation and returns 503 if none comes back within 20 s. `/ready` (0.5.20+) is 503 while
paused. Unknown routes give FastAPI's 404 `{"detail": "Not Found"}`.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

from aiohttp import web

from arealite.server import control, generate, lora, weights
from arealite.server.errors import json_response, status_response
from arealite.server.request import Req
from arealite.server.sampling import SamplingParams
from arealite.server.state import ServerState

logger = logging.getLogger("arealite.server")
OPEN_ROUTES = ("/health", "/health_generate", "/metrics")
HEALTH_TIMEOUT_S = 20.0
VERSION = "arealite-0.1 (SGLang 0.5.23 protocol)"


@web.middleware
async def api_key_middleware(request: web.Request, handler):
    key = request.app["state"].args.api_key
    if key and request.path not in OPEN_ROUTES and request.headers.get("Authorization") != f"Bearer {key}":
        return json_response({"error": "Unauthorized"}, status=401)
    return await handler(request)


@web.middleware
async def not_found_middleware(request: web.Request, handler):
    try:
        return await handler(request)
    except web.HTTPNotFound:
        return json_response({"detail": "Not Found"}, status=404)
    except web.HTTPMethodNotAllowed:
        return json_response({"detail": "Method Not Allowed"}, status=405)
    except web.HTTPRequestEntityTooLarge:  # raised by request.read() past client_max_size
        limit = request.app["state"].limits.max_request_bytes
        size = f"{request.content_length} bytes" if request.content_length is not None else "a body"
        message = f"Request body too large: {size} over the server's limit of {limit} bytes (--max-request-bytes)."
        return status_response(413, message)


async def internal_generate(
    state: ServerState, input_ids: list[int], max_new_tokens: int, timeout: float
) -> Req | None:
    """Greedy generation that bypasses the pause gate (health checks, warmup); None on timeout."""
    done = asyncio.Event()
    loop = asyncio.get_running_loop()
    req = Req(
        rid=f"HEALTH_CHECK_{uuid.uuid4().hex}",
        prompt=input_ids,
        params=SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0),
        max_new_tokens=max_new_tokens,
        on_event=lambda r, n, fin: fin and loop.call_soon_threadsafe(done.set),
    )
    state.scheduler.submit(req)
    try:
        await asyncio.wait_for(done.wait(), timeout)
        return req
    except asyncio.TimeoutError:
        state.scheduler.abort(req.rid)
        return None


def _scheduler_ok(state: ServerState) -> bool:
    return (
        state.ready
        and state.scheduler.is_alive()
        and time.monotonic() - state.scheduler.last_beat < HEALTH_TIMEOUT_S * 3
    )


async def handle_health(request: web.Request) -> web.Response:
    return web.Response(status=200 if _scheduler_ok(request.app["state"]) else 503)


async def handle_health_generate(request: web.Request) -> web.Response:
    state: ServerState = request.app["state"]
    if not _scheduler_ok(state):
        return web.Response(status=503)
    req = await internal_generate(state, [0], 1, HEALTH_TIMEOUT_S)
    return web.Response(status=200 if req is not None else 503)


async def handle_ready(request: web.Request) -> web.Response:
    state: ServerState = request.app["state"]
    return web.Response(status=200 if _scheduler_ok(state) and not state.gate.paused else 503)


def model_info(state: ServerState) -> dict:
    config = state.runner.config
    return {
        "model_path": state.model_path,
        "tokenizer_path": state.args.tokenizer_path or state.args.model_path,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": state.weight_version,
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": getattr(config, "model_type", None),
        "architectures": getattr(config, "architectures", None),
        "served_model_name": state.served_model_name,
    }


async def handle_model_info(request: web.Request) -> web.Response:
    return json_response(model_info(request.app["state"]))


async def handle_server_info(request: web.Request) -> web.Response:
    state: ServerState = request.app["state"]
    info = {k: v for k, v in vars(state.args).items() if k != "api_key"}
    limits = state.scheduler.limits
    info.update(
        context_length=state.context_len,
        max_total_num_tokens=limits.max_total_tokens,
        max_req_input_len=state.context_len - 1,
        internal_states=[
            {
                "weight_version": state.weight_version,
                "num_running": len(state.scheduler.running),
                "num_waiting": len(state.scheduler.waiting),
                "paused": state.gate.paused,
                "decode_steps": state.scheduler.decode_steps,
            }
        ],
        version=VERSION,
        startup_time=state.started_at,
        frontend="python",
        model_impl=state.runner.impl,  # the forward in use (`auto` resolved)
    )
    return json_response(info)


async def handle_v1_models(request: web.Request) -> web.Response:
    state: ServerState = request.app["state"]
    name = state.served_model_name
    card = {
        "id": name,
        "object": "model",
        "created": int(state.started_at),
        "owned_by": "sglang",
        "root": name,
        "parent": None,
        "max_model_len": state.context_len,
    }
    adapters = lora.model_cards(state.runner.lora, name, int(state.started_at), state.context_len)
    return json_response({"object": "list", "data": [card, *adapters]})


def make_app(state: ServerState) -> web.Application:
    limits = state.limits
    app = web.Application(
        middlewares=[not_found_middleware, api_key_middleware], client_max_size=limits.max_request_bytes
    )
    app["state"] = state
    app["limits"] = limits
    app["weight_groups"] = {}
    r = app.router
    r.add_route("POST", "/generate", generate.handle_generate)
    r.add_route("PUT", "/generate", generate.handle_generate)
    r.add_get("/health", handle_health)
    r.add_get("/health_generate", handle_health_generate)
    r.add_get("/ready", handle_ready)
    for path in ("/get_model_info", "/model_info"):
        r.add_get(path, handle_model_info)
    for path in ("/get_server_info", "/server_info"):
        r.add_get(path, handle_server_info)
    r.add_get("/v1/models", handle_v1_models)
    r.add_post("/pause_generation", control.handle_pause)
    r.add_post("/continue_generation", control.handle_continue)
    r.add_post("/abort_request", control.handle_abort)
    r.add_get("/flush_cache", control.handle_flush_cache)
    r.add_post("/flush_cache", control.handle_flush_cache)
    r.add_post("/update_weights_from_disk", weights.handle_update_from_disk)
    r.add_post("/init_weights_update_group", weights.handle_init_group)
    r.add_post("/update_weights_from_distributed", weights.handle_update_from_distributed)
    r.add_post("/destroy_weights_update_group", weights.handle_destroy_group)
    r.add_post("/update_weight_version", weights.handle_update_weight_version)
    r.add_post("/load_lora_adapter", lora.handle_load)
    r.add_post("/unload_lora_adapter", lora.handle_unload)
    return app


async def warmup(state: ServerState) -> None:
    """SGLang's warmup: 8 greedy tokens through the real path, then mark the server up."""
    prompt = state.tokenizer.encode("The capital city of France is") or [0]
    req = await internal_generate(state, prompt, min(8, state.context_len - len(prompt) - 1), 120.0)
    if req is None:
        raise RuntimeError("warmup generation did not finish within 120 s")
    state.ready = True
    logger.info("The server is fired up and ready to roll!")


async def serve(state: ServerState, host: str, port: int, skip_warmup: bool = False) -> None:
    """Run until cancelled (SIGINT/SIGTERM)."""
    runner = web.AppRunner(make_app(state), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    logger.info("arealite server listening on http://%s:%d", host, port)
    try:
        if skip_warmup:
            state.ready = True
        else:
            await warmup(state)
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
        state.scheduler.stop()
