"""Re-dealing a batch over the trainer ranks so that each trains on about the same tokens.

Rollouts land unevenly: one rank's batch may hold the long answers. Before an update every
rank's sequences are gathered and dealt again by token count (largest first to the lightest
rank). The loss is normalized over all tokens of all ranks, so the update does not depend
on which rank trains which sequence — only the wall time does.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from arealite import world
from arealite.data.packing import Batch, balanced_partition, concat, select, seqlens_of


def balance_across_ranks(batch: Batch) -> Batch:
    """This rank's share of all ranks' sequences, balanced by tokens; collective.

    Every rank must pass a batch with the same keys. Returns `batch` itself on one rank.
    Raises ValueError when there are fewer sequences in total than ranks.
    """
    n_ranks = world.world_size()
    if n_ranks == 1:
        return batch
    local = {k: v.detach().cpu() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    gathered: list[Batch | None] = [None] * n_ranks
    dist.all_gather_object(gathered, local)
    merged = concat([b for b in gathered if b is not None])
    lens = seqlens_of(merged["attention_mask"]).tolist()
    if len(lens) < n_ranks:
        raise ValueError(f"{len(lens)} sequences over all ranks cannot feed {n_ranks} trainer ranks")
    share = balanced_partition(lens, n_ranks)[world.rank()]
    return select(merged, share)


# The default process group, when an engine started it (a notebook, a plain script), ends with
# the last engine destroyed, so a `with` block leaves no group behind; one that was up before
# (torchrun's, or the caller's init_distributed()) is never ended here.
_group = {"engines": 0, "started_by_engine": False}


def join_process_group() -> None:
    if not world.is_initialized():
        world.init_distributed()
        _group["started_by_engine"] = True
    _group["engines"] += 1


def leave_process_group() -> None:
    _group["engines"] -= 1
    if _group["engines"] == 0 and _group["started_by_engine"]:
        _group["started_by_engine"] = False
        world.destroy_distributed()
