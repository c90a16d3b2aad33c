"""Turn-level credit (`actor.adv_estimator`), through the config and `estimate_advantages`:

- equal to a per-turn loop written here from the definition, on episodes of varied turn counts
  spread over several rows (chains);
- on a stop/continue bandit, exactly unbiased (expected gradient = the true gradient, by
  enumerating every outcome of a group), where the per-turn-index baseline (MT-GRPO) is off by
  its closed-form bias, -p(1-p) E[reward after continuing], on the stop/continue choice.
"""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch

from arealite.config import ConfigError, GenerationHyperparameters, PPOActorConfig
from arealite.train.advantage_estimation import estimate_advantages
from tests.tolerance import assert_close, close


def _episode_rows(turns: list[tuple[float, int]], cuts: list[int], prompt: int, T: int):
    """Rows of one episode: turn k has reward turns[k][0] and turns[k][1] tokens; a new row (chain)
    starts at each turn index in `cuts`. Returns (turn_ids, turn_rewards, loss_mask) lists of rows."""
    rows, row = [], None
    for k, (reward, n_tok) in enumerate(turns):
        if row is None or k in cuts:
            row = {"ids": [-1] * prompt, "rew": [0.0] * prompt}
            rows.append(row)
        row["ids"] += [k] * n_tok + [-1]  # one inserted (environment) token after every turn
        row["rew"] += [0.0] * (n_tok - 1) + [reward, 0.0]
    out = []
    for row in rows:
        pad = T - len(row["ids"])
        ids = row["ids"] + [-1] * pad
        out.append((ids, row["rew"] + [0.0] * pad, [int(i >= 0) for i in ids]))
    return out


def _random_batch(seed: int, groups: int, G: int, T: int = 40):
    rng = random.Random(seed)
    episodes, rows = [], []
    for _ in range(groups * G):
        turns = [(rng.choice([0.0, 1.0, -0.5, 0.25]), rng.randint(1, 3)) for _ in range(rng.randint(1, 4))]
        cuts = [k for k in range(1, len(turns)) if rng.random() < 0.4]
        episodes.append(turns)
        for i, r in enumerate(_episode_rows(turns, cuts, rng.randint(1, 3), T)):
            rows.append((len(episodes) - 1, i, *r))
    batch = {
        "turn_ids": torch.tensor([r[2] for r in rows]),
        "turn_rewards": torch.tensor([r[3] for r in rows]),
        "loss_mask": torch.tensor([r[4] for r in rows]),
        "chain": torch.tensor([r[1] for r in rows]),
        "rewards": torch.tensor([sum(x for x, _ in episodes[r[0]]) for r in rows]),
        "attention_mask": torch.ones(len(rows), T, dtype=torch.long),
    }
    return batch, episodes, [r[0] for r in rows]


def _naive_credit(episodes, G, mode, gamma, shape):
    """credit[e][k] by the definition, one episode and one turn at a time."""
    out = []
    for e, turns in enumerate(episodes):
        g0 = e // G * G
        group = [episodes[j] for j in range(g0, g0 + G)]

        def rtg(ts, k):
            return sum(gamma ** (j - k) * shape(ts[j][0]) for j in range(k, len(ts)))

        credit = []
        for k in range(len(turns)):
            if mode == "turn_loo":
                others = [rtg(ts, k) for j, ts in enumerate(group) if g0 + j != e and len(ts) > k]
                base = sum(others) / len(others) if others else 0.0
            else:  # per-turn-index group mean over those that reached it, accumulated from k on
                base = 0.0
                for j in range(k, len(turns)):
                    reached = [shape(ts[j][0]) for ts in group if len(ts) > j]
                    base += gamma ** (j - k) * sum(reached) / len(reached)
            credit.append(rtg(turns, k) - base)
        out.append(credit)
    return out


@pytest.mark.parametrize("mode", ["turn_loo", "turn_index"])
@pytest.mark.parametrize("gamma", [1.0, 0.8])
def test_turn_credit_matches_a_per_turn_loop(mode, gamma):
    G = 4
    batch, episodes, owner = _random_batch(seed=7 + int(gamma * 10) + len(mode), groups=3, G=G)
    assert (batch["chain"] > 0).any()  # several rows per episode are in the test
    cfg = PPOActorConfig(path="x", adv_estimator=mode, gamma=gamma, reward_scaling=2.0, reward_bias=0.1)
    adv = estimate_advantages(batch, cfg, GenerationHyperparameters(group_size=G))["advantages"]
    credit = _naive_credit(episodes, G, mode, gamma, lambda r: (r + 0.1) * 2.0)
    want = torch.zeros_like(adv, dtype=torch.float64)
    for b, e in enumerate(owner):
        for t, k in enumerate(batch["turn_ids"][b].tolist()):
            if k >= 0:
                want[b, t] = credit[e][k]
    assert_close(adv, want, n=16)
    assert (adv[batch["turn_ids"] < 0] == 0).all()


def test_sequence_estimator_with_chains_normalizes_over_episodes():
    # the default estimator: one score per episode (not per row), broadcast to every chain of it
    G = 4
    batch, episodes, owner = _random_batch(seed=3, groups=2, G=G)
    cfg = PPOActorConfig(path="x", group_norm="mean")
    adv = estimate_advantages(batch, cfg, GenerationHyperparameters(group_size=G))["advantages"]
    ret = [sum(r for r, _ in ts) for ts in episodes]
    for b, e in enumerate(owner):
        g0 = e // G * G
        want = ret[e] - sum(ret[g0 : g0 + G]) / G
        got = adv[b][batch["loss_mask"][b].bool()]
        assert_close(got, torch.full_like(got, want, dtype=torch.float64), n=G)


def test_turn_estimator_needs_turn_tensors_and_refuses_a_critic():
    batch = {"rewards": torch.ones(2), "loss_mask": torch.ones(2, 3), "attention_mask": torch.ones(2, 3)}
    g = GenerationHyperparameters(group_size=2)
    with pytest.raises(KeyError, match="turn_ids"):
        estimate_advantages(batch, PPOActorConfig(path="x", adv_estimator="turn_loo"), g)
    batch.update(turn_ids=torch.zeros(2, 3, dtype=torch.long), turn_rewards=torch.zeros(2, 3), values=torch.zeros(2, 3))
    with pytest.raises(ValueError, match="critic"):
        estimate_advantages(batch, PPOActorConfig(path="x", adv_estimator="turn_loo"), g)
    with pytest.raises(ConfigError, match="overlong_tokens"):
        PPOActorConfig(path="x", adv_estimator="turn_loo", overlong_tokens=4)
    with pytest.raises(ConfigError, match="adv_estimator"):
        PPOActorConfig(path="x", adv_estimator="gigpo")


# ---- the stop/continue bandit --------------------------------------------------------------
# Turn 0: continue (prob p = sigmoid(theta)), reward R_C, or stop, reward R_S and the episode ends.
# Turn 1 (after continuing): answer right (prob q = sigmoid(phi)), reward 1, or wrong, reward 0.
# J = p (R_C + q) + (1 - p) R_S;  dJ/dtheta = p (1-p) (R_C + q - R_S);  dJ/dphi = p q (1-q).
P, Q, R_C, R_S = 0.6, 0.7, 0.2, 0.3
OUTCOMES = {"stop": (1 - P, [R_S]), "right": (P * Q, [R_C, 1.0]), "wrong": (P * (1 - Q), [R_C, 0.0])}


def _score(outcome: str) -> tuple[float, float]:
    """d/dtheta log pi of the turn-0 action, d/dphi log pi of the turn-1 action (0 without one)."""
    if outcome == "stop":
        return -P, 0.0
    return 1 - P, (1 - Q) if outcome == "right" else -Q


def _expected_gradient(mode: str, G: int) -> tuple[float, float]:
    """E[(1/G) sum_i sum_tokens grad log pi * advantage] over every outcome of a group, exactly."""
    cfg = PPOActorConfig(path="x", adv_estimator=mode)
    gconfig = GenerationHyperparameters(group_size=G)
    total = [0.0, 0.0]
    for combo in itertools.product(OUTCOMES, repeat=G):
        prob = math.prod(OUTCOMES[o][0] for o in combo)
        ids = [[0, -1] if o == "stop" else [0, 1] for o in combo]  # one token per turn
        rew = [OUTCOMES[o][1] + [0.0] * (2 - len(OUTCOMES[o][1])) for o in combo]
        batch = {
            "turn_ids": torch.tensor(ids),
            "turn_rewards": torch.tensor(rew, dtype=torch.float64),
            "loss_mask": (torch.tensor(ids) >= 0).long(),
            "rewards": torch.tensor([sum(r) for r in rew]),
            "attention_mask": torch.ones(G, 2, dtype=torch.long),
        }
        adv = estimate_advantages(batch, cfg, gconfig)["advantages"].double()
        for i, o in enumerate(combo):
            d_theta, d_phi = _score(o)
            total[0] += prob * d_theta * float(adv[i, 0]) / G
            total[1] += prob * d_phi * float(adv[i, 1]) / G
    return total[0], total[1]


TRUE_THETA = P * (1 - P) * (R_C + Q - R_S)
TRUE_PHI = P * Q * (1 - Q)


@pytest.mark.parametrize("G", [2, 3])
def test_turn_loo_is_unbiased_on_the_stop_continue_bandit(G):
    theta, phi = _expected_gradient("turn_loo", G)
    assert close(theta, TRUE_THETA, n=3**G), (theta, TRUE_THETA)
    assert close(phi, TRUE_PHI, n=3**G), (phi, TRUE_PHI)


@pytest.mark.parametrize("G", [2, 3])
def test_per_turn_index_baseline_has_its_closed_form_bias(G):
    theta, phi = _expected_gradient("turn_index", G)
    # the own sample in the turn-0 mean shrinks by 1/G; the turn-1 mean it subtracts only when it
    # continued removes the value of continuing, p(1-p) q, from the stop/continue gradient
    want_theta = TRUE_THETA - P * (1 - P) * (R_C - R_S) / G - P * (1 - P) * Q
    mean_inv_n = (1 - (1 - P) ** G) / (G * P)  # E[1 / continuers] given this sample continued
    want_phi = TRUE_PHI * (1 - mean_inv_n)
    assert close(theta, want_theta, n=3**G) and close(phi, want_phi, n=3**G), (theta, want_theta, phi, want_phi)
    assert abs(theta - TRUE_THETA) > 0.05  # the bias is real here: it even flips the sign of the choice
    assert (theta > 0) != (TRUE_THETA > 0)


@pytest.mark.parametrize("mode", ["turn_loo", "turn_index"])
def test_adv_estimator_is_bound_at_the_actor(mode):
    """`PPOActor.compute_advantages` reads `actor.adv_estimator`: the per-turn loop's credit, not the
    one-score-per-sample default (an actor that ignored the setting would fail here)."""
    from arealite.train.actor import PPOActor

    G = 3
    batch, episodes, owner = _random_batch(seed=11, groups=2, G=G)
    actor = PPOActor(PPOActorConfig(path="x", adv_estimator=mode), GenerationHyperparameters(group_size=G))
    actor.device = torch.device("cpu")  # estimation only: no model needed
    actor.compute_advantages(batch)
    credit = _naive_credit(episodes, G, mode, 1.0, lambda r: r)
    want = torch.zeros_like(batch["advantages"], dtype=torch.float64)
    for b, e in enumerate(owner):
        for t, k in enumerate(batch["turn_ids"][b].tolist()):
            if k >= 0:
                want[b, t] = credit[e][k]
    assert_close(batch["advantages"], want, n=16)
    default = estimate_advantages(batch, PPOActorConfig(path="x"), GenerationHyperparameters(group_size=G))
    assert not torch.allclose(default["advantages"], batch["advantages"])
