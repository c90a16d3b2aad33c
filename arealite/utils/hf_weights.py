"""Reading the tensors of an HF model folder's safetensors files (trainer and built-in server)."""

from __future__ import annotations

import inspect
import json
import os

import torch
from safetensors.torch import load_file

# safetensors 0.8's default mmap backend leaves two Python ints per tensor alive on every call
# (a server reading its checkpoint at each weight update grows by that much per update); its
# pread backend reads the same tensors without. Versions before 0.8 have no `backend`.
_LOAD_KW = {"backend": "pread"} if "backend" in inspect.signature(load_file).parameters else {}


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
        out.update(load_file(os.path.join(path, fname), **_LOAD_KW))
    return out
