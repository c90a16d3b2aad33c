"""Verifiable rewards and the process pool they run in."""

from arealite.reward.math import boxed_reward_fn, extract_gsm8k_answer, gsm8k_reward_fn, last_boxed, math_equal
from arealite.reward.pool import RewardError, RewardPool, RewardTimeout, check_picklable

__all__ = [
    "RewardError",
    "RewardPool",
    "RewardTimeout",
    "boxed_reward_fn",
    "check_picklable",
    "extract_gsm8k_answer",
    "gsm8k_reward_fn",
    "last_boxed",
    "math_equal",
]
