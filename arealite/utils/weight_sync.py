"""The one-call weight sync: (write) -> pause -> load -> resume, with the version bumped on both sides.

Every trainer rank calls `sync_weights` (it is collective). Rank 0 drives the servers' HTTP
calls; the actor moves the tensors (disk: HF safetensors written by rank 0; distributed:
rank 0 broadcasts buckets over a group the servers joined). Duck-typed on purpose: this
module imports neither the rollout client nor the trainer.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Callable

from arealite.types import WeightUpdateMeta
from arealite.utils.distributed_sync import broadcast_weights, ensure_group


def init_weight_update(
    actor, rollout, kind: str, run_dir: str, rank: int, keep_versions: int = 3, backend: str | None = None
) -> Callable[[int], WeightUpdateMeta]:
    """Set up the weight transport once (collective); returns `meta_for(version)`.

    `kind="disk"`: HF safetensors under `<run_dir>/weights/v<N>`, of which the newest
    `keep_versions` stay on disk (`prune_weight_versions`). `kind="distributed"`: every
    server joins a process group with the trainer's rank 0 (which hosts it on MASTER_ADDR and
    a free port) and receives broadcasts; no files are written. A server that dies in it is
    excluded and the group rebuilt (arealite.utils.distributed_sync). `backend`: the group's,
    default nccl on CUDA (one GPU per rank), else gloo. `kind="lora"`: only the actor's LoRA
    adapter, written like a disk version (a peft folder) and loaded by the servers' LoRA
    endpoints under a name per version (`lora_update_meta`).
    """
    if kind in ("disk", "lora"):
        if keep_versions < 1:
            raise ValueError(f"keep_versions={keep_versions} must be >= 1: the servers load the newest version")
        make = disk_update_meta if kind == "disk" else lora_update_meta
        return lambda version: make(run_dir, version, keep_versions)
    if kind != "distributed":
        raise ValueError(f"weight_update={kind!r} is not supported; use 'disk', 'distributed' or 'lora'")
    meta = WeightUpdateMeta(
        type="distributed",
        master_address=os.environ.get("MASTER_ADDR", "127.0.0.1"),
        backend=backend or ("nccl" if actor.device.type == "cuda" else "gloo"),  # the trainer's device, not CUDA's presence
        timeout=rollout.config.weight_update_timeout,
    )
    meta = dataclasses.replace(meta, buckets=actor.weight_buckets(meta))
    if rank == 0:
        meta = ensure_group(actor, rollout, meta)  # the first group; rebuilt when servers die or come back
    return lambda version: dataclasses.replace(meta, version=version)


def disk_update_meta(run_dir: str, version: int, keep_versions: int = 0) -> WeightUpdateMeta:
    """Weights go through `<run_dir>/weights/v<version>` (a folder every server can read)."""
    path = os.path.abspath(os.path.join(run_dir, "weights", f"v{version}"))
    return WeightUpdateMeta(type="disk", path=path, version=version, keep_versions=keep_versions)


def lora_update_meta(run_dir: str, version: int, keep_versions: int = 0) -> WeightUpdateMeta:
    """The adapter goes through `<run_dir>/weights/v<version>` and is served as `arealite-lora-v<version>`."""
    meta = disk_update_meta(run_dir, version, keep_versions)
    return dataclasses.replace(meta, type="lora", lora_name=f"arealite-lora-v{version}")


def prune_weight_versions(weights_dir: str, keep: int, current: int) -> list[str]:
    """Delete the `v<N>` folders under `weights_dir` but versions current-keep+1 .. current.

    Call it only once every server confirmed `current`: then no server is loading an older
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


def sync_weights(actor, rollout, meta: WeightUpdateMeta, rank: int, barrier) -> None:
    """Push the actor's current weights to every server as version `meta.version`.

    `barrier` is a callable that synchronises the trainer ranks (e.g. torch.distributed.barrier).
    """
    if meta.type in ("disk", "lora"):
        # Writing the files does not touch the servers, so they keep generating meanwhile;
        # they pause only while they load.
        actor.upload_weights(meta)  # rank 0 writes, then a barrier inside
        rollout.pause()
        barrier()  # every rank has stopped submitting before the servers load
        if rank == 0:
            rollout.update_weights(meta).result()
    else:
        rollout.pause()
        barrier()  # every rank has stopped submitting before weights move
        if not meta.buckets:
            meta = dataclasses.replace(meta, buckets=actor.weight_buckets(meta))
        broadcast_weights(actor, rollout, meta, rank)  # a server that dies meanwhile is excluded
    if rank == 0:
        confirm_server_versions(rollout, meta.version)  # a down server resyncs on rejoin
        if meta.type in ("disk", "lora") and meta.keep_versions > 0:
            prune_weight_versions(os.path.dirname(meta.path), meta.keep_versions, meta.version)
    barrier()  # servers hold the new weights before anyone resumes
    if meta.type == "lora":
        rollout.set_lora_adapter(meta.lora_name)  # every rank's client asks for the new adapter
    rollout.set_version(meta.version)
    actor.set_version(meta.version)
    rollout.resume()


def confirm_server_versions(rollout, version: int) -> dict[str, str]:
    """Check that every server in rotation reports `weight_version == version`.

    A server that accepted the upload but serves another version would silently poison the
    next batch, so a mismatch raises; one that died meanwhile leaves the rotation. Waits at
    most rollout.control_timeout per server. Prints one confirmation line (the trainer log).
    """
    seen = rollout.confirm_version(version)
    print(f"[weight-sync] version {version} confirmed by {', '.join(sorted(seen))}", flush=True)
    return seen
