"""Triton group-relative reward normalization (GRPO / Dr.GRPO / RLOO), one tile of
GROUPS x BLOCK_G rewards per program; semantics in `algo/advantages.py:group_normalize`.

Same arithmetic as the torch reference: deviations from each group's first member, then
from their mean, so an all-equal group gives exactly 0."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

# MODE values follow advantages.GROUP_NORM_MODES: 0 mean_std, 1 mean, 2 rloo.


@triton.jit
def _group_norm_kernel(
    x_ptr,
    out_ptr,
    n_groups,
    group_size,
    std_div,
    eps,
    MODE: tl.constexpr,
    GROUPS: tl.constexpr,
    BLOCK_G: tl.constexpr,
    ACC: tl.constexpr,
):
    groups = tl.program_id(0) * GROUPS + tl.arange(0, GROUPS)[:, None]  # [GROUPS, 1]
    members = tl.arange(0, BLOCK_G)[None, :]  # [1, BLOCK_G]
    ok = (groups < n_groups) & (members < group_size)
    offs = groups * group_size + members
    x = tl.load(x_ptr + offs, mask=ok, other=0.0).to(ACC)
    first = tl.load(x_ptr + groups * group_size, mask=groups < n_groups, other=0.0).to(ACC)  # [GROUPS, 1]
    d = tl.where(ok, x - first, 0.0)
    mean = tl.sum(d, axis=1) / group_size  # [GROUPS]
    centered = tl.where(ok, d - mean[:, None], 0.0)
    if MODE == 0:  # std_div: G (population) or G - 1 (sample)
        std = tl.sqrt(tl.sum(centered * centered, axis=1) / std_div)
        out = centered / (std[:, None] + eps)
    elif MODE == 1:
        out = centered
    else:  # r - (sum - r) / (G - 1) == (r - mean) * G / (G - 1); G - 1 is exact in any float
        out = centered + centered / (group_size - 1.0)
    tl.store(out_ptr + offs, out, mask=ok)


def group_normalize_kernel(rewards: Tensor, group_size: int, mode: int, eps: float, std_div: int) -> Tensor:
    """Launch `_group_norm_kernel`; inputs already validated by `group_normalize_triton`."""
    dtype = torch.float64 if rewards.dtype == torch.float64 else torch.float32
    out = torch.empty(rewards.numel(), dtype=dtype, device=rewards.device)
    n_groups = rewards.numel() // group_size
    if n_groups == 0:
        return out
    block_g = triton.next_power_of_2(group_size)
    groups = max(1, min(4096 // block_g, triton.next_power_of_2(n_groups)))
    _group_norm_kernel[(triton.cdiv(n_groups, groups),)](
        rewards.contiguous(),
        out,
        n_groups,
        group_size,
        std_div,
        float(eps),
        MODE=mode,
        GROUPS=groups,
        BLOCK_G=block_g,
        ACC=tl.float64 if dtype == torch.float64 else tl.float32,
    )
    return out
