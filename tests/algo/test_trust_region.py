"""DPPO's trust-region mask against a per-token loop from the paper's binary TV / KL, and that
only a move in the advantage's direction is masked."""

from __future__ import annotations

import math

import pytest
import torch

from arealite.algo.trust_region import TrustRegion, binary_kl, trust_region_keep


def _naive_keep(logp, prox, adv, mask, kind, low, high):
    keep = []
    for t in range(len(logp)):
        p, q, A = math.exp(float(logp[t])), math.exp(float(prox[t])), float(adv[t])
        if kind == "tv":
            out = p - q > high if A > 0 else q - p > low
        else:
            kl = q * math.log(q / p) + (1 - q) * math.log((1 - q) / (1 - p))
            out = (kl > high and p > q) if A > 0 else (kl > low and p < q)
        keep.append(not (out and bool(mask[t])))
    return keep


@pytest.mark.parametrize("kind,low,high", [("tv", 0.05, 0.1), ("kl", 0.02, 0.01)])
def test_trust_region_matches_naive(kind, low, high):
    g = torch.Generator().manual_seed(0)
    n = 400
    prox = -torch.rand(n, generator=g, dtype=torch.float64) * 3 - 1e-3
    logp = (prox + 0.5 * torch.randn(n, generator=g, dtype=torch.float64)).clamp(max=-1e-3)
    adv = torch.randn(n, generator=g, dtype=torch.float64)
    mask = torch.rand(n, generator=g) < 0.8
    keep, stats = trust_region_keep(logp, prox, adv, mask, TrustRegion(kind, low=low, high=high))
    want = _naive_keep(logp, prox, adv, mask, kind, low, high)
    assert keep.tolist() == want
    # both sides are exercised, and a token moving against its advantage is never masked
    assert 0 < stats["trust_region_masked_frac_high"] < 1 and 0 < stats["trust_region_masked_frac_low"] < 1
    against = ((adv > 0) & (logp < prox)) | ((adv <= 0) & (logp > prox))
    far = (logp.exp() - prox.exp()).abs() > max(low, high)
    assert (against & far & mask).any() and keep[against].all()


def test_binary_kl_is_finite_at_the_edges():
    q = torch.tensor([0.0, 1.0, 0.5, 0.3], dtype=torch.float64)
    p = torch.tensor([1.0, 0.0, 0.5, 0.6], dtype=torch.float64)
    kl = binary_kl(q, p)
    assert torch.isfinite(kl).all() and kl[2] == 0 and kl[3] > 0


def test_bad_trust_region_is_refused():
    with pytest.raises(ValueError, match="TrustRegion.kind='js'"):
        TrustRegion("js")
    with pytest.raises(ValueError, match="TrustRegion.low=0"):
        TrustRegion("tv", low=0)


def test_kl_region_measures_the_kl_from_the_proximal_policy():
    # KL(q || p) with q the proximal probability, as the paper's; KL(p || q) differs: for the pair
    # (0.9, 0.5) one direction is 0.368, the other 0.511, and a bound of 0.45 between them keeps
    # the token under one and masks it under the other
    def kl(a, b):
        return a * math.log(a / b) + (1 - a) * math.log((1 - a) / (1 - b))

    q = torch.tensor([0.9, 0.5], dtype=torch.float64)  # proximal
    p = torch.tensor([0.5, 0.9], dtype=torch.float64)  # current: fell on token 0, rose on token 1
    adv = torch.tensor([-1.0, 1.0], dtype=torch.float64)  # each moved in its advantage's direction
    bound = 0.45
    assert kl(0.9, 0.5) < bound < kl(0.5, 0.9)
    keep, _ = trust_region_keep(p.log(), q.log(), adv, torch.ones(2, dtype=torch.bool),
                                TrustRegion("kl", low=bound, high=bound))  # fmt: skip
    assert keep.tolist() == [True, False]  # KL(q||p): 0.368 for token 0 (kept), 0.511 for token 1 (masked)
