"""Reward functions that raise, hang, or return NaN: each is counted and its group skipped;
the batch carries only real scores, and one bad reward costs only its own sample."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Iterator

import pytest

from arealite.config import GenerationHyperparameters, InferenceEngineConfig
from arealite.reward.pool import RewardPool, RewardTimeout
from arealite.rollout import RemoteSGLangEngine, RolloutWorkflowError
from arealite.workflow import RLVRWorkflow

from . import rewards

pytestmark = pytest.mark.timeout(90)


def _records(n: int, hang: int | None = None) -> list[dict]:
    return [
        {"id": f"r{i}", "messages": [{"role": "user", "content": f"{i}+2="}], "answer": str(i + 2), "hang": i == hang}
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def engine(builtin_server):
    engine = RemoteSGLangEngine(InferenceEngineConfig(setup_timeout=60, request_timeout=60), [builtin_server.address])
    engine.initialize()
    yield engine
    engine.destroy()


@contextlib.contextmanager
def _workflow(reward_fn, tokenizer, group_size: int = 2, timeout: float = 30.0) -> Iterator[RLVRWorkflow]:
    """An RLVRWorkflow with a reward pool of its own, closed on exit."""
    gconfig = GenerationHyperparameters(group_size=group_size, max_new_tokens=4)
    workflow = RLVRWorkflow(reward_fn, gconfig, tokenizer, reward_pool=RewardPool(max_workers=2, timeout=timeout))
    try:
        yield workflow
    finally:
        workflow.scorer.pool.close()


def test_raising_reward_is_counted_and_its_groups_skipped(engine, tokenizer):
    with (
        _workflow(rewards.raises, tokenizer) as workflow,
        pytest.raises(RolloutWorkflowError, match="all 3 episodes were rejected"),
    ):
        engine.rollout_batch(_records(3), workflow)
    assert workflow.stats["reward_errors"] == 3 * 2
    assert workflow.stats["rejected_groups"] == 3


def test_hanging_reward_times_out_and_only_its_group_is_skipped(engine, tokenizer):
    with _workflow(rewards.hangs_on_first, tokenizer, group_size=1, timeout=8.0) as workflow:
        batch = engine.rollout_batch(_records(3, hang=0), workflow)
    assert workflow.stats["reward_timeouts"] == 1
    assert workflow.stats["rejected_groups"] == 1
    assert batch["rewards"].tolist() == [1.0, 1.0]


def test_nan_reward_is_counted_not_trained_on(engine, tokenizer):
    """A NaN score would poison group normalisation: it must count as a failed reward."""
    with (
        _workflow(rewards.nan, tokenizer) as workflow,
        pytest.raises(RolloutWorkflowError, match="all 2 episodes were rejected"),
    ):
        engine.rollout_batch(_records(2), workflow)
    assert workflow.stats["reward_errors"] == 2 * 2


def test_calls_queued_behind_a_hung_reward_are_not_cancelled():
    """The pool replaced after a timeout must rescore the calls waiting in it, not cancel them
    (a bare CancelledError used to escape and kill the whole batch without a message)."""

    async def later(pool: RewardPool) -> float:
        await asyncio.sleep(2.0)  # submitted while the hung call still holds the only worker
        return await pool.ascore(rewards.one, "", "", [], [])

    async def run() -> list:
        pool = RewardPool(max_workers=1, timeout=6.0)
        try:
            await pool.ascore(rewards.one, "", "", [], [])  # start the worker before timing anything
            hung = pool.ascore(rewards.hangs_on_first, "", "", [], [], hang=True)
            return await asyncio.gather(hung, *(later(pool) for _ in range(4)), return_exceptions=True)
        finally:
            pool.close()

    results = asyncio.run(run())
    assert isinstance(results[0], RewardTimeout), results
    assert results[1:] == [1.0] * 4, [repr(r) for r in results]
    assert not any(isinstance(r, float) and math.isnan(r) for r in results)


def test_a_call_whose_clock_ran_out_behind_a_hung_one_is_run_again():
    """A call submitted with a hung one to a single worker waits behind it, and its clock (which
    counts the wait) runs out with the hung call's. Only the hung call is a timeout: the other,
    its pool killed for the hung one, runs again in the fresh pool and scores."""

    async def run() -> list:
        pool = RewardPool(max_workers=1, timeout=3.0)
        try:
            await pool.ascore(rewards.one, "", "", [], [])  # start the worker before timing anything
            hung = pool.ascore(rewards.hangs_on_first, "", "", [], [], hang=True)
            return await asyncio.gather(hung, pool.ascore(rewards.one, "", "", [], []), return_exceptions=True)
        finally:
            pool.close()

    results = asyncio.run(run())
    assert isinstance(results[0], RewardTimeout) and results[1] == 1.0, [repr(r) for r in results]
