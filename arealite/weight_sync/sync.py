"""`WeightSync`: the trainer's weights to every server, as one object (docs/architecture.md §6).

    with WeightSync.from_config(config, actor, rollout) as weight_sync:  # collective
        weight_sync.sync(version)                                          # collective

`sync(version)`, on every trainer rank: write (disk/lora) -> pause -> servers load -> rank 0
checks every server in rotation reports `version` -> client and actor move to `version` ->
resume. It owns the order of these steps and the trainer's end of the transport; HTTP goes
through the rollout client (`arealite.rollout.weight_update`).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import typing
from collections.abc import Callable

from arealite import world
from arealite.config import GRPOConfig, WeightUpdateMode
from arealite.interfaces import TrainEngine, WeightSyncTarget
from arealite.stats import console
from arealite.types import WeightUpdateMeta
from arealite.utils import net
from arealite.weight_sync.buckets import WeightSpec, broadcast_buckets, weight_buckets
from arealite.weight_sync.distributed import Groups, broadcast_weights, ensure_group
from arealite.weight_sync.group import WeightBroadcastError

MODES = typing.get_args(WeightUpdateMode)


class WeightSync:
    """Moves `actor`'s weights to the servers of `rollout`; see the module docstring.

    `mode`: "disk" (an HF folder under `<run_dir>/weights/v<N>`, the newest `keep_versions`
    kept), "distributed" (broadcast over a process group; `backend` default nccl when the
    actor computes on CUDA, else gloo; buckets of at most `chunk_mb` MiB; the group may take
    `timeout` seconds to form and one broadcast may wait as long) or "lora" (only the actor's
    LoRA adapter, written like a disk version and loaded under a name per version).
    `on_bucket(i, bucket)` runs on rank 0 just before bucket i is broadcast (tests use it to
    fail a server mid-broadcast).
    """

    def __init__(
        self,
        actor: TrainEngine,
        rollout: WeightSyncTarget,
        mode: str = "disk",
        run_dir: str = "",
        keep_versions: int = 3,
        backend: str | None = None,
        chunk_mb: int = 256,
        on_bucket: Callable[[int, list[WeightSpec]], None] | None = None,
        timeout: float = WeightUpdateMeta.timeout,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"weight_update={mode!r} is not supported; use 'disk', 'distributed' or 'lora'")
        if mode != "distributed" and keep_versions < 1:
            raise ValueError(f"keep_versions={keep_versions} must be >= 1: the servers load the newest version")
        if (mode == "lora") != actor.has_lora:
            raise ValueError(
                f"weight_update={mode!r} does not fit the actor "
                f"({'a LoRA adapter' if actor.has_lora else 'no LoRA adapter'}); use weight_update=lora exactly "
                "when actor.lora is set"
            )
        if mode != "distributed" and not run_dir:
            raise ValueError(f"weight_update={mode!r} needs run_dir: the folder the servers read the weights from")
        self.actor, self.rollout, self.mode = actor, rollout, mode
        self.run_dir, self.keep_versions = run_dir, keep_versions
        self.on_bucket = on_bucket
        self._groups = Groups()
        self._meta: WeightUpdateMeta | None = None
        self.buckets: list[list[WeightSpec]] = []
        if mode == "distributed":
            self.buckets = weight_buckets(actor.model, actor.compute_dtype, chunk_mb)
            meta = WeightUpdateMeta(
                type="distributed",
                # servers on other hosts must reach rank 0: not loopback outside a launcher either
                master_address=os.environ.get("MASTER_ADDR") or net.host_address(),
                backend=backend or ("nccl" if actor.device.type == "cuda" else "gloo"),  # the trainer's device
                timeout=timeout,
                weight_chunk_mb=chunk_mb,
            )
            if world.is_main():
                meta = ensure_group(self._groups, rollout, meta)  # rebuilt when servers die or come back
            self._meta = meta

    @classmethod
    def from_config(cls, config: GRPOConfig, actor: TrainEngine, rollout: WeightSyncTarget) -> WeightSync:
        """As a GRPOConfig says: `weight_update`, `run_dir`, `weight_keep_versions` and
        `rollout.weight_update_timeout` (the servers' side of the same group reads it too)."""
        return cls(
            actor, rollout, config.weight_update, config.run_dir, config.weight_keep_versions,
            timeout=config.rollout.weight_update_timeout,
        )  # fmt: skip

    # ---- lifecycle -------------------------------------------------------------------------

    def close(self) -> None:
        """Drop the weight-update groups (rank 0's end); the servers' ends fail at once."""
        self._groups.close()

    def __enter__(self) -> WeightSync:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- one sync --------------------------------------------------------------------------

    def meta(self, version: int) -> WeightUpdateMeta:
        """What the servers are told for `version`."""
        if self.mode == "distributed":
            assert self._meta is not None
            return dataclasses.replace(self._meta, version=version, buckets=self.buckets)
        path = os.path.abspath(os.path.join(self.run_dir, "weights", f"v{version}"))
        meta = WeightUpdateMeta(type="disk", path=path, version=version, keep_versions=self.keep_versions)
        if self.mode == "lora":  # served as arealite-lora-v<version>
            meta = dataclasses.replace(meta, type="lora", lora_name=f"arealite-lora-v{version}")
        return meta

    def sync(self, version: int) -> dict[str, str]:
        """Push the actor's current weights to every server as `version`; collective over
        trainer ranks. Returns {server: version} as confirmed on rank 0 ({} elsewhere)."""
        meta = self.meta(version)
        rollout, barrier = self.rollout, world.barrier
        main = world.is_main()
        if meta.type in ("disk", "lora"):
            # Writing the files does not touch the servers, so they keep generating meanwhile;
            # they pause only while they load.
            self.actor.save(meta.path)  # rank 0 writes, then a barrier inside
            rollout.pause()
            barrier()  # every rank has stopped submitting before the servers load
            if main:
                rollout.update_weights(meta).result()
        else:
            rollout.pause()
            barrier()  # every rank has stopped submitting before weights move
            broadcast_weights(self._groups, rollout, meta, self._upload)  # a server that dies is excluded
        seen: dict[str, str] = {}
        if main:
            seen = rollout.confirm_version(version)  # a down server resyncs on rejoin
            console.event(f"[weight-sync] version {version} confirmed by {', '.join(sorted(seen))}")
            if meta.type in ("disk", "lora"):
                prune_weight_versions(os.path.dirname(meta.path), self.keep_versions, version)
        barrier()  # servers hold the new weights before anyone resumes
        if meta.type == "lora":
            rollout.set_lora_adapter(meta.lora_name)  # every rank's client asks for the new adapter
        rollout.set_version(version)
        self.actor.set_version(version)
        rollout.resume(wait=False)  # the trainer's next step need not wait for the servers' replies
        return seen

    def _upload(self, meta: WeightUpdateMeta) -> None:
        """Every rank gathers; rank 0 broadcasts over `meta.group_name` in the buckets' order.
        A failed broadcast drops the group and raises WeightBroadcastError on rank 0 once
        every rank is done gathering."""
        # The group is passed without keeping a reference here, so that on a failure dropping
        # it really closes it (see broadcast_buckets).
        failure = broadcast_buckets(
            self.actor.model, meta.buckets, self._groups.get(meta.group_name), self.on_bucket,
            on_failure=lambda: self._groups.destroy(meta.group_name),
        )  # fmt: skip
        world.barrier()
        if failure is not None:  # rank 0 only
            raise WeightBroadcastError(failure)


def prune_weight_versions(weights_dir: str, keep: int, current: int) -> list[str]:
    """Delete the `v<N>` folders under `weights_dir` but versions current-keep+1 .. current.

    Called only once every server confirmed `current`: then no server is loading an older
    folder (a server that rejoins is sent the newest), and folders above `current` are left
    over from a crashed attempt that this run will write again. Returns the deleted paths.
    """
    deleted = []
    for name in sorted(os.listdir(weights_dir)) if os.path.isdir(weights_dir) else []:
        if not (name.startswith("v") and name[1:].isdigit()):
            continue  # not ours
        if current - keep < int(name[1:]) <= current:
            continue
        path = os.path.join(weights_dir, name)
        shutil.rmtree(path, ignore_errors=True)
        deleted.append(path)
    return deleted
