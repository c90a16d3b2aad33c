"""From a batch's rewards (and critic values) to token-aligned advantages, as the config says.

In order, each step a call into `arealite.algo.advantages`: reward shaping and DAPO's overlong
penalty, masking truncated responses (`mask_no_eos_with_zero`), the group baseline
(`group_norm`), token-level GAE when there are critic values or a KL-in-reward penalty (else
the score is broadcast to the loss tokens), and `whiten_advantages`; or, with a turn-level
`adv_estimator`, each turn's credit from `arealite.algo.turns` in place of the score. What each
setting computes: docs/algorithms.md. Group size and generation budget come from `gconfig`.

A batch may hold several rows per sample (`chain` [B]: 0 on a sample's first row, 1, 2, ... on
the further chains of an episode whose histories were not token prefixes): groups are then
`gconfig.group_size` consecutive *episodes*, and every chain of an episode gets its advantages.
"""

from __future__ import annotations

import torch

from arealite.algo.advantages import broadcast_to_tokens, gae_packed, group_normalize, masked_whiten
from arealite.algo.losses import KL_ESTIMATORS
from arealite.algo.turns import credit_to_tokens, episode_index, episode_turns, turn_credit
from arealite.config import GenerationHyperparameters, PPOActorConfig
from arealite.data.packing import Batch, pack, unpack


def overlong_penalty(loss_mask: torch.Tensor, config: PPOActorConfig, max_new_tokens: int) -> torch.Tensor:
    """DAPO's soft overlong penalty [B] (<= 0): linear from 0 at (budget - overlong_tokens)
    generated tokens to -overlong_penalty_factor at the budget; 0 when the penalty is off.
    GRPOConfig checks at load that `overlong_tokens <= max_new_tokens`."""
    if not config.overlong_tokens:
        return torch.zeros(loss_mask.shape[0], device=loss_mask.device)
    free = max_new_tokens - config.overlong_tokens
    excess = (loss_mask.sum(-1).float() - free).clamp(min=0.0)
    return -config.overlong_penalty_factor * (excess / config.overlong_tokens).clamp(max=1.0)


def shaped_rewards(
    rewards: torch.Tensor, loss_mask: torch.Tensor, config: PPOActorConfig, max_new_tokens: int
) -> torch.Tensor:
    """Scaled, biased, clipped rewards [B] with the overlong penalty (budget `max_new_tokens`),
    added before or after the shaping as `overlong_penalty_stage` says."""
    penalty = overlong_penalty(loss_mask, config, max_new_tokens).to(rewards.device)
    r = rewards.float()
    if config.overlong_penalty_stage == "before_shaping":
        r = r + penalty
    r = _shaped(r, config)
    if config.overlong_penalty_stage == "after_shaping":
        r = r + penalty
    return r


def _shaped(r: torch.Tensor, config: PPOActorConfig) -> torch.Tensor:
    """`reward_bias`, `reward_scaling` and `reward_clip` applied to rewards of any shape."""
    return ((r + config.reward_bias) * config.reward_scaling).clamp(-config.reward_clip, config.reward_clip)


def estimate_advantages(
    batch: Batch, config: PPOActorConfig, gconfig: GenerationHyperparameters
) -> dict[str, torch.Tensor]:
    """`{"advantages": [B, T]}` (plus `"returns"` on the token-level path); zero off the loss mask.

    With `mask_no_eos_with_zero` also `"loss_mask"`: the batch's, without truncated responses.
    """
    loss_mask = batch["loss_mask"]
    score = shaped_rewards(batch["rewards"], loss_mask, config, gconfig.max_new_tokens)  # [B]
    out: dict[str, torch.Tensor] = {}
    if config.mask_no_eos_with_zero:
        if "truncated" not in batch:
            raise KeyError(
                "actor.mask_no_eos_with_zero needs batch['truncated'] [B] (RLVRWorkflow and MultiTurnWorkflow set it)"
            )
        cut = batch["truncated"].to(score.device).bool()
        if config.truncated_baseline == "zero":
            score = torch.where(cut, torch.zeros_like(score), score)
        loss_mask = out["loss_mask"] = loss_mask * ~cut.to(loss_mask.device)[:, None]
        batch = {**batch, "loss_mask": loss_mask}
    episode = episode_index(batch.get("chain"), score.shape[0], score.device)
    n_episodes = int(episode[-1]) + 1 if episode.numel() else 0
    chained = n_episodes != score.shape[0]
    token_level = "values" in batch or (config.kl_ctl > 0 and config.kl_in_reward)
    if chained and token_level:
        raise ValueError(
            "episodes of several rows (batch['chain'] > 0: histories that were not token prefixes) do not support "
            "token-level returns (a critic or kl_in_reward); use a critic-free estimator with kl_in_reward=false"
        )
    if config.adv_estimator != "sequence":
        if token_level:
            raise ValueError(
                f"actor.adv_estimator={config.adv_estimator} is critic-free; the batch has critic values. Drop the "
                "critic or use adv_estimator=sequence"
            )
        adv = _turn_level(batch, episode, n_episodes, config, gconfig)
    else:
        if chained:  # one score per episode: its last row's (the chain with its final turn)
            last = torch.zeros(n_episodes, dtype=torch.long, device=score.device)
            last.scatter_reduce_(0, episode, torch.arange(score.shape[0], device=score.device), reduce="amax")
            score = score[last]
        if config.group_norm != "none":
            G = gconfig.group_size
            if score.shape[0] % G != 0:
                raise ValueError(
                    f"batch of {score.shape[0]} samples is not a whole number of groups of gconfig.group_size={G}; "
                    "keep every group's samples together on one rank"
                )
            score = group_normalize(score, G, mode=config.group_norm, eps=config.adv_eps, std=config.group_std)
        score = score[episode] if chained else score
        if token_level:
            out.update(_token_level(batch, score, config))
            adv = out["advantages"]
        else:
            adv = broadcast_to_tokens(score, loss_mask)
    mask = loss_mask.bool()
    if config.whiten_advantages:
        adv = masked_whiten(adv, mask, config.adv_eps)
    out["advantages"] = torch.where(mask, adv, torch.zeros_like(adv)).float()
    return out


def _turn_level(
    batch: Batch, episode: torch.Tensor, n_episodes: int, config: PPOActorConfig, gconfig: GenerationHyperparameters
) -> torch.Tensor:
    """Per-token turn credit [B, T] (`arealite.algo.turns`), each turn's reward shaped as the score is."""
    for key in ("turn_ids", "turn_rewards"):
        if key not in batch:
            raise KeyError(
                f"actor.adv_estimator={config.adv_estimator} needs batch[{key!r}] [B, T] (MultiTurnWorkflow, "
                "ToolUseWorkflow, ChatClient.trajectory and AgentProgramWorkflow set it); or use adv_estimator=sequence"
            )
    turn_ids = batch["turn_ids"].to(episode.device)
    rewards, n_turns = episode_turns(turn_ids, batch["turn_rewards"].to(episode.device), episode, n_episodes)
    credit = turn_credit(_shaped(rewards, config), n_turns, gconfig.group_size, config.adv_estimator, config.gamma)
    return credit_to_tokens(credit, episode, turn_ids)


def _token_level(batch: Batch, score: torch.Tensor, config: PPOActorConfig) -> dict[str, torch.Tensor]:
    keys = ["attention_mask", "loss_mask"] + [k for k in ("values", "logprobs", "prox_logp", "ref_logp") if k in batch]
    packed = pack({k: batch[k] for k in keys})
    cu, mask = packed["cu_seqlens"], packed["loss_mask"].bool()
    rewards = torch.zeros(mask.shape[0], dtype=torch.float32, device=mask.device)
    last = _last_loss_token(mask, cu)  # [B], -1 where a sequence trains on no token
    has = last >= 0
    rewards[last[has]] += score.to(mask.device)[has].float()
    if config.kl_ctl > 0 and config.kl_in_reward:
        if "ref_logp" not in packed:
            raise KeyError("actor.kl_in_reward with kl_ctl > 0 needs batch['ref_logp'] (ref.compute_logp(batch))")
        logp = packed.get("prox_logp", packed["logprobs"]).float()
        kl = KL_ESTIMATORS[config.kl_estimator](logp, packed["ref_logp"].float())
        rewards -= config.kl_ctl * kl * mask
    values = packed["values"].float() if "values" in packed else torch.zeros_like(rewards)
    adv, ret = gae_packed(rewards, values, mask, cu, config.gamma, config.lam)
    T = batch["loss_mask"].shape[1]
    return {"advantages": unpack(adv, cu, T), "returns": unpack(ret, cu, T)}


def _last_loss_token(mask: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Packed index of each sequence's last loss token, -1 if it has none: [B] long."""
    B = len(cu_seqlens) - 1
    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    dev = mask.device
    seg = torch.repeat_interleave(torch.arange(B, device=dev), lens.to(dev))
    idx = torch.where(mask, torch.arange(mask.shape[0], device=dev), torch.full_like(seg, -1))
    return torch.full((B,), -1, dtype=torch.long, device=dev).scatter_reduce(0, seg, idx, reduce="amax")
