"""Advantage estimators: GAE over packed sequences, group-relative reward normalization
(GRPO, Dr.GRPO, RLOO), masked whitening, and broadcasting a per-sequence value to tokens.

Each public function dispatches to a Triton kernel (`arealite.algo.kernels`, imported lazily)
for CUDA inputs and to the vectorized torch reference here otherwise; both are callable
directly (`*_torch`, `*_triton`) so tests hold each against a naive loop. Everything is
computed in float32 (float64 stays float64). KL-in-reward shaping is a loss concern
(`losses.py`).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor

from arealite.algo.advantage_checks import (
    GROUP_NORM_MODES,
    GROUP_STDS,
    _check_broadcast_inputs,
    _check_gae_inputs,
    _check_group_inputs,
    _check_same_shape,
)

__all__ = [
    "GROUP_NORM_MODES",
    "GROUP_STDS",
    "broadcast_to_tokens",
    "broadcast_to_tokens_torch",
    "broadcast_to_tokens_triton",
    "gae_packed",
    "gae_packed_torch",
    "gae_packed_triton",
    "group_normalize",
    "group_normalize_torch",
    "group_normalize_triton",
    "masked_whiten",
    "masked_whiten_torch",
    "masked_whiten_triton",
    "backend",
    "triton_available",
]


# Chunk length of the blocked scan: a [K, K] Toeplitz matmul solves K steps at once.
_CHUNK = 32


@functools.lru_cache(maxsize=1)
def triton_available() -> bool:
    """True when triton imports (it may still need CUDA or TRITON_INTERPRET=1 to run)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def backend(device: torch.device | str) -> str:
    """'triton' or 'torch': which path the dispatchers take for tensors on `device`."""
    return "triton" if torch.device(device).type == "cuda" and triton_available() else "torch"


def _use_triton(t: Tensor) -> bool:
    return t.is_cuda and triton_available()


def _float_dtype(*tensors: Tensor) -> torch.dtype:
    """float64 if any input is float64, else float32 (bf16/fp16 are upcast)."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


# ----------------------------------------------------------------------------- torch: GAE


@functools.lru_cache(maxsize=32)
def _decay_tables(decay: float, k: int, dtype: torch.dtype, device: torch.device) -> tuple[Tensor, Tensor]:
    """toeplitz [k, k]: decay^(j-i) at [j, i] for j >= i, else 0; tail [k]: decay^(k-i).
    Powers are taken in float64, so 0^0 = 1 and underflow goes cleanly to 0."""
    steps = torch.arange(k, dtype=torch.float64)
    base = torch.tensor(decay, dtype=torch.float64)
    expo = steps[:, None] - steps[None, :]
    toeplitz = torch.where(expo >= 0, base ** expo.clamp_min(0), 0.0)
    return toeplitz.to(dtype=dtype, device=device), (base ** (k - steps)).to(dtype=dtype, device=device)


def _doubling_suffix_sum(x: Tensor, ends: Tensor, decay: float) -> Tensor:
    """Same result as `_discounted_suffix_sum` by a doubling (Hillis-Steele) scan: after the
    step with shift s, y_i sums x over [i, i + 2s) within i's segment. log2(L) passes over x."""
    steps = torch.arange(x.numel(), device=x.device)
    room = ends[torch.searchsorted(ends, steps)] - steps  # elements after i in its segment
    longest = int(room.max())
    y, shift, factor = x, 1, decay
    while shift <= longest:
        y = torch.where(room >= shift, y + factor * F.pad(y[shift:], (0, shift)), y)
        shift, factor = shift * 2, factor * factor  # factor = decay^shift (0 on underflow)
    return y


def _discounted_suffix_sum(x: Tensor, ends: Tensor, decay: float) -> Tensor:
    """y_i = sum_{j >= i, same segment} decay^(j-i) x_j over a flat array of segments.

    x [n]; ends: sorted index of each segment's last element (ends[-1] == n - 1).
    Blocked scan without division (exact for decay 0 or 1, no overflow): a [K, K] Toeplitz
    matmul solves every chunk of K elements, the chunks cut by a segment end are redone from
    a window ending at that end, and the K-times shorter series of chunk heads is solved by
    a doubling scan with decay^K, then carried back into each chunk.
    """
    n, k = x.numel(), _CHUNK
    m = -(-n // k)
    toeplitz, tail = _decay_tables(decay, k, x.dtype, x.device)
    local = x.new_empty(m * k + 1)  # [m*k] chunk-local suffix sums, + 1 sink slot for masked writes
    body = local[: m * k]
    full = n // k * k
    torch.matmul(x[:full].view(-1, k), toeplitz, out=body[:full].view(-1, k))
    if full < n:
        body[full:] = F.pad(x[full:], (0, m * k - n)) @ toeplitz
    steps = torch.arange(k, device=x.device)
    sink = m * k

    # Redo the tokens before each segment end within its chunk from a window ending there.
    pos = ends[:, None] - (k - 1) + steps  # [e, k]
    # Clamped (garbage) entries sit before the chunk start and never reach an owned position.
    fixed = x.index_select(0, pos.clamp_min(0).view(-1)).view(pos.shape) @ toeplitz
    seg_start = F.pad(ends[:-1] + 1, (1, 0))
    own = (pos >= seg_start[:, None]) & (pos >= (ends - ends % k)[:, None])
    local.index_put_((torch.where(own, pos, sink).view(-1),), fixed.view(-1))
    if m == 1:
        return body[:n]

    # Chunk c continues into chunk c+1 unless a segment ends inside chunk c.
    end_chunk = ends // k
    has_end = torch.zeros(m, dtype=torch.bool, device=x.device)
    has_end[end_chunk] = True
    chunk_ends = has_end.nonzero().squeeze(1)  # includes m - 1, which holds ends[-1]
    heads = _doubling_suffix_sum(body.view(m, k)[:, 0].contiguous(), chunk_ends, decay**k)
    carry = F.pad(heads[1:], (0, 1))  # [m] suffix sum entering chunk c from chunk c+1
    body.view(m, k).addr_(torch.where(has_end, 0.0, carry), tail)
    # In a chunk with an end, only the tokens after its last end take the carry.
    last_end = torch.full((m,), -1, dtype=ends.dtype, device=x.device)
    last_end.scatter_reduce_(0, end_chunk, ends, reduce="amax")
    pos = chunk_ends[:, None] * k + steps  # [h, k]
    after = pos > last_end[chunk_ends][:, None]
    local.index_add_(0, torch.where(after, pos, sink).view(-1), (carry[chunk_ends][:, None] * tail).view(-1))
    return body[:n]


def gae_packed_torch(
    rewards: Tensor,
    values: Tensor,
    loss_mask: Tensor,
    cu_seqlens: Tensor,
    gamma: float,
    lam: float,
) -> tuple[Tensor, Tensor]:
    """Vectorized torch GAE over packed sequences; semantics in `gae_packed`."""
    _check_gae_inputs(rewards, values, loss_mask, cu_seqlens, gamma, lam)
    dtype = _float_dtype(rewards, values)
    n = values.numel()
    adv = torch.zeros(n, dtype=dtype, device=values.device)  # [N]
    mask = loss_mask if loss_mask.dtype == torch.bool else loss_mask != 0
    idx = mask.nonzero().squeeze(1)  # [n_c] loss-masked tokens, in order
    if idx.numel() == 0:
        return adv, values.to(dtype)
    # Compact the loss-masked tokens: the recurrence then has the constant coefficient
    # gamma*lam, and the next masked token's value is simply the next element.
    v = values.index_select(0, idx).to(dtype)  # [n_c]
    r = rewards.index_select(0, idx).to(dtype)
    compact_cu = torch.searchsorted(idx, cu_seqlens.to(idx.dtype))  # [B+1]
    ends = compact_cu[1:][compact_cu[1:] > compact_cu[:-1]] - 1  # last masked token of each sequence
    delta = r - v  # [n_c]
    delta[:-1].add_(v[1:], alpha=gamma)
    delta[ends] = r[ends] - v[ends]  # bootstrap value 0 after each sequence's last masked token
    adv.scatter_(0, idx, _discounted_suffix_sum(delta, ends, gamma * lam))
    return adv, values.to(dtype) + adv


def gae_packed_triton(
    rewards: Tensor,
    values: Tensor,
    loss_mask: Tensor,
    cu_seqlens: Tensor,
    gamma: float,
    lam: float,
    *,
    check_cu_seqlens: bool = True,
    rows: int | None = None,
    block: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Triton GAE over packed sequences (same semantics as `gae_packed_torch`).

    check_cu_seqlens=True reads cu_seqlens back to raise a ValueError on malformed contents
    (a host sync); without it the kernel marks the sequences at a malformed boundary with
    NaN: every sequence is clamped into [0, N], so malformed cu_seqlens never touch memory out
    of bounds (the read-back's host sync costs more than the kernel itself at a million tokens
    on a GPU, so the dispatcher leaves the check to the kernel). rows/block override the tile (sequences per
    program, tokens per scan step).
    """
    _check_gae_inputs(rewards, values, loss_mask, cu_seqlens, gamma, lam, check_cu_seqlens)
    from arealite.algo.kernels.gae import gae_packed_kernel

    return gae_packed_kernel(rewards, values, loss_mask, cu_seqlens, gamma, lam, rows=rows, block=block)


def gae_packed(
    rewards: Tensor,
    values: Tensor,
    loss_mask: Tensor,
    cu_seqlens: Tensor,
    gamma: float,
    lam: float,
) -> tuple[Tensor, Tensor]:
    """GAE over packed sequences with a loss-mask carry.

    rewards, values, loss_mask: packed [N] (float rewards and values per token, 0/1 mask);
    cu_seqlens: int [B+1]. Returns (advantages [N], returns [N]). Runs backward within each
    sequence; tokens with loss_mask == 0 pass the running advantage and the next value through
    unchanged (multi-turn: environment tokens between model turns) and get advantage 0
    (returns = values there). The bootstrap value after a sequence end is 0. Walking backward
    with a carry (A_next, V_next):

        loss_mask[t] == 1:  delta_t = r_t + gamma * V_next - V_t;  A_t = delta_t + gamma * lam * A_next
                            advantages[t] = A_t, returns[t] = A_t + V_t, carry = (A_t, V_t)
        loss_mask[t] == 0:  advantages[t] = 0, returns[t] = V_t, carry unchanged, r_t ignored

    so a model token's TD target is the value of the next model token (verl's multi-turn GAE);
    put each reward on a loss-masked token. Triton on CUDA (cu_seqlens checked in the kernel, no
    host sync), torch reference elsewhere.
    """
    if _use_triton(values):
        return gae_packed_triton(rewards, values, loss_mask, cu_seqlens, gamma, lam, check_cu_seqlens=False)
    return gae_packed_torch(rewards, values, loss_mask, cu_seqlens, gamma, lam)


# ----------------------------------------------------------------------------- torch: groups


def _std_divisor(group_size: int, std: str) -> int:
    """G for the population std, G - 1 for the sample std (1 for a group of one, whose
    deviations are all 0, so its advantage is 0 either way)."""
    return max(group_size - (std == "sample"), 1)


def group_normalize_torch(
    rewards: Tensor, group_size: int, mode: str = "mean_std", eps: float = 1e-6, std: str = "sample"
) -> Tensor:
    """Torch reference of `group_normalize`."""
    _check_group_inputs(rewards, group_size, mode, std)
    x = rewards.to(_float_dtype(rewards)).view(-1, group_size)  # [B/G, G]
    d = x - x[:, :1]  # deviations from the group's first member: exactly 0 in an all-equal group
    centered = d - d.mean(dim=1, keepdim=True)
    if mode == "mean_std":
        var = (centered * centered).sum(dim=1, keepdim=True) / _std_divisor(group_size, std)
        out = centered / (var.sqrt() + eps)
    elif mode == "mean":
        out = centered
    else:  # rloo: r - (sum - r) / (G - 1) == G / (G - 1) * (r - mean)
        out = centered * (group_size / (group_size - 1))
    return out.reshape(-1)


def group_normalize_triton(
    rewards: Tensor, group_size: int, mode: str = "mean_std", eps: float = 1e-6, std: str = "sample"
) -> Tensor:
    """Triton kernel of `group_normalize`."""
    _check_group_inputs(rewards, group_size, mode, std)
    from arealite.algo.kernels.group_norm import group_normalize_kernel

    mode_id = GROUP_NORM_MODES.index(mode)
    return group_normalize_kernel(rewards, group_size, mode_id, eps, _std_divisor(group_size, std))


def group_normalize(
    rewards: Tensor, group_size: int, mode: str = "mean_std", eps: float = 1e-6, std: str = "sample"
) -> Tensor:
    """Group-relative reward normalization.

    rewards [B] with groups contiguous (rows g*G .. g*G+G-1). mode: 'mean_std' (GRPO:
    (r - mean) / (std + eps)), 'mean' (Dr.GRPO: r - mean), 'rloo' (leave-one-out: r - mean
    of the other G-1). std: 'sample' (divisor G - 1, as torch.std, verl, TRL and AReaL) or
    'population' (divisor G). Returns [B]. Raises ValueError when B % group_size != 0,
    group_size < 1, or mode 'rloo' with group_size < 2.

    Exact for all-equal groups: every member gets exactly 0, whatever the value and G.
    The deviations are taken from the group's first member before the mean (a mean rounded
    in float32 would leave r - mean = +-1 ulp, which mean_std then divides by std + eps).
    """
    if _use_triton(rewards):
        return group_normalize_triton(rewards, group_size, mode, eps, std)
    return group_normalize_torch(rewards, group_size, mode, eps, std)


# ----------------------------------------------------------------------------- torch: whitening


def masked_whiten_torch(x: Tensor, mask: Tensor, eps: float = 1e-6, shift_mean: bool = True) -> Tensor:
    """Torch reference of `masked_whiten`."""
    _check_same_shape("masked_whiten", x, mask)
    dtype = _float_dtype(x)
    keep = mask != 0
    xf = torch.where(keep, x.to(dtype), 0.0)
    count = keep.sum().clamp_min(1).to(torch.float64)
    mean = xf.sum(dtype=torch.float64) / count
    var = (torch.where(keep, xf - mean, 0.0) ** 2).sum(dtype=torch.float64) / count
    out = (xf - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return torch.where(keep, out, 0.0).to(dtype)


def masked_whiten_triton(x: Tensor, mask: Tensor, eps: float = 1e-6, shift_mean: bool = True) -> Tensor:
    """Triton kernels of `masked_whiten`."""
    _check_same_shape("masked_whiten", x, mask)
    from arealite.algo.kernels.whiten import masked_whiten_kernel

    return masked_whiten_kernel(x, mask, eps, shift_mean)


def masked_whiten(x: Tensor, mask: Tensor, eps: float = 1e-6, shift_mean: bool = True) -> Tensor:
    """Whiten x over positions where mask == 1; masked-out positions -> 0.

    mean and variance (population, unbiased=False) are taken over masked positions only;
    out = (x - mean) / sqrt(var + eps), plus mean again when shift_mean is False. Any shape;
    mask has x's shape. With no masked position the result is all zeros.
    """
    if _use_triton(x):
        return masked_whiten_triton(x, mask, eps, shift_mean)
    return masked_whiten_torch(x, mask, eps, shift_mean)


# ----------------------------------------------------------------------------- torch: broadcast


def broadcast_to_tokens_torch(seq_values: Tensor, loss_mask: Tensor) -> Tensor:
    """Torch reference of `broadcast_to_tokens`."""
    _check_broadcast_inputs(seq_values, loss_mask)
    v = seq_values.to(_float_dtype(seq_values))
    return torch.where(loss_mask != 0, v[:, None], 0.0)


def broadcast_to_tokens_triton(seq_values: Tensor, loss_mask: Tensor) -> Tensor:
    """Triton kernel of `broadcast_to_tokens`."""
    _check_broadcast_inputs(seq_values, loss_mask)
    from arealite.algo.kernels.broadcast import broadcast_to_tokens_kernel

    return broadcast_to_tokens_kernel(seq_values, loss_mask)


def broadcast_to_tokens(seq_values: Tensor, loss_mask: Tensor) -> Tensor:
    """Per-sequence values [B] onto tokens: [B] x loss_mask [B, T] -> [B, T], 0 outside the mask."""
    if _use_triton(seq_values):
        return broadcast_to_tokens_triton(seq_values, loss_mask)
    return broadcast_to_tokens_torch(seq_values, loss_mask)
