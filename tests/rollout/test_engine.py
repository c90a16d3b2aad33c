"""RemoteSGLangEngine against real built-in servers: generation, batches, pause, disk updates."""

from __future__ import annotations

import asyncio
import json
import shutil
import time

import pytest
from transformers import AutoTokenizer

from arealite.config import GenerationHyperparameters, InferenceEngineConfig
from arealite.reward.math import gsm8k_reward_fn
from arealite.rollout import GenerationError, RemoteSGLangEngine, WeightUpdateError
from arealite.types import ModelRequest, WeightUpdateMeta
from arealite.workflow import RLVRWorkflow

pytestmark = pytest.mark.timeout(180)


def engine_config(**kw) -> InferenceEngineConfig:
    base = dict(setup_timeout=60.0, request_timeout=60.0, health_check_interval=0.5)
    base.update(kw)
    return InferenceEngineConfig(**base)


@pytest.fixture(scope="module")
def engine(two_servers, tiny_model_dir):
    eng = RemoteSGLangEngine(engine_config(), [s.address for s in two_servers])
    eng.initialize()
    eng.update_weights(WeightUpdateMeta(type="disk", path=tiny_model_dir, version=0)).result(timeout=60)
    yield eng
    eng.destroy()


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def gsm8k_records(shared_data, n: int) -> list[dict]:
    out = []
    with open(shared_data / "gsm8k" / "test.jsonl") as f:
        for i, line in zip(range(n), f):
            row = json.loads(line)
            out.append(
                {
                    "id": f"gsm8k-{i}",
                    "messages": [{"role": "user", "content": row["question"]}],
                    "answer": row["answer"].split("####")[-1].strip(),
                }
            )
    return out


def test_addresses_from_env(monkeypatch, two_servers):
    monkeypatch.setenv("AREAL_LLM_SERVER_ADDRS", ",".join(s.address for s in two_servers))
    assert RemoteSGLangEngine(engine_config()).pool.addresses == [s.address for s in two_servers]
    with pytest.raises(ValueError, match="not host:port"):
        RemoteSGLangEngine(engine_config(), ["localhost"])


def test_agenerate_from_caller_loop(engine):
    """Called from the caller's own event loop, the request runs on the engine's loop."""
    gconfig = GenerationHyperparameters(max_new_tokens=6, temperature=1.0)
    resp = asyncio.run(engine.agenerate(ModelRequest(input_ids=[5, 6, 7], gconfig=gconfig)))
    assert 1 <= resp.output_len <= 6
    assert len(resp.output_logprobs) == len(resp.output_versions) == resp.output_len
    assert all(lp <= 0 for lp in resp.output_logprobs)
    assert resp.output_versions == [0] * resp.output_len
    assert resp.stop_reason in ("stop", "length") and resp.server in engine.pool.addresses
    if resp.stop_reason == "length":
        assert resp.output_len == 6


def test_prompt_over_context_is_a_generation_error(engine):
    with pytest.raises(GenerationError, match="context length") as info:
        asyncio.run(engine.agenerate(ModelRequest(input_ids=[5] * 5000, rid="too-long")))
    assert info.value.rid == "too-long" and info.value.address in engine.pool.addresses
    assert "5, 5, 5" not in str(info.value)  # the payload is never echoed


def test_budget_is_clamped_to_context(engine):
    gconfig = GenerationHyperparameters(max_new_tokens=64, temperature=0.0)
    context = engine.pool.context_length(engine.pool.addresses[0])
    resp = asyncio.run(engine.agenerate(ModelRequest(input_ids=[5] * (context - 4), gconfig=gconfig)))
    assert resp.output_len <= 3


def test_rollout_batch_rlvr(engine, tokenizer, shared_data):
    gconfig = GenerationHyperparameters(group_size=3, max_new_tokens=8)
    workflow = RLVRWorkflow(gsm8k_reward_fn, gconfig, tokenizer)
    records = gsm8k_records(shared_data, 4)
    batch = engine.rollout_batch(records, workflow)
    B, T = batch["input_ids"].shape
    assert B == 4 * 3 and batch["rewards"].shape == (12,)
    for key in ("attention_mask", "loss_mask", "logprobs", "versions"):
        assert batch[key].shape == (B, T), key
    for g, record in enumerate(records):  # rows g*G .. g*G+G-1 are one group, in input order
        prompt = tokenizer.apply_chat_template(record["messages"], add_generation_prompt=True, tokenize=False)
        prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
        for row in range(g * 3, g * 3 + 3):
            assert batch["input_ids"][row, : len(prompt_ids)].tolist() == prompt_ids
            assert batch["loss_mask"][row, : len(prompt_ids)].sum() == 0
    generated = batch["loss_mask"].sum(1)
    assert ((generated >= 1) & (generated <= 8)).all()
    assert (batch["versions"][batch["loss_mask"].bool()] == 0).all()
    assert (batch["versions"][~batch["loss_mask"].bool()] == -1).all()
    assert (batch["logprobs"][~batch["loss_mask"].bool()] == 0).all()
    assert (batch["logprobs"][batch["loss_mask"].bool()] < 0).all()
    prompt_lens = batch["attention_mask"].long().sum(1) - generated
    assert (prompt_lens.view(4, 3) == prompt_lens.view(4, 3)[:, :1]).all()  # one prompt per group
    assert set(batch["rewards"].tolist()) <= {0.0, 1.0}
    assert workflow.stats["episodes"] >= 4


def test_pause_holds_new_requests_until_resume(engine):
    engine.pause()
    try:
        assert engine.paused
        future = engine.loop.submit(
            engine.agenerate(ModelRequest(input_ids=[1, 2], gconfig=GenerationHyperparameters(max_new_tokens=3)))
        )
        time.sleep(1.0)
        assert not future.done()
    finally:
        engine.resume()
    assert future.result(timeout=60).output_len >= 1


def test_update_weights_from_disk_sets_versions(engine, tiny_model_dir, tmp_path):
    weights = tmp_path / "v1"
    shutil.copytree(tiny_model_dir, weights)
    request = ModelRequest(input_ids=[3, 4, 5], gconfig=GenerationHyperparameters(max_new_tokens=4, temperature=0.0))
    engine.pause()
    engine.update_weights(WeightUpdateMeta(type="disk", path=str(weights), version=1)).result(timeout=60)
    engine.set_version(1)
    engine.resume()
    resp = asyncio.run(engine.agenerate(request))
    assert resp.output_versions == [1] * resp.output_len
    with pytest.raises(WeightUpdateError, match="update_weights_from_disk returned 400"):
        engine.update_weights(WeightUpdateMeta(type="disk", path=str(tmp_path / "missing"), version=2)).result(
            timeout=60
        )
    with pytest.raises(WeightUpdateError, match="needs path="):
        engine.update_weights(WeightUpdateMeta(type="disk", path="", version=2)).result(timeout=60)
    engine.update_weights(WeightUpdateMeta(type="disk", path=str(weights), version=0)).result(timeout=60)
    engine.set_version(0)
