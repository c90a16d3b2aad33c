"""A bf16 trainer (fp32 masters, fp32 gradient reduction) follows the fp32 one on a batch shaped
like the reasoning job's: 48 packed rows of 20 to 160 tokens, several attention buckets and
micro-batches. On the engine's default device, so on a GPU this checks what GPU users train with.

Bounds (relative, in direction): on a CPU the gradient's cosine to fp32 is 0.99999 over the whole
model and at least 0.9999 per tensor; one Adam step's update, sign-like on its first step, 0.9965
over the model. A gradient or update that goes elsewhere in bf16 (a broken kernel, accumulation
or cast) falls far below.
"""

from __future__ import annotations

import random

import torch
from torch.distributed.tensor import DTensor

from arealite.config import MicroBatchSpec, OptimizerConfig, TrainEngineConfig
from arealite.train.engine import FSDPEngine
from tests.train.helpers import make_batch
from tests.train.test_engine import _logp_loss, _weight


def _engine(path: str, dtype: str) -> FSDPEngine:
    mb_spec = MicroBatchSpec(max_tokens_per_mb=1024)  # about 4,300 tokens: five micro-batches
    return FSDPEngine(TrainEngineConfig(path=path, dtype=dtype, optimizer=OptimizerConfig(lr=1e-3), mb_spec=mb_spec))


def _batch() -> dict:
    rng = random.Random(0)
    return make_batch([rng.randint(20, 160) for _ in range(48)], prompt_len=8, seed=3)


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.dot(a, b) / (a.norm() * b.norm()).clamp(min=1e-30))


def _grads(engine: FSDPEngine, batch: dict) -> dict[str, torch.Tensor]:
    engine._accumulate_gradients(batch, _logp_loss, _weight)  # train_batch zeroes them before its own
    grads = {n: p.grad for n, p in engine.model.named_parameters()}
    return {n: (g.to_local() if isinstance(g, DTensor) else g).float().flatten().cpu() for n, g in grads.items()}


def _update(engine: FSDPEngine, batch: dict) -> torch.Tensor:
    before = {k: v.float().flatten().cpu().clone() for k, v in engine.export_weights()}
    stats = engine.train_batch(batch, _logp_loss, _weight)
    assert stats["update_skipped"] == 0
    return torch.cat([v.float().flatten().cpu() - before[k] for k, v in engine.export_weights()])


def test_bf16_gradient_and_update_follow_fp32_on_a_long_packed_batch(tiny_model_dir):
    batch = _batch()
    with _engine(tiny_model_dir, "bfloat16") as bf16, _engine(tiny_model_dir, "float32") as fp32:
        assert bf16.compute_dtype == torch.bfloat16 and fp32.compute_dtype == torch.float32
        g16, g32 = _grads(bf16, batch), _grads(fp32, batch)
        whole = _cos(torch.cat(list(g16.values())), torch.cat(list(g32.values())))
        worst = min((_cos(g16[n], g32[n]), n) for n in g32)
        print(f"bf16 vs fp32 gradient cosine: {whole:.6f} over the model, {worst[0]:.6f} at worst ({worst[1]})")
        assert whole >= 0.99 and worst[0] >= 0.98, (whole, worst)
        update = _cos(_update(bf16, batch), _update(fp32, batch))
        print(f"bf16 vs fp32 first update cosine: {update:.6f}")
        assert update >= 0.95, update
