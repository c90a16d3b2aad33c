"""Evaluation metrics over k samples per prompt: pass@1, pass@k and maj@k.

pass@k uses the unbiased estimator of Chen et al. 2021 (Codex, eq. 1): with n samples of
which c are correct, pass@k = 1 - C(n-c, k) / C(n, k). maj@k is the accuracy of the most
common extracted answer among k samples (self-consistency, Wang et al. 2022); ties go to
the answer seen first.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k samples drawn from n (c correct) is correct."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def extract_answer(completion: str) -> str:
    """The answer a completion commits to: the last `\\boxed{}`, else the text after the last
    `####`, else the first number; whitespace-stripped. Used only to group samples for maj@k."""
    boxed = _BOXED.findall(completion)
    if boxed:
        return boxed[-1].strip()
    if "####" in completion:
        return completion.rsplit("####", 1)[1].strip()
    m = _NUMBER.search(completion)
    return m.group().replace(",", "") if m else completion.strip()


def majority_correct(answers: Sequence[str], rewards: Sequence[float]) -> float:
    """Reward of the most common answer (its first sample's reward; all samples of one answer
    score alike under a deterministic reward)."""
    if len(answers) != len(rewards) or not answers:
        raise ValueError(
            f"majority_correct needs equal, non-empty answers and rewards; got {len(answers)} and {len(rewards)}"
        )
    top = Counter(answers).most_common()
    best = max(count for _, count in top)
    winner = next(a for a in answers if Counter(answers)[a] == best)
    return float(rewards[answers.index(winner)])


def prompt_metrics(answers: Sequence[str], rewards: Sequence[float], k: int) -> dict[str, float]:
    """pass@1, pass@k and maj@k of one prompt's samples (a reward > 0.5 counts as correct)."""
    n = len(rewards)
    c = sum(1 for r in rewards if r > 0.5)
    return {"pass@1": c / n, f"pass@{k}": pass_at_k(n, c, min(k, n)), f"maj@{k}": majority_correct(answers, rewards)}
