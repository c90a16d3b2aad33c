"""The one-call weight sync: (write) -> pause -> load -> resume, with the version bumped on both sides.

Every trainer rank calls `sync_weights` (it is collective). Rank 0 drives the servers' HTTP
calls; the actor moves the tensors (disk: HF safetensors written by rank 0; distributed:
rank 0 broadcasts buckets over a group the servers joined). Duck-typed on purpose: this
module imports neither the rollout client nor the trainer.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

from arealite.types import WeightUpdateMeta
from arealite.utils.distributed_sync import broadcast_weights, ensure_group


def init_weight_update(
    actor, rollout, kind: str, run_dir: str, rank: int, backend: str | None = None
) -> Callable[[int], WeightUpdateMeta]:
    """Set up the weight transport once (collective); returns `meta_for(version)`.

    `kind="disk"`: HF safetensors under `<run_dir>/weights/v<N>`. `kind="distributed"`: every
    server joins a process group with the trainer's rank 0 (which hosts it on MASTER_ADDR and
    a free port) and receives broadcasts; no files are written. A server that dies in it is
    excluded and the group rebuilt (arealite.utils.distributed_sync). `backend`: the group's,
    default nccl on CUDA (one GPU per rank), else gloo.
    """
    if kind == "disk":
        return lambda version: disk_update_meta(run_dir, version)
    if kind != "distributed":
        raise ValueError(f"weight_update={kind!r} is not supported; use 'disk' or 'distributed'")
    import torch

    meta = WeightUpdateMeta(
        type="distributed",
        master_address=os.environ.get("MASTER_ADDR", "127.0.0.1"),
        backend=backend or ("nccl" if torch.cuda.is_available() else "gloo"),
        timeout=rollout.config.weight_update_timeout,
    )
    meta = dataclasses.replace(meta, buckets=actor.weight_buckets(meta))
    if rank == 0:
        meta = ensure_group(actor, rollout, meta)  # the first group; rebuilt when servers die or come back
    return lambda version: dataclasses.replace(meta, version=version)


def disk_update_meta(run_dir: str, version: int) -> WeightUpdateMeta:
    """Weights go through `<run_dir>/weights/v<version>` (a folder every server can read)."""
    return WeightUpdateMeta(type="disk", path=os.path.abspath(os.path.join(run_dir, "weights", f"v{version}")), version=version)


def sync_weights(actor, rollout, meta: WeightUpdateMeta, rank: int, barrier) -> None:
    """Push the actor's current weights to every server as version `meta.version`.

    `barrier` is a callable that synchronises the trainer ranks (e.g. torch.distributed.barrier).
    """
    if meta.type == "disk":
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
    barrier()  # servers hold the new weights before anyone resumes
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
