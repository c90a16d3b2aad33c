"""Every objective, ratio level, rollout correction and trust region, set where a user sets it
(`PPOActorConfig`), reaches the loss: `actor_loss` on one packed micro-batch whose behaviour,
proximal and current log-probs all differ must equal a per-token loop written from each
setting's formula, and differ from the default PPO loss. An actor that ignored a setting would
compute the default and fail here (the unit tests in tests/algo call the pure functions, not
the actor).
"""

from __future__ import annotations

import math

import pytest
import torch

from arealite.config import PPOActorConfig
from arealite.train.actor import actor_loss
from tests.algo.test_losses import _naive_aggregate, _seqs
from tests.tolerance import close

LENS = [7, 9, 5, 11, 8, 6]
VOCAB = 12


def _micro_batch(seed: int = 0):
    """Packed logits [N, V] (float64) and a micro-batch whose three policies all differ."""
    g = torch.Generator().manual_seed(seed)
    n = sum(LENS)
    cu = torch.zeros(len(LENS) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(torch.tensor(LENS), 0)
    logits = torch.randn(n, VOCAB, generator=g, dtype=torch.float64) * 2.0
    ids = torch.randint(0, VOCAB, (n,), generator=g)
    mask = torch.rand(n, generator=g) < 0.85
    mask[cu[:-1].long()] = False  # a sequence's first token predicts nothing
    cur = _current_logp(logits, ids, cu)
    prox = (cur + 0.5 * torch.randn(n, generator=g, dtype=torch.float64)).clamp(max=-1e-3)
    behav = (prox + 0.6 * torch.randn(n, generator=g, dtype=torch.float64)).clamp(max=-1e-3)
    seq_adv = torch.randn(len(LENS), generator=g, dtype=torch.float64)
    adv = torch.repeat_interleave(seq_adv, torch.tensor(LENS))
    mb = {"input_ids": ids, "cu_seqlens": cu, "loss_mask": mask.long(), "advantages": adv.float(),
          "prox_logp": prox.float(), "logprobs": behav.float()}  # fmt: skip
    return logits, mb


def _current_logp(logits, ids, cu):
    lp = torch.zeros(len(ids), dtype=torch.float64)
    for a, b in _seqs(cu):
        for t in range(a + 1, b):
            lp[t] = torch.log_softmax(logits[t - 1], -1)[ids[t]]
    return lp


def _binary_kl(q, p):
    return q * math.log(q / p) + (1 - q) * math.log((1 - q) / (1 - p))


def _naive(logits, mb, cfg: PPOActorConfig) -> tuple[float, dict[str, float]]:
    """The per-token loss each setting's paper defines, aggregated; and the masked fractions."""
    cu, mask = mb["cu_seqlens"], mb["loss_mask"].bool()
    cur = _current_logp(logits, mb["input_ids"], cu).tolist()
    prox, behav, adv = (mb[k].double().tolist() for k in ("prox_logp", "logprobs", "advantages"))
    owner = [s for s, (a, b) in enumerate(_seqs(cu)) for _ in range(a, b)]
    loss_toks = [[t for t in range(a, b) if mask[t]] for a, b in _seqs(cu)]
    log_r = [cur[t] - prox[t] for t in range(len(cur))]
    if cfg.importance_sampling_level == "sequence":  # GSPO: the sequence's mean log ratio
        seq_mean = [sum(log_r[t] for t in ts) / len(ts) if ts else 0.0 for ts in loss_toks]
        log_r = [seq_mean[owner[t]] for t in range(len(cur))]
    log_w = [prox[t] - behav[t] for t in range(len(cur))]
    w_seq = [sum(log_w[t] for t in ts) for ts in loss_toks]
    w_geo = [w_seq[s] / max(len(ts), 1) for s, ts in enumerate(loss_toks)]
    level = {"token": lambda t: log_w[t], "sequence": lambda t: w_seq[owner[t]], "geometric": lambda t: w_geo[owner[t]]}
    out, counts = [], {"rs_high": 0, "rs_low": 0, "tr_high": 0, "tr_low": 0}
    for t in range(len(cur)):
        r, A = math.exp(log_r[t]), adv[t]
        lo, hi = 1 - cfg.eps_clip, 1 + (cfg.eps_clip if cfg.eps_clip_higher is None else cfg.eps_clip_higher)
        if cfg.policy_loss == "ppo":  # PPO's clipped surrogate, and the dual clip on negative advantages
            pg = max(-A * r, -A * min(max(r, lo), hi))
            if cfg.c_clip is not None and A < 0:
                pg = min(pg, -A * cfg.c_clip)
        elif cfg.policy_loss == "cispo":  # MiniMax-M1: sg(clip(r)) * A * log pi
            pg = -min(max(r, lo), hi) * A * cur[t]
        elif cfg.policy_loss == "sapo":  # Qwen SAPO: (4 / tau) sigmoid(tau (r - 1))
            tau = cfg.sapo_tau_pos if A > 0 else cfg.sapo_tau_neg
            pg = -A * 4.0 / tau / (1.0 + math.exp(-tau * (r - 1.0)))
        else:  # DPPO: the unclipped surrogate, bounded by the trust region below
            pg = -A * r
        keep = True
        if cfg.use_decoupled_loss and cfg.rollout_is == "none":  # decoupled PPO: times w, untruncated
            pg *= math.exp(log_w[t])
        if cfg.rollout_is != "none":  # TIS, two-sided with a lower bound
            low = 0.0 if cfg.rollout_is_cap_low is None else cfg.rollout_is_cap_low
            pg *= min(max(math.exp(level[cfg.rollout_is](t)), low), cfg.rollout_is_cap)
        if cfg.use_decoupled_loss and cfg.behav_imp_weight_cap is not None:
            keep &= math.exp(log_w[t]) <= cfg.behav_imp_weight_cap
        if cfg.rollout_rs != "none":  # rejection outside [low, cap]
            v = math.exp(level[cfg.rollout_rs](t))
            high_out, low_out = (
                v > cfg.rollout_rs_cap,
                cfg.rollout_rs_cap_low is not None and v < cfg.rollout_rs_cap_low,
            )
            keep &= not (high_out or low_out)
            counts["rs_high"] += mask[t] and high_out
            counts["rs_low"] += mask[t] and low_out
        if (
            cfg.trust_region != "none" and mask[t]
        ):  # DPPO: the sampled token's probability, in the advantage's direction
            p, q = math.exp(cur[t]), math.exp(prox[t])
            if cfg.trust_region == "tv":
                up_out, down_out = p - q > cfg.trust_region_high, q - p > cfg.trust_region_low
            else:
                kl = _binary_kl(q, p)
                up_out, down_out = kl > cfg.trust_region_high and p > q, kl > cfg.trust_region_low and p < q
            out_now = up_out if A > 0 else down_out
            keep &= not out_now
            counts["tr_high"] += mask[t] and A > 0 and up_out
            counts["tr_low"] += mask[t] and A <= 0 and down_out
        out.append(pg if keep else 0.0)
    n = max(int(mask.sum()), 1)
    return _naive_aggregate(out, mask, cu, cfg.loss_agg_mode), {k: v / n for k, v in counts.items()}


CASES = {
    "ppo-clip-higher": dict(eps_clip_higher=0.28),
    "ppo-dual-clip": dict(c_clip=1.5),
    "gspo": dict(importance_sampling_level="sequence", loss_agg_mode="seq-mean-token-mean", eps_clip=0.05),
    "cispo": dict(policy_loss="cispo", eps_clip=1.0, eps_clip_higher=1.0),
    "sapo": dict(policy_loss="sapo"),
    "dppo-tv": dict(policy_loss="dppo", trust_region="tv", trust_region_low=0.05, trust_region_high=0.1),
    "dppo-kl": dict(policy_loss="dppo", trust_region="kl", trust_region_low=0.02, trust_region_high=0.01),
    "dppo-tv-decoupled": dict(policy_loss="dppo", trust_region="tv", trust_region_low=0.05, use_decoupled_loss=True),
    "ppo-kl-region": dict(trust_region="kl", trust_region_low=0.01, trust_region_high=0.01),
    "decoupled": dict(use_decoupled_loss=True),
    "decoupled-cap": dict(use_decoupled_loss=True, behav_imp_weight_cap=1.3),
    "tis-token": dict(rollout_is="token", rollout_is_cap=1.5),
    "tis-token-two-sided": dict(rollout_is="token", rollout_is_cap=1.5, rollout_is_cap_low=0.7),
    "tis-sequence": dict(rollout_is="sequence", rollout_is_cap=2.0, rollout_is_cap_low=0.9),
    "rs-token-two-sided": dict(rollout_rs="token", rollout_rs_cap=1.5, rollout_rs_cap_low=0.6),
    "rs-sequence-two-sided": dict(rollout_rs="sequence", rollout_rs_cap=3.0, rollout_rs_cap_low=0.7),
    "rs-geometric": dict(rollout_rs="geometric", rollout_rs_cap=1.2, rollout_rs_cap_low=0.9),
    "trl-sequence-mask": dict(rollout_is="sequence", rollout_is_cap=3.0, rollout_rs="sequence", rollout_rs_cap=3.0),
    "icepop": dict(use_decoupled_loss=True, rollout_rs="token", rollout_rs_cap=1.8, rollout_rs_cap_low=0.5),
    "geo-mask-with-decoupled": dict(use_decoupled_loss=True, rollout_rs="geometric", rollout_rs_cap=1.2,
                                    rollout_rs_cap_low=0.9),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(CASES))
def test_actor_loss_binds_the_setting(name):
    logits, mb = _micro_batch()
    cfg = PPOActorConfig(path="x", **CASES[name])
    loss, stats = actor_loss(logits, mb, cfg)
    want, fracs = _naive(logits, mb, cfg)
    default, _ = actor_loss(logits, mb, PPOActorConfig(path="x", loss_agg_mode=cfg.loss_agg_mode))
    # the tokens' values are fp32 inputs combined in fp64: fp32 rounding of ~|N| terms bounds the error
    assert close(loss.item(), want, torch.float32, n=len(mb["input_ids"])), (name, loss.item(), want)
    assert not close(default.item(), want, torch.float32, n=len(mb["input_ids"]), k=1000), (name, "= PPO default")
    if cfg.rollout_rs != "none":
        for side in ("high", "low"):
            assert close(stats[f"rollout_rs_masked_frac_{side}"].item(), fracs[f"rs_{side}"]), (name, side)
        assert 0 < fracs["rs_high"] < 1 and (cfg.rollout_rs_cap_low is None or 0 < fracs["rs_low"] < 1)
    if cfg.trust_region != "none":
        for side in ("high", "low"):
            assert close(stats[f"trust_region_masked_frac_{side}"].item(), fracs[f"tr_{side}"]), (name, side)
        assert 0 < fracs["tr_high"] + fracs["tr_low"] < 1
