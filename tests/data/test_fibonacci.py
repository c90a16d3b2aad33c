"""The worked-recurrence task: answers, lengths, splits and the exact reward."""

from __future__ import annotations

import random

import pytest

from arealite.data.fibonacci import (
    draw_steps,
    fibonacci_reward_fn,
    make_fibonacci_dataset,
    response_lengths,
    worked_answer,
)


def _naive_answer(x: int, y: int, steps: int) -> str:
    seq = [x, y]
    while len(seq) < steps + 2:
        seq.append((seq[-1] + seq[-2]) % 10)
    return "\n".join(f"{steps - i:02d}:{seq[i]}+{seq[i + 1]}={seq[i + 2]}" for i in range(steps))


def test_answers_follow_the_recurrence_and_splits_differ():
    records = make_fibonacci_dataset(300, seed=3)
    for r in records:
        x, y, steps = (int(v) for v in r["messages"][0]["content"].split()[1:])
        assert steps == r["steps"] and r["answer"] == _naive_answer(x, y, steps)
    assert make_fibonacci_dataset(300, seed=3) == records  # deterministic
    test = {r["messages"][0]["content"] for r in make_fibonacci_dataset(300, seed=3, split="test")}
    assert test != {r["messages"][0]["content"] for r in records}


def test_lengths_have_a_long_tail_and_match_the_tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    lengths = sorted(response_lengths(4000, seed=0))
    p50, p95 = lengths[len(lengths) // 2], lengths[int(0.95 * len(lengths))]
    assert p50 >= 40 and p95 >= 3 * p50, (p50, p95)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    for r in make_fibonacci_dataset(50, seed=1, max_steps=40):
        assert len(tokenizer.encode(r["answer"], add_special_tokens=False)) + 1 == 9 * r["steps"]  # + stop token


def test_reward_is_one_only_for_the_whole_answer_then_stop():
    answer = worked_answer(3, 5, 4)
    assert fibonacci_reward_fn("", answer, answer=answer, completion_ids=list(range(len(answer) + 1))) == 1.0
    assert fibonacci_reward_fn("", answer, answer=answer, truncated=True) == 0.0
    assert fibonacci_reward_fn("", answer[:-1] + "0", answer=answer) == 0.0  # a wrong final sum
    assert fibonacci_reward_fn("", answer.rsplit("\n", 1)[0], answer=answer) == 0.0  # a step short
    assert fibonacci_reward_fn("", answer + "\n", answer=answer) == 0.0
    # special tokens are invisible in the text: caught by the token count
    assert fibonacci_reward_fn("", answer, answer=answer, completion_ids=list(range(len(answer) + 2))) == 0.0


def test_step_counts_stay_in_range_and_bad_settings_are_named():
    rng = random.Random(0)
    assert {draw_steps(rng, 6.0, 40) for _ in range(5000)} <= set(range(1, 41))
    with pytest.raises(ValueError, match="max_steps=120"):
        make_fibonacci_dataset(4, max_steps=120)
    with pytest.raises(ValueError, match="median_steps=50"):
        make_fibonacci_dataset(4, median_steps=50, max_steps=40)
