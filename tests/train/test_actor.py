"""PPOActor on one process: logprob alignment, advantages against naive loops, the update."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from arealite.config import ConfigError, GenerationHyperparameters, MicroBatchSpec, OptimizerConfig, PPOActorConfig
from arealite.train.actor import PPOActor
from arealite.train.advantage_estimation import estimate_advantages
from tests.tolerance import EPS32, assert_close, close, magnitude
from tests.train.helpers import make_batch

torch.set_num_threads(2)
HIDDEN = 64  # the tiny model's hidden size: the longest dot product behind a logit


@pytest.fixture(scope="module")
def actor(tiny_model_dir) -> PPOActor:
    cfg = PPOActorConfig(path=tiny_model_dir, dtype="float32", optimizer=OptimizerConfig(lr=1e-3),
                         mb_spec=MicroBatchSpec(n_mbs=2))  # fmt: skip
    return PPOActor(cfg, GenerationHyperparameters(group_size=2)).initialize()


def test_compute_logp_is_token_aligned(actor, tiny_model_dir):
    batch = make_batch([10, 6, 8, 4], seed=5)
    temp = 0.7
    logp = actor.compute_logp(batch, temperature=temp)
    ref = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    want = torch.zeros_like(logp)
    for b in range(4):
        ids = batch["input_ids"][b]
        n = int(batch["attention_mask"][b].sum())
        logits = ref(input_ids=ids[None, :n]).logits[0] / temp
        for t in range(1, n):
            if batch["loss_mask"][b, t]:
                want[b, t] = torch.log_softmax(logits[t - 1], -1)[ids[t]].detach()
        assert (logp[b, n:] == 0).all()
    # a one-token shift moves a logprob by ~0.1 here; rounding by ~1e-6
    assert_close(logp, want, n=HIDDEN)


def _naive_grpo(rewards, loss_mask, G, mode, whiten=False, eps=1e-6):
    out = torch.zeros(loss_mask.shape, dtype=torch.float64)
    for b in range(len(rewards)):
        grp = [rewards[i].item() for i in range(b // G * G, b // G * G + G)]
        mean = sum(grp) / G
        if mode == "mean_std":  # the sample std (actor.group_std's default)
            std = (sum((x - mean) ** 2 for x in grp) / (G - 1)) ** 0.5
            a = (rewards[b].item() - mean) / (std + eps)
        elif mode == "mean":
            a = rewards[b].item() - mean
        elif mode == "rloo":
            a = rewards[b].item() - (sum(grp) - rewards[b].item()) / (G - 1)
        else:  # none
            a = rewards[b].item()
        for t in range(loss_mask.shape[1]):
            out[b, t] = a if loss_mask[b, t] else 0.0
    if whiten:  # over every loss token of the batch: population variance, eps inside the root
        toks = [out[b, t].item() for b in range(len(rewards)) for t in range(loss_mask.shape[1]) if loss_mask[b, t]]
        m = sum(toks) / len(toks)
        var = sum((x - m) ** 2 for x in toks) / len(toks)
        for b in range(len(rewards)):
            for t in range(loss_mask.shape[1]):
                out[b, t] = (out[b, t] - m) / (var + eps) ** 0.5 if loss_mask[b, t] else 0.0
    return out


def _min_group_std(rewards, G):
    """The smallest group std: normalization amplifies the inputs' rounding by 1 / std."""
    std = rewards.double().view(-1, G).std(1)
    return float(std[std > 0].min())


@pytest.mark.parametrize("G", [2, 3, 4])
@pytest.mark.parametrize("mode", ["mean_std", "mean", "rloo", "none"])
@pytest.mark.parametrize("whiten", [False, True])
def test_group_advantages_match_naive(G, mode, whiten):
    # every group_norm x whiten_advantages combination, the names config and algo/ share
    g = torch.Generator().manual_seed(G)
    batch = make_batch([7, 5, 9, 6, 8, 4, 7, 9, 5, 6, 8, 7][: 3 * G], seed=G)
    batch["rewards"] = torch.randn(3 * G, generator=g)
    batch["loss_mask"][0, 4] = 0  # a hole in the mask
    cfg = PPOActorConfig(path="x", group_norm=mode, whiten_advantages=whiten, reward_clip=100.0)
    adv = estimate_advantages(batch, cfg, GenerationHyperparameters(group_size=G))["advantages"]
    want = _naive_grpo(batch["rewards"], batch["loss_mask"], G, mode, whiten)
    scale = magnitude(batch["rewards"]) / (_min_group_std(batch["rewards"], G) if mode == "mean_std" else 1.0)
    n = G
    if whiten:  # whitening divides the group stage's rounding by the advantages' std, then adds its own
        pre = _naive_grpo(batch["rewards"], batch["loss_mask"], G, mode)[batch["loss_mask"].bool()]
        scale = scale / float(pre.std(unbiased=False)) + magnitude(want)
        n += int(batch["loss_mask"].sum())  # the whitening sums over every loss token
    assert_close(adv, want.float(), n=n, scale=scale)


def test_reward_shaping_and_overlong_penalty():
    batch = make_batch([10, 10], prompt_len=2, seed=7)  # 8 generated tokens each
    batch["loss_mask"][1, 6:] = 0  # second response: 4 generated tokens
    batch["rewards"] = torch.tensor([3.0, -1.0])
    cfg = PPOActorConfig(path="x", group_norm="none", reward_bias=-0.5, reward_scaling=2.0, reward_clip=4.0,
                         overlong_tokens=4, overlong_penalty_factor=1.0)  # fmt: skip
    adv = estimate_advantages(batch, cfg, GenerationHyperparameters(group_size=1, max_new_tokens=8))["advantages"]
    # row 0: clip((3-0.5)*2)=4, 8 tokens = budget -> penalty 1 ; row 1: (-1.5)*2=-3, 4 tokens -> no penalty
    assert_close(adv[0][batch["loss_mask"][0].bool()], torch.tensor(3.0).expand(8))
    assert_close(adv[1][batch["loss_mask"][1].bool()], torch.tensor(-3.0).expand(4))


def test_gae_with_values_and_kl_in_reward_matches_naive():
    batch = make_batch([9, 7, 8], prompt_len=3, seed=8)
    g = torch.Generator().manual_seed(8)
    batch["values"] = torch.randn(3, 9, generator=g) * batch["attention_mask"]
    batch["ref_logp"] = batch["logprobs"] + 0.1 * torch.randn(3, 9, generator=g) * batch["loss_mask"]
    cfg = PPOActorConfig(path="x", group_norm="none", kl_ctl=0.5, kl_in_reward=True, kl_estimator="k1",
                         gamma=0.9, lam=0.8, reward_clip=100.0)  # fmt: skip
    out = estimate_advantages(batch, cfg, GenerationHyperparameters(group_size=1))
    want_adv, want_ret = torch.zeros(3, 9, dtype=torch.float64), torch.zeros(3, 9, dtype=torch.float64)
    for b in range(3):
        toks = [t for t in range(9) if batch["loss_mask"][b, t]]
        last, nxt_v, nxt_a = toks[-1], 0.0, 0.0
        for t in reversed(toks):
            r = -0.5 * (batch["logprobs"][b, t] - batch["ref_logp"][b, t]).item()
            r += batch["rewards"][b].item() if t == last else 0.0
            v = batch["values"][b, t].item()
            nxt_a = r + 0.9 * nxt_v - v + 0.9 * 0.8 * nxt_a
            nxt_v = v
            want_adv[b, t], want_ret[b, t] = nxt_a, nxt_a + v
    mask = batch["loss_mask"].bool()
    assert_close(out["advantages"][mask], want_adv[mask], n=9)  # fp32 scans over <= 9 tokens
    assert_close(out["returns"][mask], want_ret[mask], n=9)


def test_batch_whitening_modes():
    batch = make_batch([9, 7, 8, 6], seed=9)
    batch["rewards"] = torch.tensor([1.0, 0.0, 3.0, 1.0])
    cfg = PPOActorConfig(path="x", group_norm="mean", whiten_advantages=True)  # REINFORCE++-baseline
    adv = estimate_advantages(batch, cfg, GenerationHyperparameters(group_size=2))["advantages"]
    sel = adv[batch["loss_mask"].bool()].double()
    # mean and variance over sel.numel() fp32 values, relative to their magnitude
    assert close(sel.mean().item(), 0.0, n=sel.numel(), scale=magnitude(sel))
    assert close(sel.std(unbiased=False).item(), 1.0, n=sel.numel())


def test_ppo_update_raises_advantaged_logprobs(actor):
    batch = make_batch([9, 7, 8, 6], seed=10)
    batch["rewards"] = torch.tensor([1.0, 0.0, 0.0, 1.0])
    batch["logprobs"] = actor.compute_logp(batch)
    actor.compute_advantages(batch)
    before = actor.compute_logp(batch)
    stats = actor.ppo_update(batch)
    after = actor.compute_logp(batch)
    # the logprobs came from these very weights: only rounding separates the two forwards
    bound = 8 * EPS32 * HIDDEN**0.5 * magnitude(batch["logprobs"])
    assert stats["logprob_mismatch"] <= bound and abs(stats["behav_imp_weight"] - 1) <= bound
    mask = batch["loss_mask"].bool()
    delta = ((after - before) * mask).sum(-1) / mask.sum(-1)
    assert delta[0] > 0 and delta[3] > 0 and delta[1] < 0 and delta[2] < 0


def test_ppo_update_errors_name_the_fix(actor):
    batch = make_batch([6, 6], seed=11)
    with pytest.raises(KeyError, match="compute_advantages"):
        actor.ppo_update(batch)
    with pytest.raises(ConfigError, match="recompute_logprob"):
        PPOActorConfig(use_decoupled_loss=True, recompute_logprob=False)


@pytest.mark.parametrize("entropy_coef", [0.0, 0.1])
def test_actor_loss_entropy_is_token_aligned(entropy_coef):
    from arealite.data.packing import pack
    from arealite.train.actor import actor_loss

    batch = make_batch([7, 5, 6], seed=18, vocab=40)
    batch["prox_logp"] = batch["logprobs"]
    batch["advantages"] = torch.zeros(3, 7)
    mb = pack(batch)
    logits = torch.randn(int(mb["cu_seqlens"][-1]), 40, generator=torch.Generator().manual_seed(18), requires_grad=True)
    cfg = PPOActorConfig(path="x", entropy_coef=entropy_coef)
    loss, stats = actor_loss(logits, mb, cfg, temperature=0.8)
    ents = []
    for b in range(3):
        start = int(mb["cu_seqlens"][b])
        for t in range(int(batch["attention_mask"][b].sum())):
            if batch["loss_mask"][b, t]:
                p = torch.softmax(logits[start + t - 1].detach() / 0.8, -1)
                ents.append(float(-(p * p.log()).sum()))
    assert close(stats["entropy"].item(), sum(ents) / len(ents), n=40)  # softmax sums over 40 logits
    loss.backward()  # advantages are 0: only the entropy bonus moves the logits
    assert (logits.grad.abs().sum() > 0) == (entropy_coef > 0)


def test_advantage_stats_name_the_backend_and_time(actor):
    batch = make_batch([9, 7, 8, 6], seed=19)
    batch["logprobs"] = actor.compute_logp(batch)
    want = estimate_advantages(dict(batch), actor.config, actor.gconfig)["advantages"]
    stats = actor.compute_advantages(batch)
    assert batch["advantages"].device == batch["loss_mask"].device
    assert_close(batch["advantages"], want, n=2)
    on_cuda = actor.device.type == "cuda"
    assert stats["advantages/backend_triton"] == float(on_cuda) and stats["time/advantages"] > 0
    assert "time/advantages" not in actor.ppo_update(batch)  # the update's stats are its own


def test_batch_stats_are_the_same_before_and_after_compute_advantages(actor):
    """compute_advantages cuts truncated responses from loss_mask but keeps what the statistics read."""
    from arealite.stats.batch import batch_stats
    from arealite.stats.samples import sample_rows
    from arealite.stats.tracker import StatsTracker

    batch = make_batch([9, 7, 8, 6], seed=23)
    batch["truncated"] = torch.tensor([False, True, False, True])
    batch["versions"] = torch.where(batch["loss_mask"].bool(), 0, -1)
    before = batch_stats(StatsTracker(), batch, version=1)
    workflow_mask = batch["loss_mask"].clone()
    cut = PPOActor(PPOActorConfig(path="x", mask_no_eos_with_zero=True), GenerationHyperparameters(group_size=2))
    cut.device = torch.device("cpu")  # estimation only: no model needed
    cut.compute_advantages(batch)
    assert not batch["loss_mask"][1].any() and torch.equal(batch["response_mask"], workflow_mask)
    assert batch_stats(StatsTracker(), batch, version=1) == before
    shown = sample_rows(batch, tokenizer=type("T", (), {"decode": staticmethod(lambda ids, **_: len(ids))}))
    assert [row["completion"] for row in shown] == [int(n) for n in workflow_mask.sum(-1)]
