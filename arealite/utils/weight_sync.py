"""The one-call weight sync: pause -> upload -> resume, with the version bumped on both sides.

Every trainer rank calls `sync_weights` (it is collective). Rank 0 drives the servers' HTTP
calls; the actor moves the tensors (disk: HF safetensors written by rank 0; distributed:
rank 0 broadcasts buckets over a group the servers joined). Duck-typed on purpose: this
module imports neither the rollout client nor the trainer.
"""

from __future__ import annotations

import dataclasses
import os

from arealite.types import WeightUpdateMeta


def disk_update_meta(run_dir: str, version: int) -> WeightUpdateMeta:
    """Weights go through `<run_dir>/weights/v<version>` (a folder every server can read)."""
    return WeightUpdateMeta(type="disk", path=os.path.abspath(os.path.join(run_dir, "weights", f"v{version}")), version=version)


def sync_weights(actor, rollout, meta: WeightUpdateMeta, rank: int, barrier) -> None:
    """Push the actor's current weights to every server as version `meta.version`.

    `barrier` is a callable that synchronises the trainer ranks (e.g. torch.distributed.barrier).
    """
    rollout.pause()
    barrier()  # every rank has stopped submitting before weights move
    if meta.type == "disk":
        actor.upload_weights(meta)  # rank 0 writes, then a barrier inside
        if rank == 0:
            rollout.update_weights(meta).result()
    else:
        meta = dataclasses.replace(meta, buckets=actor.weight_buckets(meta)) if hasattr(meta, "buckets") else meta
        future = rollout.update_weights(meta) if rank == 0 else None
        actor.upload_weights(meta)  # rank 0 broadcasts while the servers receive
        if future is not None:
            future.result()
    barrier()  # servers hold the new weights before anyone resumes
    rollout.set_version(meta.version)
    actor.set_version(meta.version)
    rollout.resume()
