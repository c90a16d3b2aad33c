"""A NaN loss (here from a NaN proximal logprob) must not reach the weights: the optimizer
step is skipped and counted in the returned stats, and the next finite batch trains."""

from __future__ import annotations

import math

import pytest
import torch

from arealite.config import GenerationHyperparameters, OptimizerConfig, PPOActorConfig

pytestmark = pytest.mark.timeout(120)


def _batch(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    B, T, prompt = 8, 12, 4  # [B, T], two groups of four
    loss_mask = torch.zeros(B, T, dtype=torch.int)
    loss_mask[:, prompt:] = 1
    logprobs = -torch.rand(B, T, generator=g) * loss_mask
    return {
        "input_ids": torch.randint(0, 500, (B, T), generator=g),
        "attention_mask": torch.ones(B, T, dtype=torch.bool),
        "loss_mask": loss_mask,
        "logprobs": logprobs,
        "prox_logp": logprobs.clone(),
        "versions": torch.where(loss_mask.bool(), 0, -1),
        "rewards": torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0]),
    }


def _params(actor) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in actor.export_weights()}


def test_nan_loss_skips_the_update_and_training_continues(tiny_model_dir):
    from arealite.train import PPOActor

    config = PPOActorConfig(path=tiny_model_dir, optimizer=OptimizerConfig(lr=1e-2))
    actor = PPOActor(config, GenerationHyperparameters(group_size=4)).initialize()
    try:
        before = _params(actor)
        bad = _batch(0)
        bad["prox_logp"][0, 6] = float("nan")
        actor.compute_advantages(bad)
        stats = actor.ppo_update(bad)
        assert stats["update_skipped"] == 1.0
        assert not math.isfinite(stats["loss"]) or not math.isfinite(stats["grad_norm"])  # reported, not hidden
        after_bad = _params(actor)
        assert all(torch.equal(before[k], after_bad[k]) for k in before), "a NaN update reached the weights"

        good = _batch(1)
        actor.compute_advantages(good)
        stats = actor.ppo_update(good)
        assert stats["update_skipped"] == 0.0 and math.isfinite(stats["loss"])
        after_good = _params(actor)
        assert all(torch.isfinite(t).all() for t in after_good.values())
        assert any(not torch.equal(after_bad[k], after_good[k]) for k in before), "the finite batch did not train"
    finally:
        actor.destroy()
