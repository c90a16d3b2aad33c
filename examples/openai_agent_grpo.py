"""GRPO on an agent that is a separate program: examples/openai_agent.py, an `openai` tool loop.

    python -m arealite.launcher.local examples/openai_agent_grpo.py --config configs/tiny_cpu_openai_agent.yaml

Each sample runs `agent.command` as a subprocess whose `OpenAI()` client talks to arealite's
OpenAI-compatible endpoint (`AgentProgramWorkflow`, docs/agents.md); the tokens the endpoint
recorded are trained on (tool results masked) and the program's final reply is scored by the
task's reward. Held-out success (`evaluator.k` samples per record at `evaluator.temperature`,
questions seen in training left out) is measured before and after training; the last line is

    eval_accuracy_before=<x> eval_accuracy_after=<y>

The loop is the one of examples/tools_grpo.py (batches from `StepBatches`, in the mode
`rollout.*` says); programs that fail are counted (`agent/*`).
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
from arealite.agent import AgentProgramWorkflow
from arealite.config import AgentProgramConfig, ConfigError, setting
from arealite.eval.evaluator import eval_gconfig
from arealite.rollout.executor import RolloutWorkflowError
from arealite.world import all_reduce


@dataclass
class AgentGRPOConfig(GRPOConfig):
    """GRPOConfig plus this script's own section."""

    agent: AgentProgramConfig = setting(
        factory=AgentProgramConfig, help="the agent program run per sample, behind an OpenAI-compatible endpoint"
    )


def accuracy(rollout: RolloutRunner, workflow: AgentProgramWorkflow, records: list[dict]) -> float:
    """Mean reward over this rank's `records` (a failed program counts as 0), over all ranks; collective."""
    rewards, rejected = torch.zeros(0), workflow.stats["rejected_groups"]
    if records:
        try:
            rewards = rollout.rollout_batch(records, workflow)["rewards"]
        except RolloutWorkflowError:
            if workflow.stats["rejected_groups"] - rejected < len(records):
                raise  # not (only) failed programs
    totals = all_reduce(torch.tensor([rewards.sum().item(), len(records)], dtype=torch.float64))
    return (totals[0] / totals[1]).item()


def question(record: dict) -> str:
    return record["messages"][-1]["content"]


def main(argv: list[str]) -> None:
    config = load_config(argv, AgentGRPOConfig)
    if not config.agent.command:
        raise ConfigError("agent.command is not set; add an agent: section (see configs/tiny_cpu_openai_agent.yaml)")
    rank, world_size = init_distributed(timeout=config.dist_timeout)  # a lost rank fails, never hangs
    if rank == 0:
        save_config(config, os.path.join(config.run_dir, "config.yaml"))
    tokenizer = AutoTokenizer.from_pretrained(config.tokenizer_path or config.actor.path)
    records = load_records(config.train_dataset, split="train", seed=config.seed)
    loader = create_dataloader(
        records, config.train_dataset.batch_size, rank, world_size, config.train_dataset.shuffle, config.seed
    )
    seen = {question(r) for r in records}  # held out means unseen in training
    held_out = [r for r in held_out_records(config, tokenizer) if question(r) not in seen]
    held_out = held_out[: config.evaluator.num_samples][rank::world_size]
    command = [sys.executable if c == "python" else c for c in config.agent.command]  # this interpreter
    agent, reward_fn = config.agent, reward_fn_for(config)
    stats_logger = StatsLogger.from_config(config, rank)

    with (
        RewardPool(max_workers=2) as reward_pool,
        rollout_client(config) as rollout,  # server.backend's protocol
        PPOActor(config.actor, config.gconfig, config.total_train_steps) as actor,
        WeightSync.from_config(config, actor, rollout) as weight_sync,
    ):
        workflow = AgentProgramWorkflow(
            command, tokenizer, config.gconfig, reward_fn, agent.timeout, agent.host, reward_pool
        )
        evaluation = AgentProgramWorkflow(
            command, tokenizer, eval_gconfig(config.evaluator, config.gconfig), reward_fn, agent.timeout, agent.host,
            reward_pool,
        )  # fmt: skip
        before = accuracy(rollout, evaluation, held_out)
        batches = StepBatches(rollout, loader, workflow, config.rollout, config.gconfig.group_size)
        tracker, timer = StatsTracker(), StepTimer()
        for step in range(config.total_train_steps):
            with timer("step"):
                with timer("rollout"):
                    batch = batches.next_batch()
                with timer("train"):
                    stats = batch_stats(tracker, batch)
                    stats.update(actor.compute_advantages(batch))
                    stats.update(actor.ppo_update(batch), **batches.stats())
                with timer("weight_sync"):
                    batches.drain()  # lockstep: the batches in flight finish on the weights they began with
                    weight_sync.sync(step + 1)
            failures = {f"agent/{k}": float(v) for k, v in workflow.stats.items()}  # cumulative, this rank
            stats_logger.commit(step, {**stats, **failures, **timer.pop(), "version": step + 1})
        after = accuracy(rollout, evaluation, held_out)
    plot = stats_logger.close(plot=config.stats_logger.plot)
    if rank == 0:
        if plot:
            print(f"plots: {plot}", flush=True)
        print(f"eval_accuracy_before={before:.4f} eval_accuracy_after={after:.4f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
