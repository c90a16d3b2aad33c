"""LoRA on the train engine: peft adapters injected before sharding, saved as peft folders.

`apply_lora(model, config)` puts a low-rank adapter on every linear layer named in
`config.target_modules` (peft's `inject_adapter_in_model`: the model keeps its class and
parameter names, the base weights are frozen) and must run before FSDP2 shards the model,
so the adapter's matrices are sharded with their layer. Only adapter parameters require
gradients, so the optimizer (and its Adam moments) holds only them.

`save_adapter` writes what `PeftModel.from_pretrained` and SGLang's `/load_lora_adapter`
read: `adapter_config.json` and `adapter_model.safetensors` with peft's tensor names
(`base_model.model.<module>.lora_A.weight`). Gathering is collective; rank 0 writes.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from safetensors.torch import save_file

from arealite import world
from arealite.config import LoRAConfig
from arealite.weight_sync.buckets import full_tensor

ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
_ADAPTER = "default"  # peft's name for the (only) adapter
_PREFIX = "base_model.model."  # peft's saved names start with the PeftModel wrapper's path


def require_peft() -> Any:
    """The peft module, or an ImportError that says how to install it."""
    try:
        import peft
    except ImportError as e:
        raise ImportError(
            "actor.lora needs the peft package: pip install 'arealite[lora]' (or pip install peft)"
        ) from e
    return peft


def peft_config(config: LoRAConfig, base_model_path: str = "") -> Any:
    """`config` as a peft `LoraConfig` (what adapter_config.json holds)."""
    peft = require_peft()
    return peft.LoraConfig(
        r=config.rank,
        lora_alpha=config.alpha,
        lora_dropout=config.dropout,
        target_modules=list(config.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
        base_model_name_or_path=base_model_path or None,
    )


def apply_lora(model: torch.nn.Module, config: LoRAConfig) -> torch.nn.Module:
    """Inject the adapter into `model` in place (before sharding); base weights frozen."""
    peft = require_peft()
    names = {name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    missing = sorted(set(config.target_modules) - names)
    if missing:
        # peft accepts a partial match silently; a misspelt layer name would train nothing there
        raise ValueError(
            f"actor.lora.target_modules names {missing}, which {type(model).__name__} has no linear layer "
            f"called; its linear layers are {sorted(names)}"
        )
    # lora_A is drawn from a generator seeded by `config.seed` alone (the process's state is kept)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed or 0)
        model = peft.inject_adapter_in_model(peft_config(config), model, adapter_name=_ADAPTER)
    for name, p in model.named_parameters():
        p.requires_grad_(is_adapter_parameter(name))
    return model


def is_adapter_parameter(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def saved_name(name: str) -> str:
    """A model parameter's name -> peft's saved name (`...q_proj.lora_A.default.weight` ->
    `base_model.model....q_proj.lora_A.weight`)."""
    for part in ("lora_A", "lora_B"):
        name = name.replace(f".{part}.{_ADAPTER}.", f".{part}.")
    return _PREFIX + name


def adapter_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """{peft saved name: full tensor (CPU)} of the adapter; collective (every rank gathers).
    On one CPU rank the tensors are the live parameters (see `full_tensor`): write them out at once."""
    out = {}
    for name, p in model.named_parameters():
        if is_adapter_parameter(name):
            out[saved_name(name)] = full_tensor(p.detach()).cpu().contiguous()
    return out


def save_adapter(model: torch.nn.Module, config: LoRAConfig, path: str, base_model_path: str = "") -> None:
    """Write the adapter as a peft folder; collective, rank 0 writes."""
    tensors = adapter_tensors(model)
    if world.is_main():
        os.makedirs(path, exist_ok=True)
        save_file(tensors, os.path.join(path, ADAPTER_WEIGHTS), metadata={"format": "pt"})
        peft_config(config, base_model_path).save_pretrained(path)
    world.barrier()


def read_adapter(path: str) -> dict[str, torch.Tensor]:
    """{peft saved name: tensor} of a peft adapter folder."""
    from arealite.utils.hf_weights import read_safetensors

    file = os.path.join(path, ADAPTER_WEIGHTS)
    if not os.path.isfile(file):
        raise FileNotFoundError(f"{path!r} holds no {ADAPTER_WEIGHTS}; is it a peft adapter folder (save_adapter)?")
    return read_safetensors(file)


def load_adapter(model: torch.nn.Module, path: str) -> None:
    """Copy a saved adapter into the (sharded) model's adapter parameters; every one must be there."""
    from arealite.train.weights import load_full_weights

    saved = read_adapter(path)
    params = {name: saved_name(name) for name, _ in model.named_parameters() if is_adapter_parameter(name)}
    missing = sorted(set(params.values()) - set(saved))
    if missing:
        raise KeyError(
            f"the adapter at {path!r} lacks {len(missing)} tensors of this model, e.g. {missing[:3]}; "
            "was it saved with the same actor.lora.target_modules?"
        )
    load_full_weights(model, {name: saved[key] for name, key in params.items()}, strict=False)
