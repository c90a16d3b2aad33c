"""Per-turn credit against outcome-only reward and against the per-turn-index baseline, on a
multi-turn task whose turns have their own rewards and where the policy decides when to stop.

    python benchmarks/turn_credit.py [--seeds 1 2 3] [--steps 30] [--model-path DIR] [--smoke]

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

Then each is evaluated on held-out prompts (4 episodes each, temperature 1): success (an
episode whose return is at least 2: all 3 turns with most tokens even; the most is 2.5 with
--parity 1) and mean turns per episode. The sides run one after another in alternating order
per seed. Prints one line per estimator, then
`turn_loo_vs_turn_index_success=<median over seeds of the paired difference>`.
"""

from __future__ import annotations

import argparse
import os
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
    ap.add_argument("--model-path", default="", help="a tiny model folder; default: one built here")
    ap.add_argument("--smoke", action="store_true", help="one seed, 2 steps, 4 held-out prompts")
    args = ap.parse_args()
    if args.smoke:
        args.seeds, args.steps, args.eval_prompts = args.seeds[:1], 2, 4
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
    for i, seed in enumerate(args.seeds):
        for est in order(i, ESTIMATORS):
            settle()
            start = time.perf_counter()
            returns, sampler = run(model, est, steps=args.steps, seed=seed, parity=args.parity)
            seconds = time.perf_counter() - start
            success, turns = held_out(sampler, seed, args.eval_prompts, args.parity)
            results[est].append({"seed": seed, "success": success, "turns": turns, "seconds": seconds,
                                 "train_return_last": sum(returns[-3:]) / len(returns[-3:])})  # fmt: skip
            print(f"seed={seed} estimator={est} heldout_success={success:.3f} mean_turns={turns:.2f} "
                  f"train_return_first={returns[0]:.3f} train_return_last3={results[est][-1]['train_return_last']:.3f} "
                  f"seconds={seconds:.1f}", flush=True)  # fmt: skip
    before_success, before_turns = held_out(_fresh(model), args.seeds[0], args.eval_prompts, args.parity)
    print(f"untrained: heldout_success={before_success:.3f} mean_turns={before_turns:.2f}")
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


def _fresh(model: str):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)


if __name__ == "__main__":
    main()
