"""Reading the tensors of an HF model folder's safetensors files (trainer and built-in server).

safetensors 0.8's default (mmap) reader leaves about two Python ints per tensor alive on every
call, so a server that reads its checkpoint at each disk weight update grows by that much per
update; its pread reader keeps nothing but copies the file, several times slower than mmap from
the page cache. Files up to PREAD_MAX_BYTES (every small
model) are read with pread; larger ones, where the copy would cost more than the leak, with mmap.
"""

from __future__ import annotations

import inspect
import json
import os

import torch
from safetensors.torch import load_file

PREAD_MAX_BYTES = 256 << 20
_HAS_BACKEND = "backend" in inspect.signature(load_file).parameters  # safetensors >= 0.8


def read_hf_weights(path: str) -> dict[str, torch.Tensor]:
    """All tensors of the safetensors files in an HF model folder, by name."""
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    elif os.path.isfile(os.path.join(path, "model.safetensors")):
        files = ["model.safetensors"]
    else:
        raise FileNotFoundError(f"no model.safetensors or model.safetensors.index.json in {path!r}")
    out: dict[str, torch.Tensor] = {}
    for fname in files:
        out.update(read_safetensors(os.path.join(path, fname)))
    return out


def read_safetensors(file: str) -> dict[str, torch.Tensor]:
    """The tensors of one safetensors file (pread up to PREAD_MAX_BYTES, else mmap)."""
    small = _HAS_BACKEND and os.path.getsize(file) <= PREAD_MAX_BYTES
    return load_file(file, backend="pread") if small else load_file(file)
