"""Each loss variant learns off-policy, where its ratio math acts: the behaviour policy lags the
trainer by one version (a copy of the weights one update old samples every batch, with its own
log-probs as `logprobs`), and each batch is two optimizer steps (`ppo_n_minibatches=2`), so
behaviour, proximal and current policies all differ and ratios, clips, weights and masks move.

The task: 8 random prompts x 8 samples of 8 tokens from a random tiny model, rewarded by the
fraction of even token ids (tests/e2e/varied_reward.py: variance in every group from the
start). The mean batch reward must rise by a clear margin; with the policy-gradient sign
flipped every variant fails. Each variant also shows, in the step stats, that its mechanism's
statistic moved on these batches (its clip, truncation, mask or trust region hit some tokens
and not all), so the setup exercises what the variant is about.

What this test does not show is that a variant's formula is right. With its distinctive piece
taken out of the loss while its statistic is still computed (SAPO's gate, GSPO's sequence
ratio, CISPO's weight, DPPO's trust region, the TIS factor, the geometric or IcePop mask),
each variant still learns this task and passes here; only a removal that also zeroes the
statistic fails the statistic's check. Those removals fail the tests that check each formula
against a loop written from its definition: tests/algo (the pure functions) and
tests/train/test_actor_loss_binding.py (the same, set through `PPOActorConfig`, in the actor).

In process (the PPOActor and a transformers copy as the sampler, no server): a few seconds a
variant. Sampling is seeded; no timing is asserted.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from arealite.config import GenerationHyperparameters, MicroBatchSpec, OptimizerConfig, PPOActorConfig
from arealite.train.actor import PPOActor

torch.set_num_threads(2)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
PROMPTS, GROUP, PROMPT_LEN, NEW = 8, 8, 4, 8
STEPS, WINDOW, MARGIN = 10, 3, 0.1

# variant -> (actor settings, {stat: what must hold of its mean over the run})
VARIANTS = {
    "gspo": (
        dict(importance_sampling_level="sequence", loss_agg_mode="seq-mean-token-mean", eps_clip=0.003,
             eps_clip_higher=0.004, use_decoupled_loss=True),
        {"clip_frac": "some"},
    ),
    "cispo": (dict(policy_loss="cispo", eps_clip=1.0, eps_clip_higher=0.05, use_decoupled_loss=True),
              {"clip_frac": "some"}),
    "sapo": (dict(policy_loss="sapo", use_decoupled_loss=True), {"clip_frac": "absent"}),  # a gate, no clip
    "dppo_tv": (dict(policy_loss="dppo", trust_region="tv", trust_region_low=0.02, trust_region_high=0.02),
                {"trust_region_masked_frac": "some"}),
    "tis_token": (dict(rollout_is="token", rollout_is_cap=1.05), {"rollout_is_clipped_frac": "some"}),
    "rs_geometric": (dict(rollout_rs="geometric", rollout_rs_cap=1.1, rollout_rs_cap_low=0.9),
                      {"rollout_rs_masked_frac": "some"}),
    "icepop": (dict(use_decoupled_loss=True, rollout_rs="token", rollout_rs_cap=1.5, rollout_rs_cap_low=0.6),
               {"rollout_rs_masked_frac": "some"}),
}  # fmt: skip


def _sample(model, prompts: torch.Tensor, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences [B, PROMPT_LEN + NEW] and their token-aligned behaviour log-probs (0 on the prompt)."""
    ids = prompts
    logps = torch.zeros(prompts.shape[0], PROMPT_LEN + NEW)
    with torch.no_grad():
        for i in range(NEW):
            logits = model(input_ids=ids).logits[:, -1].float()
            lp = torch.log_softmax(logits, -1)
            tok = torch.multinomial(lp.exp(), 1, generator=g)
            logps[:, PROMPT_LEN + i] = lp.gather(1, tok).squeeze(1)
            ids = torch.cat([ids, tok], 1)
    return ids, logps


def _run(model_dir: str, settings: dict) -> tuple[list[float], list[dict]]:
    cfg = PPOActorConfig(path=model_dir, dtype="float32", ppo_n_minibatches=2, mb_spec=MicroBatchSpec(n_mbs=1),
                         optimizer=OptimizerConfig(lr=0.01), **settings)  # fmt: skip
    actor = PPOActor(cfg, GenerationHyperparameters(group_size=GROUP), total_train_steps=STEPS).initialize()
    sampler = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    g = torch.Generator().manual_seed(5)
    vocab = sampler.config.vocab_size
    rewards, stats = [], []
    for _ in range(STEPS):
        prompts = torch.randint(0, vocab, (PROMPTS, PROMPT_LEN), generator=g).repeat_interleave(GROUP, 0)
        ids, behav = _sample(sampler, prompts, g)
        loss_mask = torch.zeros_like(ids)
        loss_mask[:, PROMPT_LEN:] = 1
        reward = (ids[:, PROMPT_LEN:] % 2 == 0).float().mean(1)
        batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": loss_mask,
                 "logprobs": behav, "rewards": reward, "versions": torch.zeros_like(ids)}  # fmt: skip
        # the sampler takes the weights of this update's start only after the update: one version behind
        before = {n: t.clone() for n, t in actor.export_weights()}
        actor.compute_advantages(batch)
        stats.append(actor.ppo_update(batch))  # one dict per update, its minibatches merged
        assert not sampler.load_state_dict(before, strict=False).unexpected_keys
        rewards.append(float(reward.mean()))
    return rewards, stats


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_variant_learns_off_policy(variant: str, tiny_model_dir) -> None:
    settings, checks = VARIANTS[variant]
    rewards, stats = _run(tiny_model_dir, settings)
    first, last = sum(rewards[:WINDOW]) / WINDOW, sum(rewards[-WINDOW:]) / WINDOW
    print(f"{variant}: mean batch reward, first {WINDOW} steps {first:.3f}, last {WINDOW} steps {last:.3f}")
    assert last >= first + MARGIN, f"{variant} did not learn off-policy: {first:.3f} -> {last:.3f} ({rewards})"
    # the ratio to the proximal policy moved (second minibatch) and the behaviour weights differ from 1
    assert max(float(s["importance_ratio_max"]) for s in stats) > 1.0
    assert max(float(s["behav_imp_weight_max"]) for s in stats) > 1.0
    for key, want in checks.items():
        if want == "absent":  # no objective but this one reports no clip
            assert all(key not in s for s in stats), (variant, key)
            continue
        mean = sum(float(s[key]) for s in stats) / len(stats)  # a skipped mechanism: no such stat
        assert 0 < mean < 1, (variant, key, mean)  # it hit some of the tokens, not all
