"""What a config's task is: its reward function and its held-out records."""

from __future__ import annotations

from typing import Any

from arealite.config import GRPOConfig
from arealite.data.arithmetic import arithmetic_reward_fn
from arealite.data.loader import filter_by_prompt_length, load_records
from arealite.data.walk import walk_reward_fn
from arealite.reward.math import boxed_reward_fn, gsm8k_reward_fn
from arealite.utils.imports import import_object

REWARDS = {
    "gsm8k": gsm8k_reward_fn,
    "math500": boxed_reward_fn,
    "jsonl": boxed_reward_fn,
    "arithmetic": arithmetic_reward_fn,
    "walk": walk_reward_fn,
}
SYNTHETIC = ("arithmetic", "walk")  # tasks generated here, with a test split of their own


def reward_fn_for(config: GRPOConfig) -> Any:
    """`config.reward_fn` ("module:function"), the `judge` or the `reward_model` if set, else the
    train dataset type's reward."""
    if config.judge is not None:
        from arealite.reward.judge import JudgeReward

        return JudgeReward(config.judge)
    if config.reward_model is not None:
        from arealite.reward.classifier import ClassifierReward

        return ClassifierReward(config.reward_model)
    return import_object(config.reward_fn) if config.reward_fn else REWARDS[config.train_dataset.type]


def held_out_records(config: GRPOConfig, tokenizer: Any) -> list[dict[str, Any]]:
    """`valid_dataset` if set, else the test split of `train_dataset` (synthetic tasks only)."""
    dataset = config.valid_dataset
    if dataset is None:
        if config.train_dataset.type not in SYNTHETIC:
            raise ValueError(
                f"evaluation needs valid_dataset for train_dataset.type={config.train_dataset.type!r} "
                "(only synthetic tasks have a built-in test split); set valid_dataset.path or evaluator.freq_steps=0"
            )
        dataset = config.train_dataset
    records = load_records(dataset, split="test", seed=config.seed)
    if dataset.max_prompt_tokens:
        records = filter_by_prompt_length(records, tokenizer, dataset.max_prompt_tokens)
    return records
