"""Training time to a fixed held-out accuracy: the reasoning job, synchronous vs asynchronous.

    PYTHONPATH=. python benchmarks/time_to_accuracy.py [--target 0.75] [--repeats 3] [--every 10]

Throughput (`async_speedup.py`) says how fast samples are trained; this says how soon a job
is good. Each repeat runs both documented jobs once, in alternating order, as a user starts
them (`python -m arealite.launcher.local examples/gsm8k_grpo.py --config CFG`):
`configs/tiny_cpu_reasoning.yaml` (synchronous, 100 steps) and
`configs/tiny_cpu_reasoning_async.yaml` (staleness <= 2, decoupled loss, a smaller learning
rate for 300 steps),
each with the settings it is documented with. The runs evaluate nothing while they train
(`evaluator.freq_steps=0`), so their clocks hold training only, and keep every weight
version they upload (`weight_keep_versions`). Afterwards, off the clock, one built-in server
loads versions every `--every` steps in order and evaluates each as the job's own evaluator
does (its held-out set, k, temperature; sampling seeded by the version) until held-out
pass@1 reaches `--target`. A run's time to the target is the stats logger's `elapsed_s` at
the end of the step that uploaded the first version that reaches it.

Both jobs use one built-in server and one trainer on the same CPUs (all of ours). Prints
each run's evaluated curve and time, the spread of each job's times and of the paired ratios,
and last `async_vs_sync_time_to_accuracy_reasoning=<median over repeats of sync time / async
time>` (above 1: the asynchronous job gets there sooner). A run that never reaches the target
counts as infinitely slow (its ratio 0 or inf); a pair where neither does is left out.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness

JOBS = {"sync": "configs/tiny_cpu_reasoning.yaml", "async": "configs/tiny_cpu_reasoning_async.yaml"}


def seconds_to_version(rows: list[dict], version: int) -> float:
    """Training seconds until weight version `version` was uploaded: `elapsed_s` of step
    `version - 1` (step s trains and uploads version s + 1); 0 for the initial weights."""
    if version == 0:
        return 0.0
    by_step = {int(r["step"]): float(r["elapsed_s"]) for r in rows}
    if version - 1 not in by_step:
        raise ValueError(f"no stats row for step {version - 1}: the run did not upload version {version}")
    return by_step[version - 1]


def first_reaching(curve: list[tuple[int, float]], target: float) -> int | None:
    """The first version (in training order) whose held-out pass@1 is >= target, else None."""
    return next((v for v, acc in sorted(curve) if acc >= target), None)


def train(job: str, out: str, trial: str, extra: list[str], timeout: float) -> tuple[str, list[dict]]:
    """One launch of the job with no evaluation and every version kept; (run dir, stats rows)."""
    cmd = [
        sys.executable, "-m", "arealite.launcher.local", "examples/gsm8k_grpo.py", "--config", JOBS[job],
        "launcher.setup_commands=[]", "evaluator.freq_steps=0", "weight_keep_versions=100000",
        "recover.mode=disabled", "stats_logger.progress_bar=false", "stats_logger.plot=false",
        f"fileroot={out}", "experiment_name=tta", f"trial_name={trial}", *extra,
    ]  # fmt: skip
    env = {**os.environ, **harness.CPU_ONLY, "PYTHONPATH": harness.REPO}
    with open(os.path.join(out, f"{trial}.log"), "w") as log:
        proc = subprocess.run(cmd, cwd=harness.REPO, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout)
    from arealite.stats.jsonl import read_stats

    if proc.returncode != 0:
        raise RuntimeError(f"{job} run {trial} exited {proc.returncode}; see {os.path.join(out, trial + '.log')}")
    run_dir = os.path.join(out, "tta", trial)
    return run_dir, read_stats(run_dir)


class HeldOut:
    """One built-in server and the job's evaluator; evaluates saved weight versions on it."""

    def __init__(self, model: str, config_path: str, extra: list[str]):
        from transformers import AutoTokenizer

        from arealite.config import GRPOConfig, load_config
        from arealite.eval.evaluator import Evaluator
        from arealite.eval.task import held_out_records, reward_fn_for
        from arealite.rollout import RemoteSGLangEngine
        from arealite.server.process import launch_server_process

        config = load_config(["--config", os.path.join(harness.REPO, config_path), *extra], GRPOConfig)
        tokenizer = AutoTokenizer.from_pretrained(model)
        self.server = launch_server_process(
            model, extra_args=["--max-running-requests", str(config.server.max_running_requests)], env=harness.CPU_ONLY
        )
        config.rollout.max_head_offpolicyness = 0
        self.rollout = RemoteSGLangEngine(config.rollout, [self.server.address])
        self.rollout.initialize()
        self.evaluator = Evaluator(
            config.evaluator, config.gconfig, held_out_records(config, tokenizer), reward_fn_for(config), tokenizer
        )

    def pass_at_1(self, weights: str, version: int) -> float:
        from arealite.types import WeightUpdateMeta

        self.rollout.update_weights(WeightUpdateMeta(type="disk", path=weights, version=version)).result()
        return self.evaluator.evaluate(self.rollout)["eval/pass@1"]

    def close(self) -> None:
        self.rollout.destroy()
        self.server.stop()


def time_to_target(
    held_out: HeldOut, run_dir: str, rows: list[dict], every: int, target: float
) -> tuple[float, list[tuple[int, float]]]:
    """Evaluate versions every, 2 x every, ... until one reaches `target`: (seconds, curve)."""
    last = max(int(r["step"]) for r in rows) + 1
    curve: list[tuple[int, float]] = []
    for version in [*range(every, last, every), last]:
        weights = os.path.join(run_dir, "weights", f"v{version}")
        curve.append((version, held_out.pass_at_1(weights, version)))
        reached = first_reaching(curve, target)
        if reached is not None:
            return seconds_to_version(rows, reached), curve
    return math.inf, curve


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", type=float, default=0.75, help="held-out pass@1 to reach")
    p.add_argument("--repeats", type=int, default=3, help="paired repeats (both jobs once each, alternating order)")
    p.add_argument("--every", type=int, default=10, help="evaluate every this many versions")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per training run")
    p.add_argument("--extra", nargs="*", default=[], help="overrides added to both jobs (e.g. for a short check)")
    p.add_argument("--model-path", default=None, help="train this model (default: the jobs' warm start)")
    p.add_argument("--smoke", action="store_true", help="3 steps a job, 1 repeat, target 0: checks the plumbing only")
    args = p.parse_args()
    if args.smoke:
        args.repeats, args.every, args.target = 1, 1, 0.0
        args.extra = ["total_train_steps=3", "evaluator.num_samples=8", "evaluator.k=1", *args.extra]
    if args.model_path:
        args.extra = [f"actor.path={os.path.abspath(args.model_path)}", *args.extra]
    return args


def main() -> None:
    args = parse_args()
    print(harness.machine_line())
    print(harness.commit_line())
    print(
        f"time_to_accuracy: held-out pass@1 >= {args.target}; jobs {JOBS}; {args.repeats} paired repeats; versions "
        f"evaluated every {args.every} steps after each run; CPUs {sorted(harness.cpu_set(None))} for both"
    )
    model = os.path.abspath(args.model_path) if args.model_path else harness.build_warm_start(JOBS["sync"])
    times: dict[str, list[float]] = {job: [] for job in JOBS}
    out = tempfile.mkdtemp(prefix="time_to_accuracy_")
    held_out = HeldOut(model, JOBS["sync"], args.extra)
    try:
        for repeat in range(args.repeats):
            for job in harness.order(repeat, list(JOBS)):
                started = time.perf_counter()
                run_dir, rows = train(job, out, f"{job}-{repeat}", args.extra, args.timeout)
                wall = time.perf_counter() - started
                seconds, curve = time_to_target(held_out, run_dir, rows, args.every, args.target)
                times[job].append(seconds)
                shown = ", ".join(f"v{v} {acc:.3f}" for v, acc in curve)
                print(
                    f"repeat {repeat}: {job:<5} {seconds:7.1f} s to {args.target} (run {wall:.0f} s wall with its "
                    f"start-up, {rows[-1]['elapsed_s']:.0f} s training; {harness.load_line()}); held-out: {shown}",
                    flush=True,
                )
                shutil.rmtree(run_dir, ignore_errors=True)
    finally:
        held_out.close()
        shutil.rmtree(out, ignore_errors=True)
    for job, ts in times.items():
        missed = sum(math.isinf(t) for t in ts)
        shown = harness.spread(ts, ".1f")
        print(f"{job:<5} seconds to {args.target}: {shown}; not reached in {missed} of {len(ts)} runs")
    # a run that never reached the target counts as infinitely slow; a pair where neither did says nothing
    pairs = [(s, a) for s, a in zip(times["sync"], times["async"]) if not (math.isinf(s) and math.isinf(a))]
    if not pairs:
        raise SystemExit(f"neither job reached {args.target} in any repeat: lower --target")
    ratios = [s / a for s, a in pairs]
    n = f"{len(pairs)} of {len(times['sync'])} pairs"
    print(f"sync / async time to {args.target} (paired, {n}): {harness.spread(ratios)}")
    print(harness.load_line())
    print(f"async_vs_sync_time_to_accuracy_reasoning={harness.quartiles(ratios)[2]:.2f}")


if __name__ == "__main__":
    main()
