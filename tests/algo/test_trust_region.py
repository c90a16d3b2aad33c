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
