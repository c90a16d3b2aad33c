"""benchmarks/time_to_accuracy.py reads a run's time to a target accuracy correctly: version v
is uploaded at the end of step v - 1, and the first version in training order that reaches the
target counts, not the best one."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import time_to_accuracy as tta


def test_version_time_is_the_end_of_the_step_that_uploaded_it() -> None:
    rows = [{"step": s, "elapsed_s": 1.5 * (s + 1)} for s in range(20)]
    assert tta.seconds_to_version(rows, 0) == 0.0
    assert tta.seconds_to_version(rows, 1) == 1.5
    assert tta.seconds_to_version(rows, 10) == 15.0
    with pytest.raises(ValueError, match="step 20"):
        tta.seconds_to_version(rows, 21)


def test_first_version_reaching_the_target_counts() -> None:
    curve = [(30, 0.8), (10, 0.4), (20, 0.76), (40, 0.9)]  # out of order on purpose
    assert tta.first_reaching(curve, 0.75) == 20
    assert tta.first_reaching(curve, 0.85) == 40
    assert tta.first_reaching(curve, 0.95) is None
