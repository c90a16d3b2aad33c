"""Rollout correction (token / sequence TIS and rejection sampling, with and without the decoupled loss)
against a per-token loop written from the module docstring's formulas, with its stats."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
import torch
import yaml

from arealite.algo.losses import AGGREGATIONS, ppo_actor_loss
from arealite.algo.rollout_correction import RolloutCorrection, correction_weights
from arealite.config import ConfigError, GRPOConfig, PPOActorConfig, load_config
from arealite.train.actor import rollout_correction
from tests.algo.test_losses import _naive_aggregate, _random_packed, _seqs
from tests.tolerance import close

LEVELS = ["none", "token", "sequence"]


def _naive_corrected(logp, prox, behav, adv, mask, cu, corr: RolloutCorrection, eps=0.2):
    """Per-token PPO loss times the correction factor, 0 where rejected; and the fractions of
    loss tokens truncated and rejected, each as (both sides, above, below)."""
    seq_log_w, n_tok = {}, {}
    for s, (a, b) in enumerate(_seqs(cu)):
        seq_log_w[s] = sum(float(prox[t] - behav[t]) for t in range(a, b) if mask[t])
        n_tok[s] = sum(1 for t in range(a, b) if mask[t])
    owner = [s for s, (a, b) in enumerate(_seqs(cu)) for _ in range(a, b)]
    out, clipped, rejected = [], [0, 0], [0, 0]
    for t in range(len(logp)):
        r, A = math.exp(float(logp[t] - prox[t])), float(adv[t])
        pg = max(-A * r, -A * min(max(r, 1 - eps), 1 + eps))
        s = owner[t]
        level_w = {"token": math.exp(float(prox[t] - behav[t])), "sequence": math.exp(seq_log_w[s]),
                   "geometric": math.exp(seq_log_w[s] / max(n_tok[s], 1))}  # fmt: skip
        if corr.is_level == "none":
            factor = level_w["token"] if corr.decoupled else 1.0
            is_out = (False, False)
        else:
            w, low = level_w[corr.is_level], corr.is_cap_low or 0.0
            factor = min(max(w, low), corr.is_cap)
            is_out = (w > corr.is_cap, w < low)
        rs_out = (False, False)
        if corr.rs_level != "none":
            w = level_w[corr.rs_level]
            rs_out = (w > corr.rs_cap, corr.rs_cap_low is not None and w < corr.rs_cap_low)
        capped = corr.behav_cap is not None and level_w["token"] > corr.behav_cap
        if mask[t]:
            clipped = [c + o for c, o in zip(clipped, is_out)]
            rejected = [c + o for c, o in zip(rejected, rs_out)]
        out.append(0.0 if (capped or any(rs_out)) else pg * factor)
    n = max(int(mask.sum()), 1)
    return out, [sum(clipped) / n, *(c / n for c in clipped)], [sum(rejected) / n, *(c / n for c in rejected)]


CASES = [
    RolloutCorrection(is_level=i, rs_level=r, decoupled=d, is_cap=2.0, rs_cap=3.0)
    for i, r, d in itertools.product(LEVELS, LEVELS, [False, True])
    if i != "none" or r != "none" or d
] + [
    RolloutCorrection(decoupled=True, behav_cap=1.5, rs_level="sequence", rs_cap=3.0),
    RolloutCorrection(is_level="token", is_cap=1.5, is_cap_low=0.7),  # two-sided TIS
    RolloutCorrection(is_level="sequence", is_cap=2.0, is_cap_low=0.5),
    RolloutCorrection(rs_level="token", rs_cap=1.5, rs_cap_low=0.6, decoupled=True),  # IcePop
    RolloutCorrection(rs_level="sequence", rs_cap=3.0, rs_cap_low=0.5),
    RolloutCorrection(rs_level="geometric", rs_cap=1.38, rs_cap_low=0.6),
    RolloutCorrection(rs_level="geometric", rs_cap=1.38, rs_cap_low=0.6, decoupled=True),
]


def _case_id(c: RolloutCorrection) -> str:
    low = f"-low={c.is_cap_low or c.rs_cap_low}" if c.is_cap_low or c.rs_cap_low else ""
    return f"is={c.is_level}-rs={c.rs_level}-dec={c.decoupled}{low}"


@pytest.mark.parametrize("corr", CASES, ids=_case_id)
@pytest.mark.parametrize("mode", list(AGGREGATIONS))
def test_rollout_correction_matches_naive(corr, mode):
    logp, prox, behav, adv, mask, cu = _random_packed(4, 8)
    want, clipped_frac, rejected_frac = _naive_corrected(logp, prox, behav, adv, mask, cu, corr)
    loss, stats = ppo_actor_loss(logp, prox, adv, mask, cu, eps_clip=0.2, behav_logp=behav,
                                 aggregate=AGGREGATIONS[mode].reduce, correction=corr)  # fmt: skip
    assert close(loss.item(), _naive_aggregate(want, mask, cu, mode), torch.float64, n=len(logp))
    sides = (("rollout_is_clipped_frac", corr.is_level, clipped_frac, corr.is_cap_low),
             ("rollout_rs_masked_frac", corr.rs_level, rejected_frac, corr.rs_cap_low))  # fmt: skip
    for name, level, fracs, low in sides:
        if level == "none":
            continue
        for suffix, want_frac in zip(("", "_high", "_low"), fracs):
            assert close(stats[name + suffix].item(), want_frac, torch.float32), name + suffix  # fp32 fractions
        assert 0 < fracs[0] < 1  # the random weights straddle the bounds, so the branch is exercised
        assert low is None or 0 < fracs[2] < 1  # and the lower bound's, where there is one
    if corr.is_level != "none":
        assert stats["rollout_is_weight_max"] <= corr.is_cap
    assert all(torch.isfinite(v) for v in stats.values())


def _naive_trl(logp, prox, behav, adv, mask, cu, mode, clip_max, clip_min, eps=0.2):
    """TRL GRPOTrainer's `vllm_importance_sampling_mode` (TRL 1.16), from its definition: the ratio
    exp(old - sampling) per token, or its product over a sequence's completion tokens;
    `*_truncate` clamps it into [clip_min, clip_max], `*_mask` sets it to 0 outside and leaves it
    as is inside; each token's loss times it, and the mean over all completion tokens as before."""
    level, kind = mode.split("_")
    lo, hi = (clip_min if clip_min is not None else 0.0), clip_max
    seq_w = [math.exp(sum(float(prox[t] - behav[t]) for t in range(a, b) if mask[t])) for a, b in _seqs(cu)]
    owner = [s for s, (a, b) in enumerate(_seqs(cu)) for _ in range(a, b)]
    out, outside = [], 0
    for t in range(len(logp)):
        r, A = math.exp(float(logp[t] - prox[t])), float(adv[t])
        pg = max(-A * r, -A * min(max(r, 1 - eps), 1 + eps))
        w = math.exp(float(prox[t] - behav[t])) if level == "token" else seq_w[owner[t]]
        outside += bool(mask[t]) and not lo <= w <= hi
        f = min(max(w, lo), hi) if kind == "truncate" else (w if lo <= w <= hi else 0.0)
        out.append(pg * f)
    return out, outside


@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
@pytest.mark.parametrize("clip_min", [None, 0.5])
def test_trl_importance_sampling_modes_are_is_with_rejection_at_the_same_bounds(mode, clip_min):
    # docs/algorithms.md's mapping: *_truncate is rollout_is; *_mask is rollout_is and rollout_rs
    # at the same level and bounds (rollout_rs alone would leave the kept tokens unweighted)
    logp, prox, behav, adv, mask, cu = _random_packed(4, 8)
    clip_max = 3.0  # TRL's vllm_importance_sampling_clip_max default
    level, kind = mode.split("_")
    rs = dict(rs_level=level, rs_cap=clip_max, rs_cap_low=clip_min) if kind == "mask" else {}
    corr = RolloutCorrection(is_level=level, is_cap=clip_max, is_cap_low=clip_min, **rs)
    want, outside = _naive_trl(logp, prox, behav, adv, mask, cu, mode, clip_max, clip_min)
    loss, _ = ppo_actor_loss(logp, prox, adv, mask, cu, eps_clip=0.2, behav_logp=behav, correction=corr)
    assert close(loss.item(), _naive_aggregate(want, mask, cu, "token-mean"), torch.float64, n=len(logp))
    assert 0 < outside < int(mask.sum())  # some weights leave the bounds: truncation and mask act
    if kind == "mask":  # and dropping them is not the same as truncating them
        loss_truncated, _ = ppo_actor_loss(logp, prox, adv, mask, cu, eps_clip=0.2, behav_logp=behav,
                                           correction=RolloutCorrection(is_level=level, is_cap=clip_max,
                                                                        is_cap_low=clip_min))  # fmt: skip
        assert not close(loss_truncated.item(), loss.item(), torch.float64, n=len(logp), k=1000)


def test_the_trl_arm_of_the_corrections_matrix_is_trls_default():
    # configs/corrections.yaml's trl_sequence_mask, loaded as benchmarks/variants.py launches it
    root = Path(__file__).resolve().parents[2]
    spec = yaml.safe_load((root / "configs" / "corrections.yaml").read_text())
    arm = spec["variants"]["trl_sequence_mask"]
    cfg = load_config(["--config", str(root / arm["base"]), *spec["common"], *arm["overrides"]], GRPOConfig)
    assert rollout_correction(cfg.actor) == RolloutCorrection(is_level="sequence", is_cap=3.0, rs_level="sequence",
                                                              rs_cap=3.0)  # fmt: skip


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
