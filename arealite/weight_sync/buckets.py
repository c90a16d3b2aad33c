"""Parameters in size-bounded buckets, gathered on every trainer rank and broadcast from rank 0.

The distributed weight sync sends the servers one `/update_weights_from_distributed` call per
bucket (names, dtypes, shapes) while trainer rank 0 broadcasts that bucket's tensors over the
weight-update group (group.py), in exactly the listed order (docs/protocol.md §3.4).
Gathering is collective: every trainer rank runs `broadcast_buckets`, because each
parameter's `full_tensor()` all-gathers its shards.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from arealite import world
from arealite.weight_sync.group import broadcast

WeightSpec = tuple[str, str, list[int]]  # (name, torch dtype attribute name, shape)


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor behind `t`. A DTensor on a one-rank mesh already holds all of it
    locally, so it is returned without the all-gather (a view: callers copy before writing)."""
    if not isinstance(t, DTensor):
        return t
    if t.device_mesh.size() == 1:
        return t.to_local()
    return t.full_tensor()


def unique_parameters(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """(name, parameter) in registration order, tied parameters once."""
    return list(model.named_parameters(remove_duplicate=True))


def weight_buckets(model: torch.nn.Module, dtype: torch.dtype, chunk_mb: int) -> list[list[WeightSpec]]:
    """Parameters grouped, in order, into buckets of at most `chunk_mb` MiB in `dtype`.

    A parameter larger than the bound gets a bucket of its own. Needs no communication.
    """
    if chunk_mb <= 0:
        raise ValueError(f"weight_chunk_mb={chunk_mb} must be > 0")
    limit = chunk_mb << 20
    itemsize = torch.empty((), dtype=dtype).element_size()
    dtype_name = str(dtype).removeprefix("torch.")
    buckets: list[list[WeightSpec]] = []
    size = 0
    for name, p in unique_parameters(model):
        nbytes = p.numel() * itemsize  # p.numel() of a DTensor is the global size
        if not buckets or (size + nbytes > limit and buckets[-1]):
            buckets.append([])
            size = 0
        buckets[-1].append((name, dtype_name, list(p.shape)))
        size += nbytes
    return buckets


def broadcast_buckets(
    model: torch.nn.Module,
    buckets: list[list[WeightSpec]],
    group: dist.ProcessGroup | None,
    on_bucket=None,
    on_failure=None,
) -> str | None:
    """Gather each parameter (all ranks) and broadcast it from trainer rank 0 over `group`.

    Order: bucket by bucket, entry by entry, exactly as listed, matching the servers'
    receive loop for `/update_weights_from_distributed`. `on_bucket(index, bucket)` runs on
    rank 0 before a bucket's first broadcast (e.g. to send that bucket's HTTP request).

    A failed broadcast (a server died or timed out) does not stop the gathers, which are
    collective: rank 0 stops broadcasting, calls `on_failure()` (to drop the group, which
    fails the other servers' receives at once) and returns the error text; else None.
    """
    params = dict(unique_parameters(model))
    for name, _, shape in (spec for bucket in buckets for spec in bucket):
        if name not in params or list(params[name].shape) != [int(d) for d in shape]:
            got = list(params[name].shape) if name in params else "no such parameter"
            raise ValueError(
                f"bucket entry {name!r} with shape {list(shape)} does not match the model ({got}); "
                "build buckets with weight_buckets(actor.model, ...)"
            )
    main = world.is_main()
    failure = None if group is not None or not main else "no weight-update group on rank 0 (WeightSync forms it)"
    for i, bucket in enumerate(buckets):
        if main and on_bucket is not None and failure is None:
            on_bucket(i, bucket)
        for name, dtype_name, _ in bucket:
            t = full_tensor(params[name].detach()).to(getattr(torch, dtype_name))
            if main and failure is None:
                if _is_gloo(group):
                    t = t.cpu()
                try:
                    broadcast(group, t.contiguous(), src=0)
                except RuntimeError as e:  # kept as text: the exception's frames would keep the group alive
                    failure = f"broadcast of {name!r} (bucket {i}) failed: {str(e).strip().splitlines()[0]}"
                if failure is not None:
                    group = None
                    if on_failure is not None:
                        on_failure()
    return failure


def _is_gloo(group: dist.ProcessGroup) -> bool:
    return isinstance(group, dist.ProcessGroupGloo)
