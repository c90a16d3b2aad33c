"""Per-sequence views of packed token tensors: `[N]` values with `cu_seqlens` [B+1]."""

from __future__ import annotations

import torch
from torch import Tensor


def segment_ids(cu_seqlens: Tensor) -> Tensor:
    """Sequence index of every packed token: [N] long."""
    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    return torch.repeat_interleave(torch.arange(len(lens), device=cu_seqlens.device), lens)


def segment_sum(x: Tensor, cu_seqlens: Tensor) -> Tensor:
    """Per-sequence sum of packed `x` [N] -> [B]."""
    out = x.new_zeros(len(cu_seqlens) - 1)
    return out.index_add(0, segment_ids(cu_seqlens).to(x.device), x)
