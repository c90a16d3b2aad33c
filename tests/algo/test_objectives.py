"""CISPO and SAPO against per-token loops written from their papers' formulas (loss value and
the gradient the papers state), and every objective's gradient pointing the right way."""

from __future__ import annotations

import math

import pytest
import torch

from arealite.algo.losses import AGGREGATIONS, LOG_RATIOS, OBJECTIVES, ppo_actor_loss
from arealite.config import ConfigError, PPOActorConfig
from arealite.train.actor import policy_objective
from tests.algo.test_losses import _naive_aggregate, _random_packed, _seqs
from tests.tolerance import assert_close, close


def _token_ratios(logp, prox, mask, cu, level):
    log_r = [float(logp[t] - prox[t]) for t in range(len(logp))]
    if level == "sequence":  # GSPO: every token carries its sequence's mean log ratio
        for a, b in _seqs(cu):
            sel = [log_r[t] for t in range(a, b) if mask[t]]
            for t in range(a, b):
                log_r[t] = sum(sel) / len(sel) if sel else 0.0
    return [math.exp(x) for x in log_r]


def _naive_cispo(logp, prox, adv, mask, cu, eps_low, eps_high, level):
    """MiniMax-M1 eq. 4: J = sum_t sg(clip(r_t, 1-eps_low, 1+eps_high)) * A_t * log pi(o_t);
    loss -J per token, and d(-J_t)/d logp_t = -clip(r_t) * A_t (the weight is a constant)."""
    r = _token_ratios(logp, prox, mask, cu, level)
    w = [min(max(x, 1 - eps_low), 1 + eps_high) for x in r]
    loss = [-w[t] * float(adv[t]) * float(logp[t]) for t in range(len(logp))]
    grad = [-w[t] * float(adv[t]) for t in range(len(logp))]
    return loss, grad


def _naive_sapo(logp, prox, adv, mask, cu, tau_pos, tau_neg, level):
    """SAPO: f(r) = sigmoid(tau (r - 1)) * 4 / tau with tau = tau_pos if A > 0 else tau_neg,
    loss -f(r) A; its gradient in logp (token level) is -4 s (1 - s) r A, s the sigmoid."""
    r = _token_ratios(logp, prox, mask, cu, level)
    loss, grad = [], []
    for t in range(len(logp)):
        A = float(adv[t])
        tau = tau_pos if A > 0 else tau_neg
        s = 1.0 / (1.0 + math.exp(-tau * (r[t] - 1.0)))
        loss.append(-s * 4.0 / tau * A)
        grad.append(-4.0 * s * (1.0 - s) * r[t] * A)
    return loss, grad


def _token_mean_grad(grad, mask):
    n = max(int(mask.sum()), 1)
    return torch.tensor([g / n if mask[t] else 0.0 for t, g in enumerate(grad)], dtype=torch.float64)


@pytest.mark.parametrize("seed,n_seqs", [(0, 3), (1, 6)])
@pytest.mark.parametrize("mode", list(AGGREGATIONS))
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("bounds", [(0.2, 0.28), (1.0, 4.0)])  # (1.0, .): no lower bound, as the paper
def test_cispo_matches_naive(seed, n_seqs, mode, level, bounds):
    logp, prox, _, adv, mask, cu = _random_packed(seed, n_seqs)
    logp.requires_grad_(True)
    eps_low, eps_high = bounds
    objective = OBJECTIVES["cispo"]
    loss, stats = ppo_actor_loss(
        logp, prox, adv, mask, cu, eps_clip=eps_low, aggregate=AGGREGATIONS[mode].reduce,
        log_ratio=LOG_RATIOS[level], objective=lambda r, lp, a: objective(r, lp, a, eps_low, eps_high),
    )  # fmt: skip
    naive_loss, naive_grad = _naive_cispo(logp.detach(), prox, adv, mask, cu, eps_low, eps_high, level)
    assert close(loss.item(), _naive_aggregate(naive_loss, mask, cu, mode), torch.float64, n=len(logp))
    if mode == "token-mean":
        loss.backward()
        assert_close(logp.grad, _token_mean_grad(naive_grad, mask), torch.float64, n=len(logp))
    assert 0 <= stats["clip_frac"] <= 1


@pytest.mark.parametrize("seed,n_seqs", [(0, 3), (1, 6)])
@pytest.mark.parametrize("mode", list(AGGREGATIONS))
@pytest.mark.parametrize("taus", [(1.0, 1.05), (0.5, 2.0)])
def test_sapo_matches_naive(seed, n_seqs, mode, taus):
    logp, prox, _, adv, mask, cu = _random_packed(seed, n_seqs)
    logp.requires_grad_(True)
    objective = OBJECTIVES["sapo"]
    loss, _ = ppo_actor_loss(
        logp, prox, adv, mask, cu, eps_clip=0.2, aggregate=AGGREGATIONS[mode].reduce,
        objective=lambda r, lp, a: objective(r, lp, a, *taus),
    )  # fmt: skip
    naive_loss, naive_grad = _naive_sapo(logp.detach(), prox, adv, mask, cu, *taus, "token")
    assert close(loss.item(), _naive_aggregate(naive_loss, mask, cu, mode), torch.float64, n=len(logp))
    if mode == "token-mean":
        loss.backward()
        assert_close(logp.grad, _token_mean_grad(naive_grad, mask), torch.float64, n=len(logp))


def test_sapo_gate_weight_is_one_on_policy_and_decays_faster_for_negative_advantages():
    prox = torch.zeros(4, dtype=torch.float64)
    logp = torch.tensor([0.0, 0.0, 0.7, 0.7], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0], dtype=torch.float64)
    loss, _ = OBJECTIVES["sapo"](torch.exp(logp - prox), logp, adv, 1.0, 1.05)
    loss.sum().backward()
    g = logp.grad
    assert close(g[0].item(), -1.0, torch.float64) and close(g[1].item(), 1.0, torch.float64)  # r = 1: plain PG
    assert abs(g[3]) / math.exp(0.7) < abs(g[2]) / math.exp(0.7) < 1.0  # off-policy: damped, tau_neg more


@pytest.mark.parametrize("name", list(OBJECTIVES))
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_one_gradient_step_moves_logprobs_with_the_advantage(name, level):
    # a toy policy (free logits per position): one SGD step on the loss raises the log-prob of
    # positive-advantage tokens and lowers that of negative ones; a flipped sign fails this
    g = torch.Generator().manual_seed(3)
    n, vocab = 24, 7
    logits = torch.randn(n, vocab, generator=g, dtype=torch.float64, requires_grad=True)
    tokens = torch.randint(0, vocab, (n,), generator=g)
    cu = torch.tensor([0, 8, 16, 24], dtype=torch.int32)
    adv = torch.tensor([1.0] * 8 + [-1.0] * 8 + [0.5] * 8, dtype=torch.float64)
    mask = torch.ones(n, dtype=torch.bool)
    cfg = PPOActorConfig(path="x", policy_loss=name, trust_region="tv" if name == "dppo" else "none")
    logp0 = torch.log_softmax(logits, -1).gather(1, tokens[:, None]).squeeze(1)
    loss, _ = ppo_actor_loss(logp0, logp0.detach(), adv, mask, cu, eps_clip=0.2, log_ratio=LOG_RATIOS[level],
                             objective=policy_objective(cfg))  # fmt: skip
    loss.backward()
    with torch.no_grad():
        logp1 = torch.log_softmax(logits - 0.05 * logits.grad, -1).gather(1, tokens[:, None]).squeeze(1)
    moved = logp1 - logp0.detach()
    assert (moved[adv > 0] > 0).all() and (moved[adv < 0] < 0).all(), (name, moved)


def test_policy_loss_config_binds_parameters_and_rejects_bad_ones():
    cfg = PPOActorConfig(path="x", policy_loss="sapo", sapo_tau_pos=0.5, sapo_tau_neg=2.0)
    assert policy_objective(cfg).keywords == {"tau_pos": 0.5, "tau_neg": 2.0}
    cfg = PPOActorConfig(path="x", policy_loss="cispo", eps_clip=1.0, eps_clip_higher=4.0)
    assert policy_objective(cfg).keywords == {"eps_clip": 1.0, "eps_clip_higher": 4.0}
    with pytest.raises(ConfigError, match="actor.policy_loss='grpo'"):
        PPOActorConfig(path="x", policy_loss="grpo")
    with pytest.raises(ConfigError, match="tau_pos <= tau_neg"):
        PPOActorConfig(path="x", policy_loss="sapo", sapo_tau_pos=2.0, sapo_tau_neg=1.0)
    with pytest.raises(ConfigError, match="c_clip"):
        PPOActorConfig(path="x", policy_loss="cispo", c_clip=3.0)
