"""Full weights out of (and into) an FSDP2-sharded model: HF folders, buckets, broadcasts.

Gathering is collective: every trainer rank must call these functions in the same order,
because each parameter's `full_tensor()` all-gathers its shards. Only rank 0 writes files or
broadcasts to the servers.

Weight names are the model's parameter names (`model.layers.0.self_attn.q_proj.weight`),
with tied parameters listed once (under their first name), which is what HF loaders and
SGLang's `load_weights` expect.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Iterator

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch.distributed.tensor import DTensor

from arealite import world
from arealite.utils.process_group import broadcast

WeightSpec = tuple[str, str, list[int]]  # (name, torch dtype attribute name, shape)
_SHARD_BYTES = 4 << 30  # HF-style shards of at most 4 GiB
_TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
    "added_tokens.json", "chat_template.jinja", "generation_config.json",
)  # fmt: skip


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def unique_parameters(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """(name, parameter) in registration order, tied parameters once."""
    return list(model.named_parameters(remove_duplicate=True))


def iter_full_weights(model: torch.nn.Module, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, full tensor) for every parameter; collective over trainer ranks."""
    for name, p in unique_parameters(model):
        t = _full(p.detach())
        yield name, (t if dtype is None else t.to(dtype))


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
            raise ValueError(f"bucket entry {name!r} with shape {list(shape)} does not match the model ({got}); "
                             "build buckets with actor.weight_buckets(meta)")
    main = world.is_main()
    failure = None if group is not None or not main else "no weight-update group: call init_weight_update_group(meta, world_size) on rank 0 first"
    for i, bucket in enumerate(buckets):
        if main and on_bucket is not None and failure is None:
            on_bucket(i, bucket)
        for name, dtype_name, _ in bucket:
            t = _full(params[name].detach()).to(getattr(torch, dtype_name))
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


def save_hf(model: torch.nn.Module, hf_config, path: str, source_path: str | None = None) -> None:
    """Write an HF model folder (config + safetensors shards); collective, rank 0 writes.

    Tokenizer and generation files are copied from `source_path` when present, so the
    folder is a complete model that a server can load.
    """
    main = world.is_main()
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in iter_full_weights(model):
        if not main:
            continue
        t = t.detach().cpu().contiguous()
        if size + t.nbytes > _SHARD_BYTES and shards[-1]:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += t.nbytes
    if main:
        _write_folder(shards, hf_config, path, source_path)
    world.barrier()


def _write_folder(shards: list[dict[str, torch.Tensor]], hf_config, path: str, source_path: str | None) -> None:
    os.makedirs(path, exist_ok=True)
    if len(shards) == 1:
        save_file(shards[0], os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    else:
        weight_map = {}
        for i, shard in enumerate(shards):
            fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, os.path.join(path, fname), metadata={"format": "pt"})
            weight_map.update({k: fname for k in shard})
        total = sum(t.nbytes for s in shards for t in s.values())
        with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    hf_config.save_pretrained(path)
    if source_path and os.path.abspath(source_path) != os.path.abspath(path):
        for fname in _TOKENIZER_FILES:
            src = os.path.join(source_path, fname)
            if os.path.isfile(src):
                shutil.copyfile(src, os.path.join(path, fname))


def load_full_weights(model: torch.nn.Module, weights: dict[str, torch.Tensor], strict: bool = True) -> None:
    """Copy full tensors into the (sharded) parameters; every parameter must be present
    (`strict=False`: only those in `weights`, e.g. a LoRA adapter's)."""
    missing = [n for n, _ in unique_parameters(model) if n not in weights]
    if missing and strict:
        raise KeyError(f"the checkpoint lacks {len(missing)} parameters, e.g. {missing[:3]}")
    with torch.no_grad():
        for name, p in unique_parameters(model):
            if name not in weights:
                continue
            src = weights[name].to(dtype=p.dtype)
            if isinstance(p, DTensor):
                src = torch.distributed.tensor.distribute_tensor(
                    src.to(p.device), p.device_mesh, p.placements, src_data_rank=None
                )
                p.to_local().copy_(src.to_local())
            else:
                p.copy_(src.to(p.device))
