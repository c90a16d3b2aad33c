"""A synthetic arithmetic task that a tiny model can learn on a CPU in minutes.

Prompts are short questions such as `17+5=`; the answer is the integer result. The reward
is 1 only for a well-formed answer: the completion is exactly the integer, then a stop token
(EOS), else 0 — exact and cheap, so learning progress is visible without a large model.
Deterministic for a seed.

Why so strict: a reward that reads only the first integer leaves every token after it free,
and RL then drifts the tail into noise (seen on CPU: entropy rising to 3.3 nats and every
response running to `max_new_tokens`). Scoring the whole completion, the stop included,
makes stopping part of the task.
"""

from __future__ import annotations

import random
from typing import Any

BARE_QUESTION = "{a}{op}{b}="
_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def make_arithmetic_dataset(
    num_samples: int,
    seed: int = 0,
    max_operand: int = 20,
    ops: str = "+-",
    split: str = "train",
    min_operand: int = 0,
    question: str = BARE_QUESTION,
) -> list[dict[str, Any]]:
    """`num_samples` records `{"id", "messages", "answer"}`; train and test splits differ.

    `question` is the user message, a format string of `{a}`, `{op}` and `{b}`: the bare
    `17+5=` for a model trained from scratch, an instruction for an instruct model."""
    if num_samples < 1:
        raise ValueError(f"num_samples={num_samples} must be >= 1")
    if not 0 <= min_operand <= max_operand:
        raise ValueError(f"min_operand={min_operand} must be in 0..max_operand={max_operand}")
    bad = set(ops) - set(_OPS)
    if bad or not ops:
        raise ValueError(f"ops={ops!r} may only contain {sorted(_OPS)}")
    try:
        question.format(a=1, op="+", b=2)
    except (KeyError, IndexError, ValueError) as e:
        raise ValueError(
            f"question={question!r} is not a format string of {{a}}, {{op}} and {{b}} ({e!r}); "
            'e.g. "What is {a} {op} {b}? Reply with only the number."'
        ) from None
    rng = random.Random(f"{seed}-{split}")
    out = []
    for i in range(num_samples):
        a, b = rng.randint(min_operand, max_operand), rng.randint(min_operand, max_operand)
        op = rng.choice(ops)
        out.append(
            {
                "id": f"arith-{split}-{seed}-{i}",
                "messages": [{"role": "user", "content": question.format(a=a, op=op, b=b)}],
                "answer": str(_OPS[op](a, b)),
            }
        )
    return out


def arithmetic_reward_fn(
    prompt: str,
    completion: str,
    prompt_ids: Any = None,
    completion_ids: Any = None,
    answer: str = "",
    truncated: bool = False,
    **_: Any,
) -> float:
    """1.0 when `completion` is exactly `answer` and the response ended with a stop token, else 0.0.

    `completion` is decoded without special tokens, so special tokens between the answer and
    the stop would be invisible in it; they are caught by the token count instead: the
    answer's characters take at most one token each, plus one stop token.
    """
    answer = str(answer).strip()
    if truncated or completion != answer:
        return 0.0
    if completion_ids is not None and len(completion_ids) > len(answer) + 1:
        return 0.0
    return 1.0
