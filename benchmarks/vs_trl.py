"""GRPO wall time of arealite next to TRL's GRPOTrainer at equal cores: same model, task,
batch, lengths and optimizer, N steps timed from the first, one run.

    PIP_CONSTRAINT=constraints.txt pip install -e '.[bench]'          # TRL, an optional extra
    PYTHONPATH=. python benchmarks/vs_trl.py [--steps 8] [--repeats 5] [--cpus 0,1] \
        [--batch-size 8] [--group-size 4] [--max-new-tokens 128] [--offpolicyness 2] [--smoke]

What is the same on both sides: the tiny random Qwen2 (arealite.tools.tiny_model) and its
tokenizer (ChatML template), the synthetic arithmetic prompts in the same order,
`--batch-size` prompts x `--group-size` samples per step, at most `--max-new-tokens` new
tokens (EOS ends a sample early on both sides), temperature 1.0 with no top-p/top-k, AdamW
at lr 1e-3 constant, gradient clipping 1.0, clip range 0.2, group-normalised advantages,
token-mean loss over the batch, no KL term, one optimizer step per batch, the same reward
function. Gradient checkpointing is set explicitly on both sides: off in arealite (its
default) and off in the headline TRL run (TRL's `GRPOConfig` defaults it to on, which
its own help says costs ~20% speed); TRL with it on runs beside and is printed too.

Resources (CPU only: CUDA devices are hidden from every side): every side runs in its own
process tree, pinned (sched_setaffinity before it starts, inherited by every thread and
child) to the same `--cpus` (default: all of ours), with the same budget of torch compute
threads = the number of those CPUs:
- TRL: one process (`GRPOTrainer` on CPU, no vLLM: generation is `model.generate` inside
  the trainer) with its fastest thread count within the budget: a calibration run per
  `--trl-threads` count (default: 1 and the whole budget; gradient checkpointing off) of
  one warm-up step and 3 timed steps picks the count with the lowest median step time
  before the timed repeats (it has picked 1 and 2 on different runs of this machine);
- arealite: a built-in server process (generation over HTTP) and the trainer process of
  examples/gsm8k_grpo.py (packed sequences, disk weight sync every step), each with half
  the threads, plus 2 reward worker processes; run twice: synchronously at k=0 (on-policy,
  like TRL) and asynchronously at k=`--offpolicyness` (decoupled loss, pause_mode in_place).
The resources line printed for each side is read from the live process tree.

Timing: each side's processes are started once (imports, model files, server, reward
workers; arealite's k=0 and k=offpolicyness runs share one server and one trainer process);
each run loads a fresh model from the initial weights, then the clock runs from the start
of the first step to the end of the last (the first step's warm-up and an asynchronous
run's pipeline fill are paid). The sides run one after another, alternating order, for
`--repeats` paired repeats; each repeat gives one ratio per arealite setting. Prints every
run, CPU seconds, completion lengths and rewards per side, the spread of the ratios, then
`arealite_vs_trl_gc_on_equal_cores=<median TRL with gradient checkpointing / arealite
k=offpolicyness>`, `arealite_sync_vs_trl_equal_cores=<median TRL / arealite k=0>` and last
`arealite_vs_trl_equal_cores=<median TRL / arealite k=offpolicyness>` (TRL without gradient
checkpointing).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import grpo_step
import harness

LR = 1e-3


def trl_reward(prompts, completions, answer, **_):
    """TRL's reward signature around arealite's arithmetic reward (same scoring on both sides)."""
    from arealite.data.arithmetic import arithmetic_reward_fn

    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [arithmetic_reward_fn("", t, answer=a) for t, a in zip(texts, answer)]


def trl_setup(s: dict) -> dict:
    import torch
    import trl  # noqa: F401  (imported before any clock)

    torch.set_num_threads(s["threads"])
    return {"s": s}


def trl_run(state: dict, req: dict) -> dict:
    """`req["steps"]` GRPOTrainer steps from the initial weights; returns per-step figures."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from arealite.data.arithmetic import make_arithmetic_dataset

    s, steps = state["s"], req["steps"]
    records = make_arithmetic_dataset(s["batch_size"] * (steps + 2), seed=s["seed"])
    data = Dataset.from_list([{"prompt": r["messages"], "answer": r["answer"]} for r in records])
    times, rewards, lengths, clock = [], [], [], {}

    class Timer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.start = time.perf_counter()
            clock.setdefault("start", self.start)
            clock.setdefault("cpu", harness.tree_cpu_seconds())

        def on_step_end(self, *a, **k):
            clock["end"] = time.perf_counter()
            clock["cpu_end"] = harness.tree_cpu_seconds()
            times.append(clock["end"] - self.start)

        def on_log(self, _args, _state, _control, logs=None, **k):
            if logs and "reward" in logs:
                rewards.append(logs["reward"])
                lengths.append(logs.get("completions/mean_length", float("nan")))

    workdir = tempfile.mkdtemp(dir=s["workdir"])
    config = GRPOConfig(
        output_dir=workdir, use_cpu=True, bf16=False, use_vllm=False, report_to="none",
        per_device_train_batch_size=s["batch_size"] * s["group_size"], num_generations=s["group_size"],
        gradient_accumulation_steps=1, steps_per_generation=1, num_iterations=1,
        max_completion_length=s["max_new_tokens"], temperature=1.0, top_k=0, top_p=1.0,
        learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0, max_grad_norm=1.0, weight_decay=0.0,
        epsilon=0.2, beta=0.0, loss_type="dapo", scale_rewards="group",
        max_steps=steps, logging_steps=1, save_strategy="no", shuffle_dataset=False, seed=s["seed"],
        dataloader_num_workers=0, disable_dropout=True, gradient_checkpointing=req.get("gradient_checkpointing", False),
    )  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(s["model"], dtype="float32")
    tokenizer = AutoTokenizer.from_pretrained(s["model"])
    trainer = GRPOTrainer(
        model=model, reward_funcs=trl_reward, args=config, train_dataset=data, processing_class=tokenizer
    )
    trainer.add_callback(Timer())
    trainer.train()
    checkpointing = bool(getattr(trainer.model, "is_gradient_checkpointing", False))
    return {
        "gradient_checkpointing": checkpointing,
        "wall": clock["end"] - clock["start"], "cpu": clock["cpu_end"] - clock["cpu"], "times": times,
        "rewards": rewards, "lengths": lengths, "resources": harness.process_tree(os.getpid()),
    }  # fmt: skip


def worker(settings: dict) -> None:
    if settings["side"] == "trl":
        harness.serve_runs(lambda: trl_setup(settings), trl_run)
    else:
        harness.serve_runs(lambda: grpo_step.setup(settings), grpo_step.run, grpo_step.teardown)


def report(name: str, runs: list[dict], samples: int) -> None:
    print(f"\n{name}: repeat  wall_s  s/step  cpu_s  samples/s  mean_reward  mean_completion_tokens")
    for i, r in enumerate(runs):
        n = len(r["times"])
        print(f"{name}: {i:6d} {r['wall']:7.2f} {r['wall'] / n:7.3f} {r['cpu']:6.2f} {samples * n / r['wall']:10.1f} "
              f"{statistics.mean(r['rewards']):12.3f} {statistics.mean(r['lengths']):23.1f}")  # fmt: skip
    if runs[0].get("phases"):
        phases = [ph for r in runs for ph in r["phases"]]
        rollout, train, sync = (statistics.mean(ph[i] for ph in phases) for i in range(3))
        print(
            f"{name}: mean per step: waiting for rollouts {rollout:.3f} s, logp+update {train:.3f} s, weight sync "
            f"{sync:.3f} s"
        )
        hist: dict[str, int] = {}
        for r in runs:
            for k, v in r["staleness"].items():
                hist[k] = hist.get(k, 0) + v
        print(f"{name}: trained tokens by staleness (versions): {json.dumps(hist)}")
    if "gradient_checkpointing" in runs[0]:  # as the trained model reported it, not as configured
        print(f"{name}: gradient checkpointing on the model: {runs[0]['gradient_checkpointing']}")
    print(f"{name}: resources (read from the process tree after run 0):")
    for line in runs[0]["resources"]:
        print(f"{name}:   {line}")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=8, help="timed steps per run (the first included)")
    p.add_argument("--repeats", type=int, default=5, help="paired repeats (every side once each, alternating order)")
    p.add_argument("--batch-size", type=int, default=8, help="prompts per step")
    p.add_argument("--group-size", type=int, default=4, help="samples per prompt")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--cpus", default=None, help="CPUs of every side, e.g. 0,1 (default: all of ours)")
    p.add_argument(
        "--offpolicyness", type=int, default=2, help="arealite's max_head_offpolicyness for the headline figure"
    )
    p.add_argument(
        "--trl-threads", type=int, nargs="+", default=None, help="TRL thread counts to try (default: 1 and all CPUs)"
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--model-path", default=None, help="HF model folder (default: a tiny Qwen2 built on the spot)")
    p.add_argument(
        "--smoke", action="store_true", help="seconds: 2 prompts x 2 samples, 8 tokens, 2 steps, 1 repeat, no k=0 run"
    )
    p.add_argument("--worker", help=argparse.SUPPRESS)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        return
    if importlib.util.find_spec("trl") is None:  # not imported here: that takes seconds, the TRL worker does it
        raise SystemExit("TRL is not installed; install the benchmark extra: pip install -e '.[bench]'")
    if args.offpolicyness < 1:
        raise SystemExit(
            f"--offpolicyness {args.offpolicyness}: the headline is asynchronous (k >= 1); k=0 always runs"
        )
    if args.smoke:
        args.steps, args.repeats, args.batch_size, args.group_size, args.max_new_tokens = 2, 1, 2, 2, 8
    cpus = harness.cpu_set(args.cpus)
    budget = len(cpus)
    trl_threads = [1] if args.smoke else sorted(set(args.trl_threads or [1, budget]))
    if max(trl_threads) > budget or min(trl_threads) < 1:
        raise SystemExit(f"--trl-threads {trl_threads}: each must be in [1, {budget}] (the CPUs of a side)")
    ks = [args.offpolicyness] if args.smoke else [0, args.offpolicyness]
    print(harness.machine_line())
    print(harness.commit_line())
    print(
        f"vs_trl: {args.steps} timed steps per run (the first included), {args.batch_size} prompts x {args.group_size} "
        f"samples, max_new_tokens={args.max_new_tokens}, {args.repeats} paired repeats; every side pinned to CPUs "
        f"{sorted(cpus)} with at most {budget} torch threads in all (TRL: {' or '.join(map(str, trl_threads))} in its "
        f"one process; arealite: {max(1, budget // 2)} in the server + {max(1, budget // 2)} in the trainer)"
    )
    with tempfile.TemporaryDirectory(prefix="vs_trl_") as tmp:
        from arealite.tools.tiny_model import build_tiny_model

        model = args.model_path or build_tiny_model(os.path.join(tmp, "model"), seed=0)
        workers = start_workers(args, model, tmp, cpus, trl_threads, ks)
        try:
            for w in workers.values():  # they set up in parallel
                w.ready  # noqa: B018
            trl = calibrate_trl(workers, trl_threads)
            plan = {
                trl: (workers[trl], dict(steps=args.steps, gradient_checkpointing=False)),
                f"{trl} gc": (workers[trl], dict(steps=args.steps, gradient_checkpointing=True)),
            }
            plan |= {
                f"arealite k={k}": (workers["arealite"], dict(steps=args.steps, k=k, batch_size=args.batch_size))
                for k in ks
            }
            runs = harness.run_paired(plan, args.repeats)
        finally:
            for w in workers.values():
                w.close()
    summarize(args, runs, trl, ks)


def start_workers(
    args: argparse.Namespace, model: str, tmp: str, cpus: set[int], trl_threads: list[int], ks: list[int]
):
    """One worker per TRL thread count and one arealite worker (its server and trainer serve every k)."""
    half = max(1, len(cpus) // 2)
    common = dict(batch_size=args.batch_size, group_size=args.group_size, max_new_tokens=args.max_new_tokens,
                  seed=args.seed, model=model)  # fmt: skip
    settings = {f"trl t={t}": dict(side="trl", threads=t, **common) for t in trl_threads}
    settings["arealite"] = dict(
        side="arealite",
        server_threads=half,
        trainer_threads=half,
        pause_mode="in_place",
        lr=LR,
        max_in_flight=(max(ks) + 1) * args.batch_size,
        **common,
    )
    workers: dict[str, harness.SideProcess] = {}
    for name, s in settings.items():
        s["workdir"] = os.path.join(tmp, name.replace(" ", "_").replace("=", ""))
        os.makedirs(s["workdir"])
        argv = [os.path.abspath(__file__), "--worker", json.dumps(s)]
        env = {"OMP_NUM_THREADS": str(s.get("threads", half)), **harness.CPU_ONLY}
        workers[name] = harness.SideProcess(name, argv, cpus, s["workdir"] + ".log", env)
    return workers


def calibrate_trl(workers: dict[str, harness.SideProcess], trl_threads: list[int], timed_steps: int = 3) -> str:
    """Keep TRL's fastest thread count (closing the other workers); returns its worker's name.

    Each count runs one warm-up step and `timed_steps` timed ones (gradient checkpointing off,
    as in the headline); the lowest median step time wins."""
    names = [f"trl t={t}" for t in trl_threads]
    if len(names) == 1:
        return names[0]
    trials = {}
    for name in names:
        times = workers[name].run(steps=1 + timed_steps, gradient_checkpointing=False)["times"][1:]
        trials[name] = statistics.median(times)
        print(f"TRL calibration, {name}: s per step {harness.spread(times, '.3f')}", flush=True)
    best = min(trials, key=trials.get)
    print(f"TRL calibration: timed with {best}", flush=True)
    for name in names:
        if name != best:
            workers.pop(name).close()
    return best


def summarize(args: argparse.Namespace, runs: dict[str, list[dict]], trl: str, ks: list[int]) -> None:
    for name, r in runs.items():
        report(name, r, args.batch_size * args.group_size)
    print()
    walls = {name: [r["wall"] for r in rs] for name, rs in runs.items()}
    for name, w in walls.items():
        print(f"{name:<12} wall s for {args.steps} steps: {harness.spread(w)}")
    # CPU seconds of every process of a side: the work it does, whatever the machine's load;
    # wall time can beat a one-process side by at most (its CPU / ours) x the cores we overlap on
    for name, rs in runs.items():
        print(f"{name:<12} CPU s for {args.steps} steps (all its processes): {harness.spread([r['cpu'] for r in rs])}")
    ratios = {k: [t / a for t, a in zip(walls[trl], walls[f"arealite k={k}"])] for k in ks}
    gc_on = [t / a for t, a in zip(walls[f"{trl} gc"], walls[f"arealite k={args.offpolicyness}"])]
    for k in ks:
        print(f"{trl} / arealite k={k} (paired; TRL without gradient checkpointing): {harness.spread(ratios[k])}")
    print(
        f"{trl} gc / arealite k={args.offpolicyness} (paired; TRL with gradient checkpointing): {harness.spread(gc_on)}"
    )
    print(harness.load_line())
    print(f"arealite_vs_trl_gc_on_equal_cores={harness.quartiles(gc_on)[2]:.2f}")
    if 0 in ratios:
        print(f"arealite_sync_vs_trl_equal_cores={harness.quartiles(ratios[0])[2]:.2f}")
    print(f"arealite_vs_trl_equal_cores={harness.quartiles(ratios[args.offpolicyness])[2]:.2f}")


if __name__ == "__main__":
    main()
