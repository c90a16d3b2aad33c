"""Divergence trust region (DPPO, "Rethinking the Trust Region in LLM Reinforcement Learning",
arXiv 2602.04879): tokens whose probability moved too far from the proximal policy, in
the direction their advantage pushes, leave the loss. PPO bounds the ratio p / p_old, which
is loose for rare tokens and tight for likely ones; DPPO bounds a divergence between the two
policies at the sampled token instead, approximated by the two-outcome (binary) distribution
{the sampled token, everything else}. All tensors are packed [N] (see `losses.py`).

With p = exp(logp) and q = exp(prox_logp) of the sampled token:
- tv: the binary total variation |p - q|. A token with A > 0 leaves the loss when p - q > high;
  one with A <= 0 when q - p > low.
- kl: the binary KL(q || p) = q log(q / p) + (1 - q) log((1 - q) / (1 - p)). A token with A > 0
  leaves when the KL exceeds high and p > q; one with A <= 0 when it exceeds low and p < q.
Only a move in the advantage's direction is masked (as PPO's clip): a token moving back
toward q keeps its gradient. Masked tokens stay in the aggregation's denominator.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

KINDS = ("tv", "kl")


@dataclass(frozen=True)
class TrustRegion:
    """Which divergence bounds the update and its thresholds for each advantage sign."""

    kind: str = "tv"
    low: float = 0.2  # for tokens with A <= 0 (the probability falling)
    high: float = 0.2  # for tokens with A > 0 (the probability rising)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"TrustRegion.kind={self.kind!r}; use one of {KINDS}")
        for name in ("low", "high"):
            if not getattr(self, name) > 0:
                raise ValueError(f"TrustRegion.{name}={getattr(self, name)} must be > 0")


def binary_kl(q: Tensor, p: Tensor) -> Tensor:
    """KL(Bernoulli(q) || Bernoulli(p)) elementwise, both clamped into [eps, 1 - eps] so a
    probability that rounds to 0 or 1 gives a finite value."""
    eps = torch.finfo(p.dtype).eps
    q, p = q.clamp(eps, 1 - eps), p.clamp(eps, 1 - eps)
    return q * (torch.log(q) - torch.log(p)) + (1 - q) * (torch.log1p(-q) - torch.log1p(-p))


def trust_region_keep(
    logp: Tensor, prox_logp: Tensor, advantages: Tensor, mask: Tensor, region: TrustRegion
) -> tuple[Tensor, dict[str, Tensor]]:
    """(keep [N] bool, stats): False where the token left the trust region. Stats: fractions
    of loss tokens masked, in total and per side (`_high`: A > 0, `_low`: A <= 0)."""
    p, q = logp.detach().exp(), prox_logp.detach().exp()
    up = advantages > 0
    if region.kind == "tv":
        out_high, out_low = (p - q) > region.high, (q - p) > region.low
    else:
        kl = binary_kl(q, p)
        out_high, out_low = (kl > region.high) & (p > q), (kl > region.low) & (p < q)
    high, low = mask & up & out_high, mask & ~up & out_low
    n = mask.sum().clamp(min=1)
    stats = {
        "trust_region_masked_frac": ((high | low).sum() / n).detach(),
        "trust_region_masked_frac_high": (high.sum() / n).detach(),
        "trust_region_masked_frac_low": (low.sum() / n).detach(),
    }
    return ~(high | low), stats
