"""Where `prox_logp` comes from in `ppo_update`, and that every source gives the same update.

A one-optimizer-step update takes the old policy's log-probs from its own loss forward; it
must equal the update made with an explicit `compute_logp` pass first, cost exactly one
forward per micro-batch, and several optimizer steps must still recompute it up front.
"""

from __future__ import annotations

import pytest
import torch

from arealite.config import GenerationHyperparameters, MicroBatchSpec, OptimizerConfig, PPOActorConfig
from arealite.train.actor import PPOActor
from tests.tolerance import assert_close, close
from tests.train.helpers import make_batch

torch.set_num_threads(2)
pytestmark = pytest.mark.timeout(120)
LENS = [9, 7, 8, 6, 10, 5, 8, 7]
STAT_KEYS = ("pg_loss", "clip_frac", "importance_ratio")
ROUNDING_N = sum(LENS) * 64  # gradients sum over every token through 64-long dot products (hidden size)


def _actor(model_dir: str, **overrides) -> PPOActor:
    cfg = dict(path=model_dir, dtype="float32", optimizer=OptimizerConfig(lr=1e-3), mb_spec=MicroBatchSpec(n_mbs=2))
    return PPOActor(PPOActorConfig(**{**cfg, **overrides}), GenerationHyperparameters(group_size=2)).initialize()


def _batch(actor: PPOActor, seed: int) -> dict[str, torch.Tensor]:
    """Behaviour logprobs off the current policy by up to ±0.4 nats, so importance weights matter."""
    batch = make_batch(LENS, seed=seed)
    g = torch.Generator().manual_seed(seed)
    batch["rewards"] = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0])
    noise = (torch.rand(batch["loss_mask"].shape, generator=g) - 0.5) * 0.8
    batch["logprobs"] = (actor.compute_logp(batch) + noise) * batch["loss_mask"]
    return batch


def _weights(actor: PPOActor) -> dict[str, torch.Tensor]:
    return {name: t.clone() for name, t in actor.export_weights()}


def _count_forwards(actor: PPOActor) -> list[int]:
    calls = [0]
    actor.model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def _assert_same_update(s_f, s_e, initial, w_fused, w_explicit, keys=STAT_KEYS):
    """Same stats of the update and same moved weights, up to fp32 rounding."""
    for key in keys:
        assert close(s_f[key], s_e[key], n=ROUNDING_N), (key, s_f[key], s_e[key])
    moved = max((w_fused[n] - w0).abs().max().item() for n, w0 in initial.items())
    assert moved > 1e-4, "the update did not move the weights"
    for name in w_fused:
        assert_close(w_fused[name], w_explicit[name], n=ROUNDING_N, msg=name)


@pytest.mark.parametrize("decoupled", [False, True])
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_fused_prox_logp_makes_the_explicit_update_with_one_forward(tiny_model_dir, agg, decoupled):
    fused_actor = _actor(tiny_model_dir, loss_agg_mode=agg, use_decoupled_loss=decoupled)
    explicit_actor = _actor(tiny_model_dir, loss_agg_mode=agg, use_decoupled_loss=decoupled)
    initial = _weights(fused_actor)
    batch = _batch(fused_actor, seed=31)

    explicit = dict(batch, prox_logp=explicit_actor.compute_logp(batch))
    explicit_actor.compute_advantages(explicit)
    stats_explicit = explicit_actor.ppo_update(explicit)

    calls = _count_forwards(fused_actor)
    fused_actor.compute_advantages(batch)
    stats_fused = fused_actor.ppo_update(batch)
    assert calls[0] == 2, f"{calls[0]} forwards for 2 micro-batches"  # mb_spec n_mbs=2, no logp pass
    assert "prox_logp" not in batch  # the caller's batch is not changed behind its back

    _assert_same_update(stats_fused, stats_explicit, initial, _weights(fused_actor), _weights(explicit_actor))
    mismatch = stats_fused["logprob_mismatch"]
    assert 0.1 < mismatch < 0.3, mismatch  # |behaviour - prox| really is the injected noise
    if decoupled:
        assert close(stats_fused["behav_imp_weight"], stats_explicit["behav_imp_weight"], n=ROUNDING_N)
        assert stats_fused["behav_imp_weight_max"] > 1.3  # the importance weight is in play


def test_several_minibatches_recompute_prox_logp_before_the_first(tiny_model_dir):
    auto_actor = _actor(tiny_model_dir, ppo_n_minibatches=2, use_decoupled_loss=True)
    explicit_actor = _actor(tiny_model_dir, ppo_n_minibatches=2, use_decoupled_loss=True)
    initial = _weights(auto_actor)
    batch = _batch(auto_actor, seed=32)

    explicit = dict(batch, prox_logp=explicit_actor.compute_logp(batch))
    explicit_actor.compute_advantages(explicit)
    stats_explicit = explicit_actor.ppo_update(explicit)

    calls = _count_forwards(auto_actor)
    auto_actor.compute_advantages(batch)
    stats_auto = auto_actor.ppo_update(batch)
    assert calls[0] == 2 + 2 * 2  # the logp pass (2 micro-batches), then 2 minibatches of 2 micro-batches
    keys = STAT_KEYS + ("importance_ratio_max", "importance_ratio_min", "behav_imp_weight")
    _assert_same_update(stats_auto, stats_explicit, initial, _weights(auto_actor), _weights(explicit_actor), keys)
    # The first step's ratio to the pre-update policy is 1; the second sees moved weights, so the
    # update's ratios spread (a prox_logp taken from each step's own forward would keep them all 1).
    assert stats_auto["importance_ratio_max"] - stats_auto["importance_ratio_min"] > 1e-4


def test_kl_in_reward_advantages_recompute_prox_logp_once(tiny_model_dir):
    actor = _actor(tiny_model_dir, kl_ctl=0.5, kl_in_reward=True, group_norm="none")
    batch = _batch(actor, seed=33)
    batch["ref_logp"] = batch["logprobs"] - 0.3 * batch["loss_mask"]
    want = actor.compute_logp(batch)
    explicit = dict(batch, prox_logp=want)
    actor.compute_advantages(explicit)

    calls = _count_forwards(actor)
    actor.compute_advantages(batch)
    assert calls[0] == 2 and torch.equal(batch["prox_logp"], want)  # left in the batch for the update
    torch.testing.assert_close(batch["advantages"], explicit["advantages"], atol=0, rtol=0)
    actor.ppo_update(batch)
    assert calls[0] == 2 + 2  # the update reuses it: no further logp pass


def test_without_recompute_the_behaviour_logprobs_are_the_old_policy(tiny_model_dir):
    actor = _actor(tiny_model_dir, recompute_logprob=False)
    batch = _batch(actor, seed=34)
    actor.compute_advantages(batch)
    stats = actor.ppo_update(batch)
    assert stats["logprob_mismatch"] == 0.0 and stats["importance_ratio_max"] > 1.05  # ratio to `logprobs`
