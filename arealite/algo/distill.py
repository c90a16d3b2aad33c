"""On-policy distillation's advantage: the teacher's per-token verdict on the student's samples.

The student sampled every loss token from its behaviour policy; `teacher_logp - logprobs` at
that token is minus the single-sample estimate of the reverse KL(student || teacher) there, so
a policy gradient on it as the advantage lowers the reverse KL (on-policy distillation, as in
the Thinking Machines recipe: per token, no discounting over the tokens that follow). It is
mixed with the verifiable reward's advantage by a weight and goes through the unchanged PPO
loss, so clipping, the decoupled loss and rollout corrections apply to it as to any advantage.
Config and peers' conventions: arealite/config/distill.py.
"""

from __future__ import annotations

import torch


def reverse_kl(logprobs: torch.Tensor, teacher_logp: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Per-token reverse KL estimate `logprobs - teacher_logp` [B, T] (k1), 0 off the loss mask."""
    diff = logprobs.float() - teacher_logp.float()
    return torch.where(loss_mask.bool(), diff, torch.zeros_like(diff))


def distill_advantages(
    reward_advantages: torch.Tensor,  # [B, T], the reward's advantages (0 off the mask)
    logprobs: torch.Tensor,  # [B, T], the student's behaviour logprobs of its sampled tokens
    teacher_logp: torch.Tensor,  # [B, T], the teacher's logprobs of the same tokens
    loss_mask: torch.Tensor,  # [B, T]
    kl_coef: float = 1.0,
    reward_weight: float = 0.0,
) -> torch.Tensor:
    """`kl_coef * (teacher_logp - logprobs) + reward_weight * reward_advantages` on the loss
    tokens, 0 elsewhere: [B, T] float32."""
    mixed = reward_weight * reward_advantages.float() - kl_coef * reverse_kl(logprobs, teacher_logp, loss_mask)
    return torch.where(loss_mask.bool(), mixed, torch.zeros_like(mixed))
