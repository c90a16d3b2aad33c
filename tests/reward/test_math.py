"""GSM8K and boxed-answer rewards against real dataset answers and tricky completions."""

import json

import pytest

from arealite.reward.math import (
    boxed_reward_fn,
    extract_gsm8k_answer,
    gsm8k_reward_fn,
    last_boxed,
    math_equal,
)


def test_extract_gsm8k_answer_forms():
    assert extract_gsm8k_answer("She makes 9 * 2 = 18.\n#### 18") == "18"
    assert extract_gsm8k_answer("#### 1,234.") == "1234"
    assert extract_gsm8k_answer("first #### 3 then #### $-7") == "-7"
    assert extract_gsm8k_answer("the answer is \\boxed{42}") == "42"
    assert extract_gsm8k_answer("no marked answer 42") is None


def test_last_boxed_balances_braces():
    assert last_boxed("x \\boxed{1} y \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert last_boxed("\\fbox{a{b}c}") == "a{b}c"
    assert last_boxed("\\boxed{unclosed") is None
    assert last_boxed("nothing") is None


@pytest.mark.parametrize(
    "completion, answer, expected",
    [
        ("Adding up: 16 - 3 - 4 = 9, 9 * 2 = 18.\n#### 18", "18", 1.0),
        ("#### 18.0", "18", 1.0),
        ("#### 1,000", "1000", 1.0),
        ("so \\boxed{18}", "Janet sells 9 eggs.\n#### 18", 1.0),  # full solution as reference
        ("#### 17", "18", 0.0),
        ("18", "18", 0.0),  # no final-answer mark: not credited
        ("", "18", 0.0),
    ],
)
def test_gsm8k_reward(completion, answer, expected):
    assert gsm8k_reward_fn("prompt", completion, [1], [2], answer=answer) == expected


def test_gsm8k_reward_on_dataset_solutions(shared_data):
    """Every reference solution scores 1 against its own final number, 0 against another."""
    with open(shared_data / "gsm8k" / "test.jsonl") as f:
        rows = [json.loads(next(f)) for _ in range(20)]
    for row in rows:
        final = row["answer"].split("####")[-1].strip()
        assert gsm8k_reward_fn(row["question"], row["answer"], None, None, answer=final) == 1.0
        wrong = str(int(final.replace(",", "")) + 1)
        assert gsm8k_reward_fn(row["question"], row["answer"], None, None, answer=wrong) == 0.0


@pytest.mark.parametrize(
    "completion, answer, expected",
    [
        ("so \\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("\\boxed{\\dfrac{1}{2}}", "\\frac12", 1.0),
        ("\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}", "\\left( 3, \\frac{\\pi}{2} \\right)", 1.0),
        ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}", 1.0),
        ("\\boxed{x^2+2x+1}", "(x+1)^2", 1.0),
        ("\\boxed{3}", "4", 0.0),
        ("the answer is 4", "4", 0.0),  # not boxed
        ("\\boxed{}", "4", 0.0),
    ],
)
def test_boxed_reward(completion, answer, expected):
    assert boxed_reward_fn("prompt", completion, None, None, answer=answer) == expected


def test_boxed_reward_on_math500_solutions(shared_data):
    with open(shared_data / "math500" / "test.jsonl") as f:
        rows = [json.loads(next(f)) for _ in range(15)]
    for row in rows:
        assert boxed_reward_fn(row["problem"], row["solution"], None, None, answer=row["answer"]) == 1.0, row["answer"]


def test_empty_reference_is_an_error_not_a_zero():
    with pytest.raises(ValueError, match="empty reference answer"):
        gsm8k_reward_fn("p", "#### 3", None, None, answer="")
    with pytest.raises(ValueError, match="empty reference answer"):
        boxed_reward_fn("p", "\\boxed{3}", None, None, answer="  ")


def test_math_equal_numbers_and_latex():
    assert math_equal("0.25", "1/4")
    assert math_equal("1,000", "1000")
    assert not math_equal("0.26", "1/4")
