"""Triton broadcast of one value per sequence onto its loss-masked tokens:
[B] x loss_mask [B, T] -> [B, T], 0 outside the mask."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

_ROWS, _BLOCK_T = 8, 512


@triton.jit
def _broadcast_kernel(v_ptr, m_ptr, out_ptr, n_rows, n_cols, ROWS: tl.constexpr, BLOCK_T: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]  # [ROWS, 1]
    cols = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)[None, :]  # [1, BLOCK_T]
    ok = (rows < n_rows) & (cols < n_cols)
    value = tl.load(v_ptr + rows, mask=rows < n_rows, other=0.0)
    keep = tl.load(m_ptr + rows * n_cols + cols, mask=ok, other=0) != 0
    tl.store(out_ptr + rows * n_cols + cols, tl.where(keep, value, 0.0), mask=ok)


def broadcast_to_tokens_kernel(seq_values: Tensor, loss_mask: Tensor) -> Tensor:
    """Launch `_broadcast_kernel`; shapes already validated by `broadcast_to_tokens_triton`."""
    dtype = torch.float64 if seq_values.dtype == torch.float64 else torch.float32
    values = seq_values.contiguous().to(dtype)
    mask = loss_mask.contiguous()
    if mask.dtype == torch.bool:
        mask = mask.view(torch.uint8)
    n_rows, n_cols = mask.shape
    out = torch.empty(n_rows, n_cols, dtype=dtype, device=seq_values.device)
    if out.numel() == 0:
        return out
    grid = (triton.cdiv(n_rows, _ROWS), triton.cdiv(n_cols, _BLOCK_T))
    _broadcast_kernel[grid](values, mask, out, n_rows, n_cols, ROWS=_ROWS, BLOCK_T=_BLOCK_T)
    return out
