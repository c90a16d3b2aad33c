"""How one admitted batch is prefilled: length-sorted groups, each one padded forward.

A prefill forward pads every prompt to the longest of its batch, so prompts of mixed lengths
pay for padding: 16-128-token prompts in one forward are 40-45% padding. Split into groups
of similar lengths, each forward pads little but costs a fixed overhead of its own. The
cut minimising the modelled cost is exact (dynamic programming over the distinct lengths,
longest first): a group of `rows` prompts padded to `width` costs
    overhead + rows * (width + width**2 / quadratic),
in units of one padded token's linear work; `quadratic` is the width at which attention
costs as much as the rest per token. The defaults come from timing the tiny model on a CPU
(a forward's fixed cost is about 140 tokens' linear work; attention equals the rest at about
285 tokens); a GPU runs tokens far cheaper than forwards, so the CLI uses a larger overhead
there (fewer, larger groups).
"""

from __future__ import annotations

from collections.abc import Sequence

CPU_OVERHEAD_TOKENS = 140
GPU_OVERHEAD_TOKENS = 4096
QUADRATIC_TOKENS = 285


def plan_groups(
    lengths: Sequence[int], overhead: float = CPU_OVERHEAD_TOKENS, quadratic: float = QUADRATIC_TOKENS
) -> list[list[int]]:
    """Indices into `lengths`, grouped: each group's lengths close together, longest group
    first, each group longest first. Every index appears once; equal lengths share a group."""
    if not lengths:
        return []
    if overhead < 0 or quadratic <= 0:
        raise ValueError(f"plan_groups: overhead ({overhead}) must be >= 0 and quadratic ({quadratic}) > 0")
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    widths: list[int] = []  # distinct lengths, descending
    ends: list[int] = []  # ends[k]: rows with length >= widths[k] (a prefix of `order`)
    for n, i in enumerate(order, 1):
        if widths and widths[-1] == lengths[i]:
            ends[-1] = n
        else:
            widths.append(lengths[i])
            ends.append(n)
    # best[k]: least cost of the rows longer than widths[k] (the first k distinct lengths);
    # a group opened at widths[j] and closed after widths[k-1] holds rows ends[j-1]..ends[k-1].
    best, cut = [0.0], [0]
    for k in range(1, len(widths) + 1):
        choice, value = 0, float("inf")
        for j in range(k):
            start = ends[j - 1] if j else 0
            width = widths[j]
            cost = best[j] + overhead + (ends[k - 1] - start) * (width + width * width / quadratic)
            if cost < value:
                choice, value = j, cost
        best.append(value)
        cut.append(choice)
    groups, k = [], len(widths)
    while k:
        j = cut[k]
        groups.append(order[(ends[j - 1] if j else 0) : ends[k - 1]])
        k = j
    return groups[::-1]
