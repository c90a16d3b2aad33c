"""Wall time of N GRPO steps at max_head_offpolicyness 0, 2 and 4, side by side in one run.

    PYTHONPATH=. python benchmarks/async_speedup.py [--steps 40] [--max-new-tokens 128] \
        [--batch-size 4] [--group-size 4] [--offpolicyness 0 2 4] [--pause-mode in_place] [--no-pin]

A setting where generation latency dominates: the tiny random Qwen2 (arealite.tools.tiny_model)
writes long completions (`--max-new-tokens`, EOS still ends a sample) on one built-in
server, while the trainer's step is cheap. Each setting runs in a fresh subprocess from the
same initial weights. With pinning (the default; needs 2 CPUs) the server process runs on
CPU 0 and the trainer on CPU 1, each with one torch thread, so generation and training can
really overlap instead of sharing cores.

k = 0 is the synchronous loop (rollout_batch -> train -> weight sync). k > 0 uses
prepare_batch: the next batches are generated while the trainer trains, up to k versions
stale, with up to (k + 1) batches in flight (rollout.max_concurrent_rollouts), trained with
the decoupled loss. Weight syncs pause the server with `--pause-mode` (default in_place:
in-flight requests stay on the server; `abort` interrupts and resubmits them).

The figure is the wall time of all N steps, from the first rollout to the last weight
sync (servers started and models loaded before the clock starts), so an asynchronous run
pays for filling its pipeline. Prints per-step wall time, the phase split of the
synchronous run, the ideal overlap bound `(rollout + train + sync) / max(rollout, train +
sync)` from those phases (what perfect overlap alone could give; a fuller server batch
with (k + 1) batches in flight can add to it), the ratio of each k to k = 0, and last
`async2_vs_sync=<k=0 wall time / k=2 wall time>`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
from statistics import mean

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def exit_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit, so `with launch_server_process(...)` stops its server."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


def pin_process(pid: int, cpus: set[int]) -> None:
    """Set the CPU affinity of every thread of `pid` (sched_setaffinity alone moves one thread)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except OSError:  # a thread that just exited
            continue


def run_setting(args: argparse.Namespace) -> dict:
    """Train `args.steps` steps at max_head_offpolicyness `args.k`; returns per-step figures."""
    import torch
    from transformers import AutoTokenizer

    from arealite.config import (
        GenerationHyperparameters, InferenceEngineConfig, MicroBatchSpec, OptimizerConfig, PPOActorConfig,
    )
    from arealite.data.arithmetic import arithmetic_reward_fn, make_arithmetic_dataset
    from arealite.data.loader import create_dataloader
    from arealite.distributed import barrier, init_distributed
    from arealite.rollout import RemoteSGLangEngine
    from arealite.server.process import launch_server_process
    from arealite.train import PPOActor
    from arealite.workflow import RLVRWorkflow
    from grpo_step import timed_grpo_step  # benchmarks/, on sys.path as the script's folder

    torch.set_num_threads(1)
    rank, _ = init_distributed()
    records = make_arithmetic_dataset(args.batch_size * (args.k + 2) * args.steps, seed=args.seed)
    loader = create_dataloader(records, args.batch_size, shuffle=False, seed=args.seed)
    gconfig = GenerationHyperparameters(group_size=args.group_size, max_new_tokens=args.max_new_tokens, temperature=1.0)
    in_flight = (args.k + 1) * args.batch_size  # episodes; (k+1) batches may be generating at once
    extra = ["--torch-threads", "1", "--random-seed", str(args.seed), "--max-running-requests", str(4 * in_flight * args.group_size)]
    log = os.path.join(args.workdir, "server.log")
    with launch_server_process(args.model, extra_args=extra, env={"OMP_NUM_THREADS": "1"}, log_path=log) as server:
        if args.pin:
            pin_process(server.proc.pid, {0})
            pin_process(os.getpid(), {1})
        config = InferenceEngineConfig(max_head_offpolicyness=args.k, max_concurrent_rollouts=in_flight, pause_mode=args.pause_mode)
        rollout = RemoteSGLangEngine(config, [server.address])
        rollout.initialize()
        actor = PPOActor(
            PPOActorConfig(
                path=args.model, group_size=args.group_size, optimizer=OptimizerConfig(lr=args.lr),
                mb_spec=MicroBatchSpec(max_tokens_per_mb=args.max_tokens_per_mb),
                use_decoupled_loss=args.k > 0,  # stale samples: the decoupled loss, as configs/gsm8k_grpo.yaml
            )
        ).initialize()
        workflow = RLVRWorkflow(arithmetic_reward_fn, gconfig, AutoTokenizer.from_pretrained(args.model))
        data_iter = iter(loader)
        times, phases, rewards, stale = [], [], [], []
        for step in range(args.steps):
            batch, phase = timed_grpo_step(step, rollout, actor, workflow, loader, data_iter, args.workdir, rank, barrier)
            times.append(sum(phase))
            phases.append(phase)
            rewards.append(batch["rewards"].float().mean().item())
            produced = batch["versions"][batch["versions"] >= 0]
            stale.append(step - int(produced.min()) if produced.numel() else 0)
        counters = rollout.export_stats()
        rollout.destroy()
        actor.destroy()
    return {"times": times, "phases": phases, "rewards": rewards, "staleness": stale, "counters": counters}


def launch_setting(k: int, args: argparse.Namespace, model: str, workdir: str) -> dict:
    out = os.path.join(workdir, f"k{k}.json")
    sub = os.path.join(workdir, f"k{k}")
    os.makedirs(sub, exist_ok=True)
    cmd = [
        sys.executable, os.path.abspath(__file__), "--k", str(k), "--out", out, "--model", model, "--workdir", sub,
        "--steps", str(args.steps), "--batch-size", str(args.batch_size), "--group-size", str(args.group_size),
        "--max-new-tokens", str(args.max_new_tokens), "--lr", str(args.lr), "--seed", str(args.seed),
        "--pause-mode", args.pause_mode,
    ] + ([] if args.pin else ["--no-pin"])  # fmt: skip
    if args.max_tokens_per_mb is not None:
        cmd += ["--max-tokens-per-mb", str(args.max_tokens_per_mb)]
    env = {
        **os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_VERBOSITY": "error",
        "PYTHONPATH": os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p),
    }  # fmt: skip
    log = os.path.join(workdir, f"k{k}.log")
    with open(log, "w") as f:
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
    if proc.returncode != 0:
        with open(log) as f:
            raise SystemExit(f"k={k} failed with exit code {proc.returncode}; log tail:\n{f.read()[-3000:]}")
    with open(out) as f:
        return json.load(f)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=40, help="steps per setting, all timed (the pipeline fill included)")
    p.add_argument("--batch-size", type=int, default=4, help="prompts per step")
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-tokens-per-mb", type=int, default=None, help="arealite's mb_spec.max_tokens_per_mb (default: no limit)")
    p.add_argument("--pause-mode", default="in_place", help="rollout.pause_mode during weight syncs (abort | in_place | retract)")
    p.add_argument("--offpolicyness", type=int, nargs="+", default=[0, 2, 4], help="settings of max_head_offpolicyness")
    p.add_argument("--no-pin", dest="pin", action="store_false", help="do not pin server and trainer to CPUs 0 and 1")
    p.add_argument("--k", type=int, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--workdir", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.k is not None:
        exit_on_sigterm()
        with open(args.out, "w") as f:
            json.dump(run_setting(args), f)
        return
    if 0 not in args.offpolicyness:
        raise SystemExit("--offpolicyness must include 0 (the synchronous baseline the ratios are taken to)")
    if args.pin and len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("pinning needs 2 CPUs; run with --no-pin")
    from arealite.tools.tiny_model import build_tiny_model

    print(
        f"async_speedup: {args.steps} timed steps, {args.batch_size} prompts x {args.group_size} samples, "
        f"max_new_tokens={args.max_new_tokens}, pinned={args.pin}, pause_mode={args.pause_mode}"
    )
    with tempfile.TemporaryDirectory(prefix="async_speedup_") as workdir:
        model = build_tiny_model(os.path.join(workdir, "model"), seed=0)
        results = {k: launch_setting(k, args, model, workdir) for k in args.offpolicyness}
    total = {}
    for k, r in results.items():
        print(f"\nk={k}: step  wall_s  rollout_s  train_s  sync_s  reward  staleness")
        for i, (t, ph, rew, st) in enumerate(zip(r["times"], r["phases"], r["rewards"], r["staleness"])):
            print(f"k={k}: {i:4d}  {t:6.2f}  {ph[0]:9.2f}  {ph[1]:7.2f}  {ph[2]:6.2f}  {rew:6.3f}  {st:9d}")
        total[k] = sum(r["times"])
        c = r["counters"]
        print(
            f"k={k}: {c.get('rollout/accepted', 0)} trajectories accepted, {c.get('rollout/stale_requeued', 0)} "
            f"regenerated as too stale, {c.get('rollout/interruptions', 0)} requests interrupted by weight syncs"
        )
    rollout, train, sync = (mean(x) for x in zip(*results[0]["phases"]))
    bound = (rollout + train + sync) / max(rollout, train + sync)
    print(f"\nsynchronous step: rollout {rollout:.2f} s + train {train:.2f} s + weight sync {sync:.2f} s")
    print(f"ideal_overlap_bound={bound:.2f}")
    for k in args.offpolicyness:
        print(f"k={k}: {total[k]:.1f} s for {args.steps} steps, speedup over k=0: {total[0] / total[k]:.2f}")
    if 2 in total:
        print(f"async2_vs_sync={total[0] / total[2]:.2f}")


if __name__ == "__main__":
    main()
