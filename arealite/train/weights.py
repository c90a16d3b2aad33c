"""Full weights out of (and into) an FSDP2-sharded model: HF folders.

Buckets and broadcasts to the servers are the weight sync's (`arealite.weight_sync.buckets`).

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
from collections.abc import Iterator

import torch
from safetensors.torch import save_file
from torch.distributed.tensor import DTensor

from arealite import world
from arealite.weight_sync.buckets import full_tensor, unique_parameters

_SHARD_BYTES = 4 << 30  # HF-style shards of at most 4 GiB
_TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
    "added_tokens.json", "chat_template.jinja", "generation_config.json",
)  # fmt: skip


def iter_full_weights(model: torch.nn.Module, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, full tensor) for every parameter; collective over trainer ranks."""
    for name, p in unique_parameters(model):
        t = full_tensor(p.detach())
        yield name, (t if dtype is None else t.to(dtype))


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
            weight_map.update(dict.fromkeys(shard, fname))
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
