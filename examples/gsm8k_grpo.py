"""GRPO on math word problems: the whole training loop, readable in one screen.

    python -m arealite.launcher.local examples/gsm8k_grpo.py --config configs/tiny_cpu.yaml

The launcher starts the inference servers and sets AREAL_LLM_SERVER_ADDRS; this script is
one trainer process (torchrun starts several). Which dataset, model and reward are used is
config (`train_dataset.type`: gsm8k | math500 | arithmetic | jsonl). A relaunch of the same
run resumes from its latest checkpoint (`recover.mode=auto`); the held-out set is evaluated
before training, every `evaluator.freq_steps` versions and at the end.
"""

from __future__ import annotations

import os
import sys

from transformers import AutoTokenizer

from arealite.config import GRPOConfig, load_config, save_config
from arealite.data.loader import create_dataloader, filter_by_prompt_length, load_records
from arealite.distributed import barrier, init_distributed
from arealite.eval import Evaluator
from arealite.eval.task import held_out_records, reward_fn_for
from arealite.reward.pool import RewardPool
from arealite.rollout import RemoteSGLangEngine
from arealite.train import PPOActor
from arealite.utils.recover import Recover
from arealite.utils.stats_logger import StatsLogger
from arealite.utils.stats_tracker import StatsTracker
from arealite.utils.timing import StepTimer
from arealite.utils.data_feed import DataFeed
from arealite.utils.training_stats import batch_stats
from arealite.utils.weight_sync import init_weight_update, sync_weights
from arealite.workflow import RLVRWorkflow


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
    actor = PPOActor(config.actor, config.total_train_steps)
    actor.initialize()
    reward_fn = reward_fn_for(config)
    reward_pool = RewardPool(max_workers=2)  # shared by training and evaluation
    feed = DataFeed(loader)  # remembers prompts handed out but not yet trained (exact recovery)
    workflow = feed.tag(RLVRWorkflow(reward_fn, config.gconfig, tokenizer, reward_pool))
    stats_logger = StatsLogger.from_config(config, rank)
    evaluator = None
    if config.evaluator.freq_steps:
        held_out = held_out_records(config, tokenizer)
        evaluator = Evaluator(config.evaluator, config.gconfig, held_out, reward_fn, tokenizer, rank, world_size, reward_pool)

    meta_for = init_weight_update(
        actor, rollout, config.weight_update, config.run_dir, rank, keep_versions=config.weight_keep_versions
    )
    recover = Recover(config.recover, config.run_dir, rank)
    resumed = recover.load(actor, feed, stats_logger)
    start, version = (resumed.step + 1, resumed.version) if resumed else (0, 0)
    accuracy = resumed.extra.get("accuracy", {}) if resumed else {}  # version -> held-out pass@1
    if resumed:  # the servers may hold other weights than the checkpoint's
        sync_weights(actor, rollout, meta_for(version), rank, barrier)

    asynchronous = config.rollout.max_head_offpolicyness > 0
    feed_iter, tracker, timer = iter(feed), StatsTracker(), StepTimer()
    for step in range(start, config.total_train_steps):
        stats = {}
        if evaluator and evaluator.should_run(version, config.total_train_steps):
            with timer("eval"):
                stats.update(evaluator.evaluate(rollout), **{"eval/version": version})
            accuracy[str(version)] = stats["eval/pass@1"]
        with timer("step"):
            with timer("rollout"):
                if asynchronous:
                    batch = rollout.prepare_batch(feed, workflow)
                else:
                    prompts = next(feed_iter, None) or next(feed_iter := iter(feed))
                    batch = rollout.rollout_batch(prompts, workflow)
            with timer("train"):
                # No separate logp pass: a one-step update takes the pre-update logprobs
                # (prox_logp) from its own forward; the actor recomputes them only when needed.
                actor.compute_advantages(batch)
                train_stats = actor.ppo_update(batch)
                stats["prompt_ids"] = feed.consume(batch if asynchronous else None)
            with timer("weight_sync"):
                version = step + 1
                sync_weights(actor, rollout, meta_for(version), rank, barrier)
            with timer("save"):
                if recover.should_save(step, config.total_train_steps):
                    recover.save(step, version, actor, feed, stats_logger, {"accuracy": accuracy})
        stats.update(batch_stats(tracker, batch), **train_stats[-1], version=version, **timer.pop())
        stats_logger.commit(step, stats)

    if evaluator and evaluator.should_run(version, config.total_train_steps):
        final = evaluator.evaluate(rollout)
        accuracy[str(version)] = final["eval/pass@1"]
        stats_logger.commit(config.total_train_steps, {**final, "eval/version": version})
    plot = stats_logger.close(plot=config.stats_logger.plot)
    rollout.destroy()
    reward_pool.close()
    actor.destroy()
    if rank == 0 and accuracy:
        if plot:
            print(f"plots: {plot}", flush=True)
        before, after = accuracy.get("0", float("nan")), accuracy[max(accuracy, key=int)]
        print(f"eval_accuracy_before={before:.4f} eval_accuracy_after={after:.4f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
