"""Evaluation metrics against brute-force definitions."""

from __future__ import annotations

import itertools
import random

import pytest

from arealite.eval.metrics import extract_answer, majority_correct, pass_at_k, prompt_metrics


def _pass_at_k_brute(correct: list[bool], k: int) -> float:
    subsets = list(itertools.combinations(range(len(correct)), k))
    return sum(any(correct[i] for i in s) for s in subsets) / len(subsets)


def test_pass_at_k_equals_enumeration_over_subsets():
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(1, 8)
        correct = [rng.random() < 0.4 for _ in range(n)]
        k = rng.randint(1, n)
        assert pass_at_k(n, sum(correct), k) == pytest.approx(_pass_at_k_brute(correct, k))


def test_pass_at_k_rejects_impossible_counts():
    with pytest.raises(ValueError, match="n=4, c=5, k=1"):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError, match="k=5"):
        pass_at_k(4, 1, 5)


def test_extract_answer_prefers_boxed_then_hashes_then_first_number():
    assert extract_answer("so \\boxed{12} and \\boxed{ 7 }") == "7"
    assert extract_answer("3 apples ... #### 1,234") == "1,234"
    assert extract_answer("17 then 3") == "17"
    assert extract_answer("-1,200.5 left") == "-1200.5"
    assert extract_answer("  no number ") == "no number"


def test_majority_takes_the_most_common_answer_first_seen_on_ties():
    assert majority_correct(["3", "4", "4", "3", "4"], [1, 0, 0, 1, 0]) == 0.0
    assert majority_correct(["3", "4", "4", "3"], [1, 0, 0, 1]) == 1.0  # tie: "3" was seen first
    with pytest.raises(ValueError):
        majority_correct(["1"], [1.0, 0.0])


def test_prompt_metrics_of_one_group():
    m = prompt_metrics(["5", "5", "6", "7"], [1.0, 1.0, 0.0, 0.0], k=4)
    assert m == {"pass@1": 0.5, "pass@4": 1.0, "maj@4": 1.0}
