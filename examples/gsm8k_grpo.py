"""GRPO on math word problems: the whole training loop, readable in one screen.

    python -m arealite.launcher.local examples/gsm8k_grpo.py --config configs/tiny_cpu.yaml

The launcher starts the inference servers and sets AREAL_LLM_SERVER_ADDRS; this script is
one trainer process (torchrun starts several). Which dataset, model and reward are used is
config (`train_dataset.type`: gsm8k | math500 | arithmetic | jsonl).
"""

from __future__ import annotations

import os
import sys

from transformers import AutoTokenizer

from arealite.config import GRPOConfig, load_config, save_config
from arealite.data.arithmetic import arithmetic_reward_fn
from arealite.data.loader import create_dataloader, filter_by_prompt_length, load_records
from arealite.distributed import barrier, init_distributed
from arealite.reward.math import boxed_reward_fn, gsm8k_reward_fn
from arealite.rollout import RemoteSGLangEngine
from arealite.train import PPOActor
from arealite.utils.imports import import_object
from arealite.utils.stats_logger import StatsLogger
from arealite.utils.weight_sync import disk_update_meta, sync_weights
from arealite.workflow import RLVRWorkflow

REWARDS = {
    "gsm8k": gsm8k_reward_fn,
    "math500": boxed_reward_fn,
    "jsonl": boxed_reward_fn,
    "arithmetic": arithmetic_reward_fn,
}


def main(argv: list[str]) -> None:
    config = load_config(argv, GRPOConfig)
    rank, world_size = init_distributed()
    if rank == 0:
        save_config(config, os.path.join(config.run_dir, "config.yaml"))
    tokenizer = AutoTokenizer.from_pretrained(config.tokenizer_path or config.actor.path)

    records = load_records(config.train_dataset, split="train", seed=config.seed)
    if config.train_dataset.max_prompt_tokens:
        records = filter_by_prompt_length(records, tokenizer, config.train_dataset.max_prompt_tokens)
    loader = create_dataloader(
        records, config.train_dataset.batch_size, rank, world_size, config.train_dataset.shuffle, config.seed
    )

    rollout = RemoteSGLangEngine(config.rollout)
    rollout.initialize()
    actor = PPOActor(config.actor)
    actor.initialize()
    reward_fn = import_object(config.reward_fn) if config.reward_fn else REWARDS[config.train_dataset.type]
    workflow = RLVRWorkflow(reward_fn, config.gconfig, tokenizer)
    stats_logger = StatsLogger(config.run_dir, rank, config.stats_logger.jsonl, config.stats_logger.tensorboard)

    data_iter = iter(loader)
    for step in range(config.total_train_steps):
        if config.rollout.max_head_offpolicyness > 0:
            batch = rollout.prepare_batch(loader, workflow)
        else:
            try:
                prompts = next(data_iter)
            except StopIteration:
                data_iter = iter(loader)
                prompts = next(data_iter)
            batch = rollout.rollout_batch(prompts, workflow)

        if config.actor.recompute_logprob:
            batch["prox_logp"] = actor.compute_logp(batch, temperature=config.gconfig.temperature)
        actor.compute_advantages(batch)
        train_stats = actor.ppo_update(batch)

        sync_weights(actor, rollout, disk_update_meta(config.run_dir, step + 1), rank, barrier)

        stats = {"reward": batch["rewards"].float().mean().item(), "version": step + 1}
        stats.update(train_stats[-1] if isinstance(train_stats, list) else train_stats)
        stats_logger.commit(step, stats)

    stats_logger.close()
    rollout.destroy()
    actor.destroy()


if __name__ == "__main__":
    main(sys.argv[1:])
