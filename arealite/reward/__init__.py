"""Rewards: verifiable checkers (run in a process pool), an LLM judge and a scalar reward model."""

from arealite.reward.classifier import ClassifierReward
from arealite.reward.judge import JudgeReward
from arealite.reward.math import boxed_reward_fn, extract_gsm8k_answer, gsm8k_reward_fn, last_boxed, math_equal
from arealite.reward.pool import RewardError, RewardPool, RewardTimeout, check_picklable
from arealite.reward.verdict import VerdictError, logprob_verdict, text_verdict

__all__ = [
    "ClassifierReward",
    "JudgeReward",
    "RewardError",
    "RewardPool",
    "RewardTimeout",
    "VerdictError",
    "boxed_reward_fn",
    "check_picklable",
    "extract_gsm8k_answer",
    "gsm8k_reward_fn",
    "last_boxed",
    "logprob_verdict",
    "math_equal",
    "text_verdict",
]
