"""batch_stats' length percentiles and mixed-version share against naive loops, on 1 and 2 ranks."""

from __future__ import annotations

import random

import pytest
import torch
import torch.multiprocessing as mp

from arealite.stats.batch import batch_stats
from arealite.stats.tracker import StatsTracker


def _batch(lengths: list[int], prompt_len: int = 3) -> dict[str, torch.Tensor]:
    """Right-padded rows of `prompt_len` prompt tokens then `lengths[i]` response tokens, all of version 0."""
    width = prompt_len + max(lengths)
    loss_mask = torch.zeros(len(lengths), width, dtype=torch.bool)
    for i, n in enumerate(lengths):
        loss_mask[i, prompt_len : prompt_len + n] = True
    attn = loss_mask.clone()
    attn[:, :prompt_len] = True
    return {
        "attention_mask": attn,
        "loss_mask": loss_mask,
        "rewards": torch.zeros(len(lengths)),
        "versions": torch.where(loss_mask, 0, -1),
    }


def _nearest_rank(values: list[int], q: float) -> int:
    ordered = sorted(values)
    for i, v in enumerate(ordered):
        if i + 1 >= q * len(ordered):
            return v
    raise AssertionError


def test_length_percentiles_and_mixed_versions_equal_a_naive_loop():
    rng = random.Random(0)
    lengths = [int(rng.lognormvariate(3.5, 0.8)) + 2 for _ in range(37)]
    batch = _batch(lengths)
    for row in (2, 5, 11):  # a weight sync landed mid-answer: the answer's last token is of version 1
        batch["versions"][row, 3 + lengths[row] - 1] = 1
    stats = batch_stats(StatsTracker(), batch)
    assert stats["response_len_p50"] == _nearest_rank(lengths, 0.5)
    assert stats["response_len_p95"] == _nearest_rank(lengths, 0.95)
    naive = sum(len({int(v) for v in batch["versions"][r][batch["loss_mask"][r]]}) > 1 for r in range(37)) / 37
    assert naive == pytest.approx(3 / 37) and stats["mixed_version_frac"] == pytest.approx(naive)


def _two_rank_worker(rank: int, port: int, shares: list[list[int]], out: dict) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    batch = _batch(shares[rank])
    if rank == 1:
        batch["versions"][0, 3] = 7  # one mixed row on rank 1
    out[rank] = batch_stats(StatsTracker(), batch)
    dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_two_ranks_give_the_percentiles_of_the_whole_batch():
    from arealite.utils.net import free_ports

    shares = [[5, 6, 7], [40, 50, 60, 70, 300, 400]]  # per-rank medians 6 and 65; the whole batch's is 50
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_two_rank_worker, args=(free_ports(1)[0], shares, out), nprocs=2, join=True)
        results = dict(out)
    everything = shares[0] + shares[1]
    for rank in (0, 1):
        assert results[rank]["response_len_p50"] == _nearest_rank(everything, 0.5) == 50
        assert results[rank]["response_len_p95"] == _nearest_rank(everything, 0.95) == 400
        assert results[rank]["mixed_version_frac"] == pytest.approx(1 / 9)
