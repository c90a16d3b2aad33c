"""GPU self-check, training: FSDP2 mixed precision and CPU offload, advantages on the GPU,
and the bf16 server <-> trainer logprob agreement GPU users get (printed). Skipped without CUDA.

    python -m pytest -m cuda -q -s
"""

from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor import DTensor

from arealite.config import (
    GenerationHyperparameters,
    MicroBatchSpec,
    OptimizerConfig,
    PPOActorConfig,
    TrainEngineConfig,
)
from arealite.server.process import launch_server_process
from arealite.train.actor import PPOActor
from arealite.train.advantage_estimation import estimate_advantages
from arealite.train.engine import FSDPEngine
from tests.tolerance import EPS_BF16, assert_close, close
from tests.train.helpers import make_batch
from tests.train.server_utils import batch_from_results, generate, mean_abs_logprob_diff
from tests.train.test_engine import _logp_loss, _weight

pytestmark = pytest.mark.cuda
HIDDEN = 64  # the tiny model's hidden size: the longest dot product behind a logit
PROMPTS = [[5, 17, 42, 99], [300, 12], [7, 8, 9, 10, 11, 12], [250]]


def _local(p: torch.Tensor) -> torch.Tensor:
    return p.to_local() if isinstance(p, DTensor) else p


def _engine(path: str, dtype: str, **kw) -> FSDPEngine:
    cfg = TrainEngineConfig(
        path=path, dtype=dtype, optimizer=OptimizerConfig(lr=1e-3), mb_spec=MicroBatchSpec(n_mbs=2), **kw
    )
    return FSDPEngine(cfg).initialize()


def test_fsdp2_mixed_precision_keeps_fp32_masters_and_matches_fp32_within_bf16(tiny_model_dir):
    batch = make_batch([12, 5, 9, 7], seed=21)
    bf16, fp32 = _engine(tiny_model_dir, "auto"), _engine(tiny_model_dir, "float32")
    assert bf16.device.type == "cuda" and bf16.compute_dtype == torch.bfloat16  # auto on CUDA
    assert all(_local(p).dtype == torch.float32 and _local(p).is_cuda for p in bf16.model.parameters())
    logits = bf16.forward(batch)
    assert logits.dtype == torch.bfloat16
    ref = fp32.forward(batch)
    # bf16 rounding of activations through the layers, relative to the logits' magnitude
    # (measured on the CPU: 0.7% of max |logit|; the bound is eps_bf16 * sqrt(64) = 6%)
    assert_close(logits.float(), ref, torch.bfloat16, n=HIDDEN, k=1)
    acc, total = bf16._accumulate_gradients(batch, _logp_loss, _weight)
    acc32, _ = fp32._accumulate_gradients(batch, _logp_loss, _weight)
    assert all(_local(p.grad).dtype == torch.float32 for p in bf16.model.parameters())  # fp32 reduce
    loss, loss32 = acc.export()["loss"], acc32.export()["loss"]
    print(f"mixed precision: loss bf16={loss:.6f} fp32={loss32:.6f}")
    assert close(loss, loss32, torch.bfloat16, k=1)  # a mean over tokens: well inside one bf16 ulp


def test_fsdp2_cpu_offload_trains_with_parameters_on_the_cpu(tiny_model_dir):
    batch = make_batch([12, 5, 9, 7], seed=22)
    on_gpu = _engine(tiny_model_dir, "bfloat16")
    offloaded = _engine(tiny_model_dir, "bfloat16", cpu_offload=True)
    assert all(_local(p).device.type == "cpu" for p in offloaded.model.parameters())
    stats = [e.train_batch(batch, _logp_loss, _weight) for e in (on_gpu, offloaded)]
    assert all(s["update_skipped"] == 0 for s in stats)
    # the same bf16 compute on the GPU; only where the fp32 masters and Adam live differs
    assert close(stats[0]["grad_norm"], stats[1]["grad_norm"], torch.float32, n=HIDDEN * 33)
    w_gpu, w_off = dict(on_gpu.export_weights()), dict(offloaded.export_weights())
    w0 = dict(_engine(tiny_model_dir, "float32").export_weights())
    assert max(float((w_off[k].cpu() - w0[k].cpu()).abs().max()) for k in w0) > 1e-4  # the step moved them
    for name in w_gpu:
        assert_close(w_off[name].cpu(), w_gpu[name].cpu(), torch.float32, n=HIDDEN * 33, msg=name)


def test_advantages_run_on_the_gpu_with_triton_and_match_the_cpu_reference(tiny_model_dir):
    cfg = PPOActorConfig(path=tiny_model_dir, optimizer=OptimizerConfig(lr=1e-3))
    actor = PPOActor(cfg, GenerationHyperparameters(group_size=2)).initialize()
    batch = make_batch([9, 7, 8, 6, 10, 5], seed=23)
    want = estimate_advantages(dict(batch), cfg, actor.gconfig)["advantages"]  # CPU tensors: the torch path
    stats = actor.compute_advantages(batch)
    assert batch["advantages"].device == batch["loss_mask"].device  # back where the batch lives
    assert_close(batch["advantages"], want, torch.float32, n=2)
    assert stats["advantages/backend_triton"] == 1.0 and stats["time/advantages"] > 0
    print(f"advantages on {actor.device}: {stats['time/advantages'] * 1e3:.2f} ms, triton")


@pytest.mark.timeout(300)
def test_bf16_server_and_trainer_logprobs_agree_within_bf16_rounding(tiny_model_dir):
    server = launch_server_process(tiny_model_dir, extra_args=["--dtype", "bfloat16", "--skip-server-warmup"])
    try:
        params = {"max_new_tokens": 16, "temperature": 1.0, "ignore_eos": True}
        batch = batch_from_results(PROMPTS, generate(server, PROMPTS, params))
    finally:
        server.stop()
    g2 = GenerationHyperparameters(group_size=2)
    bf16 = PPOActor(PPOActorConfig(path=tiny_model_dir, dtype="bfloat16"), g2).initialize()
    fp32 = PPOActor(PPOActorConfig(path=tiny_model_dir, dtype="float32"), g2).initialize()
    trainer_bf16, trainer_fp32 = bf16.compute_logp(batch), fp32.compute_logp(batch)
    max_logit = float(fp32.forward(batch)[batch["attention_mask"].bool()].abs().max())
    parity = mean_abs_logprob_diff(trainer_bf16, batch)  # server bf16 vs trainer bf16
    server_vs_fp32 = mean_abs_logprob_diff(trainer_fp32, batch)
    mask = batch["loss_mask"].bool()
    trainer_vs_fp32 = float((trainer_bf16 - trainer_fp32)[mask].abs().mean())
    # logprob = z_t - logsumexp(z): bf16 logits z are known to ~eps_bf16 * max|z| each, so two
    # bf16 computations (server: KV-cache decode, trainer: packed prefill) differ by up to
    # twice that. (A one-token misalignment moves them by a good fraction of max|z|.)
    bound = 2 * EPS_BF16 * max_logit
    print(
        f"bf16 parity: mean |server - trainer| logprob = {parity:.2e} (bound {bound:.2e} = 2 * eps_bf16 * "
        f"max|logit| {max_logit:.3f}); each against fp32: server {server_vs_fp32:.2e}, trainer {trainer_vs_fp32:.2e}"
    )
    assert parity <= bound, f"bf16 server vs trainer mean |logprob diff| {parity} > {bound}"
