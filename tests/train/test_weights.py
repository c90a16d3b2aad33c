"""Weight buckets for distributed upload, and gradient checkpointing leaving gradients unchanged."""

from __future__ import annotations

import torch

from arealite.config import MicroBatchSpec, OptimizerConfig, TrainEngineConfig
from arealite.train.engine import FSDPEngine
from arealite.weight_sync.buckets import broadcast_buckets, weight_buckets
from tests.tolerance import assert_close
from tests.train.helpers import make_batch
from tests.train.test_engine import _logp_loss, _weight

torch.set_num_threads(2)


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(512, 256, bias=False)  # 0.5 MiB in fp32
        self.b = torch.nn.Linear(512, 512, bias=False)  # 1 MiB
        self.c = torch.nn.Linear(512, 1024, bias=False)  # 2 MiB: larger than the bound
        self.d = torch.nn.Linear(256, 256)  # 0.25 MiB + bias
        self.tied = self.a  # a tied alias is listed once


def test_buckets_keep_order_and_respect_the_bound():
    net = _Net()
    buckets = weight_buckets(net, torch.float32, chunk_mb=1)
    names = [n for b in buckets for n, _, _ in b]
    assert names == ["a.weight", "b.weight", "c.weight", "d.weight", "d.bias"]
    assert [[n for n, _, _ in b] for b in buckets] == [["a.weight"], ["b.weight"], ["c.weight"], ["d.weight", "d.bias"]]
    assert buckets[3][1] == ("d.bias", "float32", [256])
    half = weight_buckets(net, torch.bfloat16, chunk_mb=1)  # 2-byte elements: twice as much per bucket
    assert [[n for n, _, _ in b] for b in half] == [["a.weight", "b.weight"], ["c.weight"], ["d.weight", "d.bias"]]
    assert half[0][0][1] == "bfloat16"


def test_engine_buckets_cover_every_parameter_once(tiny_model_dir):
    engine = FSDPEngine(TrainEngineConfig(path=tiny_model_dir, dtype="float32")).initialize()
    buckets = weight_buckets(engine.model, engine.compute_dtype, chunk_mb=1)
    listed = {n: s for b in buckets for n, _, s in b}
    assert listed == {n: list(p.shape) for n, p in engine.model.named_parameters()}
    exported = dict(engine.export_weights())
    assert {n: list(t.shape) for n, t in exported.items()} == listed


def test_gradient_checkpointing_gives_the_same_gradients(tiny_model_dir):
    batch = make_batch([10, 6, 8], seed=16)
    grads = []
    for ckpt in (False, True):
        cfg = TrainEngineConfig(
            path=tiny_model_dir,
            dtype="float32",
            gradient_checkpointing=ckpt,
            optimizer=OptimizerConfig(),
            mb_spec=MicroBatchSpec(n_mbs=2),
        )
        engine = FSDPEngine(cfg).initialize()
        assert engine.activation_checkpointing == ckpt
        engine._accumulate_gradients(batch, _logp_loss, _weight)
        grads.append({n: p.grad.full_tensor().clone() for n, p in engine.model.named_parameters()})
    tokens = int(batch["loss_mask"].sum())
    for name in grads[0]:  # recomputed activations: the same sums over tokens and 64-long dot products
        assert_close(grads[1][name], grads[0][name], n=tokens * 64, msg=name)


def test_upload_rejects_buckets_that_do_not_match_the_model(tiny_model_dir):
    import pytest

    engine = FSDPEngine(TrainEngineConfig(path=tiny_model_dir, dtype="float32")).initialize()
    buckets = [[("model.embed_tokens.weight", "float32", [1, 2])]]
    with pytest.raises(ValueError, match="does not match the model"):
        broadcast_buckets(engine.model, buckets, None)
