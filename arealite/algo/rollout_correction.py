"""Rollout correction: per-token weights and masks that correct a loss for the gap between the
behaviour policy that sampled the tokens (`behav_logp`, the server's logprobs) and the
proximal policy the PPO ratio is taken to (`prox_logp`, the trainer's logprobs at the
update's start). All tensors are packed [N] with `cu_seqlens` [B+1] (see `losses.py`).

The behaviour weight of token t is w_t = exp(prox_logp_t - behav_logp_t); a sequence's is the
product over its loss tokens, W_s = exp(sum_t log w_t). Then, as `RolloutCorrection` says:
- importance sampling (`is_level`): every loss token is multiplied by a detached factor:
  none: 1 (or w_t untruncated with `decoupled`, the decoupled PPO loss of Hilton et al. 2021);
  token: min(w_t, is_cap) (truncated IS, TIS); sequence: min(W_s, is_cap) on all of s's tokens.
- rejection (`rs_level`, masked IS / MIS): token: tokens with w_t > rs_cap leave the loss;
  sequence: every token of a sequence with W_s > rs_cap leaves it. `behav_cap` is the
  decoupled loss's own token rejection (tokens with w_t > behav_cap), kept under its old name.
Dropped tokens stay in the aggregation's denominator, so rejection never rescales the rest.

Only the upper tail is truncated or rejected, as in the TIS / MIS write-ups (Yao et al. 2025;
Liu et al. 2025); a weight far below 1 already contributes little.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from arealite.algo.segments import segment_ids, segment_sum

Stats = dict[str, Tensor]

LEVELS = ("none", "token", "sequence")


@dataclass(frozen=True)
class RolloutCorrection:
    """Which correction `correction_weights` applies; fields as in the module docstring."""

    is_level: str = "none"
    is_cap: float = 2.0
    rs_level: str = "none"
    rs_cap: float = 2.0
    decoupled: bool = False
    behav_cap: float | None = None

    def __post_init__(self) -> None:
        for name in ("is_level", "rs_level"):
            if getattr(self, name) not in LEVELS:
                raise ValueError(f"RolloutCorrection.{name}={getattr(self, name)!r}; use one of {LEVELS}")
        for name in ("is_cap", "rs_cap"):
            if not getattr(self, name) > 0:
                raise ValueError(f"RolloutCorrection.{name}={getattr(self, name)} must be > 0")


def correction_weights(
    prox_logp: Tensor, behav_logp: Tensor, mask: Tensor, cu_seqlens: Tensor, corr: RolloutCorrection
) -> tuple[Tensor, Tensor, Stats]:
    """(factor [N] detached, keep [N] bool, stats) for `corr`; multiply the per-token loss by
    factor where keep, zero elsewhere. Stats: the raw weights' mean / max over loss tokens
    (and over sequences for a sequence level), the applied IS factor's mean / max, the
    fraction of loss tokens whose factor was truncated, and the fractions masked."""
    mask = mask.bool()
    log_w = torch.where(mask, (prox_logp - behav_logp).detach(), 0.0)  # [N]
    seq = segment_ids(cu_seqlens).to(log_w.device)
    log_w_seq = segment_sum(log_w, cu_seqlens)  # [B] log of the product over loss tokens
    stats: Stats = {}
    keep = mask.clone()
    if corr.is_level == "none":
        factor = log_w.exp() if corr.decoupled else torch.ones_like(log_w)
    else:
        level_log = log_w if corr.is_level == "token" else log_w_seq[seq]
        log_cap = math.log(corr.is_cap)
        factor = level_log.clamp(max=log_cap).exp()  # min(w, C) without overflowing exp(w)
        stats["rollout_is_weight"] = _mean(factor, mask)
        stats["rollout_is_weight_max"] = _max(factor, mask)
        stats["rollout_is_clipped_frac"] = _frac((level_log > log_cap).float(), mask)
    if corr.behav_cap is not None:
        capped = mask & (log_w > math.log(corr.behav_cap))
        keep &= ~capped
        stats["behav_imp_weight_capped_frac"] = _frac(capped.float(), mask)
    if corr.rs_level != "none":
        level_log = log_w if corr.rs_level == "token" else log_w_seq[seq]
        rejected = mask & (level_log > math.log(corr.rs_cap))
        keep &= ~rejected
        stats["rollout_rs_masked_frac"] = _frac(rejected.float(), mask)
    if "sequence" in (corr.is_level, corr.rs_level):
        has = segment_sum(mask.float(), cu_seqlens) > 0
        w_seq = log_w_seq[has].clamp(max=80.0).exp()  # e^80 bounds the stat; the loss never exponentiates it
        stats["behav_seq_weight"] = w_seq.mean() if w_seq.numel() else log_w.new_ones(())
        stats["behav_seq_weight_max"] = w_seq.max() if w_seq.numel() else log_w.new_ones(())
    stats["rollout_kept_frac"] = _frac(keep.float(), mask)
    return factor, keep, {k: v.detach() for k, v in stats.items()}


def _frac(hit: Tensor, mask: Tensor) -> Tensor:
    """Fraction of the loss tokens (mask) where `hit` is 1."""
    return (hit * mask).sum() / mask.sum().clamp(min=1)


def _mean(x: Tensor, mask: Tensor) -> Tensor:
    sel = x[mask]
    return sel.mean() if sel.numel() else x.new_ones(())


def _max(x: Tensor, mask: Tensor) -> Tensor:
    sel = x[mask]
    return sel.max() if sel.numel() else x.new_ones(())
