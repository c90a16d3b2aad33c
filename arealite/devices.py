"""Where the trainer runs, decided the same way by the launchers and by every trainer rank.

Torch-free on purpose: launchers read it before anything imports torch. A trainer rank
trains on GPU LOCAL_RANK when CUDA is usable, else on the CPU; `AREALITE_TRAIN_DEVICE=cpu`
keeps it on the CPU (gloo) even where GPUs are visible, which is how tests run more trainer
ranks than a machine has GPUs. Each GPU rank needs a GPU of its own: with fewer, the launch
is refused naming both numbers (CUDA itself would only say "invalid device ordinal").
"""

from __future__ import annotations

import os

DEVICE_ENV = "AREALITE_TRAIN_DEVICE"  # auto (default) | cpu | cuda
DEVICES = ("auto", "cpu", "cuda")


def requested_train_device() -> str:
    """`$AREALITE_TRAIN_DEVICE` (auto | cpu | cuda); ValueError naming it for anything else."""
    value = os.environ.get(DEVICE_ENV, "auto").strip().lower() or "auto"
    if value not in DEVICES:
        raise ValueError(f"{DEVICE_ENV}={value!r} is not supported; use one of {list(DEVICES)}")
    return value


def check_gpus_for_ranks(ranks: int, gpus: int) -> None:
    """Refuse `ranks` GPU trainer ranks on a node with `gpus` visible GPUs (each needs its own)."""
    if ranks > gpus:
        raise RuntimeError(
            f"{ranks} trainer ranks on this node but only {gpus} visible GPU(s): each rank needs a GPU of "
            f"its own. Set launcher.n_trainers={max(gpus, 1)} (or fewer), or {DEVICE_ENV}=cpu to train on "
            "the CPU with gloo"
        )
