"""Weight updates while generation is in flight: interrupted samples resume with the remaining
budget, their tokens carry mixed versions, and nothing is lost or duplicated (no token of an
interrupted answer is generated twice)."""

from __future__ import annotations

import shutil
import threading
import time

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from arealite.config import GenerationHyperparameters, InferenceEngineConfig
from arealite.reward.math import gsm8k_reward_fn
from arealite.rollout import RemoteSGLangEngine
from arealite.types import ModelRequest, WeightUpdateMeta
from arealite.utils.stop_ids import eos_token_ids
from arealite.workflow import RLVRWorkflow

pytestmark = pytest.mark.timeout(240)
BUDGET = 400  # long enough that updates land mid-generation even on a fast machine
GROUP = 2


def test_update_weights_during_generation(two_servers, tiny_model_dir, tmp_path):
    weights = tmp_path / "weights"
    shutil.copytree(tiny_model_dir, weights)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    records = [{"id": f"r{i}", "prompt": f"Question {i}: what is {i} times 3?", "answer": str(3 * i)} for i in range(6)]
    workflow = RLVRWorkflow(
        gsm8k_reward_fn, GenerationHyperparameters(group_size=GROUP, max_new_tokens=BUDGET), tokenizer
    )
    engine = RemoteSGLangEngine(
        InferenceEngineConfig(setup_timeout=60, request_timeout=120), [s.address for s in two_servers]
    )
    engine.initialize()
    try:
        engine.update_weights(WeightUpdateMeta(type="disk", path=str(weights), version=0)).result(timeout=60)
        result: dict = {}
        worker = threading.Thread(target=lambda: result.update(batch=engine.rollout_batch(records, workflow)))
        worker.start()
        version = 0
        while worker.is_alive() and version < 3:
            if not any(engine.pool.outstanding(a) for a in engine.pool.addresses):
                time.sleep(0.01)
                continue
            time.sleep(0.15)  # let tokens accumulate under the current version
            version += 1
            engine.pause()
            engine.update_weights(WeightUpdateMeta(type="disk", path=str(weights), version=version)).result(timeout=60)
            engine.set_version(version)
            engine.resume()
        worker.join(timeout=180)
        batch = result["batch"]
    finally:
        engine.destroy()

    assert version >= 1, "generation finished before any update; raise BUDGET"
    assert engine.stats["interruptions"] >= 1
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    mask = batch["loss_mask"].bool()
    assert batch["input_ids"].shape[0] == len(records) * GROUP  # nothing lost, nothing duplicated
    mixed = 0
    for row in range(batch["input_ids"].shape[0]):
        out = batch["input_ids"][row][mask[row]].tolist()
        versions = batch["versions"][row][mask[row]].tolist()
        assert len(out) == BUDGET or out[-1] == eos, f"row {row}: {len(out)} tokens, neither budget nor stop"
        assert eos not in out[:-1], f"row {row} continues past a stop token"
        assert versions == sorted(versions) and set(versions) <= set(range(version + 1))
        mixed += len(set(versions)) > 1
    assert mixed >= 1, "no trajectory spans a weight update"
    # each prompt appears exactly GROUP times, in its group's rows
    prompt_ids = [tokenizer.encode(r["prompt"], add_special_tokens=False) for r in records]
    for g, ids in enumerate(prompt_ids):
        for row in range(g * GROUP, (g + 1) * GROUP):
            assert batch["input_ids"][row, : len(ids)].tolist() == ids


LONG = 300  # tokens of the interrupted answer: many decode steps, so the pause lands mid-answer


def _decode_steps(server) -> int:
    return server.get("/get_server_info")[1]["internal_states"][0]["decode_steps"]


def _sync_mid_answer(engine, server, prompt: list[int], gconfig, weights) -> tuple:
    """Generate `prompt` on the weights in place (version 0); once a third of the answer is out,
    pause, load `weights` as version 1 and resume. Returns (the response, the server's decode
    steps while it was generated)."""
    before = _decode_steps(server)
    pending = engine.loop.submit(engine.agenerate(ModelRequest(prompt, gconfig)))
    while _decode_steps(server) < before + LONG // 3:
        time.sleep(0.005)
    engine.pause()
    engine.update_weights(WeightUpdateMeta(type="disk", path=str(weights), version=1)).result(timeout=60)
    engine.set_version(1)
    engine.resume()
    resp = pending.result(timeout=120)
    return resp, _decode_steps(server) - before


def test_interrupted_answer_continues_after_its_last_token(two_servers, tiny_model_dir, tmp_path):
    """A weight sync in the middle of an answer: the server returns the partial answer, the
    client resubmits prompt + partial, and generation continues from the next token. Greedy
    decoding makes the uninterrupted answer the reference: a token generated twice (or lost)
    shifts every token after it. The server's own count closes the gap a repeated token could
    hide in: it samples one token per prefill and one per decode step, and sampled exactly as
    many as the answer holds."""
    server = two_servers[0]
    weights = tmp_path / "weights"
    shutil.copytree(tiny_model_dir, weights)
    # the stop ban of min_new_tokens ends mid-answer (greedy: the answer still runs to LONG on this model)
    gconfig = GenerationHyperparameters(max_new_tokens=LONG, min_new_tokens=LONG // 6, temperature=0.0)
    prompt = AutoTokenizer.from_pretrained(tiny_model_dir).encode("fib 3 5 40", add_special_tokens=False)
    engine = RemoteSGLangEngine(InferenceEngineConfig(setup_timeout=60, request_timeout=120), [server.address])
    engine.initialize()
    try:
        engine.update_weights(WeightUpdateMeta(type="disk", path=str(weights), version=0)).result(timeout=60)
        engine.set_version(0)
        reference = engine.loop.submit(engine.agenerate(ModelRequest(prompt, gconfig))).result(timeout=120)
        resp, decode_steps = _sync_mid_answer(engine, server, prompt, gconfig, weights)
        sampled = decode_steps + resp.n_interruptions + 1  # + one token per prefill
    finally:
        engine.destroy()

    assert len(reference.output_tokens) == LONG and reference.n_interruptions == 0
    assert resp.n_interruptions == 1, "the pause did not interrupt the answer"
    cut = resp.output_versions.count(0)  # tokens returned before the pause
    assert 0 < cut < LONG and resp.output_versions == [0] * cut + [1] * (LONG - cut)
    assert resp.output_tokens == reference.output_tokens, f"the answer changed after its first {cut} tokens"
    # and so do the behaviour logprobs: a shifted or repeated one would be off by whole nats (fp32, same weights)
    torch.testing.assert_close(resp.output_logprobs, reference.output_logprobs, rtol=1e-5, atol=1e-5)
    assert sampled == LONG, f"the server sampled {sampled} tokens for an answer of {LONG}"
    # the tokens sampled under the ban, counted over both segments, as the adapter carried it to the server
    assert resp.output_stop_banned == reference.output_stop_banned == [i < LONG // 6 for i in range(LONG)]


def test_each_token_carries_the_logprob_of_the_weights_that_sampled_it(two_servers, tiny_model_dir, tmp_path):
    """A sync to *different* weights in the middle of a sampled answer: every token tagged
    version 0 has the logprob that weights A give it, every token tagged 1 the logprob of
    weights B, recomputed by transformers over the whole sequence (fp32). This is what the
    decoupled loss and every rollout correction divide by; same-weight syncs cannot show it."""
    server = two_servers[0]
    weights_a, weights_b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(tiny_model_dir, weights_a)
    shutil.copytree(tiny_model_dir, weights_b)
    model_a = AutoModelForCausalLM.from_pretrained(weights_a, dtype=torch.float32).eval()
    model_b = AutoModelForCausalLM.from_pretrained(weights_b, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model_b.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.3 * p.std().clamp(min=1e-3))
    model_b.save_pretrained(weights_b)
    gconfig = GenerationHyperparameters(max_new_tokens=LONG, min_new_tokens=LONG, temperature=1.0)
    prompt = AutoTokenizer.from_pretrained(tiny_model_dir).encode("walk 3 40", add_special_tokens=False)
    engine = RemoteSGLangEngine(InferenceEngineConfig(setup_timeout=60, request_timeout=120), [server.address])
    engine.initialize()
    try:
        engine.update_weights(WeightUpdateMeta(type="disk", path=str(weights_a), version=0)).result(timeout=60)
        engine.set_version(0)
        resp, _ = _sync_mid_answer(engine, server, prompt, gconfig, weights_b)
    finally:
        # the session's servers go back to the tiny model for the tests after this one
        engine.update_weights(WeightUpdateMeta(type="disk", path=str(weights_a), version=0)).result(timeout=60)
        engine.destroy()

    cut = resp.output_versions.count(0)
    assert resp.n_interruptions == 1 and 0 < cut < LONG and resp.output_versions == [0] * cut + [1] * (LONG - cut)
    ids = torch.tensor([prompt + resp.output_tokens])
    tokens = ids[0, len(prompt) :]

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    stop_ids = sorted(eos_token_ids(str(tiny_model_dir), tokenizer, model_a.config))

    def logprobs(model) -> torch.Tensor:
        """The served convention: min_new_tokens bans the stop tokens before the softmax."""
        with torch.no_grad():
            logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
        logits[:, stop_ids] = float("-inf")
        return torch.log_softmax(logits, -1).gather(1, tokens[:, None])[:, 0]

    served = torch.tensor(resp.output_logprobs)
    by_a, by_b = logprobs(model_a), logprobs(model_b)
    torch.testing.assert_close(served[:cut], by_a[:cut], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(served[cut:], by_b[cut:], rtol=1e-4, atol=1e-4)
    # the two weight sets disagree on these tokens, so a token tagged with the wrong version fails above
    assert (by_a - by_b).abs().mean() > 1e-2
