"""Packing padded trajectory batches into one token stream, and splitting them by a token budget.

A batch (docs/architecture.md §5) is right-padded `[B, T]`. Its packed form concatenates the real tokens
of every row without padding: per-token keys become `[N]` (N = total real tokens),
per-sequence keys (`rewards` [B]) stay as they are, and three keys are added:
`cu_seqlens` (int32 [B+1], sequence boundaries), `position_ids` ([N], restarting at 0 for
every sequence) and `max_seqlen` (int). The model sees one row of N tokens whose attention
is confined to each sequence (block-diagonal causal), so no compute is spent on padding.

Micro-batches are sets of whole sequences whose token count fits `max_tokens_per_mb`: the
sequences sorted by length and cut into consecutive runs balanced by tokens, so each
micro-batch holds sequences of similar lengths (the packed attention then attends equal
lengths in one call). Deliberately absent: splitting a single sequence across micro-batches
(needs sequence parallelism).
"""

from __future__ import annotations

import math
from typing import Any

import torch

Batch = dict[str, Any]


def seqlens_of(attention_mask: torch.Tensor) -> torch.Tensor:
    """Real-token count of every row of a right-padded `[B, T]` mask, as long [B].

    Raises ValueError if a row is not right-padded (a 0 before a 1), naming the row.
    """
    mask = attention_mask.bool()
    lens = mask.sum(-1)
    expected = torch.arange(mask.shape[1], device=mask.device)[None, :] < lens[:, None]
    if not torch.equal(expected, mask):
        bad = (expected != mask).any(-1).nonzero()[0].item()
        raise ValueError(
            f"attention_mask row {bad} is not right-padded (a pad precedes a real token); "
            "arealite batches put real tokens first and padding last"
        )
    return lens


def _token_keys(batch: Batch) -> tuple[int, int, list[str], list[str]]:
    """(B, T, keys shaped [B, T, ...], keys shaped [B, ...] otherwise)."""
    if "attention_mask" not in batch:
        raise KeyError("the batch has no 'attention_mask' [B, T]; every trajectory batch needs one")
    B, T = batch["attention_mask"].shape
    token, seq = [], []
    for k, v in batch.items():
        if not isinstance(v, torch.Tensor) or v.dim() == 0:
            continue
        if v.dim() >= 2 and tuple(v.shape[:2]) == (B, T):
            token.append(k)
        elif v.shape[0] == B:
            seq.append(k)
    return B, T, token, seq


def cu_seqlens_of(seqlens: torch.Tensor) -> torch.Tensor:
    """Boundaries [B+1] (int32) of sequences with lengths `seqlens` [B] in a packed stream."""
    cu = torch.zeros(len(seqlens) + 1, dtype=torch.int32, device=seqlens.device)
    cu[1:] = torch.cumsum(seqlens, 0)
    return cu


def position_ids_of(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Positions [N] that restart at 0 at each sequence start."""
    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    n = int(cu_seqlens[-1])
    starts = torch.repeat_interleave(cu_seqlens[:-1].long(), lens)
    return torch.arange(n, device=cu_seqlens.device) - starts


def pack(batch: Batch) -> Batch:
    """Packed form of a right-padded batch (see the module docstring). Other entries are copied."""
    B, T, token, seq = _token_keys(batch)
    lens = seqlens_of(batch["attention_mask"])
    mask = batch["attention_mask"].bool()
    out: Batch = {k: v for k, v in batch.items() if k not in token}
    for k in token:
        out[k] = batch[k][mask]  # row-major selection keeps sequences contiguous and in order
    cu = cu_seqlens_of(lens)
    out["cu_seqlens"] = cu
    out["position_ids"] = position_ids_of(cu)
    out["max_seqlen"] = int(lens.max()) if B else 0
    return out


def unpack(x: torch.Tensor, cu_seqlens: torch.Tensor, seq_len: int | None = None) -> torch.Tensor:
    """Inverse of packing for one tensor: `[N, ...]` -> right-padded `[B, seq_len, ...]` (zeros in the pads)."""
    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    T = int(lens.max()) if seq_len is None else seq_len
    if len(lens) and int(lens.max()) > T:
        raise ValueError(f"seq_len={T} is shorter than the longest packed sequence ({int(lens.max())})")
    mask = torch.arange(T, device=x.device)[None, :] < lens.to(x.device)[:, None]
    out = x.new_zeros((len(lens), T, *x.shape[1:]))
    out[mask] = x
    return out


def select(batch: Batch, rows: list[int] | torch.Tensor, trim: bool = True) -> Batch:
    """The sub-batch of `rows` (padded form); with `trim`, padding columns no row uses are dropped."""
    B, T, token, seq = _token_keys(batch)
    idx = torch.as_tensor(rows, dtype=torch.long)
    width = T
    if trim and len(idx):
        width = max(int(batch["attention_mask"][idx].sum(-1).max()), 1)
    out: Batch = {k: v for k, v in batch.items() if k not in token and k not in seq}
    for k in token:
        out[k] = batch[k][idx.to(batch[k].device), :width]
    for k in seq:
        out[k] = batch[k][idx.to(batch[k].device)]
    return out


def concat(batches: list[Batch]) -> Batch:
    """Row-wise concatenation of padded batches, right-padding to the widest (zeros)."""
    if not batches:
        raise ValueError("concat needs at least one batch")
    width = max(b["attention_mask"].shape[1] for b in batches)
    out: Batch = {}
    for k, v in batches[0].items():
        if not isinstance(v, torch.Tensor):
            out[k] = v
            continue
        parts = []
        for b in batches:
            t = b[k]
            if t.dim() >= 2 and t.shape[1] == b["attention_mask"].shape[1]:
                t = torch.nn.functional.pad(t, (0, 0) * (t.dim() - 2) + (0, width - t.shape[1]))
            parts.append(t)
        out[k] = torch.cat(parts)
    return out


def balanced_partition(seqlens: list[int], k: int) -> list[list[int]]:
    """Split indices of `seqlens` into `k` groups of near-equal token sums (LPT), each sorted.

    Groups may be empty when there are fewer sequences than groups.
    """
    if k < 1:
        raise ValueError(f"k={k} groups requested; need at least 1")
    loads = [0] * k
    groups: list[list[int]] = [[] for _ in range(k)]
    for i in sorted(range(len(seqlens)), key=lambda i: (-seqlens[i], i)):
        g = min(range(k), key=lambda j: (loads[j], j))
        groups[g].append(i)
        loads[g] += seqlens[i]
    return [sorted(g) for g in groups]


def split_by_token_budget(seqlens: list[int], max_tokens_per_mb: int | None, n_mbs: int = 1) -> list[list[int]]:
    """Group sequence indices into micro-batches of at most `max_tokens_per_mb` tokens.

    Returns at least `min(n_mbs, len(seqlens))` non-empty micro-batches, as few as the budget
    allows otherwise; each lists its indices in increasing order. The sequences, sorted longest
    first, are cut into consecutive runs with the smallest largest token count: micro-batches
    balanced by tokens whose sequences have similar lengths (the packed attention attends
    sequences of one length in one call; spread over micro-batches, each would take its own).
    Raises ValueError if a single sequence is longer than the budget (it cannot be split).
    """
    if n_mbs < 1:
        raise ValueError(f"n_mbs={n_mbs} must be >= 1")
    if not seqlens:
        return []
    budget = max_tokens_per_mb if max_tokens_per_mb is not None else sum(seqlens)
    longest = max(seqlens)
    if longest > budget:
        raise ValueError(
            f"a sequence of {longest} tokens exceeds max_tokens_per_mb={max_tokens_per_mb}; "
            f"set mb_spec.max_tokens_per_mb >= {longest}"
        )
    order = sorted(range(len(seqlens)), key=lambda i: (-seqlens[i], i))
    lens = [seqlens[i] for i in order]
    k = min(max(n_mbs, math.ceil(sum(lens) / budget), len(_cut(lens, budget))), len(lens))
    lo, hi = longest, budget  # the smallest cap whose cuts number at most k (more cuts as the cap falls)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if len(_cut(lens, mid)) <= k else (mid + 1, hi)
    runs = _cut(lens, lo)
    while len(runs) < k:  # n_mbs asks for more micro-batches than the tokens need: halve the largest
        j = max((j for j, (a, b) in enumerate(runs) if b - a > 1), key=lambda j: sum(lens[runs[j][0] : runs[j][1]]))
        a, b = runs[j]
        mid, load, half = a + 1, lens[a], sum(lens[a:b]) / 2
        while mid < b - 1 and load + lens[mid] <= half:
            load, mid = load + lens[mid], mid + 1
        runs[j : j + 1] = [(a, mid), (mid, b)]
    return [sorted(order[a:b]) for a, b in runs]


def _cut(lens: list[int], cap: int) -> list[tuple[int, int]]:
    """Consecutive runs [a, b) of `lens`, each as long as fits `cap` tokens (the fewest runs under it)."""
    runs, a, load = [], 0, 0
    for b, n in enumerate(lens):
        if b > a and load + n > cap:
            runs.append((a, b))
            a, load = b, 0
        load += n
    runs.append((a, len(lens)))
    return runs
