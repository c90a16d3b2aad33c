"""The trainer's packed attention (varlen sdpa) against each sequence run alone, and its length buckets."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from arealite.train.varlen_attention import padding_share, plan, register, varlen_sdpa_forward
from tests.tolerance import assert_close

HIDDEN = 64  # the tiny model's hidden size: the longest dot product behind a logit

LENS = [37, 5, 90, 1, 64]


def _packed(lens, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 500, (1, sum(lens)), generator=g)
    pos = torch.cat([torch.arange(n) for n in lens])[None]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    return ids, pos, cu


@pytest.fixture(scope="module")
def models(tiny_model_dir):
    torch.manual_seed(0)
    name = register()
    alone = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32, attn_implementation="eager")
    packed = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32, attn_implementation=name)
    return alone, packed


def test_packed_logits_and_grads_equal_each_sequence_alone(models):
    alone, packed = models
    ids, pos, cu = _packed(LENS)
    out = packed(input_ids=ids, position_ids=pos, use_cache=False, cu_seq_lens_q=cu, cu_seq_lens_k=cu).logits[0]
    refs, off = [], 0
    for n in LENS:
        refs.append(alone(input_ids=ids[:, off : off + n], use_cache=False).logits[0])
        off += n
    ref = torch.cat(refs)
    assert_close(out, ref, n=HIDDEN)
    for model in (alone, packed):
        model.zero_grad()
    (out.logsumexp(-1) * torch.arange(out.shape[0])).sum().backward()
    (ref.logsumexp(-1) * torch.arange(ref.shape[0])).sum().backward()
    for (name, a), b in zip(alone.named_parameters(), packed.parameters()):
        # each gradient sums over every token (weights up to N) through HIDDEN-long dot products
        assert_close(b.grad, a.grad, n=sum(LENS) * HIDDEN, msg=name)


def test_later_sequences_do_not_change_earlier_ones(models):
    """Sequence boundaries hold: changing sequence 2's tokens leaves sequences 0-1 untouched."""
    _, packed = models
    ids, pos, cu = _packed(LENS)
    a = packed(input_ids=ids, position_ids=pos, use_cache=False, cu_seq_lens_q=cu).logits[0]
    ids2 = ids.clone()
    ids2[0, LENS[0] + LENS[1] :] = 7
    b = packed(input_ids=ids2, position_ids=pos, use_cache=False, cu_seq_lens_q=cu).logits[0]
    head = LENS[0] + LENS[1]
    assert torch.equal(a[:head], b[:head])
    assert not torch.allclose(a[head:], b[head:])


def _qkv(n_tokens, heads=4, kv_heads=2, dim=8, seed=1):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, heads, n_tokens, dim, generator=g)
    k = torch.randn(1, kv_heads, n_tokens, dim, generator=g)
    v = torch.randn(1, kv_heads, n_tokens, dim, generator=g)
    return q, k, v


def _dense_reference(q, k, v, lens, window=None):
    """Block-diagonal causal (optionally banded) attention with an explicit N x N mask."""
    n = q.shape[2]
    seq = torch.repeat_interleave(torch.arange(len(lens)), torch.tensor(lens))
    i = torch.arange(n)
    mask = (seq[:, None] == seq[None, :]) & (i[None, :] <= i[:, None])
    if window is not None:
        mask &= i[:, None] - i[None, :] < window
    rep = q.shape[1] // k.shape[1]
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), attn_mask=mask
    )
    return out.transpose(1, 2)


@pytest.mark.parametrize("window", [None, 3])
def test_kernel_matches_dense_block_diagonal_mask(window):
    module = torch.nn.Module().eval()
    q, k, v = _qkv(sum(LENS))
    _, _, cu = _packed(LENS)
    out, weights = varlen_sdpa_forward(module, q, k, v, None, sliding_window=window, cu_seq_lens_q=cu)
    assert weights is None and out.shape == (1, sum(LENS), 4, 8)
    assert_close(out, _dense_reference(q, k, v, LENS, window), n=max(LENS))  # softmax over <= 90 keys


def test_without_cu_seqlens_the_row_is_one_sequence():
    module = torch.nn.Module().eval()
    q, k, v = _qkv(20)
    out, _ = varlen_sdpa_forward(module, q, k, v, None)
    assert_close(out, _dense_reference(q, k, v, [20]), n=20)


def test_cu_seqlens_that_do_not_cover_the_row_are_rejected():
    q, k, v = _qkv(10)
    with pytest.raises(ValueError, match="cu_seq_lens_q ends at 8 but the packed row has 10 tokens"):
        varlen_sdpa_forward(torch.nn.Module(), q, k, v, None, cu_seq_lens_q=torch.tensor([0, 3, 8]))


def test_buckets_group_similar_lengths_and_leave_long_ones_alone():
    """A long row never pads the short ones: the cost is about sum(L_i^2), not S * L_max^2."""
    buckets = plan([40, 512, 36, 500, 10, 64, 0])
    assert [(b.lengths, b.width) for b in buckets] == [((512,), 512), ((500,), 500), ((64,), 64), ((40, 36, 10), 40)]
    assert [b.starts for b in buckets] == [(40,), (588,), (1098,), (0, 552, 1088)]
    assert padding_share([512, 500]) == 0.0
    assert padding_share([40, 36, 10]) == 1 - 86 / 120


def test_buckets_of_many_sequences_match_the_dense_mask():
    """Several multi-sequence buckets, out of packed order, put back in order (max |diff| bounded)."""
    g = torch.Generator().manual_seed(3)
    lens = torch.randint(1, 48, (24,), generator=g).tolist() + [130, 7]
    assert sum(len(b.lengths) > 1 for b in plan(lens)) >= 2
    module = torch.nn.Module().eval()
    q, k, v = _qkv(sum(lens))
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    out, _ = varlen_sdpa_forward(module, q, k, v, None, cu_seq_lens_q=cu)
    assert_close(out, _dense_reference(q, k, v, lens), n=max(lens))
