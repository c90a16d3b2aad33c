"""The support of truncated sampling: which tokens top-k, top-p and min-p keep.

One rule, shared by the built-in server's sampler and the trainer's logprobs, so both see
the same distribution: from softmax(logits / T), sorted by probability, keep a token while
its rank is below top_k, while the mass strictly before it is below top_p (the first token
always stays) and while its probability is at least min_p times the largest. The sampled
distribution is the kept probabilities renormalised, so its logprob at a kept token is
`z - logsumexp(z over the kept tokens)` with z = logits / T (docs/protocol.md §1.6).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

TOP_K_ALL = 1 << 30  # "whole vocabulary"


@dataclass(frozen=True)
class Truncation:
    """One request's truncation; `top_k` <= 0 means the whole vocabulary."""

    top_k: int = -1
    top_p: float = 1.0
    min_p: float = 0.0

    def cuts(self, vocab_size: int) -> bool:
        """Whether this truncation can drop any token of a `vocab_size` vocabulary."""
        return self.top_p < 1.0 or self.min_p > 0.0 or 0 < self.top_k < vocab_size


def sorted_keep(sorted_probs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor):
    """Keep mask [n, V] over probabilities sorted in descending order; top_k/top_p/min_p are [n, 1]."""
    ranks = torch.arange(sorted_probs.shape[-1], device=sorted_probs.device)[None, :]
    keep = ranks < top_k
    # (top_p >= 1): rounding of the cumulative sum must not cut the tail of an untruncated row.
    keep &= ((sorted_probs.cumsum(-1) - sorted_probs) < top_p) | (top_p >= 1.0)
    keep &= sorted_probs >= min_p * sorted_probs[:, :1]
    return keep


def keep_mask(scaled: torch.Tensor, truncations: list[Truncation]) -> torch.Tensor:
    """Keep mask [n, V] in vocabulary order for fp32 `scaled` logits [n, V] (already / T)."""
    probs = torch.softmax(scaled.float(), dim=-1)
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    keep = sorted_keep(sorted_probs, *truncation_columns(truncations, probs))
    return torch.zeros_like(keep).scatter_(-1, order, keep)


def truncation_columns(truncations: list[Truncation], like: torch.Tensor):
    top_k = like.new_tensor([t.top_k if t.top_k > 0 else TOP_K_ALL for t in truncations])[:, None]
    top_p = like.new_tensor([t.top_p for t in truncations])[:, None]
    min_p = like.new_tensor([t.min_p for t in truncations])[:, None]
    return top_k, top_p, min_p


def truncated_token_logprobs(scaled: torch.Tensor, targets: torch.Tensor, truncation: Truncation, chunk: int = 256):
    """log p(target) under the truncated, renormalised softmax(`scaled`) [N, V] -> [N] fp32.

    The target always counts as kept: a token the server sampled sits at the edge of the kept
    set only through rounding, and a finite logprob is then the closer answer. Rows go through
    the sort `chunk` at a time to bound memory; gradients flow through `scaled`."""
    out = []
    for rows, tgt in zip(scaled.split(chunk), targets.split(chunk)):
        with torch.no_grad():
            keep = keep_mask(rows, [truncation] * rows.shape[0])
            keep.scatter_(-1, tgt[:, None], True)
        rows = rows.float()
        norm = torch.logsumexp(rows.masked_fill(~keep, float("-inf")), dim=-1)
        out.append(rows.gather(-1, tgt[:, None]).squeeze(-1) - norm)
    return torch.cat(out) if out else scaled.new_zeros(0, dtype=torch.float32)
