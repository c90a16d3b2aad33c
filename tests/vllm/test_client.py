"""`RemoteVLLMEngine` against a real vLLM server (tests/vllm/conftest.py): the generation
contract, an answer interrupted by a disk weight sync and resumed, the trainer's logprobs
equal to the server's before and after the sync, and clear errors for bad input."""

from __future__ import annotations

import re
import subprocess
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

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


ATTEMPTS = 3  # an answer that ended before the engine was stopped is retried with a new one


def queued_bytes(pids: list[int]) -> int:
    """Bytes sent to the processes `pids` and not yet read (the Recv-Q of their sockets, by `ss`)."""
    out = subprocess.run(["ss", "-H", "-x", "-t", "-n", "-p"], capture_output=True, text=True, timeout=60).stdout
    total = 0
    for line in out.splitlines():
        owners = {int(p) for p in re.findall(r"pid=(\d+),", line)}
        fields = line.split()
        if owners & set(pids) and len(fields) > 2 and fields[2].isdigit():
            total += int(fields[2])
    return total


def _answer_with_a_sync(vllm_server, new_weights, pause_mode: str, req: ModelRequest):
    """One answer with a disk weight sync to version 1 landing mid-answer: (response, tokens the
    server generated meanwhile). Once the server has generated some of the answer, its engine core
    is stopped (SIGSTOP) until the client's pause is waiting in the engine's socket, so the answer
    cannot end before the pause reaches the engine, however busy the machine. Only an answer that
    ended before the engine was stopped (all of it within one poll) is not split; the caller checks."""
    with _engine(vllm_server, pause_mode=pause_mode) as engine, ThreadPoolExecutor(1) as pool:
        before = generated_tokens(vllm_server)
        answer = engine.loop.submit(engine.agenerate(req))
        while generated_tokens(vllm_server) < before + 4 and not answer.done():  # mid-answer
            time.sleep(0.05)
        with vllm_server.engine_stopped() as pids:
            queued = queued_bytes(pids)
            pausing = pool.submit(engine.pause)
            deadline = time.monotonic() + 120
            while queued_bytes(pids) <= queued and not pausing.done():
                assert time.monotonic() < deadline, "the client's pause never reached vLLM's engine socket"
                time.sleep(0.05)
        pausing.result(timeout=300)
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
    The answer runs to its budget, as long as the server's context allows; the engine is held
    until the pause has reached it (`_answer_with_a_sync`), and an answer that ended even before
    that does not count: the test retries it, and fails after ATTEMPTS."""
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


def test_the_library_path_replays_vllms_truncation_rule_or_is_refused(vllm_server):
    """A user's own script (no experiment config): a gconfig whose truncation_rule is not vLLM's is
    refused by name; with vLLM's rule the trainer's replay agrees with the server's logprobs."""
    knobs = dict(max_new_tokens=24, temperature=0.7, top_p=0.8, top_k=20, sampling_seed=7)
    with _engine(vllm_server) as engine:
        for rule in (None, "joint"):
            with pytest.raises(GenerationError, match=rf"gconfig.truncation_rule={rule!r}: a vLLM server truncates"):
                engine.loop.run(engine.agenerate(_request(truncation_rule=rule, **knobs)))
        req = _request(truncation_rule="sequential", **knobs)
        resp = engine.loop.run(engine.agenerate(req))
    mine = trainer_logprobs(
        vllm_server.model_dir, resp.input_tokens + resp.output_tokens, resp.output_len, 0.7, req.gconfig
    )
    joint = GenerationHyperparameters(**{**knobs, "truncation_rule": "joint"})
    theirs = trainer_logprobs(
        vllm_server.model_dir, resp.input_tokens + resp.output_tokens, resp.output_len, 0.7, joint
    )
    served = torch.tensor(resp.output_logprobs)
    assert (mine - served).abs().max() < LOGPROB_BOUND_SHORT / 0.7
    assert (theirs - served).abs().max() > LOGPROB_BOUND_SHORT / 0.7  # the rule matters on this model at these settings
