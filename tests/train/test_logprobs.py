"""Packed token log-probs and entropy: values and the fused backward against autograd's own."""

from __future__ import annotations

import pytest
import torch

from arealite.train import logprobs as lp_mod
from arealite.train.logprobs import packed_logprobs_and_entropy, packed_token_logprobs


def _reference(logits: torch.Tensor, ids: torch.Tensor, cu: torch.Tensor, t: float):
    """Plain autograd: log_softmax of each row / T at the next token, entropy, token-aligned."""
    x = logits[:-1] / t
    lsm = torch.log_softmax(x, dim=-1)
    lp = torch.cat([lsm.new_zeros(1), lsm.gather(-1, ids[1:, None]).squeeze(-1)])
    ent = torch.cat([lsm.new_zeros(1), -(lsm.exp() * lsm).sum(-1)])
    starts = cu[:-1].long()
    return lp.index_fill(0, starts, 0.0), ent.index_fill(0, starts, 0.0)


def _packed(n: int, v: int, dtype: torch.dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    logits = (3 * torch.randn(n, v, generator=g)).to(dtype)
    ids = torch.randint(0, v, (n,), generator=g)
    cu = torch.tensor([0, 3, n // 2, n])  # three sequences
    return logits, ids, cu


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_fused_backward_passes_gradcheck_in_float64(temperature):
    logits, ids, cu = _packed(11, 6, torch.float64, seed=0)
    logits.requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda x: packed_token_logprobs(x, ids, cu, temperature), (logits,), eps=1e-6, atol=1e-8, rtol=1e-6
    )


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_values_entropy_and_gradient_match_autograd_in_float32(monkeypatch, temperature):
    monkeypatch.setattr(lp_mod, "ENTROPY_CHUNK", 7)  # several chunks, the last one short
    logits, ids, cu = _packed(40, 33, torch.float32, seed=1)
    weights = torch.randn(40, generator=torch.Generator().manual_seed(2))
    ours = logits.clone().requires_grad_(True)
    lp, ent = packed_logprobs_and_entropy(ours, ids, cu, temperature)
    (lp * weights).sum().backward()
    ref_logits = logits.clone().requires_grad_(True)
    ref_lp, ref_ent = _reference(ref_logits, ids, cu, temperature)
    (ref_lp * weights).sum().backward()
    # fp32 reductions over a 33-wide vocabulary: a few ulps of values of order 1-10
    torch.testing.assert_close(lp, ref_lp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent, ref_ent, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours.grad, ref_logits.grad, rtol=1e-5, atol=1e-6)
    assert not ent.requires_grad
    assert lp[cu[:-1]].abs().max() == 0 and ent[cu[:-1]].abs().max() == 0  # first tokens predict nothing
    assert ours.grad[-1].abs().max() == 0  # the last row predicts no token here


def test_bfloat16_logits_get_a_bfloat16_gradient_within_its_rounding():
    logits, ids, cu = _packed(24, 17, torch.bfloat16, seed=3)
    ours = logits.clone().requires_grad_(True)
    packed_token_logprobs(ours, ids, cu).sum().backward()
    ref = logits.float().requires_grad_(True)
    _reference(ref, ids, cu, 1.0)[0].sum().backward()
    assert ours.grad.dtype == torch.bfloat16
    # one bf16 rounding of values at most 1 in magnitude: 2^-8 relative
    torch.testing.assert_close(ours.grad.float(), ref.grad, rtol=2**-8, atol=2**-8)


def test_no_grad_and_short_inputs():
    logits, ids, cu = _packed(9, 5, torch.float32, seed=4)
    with torch.no_grad():
        lp, ent = packed_logprobs_and_entropy(logits, ids, cu)
    ref_lp, ref_ent = _reference(logits, ids, cu, 1.0)
    torch.testing.assert_close(lp, ref_lp, rtol=1e-5, atol=1e-5)
    lp1, ent1 = packed_logprobs_and_entropy(logits[:1], ids[:1], torch.tensor([0, 1]))
    assert lp1.tolist() == [0.0] and ent1.tolist() == [0.0]
    assert packed_logprobs_and_entropy(logits, ids, cu, entropy=False)[1] is None
    with pytest.raises(ValueError, match="temperature=0"):
        packed_token_logprobs(logits, ids, cu, temperature=0)
