"""Prefill in length-sorted groups (server/prefill_plan.py): the cut is the cheapest one under
the cost model, and grouping changes which forwards run, never what a request generates."""

import itertools
import random
import threading

import pytest
import torch
from transformers import AutoTokenizer

from arealite.server.model_runner import ModelRunner
from arealite.server.prefill_plan import plan_groups
from arealite.server.request import Req
from arealite.server.sampling import SamplingParams
from arealite.server.scheduler import Scheduler, SchedulerLimits


def _cost(lengths, groups, overhead, quadratic):
    return sum(overhead + len(g) * (w + w * w / quadratic) for g in groups for w in [max(lengths[i] for i in g)])


def _brute_force(lengths, overhead, quadratic):
    """The least cost over every cut of the sorted distinct lengths into contiguous runs."""
    widths = sorted(set(lengths), reverse=True)
    best = float("inf")
    for mask in range(1 << (len(widths) - 1)):
        groups, current = [], [widths[0]]
        for k, width in enumerate(widths[1:]):
            if mask >> k & 1:
                groups.append(current)
                current = []
            current.append(width)
        groups.append(current)
        rows = [[i for i, n in enumerate(lengths) if n in set(g)] for g in groups]
        best = min(best, _cost(lengths, rows, overhead, quadratic))
    return best


@pytest.mark.parametrize("seed", range(6))
def test_the_cut_is_the_cheapest(seed):
    rng = random.Random(seed)
    lengths = [rng.randint(1, 60) for _ in range(rng.randint(1, 14))]
    overhead, quadratic = rng.choice([0.0, 10.0, 40.0, 200.0]), rng.choice([20.0, 285.0])
    groups = plan_groups(lengths, overhead, quadratic)
    assert sorted(itertools.chain(*groups)) == list(range(len(lengths)))
    widths = [[lengths[i] for i in g] for g in groups]
    assert all(w == sorted(w, reverse=True) for w in widths)  # each group longest first
    assert all(min(a) > max(b) for a, b in itertools.pairwise(widths))  # longest group first, equal lengths together
    assert _cost(lengths, groups, overhead, quadratic) == pytest.approx(_brute_force(lengths, overhead, quadratic))


def test_the_overhead_sets_the_number_of_forwards():
    lengths = [16, 17, 40, 41, 90, 128, 128]
    assert plan_groups(lengths, overhead=1e9) == [[5, 6, 4, 3, 2, 1, 0]]  # one forward
    assert len(plan_groups(lengths, overhead=0.0)) == 6  # one per distinct length
    assert plan_groups([]) == []
    with pytest.raises(ValueError, match="overhead"):
        plan_groups(lengths, overhead=-1.0)


def _generate(model_dir: str, prompts: list[list[int]], overhead: float) -> tuple[list[Req], list[int]]:
    """Run `prompts` (sampled, seeded) through one scheduler; returns the requests and the
    number of prompts in each prefill forward."""
    runner = ModelRunner(model_dir)
    forwards: list[int] = []
    prefill = runner.prefill
    runner.prefill = lambda batch, ps, *a, **k: forwards.append(len(ps)) or prefill(batch, ps, *a, **k)
    limits = SchedulerLimits(prefill_group_overhead=overhead)
    scheduler = Scheduler(runner, AutoTokenizer.from_pretrained(model_dir), set(), limits, "0")
    done = threading.Semaphore(0)
    reqs = [
        Req(f"r{i}", p, SamplingParams(max_new_tokens=6, ignore_eos=True), 6, return_logprob=True, seed=i,
            logprob_start_len=0, on_event=lambda r, n, fin: fin and done.release())
        for i, p in enumerate(prompts)
    ]  # fmt: skip
    for req in reqs:  # queued before the scheduler starts: all admitted together
        scheduler.submit(req)
    scheduler.start()
    try:
        for _ in reqs:
            assert done.acquire(timeout=60)
    finally:
        scheduler.stop()
    return reqs, forwards


def test_groups_generate_what_one_forward_generates(tiny_model_dir):
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 200) for _ in range(rng.choice([3, 4, 20, 21, 60]))] for _ in range(10)]
    one, one_forwards = _generate(tiny_model_dir, prompts, overhead=1e9)
    grouped, grouped_forwards = _generate(tiny_model_dir, prompts, overhead=0.0)
    assert one_forwards == [10]
    assert len(grouped_forwards) == 5 and sum(grouped_forwards) == 10  # one forward per distinct length
    for a, b in zip(one, grouped):
        assert a.output_ids == b.output_ids
        # fp32 logits of a 2-layer model: padding changes only the summation order
        torch.testing.assert_close(
            torch.tensor(b.output_logprobs), torch.tensor(a.output_logprobs), rtol=1e-4, atol=1e-5
        )
        torch.testing.assert_close(
            torch.tensor(b.input_logprobs[1:]), torch.tensor(a.input_logprobs[1:]), rtol=1e-4, atol=1e-5
        )
