"""Per-turn credit against outcome-only reward and against the per-turn-index baseline, on a
multi-turn task whose turns have their own rewards and where the policy decides when to stop.

    python benchmarks/turn_credit.py [--seeds 1 2 3] [--steps 30] [--parity 0|1] [--out DIR] [--smoke]

The task (tests/train/test_turn_credit_learns.py): up to 3 turns of 4 tokens from a random tiny
model; a turn's reward is its fraction of even token ids, and the episode takes another turn
only when a turn ends on a token of `--parity` (1, odd, by default: continuing costs the turn a
quarter of its reward and is worth a whole further turn, the choice the per-turn-index baseline
mis-credits; 0, even: the guard's task, where both point the same way). Three estimators train
the same model on the same prompts, seeds and number of samples (8 prompts x 8 episodes a
step), in process:

    sequence    outcome only: GRPO's group-normalised episode return on every token
    turn_loo    each turn's reward-to-go minus the mean of the group's other samples that reached it
    turn_index  MT-GRPO's per-turn-index group mean, accumulated from the turn on (biased)

Every `--eval-every` steps (and before the first) each is evaluated on the same held-out
prompts (4 episodes each, temperature 1): success (an episode whose return is at least 2: all 3
turns with most tokens even; the most is 2.5 with --parity 1) and mean turns per episode. The
sides run one after another in alternating order per seed; a run's seconds are its training's
alone (the evaluations are not counted). Writes `results.json` and `turn_credit_parity<P>.png`
(held-out success and mean turns against the training step, the mean over seeds with a min-max
band) to --out. Prints one line per estimator, then
`turn_loo_vs_turn_index_success=<median over seeds of the paired difference>`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.harness import commit_line, load_line, machine_line, order, settle, spread  # noqa: E402

ESTIMATORS = ("sequence", "turn_loo", "turn_index")
SUCCESS_RETURN = 2.0


def held_out(sampler, seed: int, prompts: int, parity: int) -> tuple[float, float]:
    """(success rate, mean turns) of 4 episodes on each of `prompts` fresh prompts."""
    import torch

    from tests.train.test_turn_credit_learns import PROMPT_LEN, rollout_episodes

    g = torch.Generator().manual_seed(10_000 + seed)
    ids = torch.randint(0, sampler.config.vocab_size, (prompts, PROMPT_LEN), generator=g).repeat_interleave(4, 0)
    batch = rollout_episodes(sampler, ids, g, parity)
    turns = (batch["turn_ids"].max(dim=1).values + 1).float()
    return float((batch["rewards"] >= SUCCESS_RETURN).float().mean()), float(turns.mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--eval-prompts", type=int, default=64)
    ap.add_argument("--parity", type=int, choices=(0, 1), default=1, help="an episode goes on after a turn ending so")
    ap.add_argument("--eval-every", type=int, default=5, help="held-out evaluation every this many steps")
    ap.add_argument("--model-path", default="", help="a tiny model folder; default: one built here")
    ap.add_argument("--out", type=Path, default=REPO / "runs" / "turn_credit", help="results.json and the figure")
    ap.add_argument("--smoke", action="store_true", help="one seed, 2 steps, 4 held-out prompts")
    args = ap.parse_args()
    if args.smoke:
        args.seeds, args.steps, args.eval_prompts, args.eval_every = args.seeds[:1], 2, 4, 1
    if args.eval_every < 1:
        raise SystemExit(f"--eval-every={args.eval_every} must be >= 1")
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    import torch

    torch.set_num_threads(2)
    from tests.train.test_turn_credit_learns import run

    print(machine_line(), flush=True)
    print(commit_line(), flush=True)
    print(f"torch threads {torch.get_num_threads()}, one process; {load_line()}", flush=True)
    model = args.model_path
    tmp = None
    if not model:
        from arealite.tools.tiny_model import build_tiny_model

        tmp = tempfile.TemporaryDirectory()
        model = build_tiny_model(tmp.name, seed=0)
    results: dict[str, list[dict]] = {e: [] for e in ESTIMATORS}
    untrained = []
    for i, seed in enumerate(args.seeds):
        start_point = (0, *held_out(_fresh(model), seed, args.eval_prompts, args.parity))  # the same for every side
        untrained.append(start_point)
        for est in order(i, ESTIMATORS):
            settle()
            curve, eval_seconds = [start_point], [0.0]

            def evaluate(step: int, sampler, curve=curve, eval_seconds=eval_seconds, seed=seed) -> None:
                if step % args.eval_every == 0 or step == args.steps:
                    t = time.perf_counter()
                    curve.append((step, *held_out(sampler, seed, args.eval_prompts, args.parity)))
                    eval_seconds[0] += time.perf_counter() - t

            start = time.perf_counter()
            returns, sampler = run(model, est, steps=args.steps, seed=seed, parity=args.parity, after_step=evaluate)
            seconds = time.perf_counter() - start - eval_seconds[0]
            _, success, turns = curve[-1]
            results[est].append({"seed": seed, "success": success, "turns": turns, "seconds": seconds, "curve": curve,
                                 "train_return_last": sum(returns[-3:]) / len(returns[-3:])})  # fmt: skip
            print(f"seed={seed} estimator={est} heldout_success={success:.3f} mean_turns={turns:.2f} "
                  f"train_return_first={returns[0]:.3f} train_return_last3={results[est][-1]['train_return_last']:.3f} "
                  f"seconds={seconds:.1f}", flush=True)  # fmt: skip
    for seed, (_, before_success, before_turns) in zip(args.seeds, untrained):
        print(f"untrained (seed {seed}'s held-out episodes): heldout_success={before_success:.3f} "
              f"mean_turns={before_turns:.2f}")  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(
        json.dumps({"parity": args.parity, "steps": args.steps, **results}, indent=1)
    )
    figure = args.out / f"turn_credit_parity{args.parity}.png"
    plot(results, figure, args.parity, args.steps)
    print(f"figure {figure}")
    for est in ESTIMATORS:
        rs = results[est]
        success, turns, seconds = ([r[k] for r in rs] for k in ("success", "turns", "seconds"))
        print(f"estimator={est} heldout_success {spread(success, '.3f')}; mean_turns {spread(turns)}; "
              f"seconds {spread(seconds, '.1f')}")  # fmt: skip
    diff = [a["success"] - b["success"] for a, b in zip(results["turn_loo"], results["turn_index"])]
    diff_outcome = [a["success"] - b["success"] for a, b in zip(results["turn_loo"], results["sequence"])]
    print(f"turn_loo - sequence heldout_success (paired by seed): {spread(diff_outcome, '.3f')}")
    print(f"turn_loo - turn_index heldout_success (paired by seed): {spread(diff, '.3f')}")
    print(load_line())
    print(f"turn_loo_vs_turn_index_success={sorted(diff)[len(diff) // 2]:.3f}")
    if tmp is not None:
        tmp.cleanup()


def plot(results: dict[str, list[dict]], path: Path, parity: int, steps: int) -> None:
    """Held-out success and mean turns against the training step: per estimator the mean over
    seeds, with a min-max band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for est, runs in results.items():
        steps_at = [step for step, _, _ in runs[0]["curve"]]
        for ax, col in zip(axes, (1, 2)):
            per_step = [[r["curve"][j][col] for r in runs] for j in range(len(steps_at))]
            (line,) = ax.plot(steps_at, [statistics.fmean(v) for v in per_step], marker=".", label=est)
            ax.fill_between(steps_at, [min(v) for v in per_step], [max(v) for v in per_step],
                            color=line.get_color(), alpha=0.15)  # fmt: skip
    axes[0].set(xlabel="training step (64 episodes each)", ylabel="held-out success (return >= 2)", ylim=(-0.02, 1.02))
    axes[1].set(xlabel="training step (64 episodes each)", ylabel="held-out mean turns per episode", ylim=(0.9, 3.1))
    axes[0].legend(fontsize=8)
    seeds = len(next(iter(results.values())))
    fig.suptitle(f"turn_credit.py --parity {parity}: {steps} steps, {seeds} seeds; mean over seeds, band = min..max",
                 fontsize=10)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _fresh(model: str):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)


if __name__ == "__main__":
    main()
