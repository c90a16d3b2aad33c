"""GRPO steps/s of arealite next to TRL's GRPOTrainer: same model, task, batch and lengths, one run.

    PYTHONPATH=. python benchmarks/vs_trl.py [--steps 8] [--batch-size 8] [--group-size 4] \
        [--max-new-tokens 128] [--threads 1] [--offpolicyness 2] [--pause-mode in_place] \
        [--no-sync-baseline] [--repeats 1]

Needs TRL (`pip install -e .[bench]`). Both sides train the tiny random Qwen2 from
`arealite.tools.tiny_model` on the synthetic arithmetic task with the same prompts, group
size, generation budget (EOS ends a sample early on both sides), temperature 1.0, learning
rate, clip range, group-normalised advantages, token-mean loss, no KL, one optimizer step
per batch. Each side runs in its own subprocess with `--threads` torch threads per process:

- TRL: `GRPOTrainer` on CPU without vLLM; generation is `model.generate` inside the trainer.
- arealite: one built-in server (`python -m arealite.server`) plus the training loop of
  examples/gsm8k_grpo.py in-process: rollout over HTTP, PPO update (prox_logp from the
  update's own forward), disk weight sync every step. By default twice: asynchronously at
  `--offpolicyness 2` with the decoupled loss (as configs/gsm8k_grpo.yaml) and
  `--pause-mode in_place`, and synchronously at k=0 (on-policy, like TRL).

The first step of each run is a warm-up and is not timed. Prints per-step wall time,
samples/s and mean reward for every side, `arealite_sync_vs_trl_speedup=<x>` for k=0, and
last `arealite_vs_trl_speedup=<TRL s/step / arealite s/step at --offpolicyness>`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from statistics import mean

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def exit_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit, so `with launch_server_process(...)` stops its server."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


def cpu_seconds() -> float:
    """CPU time (user + system) of this process and its live descendants (servers, reward workers).

    Printed next to wall time: on a shared machine wall time also measures other people's
    load, while CPU time measures only the work each side does.
    """
    import psutil

    procs = [psutil.Process()]
    procs += procs[0].children(recursive=True)
    total = 0.0
    for proc in procs:
        try:
            t = proc.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            continue
    return total


def trl_reward(prompts, completions, answer, **_):
    """TRL's reward signature around arealite's arithmetic reward (same scoring on both sides)."""
    from arealite.data.arithmetic import arithmetic_reward_fn

    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [arithmetic_reward_fn("", t, answer=a) for t, a in zip(texts, answer)]


def run_trl(args: argparse.Namespace) -> dict:
    """Train with TRL's GRPOTrainer; returns per-step wall times, rewards and completion lengths."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from arealite.data.arithmetic import make_arithmetic_dataset

    records = make_arithmetic_dataset(args.batch_size * (args.steps + 1), seed=args.seed)
    data = Dataset.from_list([{"prompt": r["messages"], "answer": r["answer"]} for r in records])
    times, rewards, lengths, cpu = [], [], [], []

    class Timer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.start, self.cpu = time.perf_counter(), cpu_seconds()

        def on_step_end(self, *a, **k):
            times.append(time.perf_counter() - self.start)
            cpu.append(cpu_seconds() - self.cpu)

        def on_log(self, _args, state, control, logs=None, **k):
            if logs and "reward" in logs:
                rewards.append(logs["reward"])
                lengths.append(logs.get("completions/mean_length", float("nan")))

    config = GRPOConfig(
        output_dir=args.workdir, use_cpu=True, bf16=False, use_vllm=False, report_to="none",
        per_device_train_batch_size=args.batch_size * args.group_size, num_generations=args.group_size,
        gradient_accumulation_steps=1, steps_per_generation=1, num_iterations=1,
        max_completion_length=args.max_new_tokens, temperature=1.0, top_k=0, top_p=1.0,
        learning_rate=args.lr, lr_scheduler_type="constant", warmup_steps=0, max_grad_norm=1.0, weight_decay=0.0,
        epsilon=0.2, beta=0.0, loss_type="dapo", scale_rewards="group",
        max_steps=args.steps + 1, logging_steps=1, save_strategy="no", shuffle_dataset=False, seed=args.seed,
        dataloader_num_workers=0, disable_dropout=True,
    )  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype="float32")
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    trainer = GRPOTrainer(model=model, reward_funcs=trl_reward, args=config, train_dataset=data, processing_class=tokenizer)
    trainer.add_callback(Timer())
    trainer.train()
    return {"times": times, "rewards": rewards, "lengths": lengths, "cpu": cpu}


def run_arealite(args: argparse.Namespace) -> dict:
    """The examples/gsm8k_grpo.py loop against one built-in server; returns per-step figures."""
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

    rank, _ = init_distributed()
    records = make_arithmetic_dataset(args.batch_size * (args.steps + 1), seed=args.seed)
    loader = create_dataloader(records, args.batch_size, shuffle=False, seed=args.seed)
    gconfig = GenerationHyperparameters(group_size=args.group_size, max_new_tokens=args.max_new_tokens, temperature=1.0)
    # (k + 1) batches may be generating at once (the staleness bound allows it); the server
    # must admit all of them into its running batch.
    in_flight = (args.offpolicyness + 1) * args.batch_size
    server_env = {"OMP_NUM_THREADS": str(args.threads)}
    extra = ["--torch-threads", str(args.threads), "--random-seed", str(args.seed)]
    extra += ["--max-running-requests", str(2 * in_flight * args.group_size)]
    with launch_server_process(args.model, extra_args=extra, env=server_env, log_path=os.path.join(args.workdir, "server.log")) as server:
        config = InferenceEngineConfig(
            max_head_offpolicyness=args.offpolicyness, max_concurrent_rollouts=in_flight, pause_mode=args.pause_mode
        )
        rollout = RemoteSGLangEngine(config, [server.address])
        rollout.initialize()
        actor = PPOActor(
            PPOActorConfig(
                path=args.model, group_size=args.group_size, eps_clip=0.2, adv_norm="group", loss_agg_mode="token-mean",
                optimizer=OptimizerConfig(lr=args.lr, gradient_clipping=1.0),
                mb_spec=MicroBatchSpec(max_tokens_per_mb=args.max_tokens_per_mb),
                # off-policy samples: the decoupled loss (as configs/gsm8k_grpo.yaml)
                use_decoupled_loss=args.offpolicyness > 0,
            )
        ).initialize()  # fmt: skip
        workflow = RLVRWorkflow(arithmetic_reward_fn, gconfig, AutoTokenizer.from_pretrained(args.model))
        times, rewards, lengths, phases, cpu = [], [], [], [], []
        data_iter = iter(loader)
        for step in range(args.steps + 1):
            cpu_start = cpu_seconds()
            batch, phase = timed_grpo_step(step, rollout, actor, workflow, loader, data_iter, args.workdir, rank, barrier)
            cpu.append(cpu_seconds() - cpu_start)
            times.append(sum(phase))
            phases.append(phase)
            rewards.append(batch["rewards"].float().mean().item())
            lengths.append(batch["loss_mask"].sum(1).float().mean().item())
        rollout.destroy()
        actor.destroy()
    return {"times": times, "rewards": rewards, "lengths": lengths, "phases": phases, "cpu": cpu}


def side_main(args: argparse.Namespace) -> None:
    """Subprocess entry: run one side, write its figures as JSON."""
    import torch

    exit_on_sigterm()
    torch.set_num_threads(args.threads)
    result = run_trl(args) if args.side == "trl" else run_arealite(args)
    with open(args.out, "w") as f:
        json.dump(result, f)


def launch_side(side: str, k: int, args: argparse.Namespace, model: str, workdir: str) -> dict:
    """Run one side in a fresh subprocess (`k`: arealite's max_head_offpolicyness)."""
    tag = side if side == "trl" else f"arealite_k{k}"
    out = os.path.join(workdir, f"{tag}.json")
    cmd = [
        sys.executable, os.path.abspath(__file__), "--side", side, "--out", out, "--model", model,
        "--workdir", os.path.join(workdir, tag), "--steps", str(args.steps), "--batch-size", str(args.batch_size),
        "--group-size", str(args.group_size), "--max-new-tokens", str(args.max_new_tokens), "--threads", str(args.threads),
        "--lr", str(args.lr), "--seed", str(args.seed), "--offpolicyness", str(k),
        "--pause-mode", args.pause_mode,
    ]  # fmt: skip
    if args.max_tokens_per_mb is not None:
        cmd += ["--max-tokens-per-mb", str(args.max_tokens_per_mb)]
    env = {
        **os.environ, "OMP_NUM_THREADS": str(args.threads), "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error",
        "PYTHONPATH": os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p),
    }  # fmt: skip
    os.makedirs(os.path.join(workdir, tag), exist_ok=True)
    log = os.path.join(workdir, f"{tag}.log")
    with open(log, "w") as f:
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
    if proc.returncode != 0:
        with open(log) as f:
            tail = f.read()[-3000:]
        raise SystemExit(f"{tag} side failed with exit code {proc.returncode}; log tail:\n{tail}")
    with open(out) as f:
        return json.load(f)


def report(name: str, runs: list[dict], samples_per_step: int) -> tuple[float, float]:
    """Print one side's per-step table; returns its mean (wall s, CPU s) per timed step.

    Each run's first step is a warm-up and is left out of the means.
    """
    print(f"\n{name}: run step  wall_s  cpu_s  samples/s  reward  mean_completion_tokens")
    for k, result in enumerate(runs):
        rows = zip(result["times"], result["cpu"], result["rewards"], result["lengths"])
        for i, (t, c, r, n) in enumerate(rows):
            tag = " (warm-up, not timed)" if i == 0 else ""
            print(f"{name}: {k:3d} {i:4d}  {t:6.2f}  {c:5.2f}  {samples_per_step / t:9.1f}  {r:6.3f}  {n:6.1f}{tag}")
    phases = [p for result in runs for p in result.get("phases", [])[1:]]
    if phases:
        rollout, train, sync = (mean(x) for x in zip(*phases))
        print(f"{name}: mean phases: rollout {rollout:.2f} s, logp+update {train:.2f} s, weight sync {sync:.2f} s")
    wall = mean(t for result in runs for t in result["times"][1:])
    cpu = mean(c for result in runs for c in result["cpu"][1:])
    n = sum(len(result["times"]) - 1 for result in runs)
    print(f"{name}: mean over {n} timed steps: {wall:.2f} s/step, {samples_per_step / wall:.1f} samples/s, {cpu:.2f} CPU s/step")
    return wall, cpu


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=8, help="timed steps per side (plus one warm-up step)")
    p.add_argument("--batch-size", type=int, default=8, help="prompts per step")
    p.add_argument("--group-size", type=int, default=4, help="samples per prompt")
    p.add_argument("--max-new-tokens", type=int, default=128)
    # 1 by default: on a busy 2-core machine two OpenMP threads per process mostly spin (10x slower, both sides)
    p.add_argument("--threads", type=int, default=1, help="torch threads of every process on both sides")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-tokens-per-mb", type=int, default=None, help="arealite's mb_spec.max_tokens_per_mb (default: no limit)")
    p.add_argument("--repeats", type=int, default=1, help="runs per side, alternating TRL and arealite")
    p.add_argument(
        "--offpolicyness", type=int, default=2,
        help="arealite's max_head_offpolicyness (2: configs/gsm8k_grpo.yaml; 0: on-policy and synchronous like TRL)",
    )  # fmt: skip
    p.add_argument("--no-sync-baseline", dest="sync_baseline", action="store_false", help="skip arealite at k=0")
    p.add_argument("--pause-mode", default="in_place", help="arealite's rollout.pause_mode during weight syncs")
    p.add_argument("--side", choices=["trl", "arealite"], help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--workdir", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.side:
        side_main(args)
        return
    try:
        import trl  # noqa: F401
    except ImportError:
        raise SystemExit("TRL is not installed; install the benchmark extra: pip install -e '.[bench]'") from None
    from arealite.tools.tiny_model import build_tiny_model

    samples = args.batch_size * args.group_size
    ks = [args.offpolicyness] + ([0] if args.sync_baseline and args.offpolicyness > 0 else [])
    print(
        f"vs_trl: {args.steps} timed steps, {args.batch_size} prompts x {args.group_size} samples, "
        f"max_new_tokens={args.max_new_tokens}, {args.threads} torch threads per process, "
        f"arealite max_head_offpolicyness in {ks}, pause_mode={args.pause_mode}"
    )
    with tempfile.TemporaryDirectory(prefix="vs_trl_") as workdir:
        model = build_tiny_model(os.path.join(workdir, "model"), seed=0)
        runs: dict[tuple[str, int], list[dict]] = {("trl", 0): []} | {("arealite", k): [] for k in ks}
        for _ in range(args.repeats):  # alternating, so every side sees the same drift in machine load
            for side, k in runs:
                runs[(side, k)].append(launch_side(side, k, args, model, workdir))
    trl_s, trl_cpu = report("trl", runs[("trl", 0)], samples)
    walls = {k: report(f"arealite k={k}", runs[("arealite", k)], samples) for k in ks}
    print()
    for k, (wall, cpu) in walls.items():
        print(f"arealite k={k}: {wall:.2f} s/step vs TRL {trl_s:.2f} (wall); CPU s/step {cpu:.2f} vs TRL {trl_cpu:.2f}")
    if 0 in walls and args.offpolicyness > 0:
        print(f"arealite_sync_vs_trl_speedup={trl_s / walls[0][0]:.2f}")
    print(f"arealite_vs_trl_speedup={trl_s / walls[args.offpolicyness][0]:.2f}")


if __name__ == "__main__":
    main()
