"""The lean forward's compiled CPU decode attention (decode_kernel.py) against sdpa: alone on
random caches (every head shape it is built for, rows split across threads, the buffer's
last columns), inside the lean forward through rows joining and leaving, and its fallback."""

from __future__ import annotations

import logging
import platform
import shutil

import pytest
import torch
import torch.nn.functional as F

from arealite.server import decode_kernel
from arealite.server.model_runner import ModelRunner
from tests.tolerance import assert_close


def _reference(q, k_new, v_new, keys, values, pos, scale):
    """sdpa over each row's columns 0..pos[b] after writing its new key/value at pos[b]."""
    keys, values = keys.clone(), values.clone()
    batch, heads, d = q.shape
    rows, pos = torch.arange(batch), pos[:batch]  # the running rows; the rest stay as they are
    keys[rows, :, pos], values[rows, :, pos] = k_new, v_new
    kv_heads, cols = keys.shape[1], keys.shape[2]
    hidden = torch.arange(cols)[None, :] > pos[:, None]
    mask = torch.zeros(batch, cols).masked_fill_(hidden, torch.finfo(torch.float32).min)[:, None, None, :]
    out = F.scaled_dot_product_attention(
        q.unflatten(1, (kv_heads, heads // kv_heads)), keys[:batch], values[:batch], attn_mask=mask, scale=scale
    )
    return out.flatten(1), keys, values


@pytest.mark.parametrize("head_dim,group,cols", [(16, 2, 256), (8, 1, 37), (64, 4, 50), (64, 7, 45)])
@pytest.mark.parametrize("threads", [1, 2])
def test_kernel_matches_sdpa_and_writes_each_rows_new_token(head_dim, group, cols, threads):
    kernel = decode_kernel.build(head_dim, group)
    g = torch.Generator().manual_seed(head_dim * 100 + group * 10 + threads)
    # more rows allocated than running, as in the cache; enough rows that 2 threads split them
    batch, kv_heads = 2 * decode_kernel.ROWS_PER_THREAD + 3, 2
    rows = batch + 4
    pos = torch.randint(0, cols, (rows,), generator=g)
    pos[:3] = torch.tensor([0, cols - 1, cols - 17])  # one column; the buffer's last ones
    qkv = torch.randn(batch, (group + 2) * kv_heads, head_dim, generator=g)  # q, k, v of a row side by side
    q = qkv[:, : group * kv_heads]
    k_new, v_new = qkv[:, group * kv_heads : (group + 1) * kv_heads], qkv[:, (group + 1) * kv_heads :]
    keys = torch.randn(rows, kv_heads, cols, head_dim, generator=g)
    values = torch.randn(rows, kv_heads, cols, head_dim, generator=g)
    want, want_keys, want_values = _reference(q, k_new, v_new, keys, values, pos, head_dim**-0.5)
    keys_t = keys.transpose(-1, -2).contiguous()
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = kernel(q, k_new, v_new, keys_t, values, pos, head_dim**-0.5)
    finally:
        torch.set_num_threads(before)
    # a softmax over up to `cols` columns, each a head_dim-long dot product
    assert_close(got, want, n=cols + head_dim)
    assert torch.equal(keys_t.transpose(-1, -2), want_keys) and torch.equal(values, want_values)


def test_kernel_refuses_tensors_it_was_not_built_for():
    kernel = decode_kernel.build(16, 2)
    q, kv = torch.randn(4, 4, 16), torch.randn(4, 2, 16)
    keys_t, values, pos = torch.zeros(4, 2, 16, 32), torch.zeros(4, 2, 32, 16), torch.zeros(4, dtype=torch.long)
    with pytest.raises(ValueError, match="head_dim 16, group 2"):
        kernel(torch.randn(4, 2, 16), kv, kv, keys_t, values, pos, 0.25)
    with pytest.raises(ValueError, match="q must be fp32"):
        kernel(q.double(), kv, kv, keys_t, values, pos, 0.25)
    with pytest.raises(ValueError, match="contiguous"):
        kernel(q, kv, kv, keys_t.transpose(-1, -2), values, pos, 0.25)


PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17], list(range(20, 60))]


def _decode_with_churn(runner: ModelRunner) -> list[torch.Tensor]:
    """Prefill, greedy decode, a row leaving and two joining mid-way (the cache moves rows)."""
    batch = runner.new_batch()
    with torch.inference_mode():
        logits = runner.prefill(batch, PROMPTS)
        steps = [logits]
        for step in range(12):
            if step == 4:
                order = batch.drop([1])
                logits = logits[order]
            if step == 7:
                joined = runner.prefill(batch, [[30, 31, 32], list(range(3, 40))])
                logits = torch.cat([logits, joined])
            logits = runner.decode(batch, logits.argmax(-1))
            steps.append(logits)
    return steps


def test_lean_forward_with_the_kernel_matches_its_sdpa_path(tiny_model_dir, monkeypatch):
    compiled = ModelRunner(tiny_model_dir, model_impl="arealite")
    monkeypatch.setenv(decode_kernel.ENV_SWITCH, "0")
    plain = ModelRunner(tiny_model_dir, model_impl="arealite")
    assert (compiled.decode_attention, plain.decode_attention) == ("compiled", "sdpa")
    for a, b in zip(_decode_with_churn(compiled), _decode_with_churn(plain), strict=True):
        assert_close(a, b, n=64)  # logits through 2 layers of 64-long dot products
        assert torch.equal(a.argmax(-1), b.argmax(-1))


def test_without_a_compiler_the_forward_falls_back_and_says_why(tiny_model_dir, monkeypatch, tmp_path, caplog):
    monkeypatch.setenv(decode_kernel.ENV_CACHE, str(tmp_path / "cache"))  # nothing built yet
    monkeypatch.setenv("PATH", str(tmp_path))  # no gcc, clang or cc on it
    monkeypatch.setenv("CC", "no-such-cc")
    with pytest.raises(decode_kernel.KernelUnavailable, match="no C compiler: install gcc or clang, or set CC"):
        decode_kernel.build(16, 2)
    with caplog.at_level(logging.WARNING, logger=decode_kernel.__name__):
        runner = ModelRunner(tiny_model_dir, model_impl="arealite")
    assert runner.decode_attention == "sdpa" and "falls back to sdpa" in caplog.text
    assert len(_decode_with_churn(runner)) == 13


def test_a_failing_compiler_is_reported_with_its_message(monkeypatch, tmp_path):
    cc = tmp_path / "cc"
    cc.write_text("#!/bin/sh\necho 'cc: out of cheese' >&2\nexit 1\n")
    cc.chmod(0o755)
    monkeypatch.setenv(decode_kernel.ENV_CACHE, str(tmp_path / "cache"))
    monkeypatch.setenv("CC", str(cc))
    with pytest.raises(decode_kernel.KernelUnavailable, match="out of cheese"):
        decode_kernel.build(16, 2)
    assert list((tmp_path / "cache").iterdir()) == []  # no half-written library left behind


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="-mno-avx is an x86 flag")
def test_a_target_with_narrow_vectors_is_refused(monkeypatch, tmp_path):
    """With SSE2's 4-float vectors the kernel measured slower than sdpa: it is not used there."""
    real = shutil.which("gcc") or shutil.which("cc")
    cc = tmp_path / "cc"
    cc.write_text(f'#!/bin/sh\nexec {real} "$@" -mno-avx\n')  # the same build, AVX and wider turned off
    cc.chmod(0o755)
    monkeypatch.setenv(decode_kernel.ENV_CACHE, str(tmp_path / "cache"))
    monkeypatch.setenv("CC", str(cc))
    with pytest.raises(decode_kernel.KernelUnavailable, match="targets 128-bit vectors here; below 256"):
        decode_kernel.build(16, 2)
