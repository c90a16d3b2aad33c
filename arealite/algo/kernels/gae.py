"""Triton GAE over packed sequences with a loss-mask carry (semantics: `algo/advantages.py`).

Each program takes ROWS sequences and walks them from the end in tiles of BLOCK tokens,
loaded in reverse so the backward recurrence becomes a forward scan. Both recurrences are
affine maps x -> c*x + d composed with `tl.associative_scan`, so a tile costs log2(BLOCK)
parallel steps and only the tile loop (length / BLOCK iterations) is serial:
  1. the value of the next loss-masked token: c = 0 and d = V where the *next* token is
     masked, c = 1 and d = 0 where it is not (scanned over the token after each position);
  2. the advantage: c = gamma*lam and d = delta on masked tokens, c = 1 and d = 0 elsewhere.
The affine prefix of each tile is applied to the carry left by the previous tile.
"""

from __future__ import annotations

import functools
import struct

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.runtime.interpreter import InterpretedFunction

# ~14 live [ROWS, BLOCK] tensors per tile: 2,048 elements over 8 warps keeps them in registers.
_TILE_ELEMENTS = 2048
_NUM_WARPS = 8


@triton.jit
def _affine_combine(c1, d1, c2, d2):
    # Apply x -> c1*x + d1, then x -> c2*x + d2 (element 2 comes later in scan order).
    return c1 * c2, d1 * c2 + d2


@triton.jit
def _last_column(x, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)[None, :]
    return tl.sum(tl.where(cols == BLOCK - 1, x, 0.0), axis=1)


@triton.jit
def _gae_tile(
    tile,
    rew_ptr,
    val_ptr,
    mask_ptr,
    adv_ptr,
    ret_ptr,
    end,
    length,
    bad,
    carry_adv,
    carry_val,
    gamma,
    gamma_lam,
    BLOCK: tl.constexpr,
    ACC: tl.constexpr,
):
    """One tile of BLOCK tokens per row, `tile` tiles back from each row's end; returns the carries."""
    cols = tl.arange(0, BLOCK)[None, :]  # [1, BLOCK]
    back = tile * BLOCK + cols  # [R, BLOCK] distance from the sequence's last token
    ok = back < length[:, None]
    pos = end[:, None] - 1 - back
    m = tl.load(mask_ptr + pos, mask=ok, other=0) != 0
    r = tl.load(rew_ptr + pos, mask=ok, other=0.0).to(ACC)
    v = tl.load(val_ptr + pos, mask=ok, other=0.0).to(ACC)
    # 1. value of the next masked token, from the token after each position
    has_next = ok & (back >= 1)
    m_next = tl.load(mask_ptr + pos + 1, mask=has_next, other=0) != 0
    v_next = tl.load(val_ptr + pos + 1, mask=has_next, other=0.0).to(ACC)
    keep, found = tl.associative_scan(
        (tl.where(m_next, 0.0, 1.0).to(ACC), tl.where(m_next, v_next, 0.0).to(ACC)),
        axis=1,
        combine_fn=_affine_combine,
    )
    next_value = found + keep * carry_val[:, None]
    # 2. advantages: masked tokens discount by gamma*lam, others pass the carry through
    delta = tl.where(m, r + gamma * next_value - v, 0.0).to(ACC)
    decay = tl.where(m, gamma_lam, 1.0).to(ACC)
    scale, acc = tl.associative_scan((decay, delta), axis=1, combine_fn=_affine_combine)
    running = acc + scale * carry_adv[:, None]
    adv = tl.where(m, running, 0.0)
    ret = v + adv
    nan = float("nan")
    tl.store(adv_ptr + pos, tl.where(bad[:, None], nan, adv), mask=ok)
    tl.store(ret_ptr + pos, tl.where(bad[:, None], nan, ret), mask=ok)
    return _last_column(running, BLOCK), _last_column(next_value, BLOCK)


@triton.jit
def _gae_kernel(
    rew_ptr,
    val_ptr,
    mask_ptr,
    cu_ptr,
    adv_ptr,
    ret_ptr,
    n_seqs,
    n_tokens,
    GAMMA_HI: tl.constexpr,
    GAMMA_LO: tl.constexpr,
    DECAY_HI: tl.constexpr,
    DECAY_LO: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
    ACC: tl.constexpr,
    INTERPRETED: tl.constexpr,
):
    # gamma and gamma*lam are compile-time constants (fixed for a run; four fewer arguments to
    # specialize on every launch), each an fp32 pair: hi + lo recovers it to ~1e-14 for float64.
    gamma = tl.full([], GAMMA_HI, ACC) + tl.full([], GAMMA_LO, ACC)
    gamma_lam = tl.full([], DECAY_HI, ACC) + tl.full([], DECAY_LO, ACC)
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)  # [R]
    row_ok = rows < n_seqs
    start = tl.load(cu_ptr + rows, mask=row_ok, other=0)
    end = tl.load(cu_ptr + rows + 1, mask=row_ok, other=0)
    # cu_seqlens is checked here rather than read back by the host (a sync): a row whose
    # bounds, or its neighbours', are out of order or outside [0, N] gets NaN, and clamping
    # keeps every access inside the arrays whatever cu_seqlens holds. A bad first (last) row
    # reaches back to token 0 (on to token N), so no token is left unwritten: any walk from
    # 0 to N has an upward step over every token.
    first, last = rows == 0, rows == n_seqs - 1
    before = tl.load(cu_ptr + rows - 1, mask=row_ok & (rows > 0), other=0)
    after = tl.load(cu_ptr + rows + 2, mask=row_ok & (rows + 1 < n_seqs), other=n_tokens)
    bad = (before > start) | (start > end) | (end > after) | (start < 0) | (end > n_tokens)
    bad = (bad | (first & (start != 0)) | (last & (end != n_tokens))) & row_ok
    start = tl.where(bad & first, 0, tl.minimum(tl.maximum(start, 0), n_tokens))
    end = tl.where(bad & last, n_tokens, tl.minimum(tl.maximum(end, start), n_tokens))
    length = end - start  # [R]; 0 for padding rows
    n_tiles = tl.cdiv(tl.max(length, axis=0), BLOCK)
    carry_adv = tl.zeros([ROWS], dtype=ACC)  # advantage of the nearest masked token after the tile
    carry_val = tl.zeros([ROWS], dtype=ACC)  # its value (0 past the sequence end: bootstrap)
    if INTERPRETED:  # triton 3.6's interpreter cannot take a reduced tensor as a range() bound
        tile = 0
        while tile < n_tiles:
            carry_adv, carry_val = _gae_tile(
                tile, rew_ptr, val_ptr, mask_ptr, adv_ptr, ret_ptr, end, length, bad, carry_adv, carry_val,
                gamma, gamma_lam, BLOCK, ACC,
            )  # fmt: skip
            tile += 1
    else:
        for tile in range(n_tiles):
            carry_adv, carry_val = _gae_tile(
                tile, rew_ptr, val_ptr, mask_ptr, adv_ptr, ret_ptr, end, length, bad, carry_adv, carry_val,
                gamma, gamma_lam, BLOCK, ACC,
            )  # fmt: skip


# TRITON_INTERPRET=1 at import makes triton.jit return an interpreted function instead.
_INTERPRETED = isinstance(_gae_kernel, InterpretedFunction)


@functools.lru_cache(maxsize=64)
def _split(x: float) -> tuple[float, float]:
    """x as an fp32 pair (hi, lo) with hi + lo == x to ~2^-48 relative."""
    hi = _to_fp32(x)
    return hi, _to_fp32(x - hi)


def _to_fp32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


@functools.lru_cache(maxsize=256)
def _tile(n_tokens: int, n_seqs: int) -> tuple[int, int]:
    """(rows, block): BLOCK about the mean sequence length (16..1024), a tile of at most
    2,048 elements, and few enough rows per program that a batch fills ~128 programs."""
    mean_len = max(n_tokens // max(n_seqs, 1), 1)
    block = min(max(triton.next_power_of_2(mean_len), 16), 1024)
    rows = min(_TILE_ELEMENTS // block, max(triton.next_power_of_2(n_seqs) // 128, 1))
    return rows, block


def gae_packed_kernel(
    rewards: Tensor,
    values: Tensor,
    loss_mask: Tensor,
    cu_seqlens: Tensor,
    gamma: float,
    lam: float,
    rows: int | None = None,
    block: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Launch `_gae_kernel`; inputs already validated by `gae_packed_triton`."""
    dtype = torch.float64 if torch.float64 in (rewards.dtype, values.dtype) else torch.float32
    n, n_seqs = values.numel(), cu_seqlens.numel() - 1
    adv, ret = torch.empty(2, n, dtype=dtype, device=values.device).unbind(0)  # one allocation: less host time
    if n == 0 or n_seqs == 0:
        return adv, ret
    mask = loss_mask.contiguous()
    if mask.dtype == torch.bool:
        mask = mask.view(torch.uint8)  # same bytes; int1 pointers are awkward in Triton
    auto_rows, auto_block = _tile(n, n_seqs)
    rows, block = rows or auto_rows, block or auto_block
    for name, size in (("rows", rows), ("block", block)):
        if size < 1 or size & (size - 1):
            raise ValueError(f"gae_packed_triton: {name}={size} must be a power of two")
    grid = (triton.cdiv(n_seqs, rows),)
    _gae_kernel[grid](
        rewards.contiguous(),
        values.contiguous(),
        mask,
        cu_seqlens.contiguous(),
        adv,
        ret,
        n_seqs,
        n,
        *_split(float(gamma)),
        *_split(float(gamma * lam)),
        ROWS=rows,
        BLOCK=block,
        ACC=tl.float64 if dtype == torch.float64 else tl.float32,
        INTERPRETED=_INTERPRETED,
        num_warps=_NUM_WARPS,
    )
    return adv, ret
