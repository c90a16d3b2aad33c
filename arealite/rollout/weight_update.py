"""The server side of a weight sync: the HTTP calls that load new weights on every server.

disk (SGLANG_PROTOCOL.md §3.2): POST /update_weights_from_disk with the folder the trainer
wrote. distributed (§3.3-3.4): each server joins the trainer's process group once
(/init_weights_update_group, rank 1 + i), then every sync sends one
/update_weights_from_distributed per bucket while the trainer's rank 0 broadcasts it.

Every update sends `weight_version`, so replies from the server carry the version of the
weights that produced them. What else goes in the body follows the engine's `pause_mode`:
- abort: `abort_all_requests` (the write lock is then taken at once, §3.1) and the default
  cache flush;
- in_place / retract: requests stay on the paused server, so nothing is aborted (a paused
  0.5.6+ server skips the write lock) and `flush_cache: false`, because a flush refused by
  kept requests kills the scheduler on 0.5.6-0.5.20 and fails the update on 0.5.22+ (§3.9).
A server that is out of rotation is skipped and brought up to date when it rejoins.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from arealite.rollout import protocol
from arealite.rollout.errors import TransientServerError, WeightUpdateError
from arealite.rollout.transport import request
from arealite.types import WeightUpdateMeta

if TYPE_CHECKING:
    from arealite.rollout.remote_sglang import RemoteSGLangEngine


def _request_fields(keep_requests: bool) -> dict[str, Any]:
    """The update-body fields that say what happens to the server's requests (module doc)."""
    return {"flush_cache": False} if keep_requests else {"abort_all_requests": True}


class WeightUpdater:
    """Sends weight-update calls for one engine; remembers the last disk update for rejoiners."""

    def __init__(self, engine: RemoteSGLangEngine) -> None:
        self._engine = engine
        self._last_disk: WeightUpdateMeta | None = None
        self._last_distributed: WeightUpdateMeta | None = None

    async def _post(self, address: str, path: str, body: dict[str, Any]) -> None:
        engine = self._engine
        try:
            status, reply = await request(engine._session, "POST", address, path, body, engine.config.request_timeout)
        except TransientServerError as e:
            raise WeightUpdateError(f"POST {path} failed: {e}", address) from e
        if status != 200 or (isinstance(reply, dict) and reply.get("success") is False):
            raise WeightUpdateError(f"POST {path} returned {status}: {protocol.error_message(reply)}", address)

    async def _post_each(self, addresses: list[str], path: str, bodies: list[dict[str, Any]]) -> None:
        """POST concurrently; a server that went down is taken out of rotation (it is re-synced
        when it rejoins), any other failure is raised. Fails if no server took the update."""
        results = await asyncio.gather(
            *(self._post(a, path, b) for a, b in zip(addresses, bodies)), return_exceptions=True
        )
        done = 0
        for address, result in zip(addresses, results):
            if isinstance(result, BaseException):
                if isinstance(result.__cause__, TransientServerError) and not await self._engine.health.probe(address):
                    self._engine.health.take_out(address, f"it died during {path}; it gets the weights when back")
                    continue
                raise result
            done += 1
        if addresses and done == 0:
            raise WeightUpdateError(f"POST {path} reached no server (all of {addresses} are down)")

    @property
    def _keeps_requests(self) -> bool:
        """Whether paused servers hold on to their requests (pause_mode in_place / retract)."""
        return self._engine.config.pause_mode != "abort"

    @staticmethod
    def _disk_body(meta: WeightUpdateMeta, keep_requests: bool) -> dict[str, Any]:
        return {"model_path": meta.path, "weight_version": str(meta.version), **_request_fields(keep_requests)}

    def _distributed_body(self, meta: WeightUpdateMeta, i: int) -> dict[str, Any]:
        """The body for bucket `i` of `meta.buckets`."""
        bucket = meta.buckets[i]
        body = {
            "names": [name for name, _, _ in bucket],
            "dtypes": [str(dtype).removeprefix("torch.") for _, dtype, _ in bucket],
            "shapes": [[int(d) for d in shape] for _, _, shape in bucket],
            "group_name": meta.group_name,
            "weight_version": str(meta.version),
            "flush_cache": i == len(meta.buckets) - 1,  # flush once, after the last bucket
        }
        body.update(_request_fields(self._keeps_requests))  # in_place / retract: never flush
        return body

    async def aupdate(self, meta: WeightUpdateMeta) -> None:
        addresses = self._engine.pool.healthy
        if meta.type == "disk":
            if not meta.path:
                raise WeightUpdateError("WeightUpdateMeta(type='disk') needs path= the folder holding the new weights")
            body = self._disk_body(meta, self._keeps_requests)
            await self._post_each(addresses, "/update_weights_from_disk", [body] * len(addresses))
            self._last_disk = meta
        elif meta.type == "distributed":
            if not meta.buckets:
                raise WeightUpdateError(
                    "WeightUpdateMeta(type='distributed') has no buckets; the trainer must fill meta.buckets "
                    "with the (name, dtype, shape) lists it broadcasts, in broadcast order"
                )
            for i in range(len(meta.buckets)):
                body = self._distributed_body(meta, i)
                await self._post_each(addresses, "/update_weights_from_distributed", [body] * len(addresses))
            self._last_distributed = meta
        else:
            raise WeightUpdateError(f"WeightUpdateMeta.type={meta.type!r} is not supported; use 'disk' or 'distributed'")

    async def ainit_group(self, meta: WeightUpdateMeta) -> None:
        if meta.backend not in ("gloo", "nccl"):
            raise WeightUpdateError(f"WeightUpdateMeta.backend={meta.backend!r} is not supported; use 'gloo' or 'nccl'")
        addresses = self._engine.pool.addresses
        bodies = [
            {
                "master_address": meta.master_address,
                "master_port": int(meta.master_port),
                "rank_offset": 1 + i,  # the trainer's rank 0 is the broadcast source
                "world_size": 1 + len(addresses),
                "group_name": meta.group_name,
                "backend": meta.backend,
            }
            for i in range(len(addresses))
        ]
        results = await asyncio.gather(
            *(self._post(a, "/init_weights_update_group", b) for a, b in zip(addresses, bodies)),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def aresync(self, address: str) -> None:
        """Give a server that rejoins the rotation the newest weights it missed.

        After a distributed update this is impossible without the trainer (a restarted server
        is not in the process group), so the server stays out rather than serve old weights
        under the current version.
        """
        last_disk_version = self._last_disk.version if self._last_disk is not None else None
        if self._last_distributed is not None and (
            last_disk_version is None or self._last_distributed.version > last_disk_version
        ):
            raise WeightUpdateError(
                f"cannot rejoin: weights version {self._last_distributed.version} came by broadcast, "
                "and a rejoining server must first be re-added to the weight-update group",
                address,
            )
        if self._last_disk is not None:  # the rejoiner was never paused: nothing of ours to keep
            await self._post(address, "/update_weights_from_disk", self._disk_body(self._last_disk, keep_requests=False))
