"""Verifiable math rewards: GSM8K (`#### 42`) and MATH-style `\\boxed{...}` answers.

Answers are extracted from the completion and compared with math-verify, which knows that
`0.5`, `1/2` and `\\frac{1}{2}` are equal. math-verify times itself out with `signal.alarm`,
so these functions must run in the main thread of a process: workflows call them through
`arealite.reward.pool.RewardPool` (a process pool), never in a thread.

Every reward function has the workflow signature
`fn(prompt, completion, prompt_ids, completion_ids, **data) -> float` and returns 1.0 for a
correct final answer and 0.0 otherwise (including when no answer can be found).
"""

from __future__ import annotations

import re
from typing import Any

_GSM8K_MARK = re.compile(r"####\s*\$?\s*(-?[\d,]*\.?\d+)")
_NUMBER = re.compile(r"-?\d[\d,]*\.?\d*|-?\.\d+")


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (or `\\fbox{...}`) in `text`, braces balanced."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    brace = text.find("{", start)
    if brace < 0:
        return None
    depth = 0
    for i in range(brace, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[brace + 1 : i]
    return None


def _clean_number(text: str) -> str:
    return text.replace(",", "").replace("$", "").strip().rstrip(".")


def extract_gsm8k_answer(text: str) -> str | None:
    """The final answer of a GSM8K-style solution: the number after the last `####`, else
    the last `\\boxed{}`; None when neither is present."""
    marks = _GSM8K_MARK.findall(text)
    if marks:
        return _clean_number(marks[-1])
    boxed = last_boxed(text)
    return _clean_number(boxed) if boxed is not None else None


def _numbers_equal(a: str, b: str) -> bool | None:
    """Exact numeric comparison when both sides are plain numbers; None otherwise."""
    if not (_NUMBER.fullmatch(a) and _NUMBER.fullmatch(b)):
        return None
    try:
        return abs(float(a.replace(",", "")) - float(b.replace(",", ""))) <= 1e-6 * max(
            1.0, abs(float(b.replace(",", "")))
        )
    except ValueError:
        return None


def math_equal(prediction: str, gold: str) -> bool:
    """Whether two final answers (LaTeX or plain) are mathematically equal, by math-verify."""
    same = _numbers_equal(_clean_number(prediction), _clean_number(gold))
    if same is not None:
        return same
    from math_verify import parse, verify  # imported lazily: it pulls in sympy

    gold_parsed = parse(f"${gold}$")
    pred_parsed = parse(f"${prediction}$")
    if not gold_parsed or not pred_parsed:
        return prediction.strip() == gold.strip()
    return bool(verify(gold_parsed, pred_parsed))


def gsm8k_reward_fn(
    prompt: str, completion: str, prompt_ids: Any = None, completion_ids: Any = None, answer: str = "", **kw: Any
) -> float:
    """1.0 if the completion's final answer (`#### x` or `\\boxed{x}`) equals the reference.

    `answer` may be the bare number or a full GSM8K solution ending in `#### x`.
    """
    gold = extract_gsm8k_answer(answer) or _clean_number(answer)
    if not gold:
        raise ValueError("gsm8k_reward_fn got an empty reference answer; records need answer='<final number>'")
    predicted = extract_gsm8k_answer(completion)
    if predicted is None:
        return 0.0
    return 1.0 if math_equal(predicted, gold) else 0.0


def boxed_reward_fn(
    prompt: str, completion: str, prompt_ids: Any = None, completion_ids: Any = None, answer: str = "", **kw: Any
) -> float:
    """1.0 if the last `\\boxed{}` of the completion equals the reference answer (MATH-500)."""
    gold = last_boxed(answer) if "\\boxed" in answer else answer
    if not gold or not gold.strip():
        raise ValueError("boxed_reward_fn got an empty reference answer; records need answer='<final answer>'")
    predicted = last_boxed(completion)
    if predicted is None or not predicted.strip():
        return 0.0
    return 1.0 if math_equal(predicted, gold) else 0.0
