"""Stand-alone process groups for weight transfer between a trainer and inference servers.

A weight-update group is separate from the trainer's default group: the trainer's rank 0
(rank 0 here, the broadcast source) and every server (ranks `rank_offset ...`) meet through
a TCPStore hosted by rank 0 at `master_address:master_port`. No default process group is
needed, so a server process can join without torchrun. Same contract as SGLang's
`/init_weights_update_group` (docs/protocol.md §3.3).

`timeout` bounds forming the group and every collective on it (gloo: each send/receive;
NCCL: its watchdog). A group whose collective failed is unusable; dropping the last
reference to it closes its connections, which fails the other members' pending receives at
once (`abort()`/`shutdown()` do not, on gloo).
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

# A group's TCPStore must outlive the group; keyed by group name.
_STORES: dict[str, dist.TCPStore] = {}


def init_custom_process_group(
    backend: str,
    master_address: str,
    master_port: int,
    rank: int,
    world_size: int,
    group_name: str,
    timeout: float = 300.0,
) -> dist.ProcessGroup:
    """Create a process group of `world_size` ranks; blocks until all ranks have joined."""
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend={backend!r} is not supported for weight updates; use 'gloo' or 'nccl'")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} is outside world_size={world_size}")
    store = dist.TCPStore(
        master_address, int(master_port), world_size, is_master=(rank == 0), timeout=timedelta(seconds=timeout)
    )
    prefixed = dist.PrefixStore(group_name, store)
    if backend == "gloo":
        pg = dist.ProcessGroupGloo(prefixed, rank, world_size, timedelta(seconds=timeout))
    else:
        # The NCCL watchdog aborts a collective stuck past the timeout (a dead peer never answers).
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timedelta(seconds=timeout)
        pg = dist.ProcessGroupNCCL(prefixed, rank, world_size, options)
    _STORES[group_name] = store
    return pg


def broadcast(pg: dist.ProcessGroup, tensor: torch.Tensor, src: int = 0) -> None:
    """Broadcast `tensor` in place from rank `src` of `pg`."""
    opts = dist.BroadcastOptions()
    opts.rootRank = src
    pg.broadcast([tensor], opts).wait()


class WeightBroadcastError(RuntimeError):
    """A broadcast to the servers failed on the trainer's rank 0 (a member died or timed out)."""


def release_store(group_name: str) -> None:
    """Drop the store of a destroyed group (after the group itself is gone)."""
    _STORES.pop(group_name, None)
