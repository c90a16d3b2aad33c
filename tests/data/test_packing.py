"""Packing, unpacking and token-budget splitting of padded trajectory batches."""

from __future__ import annotations

import random

import pytest
import torch

from arealite.data.packing import (
    balanced_partition,
    concat,
    pack,
    position_ids_of,
    select,
    seqlens_of,
    split_by_token_budget,
    unpack,
)


def _batch(lens: list[int]) -> dict:
    B, T = len(lens), max(lens) + 2  # extra all-pad columns
    am = (torch.arange(T)[None] < torch.tensor(lens)[:, None]).long()
    ids = torch.arange(1, B * T + 1).view(B, T) * am
    return {"input_ids": ids, "attention_mask": am, "loss_mask": am.clone(), "rewards": torch.arange(B).float(),
            "values": torch.randn(B, T, 3), "note": "kept"}  # fmt: skip


def test_pack_then_unpack_round_trips():
    batch = _batch([5, 1, 3])
    packed = pack(batch)
    assert packed["cu_seqlens"].tolist() == [0, 5, 6, 9] and packed["cu_seqlens"].dtype == torch.int32
    assert packed["position_ids"].tolist() == [0, 1, 2, 3, 4, 0, 0, 1, 2]
    assert packed["max_seqlen"] == 5 and packed["note"] == "kept"
    assert torch.equal(packed["rewards"], batch["rewards"])
    T = batch["input_ids"].shape[1]
    assert torch.equal(unpack(packed["input_ids"], packed["cu_seqlens"], T), batch["input_ids"])
    am = batch["attention_mask"].bool()[..., None]
    assert torch.equal(unpack(packed["values"], packed["cu_seqlens"], T), batch["values"] * am)


def test_left_padding_is_rejected_with_the_row():
    am = torch.tensor([[1, 1, 0], [0, 1, 1]])
    with pytest.raises(ValueError, match="row 1 is not right-padded"):
        seqlens_of(am)


def test_position_ids_restart_per_sequence():
    cu = torch.tensor([0, 2, 2, 5], dtype=torch.int32)  # an empty sequence in the middle
    assert position_ids_of(cu).tolist() == [0, 1, 0, 1, 2]


def test_select_trims_and_concat_restores():
    batch = _batch([5, 2, 3])
    sub = select(batch, [1, 2])
    assert sub["input_ids"].shape == (2, 3) and sub["rewards"].tolist() == [1.0, 2.0]
    both = concat([select(batch, [0]), sub])
    assert torch.equal(both["input_ids"], batch["input_ids"][:, :5])


@pytest.mark.parametrize("seed", range(20))
def test_split_by_token_budget_properties(seed):
    rng = random.Random(seed)
    lens = [rng.randint(1, 50) for _ in range(rng.randint(1, 30))]
    budget = rng.randint(max(lens), 200)
    n_mbs = rng.randint(1, 6)
    groups = split_by_token_budget(lens, budget, n_mbs)
    flat = sorted(i for g in groups for i in g)
    assert flat == list(range(len(lens)))  # every sequence exactly once
    assert all(g == sorted(g) and g for g in groups)
    assert all(sum(lens[i] for i in g) <= budget for g in groups)
    assert len(groups) >= min(n_mbs, len(lens))
    assert len(groups) <= max(n_mbs, 2 * -(-sum(lens) // budget))  # no wasteful splitting


def test_split_puts_similar_lengths_together_and_balances_tokens():
    """Two lengths, interleaved: each micro-batch holds one of them (the packed attention
    attends equal lengths in one call), and the token counts are as even as consecutive cuts allow."""
    lens = [40, 10, 10, 10, 10] * 5  # 200 tokens of each length
    groups = split_by_token_budget(lens, 200, 1)
    assert sorted(sorted({lens[i] for i in g}) for g in groups) == [[10], [40]]
    assert [sum(lens[i] for i in g) for g in groups] == [200, 200]
    groups = split_by_token_budget(lens, 400, 4)  # more micro-batches than the budget needs
    # 40 x 5 then 10 x 20 in four consecutive runs: at best 120 tokens in the largest (40 x 3)
    assert len(groups) == 4 and max(sum(lens[i] for i in g) for g in groups) == 120
    assert split_by_token_budget([5] * 5, 100, 4) == [[0], [1], [2, 3], [4]]  # halved where n_mbs asks for more


def test_split_without_budget_and_over_budget():
    assert split_by_token_budget([3, 4, 5], None, 1) == [[0, 1, 2]]
    assert sorted(map(sorted, split_by_token_budget([3, 4, 5], None, 3))) == [[0], [1], [2]]
    with pytest.raises(ValueError, match="max_tokens_per_mb >= 9"):
        split_by_token_budget([3, 9], 8, 1)


def test_balanced_partition_is_balanced():
    lens = [10, 9, 8, 7, 6, 5, 4, 3, 2, 1]
    groups = balanced_partition(lens, 3)
    loads = [sum(lens[i] for i in g) for g in groups]
    assert sorted(i for g in groups for i in g) == list(range(10))
    assert max(loads) - min(loads) <= max(lens) // 2
    assert balanced_partition([5], 2) == [[0], []]
