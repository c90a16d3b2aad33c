"""Resumable training state: sharded model + optimizer (torch.distributed.checkpoint) and the
lr schedule, so a recovered run continues with the same Adam moments and learning rate.

The HF folder written by `FSDPEngine.save` is for serving and evaluation; this is for
recovery. Each rank writes its own shards; the folder must be shared by all ranks. Loading
works with the same number of ranks (DCP can also reshard to another number).

Frozen parameters are left out: they never change, so the model folder the engine was built
from already holds them. With LoRA the checkpoint is the adapter and its optimizer state.
"""

from __future__ import annotations

import os

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from arealite import world

_SCHEDULER_FILE = "scheduler.pt"
# strict=False: the frozen parameters left out are absent on load by design; a trained one
# missing from the files still fails, in dcp.load (it loads exactly the keys asked for).
_OPTIONS = StateDictOptions(ignore_frozen_params=True, strict=False)


def save_train_state(model: torch.nn.Module, optimizer, scheduler, path: str) -> None:
    """Write model, optimizer and scheduler state under `path`; collective."""
    model_sd, optim_sd = get_state_dict(model, optimizer, options=_OPTIONS)
    dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=path)
    if world.is_main() and scheduler is not None:
        torch.save(scheduler.state_dict(), os.path.join(path, _SCHEDULER_FILE))
    world.barrier()


def load_train_state(model: torch.nn.Module, optimizer, scheduler, path: str) -> None:
    """Restore what `save_train_state` wrote; collective."""
    if not os.path.isdir(path):
        raise FileNotFoundError(f"no training checkpoint at {path!r}")
    model_sd, optim_sd = get_state_dict(model, optimizer, options=_OPTIONS)
    state = {"model": model_sd, "optimizer": optim_sd}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"], options=_OPTIONS
    )
    sched_path = os.path.join(path, _SCHEDULER_FILE)
    if scheduler is not None and os.path.isfile(sched_path):
        scheduler.load_state_dict(torch.load(sched_path, weights_only=True))
