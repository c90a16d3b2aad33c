"""Re-run one step's update offline, from the rollout dump and the run's checkpoint: no servers.

    python -m arealite.replay DUMP_DIR --step N [--run-dir RUN_DIR]

The way to debug a bad step (a loss spike, a NaN, a grad-norm jump): the run wrote every
trained batch with `rollout.dump_dir=DUMP_DIR`; this rebuilds the actor at the weights and
optimizer state it had before step N and runs `ppo_update` on step N's dumped batch, so the
step can be stepped through in a debugger or printed from, at will. It starts from the newest
checkpoint of the run (`<run_dir>/checkpoints/step_K`, K < N) and first replays the dumped
batches of steps K+1..N-1 (from `actor.path`, step 0, without a checkpoint): keep
`rollout.dump_keep_steps >= recover.freq_steps` to always be able to. The last line compares
with the loss and grad norm logged for step N in `stats.jsonl`:

    replay_loss_rel_diff=<x> replay_grad_norm_rel_diff=<y>

A trainer of R ranks is replayed by R ranks: `torchrun --nproc_per_node R -m arealite.replay ...`.
On the CPU it runs with the trainer's thread count (`launcher.cpus_per_trainer`, unless
OMP_NUM_THREADS is set), so reductions add in the same order and the numbers match exactly.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import torch

from arealite.replay.dump import dumped_steps, read_batch, read_meta


def starting_point(run_dir: str, step: int) -> tuple[int, str | None]:
    """(first step to replay, the checkpoint folder holding the state before it or None: actor.path)."""
    from arealite.recover import verify_checkpoint

    root = os.path.join(run_dir, "checkpoints")
    saved = []
    if os.path.isdir(root):
        saved = sorted(
            (int(d[5:]) for d in os.listdir(root) if d.startswith("step_") and d[5:].isdigit()), reverse=True
        )
    for k in saved:
        if k < step and verify_checkpoint(os.path.join(root, f"step_{k}")) is None:
            return k + 1, os.path.join(root, f"step_{k}")
    return 0, None


def logged_update(run_dir: str, step: int, meta: dict[str, Any]) -> dict[str, float]:
    """Step `step`'s row of `<run_dir>/stats.jsonl` (what the run logged), else the dump's own record."""
    path = os.path.join(run_dir, "stats.jsonl")
    if os.path.isfile(path):
        with open(path) as f:
            for line in f:
                row = json.loads(line) if line.strip() else {}
                if row.get("step") == step and "loss" in row:
                    return row
    return meta["update_stats"]


def rel_diff(value: float, reference: float) -> float:
    return abs(value - reference) / max(abs(reference), 1e-30)


def replay(dump_dir: str, step: int, run_dir: str | None = None) -> dict[str, float]:
    """Replay step `step`; returns its update stats and the relative diffs."""
    from arealite import world
    from arealite.config import GRPOConfig, load_config
    from arealite.train.actor import PPOActor

    meta = read_meta(dump_dir, step)
    run_dir = run_dir or meta["run_dir"]
    config = load_config(["--config", os.path.join(run_dir, "config.yaml")], GRPOConfig, script_sections=True)
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(config.launcher.cpus_per_trainer)
    rank, world_size = world.init_distributed(timeout=config.dist_timeout)
    if world_size != meta["world_size"]:
        raise SystemExit(
            f"step {step} was trained by {meta['world_size']} ranks; replay it with as many: "
            f"torchrun --nproc_per_node {meta['world_size']} -m arealite.replay {dump_dir} --step {step}"
        )
    first, checkpoint = starting_point(run_dir, step)
    missing = [s for s in range(first, step) if s not in dumped_steps(dump_dir)]
    if missing:
        raise SystemExit(
            f"replaying step {step} starts at step {first} ({checkpoint or 'actor.path, no checkpoint before it'}) "
            f"but steps {missing} are not in {dump_dir}; keep more (rollout.dump_keep_steps) or checkpoint more often "
            "(recover.freq_steps)"
        )
    with PPOActor(config.actor, config.gconfig, config.total_train_steps) as actor:
        if checkpoint is not None:
            actor.load_checkpoint(os.path.join(checkpoint, "train_state"))
        for s in range(first, step + 1):
            stats = actor.ppo_update(read_batch(dump_dir, s, rank))
            if rank == 0:
                print(f"[replay] step {s}: loss={stats['loss']!r} grad_norm={stats['grad_norm']!r}", flush=True)
    logged = logged_update(run_dir, step, meta)
    out = dict(stats)
    out["replay_loss_rel_diff"] = rel_diff(out["loss"], logged["loss"])
    out["replay_grad_norm_rel_diff"] = rel_diff(out["grad_norm"], logged["grad_norm"])
    return out


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m arealite.replay", description=__doc__.split("\n\n")[0])
    parser.add_argument("dump_dir", help="the run's rollout.dump_dir")
    parser.add_argument("--step", type=int, required=True, help="the step to replay")
    parser.add_argument("--run-dir", default=None, help="the run directory (default: the one the dump names)")
    args = parser.parse_args(argv)
    out = replay(args.dump_dir, args.step, args.run_dir)
    from arealite import world

    if world.rank() == 0:
        print(
            f"replay_loss_rel_diff={out['replay_loss_rel_diff']:.3e} "
            f"replay_grad_norm_rel_diff={out['replay_grad_norm_rel_diff']:.3e}",
            flush=True,
        )


if __name__ == "__main__":
    main(sys.argv[1:])
