"""A worked recurrence whose answers run from a few tens to several hundred tokens: the
Fibonacci sequence mod 10, written out term by term. Learnable by a tiny model on a CPU.

The prompt `fib 3 5 17` asks for 17 terms after the start digits 3 and 5. The answer has one
line per term, counting the steps down: `17:3+5=8`, `16:5+8=3`, ... `01:...`; each line adds
the last two digits mod 10 and the last line's sum is the final answer. Every line is nine
tokens for Qwen2-style tokenizers (digits split one by one), newline included, so an answer
of n steps is 9n tokens with the stop token. The step count is drawn from a log-normal
distribution (median `median_steps`, capped at `max_steps` <= 99), so lengths have a long tail.

The reward is exact, as in `arealite.data.arithmetic`: 1 only when the completion is the whole
worked answer (every step, the count and the final sum right) followed by the stop token.
"""

from __future__ import annotations

import math
import random
from typing import Any

MEDIAN_STEPS = 6.0
MAX_STEPS = 99  # the step count is written with two digits
SIGMA = 0.75  # log-normal spread of the step count: p95 / p50 = exp(1.645 * SIGMA) = 3.4


def draw_steps(rng: random.Random, median_steps: float = MEDIAN_STEPS, max_steps: int = MAX_STEPS) -> int:
    """A step count from the task's long-tailed distribution: log-normal, in 1..max_steps."""
    return min(max_steps, max(1, round(rng.lognormvariate(math.log(median_steps), SIGMA))))


def worked_answer(x: int, y: int, steps: int) -> str:
    """The answer to `fib x y steps`: one `kk:x+y=z` line per step, kk counting down to 01."""
    if not (0 <= x <= 9 and 0 <= y <= 9 and 1 <= steps <= MAX_STEPS):
        raise ValueError(f"fib {x} {y} {steps}: start digits must be 0..9 and steps 1..{MAX_STEPS}")
    lines = []
    for k in range(steps, 0, -1):
        z = (x + y) % 10
        lines.append(f"{k:02d}:{x}+{y}={z}")
        x, y = y, z
    return "\n".join(lines)


def _check(median_steps: float, max_steps: int) -> None:
    if not 1 <= max_steps <= MAX_STEPS:
        raise ValueError(f"max_steps={max_steps} must be in 1..{MAX_STEPS} (the count is written with two digits)")
    if not 1.0 <= median_steps <= max_steps:
        raise ValueError(f"median_steps={median_steps} must be in 1..max_steps={max_steps}")


def make_fibonacci_dataset(
    num_samples: int,
    seed: int = 0,
    split: str = "train",
    median_steps: float = MEDIAN_STEPS,
    max_steps: int = MAX_STEPS,
) -> list[dict[str, Any]]:
    """`num_samples` records `{"id", "messages", "answer", "steps"}`; train and test splits
    differ. Deterministic for a seed."""
    if num_samples < 1:
        raise ValueError(f"num_samples={num_samples} must be >= 1")
    _check(median_steps, max_steps)
    rng = random.Random(f"fibonacci-{seed}-{split}")
    out = []
    for i in range(num_samples):
        steps = draw_steps(rng, median_steps, max_steps)
        x, y = rng.randrange(10), rng.randrange(10)
        out.append(
            {
                "id": f"fib-{split}-{seed}-{i}",
                "messages": [{"role": "user", "content": f"fib {x} {y} {steps:02d}"}],
                "answer": worked_answer(x, y, steps),
                "steps": steps,
            }
        )
    return out


def response_lengths(
    num_samples: int, seed: int = 0, median_steps: float = MEDIAN_STEPS, max_steps: int = MAX_STEPS
) -> list[int]:
    """Token counts of `num_samples` correct answers (stop token included) drawn from the task's
    distribution: what a trained policy generates, for benchmarks that need realistic lengths."""
    if num_samples < 1:
        raise ValueError(f"num_samples={num_samples} must be >= 1")
    _check(median_steps, max_steps)
    rng = random.Random(f"fibonacci-lengths-{seed}")
    return [9 * draw_steps(rng, median_steps, max_steps) for _ in range(num_samples)]


def fibonacci_reward_fn(
    prompt: str,
    completion: str,
    prompt_ids: Any = None,
    completion_ids: Any = None,
    answer: str = "",
    truncated: bool = False,
    **_: Any,
) -> float:
    """1.0 when `completion` is the whole worked `answer` and ended with a stop token, else 0.0.

    Special tokens are invisible in the decoded `completion`, so the token count bounds them:
    the answer's characters take at most one token each, plus one stop token.
    """
    answer = str(answer).strip()
    if truncated or completion != answer:
        return 0.0
    if completion_ids is not None and len(completion_ids) > len(answer) + 1:
        return 0.0
    return 1.0
