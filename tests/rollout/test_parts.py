"""The rollout client's parts alone, on a fake transport: the HTTP shapes they send and what a
transport error does to the rotation. No server and no engine object: each part is built from
what it receives (transport, pool, gate, config, callbacks)."""

import asyncio

import pytest
import torch

from arealite.backends.vllm import VLLMProtocol
from arealite.config import GenerationHyperparameters, InferenceEngineConfig
from arealite.rollout.client import RemoteSGLangEngine
from arealite.rollout.errors import GenerationError, TransientServerError, WeightUpdateError
from arealite.rollout.gate import VersionGate
from arealite.rollout.generation import SampleGenerator
from arealite.rollout.health import HealthMonitor
from arealite.rollout.servers import ServerPool
from arealite.rollout.weight_update import WeightUpdater
from arealite.types import ModelRequest, WeightUpdateMeta
from tests.rollout.fakes import FakeTransport

A, B = "127.0.0.1:1", "127.0.0.1:2"


def _parts(replies=None, server_protocol=None, **config):
    config = InferenceEngineConfig(**config)
    transport, pool, gate = FakeTransport(replies), ServerPool([A, B]), VersionGate()
    health = HealthMonitor(transport, pool, gate, config, rejoin=None)
    return transport, pool, gate, health, WeightUpdater(transport, pool, config, health, server_protocol), config


def _run(coro):
    return asyncio.run(coro)


@pytest.mark.parametrize("mode", ["abort", "in_place"])
def test_disk_update_posts_one_body_per_server_in_rotation(mode):
    transport, pool, _, _, weights, _ = _parts(pause_mode=mode)
    pool.mark_down(B)
    _run(weights.aupdate(WeightUpdateMeta(type="disk", path="/w/v3", version=3)))
    calls = transport.to("/update_weights_from_disk")
    assert [c.address for c in calls] == [A]
    expected = {"model_path": "/w/v3", "weight_version": "3"}
    expected.update({"abort_all_requests": True} if mode == "abort" else {"flush_cache": False})
    assert calls[0].body == expected


def test_distributed_update_sends_each_bucket_in_order_and_flushes_after_the_last():
    transport, _, _, _, weights, _ = _parts()
    buckets = [[("a", torch.float32, (2,))], [("b", torch.bfloat16, (3, 4))]]
    meta = WeightUpdateMeta(type="distributed", version=5, group_name="g", buckets=buckets)
    _run(weights.aupdate(meta))
    calls = transport.to("/update_weights_from_distributed")
    assert [(c.address, c.body["names"]) for c in calls] == [(A, ["a"]), (B, ["a"]), (A, ["b"]), (B, ["b"])]
    assert [c.body["flush_cache"] for c in calls] == [False, False, True, True]
    assert calls[-1].body["dtypes"] == ["bfloat16"] and calls[-1].body["shapes"] == [[3, 4]]
    assert {c.body["group_name"] for c in calls} == {"g"}


def test_a_vllm_distributed_update_wraps_the_buckets_in_start_and_finish():
    """vLLM's weight-transfer routes, each server in order: join once; start, one /update_weights per
    bucket (vLLM's `dtype_names`), finish with the version. A server whose start fails gets nothing
    more, the other goes on, and the error names it."""
    transport, _, _, _, weights, _ = _parts(
        {(B, "/start_weight_update"): (500, {"error": {"message": "no weight-update group"}})}, VLLMProtocol()
    )
    meta = WeightUpdateMeta(type="distributed", master_port=7, group_name="g", timeout=9.0, version=5)
    _run(weights.ainit_group(meta))
    joins = transport.to("/init_weight_transfer_engine")
    assert [(c.address, c.body["init_info"]["rank_offset"]) for c in joins] == [(A, 1), (B, 2)]
    assert joins[0].body["init_info"] == {
        "master_address": "127.0.0.1", "master_port": 7, "rank_offset": 1, "world_size": 3, "group_name": "g",
        "backend": "gloo", "timeout": 9.0,
    }  # fmt: skip
    buckets = [[("a", torch.float32, (2,))], [("b", torch.bfloat16, (3, 4))]]
    transport.calls.clear()
    with pytest.raises(WeightUpdateError, match=r"failed on \['127.0.0.1:2'\].*no weight-update group"):
        _run(weights.aupdate(WeightUpdateMeta(type="distributed", version=5, group_name="g", buckets=buckets)))
    assert [c.path for c in transport.calls if c.address == B] == ["/collective_rpc", "/start_weight_update"]
    to_a = [(c.path, c.body) for c in transport.calls if c.address == A]
    assert to_a == [
        ("/collective_rpc", {"method": "arealite_close_weight_update"}),  # one a dead trainer left open
        ("/start_weight_update", None),
        ("/update_weights", {"update_info": {"names": ["a"], "dtype_names": ["float32"], "shapes": [[2]]}}),
        ("/update_weights", {"update_info": {"names": ["b"], "dtype_names": ["bfloat16"], "shapes": [[3, 4]]}}),
        ("/finish_weight_update", {"weight_version": "5"}),
    ]

    async def leave() -> None:
        await weights.aleave_group()
        await asyncio.sleep(0.01)  # its calls go out without being awaited

    _run(leave())
    assert sorted(c.address for c in transport.to("/shutdown_weight_transfer_engine")) == [A, B]


def test_a_vllm_server_out_of_rotation_is_paused_around_the_broadcast():
    """A server back after a failure awaits the next broadcast out of rotation, so it was not paused
    with the rest; vLLM does not serialize a reload with generation, so the client pauses it."""
    paths = [path for path, _ in VLLMProtocol().distributed_calls(WeightUpdateMeta(version=2), False, False).before]
    assert paths == ["/pause?mode=abort&clear_cache=true", "/collective_rpc", "/start_weight_update"]
    after = VLLMProtocol().distributed_calls(WeightUpdateMeta(version=2), False, False).after
    assert after == [("/finish_weight_update", {"weight_version": "2"}), ("/resume", None)]


@pytest.mark.parametrize("protocol", [None, VLLMProtocol()], ids=["sglang", "vllm"])
def test_a_rejoining_server_is_resynced_before_it_is_back_in_rotation(protocol):
    """A restarted server comes back on its initial weights: every call of its resync to the newest
    disk version reaches it while it is still out of rotation, so no request can get there first
    (tests/launcher/test_local_vllm_fault.py shows the resync end to end; its timing cannot show the order)."""
    transport, pool, _, _, weights, _ = _parts(server_protocol=protocol)
    pool.mark_down(B)
    _run(weights.aupdate(WeightUpdateMeta(type="disk", path="/w/v3", version=3)))
    transport.calls.clear()
    in_rotation_at_call = []
    plain = transport.request

    async def request(method, address, path, *args, **kwargs):
        in_rotation_at_call.append((path, pool.is_healthy(address)))
        return await plain(method, address, path, *args, **kwargs)

    transport.request = request
    assert _run(weights.arejoin(B)) and pool.is_healthy(B)
    reload = "/collective_rpc" if protocol else "/update_weights_from_disk"
    resync = [c for c in transport.calls if c.path in (reload, "/update_weight_version")]
    assert resync and all(c.address == B for c in resync), transport.calls
    assert "/w/v3" in str(resync[0].body) and "3" in str(resync[-1].body)
    assert not [path for path, healthy in in_rotation_at_call if healthy], in_rotation_at_call


def test_a_server_that_dies_during_an_update_leaves_the_rotation():
    """A transport error plus a failed liveness check: out of rotation, the update goes on."""
    dead = TransientServerError("connection refused", B)
    transport, pool, _, _, weights, _ = _parts({(B, "/update_weights_from_disk"): dead, (B, "/get_model_info"): dead})
    _run(weights.aupdate(WeightUpdateMeta(type="disk", path="/w", version=1)))
    assert pool.healthy == [A] and pool.failovers == 1


def test_a_live_server_refusing_an_update_raises():
    transport, pool, _, _, weights, _ = _parts({(B, "/update_weights_from_disk"): (400, {"error": "bad path"})})
    with pytest.raises(WeightUpdateError, match="bad path"):
        _run(weights.aupdate(WeightUpdateMeta(type="disk", path="/w", version=1)))
    assert pool.healthy == [A, B]


def test_confirm_versions_goes_through_the_transport():
    transport, _, _, _, weights, _ = _parts(
        {(A, "/get_model_info"): (200, {"weight_version": "4"}), (B, "/get_model_info"): (200, {"weight_version": "3"})}
    )
    with pytest.raises(WeightUpdateError, match=r"version 4.*'127.0.0.1:2': '3'"):
        _run(weights.aconfirm(4))
    assert sorted(c.address for c in transport.to("/get_model_info")) == [A, B]


def test_init_group_bodies_give_each_server_its_rank():
    transport, _, _, _, weights, _ = _parts()
    meta = WeightUpdateMeta(type="distributed", master_address="10.0.0.1", master_port=1234, group_name="g")
    _run(weights.ainit_group(meta))
    bodies = {c.address: c.body for c in transport.to("/init_weights_update_group")}
    assert {a: b["rank_offset"] for a, b in bodies.items()} == {A: 1, B: 2}
    assert {b["world_size"] for b in bodies.values()} == {3}
    assert bodies[A]["master_address"] == "10.0.0.1" and bodies[A]["master_port"] == 1234


def test_generation_resubmits_after_an_abort_with_the_remaining_budget():
    """An abort reply with 2 tokens: the next /generate carries them in its prompt and asks for 2 fewer."""

    def reply(tokens, finish):
        logprobs = [[-0.1, t, None] for t in tokens]
        meta = {"finish_reason": {"type": finish}, "output_token_logprobs": logprobs}
        return {"output_ids": tokens, "meta_info": meta}

    replies = iter([reply([7, 8], "abort"), reply([9], "stop")])
    config = InferenceEngineConfig()
    transport = FakeTransport({"/generate": lambda call: (200, next(replies))})
    pool, gate = ServerPool([A]), VersionGate()

    async def main():
        gate.open()
        gen = SampleGenerator(transport, pool, gate, config, probe=None, on_progress=lambda: None)
        gconfig = GenerationHyperparameters(max_new_tokens=5)
        return await gen.agenerate(ModelRequest(input_ids=[1, 2, 3], gconfig=gconfig))

    resp = _run(main())
    first, second = (c.body for c in transport.to("/generate"))
    assert first["input_ids"] == [1, 2, 3] and first["sampling_params"]["max_new_tokens"] == 5
    assert second["input_ids"] == [1, 2, 3, 7, 8] and second["sampling_params"]["max_new_tokens"] == 3
    assert resp.output_tokens == [7, 8, 9] and resp.n_interruptions == 1 and resp.stop_reason == "stop"


@pytest.mark.parametrize("mode", ["abort", "retract"])
def test_the_client_on_a_fake_transport_pauses_and_resumes_every_server(mode):
    """The whole client runs on a fake transport (every /health answers 200): pause and resume
    send their bodies to each server in rotation, and a server that cannot be reached leaves."""
    transport = FakeTransport({(B, "/continue_generation"): TransientServerError("connection refused", B)})
    config = InferenceEngineConfig(pause_mode=mode, setup_timeout=5, health_check_interval=60)
    with RemoteSGLangEngine(config, [A, B], transport=transport) as engine:
        engine.pause()
        assert engine.paused
        engine.resume()
        assert not engine.paused and engine.pool.healthy == [A] and engine.stats["failovers"] == 1
    pauses = [(c.address, c.body) for c in transport.to("/pause_generation")]
    assert pauses == [(A, {"mode": mode}), (B, {"mode": mode})]
    assert [c.address for c in transport.to("/continue_generation")] == [A, B]
    assert {c.address for c in transport.to("/health")} == {A, B}


@pytest.mark.parametrize("echo", [True, False])
def test_truncated_sampling_asks_for_processed_logprobs_and_refuses_a_server_that_ignores_it(echo):
    """SGLang ignores the unknown top-level key and answers full-vocabulary logprobs without
    the echo (docs/protocol.md §1.6.1): the client must not train on them as if truncated."""

    def reply(call):
        meta = {"finish_reason": {"type": "stop"}, "output_token_logprobs": [[-0.1, 9, None]]}
        if echo and call.body.get("processed_logprobs"):
            meta["processed_logprobs"] = True
        return 200, {"output_ids": [9], "meta_info": meta}

    transport, pool, gate = FakeTransport({"/generate": reply}), ServerPool([A]), VersionGate()

    async def main(gconfig):
        gate.open()
        gen = SampleGenerator(transport, pool, gate, InferenceEngineConfig(), probe=None, on_progress=lambda: None)
        return await gen.agenerate(ModelRequest(input_ids=[1, 2], gconfig=gconfig))

    _run(main(GenerationHyperparameters(max_new_tokens=2)))  # nothing truncates: nothing asked, nothing checked
    assert "processed_logprobs" not in transport.to("/generate")[-1].body
    truncating = GenerationHyperparameters(max_new_tokens=2, top_p=0.9)
    if echo:
        assert _run(main(truncating)).output_logprobs == [-0.1]
    else:
        with pytest.raises(GenerationError, match="gconfig.truncated_logprobs=false"):
            _run(main(truncating))
    assert transport.to("/generate")[-1].body["processed_logprobs"] is True
    _run(main(GenerationHyperparameters(max_new_tokens=2, top_p=0.9, truncated_logprobs=False)))
    assert "processed_logprobs" not in transport.to("/generate")[-1].body
