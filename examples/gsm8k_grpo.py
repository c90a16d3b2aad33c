"""GRPO on math word problems: the whole training loop, readable in one screen.

    python -m arealite.launcher.local examples/gsm8k_grpo.py --config configs/tiny_cpu.yaml

One trainer process. Config picks data, model, reward, algorithm (`critic:` makes it PPO, `ref:`
adds a KL, `distill:` distils a teacher model) and how batches are generated (`rollout.*`); a
relaunch resumes from the latest checkpoint; the last line printed is
`eval_accuracy_before=<x> eval_accuracy_after=<y>`.
"""

from __future__ import annotations

import os
import sys
from contextlib import nullcontext

from transformers import AutoTokenizer

from arealite import (
    EngineGroup,
    Evaluator,
    GRPOConfig,
    PPOActor,
    PPOCritic,
    Recover,
    ReferenceModel,
    RewardPool,
    RLVRWorkflow,
    RunSummary,
    StatsLogger,
    StatsTracker,
    StepBatches,
    StepTimer,
    TeacherClient,
    WeightSync,
    batch_stats,
    held_out_records,
    init_distributed,
    load_config,
    reward_fn_for,
    rollout_client,
    save_config,
    train_dataloader,
)
from arealite.replay import RolloutDump
from arealite.stats.samples import shown_samples


def main(argv: list[str]) -> None:
    config = load_config(argv, GRPOConfig)
    rank, world_size = init_distributed(timeout=config.dist_timeout)  # a lost rank fails, never hangs
    if rank == 0:
        save_config(config, os.path.join(config.run_dir, "config.yaml"))
    tokenizer = AutoTokenizer.from_pretrained(config.tokenizer_path or config.actor.path)
    reward_fn, total = reward_fn_for(config), config.total_train_steps
    summary = RunSummary(asynchronous=config.rollout.max_head_offpolicyness > 0)

    # Everything that holds a resource is closed on the way out, errors included.
    with (
        rollout_client(config) as rollout,  # the servers in AREAL_LLM_SERVER_ADDRS (server.backend's protocol)
        PPOActor(config.actor, config.gconfig, total) as actor,
        PPOCritic(config.critic, total) if config.critic else nullcontext() as critic,  # PPO
        ReferenceModel(config.ref, config.gconfig) if config.ref else nullcontext() as ref,  # the KL's anchor
        RewardPool(max_workers=2) as reward_pool,  # shared by training and evaluation
        TeacherClient.from_config(config) if config.distill else nullcontext() as teacher,  # scores every token
        WeightSync.from_config(config, actor, rollout) as weight_sync,  # weight_update, run_dir, ...
    ):
        workflow = RLVRWorkflow(reward_fn, config.gconfig, tokenizer, reward_pool)
        loader = train_dataloader(config, tokenizer, rank, world_size)
        batches = StepBatches(rollout, loader, workflow, config.rollout, config.gconfig.group_size)
        evaluator = None
        if config.evaluator.freq_steps:
            held_out = held_out_records(config, tokenizer)
            evaluator = Evaluator(
                config.evaluator, config.gconfig, held_out, reward_fn, tokenizer, rank, world_size, reward_pool
            )
        stats_logger = StatsLogger.from_config(config, rank)
        recover, trained = Recover(config.recover, config.run_dir, rank), EngineGroup(actor, critic=critic)
        resumed = recover.load(trained, batches, stats_logger)  # weights, optimizer, prompts, stats
        start, version = (resumed.step + 1, resumed.version) if resumed else (0, 0)
        summary.accuracy.update(resumed.extra.get("accuracy", {}) if resumed else {})
        if resumed:  # the servers may hold other weights than the checkpoint's
            weight_sync.sync(version)
        tracker, timer = StatsTracker(), StepTimer()
        dump = RolloutDump.from_config(config, tokenizer, rank, world_size)  # rollout.dump_dir: arealite.replay

        for step in range(start, total):
            stats = {}
            if evaluator and evaluator.should_run(version, total):
                with timer("eval"):
                    stats.update(evaluator.evaluate(rollout), **{"eval/version": version})
                summary.add_eval(version, stats)
            with timer("step"):
                with timer("rollout"):
                    batch = batches.next_batch()  # sync, async or dynamic sampling, as configured
                with timer("train"):
                    if ref is not None:
                        batch["ref_logp"] = ref.compute_logp(batch)
                    if critic is not None:  # PPO: advantages by GAE on the critic's values
                        batch["values"] = critic.compute_values(batch)
                    stats.update(actor.compute_advantages(batch))  # its time and backend
                    if teacher is not None:  # the advantage becomes the teacher's per-token verdict (config.distill)
                        teacher.distill(batch)
                    update = actor.ppo_update(batch)  # loss, grad norm, clip fractions ... of the update
                    stats.update(batch_stats(tracker, batch, version), **update, **batches.stats())
                    if dump is not None:  # the batch as trained, with the weights of `version` before the update
                        dump.write(step, version, batch, update)
                    if "eval/pass@1" in stats:  # a few of the trained completions beside each evaluation
                        shown = shown_samples(batch, tokenizer, config.stats_logger.samples_shown)
                        stats_logger.log_samples(step, shown)
                    if critic is not None:
                        stats.update({f"critic/{k}": v for k, v in critic.ppo_update(batch).items()})
                with timer("weight_sync"):
                    batches.drain()  # lockstep: the batches in flight finish on the weights they began with
                    version = step + 1
                    weight_sync.sync(version)  # pause -> load -> confirm -> resume, version bumped everywhere
                with timer("save"):
                    if recover.should_save(step, total):
                        recover.save(step, version, trained, batches, stats_logger, {"accuracy": summary.accuracy})
            stats.update(version=version, **timer.pop())
            stats_logger.commit(step, stats)
            summary.add_step(stats)

        if evaluator and evaluator.should_run(version, total):
            final = {**evaluator.evaluate(rollout), "eval/version": version}
            summary.add_eval(version, final)
            stats_logger.commit(total, final)
        plot = stats_logger.close(plot=config.stats_logger.plot)

    if rank == 0:  # the closing lines, eval_accuracy_before=<x> eval_accuracy_after=<y> last
        if plot:
            print(f"plots: {plot}", flush=True)
        for line in summary.lines():
            print(line, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
