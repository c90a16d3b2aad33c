"""The server's grouped-query sdpa against transformers' eager attention (repeat_kv)."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from arealite.server.attention import grouped_sdpa_forward
from arealite.server.model_runner import ModelRunner
from tests.tolerance import assert_close


def _eager_reference(q, k, v, mask):
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5 + mask
    return (scores.softmax(-1) @ v).transpose(1, 2)


def test_grouped_heads_match_repeated_kv_for_prefill_and_decode():
    g = torch.Generator().manual_seed(0)
    for q_len in (1, 6):  # decode, prefill
        q = torch.randn(3, 4, q_len, 8, generator=g)
        k, v = torch.randn(3, 2, 6, 8, generator=g), torch.randn(3, 2, 6, 8, generator=g)
        keep = torch.rand(3, 1, q_len, 6, generator=g) > 0.3
        keep[..., -1] = True  # every query row sees at least one key
        mask = torch.where(keep, 0.0, torch.finfo(torch.float32).min)
        out, weights = grouped_sdpa_forward(torch.nn.Module(), q, k, v, mask)
        assert weights is None and out.shape == (3, q_len, 4, 8)
        assert_close(out, _eager_reference(q, k, v, mask), n=6 * 8)  # softmax over 6 keys of dim 8


@pytest.mark.parametrize("impl", ["transformers", "arealite"])
def test_runner_matches_eager_model_and_stays_finite_on_left_padding(tiny_model_dir, impl):
    runner = ModelRunner(tiny_model_dir, model_impl=impl)
    eager = AutoModelForCausalLM.from_pretrained(
        tiny_model_dir, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    prompts = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17]]
    batch = runner.new_batch()
    logits = runner.prefill(batch, prompts, all_logits=True)
    assert torch.isfinite(logits).all()  # the padding rows of short prompts too
    step = runner.decode(batch, torch.tensor([20, 21, 22]))
    with torch.no_grad():
        for i, p in enumerate(prompts):
            ref = eager(input_ids=torch.tensor([p + [20 + i]])).logits[0]
            assert_close(logits[i, -len(p) :], ref[:-1], n=64)  # the tiny model's hidden size
            assert_close(step[i], ref[-1], n=64)
