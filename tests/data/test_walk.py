"""The digit-walk task: answers, lengths, splits and the exact reward."""

from __future__ import annotations

import random

import pytest

from arealite.data.walk import (
    DIGIT_MAP,
    draw_steps,
    make_walk_dataset,
    response_lengths,
    walk_reward_fn,
    worked_answer,
)


def _naive_answer(start: int, steps: int) -> str:
    digits = [start]
    for _ in range(steps):
        digits.append(int(DIGIT_MAP[digits[-1]]))
    return "\n".join(f"{steps - i:02d}:{digits[i]}>{digits[i + 1]}" for i in range(steps))


def test_the_map_is_one_cycle_through_all_ten_digits():
    seen, d = [], 0
    for _ in range(10):
        seen.append(d)
        d = int(DIGIT_MAP[d])
    assert d == 0 and sorted(seen) == list(range(10))


def test_answers_follow_the_map_and_the_splits_share_no_prompt():
    records = make_walk_dataset(300, seed=3)
    for r in records:
        start, steps = (int(v) for v in r["messages"][0]["content"].split()[1:])
        assert steps == r["steps"] and r["answer"] == _naive_answer(start, steps)
    assert make_walk_dataset(300, seed=3) == records  # deterministic
    assert make_walk_dataset(300, seed=4) != records
    test = {r["messages"][0]["content"] for r in make_walk_dataset(300, seed=3, split="test")}
    assert test and not test & {r["messages"][0]["content"] for r in records}


def test_lengths_have_a_long_tail_and_match_the_tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    lengths = sorted(response_lengths(4000, seed=0, median_steps=7, max_steps=50))
    p50, p95 = lengths[len(lengths) // 2], lengths[int(0.95 * len(lengths))]
    assert p50 >= 40 and p95 >= 3 * p50, (p50, p95)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    for r in make_walk_dataset(50, seed=1, max_steps=50):
        assert len(tokenizer.encode(r["answer"], add_special_tokens=False)) + 1 == 7 * r["steps"]  # + stop token


def test_reward_is_one_only_for_the_whole_answer_then_stop():
    answer = worked_answer(3, 4)  # 04:3>0 03:0>4 02:4>7 01:7>8
    assert walk_reward_fn("", answer, answer=answer, completion_ids=list(range(len(answer) + 1))) == 1.0
    assert walk_reward_fn("", answer, answer=answer, truncated=True) == 0.0
    assert walk_reward_fn("", answer[:-1] + "9", answer=answer) == 0.0  # the last step mapped wrong
    assert walk_reward_fn("", answer.replace("03:0>4", "03:0>5"), answer=answer) == 0.0  # a middle step wrong
    assert walk_reward_fn("", answer.replace("02:", "01:"), answer=answer) == 0.0  # the count off
    assert walk_reward_fn("", answer.rsplit("\n", 1)[0], answer=answer) == 0.0  # a step short
    assert walk_reward_fn("", answer + "\n00:8>2", answer=answer) == 0.0  # a step too many
    assert walk_reward_fn("", answer + "\n", answer=answer) == 0.0
    # special tokens are invisible in the text: caught by the token count
    assert walk_reward_fn("", answer, answer=answer, completion_ids=list(range(len(answer) + 2))) == 0.0


def test_step_counts_stay_in_range_and_bad_settings_are_named():
    rng = random.Random(0)
    assert {draw_steps(rng, 7.0, 50) for _ in range(5000)} <= set(range(1, 51))
    with pytest.raises(ValueError, match="max_steps=120"):
        make_walk_dataset(4, max_steps=120)
    with pytest.raises(ValueError, match="median_steps=60"):
        make_walk_dataset(4, median_steps=60, max_steps=50)
    with pytest.raises(ValueError, match="split='valid'"):
        make_walk_dataset(4, split="valid")
