"""GRPO with tools: the model learns to use a calculator for multiplications it cannot do itself.

    python -m arealite.launcher.local examples/tools_grpo.py --config configs/tiny_cpu_tools.yaml

Each sample is an agent conversation (`ToolUseWorkflow`, written against the OpenAI-style
`arealite.chat.ChatClient`): the model may call the tools of `tool_use.tools`, their results
are appended as tool messages and loss-masked, and the final answer is scored by the task's
reward. The held-out accuracy (`evaluator.k` samples per record at `evaluator.temperature`,
records whose question is in the training set left out) is measured before training with the
tools, and after training with the tools and with every tool disabled (`DisabledTool`: the
same prompt, every call failing, so the answer is the model's own). The last line is

    accuracy_before=<x> accuracy_with_tool=<y> accuracy_without_tool=<z>

The loop is the one of examples/gsm8k_grpo.py (batches from `StepBatches`: synchronous,
asynchronous, lockstep or dynamic sampling as `rollout.*` says) without periodic evaluation,
checkpoints, a critic, a reference model or a prompt-length filter: a config that sets any of
those is refused with a ConfigError naming the key (`unsupported_settings`), never silently
ignored.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import torch
from transformers import AutoTokenizer

from arealite import (
    GRPOConfig,
    PPOActor,
    RewardPool,
    RolloutRunner,
    StatsLogger,
    StatsTracker,
    StepBatches,
    StepTimer,
    ToolUseWorkflow,
    WeightSync,
    batch_stats,
    create_dataloader,
    held_out_records,
    init_distributed,
    load_config,
    load_records,
    reward_fn_for,
    rollout_client,
    save_config,
)  # fmt: skip
from arealite.config import ConfigError, ToolUseConfig, setting
from arealite.eval.evaluator import eval_gconfig
from arealite.utils.imports import import_object
from arealite.workflow.tools import DisabledTool
from arealite.world import all_reduce


@dataclass
class ToolsGRPOConfig(GRPOConfig):
    """GRPOConfig plus this script's own section."""

    tool_use: ToolUseConfig = setting(factory=ToolUseConfig, help="the tools the model may call, and its turns")


def accuracy(rollout: RolloutRunner, workflow: ToolUseWorkflow, records: list[dict]) -> float:
    """Mean reward of `workflow` over this rank's `records`, over all ranks; collective."""
    rewards = rollout.rollout_batch(records, workflow)["rewards"] if records else torch.zeros(0)
    totals = all_reduce(torch.tensor([rewards.sum().item(), rewards.numel()], dtype=torch.float64))
    return (totals[0] / totals[1]).item()


def question(record: dict) -> str:
    return record["messages"][-1]["content"]


def unsupported_settings(config: ToolsGRPOConfig) -> list[str]:
    """The settings examples/gsm8k_grpo.py honours and this script does not, each with its fix."""
    found = []
    if config.critic is not None:
        found.append("critic: (PPO with a value model) is set; remove it, or use examples/gsm8k_grpo.py")
    if config.ref is not None:
        found.append("ref: (a KL reference model) is set; remove it and set actor.kl_ctl=0")
    if config.train_dataset.max_prompt_tokens:
        found.append(
            f"train_dataset.max_prompt_tokens={config.train_dataset.max_prompt_tokens} (the tool prompt is not "
            "filtered by length); unset it"
        )
    if config.recover.mode != "disabled":
        found.append(
            f"recover.mode={config.recover.mode!r} (this script keeps no checkpoints); set recover.mode=disabled"
        )
    if config.evaluator.freq_steps:
        found.append(
            f"evaluator.freq_steps={config.evaluator.freq_steps} (this script evaluates before and after "
            "training only); set it to 0"
        )
    return found


def main(argv: list[str]) -> None:
    config = load_config(argv, ToolsGRPOConfig)
    unsupported = unsupported_settings(config)
    if unsupported:
        raise ConfigError("examples/tools_grpo.py does not support: " + "; ".join(unsupported))
    rank, world_size = init_distributed(timeout=config.dist_timeout)  # a lost rank fails, never hangs
    if rank == 0:
        save_config(config, os.path.join(config.run_dir, "config.yaml"))
    tokenizer = AutoTokenizer.from_pretrained(config.tokenizer_path or config.actor.path)
    records = load_records(config.train_dataset, split="train", seed=config.seed)
    loader = create_dataloader(
        records, config.train_dataset.batch_size, rank, world_size, config.train_dataset.shuffle, config.seed
    )
    seen = {question(r) for r in records}  # held out means unseen in training
    held_out = [r for r in held_out_records(config, tokenizer) if question(r) not in seen][
        : config.evaluator.num_samples
    ]
    if rank == 0:
        print(f"[eval] {len(held_out)} held-out records, none of their questions in the training set", flush=True)
    held_out = held_out[rank::world_size]
    tools = [import_object(spec)() for spec in config.tool_use.tools]
    reward_fn, turns = reward_fn_for(config), config.tool_use.max_turns
    eval_g = eval_gconfig(config.evaluator, config.gconfig)
    stats_logger = StatsLogger.from_config(config, rank)

    with (
        RewardPool(max_workers=2) as reward_pool,
        rollout_client(config) as rollout,  # server.backend's protocol
        PPOActor(config.actor, config.gconfig, config.total_train_steps) as actor,
        WeightSync.from_config(config, actor, rollout) as weight_sync,
    ):
        workflow = ToolUseWorkflow(reward_fn, config.gconfig, tokenizer, tools, turns, reward_pool)
        with_tool = ToolUseWorkflow(reward_fn, eval_g, tokenizer, tools, turns, reward_pool)
        without_tool = ToolUseWorkflow(
            reward_fn, eval_g, tokenizer, [DisabledTool(t) for t in tools], turns, reward_pool
        )
        before = accuracy(rollout, with_tool, held_out)
        batches = StepBatches(rollout, loader, workflow, config.rollout, config.gconfig.group_size)
        tracker, timer = StatsTracker(), StepTimer()
        for step in range(config.total_train_steps):
            with timer("step"):
                with timer("rollout"):
                    batch = batches.next_batch()
                with timer("train"):
                    stats = actor.compute_advantages(batch)
                    stats.update(actor.ppo_update(batch), **batches.stats())
                with timer("weight_sync"):
                    batches.drain()  # lockstep: the batches in flight finish on the weights they began with
                    weight_sync.sync(step + 1)
            tracker.masked_mean("tool_calls", batch["num_tool_calls"].float())
            stats_logger.commit(step, {**batch_stats(tracker, batch), **stats, **timer.pop(), "version": step + 1})
        after_with, after_without = accuracy(rollout, with_tool, held_out), accuracy(rollout, without_tool, held_out)
    plot = stats_logger.close(plot=config.stats_logger.plot)
    if rank == 0:
        if plot:
            print(f"plots: {plot}", flush=True)
        print(
            f"accuracy_before={before:.4f} accuracy_with_tool={after_with:.4f} "
            f"accuracy_without_tool={after_without:.4f}",
            flush=True,
        )


if __name__ == "__main__":
    main(sys.argv[1:])
