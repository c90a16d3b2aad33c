"""The README's main command is wired as documented: its setup commands build the model the
SFT warm start reads and write the model the actor trains; the GPU config is what the docs say.
(The main job itself takes minutes; its measured run is reported in docs/production.md.)"""

from __future__ import annotations

import shlex
from pathlib import Path

from arealite.config import GRPOConfig, load_config
from arealite.data.walk import TOKENS_PER_STEP

REPO = Path(__file__).resolve().parents[2]


def test_tiny_cpu_setup_commands_chain_model_sft_and_actor():
    config = load_config(["--config", str(REPO / "configs" / "tiny_cpu.yaml")], GRPOConfig)
    build, sft = (shlex.split(c) for c in config.launcher.setup_commands)
    assert build[:3] == ["python", "-m", "arealite.tools.tiny_model"] and build[3] == config.sft.base_path
    assert sft[:3] == ["python", "-m", "arealite.tools.sft_warmstart"] and sft[3:] == [
        "--config",
        "configs/tiny_cpu.yaml",
    ]
    assert config.actor.path != config.sft.base_path, "the warm start must not overwrite its own base model"
    assert config.evaluator.freq_steps > 0 and config.gconfig.sampling_seed is not None
    assert config.rollout.max_head_offpolicyness == 0 and config.recover.mode == "auto"
    assert config.rollout.dynamic_sampling
    assert config.train_dataset.type == "arithmetic" and config.server.backend == "builtin"
    assert config.gconfig.group_size == 8


def test_gsm8k_gpu_config_is_async_with_the_decoupled_loss():
    config = load_config(["--config", str(REPO / "configs" / "gsm8k_grpo.yaml")], GRPOConfig)
    assert config.rollout.max_head_offpolicyness == 2 and config.actor.use_decoupled_loss
    assert config.server.backend == "sglang" and "Qwen2.5-1.5B-Instruct" in config.actor.path
    assert config.valid_dataset is not None and config.evaluator.freq_steps > 0
    assert config.gconfig.group_size == 8


def _load(name: str) -> GRPOConfig:
    return load_config(["--config", str(REPO / "configs" / name)], GRPOConfig)


def test_async_and_ppo_variants_share_the_main_jobs_model_task_and_evaluation():
    main = _load("tiny_cpu.yaml")
    for name in ("tiny_cpu_async.yaml", "tiny_cpu_ppo.yaml"):
        variant = _load(name)
        assert variant.launcher.setup_commands == main.launcher.setup_commands, name  # the same SFT warm start
        assert variant.actor.path == main.actor.path and variant.sft == main.sft, name
        assert variant.train_dataset == main.train_dataset and variant.evaluator == main.evaluator, name
        assert variant.gconfig == main.gconfig and variant.experiment_name != main.experiment_name, name


def test_async_variant_is_stale_by_two_with_the_decoupled_loss():
    config = _load("tiny_cpu_async.yaml")
    assert config.rollout.max_head_offpolicyness >= 2 and config.actor.use_decoupled_loss


def test_ppo_variant_turns_on_critic_gae_and_reference_kl_from_config_alone():
    config = _load("tiny_cpu_ppo.yaml")
    assert config.critic is not None and config.critic.path == config.actor.path
    assert config.ref is not None and config.ref.path == config.actor.path and config.actor.kl_ctl > 0
    assert config.actor.group_norm == "none" and config.actor.whiten_advantages  # the critic is the baseline


def test_reasoning_job_and_its_async_variant_share_model_task_and_evaluation():
    sync, variant = _load("tiny_cpu_reasoning.yaml"), _load("tiny_cpu_reasoning_async.yaml")
    build, sft = (shlex.split(c) for c in sync.launcher.setup_commands)
    assert build[:4] == ["python", "-m", "arealite.tools.tiny_model", sync.sft.base_path]
    assert sft[-5:] == ["python", "-m", "arealite.tools.sft_warmstart", "--config", "configs/tiny_cpu_reasoning.yaml"]
    assert sync.train_dataset.type == "walk" and sync.rollout.max_head_offpolicyness == 0
    assert variant.launcher.setup_commands == sync.launcher.setup_commands  # the same SFT warm start
    assert variant.actor.path == sync.actor.path and variant.sft == sync.sft
    assert variant.train_dataset == sync.train_dataset and variant.evaluator == sync.evaluator
    assert variant.gconfig == sync.gconfig and variant.experiment_name != sync.experiment_name
    assert variant.rollout.max_head_offpolicyness >= 1 and variant.actor.use_decoupled_loss
    # every correct answer fits the budget: truncation means a policy that does not stop
    assert sync.gconfig.max_new_tokens >= TOKENS_PER_STEP * sync.train_dataset.max_steps
    # the overlong penalty falls only on answers longer than any correct one, in both jobs
    assert variant.actor.overlong_tokens == sync.actor.overlong_tokens
    assert sync.gconfig.max_new_tokens - sync.actor.overlong_tokens >= TOKENS_PER_STEP * sync.train_dataset.max_steps
