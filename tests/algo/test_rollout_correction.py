"""Rollout correction (token / sequence TIS and MIS, with and without the decoupled loss)
against a per-token loop written from the module docstring's formulas, with its stats."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from arealite.algo.losses import AGGREGATIONS, ppo_actor_loss
from arealite.algo.rollout_correction import RolloutCorrection, correction_weights
from arealite.config import ConfigError, PPOActorConfig
from arealite.train.actor import rollout_correction
from tests.algo.test_losses import _naive_aggregate, _random_packed, _seqs
from tests.tolerance import close

LEVELS = ["none", "token", "sequence"]


def _naive_corrected(logp, prox, behav, adv, mask, cu, corr: RolloutCorrection, eps=0.2):
    """Per-token PPO loss times the correction factor, 0 where rejected; and the counts."""
    seq_log_w = {}
    for s, (a, b) in enumerate(_seqs(cu)):
        seq_log_w[s] = sum(float(prox[t] - behav[t]) for t in range(a, b) if mask[t])
    owner = [s for s, (a, b) in enumerate(_seqs(cu)) for _ in range(a, b)]
    out, clipped, rejected = [], 0, 0
    for t in range(len(logp)):
        r, A = math.exp(float(logp[t] - prox[t])), float(adv[t])
        pg = max(-A * r, -A * min(max(r, 1 - eps), 1 + eps))
        w, w_seq = math.exp(float(prox[t] - behav[t])), math.exp(seq_log_w[owner[t]])
        factor = {"none": w if corr.decoupled else 1.0, "token": min(w, corr.is_cap),
                  "sequence": min(w_seq, corr.is_cap)}[corr.is_level]  # fmt: skip
        level_w = {"token": w, "sequence": w_seq}
        drop = (corr.behav_cap is not None and w > corr.behav_cap) or (
            corr.rs_level != "none" and level_w[corr.rs_level] > corr.rs_cap
        )
        if mask[t]:
            clipped += corr.is_level != "none" and level_w[corr.is_level] > corr.is_cap
            rejected += corr.rs_level != "none" and level_w[corr.rs_level] > corr.rs_cap
        out.append(0.0 if drop else pg * factor)
    n = max(int(mask.sum()), 1)
    return out, clipped / n, rejected / n


CASES = [
    RolloutCorrection(is_level=i, rs_level=r, decoupled=d, is_cap=2.0, rs_cap=3.0)
    for i, r, d in itertools.product(LEVELS, LEVELS, [False, True])
    if i != "none" or r != "none" or d
] + [RolloutCorrection(decoupled=True, behav_cap=1.5, rs_level="sequence", rs_cap=3.0)]


@pytest.mark.parametrize("corr", CASES, ids=lambda c: f"is={c.is_level}-rs={c.rs_level}-dec={c.decoupled}")
@pytest.mark.parametrize("mode", list(AGGREGATIONS))
def test_rollout_correction_matches_naive(corr, mode):
    logp, prox, behav, adv, mask, cu = _random_packed(4, 8)
    want, clipped_frac, rejected_frac = _naive_corrected(logp, prox, behav, adv, mask, cu, corr)
    loss, stats = ppo_actor_loss(logp, prox, adv, mask, cu, eps_clip=0.2, behav_logp=behav,
                                 aggregate=AGGREGATIONS[mode].reduce, correction=corr)  # fmt: skip
    assert close(loss.item(), _naive_aggregate(want, mask, cu, mode), torch.float64, n=len(logp))
    if corr.is_level != "none":
        assert close(stats["rollout_is_clipped_frac"].item(), clipped_frac, torch.float32)  # fractions are fp32
        assert 0 < clipped_frac < 1  # the random weights straddle the cap, so the branch is exercised
        assert stats["rollout_is_weight_max"] <= corr.is_cap
    if corr.rs_level != "none":
        assert close(stats["rollout_rs_masked_frac"].item(), rejected_frac, torch.float32)
        assert 0 < rejected_frac < 1
    assert all(torch.isfinite(v) for v in stats.values())


def test_weight_stats_are_the_behaviour_vs_proximal_weights():
    cu = torch.tensor([0, 3, 5], dtype=torch.int32)
    prox = torch.zeros(5, dtype=torch.float64)
    behav = torch.tensor([0.0, -math.log(4.0), 0.0, -math.log(1.5), -math.log(1.5)], dtype=torch.float64)
    mask = torch.ones(5, dtype=torch.bool)
    corr = RolloutCorrection(is_level="token", is_cap=2.0, rs_level="sequence", rs_cap=3.0)
    factor, keep, stats = correction_weights(prox, behav, mask, cu, corr)
    assert torch.allclose(factor, torch.tensor([1.0, 2.0, 1.0, 1.5, 1.5], dtype=torch.float64))
    assert keep.tolist() == [False, False, False, True, True]  # W = 4 > 3 rejects sequence 0; W = 2.25 stays
    assert close(stats["rollout_is_clipped_frac"].item(), 0.2, torch.float32)
    assert close(stats["rollout_rs_masked_frac"].item(), 0.6, torch.float32)
    assert close(stats["behav_seq_weight"].item(), (4.0 + 2.25) / 2, torch.float64)
    assert close(stats["behav_seq_weight_max"].item(), 4.0, torch.float64)
    assert close(stats["rollout_is_weight"].item(), 7.0 / 5, torch.float64)


def test_long_sequence_weights_never_overflow():
    n = 4000  # a product of 4000 weights of e^0.5 is e^2000: far past float64
    cu = torch.tensor([0, n], dtype=torch.int32)
    prox, behav = torch.zeros(n), torch.full((n,), -0.5)
    corr = RolloutCorrection(is_level="sequence", is_cap=2.0, rs_level="token", rs_cap=3.0)
    factor, keep, stats = correction_weights(prox, behav, torch.ones(n, dtype=torch.bool), cu, corr)
    assert torch.equal(factor, torch.full((n,), 2.0)) and keep.all()
    assert all(torch.isfinite(v) for v in stats.values())


def test_config_builds_the_correction_and_validates_it():
    assert rollout_correction(PPOActorConfig(path="x")) is None
    cfg = PPOActorConfig(path="x", use_decoupled_loss=True, behav_imp_weight_cap=5.0, rollout_is="sequence")
    assert rollout_correction(cfg) == RolloutCorrection(is_level="sequence", decoupled=True, behav_cap=5.0)
    cfg = PPOActorConfig(path="x", rollout_rs="token", rollout_rs_cap=1.5)
    assert rollout_correction(cfg) == RolloutCorrection(rs_level="token", rs_cap=1.5)
    with pytest.raises(ConfigError, match="recompute_logprob=true"):
        PPOActorConfig(path="x", rollout_is="token", recompute_logprob=False)
    with pytest.raises(ConfigError, match="rollout_is_cap=0.5 must be > 1"):
        PPOActorConfig(path="x", rollout_is="token", rollout_is_cap=0.5)
    with pytest.raises(ConfigError, match="actor.rollout_rs='geo'"):
        PPOActorConfig(path="x", rollout_rs="geo")


def test_lower_bounds_and_trust_region_are_validated_where_set():
    cfg = PPOActorConfig(path="x", rollout_rs="geometric", rollout_rs_cap=1.01, rollout_rs_cap_low=0.99)
    assert rollout_correction(cfg) == RolloutCorrection(rs_level="geometric", rs_cap=1.01, rs_cap_low=0.99)
    with pytest.raises(ConfigError, match="rollout_rs_cap_low=1.5 must be in"):
        PPOActorConfig(path="x", rollout_rs="token", rollout_rs_cap_low=1.5)
    with pytest.raises(ConfigError, match="rollout_is_cap_low=0 must be in"):
        PPOActorConfig(path="x", rollout_is="token", rollout_is_cap_low=0)
    with pytest.raises(ConfigError, match="needs actor.trust_region=tv or kl"):
        PPOActorConfig(path="x", policy_loss="dppo")
    with pytest.raises(ConfigError, match="actor.trust_region='js'"):
        PPOActorConfig(path="x", trust_region="js")
    with pytest.raises(ValueError, match="rs_cap_low=3.0 must be in"):
        RolloutCorrection(rs_level="token", rs_cap=2.0, rs_cap_low=3.0)
