"""Attention over packed sequences without an N x N mask: the trainer's path when flash-attn is absent.

The packed row is cut into segments of consecutive sequences (`plan`); each segment runs one
`scaled_dot_product_attention` on a view of the row, with no copy of q, k or v: a segment of
one sequence is plain causal attention, a segment of several gets a block-diagonal causal
mask. The outputs are already in packed order. A cost model chooses the cuts: long sequences
run alone, runs of short ones share a call. Registered with transformers under `NAME`; the
model must be called with `cu_seq_lens_q` (int32 [S + 1]), without which the row is one
causal sequence.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

NAME = "arealite_varlen_sdpa"

# The cost model of one call, in microseconds, measured on CPU with sdpa forward + backward
# (4 query and 2 kv heads, head dim 16 and 32, one thread): a causal call over L tokens costs
# about 100 + 0.0155 L^2, a masked call over W tokens about 115 + 0.017 W^2 (the mask saves no
# work). So two sequences share a call when both are shorter than about 48 tokens. It only
# decides where the cuts go; the result is the same for any cuts.
_CAUSAL = (100.0, 0.0155)
_MASKED = (115.0, 0.017)
_MAX_SEGMENT = 1024  # tokens of a masked segment (its mask is W x W)


@dataclass(frozen=True)
class Segment:
    """Consecutive sequences attended in one call: packed offset and their lengths."""

    start: int
    lengths: tuple[int, ...]

    @property
    def width(self) -> int:
        return sum(self.lengths)

    @property
    def sequences(self) -> tuple[int, ...]:
        """The lengths of its non-empty sequences (one: a causal call without a mask)."""
        return tuple(n for n in self.lengths if n)


def _segment_cost(width: int, real: int) -> float:
    """Cost of one call over `width` tokens holding `real` non-empty sequences."""
    if real == 0:
        return 0.0
    call, quadratic = _CAUSAL if real == 1 else _MASKED
    return call + quadratic * width * width


def plan(lengths: list[int]) -> list[Segment]:
    """Cuts of the packed row with sequences of `lengths` into segments, in packed order.

    The cheapest partition under the cost model (dynamic programming over the cut points; a
    masked segment holds at most `_MAX_SEGMENT` tokens). Empty sequences join a neighbour.
    """
    n = len(lengths)
    best = [0.0] + [float("inf")] * n
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        width, real = 0, 0
        for i in range(j - 1, -1, -1):
            width += lengths[i]
            real += lengths[i] > 0
            if real > 1 and width > _MAX_SEGMENT:
                break
            cost = best[i] + _segment_cost(width, real)
            if cost < best[j]:
                best[j], cut[j] = cost, i
    bounds, j = [], n
    while j > 0:
        bounds.append((cut[j], j))
        j = cut[j]
    starts = [0]
    for length in lengths:
        starts.append(starts[-1] + length)
    return [Segment(starts[i], tuple(lengths[i:j])) for i, j in reversed(bounds) if starts[j] > starts[i]]


def scores(lengths: list[int]) -> tuple[int, int]:
    """(needed, computed) attention scores of a packed row under `plan(lengths)`: each
    sequence needs its causal triangle; a masked segment computes its whole W x W square."""
    needed = sum(n * (n + 1) // 2 for n in lengths)
    computed = sum(s.width * (s.width + 1) // 2 if len(s.sequences) == 1 else s.width * s.width for s in plan(lengths))
    return needed, computed


def masked_share(lengths: list[int]) -> float:
    """The share of the attention scores computed under `plan(lengths)` that are masked out
    (pairs of two sequences in one segment); 0 when every sequence runs alone."""
    needed, computed = scores(lengths)
    return 1.0 - needed / computed if computed else 0.0


def _block_causal_mask(lengths: tuple[int, ...], window: int | None, device: torch.device) -> torch.Tensor:
    """[W, W] bool: query i sees key j iff both are in one sequence and j <= i (and i - j < window)."""
    seq = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths)).to(device)
    i = torch.arange(seq.numel(), device=device)
    mask = (seq[:, None] == seq[None, :]) & (i[None, :] <= i[:, None])
    if window is not None:
        mask &= i[:, None] - i[None, :] < window
    return mask


@dataclass(frozen=True)
class _Layout:
    """A plan with the mask of each segment (None: one sequence, causal without a mask)."""

    segments: list[Segment]
    masks: list[torch.Tensor | None]


def _layout(cu_seqlens: torch.Tensor, n_tokens: int, window: int | None) -> _Layout:
    cu = cu_seqlens.tolist()
    if cu[-1] != n_tokens:
        raise ValueError(f"cu_seq_lens_q ends at {cu[-1]} but the packed row has {n_tokens} tokens")
    segments = plan([b - a for a, b in zip(cu[:-1], cu[1:])])
    masks = []
    for s in segments:
        if len(s.sequences) == 1 and window is None:
            masks.append(None)
        else:
            masks.append(_block_causal_mask(s.sequences, window, cu_seqlens.device))
    return _Layout(segments, masks)


# The layout of the last packed row: every layer of one forward gets the same cu_seq_lens_q
# tensor, so it is derived once per forward, not once per layer (each derivation also waits
# on the device). Holding the tensor keeps the identity check sound.
_last_layout: tuple[torch.Tensor, int, int | None, _Layout] | None = None


def _layout_of(cu_seqlens: torch.Tensor, n_tokens: int, window: int | None) -> _Layout:
    """`_layout`, reused while the same cu_seqlens tensor comes back (the layers of one forward)."""
    global _last_layout
    last = _last_layout
    if last is None or last[0] is not cu_seqlens or last[1] != n_tokens or last[2] != window:
        _last_layout = last = (cu_seqlens, n_tokens, window, _layout(cu_seqlens, n_tokens, window))
    return last[3]


def varlen_sdpa_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    cu_seq_lens_q: torch.Tensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers attention function: q [1, H, N, D], k/v [1, H_kv, N, D] -> ([1, N, H, D], None)."""
    if query.shape[0] != 1:
        raise ValueError(f"{NAME} expects one packed row, got a batch of {query.shape[0]}")
    n_tokens = query.shape[2]
    if cu_seq_lens_q is None:
        cu_seq_lens_q = torch.tensor([0, n_tokens], device=query.device)
    layout = _layout_of(cu_seq_lens_q.to(query.device), n_tokens, sliding_window)
    # One split per tensor along the tokens of the [1, N, H, D] view (its backward is one
    # concatenation; a slice per segment would allocate a zero gradient of the whole row for
    # each segment). Token-major, as the projections lay q/k/v out and sdpa lays out its
    # output and gradients: the concatenations copy contiguous blocks, and neither the
    # output nor the gradients of q/k/v need another copy to reach the linear layers.
    widths = [s.width for s in layout.segments]
    parts = zip(*(t.transpose(1, 2).split(widths, dim=1) for t in (query, key, value)))
    outs = []
    for (q, k, v), mask in zip(parts, layout.masks):
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask,
            dropout_p=dropout if module.training else 0.0, is_causal=mask is None, scale=scaling,
            enable_gqa=k.shape[2] != q.shape[2],
        )  # fmt: skip
        outs.append(out.transpose(1, 2))  # [1, W, H, D]
    return (outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)), None


def _no_mask(*args, **kwargs) -> None:
    """Mask builder for NAME: sequence boundaries come from cu_seq_lens_q, causality from sdpa."""
    return None


def register() -> str:
    """Register NAME with transformers (idempotent); returns it for `attn_implementation=`."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, varlen_sdpa_forward)
    AttentionMaskInterface.register(NAME, _no_mask)
    return NAME
