"""On-policy distillation's advantage (arealite/algo/distill.py) against a naive per-token loop,
and its config section's checks."""

from __future__ import annotations

import pytest
import torch

from arealite.algo.distill import distill_advantages, reverse_kl
from arealite.config import ConfigError, DistillConfig


def naive(reward_adv, logprobs, teacher, mask, kl_coef, reward_weight):
    out = [[0.0] * len(row) for row in mask]
    for b in range(len(mask)):
        for t in range(len(mask[b])):
            if mask[b][t]:
                kl = logprobs[b][t] - teacher[b][t]  # log pi_student(x_t) - log pi_teacher(x_t)
                out[b][t] = reward_weight * reward_adv[b][t] - kl_coef * kl
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("kl_coef, reward_weight", [(1.0, 0.0), (0.3, 1.0), (0.0, 2.0)])
def test_distill_advantages_match_a_naive_loop(kl_coef, reward_weight):
    g = torch.Generator().manual_seed(int(kl_coef * 10 + reward_weight))
    B, T = 5, 13
    reward_adv = torch.randn(B, T, generator=g)
    logprobs = -torch.rand(B, T, generator=g) * 5
    teacher = -torch.rand(B, T, generator=g) * 5
    mask = torch.rand(B, T, generator=g) > 0.3
    mask[0] = False  # a row with no loss token
    got = distill_advantages(reward_adv, logprobs, teacher, mask, kl_coef, reward_weight)
    want = naive(*(x.tolist() for x in (reward_adv, logprobs, teacher, mask)), kl_coef, reward_weight)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=0, atol=4 * torch.finfo(torch.float32).eps * 10)
    assert torch.equal(reverse_kl(logprobs, teacher, mask), torch.where(mask, logprobs - teacher, 0.0))
    # where the teacher likes a sampled token more than the student did, its advantage is positive
    agree = mask & (teacher > logprobs)
    assert (distill_advantages(torch.zeros(B, T), logprobs, teacher, mask, 1.0, 0.0)[agree] > 0).all()


@pytest.mark.parametrize(
    "fields, message",
    [
        ({}, "distill needs a teacher"),
        ({"address": "h:1", "kl_coef": -1.0}, "distill.kl_coef=-1.0 must be >= 0"),
        ({"address": "h:1", "kl_coef": 0.0}, "both 0"),
        ({"address": "h:1", "max_batch_size": 0}, "distill.max_batch_size=0 must be > 0"),
    ],
)
def test_distill_config_refuses_what_cannot_work(fields, message):
    with pytest.raises(ConfigError, match=message):
        DistillConfig(**fields)
