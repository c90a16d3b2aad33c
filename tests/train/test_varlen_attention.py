"""The trainer's packed attention (varlen sdpa) against each sequence run alone, and its segments."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from arealite.train.varlen_attention import _MAX_SEGMENT, masked_share, plan, register, varlen_sdpa_forward
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
    assert {len(s.lengths) > 1 for s in plan(LENS)} == {False, True}  # sequences alone and sharing a masked call
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


def test_segments_leave_long_sequences_alone_and_let_short_runs_share_a_call():
    """Cuts in packed order: a long sequence never shares a call (its cost stays ~L^2 / 2),
    adjacent short ones do, and the segments tile the row."""
    lens = [512, 500, 100, 12, 10, 0, 9, 8]
    segments = plan(lens)
    assert [s.lengths for s in segments] == [(512,), (500,), (100,), (12, 10, 0, 9, 8)]
    assert [s.start for s in segments] == [0, 512, 1012, 1112]
    assert masked_share([512, 500]) == 0.0
    computed = 512 * 513 // 2 + 500 * 501 // 2 + 100 * 101 // 2 + 39 * 39
    useful = sum(n * (n + 1) // 2 for n in lens)
    assert masked_share(lens) == 1 - useful / computed


def test_segments_tile_the_row_and_bound_a_masked_call():
    g = torch.Generator().manual_seed(5)
    lens = torch.randint(0, 12, (600,), generator=g).tolist() + [700, 3]
    segments = plan(lens)
    assert [s.start for s in segments] == [sum(s.width for s in segments[:i]) for i in range(len(segments))]
    assert [n for s in segments for n in s.lengths if n] == [n for n in lens if n]
    assert all(s.width <= _MAX_SEGMENT or len([n for n in s.lengths if n]) == 1 for s in segments)
    assert max(len(s.lengths) for s in segments) > 1 and (700,) in {s.lengths for s in segments}


@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("longest_first", [False, True])
def test_many_short_and_long_sequences_match_the_dense_mask(window, longest_first):
    """Masked and causal segments side by side, in either row order (max |diff| bounded)."""
    g = torch.Generator().manual_seed(3)
    lens = torch.randint(1, 48, (24,), generator=g).tolist() + [130, 7, 0, 2]
    if longest_first:
        lens.sort(reverse=True)
    assert sum(len(s.lengths) > 1 for s in plan(lens)) >= 2 and sum(len(s.lengths) == 1 for s in plan(lens)) >= 1
    module = torch.nn.Module().eval()
    q, k, v = _qkv(sum(lens))
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    out, _ = varlen_sdpa_forward(module, q, k, v, None, sliding_window=window, cu_seq_lens_q=cu)
    assert_close(out, _dense_reference(q, k, v, lens, window), n=max(lens))


def test_output_and_gradients_keep_the_token_major_layout_of_the_projections():
    """q/k/v arrive as transposed views of the projections' [1, N, H*D] outputs: the output
    comes back contiguous as [1, N, H, D] and each gradient in its input's layout, so neither
    the o_proj input nor the q/k/v projections' gradients need a copy."""
    lens = [*LENS, 30, 30, 30]  # a uniform run too: [rows, L] views of the row
    n = sum(lens)
    proj = [torch.randn(1, n, h * 8, requires_grad=True) for h in (4, 2, 2)]
    q, k, v = (p.view(1, n, -1, 8).transpose(1, 2) * 1.0 for p in proj)  # token-major, like rotary's output
    grads = {}
    for name, t in zip("qkv", (q, k, v)):
        t.register_hook(lambda g, name=name: grads.__setitem__(name, g))
    _, _, cu = _packed(lens)
    out, _ = varlen_sdpa_forward(torch.nn.Module().train(), q, k, v, None, cu_seq_lens_q=cu)
    assert out.shape == (1, n, 4, 8) and out.is_contiguous()
    out.sum().backward()
    assert [grads[name].stride() for name in "qkv"] == [t.stride() for t in (q, k, v)]


@pytest.mark.parametrize("window", [None, 3])
def test_sequences_of_one_length_share_one_causal_call(window):
    """A run of equal lengths (empty sequences inside it included) is one causal call over the
    run viewed as [rows, L]: no mask, no masked scores, however wide; it still matches the dense mask."""
    lens = [90, 30, 30, 0, 30, 30, 12, 7, 7]
    segments = plan(lens)
    assert [s.lengths for s in segments][:2] == [(90,), (30, 30, 0, 30, 30)]
    assert [s.uniform for s in segments][:2] == [True, True]
    assert masked_share([90, 30, 30, 0, 30, 30]) == 0.0
    assert [s.lengths for s in plan([40] * 60)] == [(40,) * 60]  # 2,400 tokens: no W x W mask to bound
    assert len(plan([8] * 5000)) == 1  # a long run costs the planner no more than a short one
    module = torch.nn.Module().eval()
    q, k, v = _qkv(sum(lens))
    _, _, cu = _packed(lens)
    out, _ = varlen_sdpa_forward(module, q, k, v, None, sliding_window=window, cu_seq_lens_q=cu)
    assert_close(out, _dense_reference(q, k, v, lens, window), n=max(lens))
