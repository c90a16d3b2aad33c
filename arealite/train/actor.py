"""PPOActor: the policy under training — recomputed logprobs, advantages, and the PPO update.

Typical step (docs/architecture.md §1), every call collective over trainer ranks:

    stats = actor.compute_advantages(batch)  # writes batch["advantages"] (and "returns"); its timing
    stats.update(actor.ppo_update(batch))    # the update's stats, over its ppo_n_minibatches steps

`prox_logp`, the log-probs under the weights before the update, costs no extra forward when
the update is one optimizer step (`ppo_n_minibatches == 1`): micro-batches only accumulate
gradients, so the loss forward's own log-probs, detached, are exactly those (TRL's
`num_iterations=1`). With several optimizer steps `ppo_update` recomputes it first with
`compute_logp`, and a KL-in-reward `compute_advantages` does the same because it reads it.
A `batch["prox_logp"]` the caller sets is always used as is.

Which loss variant runs is chosen by config fields that name functions in
`arealite.algo.losses` (objective, aggregation, ratio level, KL estimator) and the rollout
correction in `arealite.algo.rollout_correction`; advantages come from
`arealite.algo.advantages` (see `arealite.train.advantage_estimation`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from functools import partial

import torch

from arealite.algo.advantages import backend as advantages_backend
from arealite.algo.losses import (
    AGGREGATIONS,
    KL_ESTIMATORS,
    LOG_RATIOS,
    OBJECTIVES,
    Objective,
    kl_loss,
    ppo_actor_loss,
)
from arealite.algo.rollout_correction import RolloutCorrection
from arealite.algo.truncation import Truncation
from arealite.algo.trust_region import TrustRegion
from arealite.config import GenerationHyperparameters, PPOActorConfig
from arealite.data.packing import Batch
from arealite.train.advantage_estimation import estimate_advantages
from arealite.train.engine import FSDPEngine, load_causal_lm
from arealite.train.lm_head import HiddenStates, accepts_hidden_states
from arealite.train.logprobs import batch_token_logprobs, packed_logprobs_and_entropy
from arealite.utils.stop_ids import batch_stop_ids


class PPOActor(FSDPEngine):
    """FSDPEngine plus the PPO/GRPO verbs. `total_train_steps` counts training steps.

    Construct, then `initialize()` (collective) before use.
    """

    def __init__(
        self,
        config: PPOActorConfig,
        gconfig: GenerationHyperparameters | None = None,
        total_train_steps: int | None = None,
        build_model=load_causal_lm,
    ):
        if gconfig is not None and not isinstance(gconfig, GenerationHyperparameters):
            raise TypeError(
                f"PPOActor's second argument is the sampling config (config.gconfig: group size, temperature, "
                f"generation budget), got {type(gconfig).__name__}; call PPOActor(config.actor, config.gconfig, "
                "total_train_steps)"
            )
        optimizer_steps = None if total_train_steps is None else total_train_steps * config.ppo_n_minibatches
        super().__init__(config, optimizer_steps, build_model)
        self.config: PPOActorConfig = config
        self.gconfig = gconfig if gconfig is not None else GenerationHyperparameters()

    @torch.no_grad()
    def compute_logp(self, batch: Batch, temperature: float | None = None) -> torch.Tensor:
        """Token-aligned logprobs [B, T] (fp32) at the current weights and `temperature`.

        `out[b, t] = log p(input_ids[b, t] | input_ids[b, :t])` from logits / temperature;
        0 at t = 0, on padding, and (when the batch has `loss_mask`) outside the loss mask.
        """
        temp = self.gconfig.logprob_temperature if temperature is None else temperature
        return batch_token_logprobs(self, batch, temp, self.gconfig.logprob_truncation, self.stop_ids(batch))

    def stop_ids(self, batch: Batch) -> list[int]:
        """The stop ids `gconfig.min_new_tokens` banned while the tokens `batch["stop_banned"]` marks
        were sampled (the model's EOS and `gconfig.stop_token_ids`, arealite/utils/stop_ids.py); []
        for a batch without `stop_banned`."""
        return batch_stop_ids(batch, self.config.path, self.gconfig.stop_token_ids)

    def compute_advantages(self, batch: Batch) -> dict[str, float]:
        """Write `advantages` [B, T] (and `returns` when token-level) into `batch`; returns its stats.

        With `mask_no_eos_with_zero` it also replaces `loss_mask` by one without the truncated
        responses (so the critic's update skips them too), keeping the workflow's mask as
        `response_mask`, which the statistics read (`batch_stats` may run before or after).

        The estimate runs on the trainer's device (the Triton kernels on CUDA) and the results
        come back to the batch's device. The stats are its wall time and backend
        (`time/advantages`, `advantages/backend_triton`: 1 Triton, 0 torch).
        A KL-in-reward penalty reads `prox_logp`: if the batch lacks it (and
        `recompute_logprob` is on) it is computed here first and left in `batch`, so the
        update uses the same values; collective then.
        """
        cfg = self.config
        kl_reads_prox = cfg.recompute_logprob and cfg.kl_ctl > 0 and cfg.kl_in_reward
        if kl_reads_prox and "prox_logp" not in batch:
            batch["prox_logp"] = self.compute_logp(batch)
        started = time.perf_counter()
        home = batch["loss_mask"].device
        on_device = {k: v.to(self.device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        estimated = estimate_advantages(on_device, cfg, self.gconfig)
        result = {k: v.to(home) for k, v in estimated.items()}  # .to(home) waits for it
        if "loss_mask" in result:
            batch.setdefault("response_mask", batch["loss_mask"])
        batch.update(result)
        return {
            "time/advantages": time.perf_counter() - started,
            "advantages/backend_triton": float(advantages_backend(self.device) == "triton"),
        }

    def ppo_update(self, batch: Batch) -> dict[str, float]:
        """`ppo_n_minibatches` optimizer steps over this rank's batch; the update's stats (one dict:
        a mean over the steps weighted by their loss weight, extrema over them; FSDPEngine.train_minibatches).

        Needs `advantages` (compute_advantages). The old policy of the PPO ratio, `prox_logp`:
        the batch's own if set; else, with `recompute_logprob`, the log-probs at the current
        weights (taken from the loss forward itself when there is one optimizer step, from a
        `compute_logp` pass before the first step otherwise); else the behaviour `logprobs`.
        """
        cfg = self.config
        for key in ("advantages", "loss_mask", "logprobs"):
            if key not in batch:
                hint = " (call actor.compute_advantages(batch) first)" if key == "advantages" else ""
                raise KeyError(f"ppo_update needs batch[{key!r}]{hint}")
        if "prox_logp" not in batch:
            if not cfg.recompute_logprob:
                batch = {**batch, "prox_logp": batch["logprobs"]}
            elif cfg.ppo_n_minibatches > 1:  # later minibatches see moved weights: fix it now
                batch = {**batch, "prox_logp": self.compute_logp(batch)}
            # else: no prox_logp key, and actor_loss takes its own forward's log-probs
        agg = AGGREGATIONS[cfg.loss_agg_mode]
        loss_fn = accepts_hidden_states(
            partial(
                actor_loss,
                config=cfg,
                temperature=self.gconfig.logprob_temperature,
                truncation=self.gconfig.logprob_truncation,
                stop_ids=self.stop_ids(batch),
            )
        )
        weight_fn = lambda mb: agg.weight(mb["loss_mask"].bool(), mb["cu_seqlens"])  # noqa: E731
        return self.train_minibatches(batch, loss_fn, weight_fn, cfg.ppo_n_minibatches, "actor.ppo_n_minibatches")


def actor_loss(
    logits: torch.Tensor | HiddenStates,
    mb: Batch,
    config: PPOActorConfig,
    temperature: float = 1.0,
    truncation: Truncation | None = None,
    stop_ids: Sequence[int] = (),
) -> tuple[torch.Tensor, dict]:
    """The configured PPO loss on one packed micro-batch; logits [N, V] at the sampling `temperature`
    (or the `HiddenStates` they come from: the engine's `head_chunk_tokens`), `stop_ids` out of the
    distribution at the tokens `mb["stop_banned"]` marks (min_new_tokens, arealite/train/logprobs.py).

    Without `mb["prox_logp"]` the old policy is this forward's own log-probs, detached:
    right only while the weights have not moved since the update began (`ppo_update` leaves
    the key out only for a one-optimizer-step update).
    """
    dev = logits.device
    cu = mb["cu_seqlens"].to(dev)
    mask = mb["loss_mask"].to(dev).bool()
    entropy_grad = config.entropy_coef > 0  # a bonus needs the entropy's gradient; else it is a statistic
    logp, entropy = packed_logprobs_and_entropy(
        logits, mb["input_ids"], cu, temperature, truncation, True, entropy_grad, mb.get("stop_banned"), stop_ids
    )
    prox = mb["prox_logp"].to(dev).float() if "prox_logp" in mb else logp.detach()
    behav = mb["logprobs"].to(dev).float()
    agg = AGGREGATIONS[config.loss_agg_mode].reduce
    correction = rollout_correction(config)
    loss, stats = ppo_actor_loss(
        logp, prox, mb["advantages"].to(dev).float(), mask, cu,
        eps_clip=config.eps_clip, eps_clip_higher=config.eps_clip_higher, c_clip=config.c_clip,
        behav_logp=behav if correction is not None else None,
        aggregate=agg, log_ratio=LOG_RATIOS[config.importance_sampling_level],
        objective=policy_objective(config), correction=correction, trust_region=trust_region(config),
    )  # fmt: skip
    if config.kl_ctl > 0 and not config.kl_in_reward:
        if "ref_logp" not in mb:
            raise KeyError("actor.kl_ctl > 0 needs batch['ref_logp']: set it to ref.compute_logp(batch)")
        kl, kl_stats = kl_loss(logp, mb["ref_logp"].to(dev).float(), mask, cu, KL_ESTIMATORS[config.kl_estimator], agg)
        loss = loss + config.kl_ctl * kl
        stats.update(kl_stats)
    ent = agg(entropy, mask, cu)
    if config.entropy_coef > 0:
        loss = loss - config.entropy_coef * ent
    stats["entropy"] = ent.detach()
    stats.update(_mismatch_stats(behav, prox, mask, cu))
    return loss, stats


def policy_objective(config: PPOActorConfig) -> Objective:
    """The per-token objective `actor.policy_loss` names, with its parameters bound."""
    if config.policy_loss == "sapo":
        return partial(OBJECTIVES["sapo"], tau_pos=config.sapo_tau_pos, tau_neg=config.sapo_tau_neg)
    if config.policy_loss == "dppo":
        return OBJECTIVES["dppo"]
    return partial(OBJECTIVES[config.policy_loss], eps_clip=config.eps_clip, eps_clip_higher=config.eps_clip_higher)


def rollout_correction(config: PPOActorConfig) -> RolloutCorrection | None:
    """The behaviour-policy correction the config asks for: the decoupled loss (untruncated
    token weights, `behav_imp_weight_cap`) and / or `rollout_is` / `rollout_rs`; None: none."""
    if not config.use_decoupled_loss and config.rollout_is == "none" and config.rollout_rs == "none":
        return None
    return RolloutCorrection(
        is_level=config.rollout_is, is_cap=config.rollout_is_cap,
        rs_level=config.rollout_rs, rs_cap=config.rollout_rs_cap,
        decoupled=config.use_decoupled_loss,
        behav_cap=config.behav_imp_weight_cap if config.use_decoupled_loss else None,
        is_cap_low=config.rollout_is_cap_low, rs_cap_low=config.rollout_rs_cap_low,
    )  # fmt: skip


def trust_region(config: PPOActorConfig) -> TrustRegion | None:
    """DPPO's divergence trust region `actor.trust_region` asks for; None: none."""
    if config.trust_region == "none":
        return None
    return TrustRegion(config.trust_region, low=config.trust_region_low, high=config.trust_region_high)


def _mismatch_stats(behav: torch.Tensor, prox: torch.Tensor, mask: torch.Tensor, cu: torch.Tensor) -> dict:
    """Train-inference mismatch: |logprobs - prox_logp| and the behaviour importance weight."""
    diff = (behav - prox).abs()
    weight = torch.exp(prox - behav)
    sel_d, sel_w = diff[mask], weight[mask]
    if sel_d.numel() == 0:
        sel_d = sel_w = diff.new_zeros(1)
    return {
        "logprob_mismatch": sel_d.mean(), "logprob_mismatch_max": sel_d.max(),
        "behav_imp_weight": sel_w.mean(), "behav_imp_weight_max": sel_w.max(), "behav_imp_weight_min": sel_w.min(),
    }  # fmt: skip
