"""`POST /generate`: validate, wait at the pause gate, run through the scheduler, answer.

Non-stream: one result object (single prompt, n == 1) or a JSON array in expanded-batch
order. Stream: `data: <chunk>\\n\\n` per token with cumulative `text`/`output_ids`/logprobs
(0.5.6+ default), batch chunks carrying `index`, then `data: [DONE]\\n\\n`; validation
errors found after the contract check arrive in-band with status 200 (docs/protocol.md §1.8).
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from arealite.server.errors import (
    RequestError,
    dumps,
    error_response,
    json_response,
    read_json_object,
    stream_error_chunk,
)
from arealite.server.output import build_result
from arealite.server.protocol import GenerateCall, check_length, parse_generate
from arealite.server.request import Req
from arealite.server.state import ServerState

DEFAULT_MAX_NEW_TOKENS = 128
DISCONNECT_CHECK_S = 0.25  # how often a waiting non-stream call checks that its client is still there


def make_reqs(state: ServerState, call: GenerateCall) -> list[Req]:
    """Tokenize and length-check every item; raises RequestError on the first bad one."""
    reqs = []
    encoded: dict[str, list[int]] = {}  # the n copies of a text prompt are tokenized once
    total, cap = 0, state.limits.max_request_tokens
    for item in call.items:
        if item.input_ids is not None:
            prompt = item.input_ids
        else:
            prompt = encoded.get(item.text)
            if prompt is None:
                prompt = encoded[item.text] = state.tokenizer.encode(item.text)
        if not prompt:
            raise RequestError("The text prompt encodes to zero tokens; send a non-empty prompt.")
        check_length(len(prompt), item.params.max_new_tokens, state.context_len)
        if item.logprob_start_len >= len(prompt):
            raise RequestError(
                f"logprob_start_len ({item.logprob_start_len}) is higher than the number of input tokens "
                f"({len(prompt)})."
            )
        max_new = item.params.max_new_tokens
        if max_new is None:
            max_new = min(DEFAULT_MAX_NEW_TOKENS, state.context_len - len(prompt))
        if item.params.min_new_tokens > max_new:
            raise RequestError(
                f"min_new_tokens must be in [0, max_new_tokens({max_new})], got {item.params.min_new_tokens}."
            )
        total += len(prompt) + max_new
        if total > cap:
            raise RequestError(
                f"The request needs more than {cap} tokens (prompt + max_new_tokens summed over its {len(call.items)} "
                "sequences), the most the server accepts per request (--max-request-tokens). Split it or lower "
                "max_new_tokens."
            )
        seed = item.params.sampling_seed
        seed = state.next_seed() if seed is None else seed + item.index  # n copies must differ
        reqs.append(
            Req(
                rid=item.rid,
                prompt=list(prompt),
                params=item.params,
                max_new_tokens=max_new,
                return_logprob=item.return_logprob,
                top_logprobs_num=item.top_logprobs_num,
                logprob_start_len=item.logprob_start_len,
                seed=seed,
                stream=call.stream,
                lora=state.runner.lora.resolve(item.lora_path),
                processed_logprobs=call.processed_logprobs,
            )
        )
    return reqs


def _claim_rids(state: ServerState, reqs: list[Req]) -> None:
    for req in reqs:
        if req.rid in state.active_rids:
            raise RequestError(f"Duplicate request ID detected: {req.rid}")
    state.active_rids.update(r.rid for r in reqs)


async def handle_generate(request: web.Request) -> web.StreamResponse:
    state: ServerState = request.app["state"]
    try:
        body = await read_json_object(request)
        call = parse_generate(body, state.runner.vocab_size, state.limits)
    except ValueError as e:  # BadBody, ContractError, RequestError, and SamplingParams.verify
        return error_response(e)
    if call.stream:
        return await _stream(request, state, call)
    try:
        reqs = make_reqs(state, call)
        _claim_rids(state, reqs)
    except RequestError as e:
        return error_response(e)
    await state.gate.enter()
    try:
        await _run_all(request, state, reqs)
    finally:
        state.active_rids.difference_update(r.rid for r in reqs)
        await state.gate.leave()
    failed = [r for r in reqs if (r.finish_reason.get("status_code") or 0) >= 400]
    if failed:
        reason = failed[0].finish_reason
        status = reason["status_code"]
        body = {"object": "error", "message": reason["message"], "type": str(status), "param": None, "code": status}
        return json_response(body, status=status)
    results = [
        build_result(r, len(r.output_ids), state.tokenizer, state.weight_version, call.return_text_in_logprobs, True)
        for r in reqs
    ]
    return json_response(results if call.is_batch else results[0])


def _submit(state: ServerState, reqs: list[Req], events: asyncio.Queue) -> None:
    loop = asyncio.get_running_loop()
    for i, req in enumerate(reqs):
        req.on_event = lambda r, n, fin, i=i: loop.call_soon_threadsafe(events.put_nowait, (i, n, fin))
        state.scheduler.submit(req)


async def _run_all(request: web.Request, state: ServerState, reqs: list[Req]) -> None:
    """Submit `reqs` and wait until every one has finished; abort them if the client goes away
    (§1.7). One future for the call, set by the last request to finish; a timer re-armed every
    DISCONNECT_CHECK_S checks the client meanwhile."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    left = [len(reqs)]

    def finished_one() -> None:  # on the event loop
        left[0] -= 1
        if not left[0] and not done.done():
            done.set_result(None)

    def check_client() -> None:
        if done.done():
            return
        transport = request.transport
        if transport is None or transport.is_closing():
            for req in reqs:
                if req.finish_reason is None:
                    state.scheduler.abort(req.rid)
        else:
            timer[0] = loop.call_later(DISCONNECT_CHECK_S, check_client)

    for req in reqs:  # non-stream requests report only when they finish
        req.on_event = lambda r, n, fin: fin and loop.call_soon_threadsafe(finished_one)
        state.scheduler.submit(req)
    timer = [loop.call_later(DISCONNECT_CHECK_S, check_client)]
    try:
        await done
    except asyncio.CancelledError:
        for req in reqs:
            state.scheduler.abort(req.rid)
        raise
    finally:
        timer[0].cancel()


async def _stream(request: web.Request, state: ServerState, call: GenerateCall) -> web.StreamResponse:
    response = web.StreamResponse(
        status=200, headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    try:
        reqs = make_reqs(state, call)
        _claim_rids(state, reqs)
    except RequestError as e:
        await response.write(stream_error_chunk(str(e)).encode())
        await response.write(b"data: [DONE]\n\n")
        return response
    events: asyncio.Queue = asyncio.Queue()
    await state.gate.enter()
    try:
        _submit(state, reqs, events)
        pending = len(reqs)
        while pending:
            i, n, finished = await events.get()
            pending -= int(finished)
            interval = reqs[i].params.stream_interval or state.args.stream_interval
            if not finished and n % max(interval, 1):
                continue
            chunk = build_result(
                reqs[i], n, state.tokenizer, state.weight_version, call.return_text_in_logprobs, finished
            )
            if call.is_batch:
                chunk["index"] = i
            try:
                await response.write(f"data: {dumps(chunk)}\n\n".encode())
            except (ConnectionResetError, RuntimeError):
                for req in reqs:
                    state.scheduler.abort(req.rid)
                raise
        await response.write(b"data: [DONE]\n\n")
    finally:
        state.active_rids.difference_update(r.rid for r in reqs)
        await state.gate.leave()
    return response
