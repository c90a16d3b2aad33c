"""Prepare a tiny LLM judge offline: a random tiny model fine-tuned to answer one rubric question.

    python -m arealite.tools.tiny_judge --config configs/tiny_cpu_judge.yaml [--digit 7 --steps 300]

The judge approves (answers `yes`) exactly when the completion contains `--digit`, a property
the policy's warm start rarely shows (so a policy trained on the judge's verdict has room to
learn it). Its training prompts are `judge.rubric` rendered for the training set's questions
and synthetic completions (numbers and short junk strings, half of them with the digit), sent
as a user turn through the chat template, as `arealite.reward.judge` renders them; the target
is `yes` or `no` then EOS. Writes `judge.path` (the random base goes to `<judge.path>_base`),
prints the judge's held-out agreement with the rule (`judge_agreement=<x>`), and does nothing
when `judge.path` already holds a model, so it can sit in `launcher.setup_commands`.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import time
from typing import Any

from arealite.config import GRPOConfig, MicroBatchSpec, OptimizerConfig, TrainEngineConfig, load_config

_JUNK = "0123456789+=- abcxyz"


def synthetic_completion(rng: random.Random) -> str:
    """A completion a warm-started arithmetic policy might write: a number, or a short mess."""
    kind = rng.random()
    if kind < 0.5:
        return str(rng.randint(0, 19))
    if kind < 0.8:
        return str(rng.randint(0, 99))
    return "".join(rng.choice(_JUNK) for _ in range(rng.randint(1, 5))).strip() or "0"


def judge_records(records: list[dict[str, Any]], rubric: str, digit: str, n: int, seed: int) -> list[dict[str, Any]]:
    """`n` SFT records, half approved: the rubric over a question and a completion, target yes / no."""
    from arealite.reward.judge import render_rubric

    rng = random.Random(seed)
    out = []
    while len(out) < n:
        record = rng.choice(records)
        want = len(out) % 2 == 0  # alternate, so the classes stay balanced
        completion = synthetic_completion(rng)
        if (digit in completion) != want:
            continue
        text = render_rubric(rubric, "", completion, record)
        out.append({"messages": [{"role": "user", "content": text}], "completion": "yes" if want else "no"})
    return out


def agreement(model_dir: str, records: list[dict[str, Any]]) -> float:
    """Share of `records` where P(yes) / (P(yes) + P(no)) of the first reply token is on the target's side."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from arealite.workflow.prompt import encode_prompt

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    yes_id, no_id = tokenizer.encode("yes")[0], tokenizer.encode("no")[0]
    right = 0
    with torch.no_grad():
        for r in records:
            logits = model(torch.tensor([encode_prompt(tokenizer, r)])).logits[0, -1]
            approves = bool(logits[yes_id] > logits[no_id])
            right += approves == (r["completion"] == "yes")
    return right / len(records)


def prepare_judge(config: GRPOConfig, digit: str, steps: int, batch_size: int, lr: float, seed: int) -> str:
    """Build, fine-tune and save the judge to `config.judge.path`; returns that path."""
    import torch
    from transformers import AutoTokenizer

    from arealite.data.loader import load_records
    from arealite.tools.tiny_model import build_tiny_model
    from arealite.train.engine import FSDPEngine
    from arealite.train.sft import sft_batch, sft_step

    judge = config.judge
    if judge is None or not judge.path:
        raise ValueError("tiny_judge writes judge.path, but the config has no judge.path; add a `judge:` section")
    base = build_tiny_model(judge.path.rstrip("/") + "_base", seed=seed)
    torch.manual_seed(seed)
    engine = FSDPEngine(
        TrainEngineConfig(path=base, optimizer=OptimizerConfig(lr=lr, gradient_clipping=1.0), mb_spec=MicroBatchSpec()),
        total_optimizer_steps=steps,
    ).initialize()
    tokenizer = AutoTokenizer.from_pretrained(base)
    questions = load_records(config.train_dataset, split="train", seed=config.seed)
    train = judge_records(questions, judge.rubric, digit, steps * batch_size, seed)
    started = time.monotonic()
    for step in range(steps):
        stats = sft_step(engine, sft_batch(train[step * batch_size : (step + 1) * batch_size], tokenizer))
        if step % 50 == 0 or step == steps - 1:
            print(f"[judge] step {step} loss={stats['loss']:.4f}", flush=True)
    partial = judge.path.rstrip("/") + ".partial"  # a killed run never leaves a half model behind
    engine.save(partial)
    engine.destroy()
    if os.path.isdir(judge.path):
        shutil.rmtree(judge.path)
    os.replace(partial, judge.path)
    held_out = judge_records(
        load_records(config.train_dataset, split="test", seed=config.seed), judge.rubric, digit, 400, seed + 1
    )
    print(f"[judge] wrote {judge.path} in {time.monotonic() - started:.1f}s", flush=True)
    print(f"judge_agreement={agreement(judge.path, held_out):.4f}", flush=True)
    return judge.path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--digit", default="7", help="the judge approves completions containing this character")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    args, overrides = p.parse_known_args(argv)
    config = load_config(overrides, GRPOConfig)
    from arealite.tools.sft_warmstart import has_model

    if config.judge is not None and os.path.isdir(config.judge.path) and has_model(config.judge.path):
        print(f"[judge] {config.judge.path} already holds a model; skipping", flush=True)
        return 0
    prepare_judge(config, args.digit, args.steps, args.batch_size, args.lr, args.seed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
