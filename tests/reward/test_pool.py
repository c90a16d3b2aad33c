"""The reward process pool: results, raised errors and timeouts are distinguished, never zeroed."""

import time

import pytest

from arealite.reward.math import gsm8k_reward_fn
from arealite.reward.pool import RewardError, RewardPool, RewardTimeout, check_picklable


@pytest.fixture(scope="module")
def pool():
    p = RewardPool(max_workers=1, timeout=20.0)
    yield p
    p.close()


@pytest.mark.timeout(120)
def test_scores_in_a_worker_process(pool):
    assert pool.score(gsm8k_reward_fn, "p", "#### 7", [1], [2], answer="7") == 1.0
    assert pool.score(gsm8k_reward_fn, "p", "#### 8", [1], [2], answer="7") == 0.0


@pytest.mark.timeout(120)
def test_raising_reward_is_a_reward_error(pool):
    with pytest.raises(RewardError, match="empty reference answer"):
        pool.score(gsm8k_reward_fn, "p", "#### 7", [1], [2], answer="")


@pytest.mark.timeout(120)
def test_hung_reward_times_out_and_pool_recovers():
    pool = RewardPool(max_workers=1, timeout=1.0)
    try:
        pool.score(gsm8k_reward_fn, "p", "#### 1", None, None, answer="1")  # start the worker
        with pytest.raises(RewardTimeout, match="longer than 1.0s"):
            pool.score(time.sleep, 30)
        # the stuck worker was killed; a fresh pool answers
        assert pool.score(gsm8k_reward_fn, "p", "#### 2", None, None, answer="2") == 1.0
    finally:
        pool.close()


def test_unpicklable_reward_fails_early():
    with pytest.raises(TypeError, match="define it at module level"):
        check_picklable(lambda *a, **k: 1.0)


def test_bad_pool_settings():
    with pytest.raises(ValueError, match="max_workers=0"):
        RewardPool(max_workers=0)
    with pytest.raises(ValueError, match="timeout=0"):
        RewardPool(timeout=0)
