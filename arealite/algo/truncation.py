"""The support of truncated sampling: which tokens top-k, top-p and min-p keep, by two rules.

`joint` (the built-in server's sampler): from softmax(logits / T), sorted by probability, keep
a token while its rank is below top_k, while the mass strictly before it is below top_p (the
first token always stays) and while its probability is at least min_p times the largest: all
three tests on the one distribution. `sequential` (vLLM 0.32's sampler, CPU path): min-p on
softmax(logits / T), then top-k on the logits left (ties at the k-th value stay), then top-p on
the distribution renormalised over what is left. Either way the sampled distribution is the
kept probabilities renormalised, so its logprob at a kept token is
`z - logsumexp(z over the kept tokens)` with z = logits / T (docs/protocol.md §1.6.1).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

TRUNCATION_RULES = ("joint", "sequential")  # the built-in server's, vLLM's (gconfig.truncation_rule)

TOP_K_ALL = 1 << 30  # "whole vocabulary"


@dataclass(frozen=True)
class Truncation:
    """One request's truncation; `top_k` <= 0 means the whole vocabulary; `rule` says how
    the three cuts combine (module docstring)."""

    top_k: int = -1
    top_p: float = 1.0
    min_p: float = 0.0
    rule: str = "joint"

    def __post_init__(self) -> None:
        if self.rule not in TRUNCATION_RULES:
            raise ValueError(f"Truncation.rule={self.rule!r} is not a rule; choose one of {list(TRUNCATION_RULES)}")

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


def sequential_keep_mask(scaled: torch.Tensor, truncation: Truncation) -> torch.Tensor:
    """vLLM's keep mask [n, V] for fp32 `scaled` logits [n, V] (already / T), op for op as its
    CPU sampler computes it in fp32 (`MinPLogitsProcessor`, `apply_top_k_top_p_pytorch`), so
    rounding at a cut's edge falls the same way on both sides."""
    x = scaled.float()
    keep = torch.ones_like(x, dtype=torch.bool)
    if truncation.min_p > 0.0:
        probs = torch.softmax(x, dim=-1)
        keep = probs >= probs.amax(-1, keepdim=True) * x.new_tensor(truncation.min_p)
        x = x.masked_fill(~keep, float("-inf"))
    vocab = x.shape[-1]
    top_k = truncation.top_k if 0 < truncation.top_k < vocab else 0
    if truncation.top_p >= 1.0:
        if top_k:  # vLLM's top-k-only path: the k-th largest logit is the threshold, no sort
            keep &= x >= x.topk(top_k, dim=-1).values[:, -1:]
        return keep
    ascending, order = x.sort(dim=-1)
    drop = torch.zeros_like(keep)
    if top_k:
        drop = ascending < ascending[:, vocab - top_k : vocab - top_k + 1]
        ascending = ascending.masked_fill(drop, float("-inf"))
    # top-p on the renormalised remainder: drop a token while the mass up to it, summed from
    # the least likely, is at most 1 - p (the most likely token always stays)
    low_mass = ascending.softmax(dim=-1).cumsum(dim=-1) <= 1 - x.new_tensor(truncation.top_p)
    low_mass[:, -1] = False
    drop |= low_mass
    return keep & ~torch.zeros_like(drop).scatter_(-1, order, drop)


def truncation_columns(truncations: list[Truncation], like: torch.Tensor):
    top_k = like.new_tensor([t.top_k if t.top_k > 0 else TOP_K_ALL for t in truncations])[:, None]
    top_p = like.new_tensor([t.top_p for t in truncations])[:, None]
    min_p = like.new_tensor([t.min_p for t in truncations])[:, None]
    return top_k, top_p, min_p


@torch.no_grad()
def kept_set(rows: torch.Tensor, truncation: Truncation, targets: torch.Tensor) -> torch.Tensor:
    """The tokens `truncation` keeps of `rows` [N, V] (logits / T), each row's target always
    among them: bool [N, V]."""
    if truncation.rule == "sequential":
        keep = sequential_keep_mask(rows, truncation)
    else:
        keep = keep_mask(rows, [truncation] * rows.shape[0])
    return keep.scatter_(-1, targets[:, None], True)


def truncated_token_logprobs(scaled: torch.Tensor, targets: torch.Tensor, truncation: Truncation, chunk: int = 256):
    """log p(target) under the truncated, renormalised softmax(`scaled`) [N, V] -> [N] fp32.

    The target always counts as kept: a token the server sampled sits at the edge of the kept
    set only through rounding, and a finite logprob is then the closer answer. Rows go through
    the sort `chunk` at a time to bound memory; gradients flow through `scaled`."""
    out = []
    for rows, tgt in zip(scaled.split(chunk), targets.split(chunk)):
        keep = kept_set(rows, truncation, tgt)
        rows = rows.float()
        norm = torch.logsumexp(rows.masked_fill(~keep, float("-inf")), dim=-1)
        out.append(rows.gather(-1, tgt[:, None]).squeeze(-1) - norm)
    return torch.cat(out) if out else scaled.new_zeros(0, dtype=torch.float32)
