"""`rollout.pause_mode`: in_place / retract keep requests on the servers across a weight sync.

Nothing is interrupted, each sample ends at its budget or EOS, its tokens switch from the old
version to the new one exactly once (and were really produced by those weights), greedy output
over a same-weights sync equals an uninterrupted run, and a trajectory that spans syncs is
still re-queued once its oldest token falls more than k versions behind.
"""

from __future__ import annotations

import asyncio
import math
import time
from contextlib import contextmanager

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from arealite.config import ConfigError, GenerationHyperparameters, GRPOConfig, InferenceEngineConfig, load_config
from arealite.reward.math import gsm8k_reward_fn
from arealite.rollout import RemoteSGLangEngine
from arealite.tools.tiny_model import build_tiny_model
from arealite.types import ModelRequest, ModelResponse, WeightUpdateMeta
from arealite.workflow import RLVRWorkflow
from tests.tolerance import assert_close, magnitude, tolerance

pytestmark = pytest.mark.timeout(180)
N = 4  # concurrent samples, spread over both servers
BUDGET = 160


@pytest.fixture(scope="module")
def new_weights(tmp_path_factory) -> str:
    """The tiny model's architecture and tokenizer with other random weights."""
    return build_tiny_model(str(tmp_path_factory.mktemp("new_weights")), seed=1)


@contextmanager
def open_engine(servers, tiny_model_dir: str, mode: str, **kw):
    """An engine whose servers serve the tiny model as version 0; they do again afterwards."""
    config = InferenceEngineConfig(
        pause_mode=mode, setup_timeout=60, request_timeout=120, health_check_interval=0.5, **kw
    )
    engine = RemoteSGLangEngine(config, [s.address for s in servers])
    engine.initialize()
    try:
        engine.update_weights(WeightUpdateMeta(type="disk", path=tiny_model_dir, version=0)).result(timeout=60)
        engine.set_version(0)
        yield engine
    finally:
        try:  # the servers are shared with the other rollout test modules
            engine.update_weights(WeightUpdateMeta(type="disk", path=tiny_model_dir, version=0)).result(timeout=60)
        finally:
            engine.destroy()


def _states(servers) -> list[dict]:
    return [s.get("/get_server_info")[1]["internal_states"][0] for s in servers]


def held_requests(servers) -> int:
    """Requests the servers hold (running or queued: retract moves them back to the queue)."""
    return sum(st["num_running"] + st["num_waiting"] for st in _states(servers))


def wait_running(servers, n: int, future=None) -> None:
    """Until `n` requests run on the servers (each prefilled, so it has its first token)."""
    while sum(st["num_running"] for st in _states(servers)) < n:
        assert future is None or not future.done(), "samples finished before they were all running; raise BUDGET"
        time.sleep(0.005)


def sync(engine: RemoteSGLangEngine, servers, path: str, version: int) -> int:
    """pause -> update -> set_version -> resume, as WeightSync.sync does; returns the requests
    the servers held while paused."""
    engine.pause()
    held = held_requests(servers)
    engine.update_weights(WeightUpdateMeta(type="disk", path=path, version=version)).result(timeout=60)
    engine.set_version(version)
    engine.resume()
    return held


def generate(engine, servers, prompts, gconfig, during=None) -> list[ModelResponse]:
    """Generate every prompt concurrently (one group each); `during()` runs once all of them
    are running on the servers."""

    async def all_of_them():
        reqs = [ModelRequest(input_ids=p, gconfig=gconfig, group_id=f"g{i}") for i, p in enumerate(prompts)]
        return await asyncio.gather(*(engine.agenerate(r) for r in reqs))

    future = engine.loop.submit(all_of_them())
    if during is not None:
        wait_running(servers, len(prompts), future)
        during()
    return future.result(timeout=150)


def split_at_switch(versions: list[int], old: int, new: int) -> int:
    """Index of the first `new` token; asserts versions are old* new* (one switch at most)."""
    switch = versions.index(new) if new in versions else len(versions)
    assert versions == [old] * switch + [new] * (len(versions) - switch), f"versions do not switch once: {versions}"
    return switch


def old_model_logprobs(model, prompt: list[int], output: list[int]) -> torch.Tensor:
    """log p(output[t] | prompt + output[:t]) under `model`, recomputed in one forward."""
    ids = torch.tensor([prompt + output])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(output)[:, None])[:, 0]


PROMPTS = [[11 + i, 40 + 3 * i, 7, 90 + i, 5] for i in range(N)]


@pytest.mark.parametrize("mode", ["in_place", "retract"])
def test_sync_to_new_weights_keeps_requests(mode, two_servers, tiny_model_dir, new_weights):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    # seeded: the old weights' first tokens never include an early EOS (which would end a
    # sample before all are running); what follows the sync depends on when it lands
    gconfig = GenerationHyperparameters(max_new_tokens=BUDGET, temperature=1.0, sampling_seed=7)
    held = []
    with open_engine(two_servers, tiny_model_dir, mode) as engine:
        resps = generate(
            engine, two_servers, PROMPTS, gconfig, lambda: held.append(sync(engine, two_servers, new_weights, 1))
        )
        assert engine.stats["interruptions"] == 0 and all(r.n_interruptions == 0 for r in resps)

    old_model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    spanned, after_sync = 0, []
    for prompt, r in zip(PROMPTS, resps):
        assert r.stop_reason in ("stop", "length")
        if r.stop_reason == "length":
            assert r.output_len == BUDGET
        else:
            assert r.output_tokens[-1] == eos
        assert eos not in r.output_tokens[:-1]
        assert len(r.output_logprobs) == len(r.output_versions) == r.output_len
        assert all(math.isfinite(lp) and lp <= 0 for lp in r.output_logprobs)
        switch = split_at_switch(r.output_versions, 0, 1)
        assert switch >= 1  # the first token came before the sync
        spanned += switch < r.output_len
        # the labels are true: version-0 tokens match the old weights, version-1 tokens do not
        diff = (old_model_logprobs(old_model, prompt, r.output_tokens) - torch.tensor(r.output_logprobs)).abs()
        bound = tolerance(torch.float32, 64) * magnitude(torch.tensor(r.output_logprobs))  # fp32 rounding
        assert diff[:switch].max() <= bound, f"version-0 tokens disagree with the old weights by {diff[:switch].max()}"
        after_sync.append(diff[switch:])
    assert torch.cat(after_sync).max() > 0.05, "tokens labelled version 1 look generated by the old weights"
    assert held[0] >= 1, "no request was in flight at the sync; raise BUDGET"
    assert spanned == held[0]  # every request kept over the sync went on to use the new weights


def test_in_place_sync_to_same_weights_matches_uninterrupted_greedy(two_servers, tiny_model_dir):
    gconfig = GenerationHyperparameters(max_new_tokens=BUDGET, temperature=0.0)
    with open_engine(two_servers, tiny_model_dir, "in_place") as engine:
        plain = generate(engine, two_servers, PROMPTS, gconfig)
        held = []
        synced = generate(
            engine, two_servers, PROMPTS, gconfig, lambda: held.append(sync(engine, two_servers, tiny_model_dir, 1))
        )
        assert engine.stats["interruptions"] == 0
    assert held[0] >= 1, "no request was in flight at the sync; raise BUDGET"
    for a, b in zip(plain, synced):
        assert b.output_tokens == a.output_tokens
        assert b.stop_reason == a.stop_reason
        assert_close(torch.tensor(b.output_logprobs), torch.tensor(a.output_logprobs), n=64)
        assert set(a.output_versions) == {0}
        split_at_switch(b.output_versions, 0, 1)
    assert sum(1 in b.output_versions for b in synced) == held[0]


def test_trajectory_spanning_syncs_is_requeued_when_too_stale(two_servers, tiny_model_dir):
    """k=1: an episode kept in place over two syncs (0 -> 1 -> 2) has tokens of versions 0..2;
    its oldest token is 2 versions behind, so wait() must regenerate it, not return it."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    # min_new_tokens = budget: no early EOS, so the episode is surely running at both syncs
    gconfig = GenerationHyperparameters(group_size=1, max_new_tokens=BUDGET, min_new_tokens=BUDGET)
    workflow = RLVRWorkflow(gsm8k_reward_fn, gconfig, tokenizer)
    with open_engine(
        two_servers, tiny_model_dir, "in_place", max_head_offpolicyness=1, consumer_batch_size=1
    ) as engine:
        engine.submit({"id": "r0", "prompt": "What is 2 + 2?", "answer": "4"}, workflow)
        wait_running(two_servers, 1)
        held = [sync(engine, two_servers, tiny_model_dir, v) for v in (1, 2)]
        batch = engine.wait(1, timeout=120)
        assert engine.stats["interruptions"] == 0
        assert engine.executor.stats["stale_requeued"] == 1
    assert held == [1, 1], "the episode was not kept on the server over both syncs; raise BUDGET"
    produced = batch["versions"][batch["loss_mask"].bool()]
    assert produced.numel() == BUDGET and int(produced.min()) >= 2 - 1


def test_resume_without_waiting_reaches_the_servers_before_destroy(two_servers, tiny_model_dir):
    """The weight sync's resume(wait=False) returns before the servers answer; an engine
    destroyed right after it (a training run's end) must still leave no server paused."""
    for _ in range(10):
        config = InferenceEngineConfig(pause_mode="in_place", setup_timeout=60)
        engine = RemoteSGLangEngine(config, [s.address for s in two_servers])
        engine.initialize()
        engine.pause()
        assert all(st["paused"] for st in _states(two_servers))
        engine.resume(wait=False)
        engine.destroy()
        assert not any(st["paused"] for st in _states(two_servers))


def test_pause_mode_is_validated():
    with pytest.raises(ConfigError, match=r"rollout\.pause_mode='inplace'.*'abort', 'in_place', 'retract'"):
        InferenceEngineConfig(pause_mode="inplace")
    with pytest.raises(ConfigError, match="pause_mode='pause'"):
        load_config(["rollout.pause_mode=pause"], GRPOConfig)
    assert load_config(["rollout.pause_mode=in_place"], GRPOConfig).rollout.pause_mode == "in_place"


@pytest.mark.parametrize("mode", ["abort", "in_place", "retract"])
def test_update_bodies_follow_pause_mode(mode):
    """abort: abort_all_requests and the default flush; kept requests: no abort, never a flush
    (a refused flush kills 0.5.6-0.5.20 schedulers, docs/protocol.md §3.9)."""
    engine = RemoteSGLangEngine(InferenceEngineConfig(pause_mode=mode), ["127.0.0.1:1"])  # never initialized
    buckets = [[("a", torch.float32, (2,))], [("b", torch.float32, (3,))]]
    meta = WeightUpdateMeta(type="distributed", version=3, buckets=buckets)
    [(path, disk)] = engine.weights._protocol.disk_update_calls("/w", 3, engine.weights._keeps_requests, True)
    assert path == "/update_weights_from_disk" and disk["model_path"] == "/w"
    plan = engine.weights._protocol.distributed_calls(meta, engine.weights._keeps_requests, True)
    assert not plan.before and not plan.after  # SGLang serializes an update with generation
    assert [path for path, _ in plan.buckets] == ["/update_weights_from_distributed"] * 2
    dist = [body for _, body in plan.buckets]
    if mode == "abort":
        assert disk["abort_all_requests"] is True and "flush_cache" not in disk
        assert [b["flush_cache"] for b in dist] == [False, True] and all(b["abort_all_requests"] for b in dist)
    else:
        assert disk["flush_cache"] is False and "abort_all_requests" not in disk
        assert [b["flush_cache"] for b in dist] == [False, False] and not any("abort_all_requests" in b for b in dist)
    assert disk["weight_version"] == "3" and all(b["weight_version"] == "3" for b in dist)
