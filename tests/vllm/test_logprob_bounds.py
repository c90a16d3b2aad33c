"""The vLLM tests' logprob bounds catch a sync path that loses precision.

Every |vLLM - trainer| logprob comparison under tests/vllm uses a bound of tests/vllm/conftest.py
(`LOGPROB_BOUND_SHORT` for answers of up to 24 tokens, `LOGPROB_BOUND_LONG` for answers of about
1,000), set from benchmarks/vllm_parity.py's measurement on this model (benchmarks/README.md).
A bound is worth only what it catches: here the trainer keeps the model's fp32 weights while the
server gets them rounded to bf16 through each sync path (disk: `actor.save` and the server's
reload; distributed: the broadcast into arealite's weight-transfer engine), the fault of a sync
that casts on the way, and each bound must be exceeded at the answer length it is used for.
"""

from __future__ import annotations

import uuid

import pytest
import torch

from arealite.config import GenerationHyperparameters, InferenceEngineConfig, OptimizerConfig, PPOActorConfig
from arealite.rollout import RemoteVLLMEngine
from arealite.types import ModelRequest
from tests.vllm.conftest import LOGPROB_BOUND_LONG, LOGPROB_BOUND_SHORT, MAX_MODEL_LEN, trainer_logprobs

pytestmark = [pytest.mark.xdist_group("vllm"), pytest.mark.timeout(900)]
PROMPT = [5, 17, 42, 99]
SHORT, LONG = 24, MAX_MODEL_LEN - len(PROMPT) - 16  # the lengths the other tests' answers have


def bf16_rounded(src: str, dst: str) -> str:
    """An HF copy of the model at `src` with every weight rounded to bf16 (stored in fp32)."""
    import shutil

    from transformers import AutoModelForCausalLM

    shutil.copytree(src, dst)  # the tokenizer's files; the weights are written over below
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    model.save_pretrained(dst)
    return dst


def _gap(model_dir: str, engine, n_tokens: int) -> float:
    """max |vLLM - trainer at the weights in `model_dir`| over one answer of `n_tokens`, as the
    other tests compute it (temperature 1, min_new_tokens's stop ban replayed)."""
    g = GenerationHyperparameters(max_new_tokens=n_tokens, min_new_tokens=n_tokens, sampling_seed=3)
    resp = engine.loop.run(engine.agenerate(ModelRequest(rid=uuid.uuid4().hex, input_ids=PROMPT, gconfig=g)))
    assert resp.output_len == n_tokens
    want = trainer_logprobs(model_dir, PROMPT + resp.output_tokens, n_tokens, 1.0, banned=n_tokens)
    return float((torch.tensor(resp.output_logprobs) - want).abs().max())


@pytest.mark.parametrize("path", ["disk", "distributed"])
def test_bf16_rounded_weights_through_a_sync_exceed_every_bound(vllm_server, tmp_path, path):
    from arealite.train.actor import PPOActor
    from arealite.weight_sync import WeightSync

    rounded = bf16_rounded(vllm_server.model_dir, str(tmp_path / "bf16"))
    config = PPOActorConfig(path=vllm_server.model_dir, dtype="float32", optimizer=OptimizerConfig(lr=1e-5))
    actor = PPOActor(config, GenerationHyperparameters(group_size=1)).initialize()
    engine = RemoteVLLMEngine(
        InferenceEngineConfig(setup_timeout=60.0, request_timeout=300.0, weight_update_timeout=120.0),
        [vllm_server.address],
    )
    engine.initialize()
    try:
        kwargs = {"run_dir": str(tmp_path / "run")} if path == "disk" else {"chunk_mb": 1, "timeout": 120.0}
        with WeightSync(actor, engine, path, **kwargs) as weight_sync:
            actor.load(rounded)
            assert weight_sync.sync(1) == {vllm_server.address: "1"}
        # the trainer at the fp32 weights, the server at their bf16 rounding
        short, long = _gap(vllm_server.model_dir, engine, SHORT), _gap(vllm_server.model_dir, engine, LONG)
    finally:
        engine.destroy()
        vllm_server.restore()
    print(
        f"bf16-rounded weights by a {path} sync: max |vLLM - trainer| {short:.2e} over {SHORT} tokens "
        f"(bound {LOGPROB_BOUND_SHORT:.1e}), {long:.2e} over {LONG} (bound {LOGPROB_BOUND_LONG:.1e})"
    )
    assert short > LOGPROB_BOUND_SHORT
    assert long > LOGPROB_BOUND_LONG
