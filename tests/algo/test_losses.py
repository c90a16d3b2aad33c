"""Every loss in arealite.algo.losses against a per-token Python loop, on random packed inputs
with several group sizes and loss masks with holes."""

from __future__ import annotations

import math

import pytest
import torch

from arealite.algo.losses import (
    AGGREGATIONS,
    KL_ESTIMATORS,
    LOG_RATIOS,
    clipped_value_loss,
    entropy_from_logits,
    kl_k1,
    kl_k2,
    kl_k3,
    kl_loss,
    ppo_actor_loss,
)
from tests.tolerance import assert_close, close, tolerance


def _random_packed(seed: int, n_seqs: int):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(1, 12, (n_seqs,), generator=g)
    cu = torch.zeros(n_seqs + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(lens, 0)
    n = int(cu[-1])
    mask = torch.rand(n, generator=g) < 0.7  # holes everywhere, some sequences may be empty
    mask[: int(lens[0])] = False  # one sequence trains on nothing
    prox = -torch.rand(n, generator=g) * 3
    logp = prox + 0.4 * torch.randn(n, generator=g)
    behav = prox + 0.6 * torch.randn(n, generator=g)
    adv = torch.randn(n, generator=g)
    return logp.double(), prox.double(), behav.double(), adv.double(), mask, cu


def _seqs(cu):
    return [(int(cu[i]), int(cu[i + 1])) for i in range(len(cu) - 1)]


def _naive_aggregate(vals, mask, cu, mode):
    if mode == "token-mean":
        sel = [vals[t] for t in range(len(vals)) if mask[t]]
        return sum(sel) / max(len(sel), 1)
    per_seq = []
    for a, b in _seqs(cu):
        sel = [vals[t] for t in range(a, b) if mask[t]]
        if sel:
            per_seq.append(sum(sel) / len(sel) if mode == "seq-mean-token-mean" else sum(sel))
    return sum(per_seq) / max(len(per_seq), 1)


def _naive_ppo(logp, prox, behav, adv, mask, cu, eps, eps_hi, c_clip, cap, level):
    log_ratio = [float(logp[t] - prox[t]) for t in range(len(logp))]
    if level == "sequence":
        for a, b in _seqs(cu):
            sel = [log_ratio[t] for t in range(a, b) if mask[t]]
            m = sum(sel) / len(sel) if sel else 0.0
            for t in range(a, b):
                log_ratio[t] = m
    out = []
    for t in range(len(logp)):
        r, A = math.exp(log_ratio[t]), float(adv[t])
        hi = eps if eps_hi is None else eps_hi
        pg = max(-A * r, -A * min(max(r, 1 - eps), 1 + hi))
        if c_clip is not None and A < 0:
            pg = min(pg, -A * c_clip)
        if behav is not None:
            w = math.exp(float(prox[t] - behav[t]))
            pg = 0.0 if (cap is not None and w > cap) else pg * w
        out.append(pg)
    return out


@pytest.mark.parametrize("seed,n_seqs", [(0, 2), (1, 4), (2, 8)])
@pytest.mark.parametrize("mode", list(AGGREGATIONS))
@pytest.mark.parametrize("variant", ["plain", "decoupled", "dual_clip_higher", "gspo"])
def test_ppo_actor_loss_matches_naive(seed, n_seqs, mode, variant):
    logp, prox, behav, adv, mask, cu = _random_packed(seed, n_seqs)
    kw = dict(eps=0.2, eps_hi=None, c_clip=None, cap=None, level="token", behav=None)
    if variant == "decoupled":
        kw.update(behav=behav, cap=1.5)
    elif variant == "dual_clip_higher":
        kw.update(eps_hi=0.28, c_clip=3.0)
    elif variant == "gspo":
        kw.update(level="sequence")
    want = _naive_aggregate(
        _naive_ppo(
            logp, prox, kw["behav"], adv, mask, cu, kw["eps"], kw["eps_hi"], kw["c_clip"], kw["cap"], kw["level"]
        ),
        mask,
        cu,
        mode,
    )
    loss, stats = ppo_actor_loss(
        logp, prox, adv, mask, cu, eps_clip=kw["eps"], eps_clip_higher=kw["eps_hi"], c_clip=kw["c_clip"],
        behav_logp=kw["behav"], behav_imp_weight_cap=kw["cap"], aggregate=AGGREGATIONS[mode].reduce,
        log_ratio=LOG_RATIOS[kw["level"]],
    )  # fmt: skip
    assert close(loss.item(), want, torch.float64, n=len(logp))
    assert all(torch.isfinite(v) for v in stats.values())


def test_ppo_loss_gradient_is_zero_where_clipped():
    cu = torch.tensor([0, 2], dtype=torch.int32)
    prox = torch.zeros(2, dtype=torch.float64)
    logp = torch.tensor([0.5, 0.05], dtype=torch.float64, requires_grad=True)  # ratio e^0.5 > 1.2, 1.05 inside
    adv = torch.ones(2, dtype=torch.float64)
    loss, stats = ppo_actor_loss(logp, prox, adv, torch.ones(2, dtype=torch.bool), cu, eps_clip=0.2)
    loss.backward()
    assert logp.grad[0] == 0 and logp.grad[1] != 0 and stats["clip_frac"] == 0.5


def test_behaviour_cap_drops_tokens_but_keeps_denominator():
    cu = torch.tensor([0, 3], dtype=torch.int32)
    zeros = torch.zeros(3, dtype=torch.float64)
    behav = torch.tensor([0.0, -2.0, 0.0], dtype=torch.float64)  # token 1 weight e^2 > cap
    adv = torch.ones(3, dtype=torch.float64)
    loss, stats = ppo_actor_loss(zeros, zeros, adv, torch.ones(3, dtype=torch.bool), cu, eps_clip=0.2,
                                   behav_logp=behav, behav_imp_weight_cap=5.0)  # fmt: skip
    assert close(loss.item(), -2.0 / 3, torch.float64, n=3)
    assert close(stats["behav_imp_weight_capped_frac"].item(), 1 / 3, torch.float32, n=3)


@pytest.mark.parametrize("name", ["k1", "k2", "k3"])
@pytest.mark.parametrize("mode", list(AGGREGATIONS))
def test_kl_loss_matches_naive(name, mode):
    logp, prox, _, _, mask, cu = _random_packed(3, 5)
    per_token = []
    for t in range(len(logp)):
        d = float(logp[t] - prox[t])
        per_token.append({"k1": d, "k2": 0.5 * d * d, "k3": math.exp(-d) + d - 1}[name])
    want = _naive_aggregate(per_token, mask, cu, mode)
    loss, _ = kl_loss(logp, prox, mask, cu, KL_ESTIMATORS[name], AGGREGATIONS[mode].reduce)
    assert close(loss.item(), want, torch.float64, n=len(logp))


def test_kl_estimators_are_unbiased_or_positive():
    g = torch.Generator().manual_seed(0)
    logits_p, logits_q = torch.randn(6, generator=g), torch.randn(6, generator=g)
    p, q = torch.softmax(logits_p, 0), torch.softmax(logits_q, 0)
    exact = (p * (p.log() - q.log())).sum()
    samples = torch.multinomial(p, 200000, replacement=True, generator=g)
    lp, lq = p.log()[samples], q.log()[samples]
    # Monte Carlo, not rounding: 0.02 is > 10 standard errors of a 200,000-sample mean here
    assert abs(kl_k1(lp, lq).mean() - exact) < 0.02
    assert abs(kl_k3(lp, lq).mean() - exact) < 0.02
    # k3 = e^-d + d - 1 >= 0 exactly; in fp32 it may round below 0 by eps * |terms|
    assert (kl_k3(lp, lq) >= -tolerance(torch.float32) * (1 + (lp - lq).abs())).all() and (kl_k2(lp, lq) >= 0).all()


@pytest.mark.parametrize("eps", [None, 0.2])
@pytest.mark.parametrize("mode", list(AGGREGATIONS))
def test_clipped_value_loss_matches_naive(eps, mode):
    _, _, _, _, mask, cu = _random_packed(4, 6)
    g = torch.Generator().manual_seed(4)
    n = len(mask)
    v, old, ret = (torch.randn(n, generator=g, dtype=torch.float64) for _ in range(3))
    per_token = []
    for t in range(n):
        e = (float(v[t]) - float(ret[t])) ** 2
        if eps is not None:
            vc = float(old[t]) + min(max(float(v[t] - old[t]), -eps), eps)
            e = max(e, (vc - float(ret[t])) ** 2)
        per_token.append(0.5 * e)
    loss, _ = clipped_value_loss(v, old, ret, mask, cu, eps, AGGREGATIONS[mode].reduce)
    assert close(loss.item(), _naive_aggregate(per_token, mask, cu, mode), torch.float64, n=n)


@pytest.mark.parametrize("mode", list(AGGREGATIONS))
def test_aggregation_weights_make_micro_batch_sums_exact(mode):
    logp, _, _, _, mask, cu = _random_packed(5, 8)
    agg = AGGREGATIONS[mode]
    whole = agg.reduce(logp, mask, cu)
    parts = []
    for a, b in ((0, 3), (3, 5), (5, 8)):  # micro-batches of whole sequences
        s, e = int(cu[a]), int(cu[b])
        sub_cu = cu[a : b + 1] - cu[a]
        parts.append((agg.reduce(logp[s:e], mask[s:e], sub_cu), agg.weight(mask[s:e], sub_cu)))
    total = sum(w for _, w in parts)
    assert close(sum(v * w for v, w in parts) / total, whole.item(), torch.float64, n=len(logp))


def test_entropy_from_logits_matches_definition():
    g = torch.Generator().manual_seed(6)
    logits = torch.randn(4, 7, generator=g, dtype=torch.float64)
    p = torch.softmax(logits, -1)
    assert_close(entropy_from_logits(logits), -(p * p.log()).sum(-1), torch.float64, n=7)
