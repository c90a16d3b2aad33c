"""PPO-family losses as pure functions of packed token tensors; each returns `(loss, stats)`.

Tensors are packed `[N]` with `cu_seqlens` int32 [B+1] and `loss_mask` [N]; log-probabilities
are token-aligned (`logp[t] = log p(token t | tokens < t)`). Variants are functions picked
from the registries (`OBJECTIVES`, `AGGREGATIONS`, `KL_ESTIMATORS`, `LOG_RATIOS`), not flags:
what each computes, with its paper, is in docs/algorithms.md. Stats are detached scalars;
keys ending in `_max`/`_min` are extrema, the rest means.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from arealite.algo.rollout_correction import RolloutCorrection, correction_weights
from arealite.algo.segments import segment_ids, segment_sum
from arealite.algo.trust_region import TrustRegion, trust_region_keep

Tensor = torch.Tensor
Stats = dict[str, Tensor]
__all__ = ["segment_ids", "segment_sum"]  # re-exported: the packed-sequence helpers the losses are built on


# ---- aggregation: [N] values -> scalar, with the weight that makes micro-batch sums exact ----


def token_mean(x: Tensor, mask: Tensor, cu_seqlens: Tensor) -> Tensor:
    """Mean over all loss tokens of the batch."""
    m = mask.to(x.dtype)
    return (x * m).sum() / m.sum().clamp(min=1.0)


def seq_mean_token_mean(x: Tensor, mask: Tensor, cu_seqlens: Tensor) -> Tensor:
    """Mean over sequences (with >= 1 loss token) of each sequence's token mean."""
    m = mask.to(x.dtype)
    count = segment_sum(m, cu_seqlens)  # [B]
    per_seq = segment_sum(x * m, cu_seqlens) / count.clamp(min=1.0)
    has = (count > 0).to(x.dtype)
    return (per_seq * has).sum() / has.sum().clamp(min=1.0)


def seq_mean_token_sum(x: Tensor, mask: Tensor, cu_seqlens: Tensor) -> Tensor:
    """Mean over sequences of each sequence's token sum (Dr.GRPO: no length normalization)."""
    m = mask.to(x.dtype)
    count = segment_sum(m, cu_seqlens)
    has = (count > 0).to(x.dtype)
    return (segment_sum(x * m, cu_seqlens) * has).sum() / has.sum().clamp(min=1.0)


def count_tokens(mask: Tensor, cu_seqlens: Tensor) -> float:
    return float(mask.sum())


def count_sequences(mask: Tensor, cu_seqlens: Tensor) -> float:
    return float((segment_sum(mask.float(), cu_seqlens) > 0).sum())


@dataclass(frozen=True)
class Aggregation:
    """How token values become one loss, and the weight of a micro-batch in the global mean.

    Splitting a batch into micro-batches (and ranks) and summing `reduce(mb) * weight(mb) /
    sum of weights` gives exactly `reduce(batch)`.
    """

    reduce: Callable[[Tensor, Tensor, Tensor], Tensor]
    weight: Callable[[Tensor, Tensor], float]


AGGREGATIONS: dict[str, Aggregation] = {
    "token-mean": Aggregation(token_mean, count_tokens),
    "seq-mean-token-mean": Aggregation(seq_mean_token_mean, count_sequences),
    "seq-mean-token-sum": Aggregation(seq_mean_token_sum, count_sequences),
}


# ---- KL estimators: per-token estimate of KL(pi || ref) from samples of pi ----


def kl_k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    return logp - ref_logp


def kl_k2(logp: Tensor, ref_logp: Tensor) -> Tensor:
    return 0.5 * (logp - ref_logp) ** 2


def kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    log_r = ref_logp - logp
    return torch.exp(log_r) - log_r - 1.0


KL_ESTIMATORS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}


# ---- log importance ratios to the proximal policy ----


def token_log_ratio(logp: Tensor, prox_logp: Tensor, mask: Tensor, cu_seqlens: Tensor) -> Tensor:
    """PPO's per-token log ratio [N]."""
    return logp - prox_logp


def sequence_log_ratio(logp: Tensor, prox_logp: Tensor, mask: Tensor, cu_seqlens: Tensor) -> Tensor:
    """GSPO: each token carries its sequence's mean log ratio over loss tokens [N].

    Gradients flow to every token of the sequence through the mean (GSPO's sequence
    objective, not GSPO-token's stop-gradient variant). GSPO averages over sequences:
    pair it with `seq_mean_token_mean` (token-mean would weight sequences by length).
    """
    m = mask.to(logp.dtype)
    per_seq = segment_sum((logp - prox_logp) * m, cu_seqlens) / segment_sum(m, cu_seqlens).clamp(min=1.0)
    return per_seq[segment_ids(cu_seqlens).to(logp.device)]


LOG_RATIOS: dict[str, Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]] = {
    "token": token_log_ratio,
    "sequence": sequence_log_ratio,
}


def _masked_stats(prefix: str, x: Tensor, mask: Tensor) -> Stats:
    sel = x.detach()[mask]
    if sel.numel() == 0:
        sel = x.new_zeros(1)
    return {f"{prefix}": sel.float().mean(), f"{prefix}_max": sel.float().max(), f"{prefix}_min": sel.float().min()}


# ---- per-token policy objectives: (ratio, logp, advantages) -> (loss [N], clipped [N] bool | None) ----
# ratio [N] = exp(log ratio to the proximal policy), with gradient; logp [N] the current log-probs.


def ppo_clip_objective(
    ratio: Tensor, logp: Tensor, advantages: Tensor, eps_clip: float = 0.2, eps_clip_higher: float | None = None
) -> tuple[Tensor, Tensor]:
    """PPO's clipped surrogate, -min(r*A, clip(r, 1-eps, 1+eps_higher)*A); no gradient where clipped."""
    hi = eps_clip if eps_clip_higher is None else eps_clip_higher
    pg1 = -advantages * ratio
    pg2 = -advantages * torch.clamp(ratio, 1.0 - eps_clip, 1.0 + hi)
    return torch.maximum(pg1, pg2), pg2 > pg1


def cispo_objective(
    ratio: Tensor, logp: Tensor, advantages: Tensor, eps_clip: float = 0.2, eps_clip_higher: float | None = None
) -> tuple[Tensor, Tensor]:
    """CISPO (MiniMax-M1, Chen et al. 2025, eq. 4): -sg(clip(r, 1-eps, 1+eps_higher)) * A * logp.

    The importance weight is truncated and detached instead of the update being clipped, so
    every token keeps a gradient (-clip(r) * A * grad logp). The paper bounds r only from
    above: eps_clip >= 1 does that (r > 0 always).
    """
    hi = eps_clip if eps_clip_higher is None else eps_clip_higher
    r = ratio.detach()
    weight = torch.clamp(r, 1.0 - eps_clip, 1.0 + hi)
    return -advantages * weight * logp, weight != r


def sapo_objective(
    ratio: Tensor, logp: Tensor, advantages: Tensor, tau_pos: float = 1.0, tau_neg: float = 1.05
) -> tuple[Tensor, None]:
    """SAPO (Qwen, Gao et al. 2025): -(4/tau) * sigmoid(tau * (r - 1)) * A, tau = tau_pos where
    A > 0 else tau_neg. A soft trust region: the gradient weight 4*s*(1-s) (s the sigmoid) is
    1 at r = 1 and decays smoothly away from it, faster for negative advantages."""
    tau = torch.where(advantages > 0, ratio.new_tensor(tau_pos), ratio.new_tensor(tau_neg))  # in ratio's dtype
    return -advantages * torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau), None


def dppo_objective(ratio: Tensor, logp: Tensor, advantages: Tensor) -> tuple[Tensor, None]:
    """DPPO's surrogate (arXiv 2602.04879): -r * A, unclipped; its trust region is the divergence
    mask of `arealite.algo.trust_region`, which `ppo_actor_loss` applies (`trust_region`).
    The gradient -r A grad logp equals verl's and prime-rl's -sg(r) A logp form."""
    return -advantages * ratio, None


Objective = Callable[[Tensor, Tensor, Tensor], tuple[Tensor, Tensor | None]]
OBJECTIVES: dict[str, Callable[..., tuple[Tensor, Tensor | None]]] = {
    "ppo": ppo_clip_objective,
    "cispo": cispo_objective,
    "sapo": sapo_objective,
    "dppo": dppo_objective,
}


def ppo_actor_loss(
    logp: Tensor,
    prox_logp: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    cu_seqlens: Tensor,
    eps_clip: float,
    eps_clip_higher: float | None = None,
    c_clip: float | None = None,
    behav_logp: Tensor | None = None,
    behav_imp_weight_cap: float | None = None,
    aggregate: Callable[[Tensor, Tensor, Tensor], Tensor] = token_mean,
    log_ratio: Callable[[Tensor, Tensor, Tensor, Tensor], Tensor] = token_log_ratio,
    objective: Objective | None = None,
    correction: RolloutCorrection | None = None,
    trust_region: TrustRegion | None = None,
) -> tuple[Tensor, Stats]:
    """Policy-gradient loss; all tensors [N]. Returns (scalar loss, stats).

    `objective` (default: PPO's clip with eps_clip / eps_clip_higher) gives each token's loss
    from the ratio to `prox_logp`; `c_clip` adds the dual clip (PPO only).
    With `behav_logp` the tokens are reweighted and masked by `correction`
    (`arealite.algo.rollout_correction`); without one, by the decoupled PPO loss: each token
    weighted by `exp(prox_logp - behav_logp)`, tokens whose weight exceeds
    `behav_imp_weight_cap` dropped (they still count in the aggregation's denominator, so
    dropping never rescales the other tokens). `trust_region` drops the tokens whose
    probability left the divergence trust region around `prox_logp` (`algo.trust_region`).
    """
    mask = loss_mask.bool()
    ratio = torch.exp(log_ratio(logp, prox_logp, mask, cu_seqlens))
    if objective is None:
        objective = partial(ppo_clip_objective, eps_clip=eps_clip, eps_clip_higher=eps_clip_higher)
    pg, clipped = objective(ratio, logp, advantages)
    stats: Stats = {}
    if c_clip is not None:
        # Dual clip bounds the loss of negative-advantage tokens whose ratio ran far up.
        pg3 = -advantages * c_clip
        dual = (advantages < 0) & (pg3 < pg)
        pg = torch.where(advantages < 0, torch.minimum(pg, pg3), pg)
        stats["dual_clip_frac"] = token_mean(dual.float(), mask, cu_seqlens).detach()
    if behav_logp is not None:
        if correction is None:
            correction = RolloutCorrection(decoupled=True, behav_cap=behav_imp_weight_cap)
        factor, keep, correction_stats = correction_weights(prox_logp, behav_logp, mask, cu_seqlens, correction)
        pg = torch.where(keep, pg * factor, torch.zeros_like(pg))
        stats.update(correction_stats)
        stats.update(_masked_stats("behav_imp_weight", torch.exp(prox_logp - behav_logp), mask))
    if trust_region is not None:
        inside, region_stats = trust_region_keep(logp, prox_logp, advantages, mask, trust_region)
        pg = torch.where(inside, pg, torch.zeros_like(pg))
        stats.update(region_stats)
    loss = aggregate(pg, mask, cu_seqlens)
    stats["pg_loss"] = loss.detach()
    if clipped is not None:
        stats["clip_frac"] = token_mean(clipped.float(), mask, cu_seqlens).detach()
    stats.update(_masked_stats("importance_ratio", ratio, mask))
    return loss, stats


def kl_loss(
    logp: Tensor,
    ref_logp: Tensor,
    loss_mask: Tensor,
    cu_seqlens: Tensor,
    estimator: Callable[[Tensor, Tensor], Tensor] = kl_k3,
    aggregate: Callable[[Tensor, Tensor, Tensor], Tensor] = token_mean,
) -> tuple[Tensor, Stats]:
    """KL(pi || ref) as a loss term (GRPO's placement); multiply by the KL coefficient outside."""
    loss = aggregate(estimator(logp, ref_logp), loss_mask.bool(), cu_seqlens)
    return loss, {"kl": loss.detach()}


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of softmax(logits) along the last dimension: [..., V] -> [...]."""
    logz = torch.logsumexp(logits, dim=-1)
    p = torch.softmax(logits, dim=-1)
    return logz - (p * logits).sum(-1)


def clipped_value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    loss_mask: Tensor,
    cu_seqlens: Tensor,
    value_eps_clip: float | None,
    aggregate: Callable[[Tensor, Tensor, Tensor], Tensor] = token_mean,
) -> tuple[Tensor, Stats]:
    """PPO value loss 0.5 * max((v - R)^2, (v_clip - R)^2), v_clip = old + clip(v - old, ±eps)."""
    mask = loss_mask.bool()
    err = (values - returns) ** 2
    if value_eps_clip is None:
        per_token = 0.5 * err
        clip_frac = torch.zeros((), device=values.device)
    else:
        v_clip = old_values + torch.clamp(values - old_values, -value_eps_clip, value_eps_clip)
        err_clip = (v_clip - returns) ** 2
        per_token = 0.5 * torch.maximum(err, err_clip)
        clip_frac = token_mean((err_clip > err).float(), mask, cu_seqlens)
    loss = aggregate(per_token, mask, cu_seqlens)
    return loss, {"value_loss": loss.detach(), "value_clip_frac": clip_frac.detach()}
