"""Rollout correction: per-token weights and masks that correct a loss for the gap between the
behaviour policy that sampled the tokens (`behav_logp`, the server's logprobs) and the
proximal policy the PPO ratio is taken to (`prox_logp`, the trainer's logprobs at the
update's start). All tensors are packed [N] with `cu_seqlens` [B+1] (see `losses.py`).

The behaviour weight of token t is w_t = exp(prox_logp_t - behav_logp_t); a sequence's is the
product over its loss tokens, W_s = exp(sum_t log w_t), and its geometric mean the exp of the
mean over its loss tokens, G_s = exp(mean_t log w_t). Then, as `RolloutCorrection` says:
- importance sampling (`is_level`): every loss token is multiplied by a detached factor:
  none: 1 (or w_t untruncated with `decoupled`, the decoupled PPO loss of Hilton et al. 2021);
  token: clip(w_t, is_cap_low, is_cap) (truncated IS, TIS); sequence: clip(W_s, ...) on all of
  s's tokens. Without `is_cap_low` the weight is truncated from above only.
- rejection sampling (`rs_level`): a mask, no weight: token: tokens with w_t > rs_cap (or
  < rs_cap_low) leave the loss; sequence: every token of a sequence whose W_s is out of those
  bounds leaves it; geometric: the same with G_s, which does not grow with length. `decoupled`
  with token rejection on both sides is IcePop (Ling team, Ring-1T, 2025). `behav_cap` is the
  decoupled loss's own token rejection (tokens with w_t > behav_cap), kept under its old name.
Dropped tokens stay in the denominator, so rejection never rescales the rest (verl's do not).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from arealite.algo.segments import segment_ids, segment_sum

Stats = dict[str, Tensor]

LEVELS = ("none", "token", "sequence")
RS_LEVELS = (*LEVELS, "geometric")


@dataclass(frozen=True)
class RolloutCorrection:
    """Which correction `correction_weights` applies; fields as in the module docstring."""

    is_level: str = "none"
    is_cap: float = 2.0
    rs_level: str = "none"
    rs_cap: float = 2.0
    decoupled: bool = False
    behav_cap: float | None = None
    is_cap_low: float | None = None
    rs_cap_low: float | None = None

    def __post_init__(self) -> None:
        for name, allowed in (("is_level", LEVELS), ("rs_level", RS_LEVELS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"RolloutCorrection.{name}={getattr(self, name)!r}; use one of {allowed}")
        for name in ("is_cap", "rs_cap"):
            if not getattr(self, name) > 0:
                raise ValueError(f"RolloutCorrection.{name}={getattr(self, name)} must be > 0")
        for name in ("is_cap", "rs_cap"):
            low = getattr(self, f"{name}_low")
            if low is not None and not 0 < low < getattr(self, name):
                raise ValueError(f"RolloutCorrection.{name}_low={low} must be in (0, {name}={getattr(self, name)})")


def correction_weights(
    prox_logp: Tensor, behav_logp: Tensor, mask: Tensor, cu_seqlens: Tensor, corr: RolloutCorrection
) -> tuple[Tensor, Tensor, Stats]:
    """(factor [N] detached, keep [N] bool, stats) for `corr`; multiply the per-token loss by
    factor where keep, zero elsewhere. Stats: the raw weights' mean / max over loss tokens
    (and over sequences for a sequence level), the applied IS factor's mean / max, the
    fractions of loss tokens whose factor was truncated and that were masked, in total and
    per side (`_high`: above the cap, `_low`: below the lower bound)."""
    mask = mask.bool()
    log_w = torch.where(mask, (prox_logp - behav_logp).detach(), 0.0)  # [N]
    seq = segment_ids(cu_seqlens).to(log_w.device)
    log_w_seq = segment_sum(log_w, cu_seqlens)  # [B] log of the product over loss tokens
    n_seq = segment_sum(mask.to(log_w.dtype), cu_seqlens).clamp(min=1.0)  # [B]
    level_logs = {"token": log_w, "sequence": log_w_seq[seq], "geometric": (log_w_seq / n_seq)[seq]}
    stats: Stats = {}
    keep = mask.clone()
    if corr.is_level == "none":
        factor = log_w.exp() if corr.decoupled else torch.ones_like(log_w)
    else:
        level_log = level_logs[corr.is_level]
        high, low = _outside(level_log, corr.is_cap, corr.is_cap_low)
        log_low = -math.inf if corr.is_cap_low is None else math.log(corr.is_cap_low)
        factor = level_log.clamp(min=log_low, max=math.log(corr.is_cap)).exp()  # clip(w) without overflowing exp(w)
        stats["rollout_is_weight"] = _mean(factor, mask)
        stats["rollout_is_weight_max"] = _max(factor, mask)
        stats.update(_sided("rollout_is_clipped_frac", high, low, mask))
    if corr.behav_cap is not None:
        capped = mask & (log_w > math.log(corr.behav_cap))
        keep &= ~capped
        stats["behav_imp_weight_capped_frac"] = _frac(capped.float(), mask)
    if corr.rs_level != "none":
        high, low = _outside(level_logs[corr.rs_level], corr.rs_cap, corr.rs_cap_low)
        keep &= ~(high | low)
        stats.update(_sided("rollout_rs_masked_frac", high, low, mask))
    if corr.is_level == "sequence" or corr.rs_level in ("sequence", "geometric"):
        has = segment_sum(mask.float(), cu_seqlens) > 0
        w_seq = log_w_seq[has].clamp(max=80.0).exp()  # e^80 bounds the stat; the loss never exponentiates it
        stats["behav_seq_weight"] = w_seq.mean() if w_seq.numel() else log_w.new_ones(())
        stats["behav_seq_weight_max"] = w_seq.max() if w_seq.numel() else log_w.new_ones(())
    stats["rollout_kept_frac"] = _frac(keep.float(), mask)
    return factor, keep, {k: v.detach() for k, v in stats.items()}


def _outside(level_log: Tensor, cap: float, cap_low: float | None) -> tuple[Tensor, Tensor]:
    """(above cap, below cap_low) as bool [N]; nothing is below a missing lower bound."""
    high = level_log > math.log(cap)
    low = level_log < math.log(cap_low) if cap_low is not None else torch.zeros_like(high)
    return high, low


def _sided(name: str, high: Tensor, low: Tensor, mask: Tensor) -> Stats:
    """Fractions of the loss tokens above, below, and outside the bounds."""
    return {
        name: _frac((high | low).float(), mask),
        f"{name}_high": _frac(high.float(), mask),
        f"{name}_low": _frac(low.float(), mask),
    }


def _frac(hit: Tensor, mask: Tensor) -> Tensor:
    """Fraction of the loss tokens (mask) where `hit` is 1."""
    return (hit * mask).sum() / mask.sum().clamp(min=1)


def _mean(x: Tensor, mask: Tensor) -> Tensor:
    sel = x[mask]
    return sel.mean() if sel.numel() else x.new_ones(())


def _max(x: Tensor, mask: Tensor) -> Tensor:
    sel = x[mask]
    return sel.max() if sel.numel() else x.new_ones(())
