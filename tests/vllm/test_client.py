"""`RemoteVLLMEngine` against a real vLLM server (tests/vllm/conftest.py): the generation
contract, an answer interrupted by a disk weight sync and resumed, the trainer's logprobs
equal to the server's before and after the sync, and clear errors for bad input."""

from __future__ import annotations

import re
import time
import uuid

import pytest
import torch

from arealite.config import GenerationHyperparameters, InferenceEngineConfig
from arealite.rollout import GenerationError, RemoteVLLMEngine, WeightUpdateError
from arealite.types import ModelRequest, WeightUpdateMeta
from tests.server.conftest import make_peaky_model
from tests.vllm.conftest import LOGPROB_BOUND_LONG, LOGPROB_BOUND_SHORT, MAX_MODEL_LEN, MOVED_NATS, trainer_logprobs

pytestmark = pytest.mark.timeout(900)
PROMPT = [5, 6, 7, 8]
HEAD_SCALE = 4.0  # `new_weights`' output layer: its logits, and their rounding, this many times the model's


@pytest.fixture(scope="module")
def new_weights(vllm_server, tmp_path_factory) -> str:
    """Other weights for the server to sync to: perturbed, with peaked next-token distributions."""
    return make_peaky_model(vllm_server.model_dir, str(tmp_path_factory.mktemp("vllm_new")), scale=HEAD_SCALE, seed=5)


def _engine(vllm_server, **config) -> RemoteVLLMEngine:
    config.setdefault("setup_timeout", 60.0)
    return RemoteVLLMEngine(InferenceEngineConfig(**config), [vllm_server.address])


def _request(**gconfig) -> ModelRequest:
    return ModelRequest(rid=uuid.uuid4().hex, input_ids=list(PROMPT), gconfig=GenerationHyperparameters(**gconfig))


def generated_tokens(vllm_server) -> float:
    """vLLM's count of tokens it generated since start (its Prometheus metrics)."""
    status, text = vllm_server.call("GET", "/metrics")
    match = re.search(r"^vllm:generation_tokens_total\{[^}]*\} ([0-9.e+]+)$", str(text), re.M)
    assert status == 200 and match, "vLLM's /metrics has no vllm:generation_tokens_total"
    return float(match.group(1))


def test_generation_contract_and_seeds(vllm_server):
    with _engine(vllm_server) as engine:
        req = _request(max_new_tokens=12, temperature=0.8, sampling_seed=123)
        first = engine.loop.run(engine.agenerate(req))
        again = engine.loop.run(engine.agenerate(req))
    assert 1 <= first.output_len <= 12 and first.stop_reason in ("stop", "length")
    assert len(first.output_logprobs) == len(first.output_versions) == first.output_len
    assert first.output_versions == [0] * first.output_len
    assert all(lp <= 0.0 for lp in first.output_logprobs)
    assert again.output_tokens == first.output_tokens  # a seeded request repeats (and the engine survives it)
    want = trainer_logprobs(vllm_server.model_dir, PROMPT + first.output_tokens, first.output_len, 0.8)
    torch.testing.assert_close(torch.tensor(first.output_logprobs), want, atol=LOGPROB_BOUND_SHORT / 0.8, rtol=0)


ATTEMPTS = 3  # answers that ended before the pause reached the server are retried with a new one


def _answer_with_a_sync(vllm_server, new_weights, pause_mode: str, req: ModelRequest):
    """One answer with a disk weight sync to version 1 started once the server has generated
    some of it: (response, tokens the server generated meanwhile). The pause reaches the server
    after the client posts it; on a busy machine that can take seconds, enough for the tiny model
    to finish, so the caller checks the answer really was split and otherwise tries again."""
    with _engine(vllm_server, pause_mode=pause_mode) as engine:
        before = generated_tokens(vllm_server)
        answer = engine.loop.submit(engine.agenerate(req))
        while generated_tokens(vllm_server) < before + 4 and not answer.done():  # mid-answer
            time.sleep(0.05)
        engine.pause()
        engine.update_weights(WeightUpdateMeta(type="disk", path=new_weights, version=1)).result(timeout=300)
        engine.set_version(1)
        assert engine.confirm_version(1) == {vllm_server.address: "1"}
        engine.resume()
        resp = answer.result(timeout=600)
    return resp, generated_tokens(vllm_server) - before


@pytest.mark.parametrize("pause_mode", ["abort", "retract", "in_place"])
def test_answer_interrupted_by_a_disk_sync_resumes_on_the_new_weights(vllm_server, new_weights, pause_mode):
    """abort: the partial answer comes back and is resumed from its prefix; retract / in_place:
    the request stays on the server and continues on the new weights. Each way no token is
    generated twice and each token carries the version of the weights that made it (vLLM's
    spans when kept); its logprob is the trainer's under those weights, except after the sync
    with in_place, whose continuation attends over keys and values the old weights computed.
    The answer runs to its budget, as long as the server's context allows, and one that ended
    before the sync landed does not count: the test retries it, and fails after ATTEMPTS."""
    budget, temperature = MAX_MODEL_LEN - len(PROMPT) - 16, 1.0  # vLLM stops short of its context
    for _ in range(ATTEMPTS):
        req = _request(max_new_tokens=budget, min_new_tokens=budget, temperature=temperature)
        try:
            resp, generated = _answer_with_a_sync(vllm_server, new_weights, pause_mode, req)
        finally:
            vllm_server.restore()
        if 1 in resp.output_versions:
            break
    assert 1 in resp.output_versions, f"in {ATTEMPTS} answers of {budget} tokens the sync never landed mid-answer"
    assert resp.output_len == budget
    assert generated == budget  # nothing generated twice (or thrown away)
    if pause_mode == "abort":
        assert resp.n_interruptions == 1
    split = resp.output_versions.index(1)
    assert 0 < split < budget and resp.output_versions == [0] * split + [1] * (budget - split)
    tokens = PROMPT + resp.output_tokens
    old = trainer_logprobs(vllm_server.model_dir, tokens, budget, temperature, banned=budget)  # min_new_tokens
    new = trainer_logprobs(new_weights, tokens, budget, temperature, banned=budget)
    served = torch.tensor(resp.output_logprobs)
    torch.testing.assert_close(served[:split], old[:split], atol=LOGPROB_BOUND_LONG, rtol=0)
    if pause_mode != "in_place":
        torch.testing.assert_close(served[split:], new[split:], atol=LOGPROB_BOUND_LONG * HEAD_SCALE, rtol=0)
    assert (new[split:] - old[split:]).abs().mean() > MOVED_NATS  # the sync did change the weights


def test_bad_input_gets_a_clear_error(vllm_server):
    with _engine(vllm_server) as engine:
        with pytest.raises(GenerationError, match=r"gconfig.temperature=3.0 is above vLLM's limit"):
            engine.loop.run(engine.agenerate(_request(temperature=3.0)))
        with pytest.raises(GenerationError, match=r"gconfig.truncated_logprobs=true"):
            engine.loop.run(engine.agenerate(_request(top_k=5, truncated_logprobs=False)))
        with pytest.raises(ValueError, match="empty prompt"):
            engine.loop.run(engine.agenerate(ModelRequest(rid="r", input_ids=[])))
        with pytest.raises(GenerationError, match=r"(?s)returned 400: .*token_ids must not contain negative"):
            engine.loop.run(engine.agenerate(ModelRequest(rid="r", input_ids=[-3])))
        meta = WeightUpdateMeta(type="lora", path="/nowhere", lora_name="a", version=1)
        with pytest.raises(WeightUpdateError, match=r"weight_update=lora is not supported with a vLLM server"):
            engine.update_weights(meta).result(timeout=60)
        # the server still serves
        assert engine.loop.run(engine.agenerate(_request(max_new_tokens=2))).output_len >= 1
