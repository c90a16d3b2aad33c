"""The sampler and the KV batch, in process, against naive references."""

from __future__ import annotations

import pytest
import torch

from arealite.server.model_runner import ModelRunner
from arealite.server.sampling import SamplingParams, UniformStream, _sample_truncated, apply_penalties, sample
from tests.tolerance import assert_close, close


def naive_allowed(probs: list[float], top_k: int, top_p: float, min_p: float) -> set[int]:
    """Tokens SGLang's top-k, then top-p, then min-p truncation keeps, one by one."""
    order = sorted(range(len(probs)), key=lambda i: -probs[i])
    kept, mass = [], 0.0
    for rank, i in enumerate(order):
        if top_k > 0 and rank >= top_k:
            break
        if rank > 0 and mass >= top_p:
            break
        kept.append(i)
        mass += probs[i]
    return {i for i in kept if probs[i] >= min_p * probs[order[0]]}


@pytest.mark.parametrize(
    "top_k,top_p,min_p", [(-1, 1.0, 0.0), (3, 1.0, 0.0), (-1, 0.6, 0.0), (-1, 1.0, 0.3), (5, 0.8, 0.1)]
)
def test_truncated_sampling_matches_naive_distribution(top_k, top_p, min_p):
    torch.manual_seed(0)
    logits = torch.randn(1, 12) * 2
    probs = torch.softmax(logits, -1)[0].tolist()
    allowed = naive_allowed(probs, top_k, top_p, min_p)
    params = [SamplingParams(top_k=top_k, top_p=top_p, min_p=min_p)]
    n = 20000
    uniforms = torch.rand(n, generator=torch.Generator().manual_seed(1))
    draws, _ = _sample_truncated(logits.expand(n, -1), params * n, uniforms)
    counts = torch.bincount(draws, minlength=12).double() / n
    total = sum(probs[i] for i in allowed)
    expected = torch.tensor([probs[i] / total if i in allowed else 0.0 for i in range(12)], dtype=torch.double)
    assert set(torch.nonzero(counts).flatten().tolist()) <= allowed
    assert (counts - expected).abs().max() < 0.015


def test_penalties_match_naive_loop():
    torch.manual_seed(2)
    logits = torch.randn(2, 10)
    counts = torch.tensor([[0, 2, 1, 0, 0, 0, 3, 0, 0, 0], [1, 0, 0, 0, 0, 0, 0, 0, 0, 5]], dtype=torch.float)
    seen = counts > 0
    seen[0, 4] = True  # a prompt token: repetition penalty only
    params = [
        SamplingParams(frequency_penalty=0.5, presence_penalty=0.25, repetition_penalty=1.3),
        SamplingParams(repetition_penalty=0.8),
    ]
    expected = logits.clone()
    for b, p in enumerate(params):
        for v in range(10):
            x = (
                expected[b, v].item()
                - p.frequency_penalty * counts[b, v].item()
                - p.presence_penalty * float(counts[b, v] > 0)
            )
            if seen[b, v]:
                x = x / p.repetition_penalty if x > 0 else x * p.repetition_penalty
            expected[b, v] = x
    out = logits.clone()
    apply_penalties(out, counts, seen, params)
    assert_close(out, expected, n=3)  # three fp32 operations per logit


def test_sample_logprobs_are_tempered_log_softmax():
    torch.manual_seed(3)
    logits = torch.randn(3, 20)
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.5),
        SamplingParams(temperature=1.3, top_k=2),
    ]
    streams = [UniformStream(i) for i in range(3)]
    out = sample(logits, params, streams, top_logprobs_num=4)
    assert out.tokens[0] == logits[0].argmax()
    for b, t in enumerate((1.0, 0.5, 1.3)):
        ref = torch.log_softmax(logits[b] / t, -1)
        assert close(out.logprobs[b].item(), ref[out.tokens[b]].item(), n=20)  # a softmax over 20 logits
        assert_close(out.top_logprobs[b], ref.topk(4).values, n=20)
    assert out.tokens[2] in logits[2].topk(2).indices


@pytest.mark.parametrize("impl", ["transformers", "arealite"])
def test_kv_batch_join_and_leave_equals_solo(model_dir, impl):
    """Rows joining (prefill into a running batch) and leaving (drop) give the same logits
    as each sequence alone, whatever order the batch keeps its rows in."""
    torch.set_num_threads(1)
    runner = ModelRunner(model_dir, model_impl=impl)
    prompts = [[1, 2, 3, 4, 5], [9, 8], [100, 101, 102, 103, 104, 105, 106, 107], [7, 7, 7]]

    def solo(prompt: list[int], steps: int) -> list[torch.Tensor]:
        batch = runner.new_batch()
        logits = runner.prefill(batch, [prompt])
        rows, token = [logits[0]], logits[0].argmax()[None]
        for _ in range(steps):
            logits = runner.decode(batch, token)
            rows.append(logits[0])
            token = logits[0].argmax()[None]
        return rows

    refs = [solo(p, 6) for p in prompts]
    batch = runner.new_batch()
    logits = runner.prefill(batch, prompts[:2])
    got = {0: [logits[0]], 1: [logits[1]]}
    live = [0, 1]  # the sequence in each row of the batch
    for step in range(6):
        if step == 2:  # newcomers join between decode steps
            new_logits = runner.prefill(batch, prompts[2:])
            got[2], got[3] = [new_logits[0]], [new_logits[1]]
            live += [2, 3]
        if step == 4:  # the longest-running row leaves; the others may change rows
            order = batch.drop({0})
            live = [live[i] for i in order]
            assert sorted(live) == [1, 2, 3]
        tokens = torch.stack([got[i][-1].argmax() for i in live])
        logits = runner.decode(batch, tokens)
        for row, i in enumerate(live):
            got[i].append(logits[row])
    for i, rows in got.items():
        for a, b in zip(rows, refs[i]):
            assert_close(a, b, n=64)  # fp32 logits through the tiny model's 64-long dot products
    assert batch.size == 3


def test_a_rows_draws_follow_its_seed_whatever_shares_the_batch():
    """Seeded sampling is per request: the same seed gives the same tokens alone or in a batch
    with other rows (sampled or greedy), across the stream's chunk boundary."""
    torch.manual_seed(5)
    steps = UniformStream.CHUNK + 10
    logits = torch.randn(steps, 4, 50)  # per step: the row of interest, then three others
    params = [SamplingParams(temperature=0.8), SamplingParams(temperature=0.0), SamplingParams(), SamplingParams()]
    alone, shared = UniformStream(11), [UniformStream(11), UniformStream(1), UniformStream(2), UniformStream(3)]
    got_alone = [sample(logits[s, :1], params[:1], [alone]).tokens[0].item() for s in range(steps)]
    got_shared = [sample(logits[s], params, shared).tokens[0].item() for s in range(steps)]
    assert got_alone == got_shared
    other = UniformStream(12)
    assert got_alone != [sample(logits[s, :1], params[:1], [other]).tokens[0].item() for s in range(steps)]
