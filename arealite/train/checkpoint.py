"""Resumable training state: sharded model + optimizer (torch.distributed.checkpoint) and the
lr schedule, so a recovered run continues with the same Adam moments and learning rate.

The HF folder written by `FSDPEngine.save` is for serving and evaluation; this is for
recovery. Each rank writes its own shards; the folder must be shared by all ranks. Loading
works with the same number of ranks (DCP can also reshard to another number).
"""

from __future__ import annotations

import os

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from arealite import distributed as dist_utils

_SCHEDULER_FILE = "scheduler.pt"


def save_train_state(model: torch.nn.Module, optimizer, scheduler, path: str) -> None:
    """Write model, optimizer and scheduler state under `path`; collective."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=path)
    if dist_utils.is_main() and scheduler is not None:
        torch.save(scheduler.state_dict(), os.path.join(path, _SCHEDULER_FILE))
    dist_utils.barrier()


def load_train_state(model: torch.nn.Module, optimizer, scheduler, path: str) -> None:
    """Restore what `save_train_state` wrote; collective."""
    if not os.path.isdir(path):
        raise FileNotFoundError(f"no training checkpoint at {path!r}")
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optimizer": optim_sd}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    sched_path = os.path.join(path, _SCHEDULER_FILE)
    if scheduler is not None and os.path.isfile(sched_path):
        scheduler.load_state_dict(torch.load(sched_path, weights_only=True))
