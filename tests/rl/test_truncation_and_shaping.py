"""Truncation handling, the overlong penalty and dynamic sampling as the config switches them,
and the step statistics that show them (truncated fraction, staleness)."""

from __future__ import annotations

import pytest
import torch

from arealite.config import ConfigError, GenerationHyperparameters, GRPOConfig, PPOActorConfig
from arealite.rollout.dynamic_sampling import informative_rows, rewards_differ
from arealite.stats.batch import batch_stats
from arealite.stats.tracker import StatsTracker
from arealite.train.advantage_estimation import estimate_advantages
from tests.train.helpers import make_batch


def _config(**actor) -> GRPOConfig:
    return GRPOConfig(
        gconfig=GenerationHyperparameters(group_size=2, max_new_tokens=8), actor=PPOActorConfig(path="x", **actor)
    )


def test_mask_no_eos_with_zero_drops_truncated_responses_from_the_loss_and_scores_them_zero():
    batch = make_batch([10, 10, 9, 10], prompt_len=2, seed=1)  # two groups of 2
    batch["rewards"] = torch.tensor([1.0, 1.0, 0.0, 1.0])
    batch["truncated"] = torch.tensor([False, True, False, True])
    g2 = GenerationHyperparameters(group_size=2)
    on = estimate_advantages(batch, PPOActorConfig(path="x", group_norm="mean", mask_no_eos_with_zero=True), g2)
    off = estimate_advantages(batch, PPOActorConfig(path="x", group_norm="mean"), g2)
    mask = batch["loss_mask"].bool()
    # off: group 0 has equal rewards (no signal); group 1: -0.5 / +0.5
    assert "loss_mask" not in off
    assert torch.equal(off["advantages"][0][mask[0]], torch.zeros(int(mask[0].sum())))
    assert torch.allclose(off["advantages"][3][mask[3]], torch.tensor(0.5))
    # on: the truncated rows count as 0 in their group's baseline and leave the loss
    assert on["loss_mask"][[1, 3]].sum() == 0 and torch.equal(on["loss_mask"][[0, 2]], batch["loss_mask"][[0, 2]])
    assert torch.allclose(on["advantages"][0][mask[0]], torch.tensor(0.5))  # 1 against the truncated 0
    assert torch.equal(on["advantages"][2][mask[2]], torch.zeros(int(mask[2].sum())))  # 0 against 0
    assert (on["advantages"][[1, 3]] == 0).all()


def test_mask_no_eos_with_zero_needs_the_truncated_key():
    batch = make_batch([6, 6], seed=2)
    with pytest.raises(KeyError, match="truncated"):
        config = PPOActorConfig(path="x", mask_no_eos_with_zero=True)
        estimate_advantages(batch, config, GenerationHyperparameters(group_size=2))


def test_overlong_penalty_takes_the_budget_from_gconfig():
    config = _config(overlong_tokens=4, group_norm="none")
    batch = make_batch([10, 10, 10, 10], prompt_len=2, seed=3)  # 8 generated tokens each
    batch["loss_mask"][1, 6:] = 0  # 4 tokens: outside the penalty zone (the last 4 of 8)
    batch["loss_mask"][2, 8:] = 0  # 6 tokens: half way into it
    batch["rewards"] = torch.ones(4)
    adv = estimate_advantages(batch, config.actor, config.gconfig)["advantages"]
    per_row = [adv[b][batch["loss_mask"][b].bool()].unique().tolist() for b in range(4)]
    assert per_row == [[0.0], [1.0], [0.5], [0.0]]  # 1 - (excess / 4), excess = len - 4


def test_overlong_zone_must_fit_the_budget():
    with pytest.raises(ConfigError, match="overlong_tokens=9"):
        _config(overlong_tokens=9)
    with pytest.raises(ConfigError, match="overlong_tokens=0"):
        PPOActorConfig(path="x", overlong_tokens=0)


def test_kl_needs_a_reference_model_and_the_models_default_to_the_actor():
    with pytest.raises(ConfigError, match="ref"):
        _config(kl_ctl=0.1)
    from arealite.config import PPOCriticConfig, TrainEngineConfig

    config = GRPOConfig(actor=PPOActorConfig(path="/m", kl_ctl=0.1), ref=TrainEngineConfig(), critic=PPOCriticConfig())
    assert config.ref.path == "/m" and config.critic.path == "/m"


def test_rewards_differ_is_false_only_for_all_equal_groups():
    assert rewards_differ({"rewards": torch.tensor([0.0, 1.0, 1.0])})
    assert not rewards_differ({"rewards": torch.tensor([1.0, 1.0, 1.0])})
    assert not rewards_differ({"rewards": torch.tensor([0.5])})  # a lone sample has no baseline
    batch = {"rewards": torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.5, 0.0])}
    assert informative_rows(batch, 2) == [[2, 3], [6, 7]]
    with pytest.raises(ValueError, match="groups of 3"):
        informative_rows(batch, 3)
    # a sample's further chains (histories that were not token prefixes) stay with its group
    batch = {"rewards": torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 2.0, 2.0]), "chain": torch.tensor([0, 1, 0, 0, 1, 0, 1])}
    assert informative_rows(batch, 2) == [[3, 4, 5, 6]]


def test_batch_stats_report_truncated_fraction_and_staleness():
    batch = make_batch([6, 8, 7, 8], prompt_len=3, seed=4)
    batch["truncated"] = torch.tensor([True, False, False, False])
    mask = batch["loss_mask"].bool()
    batch["versions"] = torch.where(mask, 5, -1)
    batch["versions"][1, 3:5] = 3  # two tokens of row 1 came from version 3 (an interrupted request)
    stats = batch_stats(StatsTracker(), batch, version=6)
    n = int(mask.sum())
    assert stats["truncated_frac"] == pytest.approx(0.25)
    assert stats["staleness"] == pytest.approx((n - 2 + 2 * 3) / n)  # 1 behind, except two tokens 3 behind
    assert stats["staleness_max"] == 3 and stats["staleness_min"] == 1
    assert stats["response_len"] == pytest.approx(n / 4)
    assert "kl_ref" not in stats
    batch["ref_logp"] = batch["logprobs"] - 0.25 * mask  # the policy sampled 0.25 nats above the reference
    assert batch_stats(StatsTracker(), batch)["kl_ref"] == pytest.approx(0.25)


def test_asynchronous_filter_lets_a_group_through_after_the_search_bound():
    from arealite.data.feed import DataFeed
    from arealite.data.loader import create_dataloader
    from arealite.rollout.dynamic_sampling import MAX_SAMPLED_BATCHES, DynamicSampler

    feed = DataFeed(create_dataloader([{"id": str(i)} for i in range(8)], batch_size=4))
    sampler = DynamicSampler(feed, group_size=2)
    equal, differ = {"rewards": torch.tensor([1.0, 1.0])}, {"rewards": torch.tensor([0.0, 1.0])}
    limit = MAX_SAMPLED_BATCHES * 4
    assert [sampler.accept(equal) for _ in range(limit)] == [False] * limit
    assert sampler.accept(equal) and sampler.filler_groups == 1  # the bound: this one passes
    assert sampler.accept(differ) and not sampler.accept(equal)  # a group with signal resets the count
