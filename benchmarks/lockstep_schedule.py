"""The lockstep asynchronous schedule vs the interruptible one: same k, same samples, same cores.

    PYTHONPATH=. python benchmarks/lockstep_schedule.py [--steps 24] [--repeats 3] [--offpolicyness 1] \
        [--batch-size 4] [--group-size 4] [--max-new-tokens 192] [--no-split] [--smoke]

Both train `--steps` steps of `--batch-size` arithmetic prompts x `--group-size` samples from
the same initial weights with the decoupled loss, k = `--offpolicyness`, on the processes and
CPUs of async_speedup.py (a built-in server and a trainer, 1 torch thread each, the server on
its own CPU with the default `--split`; disk weight sync every step):

- interruptible: `prepare_batch` (AReaL's schedule): episodes start within the staleness
  bound, and each weight sync pauses the server in place mid-generation.
- lockstep: `rollout.schedule=lockstep` (arealite/rollout/lockstep.py): batch b is the b-th
  prompt batch, generated entirely by weights b - k while batch b - 1 trains; before each
  sync the trainer waits for the batches in flight (that wait counts as sync time).

Configurations alternate over `--repeats` paired repeats. Prints each run's phases and
staleness histogram (async_speedup.py's report), the spread of the paired ratios, and last
`lockstep_vs_interruptible=<median over repeats of interruptible wall / lockstep wall>`
(above 1: lockstep trains the same samples faster).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness
from async_speedup import report, start_worker


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--repeats", type=int, default=3, help="paired repeats (both schedules, alternating order)")
    p.add_argument("--offpolicyness", type=int, default=1, help="k of both schedules")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=192)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--cpus", default=None, help="CPUs of both configurations (default: all of ours)")
    p.add_argument("--no-split", dest="split", action="store_false", help="do not give the server its own CPU")
    p.add_argument("--model-path", default=None, help="HF model folder (default: a tiny Qwen2 built on the spot)")
    p.add_argument("--smoke", action="store_true", help="a few seconds: 2 prompts x 2, 8 tokens, 2 steps, 1 repeat")
    args = p.parse_args()
    args.records_fn = args.reward_fn = None  # async_speedup's worker: the arithmetic task
    if args.smoke:
        args.steps, args.repeats, args.batch_size, args.group_size, args.max_new_tokens = 2, 1, 2, 2, 8
    cpus = sorted(harness.cpu_set(args.cpus))
    if args.split and len(cpus) < 2:
        raise SystemExit("--split needs 2 CPUs; pass --no-split")
    k = args.offpolicyness
    print(harness.machine_line())
    print(harness.commit_line())
    print(
        f"lockstep_schedule: {args.steps * args.batch_size} prompts x {args.group_size} samples per run, k={k}, "
        f"max_new_tokens={args.max_new_tokens}, {args.repeats} paired repeats; CPUs {cpus}"
        + (f", server on CPU {cpus[0]}, trainer on {cpus[1:]}" if args.split else "")
    )
    layout = "split-1+1" if args.split else "shared-1+1"
    base = dict(k=k, batch_size=args.batch_size, steps=args.steps, layout=layout)
    configs = {"interruptible": base, "lockstep": dict(base, schedule="lockstep")}
    runs = run_pair(args, cpus, configs, layout)
    for name, r in runs.items():
        report(name, r)
    walls = {name: [r["wall"] for r in rs] for name, rs in runs.items()}
    ratios = [i / s for i, s in zip(walls["interruptible"], walls["lockstep"])]
    for name, w in walls.items():
        print(f"{name:<13} wall s: {harness.spread(w)}")
    print(f"interruptible / lockstep wall (paired): {harness.spread(ratios)}")
    print(harness.load_line())
    print(f"lockstep_vs_interruptible={harness.quartiles(ratios)[2]:.2f}")


def run_pair(args: argparse.Namespace, cpus: list[int], configs: dict[str, dict], layout: str) -> dict[str, list[dict]]:
    """Both schedules on one worker (server + trainer process tree), `args.repeats` alternating repeats."""
    with tempfile.TemporaryDirectory(prefix="lockstep_schedule_") as tmp:
        from arealite.tools.tiny_model import build_tiny_model

        model = args.model_path or build_tiny_model(os.path.join(tmp, "model"), seed=0)
        worker = start_worker(args, cpus, configs, model, tmp, layout)
        try:
            return harness.run_paired({name: (worker, c) for name, c in configs.items()}, args.repeats)
        finally:
            worker.close()


if __name__ == "__main__":
    main()
