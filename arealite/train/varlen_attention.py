"""Attention over packed sequences without an N x N mask: the trainer's path when flash-attn is absent.

The packed row is cut into segments of consecutive sequences (`plan`); each segment runs one
`scaled_dot_product_attention` on a view of the row, with no copy of q, k or v: a segment of
sequences of one length is plain causal attention over a batch of them (the row viewed as
[rows, L]), a segment of several lengths gets a block-diagonal causal mask. The outputs are
already in packed order. A cost model chooses the cuts: long sequences run alone (or with
others of their length), runs of short ones share a call. Registered with transformers under
`NAME`; the model must be called with `cu_seq_lens_q` (int32 [S + 1]), without which the row
is one causal sequence.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

NAME = "arealite_varlen_sdpa"

# The cost model of one call, in microseconds, measured on CPU with sdpa forward + backward
# (4 query and 2 kv heads, head dim 16 and 32, one thread): a causal call over L tokens costs
# about 100 + 0.0155 L^2 (over a batch of r rows of L tokens, about 100 + 0.0155 r L^2: the
# call's cost is paid once), a masked call over W tokens about 115 + 0.017 W^2 (the mask saves
# no work). So two sequences share a call when both are shorter than about 48 tokens, and
# sequences of one length always do. It only decides where the cuts go; the result is the
# same for any cuts.
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
        """The lengths of its non-empty sequences."""
        return tuple(n for n in self.lengths if n)

    @property
    def uniform(self) -> bool:
        """Whether its non-empty sequences share one length: one causal call over them as a
        batch of rows, without a mask (one sequence: plain causal attention)."""
        return len(set(self.sequences)) == 1


def plan(lengths: list[int]) -> list[Segment]:
    """Cuts of the packed row with sequences of `lengths` into segments, in packed order.

    The cheapest partition under the cost model, by dynamic programming over the cut points:
    the segment ending at sequence j is either a causal batch of sequences of j's length
    (starting anywhere in their run: a running minimum, so a long run costs no more than a
    short one) or a masked segment reaching back past that run (at most `_MAX_SEGMENT`
    tokens). Empty sequences join a neighbour.
    """
    n = len(lengths)
    tokens, rows = [0], [0]  # prefix sums: tokens, non-empty sequences
    for length in lengths:
        tokens.append(tokens[-1] + length)
        rows.append(rows[-1] + (length > 0))
    best = [0.0] + [float("inf")] * n
    cut = [0] * (n + 1)
    run, length, after = 0, 0, 0  # the current run of one length: its start, length; index after its last sequence
    per_row, low = 0.0, (float("inf"), 0)  # min over the run's starts i of best[i] - per_row * rows[i]
    for j in range(1, n + 1):
        m = lengths[j - 1]
        if m and m != length:  # a new run, holding the empty sequences just before it
            run, length, per_row = after, m, _CAUSAL[1] * m * m
            low = min((best[i] - per_row * rows[i], i) for i in range(run, j))
        elif length:
            low = min(low, (best[j - 1] - per_row * rows[j - 1], j - 1))
        if m:
            after = j
        if length:
            best[j], cut[j] = low[0] + _CAUSAL[0] + per_row * rows[j], low[1]
        else:  # only empty sequences so far: they cost nothing
            best[j], cut[j] = 0.0, 0
        for i in range(run - 1, -1, -1):  # [i, j) holds two lengths: a masked call
            width = tokens[j] - tokens[i]
            if width > _MAX_SEGMENT:
                break
            cost = best[i] + _MASKED[0] + _MASKED[1] * width * width
            if cost < best[j]:
                best[j], cut[j] = cost, i
    bounds, j = [], n
    while j > 0:
        bounds.append((cut[j], j))
        j = cut[j]
    return [Segment(tokens[i], tuple(lengths[i:j])) for i, j in reversed(bounds) if tokens[j] > tokens[i]]


def scores(lengths: list[int]) -> tuple[int, int]:
    """(needed, computed) attention scores of a packed row under `plan(lengths)`: each
    sequence needs its causal triangle; a masked segment computes its whole W x W square."""
    needed = sum(n * (n + 1) // 2 for n in lengths)
    computed = sum(
        sum(n * (n + 1) // 2 for n in s.sequences) if s.uniform else s.width * s.width for s in plan(lengths)
    )
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
    """A plan with the mask of each segment (None: causal without a mask)."""

    segments: list[Segment]
    masks: list[torch.Tensor | None]


def _layout(cu_seqlens: torch.Tensor, n_tokens: int, window: int | None) -> _Layout:
    cu = cu_seqlens.tolist()
    if cu[-1] != n_tokens:
        raise ValueError(f"cu_seq_lens_q ends at {cu[-1]} but the packed row has {n_tokens} tokens")
    segments = plan([b - a for a, b in zip(cu[:-1], cu[1:])])
    masks = []
    for s in segments:
        if s.uniform:  # causal over each row; a window bands each row's [L, L] scores alike
            masks.append(None if window is None else _block_causal_mask(s.sequences[:1], window, cu_seqlens.device))
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
    for (q, k, v), segment, mask in zip(parts, layout.segments, layout.masks):
        rows = len(segment.sequences) if segment.uniform else 1  # a uniform segment: [1, r L] viewed as [r, L]
        q, k, v = (t.reshape(rows, -1, *t.shape[2:]).transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout if module.training else 0.0,
            is_causal=mask is None, scale=scaling, enable_gqa=k.shape[1] != q.shape[1],
        )  # fmt: skip
        outs.append(out.transpose(1, 2).reshape(1, -1, out.shape[1], out.shape[3]))  # [1, W, H, D]
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
