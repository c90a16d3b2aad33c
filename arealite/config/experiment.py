"""`GRPOConfig`: a GRPO/PPO experiment, every section nested in one config, with the checks
that span sections (one reward, LoRA and weight sync, KL and the reference model)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

from arealite.config.data import DatasetConfig, EvaluatorConfig
from arealite.config.distill import DistillConfig
from arealite.config.fields import check_choices, check_positive, setting
from arealite.config.generation import GenerationHyperparameters
from arealite.config.loading import ConfigError
from arealite.config.reward import JudgeConfig, RewardModelConfig
from arealite.config.rollout import TRUNCATION_RULE_OF_BACKEND, InferenceEngineConfig, ServerConfig
from arealite.config.run import LauncherConfig, RecoverConfig, StatsLoggerConfig
from arealite.config.train import PPOActorConfig, PPOCriticConfig, SFTConfig, TrainEngineConfig

WeightUpdateMode = Literal["disk", "distributed", "lora"]


@dataclass
class GRPOConfig:
    """A GRPO/PPO experiment: the sections every training script shares. A script with settings of
    its own subclasses it (examples/tools_grpo.py adds `tool_use`, examples/openai_agent_grpo.py `agent`)."""

    experiment_name: str = setting("arealite", "names the run directory (and the wandb run)")
    trial_name: str = setting("trial0", "one attempt of an experiment; recovery resumes the same trial")
    fileroot: str = setting("runs", "run directories live under fileroot/experiment/trial")
    seed: int = setting(
        1,
        "seeds the data order, the critic's value head and the LoRA adapter's initialization (critic.seed, "
        "actor.lora.seed) and the sampling seeds (gconfig.sampling_seed), where those are unset",
    )
    total_train_steps: int = setting(10, "training steps (rollout, update, weight sync) of the run")
    tokenizer_path: str = setting("", "defaults to actor.path")
    weight_update: WeightUpdateMode = setting(
        "disk",
        "how weights reach the servers: disk (an HF folder under run_dir they reload), distributed (trainer rank 0 "
        "broadcasts buckets over a process group the servers joined, through each backend's own routes) or lora "
        "(only the actor's LoRA adapter, through /load_lora_adapter); which server.backend takes which: "
        "docs/backends.md",
    )
    weight_keep_versions: int = setting(
        3, "disk: weight versions kept under <run_dir>/weights (older ones are deleted)"
    )
    dist_timeout: float = setting(
        1800.0, "seconds a trainer collective (rendezvous, all-reduce, barrier) may wait for a peer rank"
    )
    reward_fn: str = setting(
        "", '"module:function" of a custom reward; empty: chosen by train_dataset.type (or judge, reward_model)'
    )
    gconfig: GenerationHyperparameters = setting(
        factory=GenerationHyperparameters, help="sampling, for rollouts and the trainer"
    )
    rollout: InferenceEngineConfig = setting(factory=InferenceEngineConfig, help="the rollout client")
    actor: PPOActorConfig = setting(factory=PPOActorConfig, help="the policy being trained")
    ref: TrainEngineConfig | None = setting(
        None, "frozen reference model for the KL term (actor.kl_ctl); path defaults to actor.path"
    )
    critic: PPOCriticConfig | None = setting(
        None, "PPO value model: set it to train with GAE on its values; path defaults to actor.path"
    )
    train_dataset: DatasetConfig = setting(factory=DatasetConfig, help="the prompts trained on")
    valid_dataset: DatasetConfig | None = setting(None, "held-out records for the evaluator; None: no evaluation set")
    server: ServerConfig = setting(factory=ServerConfig, help="the inference servers the launchers start")
    launcher: LauncherConfig = setting(factory=LauncherConfig, help="processes and resources")
    stats_logger: StatsLoggerConfig = setting(factory=StatsLoggerConfig, help="where per-step statistics go")
    recover: RecoverConfig = setting(factory=RecoverConfig, help="checkpoints and resuming")
    evaluator: EvaluatorConfig = setting(factory=EvaluatorConfig, help="held-out evaluation during training")
    sft: SFTConfig = setting(factory=SFTConfig, help="the supervised warm start before RL")
    judge: JudgeConfig | None = setting(None, "an LLM judge as the reward (instead of reward_fn / the dataset's)")
    reward_model: RewardModelConfig | None = setting(
        None, "a scalar reward model as the reward (instead of reward_fn / the dataset's)"
    )
    distill: DistillConfig | None = setting(
        None, "on-policy distillation: a teacher model's per-token logprobs as the advantage (docs/algorithms.md)"
    )

    def __post_init__(self) -> None:
        check_choices(self, "")
        self._check_lora()
        self._check_ppo_models()
        self._check_truncation_rule()
        self._check_restart_wait()
        check_positive("", "weight_keep_versions", self.weight_keep_versions)
        check_positive("", "dist_timeout", self.dist_timeout)
        chosen = [
            n
            for n, v in (("reward_fn", self.reward_fn), ("judge", self.judge), ("reward_model", self.reward_model))
            if v
        ]
        if len(chosen) > 1:
            raise ConfigError(f"{' and '.join(chosen)} are set, but a run has one reward; keep one of them")

    def _check_ppo_models(self) -> None:
        """Fill what the actor, critic and reference model take from elsewhere; check they fit."""
        actor = self.actor
        if actor.overlong_tokens is not None and actor.overlong_tokens > self.gconfig.max_new_tokens:
            raise ConfigError(
                f"actor.overlong_tokens={actor.overlong_tokens} exceeds the generation budget "
                f"gconfig.max_new_tokens={self.gconfig.max_new_tokens}; lower it"
            )
        for name in ("ref", "critic"):
            model = getattr(self, name)
            if model is not None and not model.path:
                model.path = actor.path
        # `seed` seeds every random initialization and the sampling, unless set on its own
        if self.critic is not None and self.critic.seed is None:
            self.critic.seed = self.seed
        if actor.lora is not None and actor.lora.seed is None:
            actor.lora.seed = self.seed
        if self.gconfig.sampling_seed is None:
            self.gconfig.sampling_seed = self.seed
        if actor.kl_ctl > 0 and self.ref is None:
            raise ConfigError(
                f"actor.kl_ctl={actor.kl_ctl} needs a reference model: add a `ref:` section "
                "(e.g. ref.path=<initial policy>; empty path means actor.path), or set actor.kl_ctl=0"
            )
        if self.critic is not None and self.critic.optimizer is None:
            raise ConfigError("critic.optimizer is null; a critic is trained, give it an optimizer section")

    def _check_restart_wait(self) -> None:
        """A server the launcher restarts may answer /health only after `launcher.server_start_timeout`
        (vLLM's start takes minutes on a CPU), then waits up to `rollout.health_check_interval` for the
        client's probe and its resync; with every server down, the client's calls wait for it only
        `rollout.setup_timeout` (arealite/rollout/failover.py). Shorter, the run stops while the
        launcher still waits for the server it restarted."""
        launcher, rollout = self.launcher, self.rollout
        needed = launcher.server_start_timeout + rollout.health_check_interval
        if launcher.max_server_restarts > 0 and rollout.setup_timeout < needed:
            raise ConfigError(
                f"rollout.setup_timeout={rollout.setup_timeout:g} is shorter than a restarted server may take to "
                f"come back (launcher.server_start_timeout={launcher.server_start_timeout:g} + "
                f"rollout.health_check_interval={rollout.health_check_interval:g}), with "
                f"launcher.max_server_restarts={launcher.max_server_restarts}: the client would give up while the "
                f"launcher still waits; raise rollout.setup_timeout above {needed:g} (room for the resync)"
            )

    def _check_truncation_rule(self) -> None:
        """The trainer replays the serving backend's truncation (docs/protocol.md §1.6.1): fill
        `gconfig.truncation_rule` from `server.backend`. What a backend cannot honour is refused by
        arealite.backends.check, right after the config loads (docs/backends.md)."""
        gconfig, backend = self.gconfig, self.server.backend
        rule = TRUNCATION_RULE_OF_BACKEND[backend]
        if gconfig.truncation_rule is None:
            gconfig.truncation_rule = rule
        elif gconfig.truncation_rule != rule:
            raise ConfigError(
                f"gconfig.truncation_rule={gconfig.truncation_rule!r} is not how server.backend={backend!r} "
                f"truncates ({rule!r}): the trainer's logprobs would not be the server's; leave it unset"
            )

    def _check_lora(self) -> None:
        """An adapter trains only if the servers receive it, and only adapter syncs need one."""
        if self.weight_update == "lora" and self.actor.lora is None:
            raise ConfigError("weight_update=lora needs an adapter to sync: set actor.lora (e.g. actor.lora.rank=8)")
        if self.actor.lora is not None and self.weight_update != "lora":
            raise ConfigError(
                f"actor.lora is set but weight_update={self.weight_update!r} would sync full weights; "
                "set weight_update=lora"
            )
        if self.weight_update == "lora" and self.rollout.pause_mode != "abort":
            # SGLang keeps a paused request on the adapter it started with, and unloading an
            # adapter waits for its requests: only aborted requests move to the new adapter.
            raise ConfigError(
                f"weight_update=lora needs rollout.pause_mode=abort (got {self.rollout.pause_mode!r}): "
                "requests kept on a paused server would finish on the old adapter"
            )

    @property
    def run_dir(self) -> str:
        return os.path.join(self.fileroot, self.experiment_name, self.trial_name)
