"""One timed step of the examples/gsm8k_grpo.py loop, shared by vs_trl.py and async_speedup.py."""

from __future__ import annotations

import time
from typing import Any, Iterator

from arealite.utils.weight_sync import disk_update_meta, sync_weights


def timed_grpo_step(
    step: int, rollout: Any, actor: Any, workflow: Any, loader: Any, data_iter: Iterator, workdir: str, rank: int, barrier: Any
) -> tuple[dict, list[float]]:
    """rollout -> advantages -> PPO update -> disk weight sync to version step + 1.

    Asynchronous (`prepare_batch`) when the engine's max_head_offpolicyness > 0, else the
    next item of `data_iter` through `rollout_batch`. Returns the batch and the seconds of
    [rollout, train, weight sync].
    """
    start = time.perf_counter()
    if rollout.config.max_head_offpolicyness > 0:
        batch = rollout.prepare_batch(loader, workflow)
    else:
        batch = rollout.rollout_batch(next(data_iter), workflow)
    t_rollout = time.perf_counter()
    actor.compute_advantages(batch)  # prox_logp comes from the update's own forward (one minibatch)
    actor.ppo_update(batch)
    t_train = time.perf_counter()
    sync_weights(actor, rollout, disk_update_meta(workdir, step + 1), rank, barrier)
    return batch, [t_rollout - start, t_train - t_rollout, time.perf_counter() - t_train]
