"""`min_operand`: the arithmetic task with operands from a range (the tool-use task's 32..99)."""

import re

import pytest

from arealite.config import DatasetConfig
from arealite.data.arithmetic import make_arithmetic_dataset
from arealite.data.loader import load_records


def test_operands_in_range_through_the_config():
    config = DatasetConfig(type="arithmetic", num_samples=300, ops="*", min_operand=32, max_operand=99)
    records = load_records(config, split="test", seed=3)
    pairs = [tuple(map(int, re.fullmatch(r"(\d+)\*(\d+)=", r["messages"][0]["content"]).groups())) for r in records]
    assert all(32 <= a <= 99 and 32 <= b <= 99 for a, b in pairs)
    assert {len(r["answer"]) for r in records} == {4}  # 32*32 = 1024 .. 99*99 = 9801
    assert min(min(p) for p in pairs) < 40 and max(max(p) for p in pairs) > 90  # the whole range is drawn


def test_default_range_unchanged_and_bad_range_refused():
    assert make_arithmetic_dataset(50, seed=1, max_operand=9) == make_arithmetic_dataset(
        50, seed=1, max_operand=9, min_operand=0
    )
    with pytest.raises(ValueError, match="min_operand=10 must be in 0..max_operand=9"):
        make_arithmetic_dataset(5, max_operand=9, min_operand=10)
