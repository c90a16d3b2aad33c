"""Training: the train engine, optimizer, micro-batching and LoRA adapter, the PPO actor's
losses and advantages, the PPO critic, and the supervised warm start."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from arealite.config.fields import check_choices, check_positive, setting
from arealite.config.loading import ConfigError

LrScheduler = Literal["constant", "linear", "cosine"]
TrainDtype = Literal["auto", "float32", "bfloat16"]
GroupNorm = Literal["mean_std", "mean", "rloo", "none"]  # `algo.advantages.group_normalize`'s modes, plus none
LossAggMode = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]  # algo.losses.AGGREGATIONS
IsLevel = Literal["token", "sequence"]
KlEstimator = Literal["k1", "k2", "k3"]  # algo.losses.KL_ESTIMATORS
GroupStd = Literal["sample", "population"]
TruncatedBaseline = Literal["zero", "score"]
OverlongStage = Literal["after_shaping", "before_shaping"]
PolicyLoss = Literal["ppo", "cispo", "sapo", "dppo"]  # algo.losses.OBJECTIVES
RolloutCorrectionLevel = Literal["none", "token", "sequence"]
RolloutRejectionLevel = Literal["none", "token", "sequence", "geometric"]
TrustRegionKind = Literal["none", "tv", "kl"]  # algo.trust_region.KINDS
AdvEstimator = Literal["sequence", "turn_loo", "turn_index"]  # sequence, plus algo.turns.TURN_ESTIMATORS


@dataclass
class OptimizerConfig:
    """AdamW with warmup and a learning-rate schedule."""

    lr: float = setting(1e-5, "peak learning rate")
    weight_decay: float = setting(0.0, "AdamW's decoupled weight decay")
    beta1: float = setting(0.9, "Adam's first-moment decay")
    beta2: float = setting(0.999, "Adam's second-moment decay")
    eps: float = setting(1e-8, "Adam's denominator epsilon")
    warmup_steps_proportion: float = setting(
        0.0, "fraction of the optimizer steps spent warming the lr up linearly from 0"
    )
    lr_scheduler_type: LrScheduler = setting("constant", "the lr schedule after warmup")
    min_lr_ratio: float = setting(0.0, "floor of linear/cosine decay, as a fraction of lr")
    gradient_clipping: float = setting(1.0, "max global grad norm; 0 disables clipping")

    def __post_init__(self) -> None:
        check_choices(self, "optimizer")
        check_positive("optimizer", "lr", self.lr)


@dataclass
class MicroBatchSpec:
    """How a batch is split for forward/backward passes."""

    n_mbs: int = setting(1, "minimum number of micro-batches")
    max_tokens_per_mb: int | None = setting(None, "token budget of one packed micro-batch")
    balance_across_ranks: bool = setting(
        True, "ppo_update re-deals all ranks' sequences so each rank trains on ~equal tokens"
    )

    def __post_init__(self) -> None:
        check_positive("mb_spec", "n_mbs", self.n_mbs)
        if self.max_tokens_per_mb is not None:
            check_positive("mb_spec", "max_tokens_per_mb", self.max_tokens_per_mb)


@dataclass
class LoRAConfig:
    """A LoRA adapter (peft) on the actor: only its low-rank matrices train (arealite[lora])."""

    rank: int = setting(8, "r: the adapter's inner dimension")
    alpha: float = setting(16.0, "the update is scaled by alpha / rank")
    target_modules: list[str] = setting(
        factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        help="names of the linear layers that get an adapter (SGLang's --lora-target-modules)",
    )
    dropout: float = setting(0.0, "dropout on the adapter's input, in training only")
    seed: int | None = setting(
        None, "seeds the adapter's initialization (lora_A); None: the experiment's `seed` (else 0)"
    )

    def __post_init__(self) -> None:
        check_positive("actor.lora", "rank", self.rank)
        check_positive("actor.lora", "alpha", self.alpha)
        if not 0 <= self.dropout < 1:
            raise ConfigError(f"actor.lora.dropout={self.dropout} must be in [0, 1)")
        if not self.target_modules:
            raise ConfigError(
                "actor.lora.target_modules is empty; name the linear layers to adapt, e.g. [q_proj, v_proj]"
            )


@dataclass
class TrainEngineConfig:
    """The FSDP2 training engine: model, precision, optimizer, micro-batching."""

    _section = "actor"  # the name its validation messages use (not a field: no annotation)

    path: str = setting("", "HF model folder to load")
    dtype: TrainDtype = setting("auto", "auto (bf16 on CUDA, fp32 on CPU) | float32 | bfloat16")
    gradient_checkpointing: bool = setting(False, "recompute activations in the backward pass: less memory, more time")
    cpu_offload: bool = setting(False, "FSDP2 keeps parameters and optimizer state on the CPU between uses")
    optimizer: OptimizerConfig | None = setting(factory=OptimizerConfig, help="None: frozen (reference model)")
    mb_spec: MicroBatchSpec = setting(factory=MicroBatchSpec, help="how a batch is split into micro-batches")
    head_chunk_tokens: int = setting(
        2048,
        "a micro-batch of more tokens than this gets its log-probs and entropy from the final hidden states, this "
        "many tokens' [tokens, vocab] logits at a time, in forward and backward (one more head matmul, far less "
        "memory: arealite/train/lm_head.py); 0: always the whole micro-batch's logits at once",
    )
    lora: LoRAConfig | None = setting(None, "train a LoRA adapter instead of every weight (needs weight_update=lora)")

    def __post_init__(self) -> None:
        check_choices(self, self._section)
        if self.head_chunk_tokens < 0:
            raise ConfigError(
                f"{self._section}.head_chunk_tokens={self.head_chunk_tokens} must be >= 0 (0: no chunking)"
            )
        if self.lora is not None and self.optimizer is None:
            raise ConfigError(
                "a frozen model (optimizer: null, e.g. ref) cannot have a LoRA adapter; set its lora to null"
            )


@dataclass
class PPOActorConfig(TrainEngineConfig):
    """PPO/GRPO actor: losses and advantages on top of the training engine."""

    ppo_n_minibatches: int = setting(1, "optimizer steps per training step")
    eps_clip: float = setting(0.2, "PPO clip range (lower, and upper unless eps_clip_higher is set)")
    eps_clip_higher: float | None = setting(None, "DAPO clip-higher upper bound")
    c_clip: float | None = setting(None, "dual-clip constant (> 1); None disables")
    reward_scaling: float = setting(1.0, "shaped reward = clip((reward + reward_bias) * reward_scaling, +-reward_clip)")
    reward_bias: float = setting(0.0, "added to every reward before scaling")
    reward_clip: float = setting(20.0, "shaped rewards are clipped to [-reward_clip, reward_clip]")
    group_norm: GroupNorm = setting(
        "mean_std", "baseline within a group: mean_std (GRPO) | mean (Dr.GRPO) | rloo (RLOO) | none"
    )
    adv_estimator: AdvEstimator = setting(
        "sequence",
        "sequence (one score per sample: group_norm, or GAE with a critic) | turn_loo (per-turn credit: each "
        "turn's reward-to-go minus the mean reward-to-go of the group's other samples that reached that turn; "
        "unbiased with variable turn counts; needs batch turn_ids/turn_rewards, ignores group_norm, gamma "
        "discounts across turns) | turn_index (MT-GRPO-style per-turn-index group mean: biased when the policy "
        "chooses how many turns to take; for comparison)",
    )
    whiten_advantages: bool = setting(
        False,
        "whiten advantages over the batch's loss tokens (with group_norm=mean: REINFORCE++-baseline; with a "
        "critic: PPO)",
    )
    kl_ctl: float = setting(0.0, "weight of the KL to the reference model")
    use_decoupled_loss: bool = setting(False, "ratio to prox_logp with a behaviour importance weight")
    behav_imp_weight_cap: float | None = setting(
        None, "decoupled loss: tokens whose behaviour importance weight exceeds it get no loss; None: no cap"
    )
    recompute_logprob: bool = setting(True, "recompute prox_logp with current weights before the update")
    loss_agg_mode: LossAggMode = setting("token-mean", "how token losses are averaged (seq-mean-token-sum: Dr.GRPO)")
    importance_sampling_level: IsLevel = setting("token", "token (PPO) | sequence (GSPO's sequence-level ratio)")
    kl_estimator: KlEstimator = setting("k1", "Schulman's KL approximation")
    kl_in_reward: bool = setting(False, "True: -kl_ctl*KL as a per-token reward; False: kl_ctl*KL in the loss")
    entropy_coef: float = setting(0.0, "weight of the entropy bonus in the loss (entropy is always reported)")
    gamma: float = setting(1.0, "discount for token-level returns (GAE, KL-in-reward)")
    lam: float = setting(1.0, "GAE lambda")
    adv_eps: float = setting(1e-6, "epsilon in group and batch normalization of advantages")
    overlong_tokens: int | None = setting(
        None, "DAPO soft overlong penalty over the last this-many tokens of gconfig.max_new_tokens; None: off"
    )
    overlong_penalty_factor: float = setting(1.0, "penalty at the full budget, in reward units")
    mask_no_eos_with_zero: bool = setting(
        False,
        "truncated responses (no stop token within the budget) leave the loss mask (no gradient, not in the "
        "loss's denominator); what they count as in their group's baseline: truncated_baseline",
    )
    group_std: GroupStd = setting(
        "sample",
        "std of group_norm=mean_std: sample (divisor G-1, as verl, TRL and AReaL) | population (divisor G: "
        "advantages sqrt(G/(G-1)) larger, arealite's convention before this setting)",
    )
    truncated_baseline: TruncatedBaseline = setting(
        "zero",
        "with mask_no_eos_with_zero, a truncated response counts in its group's baseline (mean, std) as: zero "
        "(a failure: shaped score 0) | score (its shaped score as is: TRL's mask_truncated_completions, "
        "AReaL's group normalization)",
    )
    overlong_penalty_stage: OverlongStage = setting(
        "after_shaping",
        "after_shaping (the overlong penalty is added to the shaped reward, in its units, after the clip) | "
        "before_shaping (added to the raw reward, so bias, scaling and clip apply to it too: AReaL's and "
        "verl's DAPO order)",
    )
    policy_loss: PolicyLoss = setting(
        "ppo",
        "per-token objective: ppo (clipped ratio) | cispo (MiniMax-M1: stop-gradient ratio truncated to "
        "[1-eps_clip, 1+eps_clip_higher] times A*logp; eps_clip=1 leaves it unbounded below, as the paper) | "
        "sapo (Qwen's soft gate (4/tau)*sigmoid(tau*(ratio-1)) times A) | dppo (the unclipped -ratio*A; needs "
        "trust_region, which bounds it instead of the clip)",
    )
    sapo_tau_pos: float = setting(1.0, "policy_loss=sapo: gate temperature of tokens with a positive advantage")
    sapo_tau_neg: float = setting(1.05, "policy_loss=sapo: gate temperature of tokens with a negative advantage")
    rollout_is: RolloutCorrectionLevel = setting(
        "none",
        "rollout correction, truncated importance sampling (TIS) with the behaviour-vs-proximal weight w = "
        "exp(prox_logp - logprobs): none | token (each token's loss times min(w, rollout_is_cap)) | sequence "
        "(every token of a sequence times min(prod of its w, rollout_is_cap)); replaces the decoupled loss's "
        "untruncated w",
    )
    rollout_is_cap: float = setting(2.0, "the truncation C of rollout_is")
    rollout_is_cap_low: float | None = setting(
        None, "rollout_is: weights below it are raised to it (two-sided truncation); None: upper side only"
    )
    rollout_rs: RolloutRejectionLevel = setting(
        "none",
        "rollout correction, rejection sampling (a mask, no weight): none | token (tokens with w > "
        "rollout_rs_cap or < rollout_rs_cap_low leave the loss) | sequence (sequences whose prod of w is out "
        "of those bounds leave it) | geometric (the same with the geometric mean of the sequence's w); "
        "rejected tokens stay in the aggregation's denominator (verl's rollout_rs takes them out of its "
        "loss mask, so there the kept tokens weigh more); docs/algorithms.md maps verl's, TRL's, "
        "SkyRL's and OpenRLHF's modes onto these",
    )
    rollout_rs_cap: float = setting(2.0, "the upper threshold of rollout_rs")
    rollout_rs_cap_low: float | None = setting(
        None, "the lower threshold of rollout_rs (IcePop, verl's rollout_rs_threshold_lower); None: upper side only"
    )
    trust_region: TrustRegionKind = setting(
        "none",
        "DPPO's divergence trust region around prox_logp: none | tv (tokens whose probability rose by more "
        "than trust_region_high with A > 0, or fell by more than trust_region_low with A <= 0, leave the loss) "
        "| kl (the same with the binary KL of the sampled token's probability)",
    )
    trust_region_low: float = setting(0.2, "trust_region's threshold for tokens with A <= 0")
    trust_region_high: float = setting(0.2, "trust_region's threshold for tokens with A > 0")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.overlong_tokens is not None:
            check_positive("actor", "overlong_tokens", self.overlong_tokens)
        if self.use_decoupled_loss and not self.recompute_logprob:
            raise ConfigError("actor.use_decoupled_loss=true needs actor.recompute_logprob=true (it uses prox_logp)")
        if self.c_clip is not None and self.c_clip <= 1.0:
            raise ConfigError(f"actor.c_clip={self.c_clip} must be > 1 (dual clip), or null to disable")
        self._check_objective_and_correction()
        if self.adv_estimator != "sequence":
            if self.overlong_tokens is not None:
                raise ConfigError(
                    f"actor.overlong_tokens (a per-sequence penalty) does not apply to actor.adv_estimator="
                    f"{self.adv_estimator} (per-turn rewards); set it to null, or give the penalty as a turn reward"
                )
            if self.kl_ctl > 0 and self.kl_in_reward:
                raise ConfigError(
                    f"actor.kl_in_reward (token-level returns) does not combine with actor.adv_estimator="
                    f"{self.adv_estimator}; set kl_in_reward=false (the KL goes in the loss) or adv_estimator=sequence"
                )

    def _check_objective_and_correction(self) -> None:
        if self.c_clip is not None and self.policy_loss != "ppo":
            raise ConfigError(
                f"actor.c_clip={self.c_clip} (dual clip) belongs to policy_loss=ppo, not {self.policy_loss!r}; "
                "set actor.c_clip to null"
            )
        if self.policy_loss == "sapo" and not 0 < self.sapo_tau_pos <= self.sapo_tau_neg:
            raise ConfigError(
                f"actor.sapo_tau_pos={self.sapo_tau_pos} and sapo_tau_neg={self.sapo_tau_neg} must satisfy "
                "0 < tau_pos <= tau_neg (SAPO damps negative-advantage tokens faster; the paper uses 1.0 and 1.05)"
            )
        for name in ("rollout_is", "rollout_rs"):
            cap, low = getattr(self, f"{name}_cap"), getattr(self, f"{name}_cap_low")
            if getattr(self, name) != "none" and not cap > 1.0:
                raise ConfigError(f"actor.{name}_cap={cap} must be > 1 (a weight of 1 is on-policy)")
            if low is not None and not 0 < low < 1.0:
                raise ConfigError(f"actor.{name}_cap_low={low} must be in (0, 1) (a weight of 1 is on-policy), or null")
        if self.policy_loss == "dppo" and self.trust_region == "none":
            raise ConfigError(
                "actor.policy_loss=dppo is the unclipped ratio surrogate: it needs actor.trust_region=tv or kl to "
                "bound the update"
            )
        for name in ("trust_region_low", "trust_region_high"):
            check_positive("actor", name, getattr(self, name))
        if (self.rollout_is != "none" or self.rollout_rs != "none") and not self.recompute_logprob:
            raise ConfigError(
                "actor.rollout_is / actor.rollout_rs weigh the behaviour logprobs against prox_logp, which needs "
                "actor.recompute_logprob=true (without it the PPO ratio is already taken to the behaviour policy)"
            )


@dataclass
class PPOCriticConfig(TrainEngineConfig):
    """PPO critic: a value head on the training engine, trained on GAE returns."""

    _section = "critic"

    ppo_n_minibatches: int = setting(1, "optimizer steps per training step")
    value_eps_clip: float | None = setting(0.2, "PPO value clipping around the old values; None disables")
    loss_agg_mode: LossAggMode = setting("token-mean", "how token losses are averaged")
    seed: int | None = setting(
        None, "seeds the value head's initialization; None: the experiment's `seed` (0 outside one)"
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.lora is not None:
            raise ConfigError("critic.lora is not supported (the value head must train); set critic.lora to null")


@dataclass
class SFTConfig:
    """Supervised warm start (`python -m arealite.tools.sft_warmstart`): base model -> actor.path."""

    base_path: str = setting("", "HF model to fine-tune; the result is written to actor.path")
    steps: int = setting(100, "optimizer steps")
    batch_size: int = setting(32, "sequences per step")
    lr: float = setting(1e-3, "constant learning rate of the warm start")
    seed: int = setting(0, "data order; makes the warm start deterministic")
    records_fn: str = setting(
        "",
        '"module:function" turning the training records into SFT records, fn(records, tokenizer, config); '
        "empty: the records themselves, answer as completion",
    )

    def __post_init__(self) -> None:
        check_positive("sft", "steps", self.steps, allow_zero=True)
        check_positive("sft", "batch_size", self.batch_size)
        check_positive("sft", "lr", self.lr)
