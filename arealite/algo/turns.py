"""Turn-level credit for multi-turn episodes, critic-free (docs/algorithms.md, "Turn-level credit").

An episode (one of a group's G samples) takes turns k = 0 .. n-1, each with a reward r_k; its
turns may be spread over several rows ("chains", when a request's history was not a token
prefix of the previous one). The batch says which tokens belong to which turn:

    turn_ids      [B, T] long   the episode's turn index of each model token, -1 elsewhere
    turn_rewards  [B, T] float  the turn's reward on its last model token, 0 elsewhere
    chain         [B]    long   (optional) 0 on an episode's first row, 1, 2, ... on its further rows

Each turn's credit is its reward-to-go minus a baseline: `turn_loo`, the mean reward-to-go of
the group's *other* samples that reached the turn (unbiased with variable turn counts), or
`turn_index`, MT-GRPO's per-turn-index group mean accumulated from the turn on (biased when the
policy chooses how many turns to take; offered to compare). Derivation: docs/algorithms.md.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["TURN_ESTIMATORS", "episode_index", "episode_turns", "reward_to_go", "turn_credit", "credit_to_tokens"]

TURN_ESTIMATORS = ("turn_loo", "turn_index")


def episode_index(chain: Tensor | None, n_rows: int, device: torch.device | None = None) -> Tensor:
    """The episode of every row [B] long: rows with chain > 0 belong to the episode of the row above."""
    if chain is None:
        return torch.arange(n_rows, device=device)
    if chain.dim() != 1 or chain.numel() != n_rows:
        raise ValueError(f"chain must be [B]={n_rows}, got shape {tuple(chain.shape)}")
    if n_rows and int(chain[0]) != 0:
        raise ValueError(
            f"chain[0]={int(chain[0])}: a batch must start with an episode's first row (chain 0); keep each "
            "episode's rows together, first row first"
        )
    return torch.cumsum((chain == 0).long(), 0) - 1


def episode_turns(turn_ids: Tensor, turn_rewards: Tensor, episode: Tensor, n_episodes: int) -> tuple[Tensor, Tensor]:
    """(rewards [E, K] float64, n_turns [E] long): each episode's turn rewards, summed over its rows'
    tokens, and its number of turns (1 + its largest turn index; 0 with no model token)."""
    if turn_ids.shape != turn_rewards.shape or turn_ids.dim() != 2 or turn_ids.shape[0] != episode.numel():
        raise ValueError(
            f"turn_ids {tuple(turn_ids.shape)} and turn_rewards {tuple(turn_rewards.shape)} must both be [B, T] "
            f"with B={episode.numel()}"
        )
    ids = turn_ids.long()
    k = max(int(ids.max()) + 1, 1) if ids.numel() else 1
    has = ids >= 0
    rows = episode[:, None].expand_as(ids)
    flat = (rows * k + ids.clamp_min(0))[has]
    rewards = torch.zeros(n_episodes * k, dtype=torch.float64, device=ids.device)
    rewards.index_add_(0, flat, turn_rewards.double()[has])
    row_turns = (ids.max(dim=1).values + 1).clamp_min(0)  # [B]
    n_turns = torch.zeros(n_episodes, dtype=torch.long, device=ids.device)
    n_turns.scatter_reduce_(0, episode, row_turns, reduce="amax")
    return rewards.view(n_episodes, k), n_turns


def reward_to_go(rewards: Tensor, gamma: float = 1.0) -> Tensor:
    """R[:, k] = sum_{j >= k} gamma^(j-k) rewards[:, j], over [E, K]."""
    out = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for k in range(rewards.shape[1] - 1, -1, -1):
        running = rewards[:, k] + gamma * running
        out[:, k] = running
    return out


def turn_credit(
    rewards: Tensor, n_turns: Tensor, group_size: int, mode: str = "turn_loo", gamma: float = 1.0
) -> Tensor:
    """Credit [E, K] of every turn of every episode (0 past an episode's last turn).

    rewards [E, K], n_turns [E]; episodes in groups of `group_size` consecutive ones."""
    if mode not in TURN_ESTIMATORS:
        raise ValueError(f"unknown turn estimator {mode!r}; use one of {TURN_ESTIMATORS}")
    E, K = rewards.shape
    if group_size < 1 or E % group_size:
        raise ValueError(
            f"{E} episodes are not a whole number of groups of gconfig.group_size={group_size}; keep every group's "
            "episodes together (a row with chain > 0 continues the episode above it, it is not a new sample)"
        )
    reached = torch.arange(K, device=rewards.device)[None, :] < n_turns[:, None]  # [E, K]
    r = torch.where(reached, rewards, 0.0)
    ret = reward_to_go(r, gamma)
    g = group_size
    if mode == "turn_loo":
        R, hit = ret.view(-1, g, K), reached.view(-1, g, K).to(ret.dtype)
        others = (R * hit).sum(1, keepdim=True) - R * hit
        count = hit.sum(1, keepdim=True) - hit
        base = torch.where(count > 0, others / count.clamp_min(1), 0.0).view(E, K)
    else:
        hit = reached.view(-1, g, K).to(r.dtype)
        mean = (r.view(-1, g, K) * hit).sum(1, keepdim=True) / hit.sum(1, keepdim=True).clamp_min(1)
        base = reward_to_go(torch.where(reached, mean.expand(-1, g, K).reshape(E, K), 0.0), gamma)
    return torch.where(reached, ret - base, 0.0)


def credit_to_tokens(credit: Tensor, episode: Tensor, turn_ids: Tensor) -> Tensor:
    """Each model token's turn credit [B, T] float32 (0 where turn_ids < 0)."""
    ids = turn_ids.long()
    has = ids >= 0
    per_row = credit[episode]  # [B, K]
    picked = per_row.gather(1, ids.clamp(0, credit.shape[1] - 1))
    return torch.where(has, picked, 0.0).float()
