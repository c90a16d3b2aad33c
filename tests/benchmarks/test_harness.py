"""benchmarks/harness.quartiles: the inclusive quartiles of `statistics`, and a run that never
got there (inf, as time_to_accuracy.py records it) moves only the quartiles it reaches."""

from __future__ import annotations

import math
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import harness


def test_quartiles_are_the_inclusive_method() -> None:
    rng = random.Random(0)
    for n in range(2, 12):
        xs = [rng.uniform(0.5, 3.0) for _ in range(n)]
        lo, p25, med, p75, hi = harness.quartiles(xs)
        expected = statistics.quantiles(xs, n=4, method="inclusive")
        assert (lo, hi) == (min(xs), max(xs))
        for got, want in zip((p25, med, p75), expected):
            assert math.isclose(got, want, rel_tol=1e-12), (n, got, want)
    assert harness.quartiles([5.0]) == (5.0,) * 5


def test_an_unreached_run_leaves_the_median_finite() -> None:
    lo, p25, med, p75, hi = harness.quartiles([132.0, math.inf, 117.0])
    assert (lo, p25, med) == (117.0, 124.5, 132.0)
    assert math.isinf(p75) and math.isinf(hi)
