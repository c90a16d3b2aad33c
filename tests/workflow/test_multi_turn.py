"""MultiTurnWorkflow: feedback after wrong answers, discounted rewards, loss on model tokens only."""

import pytest
import torch

from arealite.config import GenerationHyperparameters
from arealite.reward.math import gsm8k_reward_fn
from arealite.workflow import MultiTurnWorkflow

from .rewards import completion_length, wrong_until_feedback

pytestmark = pytest.mark.timeout(180)
FEEDBACK = "Wrong, try once more."


def segments(mask_row):
    """Runs of equal loss_mask values after the prompt: [(value, start, end), ...]."""
    runs, start = [], None
    values = mask_row.tolist()
    first = values.index(1)
    for i in range(first, len(values) + 1):
        if i == len(values) or (i > first and values[i] != values[i - 1]):
            runs.append((values[i - 1], start, i))
            start = i
        if start is None:
            start = i
    return runs


def test_second_answer_after_feedback(server_engine, tokenizer):
    gconfig = GenerationHyperparameters(group_size=2, max_new_tokens=6, min_new_tokens=3)
    workflow = MultiTurnWorkflow(
        wrong_until_feedback, gconfig, tokenizer, max_turns=3, turn_discount=0.5, feedback=FEEDBACK
    )
    record = {
        "id": "q",
        "messages": [{"role": "user", "content": "What is 3 + 4?"}],
        "answer": "7",
        "feedback_marker": FEEDBACK,
    }
    batch = server_engine.rollout_batch([record], workflow)
    assert batch["num_turns"].tolist() == [2, 2]
    assert batch["rewards"].tolist() == [0.5, 0.5]  # correct on the second turn: 1.0 * 0.5**1
    for row in range(2):
        valid = batch["attention_mask"][row].bool()
        mask = batch["loss_mask"][row][valid]
        runs = segments(mask)
        assert [v for v, _, _ in runs] == [1, 0, 1]  # answer, feedback, answer
        _, fb_start, fb_end = runs[1]
        feedback_text = tokenizer.decode(batch["input_ids"][row][valid][fb_start:fb_end])
        assert FEEDBACK in feedback_text and feedback_text.rstrip().endswith("assistant")
        assert (batch["versions"][row][valid][fb_start:fb_end] == -1).all()
        assert (batch["logprobs"][row][valid][fb_start:fb_end] == 0).all()
        assert (batch["logprobs"][row][valid][mask.bool()] < 0).all()
        # each answer's tokens carry its turn; each turn's reward (times 0.5**turn) sits on its last token
        turns = batch["turn_ids"][row][valid]
        (_, a0, b0), _, (_, a1, b1) = runs
        assert (turns[a0:b0] == 0).all() and (turns[fb_start:fb_end] == -1).all() and (turns[a1:b1] == 1).all()
        # min_new_tokens banned the stop tokens for the first 3 tokens of each answer, its own generation
        banned = batch["stop_banned"][row][valid]
        for a, b in ((a0, b0), (a1, b1)):
            assert banned[a:b].tolist() == [i < 3 for i in range(b - a)]
        assert not banned[fb_start:fb_end].any()
        rewards = batch["turn_rewards"][row][valid]
        assert rewards[b1 - 1].item() == 0.5 and rewards.abs().sum().item() == 0.5
    assert workflow.stats["turns"] == 4


def test_stops_after_max_turns(server_engine, tokenizer):
    gconfig = GenerationHyperparameters(group_size=1, max_new_tokens=4)
    workflow = MultiTurnWorkflow(gsm8k_reward_fn, gconfig, tokenizer, max_turns=2)
    batch = server_engine.rollout_batch([{"id": "q", "prompt": "What is 3 + 4?", "answer": "987654"}], workflow)
    assert batch["num_turns"].tolist() == [2] and batch["rewards"].tolist() == [0.0]


def test_bad_settings(tokenizer):
    with pytest.raises(ValueError, match="max_turns=0"):
        MultiTurnWorkflow(gsm8k_reward_fn, GenerationHyperparameters(), tokenizer, max_turns=0)
    with pytest.raises(ValueError, match="turn_discount=1.5"):
        MultiTurnWorkflow(gsm8k_reward_fn, GenerationHyperparameters(), tokenizer, turn_discount=1.5)


def test_a_seeded_group_gives_each_answer_its_own_seed(server_engine, tokenizer):
    """With gconfig.sampling_seed set (a config's `seed` sets it), the samples of a group differ, and
    the same record at the same version draws the same answers again; one seed for the whole group
    would make every sample the same conversation and every advantage 0."""
    gconfig = GenerationHyperparameters(group_size=4, max_new_tokens=8, sampling_seed=3)
    workflow = MultiTurnWorkflow(completion_length, gconfig, tokenizer, max_turns=1)
    record = {"id": "q", "prompt": "What is 3 + 4?"}
    first, again = (server_engine.rollout_batch([record], workflow) for _ in range(2))
    answers = [tuple(row[mask.bool()].tolist()) for row, mask in zip(first["input_ids"], first["loss_mask"])]
    assert len(set(answers)) > 1, f"every sample of the group drew the same answer: {answers[0]}"
    assert torch.equal(first["input_ids"], again["input_ids"])
