"""Triton masked whitening in two launches: per-tile (count, mean, M2) partials, merged in
torch with Chan's parallel-variance formula (stable, no host sync), then one elementwise
pass. Semantics in `algo/advantages.py:masked_whiten`."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

_BLOCK = 4096


@triton.jit
def _tile_stats_kernel(x_ptr, m_ptr, part_ptr, n, BLOCK: tl.constexpr, ACC: tl.constexpr):
    tile = tl.program_id(0)
    offs = tile * BLOCK + tl.arange(0, BLOCK)
    keep = (tl.load(m_ptr + offs, mask=offs < n, other=0) != 0) & (offs < n)
    x = tl.where(keep, tl.load(x_ptr + offs, mask=keep, other=0.0).to(ACC), 0.0)
    count = tl.sum(keep.to(ACC), axis=0)
    mean = tl.sum(x, axis=0) / tl.maximum(count, 1.0)
    dev = tl.where(keep, x - mean, 0.0)
    tl.store(part_ptr + tile * 3, count)
    tl.store(part_ptr + tile * 3 + 1, mean)
    tl.store(part_ptr + tile * 3 + 2, tl.sum(dev * dev, axis=0))


@triton.jit
def _normalize_kernel(
    x_ptr, m_ptr, stats_ptr, out_ptr, n, SHIFT_MEAN: tl.constexpr, BLOCK: tl.constexpr, ACC: tl.constexpr
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < n
    keep = tl.load(m_ptr + offs, mask=inside, other=0) != 0
    x = tl.load(x_ptr + offs, mask=inside, other=0.0).to(ACC)
    mean = tl.load(stats_ptr)
    rstd = tl.load(stats_ptr + 1)
    out = (x - mean) * rstd
    if not SHIFT_MEAN:
        out = out + mean
    tl.store(out_ptr + offs, tl.where(keep, out, 0.0), mask=inside)


def masked_whiten_kernel(x: Tensor, mask: Tensor, eps: float, shift_mean: bool) -> Tensor:
    """Launch the two whitening kernels; shapes already validated by `masked_whiten_triton`."""
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    acc = tl.float64 if dtype == torch.float64 else tl.float32
    flat_x = x.contiguous().view(-1)
    flat_m = mask.contiguous().view(-1)
    if flat_m.dtype == torch.bool:
        flat_m = flat_m.view(torch.uint8)
    n = flat_x.numel()
    out = torch.empty(n, dtype=dtype, device=x.device)
    if n == 0:
        return out.view(x.shape)
    tiles = triton.cdiv(n, _BLOCK)
    parts = torch.empty(tiles, 3, dtype=dtype, device=x.device)  # count, mean, M2 per tile
    _tile_stats_kernel[(tiles,)](flat_x, flat_m, parts, n, BLOCK=_BLOCK, ACC=acc)
    count, tile_mean, tile_m2 = parts.double().unbind(1)
    total = count.sum().clamp_min(1.0)
    mean = (count * tile_mean).sum() / total
    var = (tile_m2 + count * (tile_mean - mean) ** 2).sum() / total
    stats = torch.stack([mean, torch.rsqrt(var + eps)]).to(dtype)  # stays on device
    _normalize_kernel[(tiles,)](flat_x, flat_m, stats, out, n, SHIFT_MEAN=shift_mean, BLOCK=_BLOCK, ACC=acc)
    return out.view(x.shape)
