"""The settings that choose between arealite's conventions and its peers' (verl, TRL, AReaL),
each held against a naive formula written from its documented meaning (docs/algorithms.md)."""

from __future__ import annotations

import math

import pytest
import torch

from arealite.config import ConfigError, GenerationHyperparameters, PPOActorConfig
from arealite.train.advantage_estimation import estimate_advantages
from tests.tolerance import assert_close


def _batch(rewards, gen_lens, truncated=None, T=10):
    B = len(rewards)
    mask = (torch.arange(T)[None] < torch.tensor(gen_lens)[:, None]).long()
    batch = {"rewards": torch.tensor(rewards), "loss_mask": mask, "attention_mask": torch.ones(B, T, dtype=torch.long)}
    if truncated is not None:
        batch["truncated"] = torch.tensor(truncated)
    return batch


def _naive_mean_std(scores, G, std, eps=1e-6):
    out = []
    for g in range(0, len(scores), G):
        grp = scores[g : g + G]
        mean = sum(grp) / G
        sd = math.sqrt(sum((x - mean) ** 2 for x in grp) / (G - 1 if std == "sample" else G))
        out += [(x - mean) / (sd + eps) for x in grp]
    return out


def _per_sequence(adv, loss_mask):
    """The one advantage each sequence carries on its loss tokens (0 with none)."""
    rows = []
    for b in range(adv.shape[0]):
        sel = adv[b][loss_mask[b].bool()]
        assert (sel == sel[0]).all() if sel.numel() else True
        rows.append(float(sel[0]) if sel.numel() else 0.0)
    return torch.tensor(rows, dtype=torch.float64)


@pytest.mark.parametrize("std", ["population", "sample"])
def test_group_std_setting_matches_naive(std):
    rewards = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.5]
    batch = _batch(rewards, [4] * 8)
    cfg = PPOActorConfig(path="x", group_std=std)
    adv = estimate_advantages(batch, cfg, GenerationHyperparameters(group_size=4))["advantages"]
    want = torch.tensor(_naive_mean_std(rewards, 4, std), dtype=torch.float64)
    assert_close(_per_sequence(adv, batch["loss_mask"]), want, n=4)


def test_group_std_default_is_the_peers_sample_std():
    # verl, TRL and AReaL divide by the unbiased (G-1) std: advantages sqrt((G-1)/G) of the population ones
    assert PPOActorConfig(path="x").group_std == "sample"
    batch = _batch([1.0, 0.0], [3, 3])
    adv = estimate_advantages(batch, PPOActorConfig(path="x"), GenerationHyperparameters(group_size=2))["advantages"]
    assert_close(adv[0, :3], torch.full((3,), 0.5 / (math.sqrt(0.5) + 1e-6)))  # population: 0.5 / (0.5 + eps)


@pytest.mark.parametrize("baseline", ["zero", "score"])
def test_truncated_baseline_matches_naive(baseline):
    # group of 4: scores 1, 1, 0.5 (truncated), 0; scaling 2 so the shaped score is what is zeroed
    rewards, truncated = [1.0, 1.0, 0.5, 0.0, 0.0, 1.0, 1.0, 1.0], [0, 0, 1, 0, 0, 0, 0, 1]
    batch = _batch(rewards, [5, 6, 10, 3, 4, 4, 4, 10], truncated)
    cfg = PPOActorConfig(path="x", reward_scaling=2.0, mask_no_eos_with_zero=True, truncated_baseline=baseline)
    out = estimate_advantages(batch, cfg, GenerationHyperparameters(group_size=4, max_new_tokens=10))
    shaped = [2.0 * r for r in rewards]
    in_baseline = [0.0 if (t and baseline == "zero") else s for s, t in zip(shaped, truncated)]
    want = _naive_mean_std(in_baseline, 4, "sample")
    for b, t in enumerate(truncated):  # truncated rows leave the loss: no token, no advantage
        if t:
            want[b] = 0.0
    assert torch.equal(out["loss_mask"], batch["loss_mask"] * (1 - torch.tensor(truncated))[:, None])
    assert_close(_per_sequence(out["advantages"], out["loss_mask"]), torch.tensor(want, dtype=torch.float64), n=4)
    assert (out["advantages"][torch.tensor(truncated).bool()] == 0).all()


@pytest.mark.parametrize("stage", ["after_shaping", "before_shaping"])
def test_overlong_penalty_stage_matches_naive(stage):
    # budget 10, penalty over the last 4 tokens with factor 0.5; bias -0.2, scaling 3, clip 2.5
    gen_lens, rewards = [4, 6, 7, 8, 10, 9], [1.0, 1.0, 1.0, 0.0, 1.0, 0.2]
    batch = _batch(rewards, gen_lens)
    cfg = PPOActorConfig(path="x", group_norm="none", reward_bias=-0.2, reward_scaling=3.0, reward_clip=2.5,
                         overlong_tokens=4, overlong_penalty_factor=0.5, overlong_penalty_stage=stage)  # fmt: skip
    adv = estimate_advantages(batch, cfg, GenerationHyperparameters(group_size=1, max_new_tokens=10))["advantages"]
    want = []
    for r, n in zip(rewards, gen_lens):
        penalty = -0.5 * min(max(n - 6, 0) / 4, 1.0)  # DAPO: 0 up to 6 tokens, -factor at 10
        if stage == "before_shaping":
            want.append(min(max((r + penalty - 0.2) * 3.0, -2.5), 2.5))
        else:
            want.append(min(max((r - 0.2) * 3.0, -2.5), 2.5) + penalty)
    assert_close(_per_sequence(adv, batch["loss_mask"]), torch.tensor(want, dtype=torch.float64))


def test_convention_settings_reject_unknown_values():
    for field, bad in (("group_std", "unbiased"), ("truncated_baseline", "mean"), ("overlong_penalty_stage", "x")):
        with pytest.raises(ConfigError, match=f"actor.{field}='{bad}'"):
            PPOActorConfig(path="x", **{field: bad})
