"""Attention over packed sequences without an N x N mask: the trainer's path when flash-attn is absent.

The trainer packs a micro-batch's sequences into one row of N tokens. flash-attn handles that
natively (`cu_seqlens`); without it, transformers' sdpa path builds a dense block-diagonal
N x N mask, so attention costs O(N^2) in the micro-batch's TOTAL tokens and the step grows
quadratically with the token budget (measured on CPU: 32 sequences of ~110 tokens took 3x
longer in one 4096-token micro-batch than in 512-token ones).

Here the packed q/k/v are scattered into a right-padded [S, H, L_max, D] layout (S
sequences), attended with `scaled_dot_product_attention(is_causal=True)` and gathered back.
Right padding needs no mask: a real query at position i only sees keys 0..i, which are all
real; padded queries are dropped, so no gradient flows through padding. The cost is
O(S * L_max^2) instead of O(N^2), and no mask tensor is built or differentiated.

Registered with transformers under `NAME` (attention and mask interfaces). The model must be
called with `cu_seq_lens_q` (int32 [S + 1], as for flash-attn); without it the whole row is
one causal sequence.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

NAME = "arealite_varlen_sdpa"


def _layout(cu_seqlens: torch.Tensor, n_tokens: int) -> tuple[torch.Tensor, int, int]:
    """Flat indices of each packed token in the padded [S * L_max] layout; (index, S, L_max)."""
    cu = cu_seqlens.to(torch.long)
    lens = cu[1:] - cu[:-1]
    if int(cu[-1]) != n_tokens:
        raise ValueError(f"cu_seq_lens_q ends at {int(cu[-1])} but the packed row has {n_tokens} tokens")
    num, longest = lens.numel(), int(lens.max())
    seq = torch.repeat_interleave(torch.arange(num, device=cu.device), lens)
    offset = torch.arange(n_tokens, device=cu.device) - cu[:-1][seq]
    return seq * longest + offset, num, longest


# The layout of the last packed row: every layer of one forward gets the same cu_seq_lens_q
# tensor, so it is derived once per forward, not once per layer (each derivation also waits
# on the device twice). Holding the tensor keeps the identity check sound.
_last_layout: tuple[torch.Tensor, int, tuple[torch.Tensor, int, int]] | None = None


def _layout_of(cu_seqlens: torch.Tensor, n_tokens: int) -> tuple[torch.Tensor, int, int]:
    """`_layout`, reused while the same cu_seqlens tensor comes back (the layers of one forward)."""
    global _last_layout
    if _last_layout is None or _last_layout[0] is not cu_seqlens or _last_layout[1] != n_tokens:
        _last_layout = (cu_seqlens, n_tokens, _layout(cu_seqlens, n_tokens))
    return _last_layout[2]


def _to_padded(x: torch.Tensor, flat: torch.Tensor, num: int, longest: int) -> torch.Tensor:
    """[1, H, N, D] packed -> [S, H, L_max, D] right-padded with zeros."""
    heads, dim = x.shape[1], x.shape[3]
    tokens = x[0].transpose(0, 1)  # [N, H, D]
    padded = tokens.new_zeros(num * longest, heads, dim).index_copy(0, flat, tokens)
    return padded.view(num, longest, heads, dim).transpose(1, 2)


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
    flat, num, longest = _layout_of(cu_seq_lens_q.to(query.device), n_tokens)
    q, k, v = (_to_padded(t, flat, num, longest) for t in (query, key, value))
    mask = None
    if sliding_window is not None:  # causal band: key j visible from query i iff i - window < j <= i
        i = torch.arange(longest, device=query.device)
        mask = (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < sliding_window)
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=dropout if module.training else 0.0, is_causal=mask is None,
        scale=scaling, enable_gqa=k.shape[1] != q.shape[1],
    )  # fmt: skip
    heads, dim = out.shape[1], out.shape[3]
    tokens = out.transpose(1, 2).reshape(num * longest, heads, dim).index_select(0, flat)
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
