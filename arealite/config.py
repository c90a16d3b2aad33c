"""Typed configuration: one dataclass per component, nested in one experiment config.

`load_config(argv, GRPOConfig)` reads `--config file.yaml` plus `key=value` overrides with
omegaconf and returns real dataclass objects. Unknown keys fail naming their dotted path and
the closest valid names; wrong types fail naming the field and the expected type.

Each field is documented once, here. Derived values are properties. Validation that needs
more than a type lives in `__post_init__` and says what to set instead.
"""

from __future__ import annotations

import os
import typing
from dataclasses import MISSING, dataclass, field, fields
from typing import TYPE_CHECKING, Any, Literal

from arealite.config_loading import ConfigError, choices, load_config, save_config  # noqa: F401  (re-exported)

if TYPE_CHECKING:
    from arealite.truncation import Truncation


def _key(owner: str, name: str) -> str:
    return f"{owner}.{name}" if owner else name  # owner "": a top-level field


def setting(default: Any = MISSING, help: str = "", *, factory: Any = MISSING) -> Any:
    """A config field with its help text (`--help`, `arealite.config_help`): `setting(4, "...")`,
    or `setting(factory=list, help="...")` for a mutable default."""
    if factory is not MISSING:
        return field(default_factory=factory, metadata={"help": help})
    return field(default=default, metadata={"help": help})


def _check_choices(config: Any, owner: str) -> None:
    """Every `Literal` field of `config` holds one of its values (None where the type allows it)."""
    hints = typing.get_type_hints(type(config))
    for f in fields(config):
        allowed, value = choices(hints[f.name]), getattr(config, f.name)
        if allowed is not None and value is not None and value not in allowed:
            raise ConfigError(f"{_key(owner, f.name)}={value!r} is not supported; choose one of {list(allowed)}")


# The choices of the config's fields, each declared once (the configs' validation and --help read them).
PauseMode = Literal["abort", "in_place", "retract"]  # SGLang's /pause_generation modes (0.5.6+)
Schedule = Literal["interruptible", "lockstep"]
LrScheduler = Literal["constant", "linear", "cosine"]
TrainDtype = Literal["auto", "float32", "bfloat16"]
GroupNorm = Literal["mean_std", "mean", "rloo", "none"]  # `algo.advantages.group_normalize`'s modes, plus none
LossAggMode = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]  # algo.losses.AGGREGATIONS
IsLevel = Literal["token", "sequence"]
KlEstimator = Literal["k1", "k2", "k3"]  # algo.losses.KL_ESTIMATORS
GroupStd = Literal["sample", "population"]
TruncatedBaseline = Literal["zero", "score"]
OverlongStage = Literal["after_shaping", "before_shaping"]
PolicyLoss = Literal["ppo", "cispo", "sapo"]  # algo.losses.OBJECTIVES
RolloutCorrectionLevel = Literal["none", "token", "sequence"]
DatasetType = Literal["gsm8k", "math500", "arithmetic", "walk", "jsonl"]
ServerBackend = Literal["auto", "builtin", "sglang"]
ServerDtype = Literal["auto", "float32", "bfloat16", "float16"]
WandbMode = Literal["disabled", "offline", "online"]
RecoverMode = Literal["auto", "disabled", "resume"]
WeightUpdateMode = Literal["disk", "distributed", "lora"]


def _check_positive(owner: str, name: str, value: float | int, allow_zero: bool = False) -> None:
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigError(f"{_key(owner, name)}={value!r} must be {bound}")


GREEDY_TEMPERATURE = 1e-6  # below it, sampling is greedy (SGLang's rule)


@dataclass
class GenerationHyperparameters:
    """Sampling settings for rollouts (`rollout.protocol.sampling_params` turns them into SGLang's)."""

    group_size: int = setting(4, "samples per prompt (GRPO group); also the group of group-relative advantages")
    max_new_tokens: int = setting(64, "budget of generated tokens per sample; also the budget of the overlong penalty")
    min_new_tokens: int = setting(0, "EOS/stop is suppressed until this many tokens are out")
    temperature: float = setting(1.0, "< 1e-6 means greedy, as in SGLang; the trainer's logprobs use it too")
    top_p: float = setting(1.0, "nucleus sampling: keep the smallest set of tokens with this much probability")
    top_k: int = setting(-1, "-1: whole vocabulary")
    stop_token_ids: list[int] = setting(factory=list, help="extra stop ids besides EOS")
    stop: list[str] = setting(factory=list, help="stop strings")
    frequency_penalty: float = setting(0.0, "subtracted from a token's logit once per earlier occurrence (SGLang's)")
    sampling_seed: int | None = setting(
        None,
        "base of per-sample seeds (reproducible sampling); None: the experiment's `seed` (server-chosen "
        "outside an experiment)",
    )
    min_p: float = setting(0.0, "drop tokens less likely than min_p times the most likely one")
    truncated_logprobs: bool = setting(
        True,
        "with top_p / top_k / min_p truncating: behaviour logprobs (asked of the server as "
        "`processed_logprobs`) and the trainer's logprobs are those of the truncated, renormalised "
        "distribution tokens are drawn from; false: full-vocabulary log_softmax(logits / T) on both sides "
        "(SGLang's and verl's, TRL's, AReaL's convention), which is all a real SGLang server reports "
        "(docs/protocol.md §1.6)",
    )

    def __post_init__(self) -> None:
        _check_positive("gconfig", "group_size", self.group_size)
        _check_positive("gconfig", "max_new_tokens", self.max_new_tokens)
        _check_positive("gconfig", "temperature", self.temperature, allow_zero=True)
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"gconfig.top_p={self.top_p} must be in (0, 1]")
        if self.top_k != -1 and self.top_k < 1:
            raise ConfigError(f"gconfig.top_k={self.top_k} must be -1 (whole vocabulary) or >= 1")
        if not 0.0 <= self.min_p <= 1.0:
            raise ConfigError(f"gconfig.min_p={self.min_p} must be in [0, 1]")

    @property
    def logprob_temperature(self) -> float:
        """The temperature of the logprobs a server reports, which the trainer must reproduce:
        the sampling temperature, or 1 for greedy sampling (SGLang's greedy rewrite)."""
        return 1.0 if self.temperature < GREEDY_TEMPERATURE else self.temperature

    @property
    def logprob_truncation(self) -> Truncation | None:
        """The truncation the trainer's logprobs apply, or None for full-vocabulary logprobs:
        nothing truncates, `truncated_logprobs` is off, or sampling is greedy (which keeps
        SGLang's temperature-1 logprobs: greedy runs evaluate, they do not train off-policy)."""
        from arealite.truncation import TOP_K_ALL, Truncation  # imports torch: launchers must not

        truncation = Truncation(self.top_k, self.top_p, self.min_p)
        greedy = self.temperature < GREEDY_TEMPERATURE
        if greedy or not self.truncated_logprobs or not truncation.cuts(TOP_K_ALL):
            return None
        return truncation


@dataclass
class InferenceEngineConfig:
    """The rollout client (`RemoteSGLangEngine`) and its workflow executor."""

    max_concurrent_rollouts: int | None = setting(None, "in-flight trajectories; None: the batch size")
    max_head_offpolicyness: int = setting(0, "staleness bound in versions; 0 is synchronous")
    dynamic_sampling: bool = setting(
        False,
        "DAPO: drop groups whose rewards are all equal (no learning signal) and keep sampling until the batch is full",
    )
    request_timeout: float = setting(3600.0, "seconds for one /generate call (includes pause windows)")
    request_retries: int = setting(3, "attempts on connection errors and 5xx, with backoff")
    setup_timeout: float = setting(120.0, "seconds to wait for servers to become healthy")
    health_check_interval: float = setting(5.0, "seconds between probes of servers out of rotation")
    pause_grace_period: float = setting(0.0, "seconds to sleep after pausing before a weight upload")
    health_check_timeout: float = setting(5.0, "seconds one /health probe may take before the server counts as down")
    consumer_batch_size: int | None = setting(
        None, "trajectories per trained batch (the staleness unit); None: the dataloader's batch size"
    )
    control_timeout: float = setting(60.0, "seconds one pause / continue / version-check call to a server may take")
    weight_update_timeout: float = setting(
        45.0,
        "distributed weight update: seconds the group may take to form, one broadcast may wait and one "
        "server's update call may take; a server past it is excluded (a killed one within a second)",
    )
    stall_timeout: float = setting(
        600.0,
        "seconds rollout_batch / prepare_batch may go without progress before a diagnostic is logged; raised "
        "after twice that; 0 disables",
    )
    pause_mode: PauseMode = setting(
        "abort",
        "weight sync: abort (interrupt, resubmit with partial output; any SGLang) | in_place (stay, continue "
        "on new weights over kept KV; >= 0.5.6) | retract (stay queued, KV recomputed on resume; >= 0.5.6)",
    )
    schedule: Schedule = setting(
        "interruptible",
        "with max_head_offpolicyness = k >= 1: interruptible (AReaL's: episodes start within the staleness "
        "bound, weight syncs interrupt them) | lockstep (batch b is exactly the b-th prompt batch, generated "
        "entirely by weights b - k while batch b - 1 trains; never interrupted, reproducible; no dynamic "
        "sampling)",
    )
    dump_dir: str = setting(
        "",
        "write each trained step's samples (prompt and completion text, token ids, logprobs, versions, "
        "reward, advantages) to <dump_dir>/step_<n>/rank<r>.jsonl, one line per sample "
        "(`arealite.replay.RolloutDump`); `python -m arealite.replay <dump_dir> --step <n>` re-runs that "
        "step's update; empty: no dump",
    )
    dump_keep_steps: int = setting(20, "steps kept in dump_dir (older ones are deleted); 0 keeps every step")

    def __post_init__(self) -> None:
        _check_choices(self, "rollout")
        if self.schedule == "lockstep" and (self.max_head_offpolicyness < 1 or self.dynamic_sampling):
            raise ConfigError(
                "rollout.schedule=lockstep needs rollout.max_head_offpolicyness >= 1 (how many batches ahead it "
                f"generates; got {self.max_head_offpolicyness}) and rollout.dynamic_sampling=false (got "
                f"{self.dynamic_sampling}); set them, or use schedule=interruptible"
            )
        _check_positive("rollout", "max_head_offpolicyness", self.max_head_offpolicyness, allow_zero=True)
        if self.max_concurrent_rollouts is not None:
            _check_positive("rollout", "max_concurrent_rollouts", self.max_concurrent_rollouts)
        _check_positive("rollout", "request_timeout", self.request_timeout)
        for name in ("control_timeout", "weight_update_timeout", "setup_timeout", "health_check_timeout"):
            _check_positive("rollout", name, getattr(self, name))
        _check_positive("rollout", "stall_timeout", self.stall_timeout, allow_zero=True)
        _check_positive("rollout", "dump_keep_steps", self.dump_keep_steps, allow_zero=True)


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
        _check_choices(self, "optimizer")
        _check_positive("optimizer", "lr", self.lr)


@dataclass
class MicroBatchSpec:
    """How a batch is split for forward/backward passes."""

    n_mbs: int = setting(1, "minimum number of micro-batches")
    max_tokens_per_mb: int | None = setting(None, "token budget of one packed micro-batch")
    balance_across_ranks: bool = setting(
        True, "ppo_update re-deals all ranks' sequences so each rank trains on ~equal tokens"
    )

    def __post_init__(self) -> None:
        _check_positive("mb_spec", "n_mbs", self.n_mbs)
        if self.max_tokens_per_mb is not None:
            _check_positive("mb_spec", "max_tokens_per_mb", self.max_tokens_per_mb)


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
        _check_positive("actor.lora", "rank", self.rank)
        _check_positive("actor.lora", "alpha", self.alpha)
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
    lora: LoRAConfig | None = setting(None, "train a LoRA adapter instead of every weight (needs weight_update=lora)")

    def __post_init__(self) -> None:
        _check_choices(self, self._section)
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
        "sapo (Qwen's soft gate (4/tau)*sigmoid(tau*(ratio-1)) times A)",
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
    rollout_rs: RolloutCorrectionLevel = setting(
        "none",
        "rollout correction, masked importance sampling (MIS / rejection): none | token (tokens with w > "
        "rollout_rs_cap leave the loss) | sequence (sequences whose prod of w exceeds rollout_rs_cap leave "
        "it); dropped tokens stay in the aggregation's denominator; upper side only (verl's rollout_rs also "
        "rejects below a lower threshold); docs/algorithms.md maps verl's and TRL's modes onto these",
    )
    rollout_rs_cap: float = setting(2.0, "the threshold of rollout_rs")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.overlong_tokens is not None:
            _check_positive("actor", "overlong_tokens", self.overlong_tokens)
        if self.use_decoupled_loss and not self.recompute_logprob:
            raise ConfigError("actor.use_decoupled_loss=true needs actor.recompute_logprob=true (it uses prox_logp)")
        if self.c_clip is not None and self.c_clip <= 1.0:
            raise ConfigError(f"actor.c_clip={self.c_clip} must be > 1 (dual clip), or null to disable")
        self._check_objective_and_correction()

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
            cap = getattr(self, f"{name}_cap")
            if getattr(self, name) != "none" and not cap > 1.0:
                raise ConfigError(f"actor.{name}_cap={cap} must be > 1 (a weight of 1 is on-policy)")
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
class DatasetConfig:
    """A dataset and its loader."""

    path: str = setting(
        "",
        "what datasets reads: a json/jsonl/parquet/csv/arrow file, a save_to_disk folder, a folder of data "
        "files, or a cached hub name (HF_HUB_OFFLINE=1); unused for type=arithmetic",
    )
    type: DatasetType = setting(
        "gsm8k",
        "jsonl: generic records in any of path's formats; arithmetic and walk are synthetic (arealite/data/)",
    )
    split: str | None = setting(
        None,
        "split of a multi-split source (hub name, folder, DatasetDict); None: train for train_dataset, test "
        "for valid_dataset",
    )
    subset: str | None = setting(None, "hub dataset configuration, e.g. main for openai/gsm8k")
    batch_size: int = setting(8, "prompts per step (across all ranks)")
    shuffle: bool = setting(True, "reshuffle the records every epoch (seeded by the experiment seed)")
    num_samples: int = setting(1000, "size of a synthetic dataset (type=arithmetic or walk)")
    max_prompt_tokens: int | None = setting(None, "drop prompts longer than this")
    max_operand: int = setting(20, "type=arithmetic: operands are drawn from min_operand..max_operand")
    min_operand: int = setting(
        0, 'type=arithmetic: smallest operand (e.g. 32 with max 99 and ops "*": four-digit products)'
    )
    ops: str = setting("+-", "type=arithmetic: operators to draw from (any of + - *)")
    median_steps: float = setting(7.0, "type=walk: median number of worked steps (log-normal, so a long tail)")
    max_steps: int = setting(99, "type=walk: most steps of a problem (at most 99)")

    def __post_init__(self) -> None:
        _check_choices(self, "dataset")
        _check_positive("dataset", "batch_size", self.batch_size)


@dataclass
class ServerConfig:
    """Inference servers: the built-in CPU server or SGLang."""

    backend: ServerBackend = setting("auto", "auto (SGLang with CUDA, built-in otherwise) | builtin | sglang")
    model_path: str = setting("", "defaults to actor.path")
    dtype: ServerDtype = setting("auto", "--dtype of the server")
    context_length: int | None = setting(None, "defaults to the model's max_position_embeddings")
    max_running_requests: int = setting(64, "sequences a server decodes at once (--max-running-requests); more wait")
    random_seed: int = setting(1, "the server's --random-seed (sampling without a per-request seed)")
    extra_args: list[str] = setting(factory=list, help="appended to the server command line")
    deterministic: bool = setting(
        False,
        "--enable-deterministic-inference (SGLang's flag, both backends): a sequence's numerics do not depend "
        "on what shares its batch, so same-seed runs repeat exactly; slower (benchmarks/README.md)",
    )

    def __post_init__(self) -> None:
        _check_choices(self, "server")


@dataclass
class LauncherConfig:
    """Process allocation for the launchers."""

    n_servers: int = setting(1, "inference servers")
    n_trainers: int = setting(1, "trainer processes (torchrun nproc_per_node)")
    gpus_per_server: int = setting(1, "ignored by the built-in server on CPU")
    server_start_timeout: float = setting(180.0, "seconds a server may take to answer /health before the launch fails")
    max_server_restarts: int = setting(0, "restarts per server before the run stops")
    setup_commands: list[str] = setting(factory=list, help="shell commands run once before servers start")
    cpus_per_server: int = setting(
        1,
        "CPUs reserved per server (Ray bundle, Slurm --cpus-per-task; local built-in server: its torch "
        "threads unless OMP_NUM_THREADS is set)",
    )
    cpus_per_trainer: int = setting(
        1,
        "CPUs reserved per trainer rank (Ray bundle, Slurm --cpus-per-task; local: its torch threads unless "
        "OMP_NUM_THREADS is set)",
    )
    ray_address: str = setting(
        "", 'Ray cluster to join ("auto" or host:port); empty: $RAY_ADDRESS, else start a local one'
    )
    trainer_nodes: int = setting(1, "Slurm nodes the trainer ranks span (n_trainers split evenly across them)")
    slurm_partition: str = setting("", "sbatch --partition; empty: the cluster's default partition")
    slurm_sbatch_args: list[str] = setting(factory=list, help='extra sbatch options, e.g. ["--account=rl"]')

    def __post_init__(self) -> None:
        _check_positive("launcher", "n_servers", self.n_servers)
        _check_positive("launcher", "n_trainers", self.n_trainers)
        _check_positive("launcher", "max_server_restarts", self.max_server_restarts, allow_zero=True)
        _check_positive("launcher", "trainer_nodes", self.trainer_nodes)
        if self.n_trainers % self.trainer_nodes:
            raise ConfigError(
                f"launcher.n_trainers={self.n_trainers} does not split evenly over "
                f"launcher.trainer_nodes={self.trainer_nodes}; make n_trainers a multiple of trainer_nodes"
            )


@dataclass
class StatsLoggerConfig:
    """Where per-step statistics go."""

    jsonl: bool = setting(True, "write <run_dir>/stats.jsonl")
    tensorboard: bool = setting(False, "also write <run_dir>/tensorboard/ (needs the tensorboard package)")
    wandb_mode: WandbMode = setting("disabled", "whether and how wandb logs the run")
    progress_bar: bool = setting(True, "a tqdm bar over training steps on the main process")
    plot: bool = setting(True, "write <run_dir>/plots.png at the end of the run (needs matplotlib)")
    samples_shown: int = setting(
        3,
        "completions of the trained batch shown in the console, samples.jsonl, tensorboard and wandb at each "
        "evaluation (`StatsLogger.log_samples`); 0: none",
    )

    def __post_init__(self) -> None:
        _check_choices(self, "stats_logger")


@dataclass
class RecoverConfig:
    """Checkpoints for recovery (`arealite.recover`): what a crashed run resumes from."""

    mode: RecoverMode = setting(
        "auto", "auto: resume when a checkpoint exists | disabled | resume: a checkpoint must exist"
    )
    freq_steps: int = setting(0, "save every this many steps (and after the last); 0: only after the last step")
    keep_last: int = setting(
        2, "checkpoints kept on disk (older ones are deleted); >= 2 leaves one to fall back to if the newest is damaged"
    )
    checksum: bool = setting(
        True,
        "record each checkpoint file's SHA-256 and verify it before loading (one extra read at save and "
        "load); sizes are always checked",
    )

    def __post_init__(self) -> None:
        _check_choices(self, "recover")
        _check_positive("recover", "freq_steps", self.freq_steps, allow_zero=True)
        _check_positive("recover", "keep_last", self.keep_last)


@dataclass
class EvaluatorConfig:
    """Periodic evaluation on a held-out set (`arealite.eval`): pass@1, pass@k and maj@k."""

    freq_steps: int = setting(0, "evaluate every this many steps, before the first and after the last; 0: never")
    k: int = setting(4, "samples per prompt")
    temperature: float = setting(1.0, "sampling temperature of the evaluation (pass@1 is the mean accuracy)")
    max_new_tokens: int | None = setting(None, "defaults to gconfig.max_new_tokens")
    num_samples: int | None = setting(None, "evaluate on the first this-many held-out records; None: all")
    seed: int = setting(1234, "base of the per-sample sampling seeds, so a re-run reproduces the number")

    def __post_init__(self) -> None:
        _check_positive("evaluator", "freq_steps", self.freq_steps, allow_zero=True)
        _check_positive("evaluator", "k", self.k)
        _check_positive("evaluator", "temperature", self.temperature, allow_zero=True)


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
        _check_positive("sft", "steps", self.steps, allow_zero=True)
        _check_positive("sft", "batch_size", self.batch_size)
        _check_positive("sft", "lr", self.lr)


@dataclass
class ToolUseConfig:
    """Tool calling in rollouts (`arealite.workflow.ToolUseWorkflow`), read by examples/tools_grpo.py."""

    tools: list[str] = setting(
        factory=lambda: ["arealite.workflow.tools:Calculator"],
        help='"module:Class" of each tool, built without arguments',
    )
    max_turns: int = setting(3, "model replies per sample, the final answer included")

    def __post_init__(self) -> None:
        _check_positive("tool_use", "max_turns", self.max_turns)


@dataclass
class AgentProgramConfig:
    """Agents that are programs (`arealite.agent.AgentProgramWorkflow`), read by examples/openai_agent_grpo.py."""

    command: list[str] = setting(
        factory=list,
        help="the program and its arguments, run once per sample with OPENAI_BASE_URL set to its session of the "
        "endpoint (docs/agents.md)",
    )
    timeout: float = setting(60.0, "seconds a program may run; past it it is killed and its group rejected")
    host: str = setting("127.0.0.1", "where the endpoint listens; loopback unless the programs run elsewhere")

    def __post_init__(self) -> None:
        _check_positive("agent", "timeout", self.timeout)


JUDGE_RUBRIC = "Question: {question}\nAnswer: {completion}\nIs the answer correct? Reply with one word: yes or no."
JudgeVerdict = Literal["logprob", "text"]
RewardModelDtype = Literal["float32", "bfloat16", "float16"]


@dataclass
class JudgeConfig:
    """An LLM judge as the reward (`arealite.reward.judge.JudgeReward`, docs/reward_models.md): never trained."""

    path: str = setting(
        "",
        "HF model folder of the judge: the local launcher serves it on a built-in server of its own (never "
        "weight-synced), and its tokenizer renders the chat template; empty: address must be set",
    )
    address: str = setting(
        "",
        "host:port[,host:port] of judge servers that already run (SGLang or built-in); empty: the launcher's "
        "server of path",
    )
    rubric: str = setting(
        JUDGE_RUBRIC,
        "the judge's instruction, a format string with {question} (the last user message), {completion}, {prompt} "
        "and any record field (e.g. {answer} for a reference-guided judge)",
    )
    chat_template: bool = setting(
        True,
        "send the rubric as a user turn through the judge tokenizer's chat template (needs path); false: the rubric "
        "is the whole prompt text, chat markup included",
    )
    verdict: JudgeVerdict = setting(
        "logprob",
        "logprob: P(yes) / (P(yes) + P(no)) of the first reply token, a graded score in [0, 1]; text: a greedy "
        "reply, read as `VERDICT: yes|no`, `score: N` (N / max_score) or a bare yes/no",
    )
    yes: list[str] = setting(factory=lambda: ["yes"], help="words that approve (any case, any leading space)")
    no: list[str] = setting(factory=lambda: ["no"], help="words that reject")
    top_logprobs: int = setting(20, "verdict=logprob: first-token candidates searched for yes / no tokens")
    max_new_tokens: int = setting(32, "verdict=text: budget of the judge's reply")
    max_score: float = setting(10.0, "verdict=text: `score: N` is scaled to N / max_score")
    timeout: float = setting(
        60.0,
        "seconds one batched judge request may take; past it each of its samples is a failed reward "
        "(RewardTimeout), never a 0",
    )
    max_batch_size: int = setting(64, "samples per judge request")
    max_wait: float = setting(0.02, "seconds a sample waits for others to share its request")
    max_concurrency: int = setting(4, "judge requests in flight at once, per trainer process")

    def __post_init__(self) -> None:
        _check_choices(self, "judge")
        if not self.path and not self.address:
            raise ConfigError(
                "judge needs a model: set judge.path=DIR (the launcher serves it) or judge.address=host:port"
            )
        if self.chat_template and not self.path:
            raise ConfigError(
                "judge.chat_template=true renders with the judge's tokenizer, but judge.path is empty; set "
                "judge.path=DIR, or judge.chat_template=false and write the chat markup into judge.rubric"
            )
        if not self.yes or not self.no:
            raise ConfigError(f"judge.yes={self.yes} and judge.no={self.no} must each name at least one word")
        for name in ("top_logprobs", "max_new_tokens", "max_score", "timeout", "max_batch_size", "max_concurrency"):
            _check_positive("judge", name, getattr(self, name))
        _check_positive("judge", "max_wait", self.max_wait, allow_zero=True)


@dataclass
class RewardModelConfig:
    """A scalar reward model (`AutoModelForSequenceClassification`) as the reward (`arealite.reward.classifier`)."""

    path: str = setting("", "HF folder of the classifier; loaded once per trainer process, never trained")
    device: str = setting("cpu", "where it runs: cpu | cuda | cuda:N | auto (cuda when available)")
    dtype: RewardModelDtype = setting("float32", "the classifier's dtype")
    template: str = setting(
        "",
        "the classifier's input, a format string with {question}, {completion}, {prompt} and record fields; empty: "
        "its tokenizer's chat template over [user: question, assistant: completion] (else question + ' ' + "
        "completion)",
    )
    positive_label: int = setting(
        1,
        "num_labels > 1: the reward is this class's softmax probability; num_labels == 1: the reward is the logit "
        "itself",
    )
    max_length: int = setting(1024, "tokens per input; longer inputs keep their end (the completion)")
    max_batch_size: int = setting(32, "samples per forward pass")
    max_wait: float = setting(0.02, "seconds a sample waits for others to share its forward pass")
    timeout: float = setting(
        60.0, "seconds one batched forward pass may take; past it each of its samples is a failed reward"
    )

    def __post_init__(self) -> None:
        if not self.path:
            raise ConfigError("reward_model.path is empty; set it to an AutoModelForSequenceClassification folder")
        _check_choices(self, "reward_model")
        if not (self.device in ("cpu", "cuda", "auto") or self.device.startswith("cuda:")):
            raise ConfigError(f"reward_model.device={self.device!r} is not supported; use cpu, cuda, cuda:N or auto")
        for name in ("max_length", "max_batch_size", "timeout"):
            _check_positive("reward_model", name, getattr(self, name))
        _check_positive("reward_model", "max_wait", self.max_wait, allow_zero=True)
        _check_positive("reward_model", "positive_label", self.positive_label, allow_zero=True)


@dataclass
class GRPOConfig:
    """A GRPO/PPO experiment: everything one training script reads."""

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
        "disk", "how weights reach the servers (lora: only the actor's LoRA adapter, through /load_lora_adapter)"
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
    tool_use: ToolUseConfig | None = setting(None, "tool calling (examples/tools_grpo.py)")
    agent: AgentProgramConfig | None = setting(
        None, "agent programs behind an OpenAI-compatible endpoint (examples/openai_agent_grpo.py)"
    )
    judge: JudgeConfig | None = setting(None, "an LLM judge as the reward (instead of reward_fn / the dataset's)")
    reward_model: RewardModelConfig | None = setting(
        None, "a scalar reward model as the reward (instead of reward_fn / the dataset's)"
    )

    def __post_init__(self) -> None:
        _check_choices(self, "")
        self._check_lora()
        self._check_ppo_models()
        _check_positive("", "weight_keep_versions", self.weight_keep_versions)
        _check_positive("", "dist_timeout", self.dist_timeout)
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
