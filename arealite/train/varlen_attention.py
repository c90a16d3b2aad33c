"""Attention over packed sequences without an N x N mask: the trainer's path when flash-attn is absent.

The sequences of a packed row are grouped into length buckets (`plan`); each bucket runs
`scaled_dot_product_attention(is_causal=True)` on a right-padded block (or a view, for a bucket
of one) and the outputs go back in packed order, so the cost is about sum(L_i^2) and no mask
is built. Registered with transformers under `NAME`; the model must be called with
`cu_seq_lens_q` (int32 [S + 1]), without which the row is one causal sequence.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

NAME = "arealite_varlen_sdpa"

# The bucketing cost model, in units of one token's linear attention work (measured on CPU
# with sdpa forward + backward, head dim 32: a call's fixed cost is that of ~68 tokens, and a
# sequence of L tokens costs about L + L^2 / 44). It only decides which sequences share a
# call; the result is the same for any grouping.
_CALL_COST = 68.0
_QUADRATIC = 1.0 / 44.0


def _cost(length: int) -> float:
    return length + _QUADRATIC * length * length


@dataclass(frozen=True)
class Bucket:
    """Sequences attended in one call: their packed starts and lengths, padded to `width`."""

    starts: tuple[int, ...]
    lengths: tuple[int, ...]
    width: int


def plan(lengths: list[int]) -> list[Bucket]:
    """Length buckets for sequences of `lengths` (in packed order); longest bucket first.

    Greedy over the sequences sorted by length: the next one joins the current bucket when
    padding it to the bucket's width costs less than an attention call of its own.
    """
    starts = [0]
    for n in lengths[:-1]:
        starts.append(starts[-1] + n)
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    groups: list[list[int]] = []
    for i in order:
        if lengths[i] == 0:
            continue
        if groups and _cost(lengths[groups[-1][0]]) - _cost(lengths[i]) < _CALL_COST:
            groups[-1].append(i)
        else:
            groups.append([i])
    return [Bucket(tuple(starts[i] for i in g), tuple(lengths[i] for i in g), lengths[g[0]]) for g in groups]


def padding_share(lengths: list[int]) -> float:
    """The share of attention rows that are padding under `plan(lengths)` (0 when none)."""
    slots = sum(len(b.lengths) * b.width for b in plan(lengths))
    return 1.0 - sum(lengths) / slots if slots else 0.0


@dataclass(frozen=True)
class _Layout:
    """Index tensors of a plan: gather into each padded bucket, keep its real rows, restore order."""

    buckets: list[Bucket]
    gathers: list[torch.Tensor | None]  # [S_b * L_b] rows of the packed tokens (N = a zero row); None: one view
    keeps: list[torch.Tensor | None]  # [sum L] real rows of the padded bucket output
    restore: torch.Tensor | None  # [N] packed position -> row of the concatenated bucket outputs; None: same


def _layout(cu_seqlens: torch.Tensor, n_tokens: int) -> _Layout:
    cu = cu_seqlens.tolist()
    if cu[-1] != n_tokens:
        raise ValueError(f"cu_seq_lens_q ends at {cu[-1]} but the packed row has {n_tokens} tokens")
    buckets = plan([b - a for a, b in zip(cu[:-1], cu[1:])])
    device = cu_seqlens.device
    gathers, keeps, rows = [], [], []
    for b in buckets:
        rows += [list(range(s, s + n)) for s, n in zip(b.starts, b.lengths)]
        if len(b.starts) == 1:
            gathers.append(None)
            keeps.append(None)
            continue
        gather = [s + j if j < n else n_tokens for s, n in zip(b.starts, b.lengths) for j in range(b.width)]
        keep = [k * b.width + j for k, n in enumerate(b.lengths) for j in range(n)]
        gathers.append(torch.tensor(gather, device=device))
        keeps.append(torch.tensor(keep, device=device))
    flat = [r for seq in rows for r in seq]
    if flat == list(range(n_tokens)):
        return _Layout(buckets, gathers, keeps, None)
    restore = torch.empty(n_tokens, dtype=torch.long)
    restore[torch.tensor(flat, dtype=torch.long)] = torch.arange(n_tokens)
    return _Layout(buckets, gathers, keeps, restore.to(device))


# The layout of the last packed row: every layer of one forward gets the same cu_seq_lens_q
# tensor, so it is derived once per forward, not once per layer (each derivation also waits
# on the device). Holding the tensor keeps the identity check sound.
_last_layout: tuple[torch.Tensor, int, _Layout] | None = None


def _layout_of(cu_seqlens: torch.Tensor, n_tokens: int) -> _Layout:
    """`_layout`, reused while the same cu_seqlens tensor comes back (the layers of one forward)."""
    global _last_layout
    if _last_layout is None or _last_layout[0] is not cu_seqlens or _last_layout[1] != n_tokens:
        _last_layout = (cu_seqlens, n_tokens, _layout(cu_seqlens, n_tokens))
    return _last_layout[2]


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
    layout = _layout_of(cu_seq_lens_q.to(query.device), n_tokens)
    # [N + 1, H, D] token rows with a zero row at N, the padding of every gathered bucket
    rows = None
    if any(g is not None for g in layout.gathers):
        rows = [torch.cat([t[0].transpose(0, 1), t.new_zeros(1, t.shape[1], t.shape[3])]) for t in (query, key, value)]
    outs = []
    for b, gather, keep in zip(layout.buckets, layout.gathers, layout.keeps):
        if gather is None:
            q, k, v = (t[:, :, b.starts[0] : b.starts[0] + b.width] for t in (query, key, value))
        else:
            q, k, v = (r.index_select(0, gather).view(len(b.starts), b.width, r.shape[1], r.shape[2]).transpose(1, 2)
                       for r in rows)  # fmt: skip
        mask = None
        if sliding_window is not None:  # causal band: key j visible from query i iff i - window < j <= i
            i = torch.arange(b.width, device=query.device)
            mask = (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < sliding_window)
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout if module.training else 0.0, is_causal=mask is None,
            scale=scaling, enable_gqa=k.shape[1] != q.shape[1],
        )  # fmt: skip
        out = out.transpose(1, 2).reshape(-1, out.shape[1], out.shape[3])  # [S_b * L_b, H, D]
        outs.append(out if keep is None else out.index_select(0, keep))
    tokens = outs[0] if len(outs) == 1 else torch.cat(outs)
    if layout.restore is not None:
        tokens = tokens.index_select(0, layout.restore)
    return tokens[None], None


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
