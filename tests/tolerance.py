"""Float tolerances for the tests: relative, from the dtype's epsilon and the reduction size.

A result computed in `dtype` by reductions of about `n` terms carries a rounding error of
about eps(dtype) * sqrt(n) (a random walk of n roundings) times the magnitude of what was
summed. The bounds below allow `k` times that, relative to the reference's largest
magnitude (elementwise relative error means nothing next to values that cancel to ~0).
A bug (a wrong token, a missing term, a dtype dropped) moves results by orders of magnitude
more than this, so the tests can fail; rounding never reaches it, so they do not flake on
another machine's kernels (the fixed 1e-4 these replace failed at 1.22e-4 on one).
"""

from __future__ import annotations

import math

import torch

EPS32 = torch.finfo(torch.float32).eps  # 1.19e-7
EPS64 = torch.finfo(torch.float64).eps  # 2.22e-16
EPS_BF16 = torch.finfo(torch.bfloat16).eps  # 7.81e-3 (8 mantissa bits)


def eps(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps


def tolerance(dtype: torch.dtype, n: int = 1, k: float = 8.0) -> float:
    """k * eps(dtype) * sqrt(n): the relative bound for a result of n-term reductions in dtype."""
    return k * eps(dtype) * math.sqrt(max(n, 1))


def magnitude(t: torch.Tensor | float) -> float:
    """The scale a tolerance is relative to: the largest |value| (at least the smallest normal)."""
    if isinstance(t, torch.Tensor):
        m = float(t.detach().abs().max()) if t.numel() else 0.0
    else:
        m = abs(float(t))
    return max(m, torch.finfo(torch.float32).tiny)


def assert_close(
    actual: torch.Tensor,
    expected: torch.Tensor,
    dtype: torch.dtype = torch.float32,
    n: int = 1,
    k: float = 8.0,
    scale: float | None = None,
    msg: str = "",
) -> None:
    """|actual - expected| <= tolerance(dtype, n, k) * scale everywhere (scale: max |expected|).

    `dtype` is the precision the result was computed in (not necessarily its storage dtype).
    """
    expected = expected.detach().to(actual.device)
    bound = tolerance(dtype, n, k) * (magnitude(expected) if scale is None else scale)
    torch.testing.assert_close(actual.detach().to(expected.dtype), expected, rtol=0.0, atol=bound, msg=msg or None)


def close(
    a: float, b: float, dtype: torch.dtype = torch.float32, n: int = 1, k: float = 8.0, scale: float | None = None
) -> bool:
    """Scalar form of `assert_close`: |a - b| <= tolerance(dtype, n, k) * max(|a|, |b|) (or `scale`)."""
    s = max(abs(a), abs(b), torch.finfo(torch.float32).tiny) if scale is None else scale
    return abs(a - b) <= tolerance(dtype, n, k) * s
