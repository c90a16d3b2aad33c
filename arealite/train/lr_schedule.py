"""Learning-rate schedules: linear warmup, then constant, linear or cosine decay to a floor."""

from __future__ import annotations

import math

import torch

from arealite.config import OptimizerConfig


def lr_factor(step: int, total_steps: int, warmup_steps: int, kind: str, min_lr_ratio: float) -> float:
    """Multiplier of the base lr at optimizer step `step` (0-based)."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if kind == "constant":
        return 1.0
    decay_steps = max(total_steps - warmup_steps, 1)
    progress = min(max(step - warmup_steps, 0) / decay_steps, 1.0)
    if kind == "linear":
        shape = 1.0 - progress
    elif kind == "cosine":
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    else:
        raise ValueError(f"lr_scheduler_type={kind!r} is not supported; use constant, linear or cosine")
    return min_lr_ratio + (1.0 - min_lr_ratio) * shape


def build_scheduler(
    optimizer: torch.optim.Optimizer, config: OptimizerConfig, total_steps: int | None
) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR following `config`; decaying schedules need `total_steps` (optimizer steps)."""
    if total_steps is None:
        if config.lr_scheduler_type != "constant" or config.warmup_steps_proportion > 0:
            raise ValueError(
                f"optimizer.lr_scheduler_type={config.lr_scheduler_type!r} with warmup_steps_proportion="
                f"{config.warmup_steps_proportion} needs the number of optimizer steps; pass total_optimizer_steps "
                "to the engine (the actor and critic: total_train_steps)"
            )
        total_steps = 1
    warmup = int(config.warmup_steps_proportion * total_steps)
    kind, floor = config.lr_scheduler_type, config.min_lr_ratio
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, total_steps, warmup, kind, floor))
