"""Prompt logprobs with nothing generated (`max_new_tokens: 0`, `logprob_start_len`): the call
a distillation teacher answers (arealite/rollout/teacher.py). Checked against a plain
transformers forward, alone and while other requests decode beside it."""

from __future__ import annotations

import concurrent.futures

import pytest
import torch

from tests.server.conftest import reference_greedy, reference_logprobs
from tests.tolerance import tolerance

pytestmark = pytest.mark.timeout(180)


def score(server, prompts: list[list[int]], start: int, temperature: float = 1.0) -> list[dict]:
    status, out = server.post(
        "/generate",
        {
            "input_ids": prompts,
            "sampling_params": {"max_new_tokens": 0, "temperature": temperature},
            "return_logprob": True,
            "logprob_start_len": start,
        },
    )
    assert status == 200, out
    return out


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_prompt_logprobs_without_generation_match_a_plain_forward(server, hf_model, temperature):
    prompts = [[5, 6, 7, 8, 9, 10, 11], [20, 21, 22, 23]]  # two lengths in one batch: left padding inside
    start = 2
    for prompt, out in zip(prompts, score(server, prompts, start, temperature)):
        meta = out["meta_info"]
        assert out["output_ids"] == [] and meta["finish_reason"] == {"type": "length", "length": 0}
        entries = meta["input_token_logprobs"]
        assert [e[1] for e in entries] == prompt[start:]  # entry k is token start + k
        expected = reference_logprobs(hf_model, prompt[:start], prompt[start:], temperature)
        got = [e[0] for e in entries]
        bound = tolerance(torch.float32, hf_model.config.hidden_size, k=16) * max(map(abs, expected))
        assert max(abs(a - b) for a, b in zip(got, expected)) <= bound, (got, expected)


def test_scoring_beside_running_generations_leaves_them_unchanged(server, hf_model):
    """Scoring rows join the running batch and leave it at once; the decoding rows must not
    notice (a wrong row kept or dropped would change their greedy tokens)."""
    prompt, n = [30, 31, 32], 24
    expected = reference_greedy(hf_model, prompt, n)
    gen_body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}}
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        gens = [pool.submit(server.post, "/generate", gen_body) for _ in range(2)]
        scores = [pool.submit(score, server, [[5, 6, 7, 8], [9, 10]], 0) for _ in range(4)]
        for f in gens:
            status, out = f.result()
            assert status == 200 and out["output_ids"] == expected
        for f in scores:
            first, second = f.result()
            assert [e[1] for e in first["meta_info"]["input_token_logprobs"]] == [5, 6, 7, 8]
            assert second["meta_info"]["input_token_logprobs"][0][0] is None  # position 0 has no logprob
