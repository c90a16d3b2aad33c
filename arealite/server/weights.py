"""Weight updates: from disk, and over torch.distributed from a trainer (docs/protocol.md §3).

Distributed: `/init_weights_update_group` joins a stand-alone group as rank `rank_offset`
(`arealite.weight_sync.group`; the trainer's rank 0 hosts the store and is the broadcast
source). Each `/update_weights_from_distributed` call receives its tensors in the listed
order and copies them into the parameters of the same HF names. Receives run in a worker
thread so the event loop keeps serving; each copy holds the model lock, so no forward sees
a half-copied tensor. Unlike SGLang (which asserts and may crash its scheduler), a missing
group is a clean 400.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading

import torch
from aiohttp import web

from arealite.server.errors import BadBody, json_body, json_response
from arealite.server.model_runner import load_model
from arealite.server.state import ServerState
from arealite.utils.hf_weights import read_hf_weights
from arealite.weight_sync.group import broadcast, init_custom_process_group, release_store

logger = logging.getLogger("arealite.server")
NOT_FLUSHED = (
    " Weights were updated, but the cache was not flushed because requests are still running or queued."
    " Send flush_cache=false while paused with in_place or retract."
)


def _named_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return dict(model.state_dict(keep_vars=False))


def copy_into(state: ServerState, named: dict[str, torch.Tensor]) -> None:
    """Copy tensors into the model by HF name, under the model lock; unknown names raise.
    In place: the lean forward's fused q/k/v and gate/up buffers are what these names view."""
    params = _named_tensors(state.runner.model)
    for name, tensor in named.items():
        if name not in params:
            raise KeyError(f"parameter {name!r} does not exist in the served model")
        if tuple(params[name].shape) != tuple(tensor.shape):
            raise ValueError(f"parameter {name!r} has shape {tuple(params[name].shape)}, got {tuple(tensor.shape)}")
    with state.runner.lock, torch.no_grad():
        for name, tensor in named.items():
            params[name].copy_(tensor.to(params[name].dtype))
        state.runner.weights_changed()


def _read_checkpoint(model_path: str) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors: safetensors files read directly (no second model is built),
    else (e.g. pytorch_model.bin) through transformers."""
    try:
        return read_hf_weights(model_path)
    except FileNotFoundError:
        return _named_tensors(load_model(model_path, torch.float32, "cpu"))


def _tied_aliases(model: torch.nn.Module) -> set[str]:
    """Parameter names that repeat an earlier parameter (tied weights: checkpoints save them once)."""
    every = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    return every - {name for name, _ in model.named_parameters()}


def load_from_disk(state: ServerState, model_path: str) -> None:
    """Read a checkpoint and copy it in; on any failure the served weights stay untouched."""
    if not os.path.isdir(model_path):  # never a hub id: a disk update must not start a download
        raise RuntimeError(
            f"Failed to get weights iterator: {model_path[:300]!r} is not a checkpoint directory on this server"
        )
    try:
        new = _read_checkpoint(model_path)
    except Exception as e:
        raise RuntimeError(f"Failed to get weights iterator: {e}") from e
    old = _named_tensors(state.runner.model)
    optional = _tied_aliases(state.runner.model)
    if not set(new) <= set(old) or set(old) - set(new) - optional:
        differ = sorted((set(new) ^ set(old)) - optional)[:5]
        raise RuntimeError(
            f"Failed to update weights: parameter names differ from the served model ({differ}).\nRolling back to "
            "original weights."
        )
    try:
        copy_into(state, new)
    except ValueError as e:
        raise RuntimeError(f"Failed to update weights: {e}.\nRolling back to original weights.") from e


async def _begin_update(state: ServerState, body: dict) -> bool:
    """Abort if asked, then take the update slot (skipped while paused). Returns whether taken."""
    if body.get("abort_all_requests", False):
        state.scheduler.abort(abort_all=True)
    return await state.gate.acquire_update()


def _success_message(state: ServerState, base: str, body: dict) -> str:
    version = body.get("weight_version")
    if version is None:
        return base
    state.set_weight_version(str(version))
    return f"{base} Weight version updated to {version}."


def _flush_refused(state: ServerState, body: dict) -> bool:
    return bool(body.get("flush_cache", True)) and state.scheduler.num_requests > 0


@json_body
async def handle_update_from_disk(request: web.Request, body: dict) -> web.Response:
    state: ServerState = request.app["state"]
    model_path = body.get("model_path")
    if not isinstance(model_path, str) or not model_path:
        raise BadBody("1 validation error: model_path Field required (a checkpoint directory)")
    taken = await _begin_update(state, body)
    try:
        await state.run_blocking(load_from_disk, state, model_path)
    except Exception as e:
        logger.warning("update_weights_from_disk failed: %s", e)
        return json_response({"success": False, "message": str(e), "num_paused_requests": 0}, status=400)
    finally:
        if taken:
            await state.gate.release_update()
    state.model_path = state.served_model_name = model_path
    message = _success_message(state, "Succeeded to update model weights.", body)
    if _flush_refused(state, body):
        return json_response({"success": False, "message": message + NOT_FLUSHED, "num_paused_requests": 0}, status=400)
    return json_response({"success": True, "message": message, "num_paused_requests": 0})


def _group_name(body: dict) -> str:
    name = body.get("group_name", "weight_update_group")
    if not isinstance(name, str) or not name:
        raise BadBody(f"1 validation error: group_name must be a non-empty string, got {str(name)[:80]}")
    return name


def _int_field(body: dict, key: str, low: int, high: int) -> int:
    """An integer field (AReaL sends master_port as a numeric string): a missing or non-numeric
    value fails body validation (BadBody); one out of [low, high] fails the init (ValueError)."""
    value = body.get(key)
    try:
        if isinstance(value, (bool, float)):
            raise ValueError
        number = int(value)
    except (TypeError, ValueError):
        raise BadBody(f"1 validation error: {key} must be an integer, got {str(value)[:80]}") from None
    if not low <= number <= high:
        raise ValueError(f"{key} must be in [{low}, {high}], got {number}")
    return number


def _init_args(body: dict, default_timeout: float) -> tuple:
    """The init body's fields; BadBody for a malformed body, ValueError for a refused value."""
    address = body.get("master_address")
    if not isinstance(address, str) or not address:
        raise BadBody(f"1 validation error: master_address must be a host name or IP, got {str(address)[:80]}")
    name = _group_name(body)
    backend = body.get("backend", "nccl")
    timeout = body.get("timeout", default_timeout)  # arealite's own field; SGLang ignores it
    if not isinstance(backend, str) or isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise BadBody("1 validation error: backend must be a string and timeout a number of seconds")
    port = _int_field(body, "master_port", 1, 65535)
    world_size = _int_field(body, "world_size", 2, 1 << 20)
    # rank 0 is the trainer, which hosts the store: a server at rank 0 would bind master_port.
    rank = _int_field(body, "rank_offset", 1, world_size - 1)
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend={backend[:80]!r} is not supported for weight updates; use 'gloo' or 'nccl'")
    if not 0 < timeout <= 86400:
        raise ValueError(f"timeout must be in (0, 86400] seconds, got {timeout}")
    return backend, address, port, rank, world_size, name, float(timeout)


async def _join_group(backend: str, address: str, port: int, rank: int, world_size: int, name: str, timeout: float):
    """Join in a thread of its own, waiting at most `timeout` (+ a little for the store's own
    error to arrive first). A store client facing a peer that accepts but never answers blocks
    in a read torch does not time out; such a thread is left behind rather than holding the
    request (it ends when the peer closes), and it does not occupy the shared executor."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(pg, error: BaseException | None) -> None:
        if not future.done():
            future.set_result(pg) if error is None else future.set_exception(error)

    def run() -> None:
        try:
            outcome = (init_custom_process_group(backend, address, port, rank, world_size, name, timeout), None)
        except Exception as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__  # torch appends C++ frames
            outcome = (
                None,
                RuntimeError(
                    f"{first} (master {address}:{port}, rank {rank} of {world_size}, timeout {timeout:g}s: "
                    "the request's `timeout`, else the server's --dist-timeout)"
                ),
            )
        try:
            loop.call_soon_threadsafe(settle, *outcome)
        except RuntimeError:  # the server shut down meanwhile
            pass

    threading.Thread(target=run, name=f"join-{name}", daemon=True).start()
    try:
        return await asyncio.wait_for(asyncio.shield(future), timeout + 5.0)
    except asyncio.TimeoutError:
        raise TimeoutError(
            f"the rendezvous with master {address}:{port} did not complete within {timeout:g}s; check that the "
            "trainer's rank 0 listens there, or raise the request's `timeout` (the server's --dist-timeout)"
        ) from None


@json_body
async def handle_init_group(request: web.Request, body: dict) -> web.Response:
    state: ServerState = request.app["state"]
    groups: dict = request.app["weight_groups"]
    group_name = _group_name(body)
    if group_name in groups:
        return json_response(
            {
                "success": False,
                "message": (
                    f"Failed to initialize custom process group: group {group_name!r} already exists; destroy it first."
                ),
            },
            status=400,
        )
    try:
        backend, address, port, rank, world_size, group_name, timeout = _init_args(body, state.args.dist_timeout)
        pg = await _join_group(backend, address, port, rank, world_size, group_name, timeout)
    except BadBody:
        raise
    except Exception as e:
        return json_response(
            {"success": False, "message": f"Failed to initialize custom process group: {e}"}, status=400
        )
    groups[group_name] = (pg, backend)
    return json_response({"success": True, "message": "Succeeded to initialize custom process group."})


def _parse_specs(body: dict, params: dict[str, torch.Tensor]) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
    """The (name, dtype, shape) list to receive, checked against the served parameters BEFORE
    any receive: a wrong layout would otherwise hang the broadcast or allocate at will."""
    if body.get("load_format") not in (None, "auto"):
        # Refuse before joining any broadcast: a receiver expecting the wrong layout would hang the trainer.
        raise BadBody(
            f"load_format {str(body['load_format'])[:80]!r} is not supported by the built-in server; send one tensor "
            "per name (omit load_format)"
        )
    names, dtypes, shapes = body.get("names"), body.get("dtypes"), body.get("shapes")
    if not (isinstance(names, list) and isinstance(dtypes, list) and isinstance(shapes, list)):
        raise BadBody("1 validation error: names, dtypes and shapes must be lists")
    if not len(names) == len(dtypes) == len(shapes):
        raise BadBody(
            f"names ({len(names)}), dtypes ({len(dtypes)}) and shapes ({len(shapes)}) must have the same length"
        )
    specs = []
    for name, dtype, shape in zip(names, dtypes, shapes):
        if not isinstance(name, str) or name not in params:
            raise BadBody(f"parameter {str(name)[:200]!r} does not exist in the served model")
        torch_dtype = getattr(torch, str(dtype).removeprefix("torch."), None)
        if not isinstance(torch_dtype, torch.dtype):
            raise BadBody(f"dtype {str(dtype)[:80]!r} of {name!r} is not a torch dtype name such as 'float32'")
        expected = list(params[name].shape)
        if not isinstance(shape, list) or shape != expected:
            raise BadBody(f"shape {str(shape)[:80]} of {name!r} differs from the served parameter's {expected}")
        specs.append((name, torch_dtype, tuple(expected)))
    return specs


def receive_and_load(state: ServerState, group: tuple, specs: list) -> None:
    """Receive every tensor (broadcast from rank 0) in order, then copy them in."""
    pg, backend = group
    device = "cuda" if backend == "nccl" else "cpu"  # NCCL moves only CUDA tensors
    received = {}
    for name, dtype, shape in specs:
        tensor = torch.empty(shape, dtype=dtype, device=device)
        broadcast(pg, tensor, src=0)
        received[name] = tensor
    copy_into(state, received)


@json_body
async def handle_update_from_distributed(request: web.Request, body: dict) -> web.Response:
    state: ServerState = request.app["state"]
    groups: dict = request.app["weight_groups"]
    specs = _parse_specs(body, _named_tensors(state.runner.model))
    group_name = _group_name(body)
    if group_name not in groups:
        message = f"Group {group_name} not in {sorted(groups)}. Please call init_weights_update_group first."
        return json_response({"success": False, "message": message}, status=400)
    taken = await _begin_update(state, body)
    try:
        await state.run_blocking(receive_and_load, state, groups[group_name], specs)
    except Exception as e:
        # A collective that failed (a peer died, a timeout) leaves the group unusable: drop it,
        # which also closes its connections so the other members fail fast instead of waiting.
        groups.pop(group_name, None)
        release_store(group_name)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        message = (
            f"Failed to update parameter online: {first}. The full weights of the ModelRunner are partially updated. "
            f"Please discard the whole weights. Group {group_name} was destroyed; initialize a new one."
        )
        logger.warning("update_weights_from_distributed failed: %s", first)
        return json_response({"success": False, "message": message}, status=400)
    finally:
        if taken:
            await state.gate.release_update()
    message = _success_message(state, "Succeeded to update parameter online.", body)
    if _flush_refused(state, body):
        return json_response({"success": False, "message": message + NOT_FLUSHED}, status=400)
    return json_response({"success": True, "message": message})


@json_body
async def handle_destroy_group(request: web.Request, body: dict) -> web.Response:
    groups: dict = request.app["weight_groups"]
    group_name = _group_name(body)
    if group_name not in groups:
        return json_response({"success": False, "message": "The group to be destroyed does not exist."}, status=400)
    del groups[group_name]
    release_store(group_name)
    return json_response({"success": True, "message": "Succeeded to destroy custom process group."})


@json_body
async def handle_update_weight_version(request: web.Request, body: dict) -> web.Response:
    state: ServerState = request.app["state"]
    if not isinstance(body.get("new_version"), str):
        raise BadBody("1 validation error: new_version Field required (a string)")
    if body.get("abort_all_requests", True):
        state.scheduler.abort(abort_all=True)
    state.set_weight_version(body["new_version"])
    return json_response(
        {
            "success": True,
            "message": f"Weight version updated to {body['new_version']}",
            "new_version": body["new_version"],
        }
    )
