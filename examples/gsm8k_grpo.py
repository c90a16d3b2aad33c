"""GRPO on math word problems: the whole training loop, readable in one screen.

    python -m arealite.launcher.local examples/gsm8k_grpo.py --config configs/tiny_cpu.yaml

The launcher starts the inference servers and sets AREAL_LLM_SERVER_ADDRS; this script is
one trainer process (torchrun starts several). Which dataset, model and reward are used is
config (`train_dataset.type`: gsm8k | math500 | arithmetic | jsonl), and so is the algorithm:
a `critic:` section turns GRPO into PPO with GAE on the critic's values, a `ref:` section
(with `actor.kl_ctl > 0`) adds the KL to a frozen reference model, `rollout.dynamic_sampling`
drops groups whose rewards are all equal. A relaunch of the same run resumes from its latest
checkpoint (`recover.mode=auto`); the held-out set is evaluated before training, every
`evaluator.freq_steps` versions and at the end. The closing lines printed are
`response_len_p50=<x> response_len_p95=<y>`, for asynchronous runs `mixed_version_frac=<f>`
(the share of trained samples whose tokens span a weight sync, over the run), then the last
two: `final_entropy=<e> truncated_frac=<t>` (these three: means over the last steps) and
`eval_accuracy_before=<x> eval_accuracy_after=<y>`.
"""

from __future__ import annotations

import os
import sys
from collections import deque
from contextlib import nullcontext
from itertools import chain, repeat

from transformers import AutoTokenizer

from arealite import (
    DataFeed,
    DynamicSampler,
    EngineGroup,
    Evaluator,
    GRPOConfig,
    PPOActor,
    PPOCritic,
    Recover,
    ReferenceModel,
    RemoteSGLangEngine,
    RewardPool,
    RLVRWorkflow,
    StatsLogger,
    StatsTracker,
    StepTimer,
    WeightSync,
    batch_stats,
    create_dataloader,
    filter_by_prompt_length,
    held_out_records,
    init_distributed,
    load_config,
    load_records,
    reward_fn_for,
    save_config,
)  # fmt: skip

RECENT = ("entropy", "truncated_frac", "response_len_p50", "response_len_p95")


def main(argv: list[str]) -> None:
    config = load_config(argv, GRPOConfig)
    rank, world_size = init_distributed(timeout=config.dist_timeout)  # a lost rank fails, never hangs
    if rank == 0:
        save_config(config, os.path.join(config.run_dir, "config.yaml"))
    tokenizer = AutoTokenizer.from_pretrained(config.tokenizer_path or config.actor.path)
    records = load_records(config.train_dataset, split="train", seed=config.seed)
    if config.train_dataset.max_prompt_tokens:
        records = filter_by_prompt_length(records, tokenizer, config.train_dataset.max_prompt_tokens)
    loader = create_dataloader(
        records, config.train_dataset.batch_size, rank, world_size, config.train_dataset.shuffle, config.seed
    )
    feed = DataFeed(loader)  # remembers prompts handed out but not yet trained (exact recovery)
    reward_fn = reward_fn_for(config)
    asynchronous = config.rollout.max_head_offpolicyness > 0
    recent = deque(maxlen=10)  # the RECENT stats of the last steps, for the closing lines
    mixed = []  # mixed_version_frac of every step (asynchronous runs)
    accuracy = {}  # version -> held-out pass@1

    # Everything that holds a resource is closed on the way out, errors included.
    with (
        RemoteSGLangEngine(config.rollout) as rollout,  # the servers in AREAL_LLM_SERVER_ADDRS
        PPOActor(config.actor, config.gconfig, config.total_train_steps) as actor,
        PPOCritic(config.critic, config.total_train_steps) if config.critic else nullcontext() as critic,  # PPO
        ReferenceModel(config.ref, config.gconfig) if config.ref else nullcontext() as ref,  # the KL term's anchor
        RewardPool(max_workers=2) as reward_pool,  # shared by training and evaluation
        WeightSync(
            actor, rollout, config.weight_update, config.run_dir, keep_versions=config.weight_keep_versions
        ) as weight_sync,
    ):
        stats_logger = StatsLogger.from_config(config, rank)
        # dynamic sampling: asynchronous runs filter each finished group here, synchronous ones per batch below
        sampler = DynamicSampler(feed, config.gconfig.group_size) if config.rollout.dynamic_sampling else None
        should_accept = sampler.accept if sampler and asynchronous else None
        workflow = feed.tag(RLVRWorkflow(reward_fn, config.gconfig, tokenizer, reward_pool), should_accept)
        evaluator = None
        if config.evaluator.freq_steps:
            held_out = held_out_records(config, tokenizer)
            evaluator = Evaluator(
                config.evaluator, config.gconfig, held_out, reward_fn, tokenizer, rank, world_size, reward_pool
            )
        recover, trained = Recover(config.recover, config.run_dir, rank), EngineGroup(actor, critic=critic)
        resumed = recover.load(trained, feed, stats_logger)
        start, version = (resumed.step + 1, resumed.version) if resumed else (0, 0)
        accuracy.update(resumed.extra.get("accuracy", {}) if resumed else {})
        if resumed:  # the servers may hold other weights than the checkpoint's
            weight_sync.sync(version)

        prompt_batches = chain.from_iterable(repeat(feed))  # synchronous runs' prompts, epoch after epoch
        tracker, timer = StatsTracker(), StepTimer()
        for step in range(start, config.total_train_steps):
            stats = {}
            if evaluator and evaluator.should_run(version, config.total_train_steps):
                with timer("eval"):
                    stats.update(evaluator.evaluate(rollout), **{"eval/version": version})
                accuracy[str(version)] = stats["eval/pass@1"]
            with timer("step"):
                with timer("rollout"):
                    if asynchronous:  # ahead of training, within the staleness bound
                        batch = rollout.prepare_batch(feed, workflow)
                    elif sampler is not None:  # groups whose rewards differ, from as many prompts as needed
                        batch = sampler.next_batch(rollout, workflow)
                    else:
                        batch = rollout.rollout_batch(next(prompt_batches), workflow)
                with timer("train"):
                    if ref is not None:
                        batch["ref_logp"] = ref.compute_logp(batch)
                    if critic is not None:  # PPO: advantages by GAE on the critic's values
                        batch["values"] = critic.compute_values(batch)
                    stats.update(batch_stats(tracker, batch, version))  # before compute_advantages edits loss_mask
                    # No separate logp pass: a one-step update takes the pre-update logprobs
                    # (prox_logp) from its own forward; the actor recomputes them only when needed.
                    actor.compute_advantages(batch)
                    stats.update(actor.ppo_update(batch)[-1])
                    if critic is not None:
                        stats.update({f"critic/{k}": v for k, v in critic.ppo_update(batch)[-1].items()})
                    stats["prompt_ids"] = feed.consume(batch if asynchronous or sampler else None)  # trained prompts
                with timer("weight_sync"):
                    version = step + 1
                    weight_sync.sync(version)  # pause -> load -> confirm -> resume, version bumped everywhere
                with timer("save"):
                    if recover.should_save(step, config.total_train_steps):
                        recover.save(step, version, trained, feed, stats_logger, {"accuracy": accuracy})
            if sampler is not None:  # cumulative counts of this rank
                stats.update(dropped_groups=feed.dropped_groups, filler_groups=sampler.filler_groups)
            stats.update(version=version, **timer.pop())
            stats_logger.commit(step, stats)
            recent.append(tuple(stats.get(k, float("nan")) for k in RECENT))
            mixed.append(stats.get("mixed_version_frac", float("nan")))

        if evaluator and evaluator.should_run(version, config.total_train_steps):
            final = evaluator.evaluate(rollout)
            accuracy[str(version)] = final["eval/pass@1"]
            stats_logger.commit(config.total_train_steps, {**final, "eval/version": version})
        plot = stats_logger.close(plot=config.stats_logger.plot)

    if rank == 0 and plot:
        print(f"plots: {plot}", flush=True)
    if rank == 0 and recent:
        entropy, truncated, p50, p95 = (sum(v) / len(v) for v in zip(*recent))
        print(f"response_len_p50={p50:.1f} response_len_p95={p95:.1f}", flush=True)
        if asynchronous:
            print(f"mixed_version_frac={sum(mixed) / len(mixed):.4f}", flush=True)
        print(f"final_entropy={entropy:.4f} truncated_frac={truncated:.4f}", flush=True)
    if rank == 0 and accuracy:
        before, after = accuracy.get("0", float("nan")), accuracy[max(accuracy, key=int)]
        print(f"eval_accuracy_before={before:.4f} eval_accuracy_after={after:.4f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
