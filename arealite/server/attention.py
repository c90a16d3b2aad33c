"""The server's attention: sdpa over grouped query heads, without copying the KV cache.

transformers' eager attention expands every key/value head to its query heads
(`repeat_kv`) before each step, copying the whole KV cache once per layer per decode step;
at 48 running requests that copy was the largest single cost of a decode step. Here the
query heads that share a key/value head are folded into the query-length dimension
([B, H, Lq, D] -> [B, H_kv, G * Lq, D]), so one sdpa call per layer reads the cache as is.

Masks are additive (0 or the dtype's minimum, transformers' eager mask builder), never
boolean: a left-padded prompt row is fully masked at its padding positions, where a boolean
mask would give NaN (softmax over nothing) and an additive one gives finite, unused values.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

NAME = "arealite_grouped_sdpa"


def grouped_sdpa_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """q [B, H, Lq, D], k/v [B, H_kv, Lk, D], additive mask [B, 1, Lq, Lk] -> ([B, Lq, H, D], None)."""
    batch, heads, q_len, dim = query.shape
    kv_heads, k_len = key.shape[1], key.shape[2]
    group = heads // kv_heads
    # Query head h reads key/value head h // group (transformers' repeat_kv order).
    q = query.reshape(batch, kv_heads, group * q_len, dim)
    mask = None
    if attention_mask is not None:
        mask = attention_mask[:, :, :, :k_len]
        if q_len > 1 and group > 1:
            mask = mask.repeat(1, 1, group, 1)  # row g * Lq + t is query position t
    out = F.scaled_dot_product_attention(q, key, value, attn_mask=mask, scale=scaling)
    return out.reshape(batch, heads, q_len, dim).transpose(1, 2).contiguous(), None


def register() -> str:
    """Register NAME with transformers (idempotent); returns it for `attn_implementation=`."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(NAME, grouped_sdpa_forward)
    AttentionMaskInterface.register(NAME, eager_mask)
    return NAME
