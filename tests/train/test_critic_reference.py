"""PPOCritic (value head, GAE, clipped value loss) and the frozen ReferenceModel (KL)."""

from __future__ import annotations

import pytest
import torch

from arealite.config import (
    GenerationHyperparameters,
    MicroBatchSpec,
    OptimizerConfig,
    PPOActorConfig,
    PPOCriticConfig,
    TrainEngineConfig,
)
from arealite.train import PPOActor, PPOCritic, ReferenceModel
from tests.tolerance import assert_close, magnitude, tolerance
from tests.train.helpers import make_batch

HIDDEN = 64  # the tiny model's hidden size: the longest dot product behind an output

torch.set_num_threads(2)


@pytest.fixture(scope="module")
def critic(tiny_model_dir) -> PPOCritic:
    cfg = PPOCriticConfig(
        path=tiny_model_dir, dtype="float32", optimizer=OptimizerConfig(lr=1e-2), mb_spec=MicroBatchSpec(n_mbs=2)
    )
    return PPOCritic(cfg).initialize()


def test_values_are_token_aligned(critic):
    batch = make_batch([9, 5, 7], seed=13)
    values = critic.compute_values(batch)
    for b in range(3):
        n = int(batch["attention_mask"][b].sum())
        scores = critic.model(input_ids=batch["input_ids"][b : b + 1, :n]).logits[0, :, 0]
        assert values[b, 0] == 0 and (values[b, n:] == 0).all()
        assert_close(values[b, 1:n], scores[: n - 1], n=HIDDEN)


def test_gae_advantages_and_critic_update_fit_returns(critic, tiny_model_dir):
    batch = make_batch([9, 5, 7, 8], seed=14)
    batch["rewards"] = torch.tensor([1.0, -1.0, 0.5, 0.0])
    actor_cfg = PPOActorConfig(path=tiny_model_dir, dtype="float32", group_norm="none", gamma=1.0, lam=0.95)
    from arealite.train.advantage_estimation import estimate_advantages

    losses = []
    for _ in range(6):
        batch["values"] = critic.compute_values(batch)
        batch.update(estimate_advantages(batch, actor_cfg, GenerationHyperparameters(group_size=1)))
        losses.append(critic.ppo_update(batch)["value_loss"])
    assert "returns" in batch and losses[-1] < 0.5 * losses[0]


def test_critic_errors_name_the_missing_key(critic):
    with pytest.raises(KeyError, match="compute_values"):
        critic.ppo_update(make_batch([5, 6]))


def test_more_minibatches_than_sequences_is_refused_naming_the_setting(critic):
    # actor and critic share FSDPEngine.train_minibatches; each names its own config key
    batch = make_batch([5, 6], seed=16)
    batch["values"] = batch["returns"] = torch.zeros_like(batch["loss_mask"], dtype=torch.float32)
    with pytest.raises(ValueError, match=r"2 sequences, fewer than critic.ppo_n_minibatches=3"):
        critic.train_minibatches(batch, None, None, 3, "critic.ppo_n_minibatches")
    critic.config.ppo_n_minibatches = 3
    try:
        with pytest.raises(ValueError, match=r"critic.ppo_n_minibatches=3"):
            critic.ppo_update(batch)
    finally:
        critic.config.ppo_n_minibatches = 1


def test_reference_is_frozen_and_feeds_the_kl_loss(tiny_model_dir):
    ref = ReferenceModel(TrainEngineConfig(path=tiny_model_dir, dtype="float32")).initialize()
    assert ref.optimizer is None
    cfg = PPOActorConfig(path=tiny_model_dir, dtype="float32", kl_ctl=0.5, kl_estimator="k3",
                         optimizer=OptimizerConfig(lr=1e-2))  # fmt: skip
    actor = PPOActor(cfg, GenerationHyperparameters(group_size=2)).initialize()
    batch = make_batch([9, 7, 8, 6], seed=15)
    batch["rewards"] = torch.tensor([1.0, 0.0, 0.0, 1.0])
    ref_logp = ref.compute_logp(batch)
    assert_close(actor.compute_logp(batch), ref_logp, n=HIDDEN)
    batch["logprobs"] = batch["prox_logp"] = actor.compute_logp(batch)
    batch["ref_logp"] = ref_logp
    actor.compute_advantages(batch)
    first = actor.ppo_update(batch)
    second = actor.ppo_update(batch)
    rounding = tolerance(torch.float32, HIDDEN) * magnitude(ref_logp)  # |logp - ref_logp| before any step
    assert 0.0 <= first["kl"] <= rounding**2 and second["kl"] > 1e-6  # k3 ~ diff^2 / 2; >= 0 once the policy moved
    assert_close(ref.compute_logp(batch), ref_logp, n=1)  # frozen: the same weights, the same kernels
    with pytest.raises(RuntimeError, match="frozen"):
        ref.train_batch(batch, None, None)
