"""RLVRWorkflow: reward arguments, and reward failures counted and handled as configured."""

import pytest

from arealite.config import GenerationHyperparameters
from arealite.reward.pool import RewardPool
from arealite.rollout import RolloutWorkflowError
from arealite.workflow import RLVRWorkflow

from .rewards import always_raises, completion_length, hangs, reports_truncation

pytestmark = pytest.mark.timeout(180)
RECORDS = [
    {"id": "a", "prompt": "What is 1 + 1?", "answer": "2"},
    {"id": "b", "prompt": "What is 2 + 2?", "answer": "4"},
]


def test_rewards_see_the_completion_ids(server_engine, tokenizer):
    gconfig = GenerationHyperparameters(group_size=2, max_new_tokens=5, min_new_tokens=2)
    batch = server_engine.rollout_batch(RECORDS, RLVRWorkflow(completion_length, gconfig, tokenizer))
    assert batch["rewards"].tolist() == batch["loss_mask"].sum(1).float().tolist()
    # the first min_new_tokens answer tokens were sampled without the stop tokens: marked for the trainer
    for banned, mask in zip(batch["stop_banned"], batch["loss_mask"].bool()):
        assert banned[mask].tolist() == [i < 2 for i in range(int(mask.sum()))] and not banned[~mask].any()


def test_truncated_responses_are_recorded_and_told_to_rewards_that_ask(server_engine, tokenizer):
    """`truncated` is True exactly when a response used its whole budget without ending on a
    stop token; a reward declaring `truncated` receives the same flag."""
    vocab = len(tokenizer)
    stops = list(range(0, vocab, 2))  # every even id stops: about half the 2-token budgets run out
    gconfig = GenerationHyperparameters(group_size=8, max_new_tokens=2, stop_token_ids=stops, sampling_seed=3)
    workflow = RLVRWorkflow(reports_truncation, gconfig, tokenizer)
    records = [{"id": f"t{i}", "prompt": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(4)]
    batch = server_engine.rollout_batch(records, workflow)
    stop_set = set(stops) | {tokenizer.eos_token_id}
    expected = []
    for ids, mask in zip(batch["input_ids"], batch["loss_mask"].bool()):
        out = ids[mask].tolist()
        expected.append(len(out) == 2 and out[-1] not in stop_set)
    assert batch["truncated"].tolist() == expected
    assert "stop_banned" not in batch  # min_new_tokens = 0: nothing banned, the batch as before
    assert batch["rewards"].tolist() == [float(x) for x in expected]
    assert 0 < sum(expected) < len(expected), "both kinds must occur for the check to mean anything"


def test_raising_reward_rejects_the_group_and_is_counted(server_engine, tokenizer):
    workflow = RLVRWorkflow(always_raises, GenerationHyperparameters(group_size=2, max_new_tokens=3), tokenizer)
    with pytest.raises(RolloutWorkflowError, match="all 2 episodes were rejected"):
        server_engine.rollout_batch(RECORDS, workflow)
    assert workflow.stats["reward_errors"] == 4 and workflow.stats["rejected_groups"] == 2


def test_raising_reward_can_fail_the_batch(server_engine, tokenizer):
    workflow = RLVRWorkflow(
        always_raises, GenerationHyperparameters(group_size=1, max_new_tokens=3), tokenizer, on_reward_error="raise"
    )
    with pytest.raises(RolloutWorkflowError, match="reward checker crashed"):
        server_engine.rollout_batch(RECORDS[:1], workflow)


def test_timed_out_reward_scored_zero_only_when_asked(server_engine, tokenizer):
    pool = RewardPool(max_workers=1, timeout=1.0)
    try:
        workflow = RLVRWorkflow(
            hangs,
            GenerationHyperparameters(group_size=1, max_new_tokens=3),
            tokenizer,
            reward_pool=pool,
            on_reward_error="zero",
        )
        batch = server_engine.rollout_batch(RECORDS[:1], workflow)
        assert batch["rewards"].tolist() == [0.0]
        assert workflow.stats["reward_timeouts"] == 1
    finally:
        pool.close()


def test_bad_arguments_are_named(tokenizer):
    with pytest.raises(ValueError, match="on_reward_error='ignore'"):
        RLVRWorkflow(completion_length, GenerationHyperparameters(), tokenizer, on_reward_error="ignore")
    with pytest.raises(TypeError, match="define it at module level"):
        RLVRWorkflow(lambda *a, **k: 0.0, GenerationHyperparameters(), tokenizer)
