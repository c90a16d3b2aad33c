"""SGLang's error statuses and bodies (docs/protocol.md §6), as aiohttp responses.

Three 400 shapes coexist in SGLang 0.5.23 and clients key on them:
* a ValueError while handling a request: `{"error": {"message": ...}}`;
* the 0.5.22+ JSON contract check on `/generate` (unknown sampling key, wrong JSON type):
  `{"error": "<plain string>"}`;
* a body that fails request-model validation (not JSON, missing required field, bad literal):
  `{"object": "error", "message": ..., "type": "Bad Request", "param": null, "code": 400}`.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Awaitable, Callable

from aiohttp import web

from arealite.server.limits import RequestLimits, json_depth_exceeds


class RequestError(ValueError):
    """A bad request value; becomes 400 `{"error": {"message": ...}}` (or an in-band stream chunk)."""


class ContractError(ValueError):
    """A 0.5.22+ JSON-contract violation on /generate; becomes 400 `{"error": "<message>"}`."""


class BadBody(ValueError):
    """A body that fails request-model validation; becomes SGLang's remapped-422 400 shape."""


def dumps(obj) -> str:
    """JSON as orjson writes it for SGLang: -inf and NaN become null."""
    try:  # the common case, in one pass: no non-finite float anywhere
        return json.dumps(obj, separators=(",", ":"), allow_nan=False)
    except ValueError:
        return json.dumps(_nan_to_null(obj), separators=(",", ":"))


def _nan_to_null(obj):
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _nan_to_null(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_nan_to_null(v) for v in obj]
    return obj


def json_response(obj, status: int = 200) -> web.Response:
    return web.Response(text=dumps(obj), status=status, content_type="application/json")


def error_response(exc: Exception) -> web.Response:
    """Map one of this module's exceptions to SGLang's 400 body."""
    if isinstance(exc, ContractError):
        return json_response({"error": str(exc)}, status=400)
    if isinstance(exc, BadBody):
        return bad_body_response(str(exc))
    return json_response({"error": {"message": str(exc)}}, status=400)


def bad_body_response(message: str) -> web.Response:
    body = {"object": "error", "message": message, "type": "Bad Request", "param": None, "code": 400}
    return json_response(body, status=400)


def status_response(status: int, message: str) -> web.Response:
    """SGLang's HTTPException shape, used for every error status other than 400 (§6)."""
    body = {"object": "error", "message": message, "type": str(status), "param": None, "code": status}
    return json_response(body, status=status)


def stream_error_chunk(message: str) -> str:
    """0.5.16+ in-band error chunk of a stream that already started (HTTP status stays 200)."""
    body = {"error": {"message": message, "type": "invalid_request_error", "code": 400, "retryable": False}}
    return f"data: {dumps(body)}\n\n"


def _reject_constant(name: str):
    # Python's parser accepts NaN and Infinity; JSON (and SGLang's orjson) does not.
    raise ValueError(f"{name} is not valid JSON")


async def read_json_object(request: web.Request, required: bool = True) -> dict:
    """The body as a JSON object. Missing/empty gives `{}` unless `required` (then BadBody).

    A body over `--max-request-bytes` raises aiohttp's 413 (answered by the app's
    middleware); nesting deeper than `--max-json-depth` is a BadBody.
    """
    limits: RequestLimits = request.app.get("limits") or RequestLimits()
    raw = await request.read()
    if not raw.strip():
        if required:
            raise BadBody(
                "1 validation error: body Field required [{'type': 'missing', 'loc': ('body',), "
                "'msg': 'Field required', 'input': None}]"
            )
        return {}
    too_deep = False
    try:
        body = json.loads(raw, parse_constant=_reject_constant)
    except RecursionError:
        body, too_deep = None, True  # nested beyond Python's stack: certainly beyond the limit
    except ValueError as e:
        raise BadBody(f"JSON decode error: {e}") from None
    if too_deep or json_depth_exceeds(body, limits.max_json_depth):
        raise BadBody(
            f"JSON decode error: the body nests deeper than {limits.max_json_depth} levels (the server's "
            "--max-json-depth)"
        )
    if not isinstance(body, dict):
        raise BadBody(f"Input should be a valid dictionary or object, got {type(body).__name__}: {str(body)[:80]}")
    return body


def json_body(
    handler: Callable[[web.Request, dict], Awaitable[web.StreamResponse]],
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """A route handler that gets the request's JSON object body (required) as a second argument.

    A missing or non-object body, or a BadBody the handler raises while checking its fields,
    is answered with SGLang's validation 400 (`error_response`), as FastAPI answers a body
    that fails its request model.
    """

    @functools.wraps(handler)
    async def handle(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request, await read_json_object(request))
        except BadBody as e:
            return error_response(e)

    return handle
