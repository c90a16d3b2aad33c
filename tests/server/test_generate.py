"""/generate against a live built-in server: shapes, logprob fidelity, batching correctness."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from tests.server.conftest import reference_greedy, reference_logprobs
from tests.tolerance import tolerance

pytestmark = pytest.mark.timeout(180)
EOS = 514  # the tiny model's <|im_end|>


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(0, 512) for _ in range(rng.randint(2, 20))] for _ in range(n)]


def test_single_generate_shape(server):
    status, out = server.post(
        "/generate",
        {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 6, "temperature": 0}, "return_logprob": True},
    )
    assert status == 200, out
    meta = out["meta_info"]
    assert len(out["output_ids"]) == meta["completion_tokens"] == len(meta["output_token_logprobs"])
    assert [t[1] for t in meta["output_token_logprobs"]] == out["output_ids"]
    assert meta["prompt_tokens"] == 3 and meta["weight_version"] == "default"
    assert meta["finish_reason"]["type"] in ("length", "stop")
    assert isinstance(out["text"], str) and meta["id"]


@pytest.mark.parametrize("temperature", [0.0, 1.0, 0.7])
def test_logprobs_match_plain_forward(server, hf_model, temperature):
    """Server logprobs == log_softmax(logits / T) of one plain forward, up to fp32 rounding."""
    prompts = _prompts(6, seed=1)
    body = {
        "input_ids": prompts,
        "return_logprob": True,
        "sampling_params": {"max_new_tokens": 12, "temperature": temperature, "ignore_eos": True},
    }
    status, outs = server.post("/generate", body)
    assert status == 200, outs
    diffs, scale = [], []
    for prompt, out in zip(prompts, outs):
        served = [t[0] for t in out["meta_info"]["output_token_logprobs"]]
        ref = reference_logprobs(hf_model, prompt, out["output_ids"], temperature)
        diffs += [abs(a - b) for a, b in zip(served, ref)]
        scale += [abs(b) for b in ref]
    assert len(diffs) == 6 * 12
    # fp32 rounding through the tiny model's 64-long dot products, relative to mean |logprob|
    bound = tolerance(torch.float32, 64) * max(sum(scale) / len(scale), 1.0)
    assert sum(diffs) / len(diffs) <= bound, (max(diffs), bound)


def test_batched_greedy_equals_alone_and_reference(server, hf_model):
    """Concurrent requests join and leave one batch; each greedy output equals its solo run."""
    prompts = _prompts(10, seed=2)
    lengths = [3 + 2 * i for i in range(10)]  # different lengths so rows leave at different steps

    def call(i):
        body = {
            "input_ids": prompts[i],
            "sampling_params": {"max_new_tokens": lengths[i], "temperature": 0, "ignore_eos": True},
        }
        return server.post("/generate", body)[1]["output_ids"]

    with ThreadPoolExecutor(10) as pool:
        batched = list(pool.map(call, range(10)))
    alone = [call(i) for i in range(10)]
    assert batched == alone
    for i in (0, 5, 9):
        assert batched[i] == reference_greedy(hf_model, prompts[i], lengths[i])
