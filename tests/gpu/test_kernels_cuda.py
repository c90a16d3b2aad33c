"""GPU self-check, kernels: the compiled Triton kernels on CUDA tensors against the torch
reference (itself held against naive loops in tests/algo). Skipped without CUDA.

    python -m pytest -m cuda -q -s
"""

from __future__ import annotations

import pytest
import torch

from arealite.algo import advantages as adv
from tests.algo.test_advantages import random_packed_batch
from tests.tolerance import assert_close

pytestmark = pytest.mark.cuda
CUDA = torch.device("cuda")


def _reference_gae(rewards, values, mask, cu, gamma, lam):
    """The torch reference on the CPU in float64: the ground truth for both dtypes."""
    return adv.gae_packed_torch(rewards.double().cpu(), values.double().cpu(), mask.cpu(), cu.cpu(), gamma, lam)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gae_kernel_on_cuda_matches_the_reference_on_random_packed_batches(dtype):
    assert adv.backend(CUDA) == "triton"
    for seed in range(12):
        rewards, values, mask, cu = random_packed_batch(seed=seed, n_seqs=3 + seed * 5, max_len=64 << (seed % 5),
                                                        dtype=dtype, empty=seed % 2 == 1)  # fmt: skip
        gamma, lam = (1.0, 1.0) if seed % 3 == 0 else (0.99, 0.95)
        args = [t.to(CUDA) for t in (rewards, values, mask.bool(), cu)]
        got_adv, got_ret = adv.gae_packed(*args, gamma, lam)  # the dispatcher: the kernel, no host check
        assert got_adv.is_cuda and got_adv.dtype == dtype
        want_adv, want_ret = _reference_gae(rewards, values, mask, cu, gamma, lam)
        longest = int((cu[1:] - cu[:-1]).max())
        assert_close(got_adv, want_adv, dtype, n=longest, msg=f"seed {seed}")
        assert_close(got_ret, want_ret, dtype, n=longest, msg=f"seed {seed}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gae_kernel_on_cuda_long_and_empty_sequences(dtype):
    lengths = torch.tensor([70_000, 0, 5, 1024, 0, 3, 1])
    cu = torch.cat([torch.zeros(1, dtype=torch.int32), lengths.cumsum(0).int()])
    g = torch.Generator().manual_seed(70)
    n = int(cu[-1])
    rewards, values = torch.randn(n, generator=g, dtype=dtype), torch.randn(n, generator=g, dtype=dtype)
    mask = torch.rand(n, generator=g) < 0.9
    got_adv, got_ret = adv.gae_packed(*(t.to(CUDA) for t in (rewards, values, mask, cu)), 0.999, 0.95)
    want_adv, want_ret = _reference_gae(rewards, values, mask, cu, 0.999, 0.95)
    # the recurrence decays by 0.999 * 0.95 per token: ~1,000 terms carry weight
    assert_close(got_adv, want_adv, dtype, n=1000)
    assert_close(got_ret, want_ret, dtype, n=1000)


def test_malformed_cu_seqlens_on_cuda_give_nan_not_a_crash():
    x = torch.randn(12, device=CUDA)
    mask = torch.ones(12, dtype=torch.bool, device=CUDA)
    got_adv, _ = adv.gae_packed(x, x, mask, torch.tensor([0, 5, 40], device=CUDA), 0.99, 0.95)
    assert got_adv[5:].isnan().all() and not got_adv[:5].isnan().any()
    torch.cuda.synchronize()  # no illegal memory access: the context is still usable
    assert float(torch.ones(1, device=CUDA).sum()) == 1.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("mode", adv.GROUP_NORM_MODES)
def test_group_normalize_kernel_on_cuda(dtype, mode):
    for group_size in (2, 8, 16, 64):
        rewards = torch.randn(group_size * 300, generator=torch.Generator().manual_seed(group_size), dtype=dtype)
        rewards[:group_size] = 1.0  # identical rewards: std 0
        got = adv.group_normalize(rewards.to(CUDA), group_size, mode)
        want = adv.group_normalize_torch(rewards.double(), group_size, mode)
        std = rewards.double().view(-1, group_size).std(1, unbiased=False)
        scale = float(rewards.abs().max()) / float(std[std > 0].min())  # normalization amplifies rounding
        assert_close(got, want, dtype, n=group_size, scale=scale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_masked_whiten_and_broadcast_kernels_on_cuda(dtype):
    g = torch.Generator().manual_seed(8)
    x = torch.randn(64, 3000, generator=g, dtype=dtype) * 3 + 50
    mask = torch.rand(64, 3000, generator=g) < 0.7
    for shift_mean in (True, False):
        got = adv.masked_whiten(x.to(CUDA), mask.to(CUDA), shift_mean=shift_mean)
        want = adv.masked_whiten_torch(x.double(), mask, shift_mean=shift_mean)
        assert_close(got, want, dtype, n=x.numel(), scale=float(want.abs().max()) * 50 / 3)  # |x| / std rounding
    seq = torch.randn(64, generator=g, dtype=dtype)
    got = adv.broadcast_to_tokens(seq.to(CUDA), mask.to(CUDA))
    assert torch.equal(got.cpu(), adv.broadcast_to_tokens_torch(seq, mask))
