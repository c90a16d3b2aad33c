"""Advantage functions, torch reference and Triton kernels (TRITON_INTERPRET=1 on CPU), each
held against a naive Python loop written straight from the documented semantics."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from arealite.algo import advantages as adv
from tests.tolerance import assert_close

GAMMAS_LAMS = list(itertools.product([1.0, 0.99, 0.95], [1.0, 0.99, 0.95]))


# Triton runs compiled on CUDA tensors where CUDA is present, else in the interpreter on the CPU
# (tests/conftest.py sets TRITON_INTERPRET=1 only without CUDA).
KERNEL_DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def kernel(fn):
    """`fn` with its tensor arguments moved to KERNEL_DEVICE."""

    def call(*args, **kwargs):
        return fn(*(a.to(KERNEL_DEVICE) if isinstance(a, torch.Tensor) else a for a in args), **kwargs)

    return call


# ----------------------------------------------------------------------------- naive loops


def naive_gae(rewards, values, mask, cu_seqlens, gamma, lam):
    """One Python step per token, backward within each sequence (module docstring semantics)."""
    r, v, m, cu = rewards.tolist(), values.tolist(), mask.tolist(), cu_seqlens.tolist()
    advantages, returns = [0.0] * len(r), list(v)
    for start, end in zip(cu[:-1], cu[1:]):
        a_next, v_next = 0.0, 0.0
        for t in range(end - 1, start - 1, -1):
            if not m[t]:
                continue
            delta = r[t] + gamma * v_next - v[t]
            a_next = delta + gamma * lam * a_next
            v_next = v[t]
            advantages[t], returns[t] = a_next, a_next + v[t]
    return torch.tensor(advantages, dtype=torch.float64), torch.tensor(returns, dtype=torch.float64)


def naive_group_normalize(rewards, group_size, mode, eps, std="sample"):
    r, out = rewards.tolist(), []
    divisor = group_size - 1 if std == "sample" and group_size > 1 else group_size
    for g in range(0, len(r), group_size):
        group = r[g : g + group_size]
        mean = sum(group) / group_size
        sd = math.sqrt(sum((x - mean) ** 2 for x in group) / divisor)
        for i, x in enumerate(group):
            if mode == "mean_std":
                out.append((x - mean) / (sd + eps))
            elif mode == "mean":
                out.append(x - mean)
            else:
                others = group[:i] + group[i + 1 :]
                out.append(x - sum(others) / len(others))
    return torch.tensor(out, dtype=torch.float64)


def naive_whiten(x, mask, eps, shift_mean):
    xs, ms = x.flatten().tolist(), mask.flatten().tolist()
    picked = [a for a, k in zip(xs, ms) if k]
    mean = sum(picked) / max(len(picked), 1)
    var = sum((a - mean) ** 2 for a in picked) / max(len(picked), 1)
    out = [((a - mean) / math.sqrt(var + eps) + (0.0 if shift_mean else mean)) if k else 0.0 for a, k in zip(xs, ms)]
    return torch.tensor(out, dtype=torch.float64).view(x.shape)


def _group_norm_scale(rewards, group_size, mode):
    """Error scale of a group normalization: input rounding, amplified by 1/std in mean_std mode."""
    x = rewards.double().view(-1, group_size)
    scale = float(x.abs().max())
    if mode == "mean_std":
        std = x.std(1, unbiased=False)
        scale /= float(std[std > 0].min())
    return scale


# ----------------------------------------------------------------------------- random batches


def random_packed_batch(seed, n_seqs, max_len=512, dtype=torch.float32, empty=False):
    """Packed batch with lengths 1..max_len (both extremes present), prompts and multi-turn holes."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, max_len + 1, (n_seqs,), generator=g)
    lengths[0], lengths[-1] = max_len, 1
    if empty:
        lengths[n_seqs // 2] = 0
    masks = []
    for length in lengths.tolist():
        m = torch.zeros(length, dtype=torch.long)
        t = int(torch.randint(0, max(length // 4, 1), (1,), generator=g))  # prompt
        while t < length:  # alternating model turns and environment turns
            turn = int(torch.randint(1, 64, (1,), generator=g))
            m[t : t + turn] = 1
            t += turn + int(torch.randint(0, 16, (1,), generator=g))
        m[torch.rand(length, generator=g) < 0.05] = 0  # scattered holes
        masks.append(m)
    masks[1] = torch.zeros_like(masks[1])  # a sequence with no trained token
    n = int(lengths.sum())
    cu = torch.zeros(n_seqs + 1, dtype=torch.int32)
    cu[1:] = lengths.cumsum(0)
    rewards = torch.randn(n, generator=g, dtype=torch.float64).to(dtype)
    values = torch.randn(n, generator=g, dtype=torch.float64).to(dtype)
    return rewards, values, torch.cat(masks), cu


# ----------------------------------------------------------------------------- GAE, torch


@pytest.mark.parametrize("gamma,lam", GAMMAS_LAMS)
def test_gae_torch_matches_naive_loop(gamma, lam):
    rewards, values, mask, cu = random_packed_batch(seed=int(gamma * 100 + lam * 10), n_seqs=24)
    got_adv, got_ret = adv.gae_packed_torch(rewards, values, mask, cu, gamma, lam)
    want_adv, want_ret = naive_gae(rewards, values, mask, cu, gamma, lam)
    assert got_adv.dtype == torch.float32 and got_adv.shape == rewards.shape
    # fp32 scans over sequences of up to 512 tokens
    assert_close(got_adv, want_adv, torch.float32, n=512)
    assert_close(got_ret, want_ret, torch.float32, n=512)


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.95, 0.99), (0.9, 0.0), (0.0, 0.5)])
def test_gae_torch_float64_is_exact_on_long_sequences(gamma, lam):
    # Lengths up to 5000 force three levels of the blocked scan; float64 exposes logic slips.
    rewards, values, mask, cu = random_packed_batch(seed=7, n_seqs=6, max_len=5000, dtype=torch.float64, empty=True)
    got_adv, got_ret = adv.gae_packed_torch(rewards, values, mask, cu, gamma, lam)
    want_adv, want_ret = naive_gae(rewards, values, mask, cu, gamma, lam)
    assert_close(got_adv, want_adv, torch.float64, n=5000)
    assert_close(got_ret, want_ret, torch.float64, n=5000)


@pytest.mark.parametrize("path", ["torch", "triton"])
def test_gae_segment_ends_on_chunk_edges(path):
    # Fully masked sequences whose ends land on, just before and just after 64-token chunk edges.
    if path == "triton" and not adv.triton_available():
        pytest.skip("triton is not installed")
    lengths = torch.tensor([64, 128, 1, 63, 65, 64, 1000])
    cu = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    g = torch.Generator().manual_seed(4)
    rewards = torch.randn(int(cu[-1]), generator=g, dtype=torch.float64)
    values = torch.randn(int(cu[-1]), generator=g, dtype=torch.float64)
    mask = torch.ones_like(rewards, dtype=torch.long)
    fn = adv.gae_packed_torch if path == "torch" else kernel(adv.gae_packed_triton)
    got_adv, got_ret = fn(rewards, values, mask, cu, 0.97, 0.9)
    want_adv, want_ret = naive_gae(rewards, values, mask, cu, 0.97, 0.9)
    assert_close(got_adv, want_adv, torch.float64, n=1000)
    assert_close(got_ret, want_ret, torch.float64, n=1000)


@pytest.mark.parametrize("path", ["torch", "triton"])
def test_gae_empty_batch(path):
    if path == "triton" and not adv.triton_available():
        pytest.skip("triton is not installed")
    fn = adv.gae_packed_torch if path == "torch" else kernel(adv.gae_packed_triton)
    empty = torch.zeros(0)
    for cu in (torch.tensor([0]), torch.tensor([0, 0, 0])):
        got_adv, got_ret = fn(empty, empty, empty, cu, 0.99, 0.95)
        assert got_adv.shape == (0,) and got_ret.shape == (0,)


@pytest.mark.parametrize("path", ["torch", "triton"])
def test_gae_bfloat16_inputs_compute_in_float32(path):
    if path == "triton" and not adv.triton_available():
        pytest.skip("triton is not installed")
    rewards, values, mask, cu = random_packed_batch(seed=9, n_seqs=3, max_len=200)
    rewards, values = rewards.bfloat16(), values.bfloat16()
    fn = adv.gae_packed_torch if path == "torch" else kernel(adv.gae_packed_triton)
    got_adv, got_ret = fn(rewards, values, mask, cu, 0.99, 0.95)
    want_adv, want_ret = naive_gae(rewards.double(), values.double(), mask, cu, 0.99, 0.95)
    assert got_adv.dtype == torch.float32 and got_ret.dtype == torch.float32
    # bf16 inputs are exact in fp32, so the error is that of the fp32 scan alone
    assert_close(got_adv, want_adv, torch.float32, n=200)
    assert_close(got_ret, want_ret, torch.float32, n=200)


def test_gae_masked_tokens_are_transparent():
    # Two model turns separated by environment tokens: the env tokens change nothing.
    r = torch.tensor([0.0, 0.0, 5.0, 7.0, 0.0, 1.0])
    v = torch.tensor([0.5, 0.2, 9.0, 9.0, 0.1, 0.3])
    m = torch.tensor([1, 1, 0, 0, 1, 1])
    cu = torch.tensor([0, 6])
    got, ret = adv.gae_packed_torch(r, v, m, cu, gamma=0.9, lam=0.8)
    keep = m.bool()
    got_compact, _ = adv.gae_packed_torch(r[keep], v[keep], m[keep], torch.tensor([0, 4]), 0.9, 0.8)
    assert_close(got[keep], got_compact, torch.float32, n=4)
    assert got[~keep].abs().sum() == 0 and torch.equal(ret[~keep], v[~keep])


def test_gae_rejects_bad_inputs():
    x = torch.zeros(5)
    with pytest.raises(ValueError, match="end at N=5"):
        adv.gae_packed(x, x, x, torch.tensor([0, 3]), 1.0, 1.0)
    with pytest.raises(ValueError, match="non-decreasing"):
        adv.gae_packed(x, x, x, torch.tensor([0, 4, 2, 5]), 1.0, 1.0)
    with pytest.raises(ValueError, match="same length"):
        adv.gae_packed(x, torch.zeros(4), x, torch.tensor([0, 5]), 1.0, 1.0)
    with pytest.raises(ValueError, match="packed 1-D"):
        adv.gae_packed(x.view(1, 5), x.view(1, 5), x.view(1, 5), torch.tensor([0, 5]), 1.0, 1.0)
    with pytest.raises(ValueError, match="lam=1.5"):
        adv.gae_packed(x, x, x, torch.tensor([0, 5]), 1.0, 1.5)


# ----------------------------------------------------------------------------- groups, whitening, broadcast


@pytest.mark.parametrize("mode", adv.GROUP_NORM_MODES)
@pytest.mark.parametrize("group_size", [2, 5, 8])
@pytest.mark.parametrize("std", adv.GROUP_STDS)
def test_group_normalize_torch_matches_naive_loop(mode, group_size, std):
    rewards = torch.randn(group_size * 7, generator=torch.Generator().manual_seed(group_size))
    rewards[:group_size] = 1.0  # a group with identical rewards: std 0 must not blow up
    got = adv.group_normalize_torch(rewards, group_size, mode, std=std)
    want = naive_group_normalize(rewards, group_size, mode, 1e-6, std)
    assert_close(got, want, torch.float32, n=group_size, scale=_group_norm_scale(rewards, group_size, mode))


def test_group_normalize_rejects_bad_groups():
    with pytest.raises(ValueError, match="not a multiple of group_size=4"):
        adv.group_normalize(torch.zeros(6), 4)
    with pytest.raises(ValueError, match="group_size >= 2"):
        adv.group_normalize(torch.zeros(6), 1, mode="rloo")
    with pytest.raises(ValueError, match="group_size=0"):
        adv.group_normalize(torch.zeros(6), 0)
    with pytest.raises(ValueError, match="unknown mode"):
        adv.group_normalize(torch.zeros(6), 2, mode="std")
    with pytest.raises(ValueError, match="unknown std 'unbiased'"):
        adv.group_normalize(torch.zeros(6), 2, std="unbiased")


@pytest.mark.parametrize("shift_mean", [True, False])
def test_masked_whiten_torch_matches_naive_loop(shift_mean):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(6, 37, generator=g) * 3 + 2
    mask = (torch.rand(6, 37, generator=g) < 0.6).long()
    got = adv.masked_whiten_torch(x, mask, shift_mean=shift_mean)
    assert_close(got, naive_whiten(x, mask, 1e-6, shift_mean), torch.float32, n=x.numel())


def test_masked_whiten_empty_mask_gives_zeros():
    out = adv.masked_whiten(torch.randn(3, 4), torch.zeros(3, 4))
    assert torch.equal(out, torch.zeros(3, 4))


def test_broadcast_to_tokens_torch():
    mask = torch.tensor([[1, 1, 0], [0, 1, 1]])
    got = adv.broadcast_to_tokens_torch(torch.tensor([2.0, -1.0]), mask)
    assert torch.equal(got, torch.tensor([[2.0, 2.0, 0.0], [0.0, -1.0, -1.0]]))
    with pytest.raises(ValueError, match="seq_values"):
        adv.broadcast_to_tokens(torch.zeros(3), mask)


# ----------------------------------------------------------------------------- Triton (interpreter on CPU)

triton_only = pytest.mark.skipif(not adv.triton_available(), reason="triton is not installed")


@triton_only
@pytest.mark.parametrize("gamma,lam", GAMMAS_LAMS)
def test_gae_triton_matches_naive_loop(gamma, lam):
    # rows=2, block=128: several tiles per sequence (carry across tiles) and a padding row.
    rewards, values, mask, cu = random_packed_batch(seed=int(gamma * 100 + lam * 10) + 1, n_seqs=5)
    got_adv, got_ret = kernel(adv.gae_packed_triton)(rewards, values, mask.bool(), cu, gamma, lam, rows=2, block=128)
    want_adv, want_ret = naive_gae(rewards, values, mask, cu, gamma, lam)
    assert got_adv.dtype == torch.float32
    assert_close(got_adv, want_adv, torch.float32, n=512)
    assert_close(got_ret, want_ret, torch.float32, n=512)


@triton_only
@pytest.mark.parametrize(
    "cu,nan,good",
    [
        ([0, 4, 2, 9, 12], (0, 9), (9, 12)),  # out of order: the rows at the fault are NaN
        ([0, 5, 9], (5, 12), (0, 5)),  # ends short of N: the last row reaches on to N
        ([3, 7, 12], (0, 7), (7, 12)),  # starts after 0: the first row reaches back to 0
        ([0, 5, 40], (5, 12), (0, 5)),  # past N: clamped, never read or written out of bounds
        ([0, -8, 12], (0, 12), None),
    ],
)
def test_gae_triton_marks_malformed_cu_seqlens_with_nan_without_a_host_check(cu, nan, good):
    g = torch.Generator().manual_seed(3)
    rewards, values = torch.randn(12, generator=g), torch.randn(12, generator=g)
    mask = torch.ones(12, dtype=torch.bool)
    triton = kernel(adv.gae_packed_triton)
    got_adv, got_ret = triton(rewards, values, mask, torch.tensor(cu), 0.99, 0.95, check_cu_seqlens=False)
    lo, hi = nan
    assert got_adv[lo:hi].isnan().all() and got_ret[lo:hi].isnan().all()
    if good is not None:  # the well-formed sequence is computed as usual
        a, b = good
        want_adv, _ = naive_gae(rewards[a:b], values[a:b], mask[a:b], torch.tensor([0, b - a]), 0.99, 0.95)
        assert_close(got_adv[a:b], want_adv, torch.float32, n=b - a)
    with pytest.raises(ValueError, match="cu_seqlens"):
        triton(rewards, values, mask, torch.tensor(cu), 0.99, 0.95, check_cu_seqlens=True)


@triton_only
def test_gae_triton_rejects_odd_tiles():
    x = torch.zeros(4)
    with pytest.raises(ValueError, match="block=96 must be a power of two"):
        kernel(adv.gae_packed_triton)(x, x, x, torch.tensor([0, 4]), 1.0, 1.0, block=96)


@triton_only
def test_gae_triton_float64_default_tile_with_empty_sequence():
    rewards, values, mask, cu = random_packed_batch(seed=11, n_seqs=6, max_len=300, dtype=torch.float64, empty=True)
    got_adv, got_ret = kernel(adv.gae_packed_triton)(rewards, values, mask.float(), cu.long(), 0.99, 0.95)
    want_adv, want_ret = naive_gae(rewards, values, mask, cu, 0.99, 0.95)
    assert_close(got_adv, want_adv, torch.float64, n=300)
    assert_close(got_ret, want_ret, torch.float64, n=300)


@triton_only
@pytest.mark.parametrize("mode", adv.GROUP_NORM_MODES)
@pytest.mark.parametrize("group_size", [2, 5, 16])
@pytest.mark.parametrize("std", adv.GROUP_STDS)
def test_group_normalize_triton_matches_naive_loop(mode, group_size, std):
    rewards = torch.randn(group_size * 9, generator=torch.Generator().manual_seed(group_size), dtype=torch.float64)
    rewards[:group_size] = 1.0
    got = kernel(adv.group_normalize_triton)(rewards, group_size, mode, std=std)
    want = naive_group_normalize(rewards, group_size, mode, 1e-6, std)
    assert_close(got, want, torch.float64, n=group_size, scale=_group_norm_scale(rewards, group_size, mode))


@triton_only
@pytest.mark.parametrize("shift_mean", [True, False])
def test_masked_whiten_triton_matches_naive_loop(shift_mean):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 5000, generator=g) * 3 + 100  # several tiles; a large mean tests stability
    mask = torch.rand(3, 5000, generator=g) < 0.6
    got = kernel(adv.masked_whiten_triton)(x, mask, shift_mean=shift_mean)
    assert_close(got, naive_whiten(x, mask, 1e-6, shift_mean), torch.float32, n=x.numel())
    assert torch.equal(kernel(adv.masked_whiten_triton)(x, torch.zeros_like(mask)).cpu(), torch.zeros_like(x))


@triton_only
def test_broadcast_to_tokens_triton_matches_torch():
    g = torch.Generator().manual_seed(6)
    mask = torch.rand(19, 700, generator=g) < 0.5  # several row and column tiles
    values = torch.randn(19, generator=g)
    got = kernel(adv.broadcast_to_tokens_triton)(values, mask)
    want = torch.tensor([[values[b].item() if mask[b, t] else 0.0 for t in range(700)] for b in range(19)])
    assert torch.equal(got.cpu(), want)
