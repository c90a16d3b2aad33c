"""FSDPEngine on one process: packed forward = padded forward, micro-batch split invariance,
HF save/load round trip, lr schedules."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from arealite.algo.losses import token_mean
from arealite.config import MicroBatchSpec, OptimizerConfig, TrainEngineConfig
from arealite.train.engine import FSDPEngine, merge_step_stats
from arealite.train.logprobs import packed_token_logprobs
from arealite.train.lr_schedule import lr_factor
from arealite.train.varlen_attention import plan
from tests.tolerance import assert_close, close
from tests.train.helpers import make_batch

torch.set_num_threads(2)
HIDDEN = 64  # the tiny model's hidden size: the longest dot product behind a logit


def _engine(path: str, **mb) -> FSDPEngine:
    cfg = TrainEngineConfig(
        path=path, dtype="float32", optimizer=OptimizerConfig(lr=1e-3), mb_spec=MicroBatchSpec(**mb)
    )
    return FSDPEngine(cfg).initialize()


def _logp_loss(logits, mb):
    lp = packed_token_logprobs(logits, mb["input_ids"], mb["cu_seqlens"])
    return token_mean(-lp, mb["loss_mask"].bool(), mb["cu_seqlens"]), {}


def _weight(mb):
    return float(mb["loss_mask"].sum())


def test_packed_logits_equal_each_sequence_alone(tiny_model_dir):
    engine = _engine(tiny_model_dir)
    batch = make_batch([11, 4, 8, 6], seed=1)
    logits = engine.forward(batch)  # [B, T, V], computed on one packed row
    ref = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    for b, n in enumerate(batch["attention_mask"].sum(-1).tolist()):
        alone = ref(input_ids=batch["input_ids"][b : b + 1, :n]).logits[0]
        assert_close(logits[b, :n], alone, n=HIDDEN)
        assert (logits[b, n:] == 0).all()


def test_one_vs_four_micro_batches_same_loss_and_grads(tiny_model_dir):
    batch = make_batch([12, 5, 9, 7, 3, 10, 6, 8], seed=2)
    results = []
    for n_mbs in (1, 4):
        engine = _engine(tiny_model_dir, n_mbs=n_mbs)
        acc, total = engine._accumulate_gradients(batch, _logp_loss, _weight)
        grads = {n: p.grad.full_tensor().clone() for n, p in engine.model.named_parameters()}
        results.append((acc.export()["loss"], grads, total))
    (loss1, g1, t1), (loss4, g4, t4) = results
    assert t1 == t4 == float(batch["loss_mask"].sum())
    assert close(loss1, loss4, n=int(t1))
    for name in g1:  # each gradient sums over every loss token, through HIDDEN-long dot products
        assert_close(g4[name], g1[name], n=int(t1) * HIDDEN, msg=name)


def test_token_budget_splits_and_trains(tiny_model_dir):
    batch = make_batch([12, 5, 9, 7], seed=3)
    engine = _engine(tiny_model_dir, max_tokens_per_mb=14)
    mbs = engine._micro_batches(batch)
    assert all(int(mb["cu_seqlens"][-1]) <= 14 for mb, _ in mbs)
    assert sorted(r for _, rows in mbs for r in rows) == [0, 1, 2, 3]
    before = engine.forward(batch, lambda lg, mb: packed_token_logprobs(lg, mb["input_ids"], mb["cu_seqlens"]))
    stats = engine.train_batch(batch, _logp_loss, _weight)
    after = engine.forward(batch, lambda lg, mb: packed_token_logprobs(lg, mb["input_ids"], mb["cu_seqlens"]))
    mask = batch["loss_mask"].bool()
    assert stats["update_skipped"] == 0 and math.isfinite(stats["grad_norm"])
    assert after[mask].mean() > before[mask].mean()  # maximizing likelihood raised it
    # the step's masked share: of the attention scores the varlen sdpa computed, those masked out
    useful = sum(n * (n + 1) // 2 for n in (12, 5, 9, 7))
    computed = sum(s.width * (s.width + 1) // 2 if len(s.lengths) == 1 else s.width**2 for mb, _ in mbs
                   for s in plan(_lens(mb)))  # fmt: skip
    assert close(stats["masked_share"], 1 - useful / computed, torch.float64) and computed > useful
    assert all(_lens(mb) == sorted(_lens(mb), reverse=True) for mb, _ in mbs)  # longest first in a row


def _lens(mb) -> list[int]:
    return (mb["cu_seqlens"][1:] - mb["cu_seqlens"][:-1]).tolist()


def test_sequence_over_budget_is_a_clear_error(tiny_model_dir):
    engine = _engine(tiny_model_dir, max_tokens_per_mb=8)
    with pytest.raises(ValueError, match="max_tokens_per_mb"):
        engine.forward(make_batch([12, 5]))


def test_save_load_round_trip(tiny_model_dir, tmp_path):
    engine = _engine(tiny_model_dir)
    batch = make_batch([9, 6], seed=4)
    engine.train_batch(batch, _logp_loss, _weight)
    engine.save(str(tmp_path / "hf"))
    logits = engine.forward(batch)
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), dtype=torch.float32)
    assert_close(logits[0], hf(input_ids=batch["input_ids"][:1]).logits[0], n=HIDDEN)
    fresh = _engine(tiny_model_dir)
    assert not torch.allclose(fresh.forward(batch), logits)
    fresh.load(str(tmp_path / "hf"))
    assert_close(fresh.forward(batch), logits, n=1)  # the same weights through the same kernels


@pytest.mark.parametrize("kind", ["constant", "linear", "cosine"])
def test_lr_schedules(kind):
    f = [lr_factor(s, 10, 2, kind, 0.1) for s in range(12)]
    assert f[0] == 0.5 and f[1] == 1.0  # linear warmup over 2 steps
    if kind == "constant":
        assert all(x == 1.0 for x in f[1:])
    else:
        assert f[2] == 1.0 and close(f[10], 0.1, torch.float64) and close(f[11], 0.1, torch.float64)
        assert all(a >= b for a, b in zip(f[1:], f[2:]))
    if kind == "cosine":
        assert close(f[6], 0.1 + 0.9 * 0.5, torch.float64)  # halfway through decay


def test_checkpoint_resume_continues_identically(tiny_model_dir, tmp_path):
    cfg = TrainEngineConfig(
        path=tiny_model_dir, dtype="float32", optimizer=OptimizerConfig(lr=1e-2, lr_scheduler_type="linear")
    )
    batch = make_batch([9, 6, 7], seed=17)
    engine = FSDPEngine(cfg, total_optimizer_steps=4).initialize()
    engine.train_batch(batch, _logp_loss, _weight)
    engine.save_checkpoint(str(tmp_path / "ckpt"))
    lr_before = engine.optimizer.param_groups[0]["lr"]
    engine.train_batch(batch, _logp_loss, _weight)
    want = engine.forward(batch)
    resumed = FSDPEngine(cfg, total_optimizer_steps=4).initialize()
    resumed.load_checkpoint(str(tmp_path / "ckpt"))
    assert resumed.optimizer.param_groups[0]["lr"] == lr_before < 1e-2  # the schedule resumed mid-decay
    resumed.train_batch(batch, _logp_loss, _weight)  # needs the restored Adam moments to match
    assert_close(resumed.forward(batch), want, n=HIDDEN)


def test_bf16_mixed_precision_keeps_fp32_masters_and_stays_within_bf16_rounding(tiny_model_dir):
    # The mixed-precision path GPU runs take by default (dtype auto), exercised here on the CPU.
    from torch.distributed.tensor import DTensor

    batch = make_batch([12, 5, 9, 7], seed=21)
    bf16 = FSDPEngine(
        TrainEngineConfig(path=tiny_model_dir, dtype="bfloat16", optimizer=OptimizerConfig(lr=1e-3))
    ).initialize()
    fp32 = _engine(tiny_model_dir)
    assert bf16.compute_dtype == torch.bfloat16
    logits, ref = bf16.forward(batch), fp32.forward(batch)
    assert logits.dtype == torch.bfloat16
    assert_close(logits.float(), ref, torch.bfloat16, n=HIDDEN, k=1)  # measured: 0.7% of max |logit|
    acc, _ = bf16._accumulate_gradients(batch, _logp_loss, _weight)
    acc32, _ = fp32._accumulate_gradients(batch, _logp_loss, _weight)
    local = [p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad for p in bf16.model.parameters()]
    assert all(g.dtype == torch.float32 for g in local)  # fp32 master weights and gradient reduction
    assert close(acc.export()["loss"], acc32.export()["loss"], torch.bfloat16, k=1)


def test_an_update_of_several_steps_reports_one_dict_of_its_stats():
    """Means weighted by each step's loss weight, extrema over the steps, loss weights summed."""
    g = torch.Generator().manual_seed(7)
    steps = [
        {"loss": float(torch.randn(1, generator=g)), "grad_norm": float(torch.rand(1, generator=g)),
         "ratio_max": float(torch.rand(1, generator=g)), "ratio_min": float(torch.rand(1, generator=g)),
         "loss_weight": float(torch.randint(1, 50, (1,), generator=g))}
        for _ in range(3)
    ]  # fmt: skip
    merged = merge_step_stats(steps)
    total = sum(s["loss_weight"] for s in steps)
    for key in ("loss", "grad_norm"):
        want = 0.0
        for s in steps:  # naive loop
            want += s[key] * s["loss_weight"] / total
        assert close(merged[key], want, n=3, scale=max(abs(s[key]) for s in steps)), key
    assert merged["ratio_max"] == max(s["ratio_max"] for s in steps)
    assert merged["ratio_min"] == min(s["ratio_min"] for s in steps)
    assert merged["loss_weight"] == total
    assert merge_step_stats(steps[:1]) == steps[0]  # one step: its own stats, bit for bit
    empty = [dict(s, loss_weight=0.0) for s in steps[:2]]
    assert close(merge_step_stats(empty)["loss"], (steps[0]["loss"] + steps[1]["loss"]) / 2, n=2)
