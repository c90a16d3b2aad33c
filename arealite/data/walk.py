"""A worked digit walk whose answers run from a few tens to several hundred tokens, with a long
tail: the reasoning job's task, learnable by a tiny model on a CPU in minutes.

The prompt `walk 3 17` asks for 17 steps of a fixed digit map starting from the digit 3. The
answer has one line per step, counting the steps down: `17:3>0`, `16:0>4`, ... `01:...>d`;
each line maps the last digit by `DIGIT_MAP` (the digit d goes to `DIGIT_MAP[d]`, one cycle
through all ten digits) and the last line's digit is the final answer. A line is seven tokens
for Qwen2-style tokenizers (digits split one by one), newline included, so an answer of n steps
is 7n tokens with the stop token. The step count is log-normal (median `median_steps`, spread
`SIGMA`, capped at `max_steps` <= 99), so lengths have a long tail: with median 7 and at most
50 steps, correct answers are 7 to 350 tokens, median 49, 95th percentile 210.

Every step is a copy, a ten-entry lookup and a count-down, which a two-layer model of width 64
can represent: a short SFT warm start leaves each step unreliable when sampled, so long chains
are rarely all right, and RL makes the whole chain reliable. The reward is exact: 1 only when
the completion is the whole worked answer (every step, the count and the final digit right)
followed by the stop token.
"""

from __future__ import annotations

import math
import random
from typing import Any

from arealite.data.arithmetic import arithmetic_reward_fn

DIGIT_MAP = "4690713825"  # d -> int(DIGIT_MAP[d]): 0>4>7>8>2>9>5>1>6>3>0
MEDIAN_STEPS = 7.0
MAX_STEPS = 99  # the step count is written with two digits
SIGMA = 0.9  # log-normal spread of the step count: p95 / p50 = exp(1.645 * SIGMA) = 4.4
TOKENS_PER_STEP = 7  # `kk:x>y` and a newline (the last line: the stop token)


def draw_steps(rng: random.Random, median_steps: float = MEDIAN_STEPS, max_steps: int = MAX_STEPS) -> int:
    """A step count from the task's long-tailed distribution: log-normal, in 1..max_steps."""
    return min(max_steps, max(1, round(rng.lognormvariate(math.log(median_steps), SIGMA))))


def worked_answer(start: int, steps: int) -> str:
    """The answer to `walk start steps`: one `kk:x>y` line per step, kk counting down to 01."""
    if not (0 <= start <= 9 and 1 <= steps <= MAX_STEPS):
        raise ValueError(f"walk {start} {steps}: the start must be a digit and steps 1..{MAX_STEPS}")
    lines, x = [], start
    for k in range(steps, 0, -1):
        y = int(DIGIT_MAP[x])
        lines.append(f"{k:02d}:{x}>{y}")
        x = y
    return "\n".join(lines)


def in_test_split(start: int, steps: int) -> bool:
    """Whether the prompt `walk start steps` is held out: a fixed quarter of all prompts, drawn
    independently of the seed, spread over every start digit and step count."""
    return random.Random(f"walk-split-{start}-{steps}").random() < 0.25


def _check(median_steps: float, max_steps: int) -> None:
    if not 1 <= max_steps <= MAX_STEPS:
        raise ValueError(f"max_steps={max_steps} must be in 1..{MAX_STEPS} (the count is written with two digits)")
    if not 1.0 <= median_steps <= max_steps:
        raise ValueError(f"median_steps={median_steps} must be in 1..max_steps={max_steps}")


def make_walk_dataset(
    num_samples: int,
    seed: int = 0,
    split: str = "train",
    median_steps: float = MEDIAN_STEPS,
    max_steps: int = MAX_STEPS,
) -> list[dict[str, Any]]:
    """`num_samples` records `{"id", "messages", "answer", "steps"}`. Deterministic for a seed.

    The splits share no prompt: each prompt `(start, steps)` belongs to one split (`in_test_split`,
    a fixed pseudo-random quarter of them for the test split), so held-out accuracy is measured
    on prompts never trained on (there are only 10 x max_steps distinct prompts)."""
    if num_samples < 1:
        raise ValueError(f"num_samples={num_samples} must be >= 1")
    if split not in ("train", "test"):
        raise ValueError(f"split={split!r} must be 'train' or 'test'")
    _check(median_steps, max_steps)
    rng = random.Random(f"walk-{seed}-{split}")
    out = []
    for i in range(num_samples):
        while True:  # a prompt of this split: its step count drawn from the split's share of the distribution
            steps, start = draw_steps(rng, median_steps, max_steps), rng.randrange(10)
            if in_test_split(start, steps) == (split == "test"):
                break
        out.append(
            {
                "id": f"walk-{split}-{seed}-{i}",
                "messages": [{"role": "user", "content": f"walk {start} {steps:02d}"}],
                "answer": worked_answer(start, steps),
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
    rng = random.Random(f"walk-lengths-{seed}")
    return [TOKENS_PER_STEP * draw_steps(rng, median_steps, max_steps) for _ in range(num_samples)]


# Exact match of the whole worked answer, stop token required: the arithmetic task's reward.
walk_reward_fn = arithmetic_reward_fn
