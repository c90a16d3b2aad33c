"""Weight updates over a process group: the test plays the trainer's rank 0 and broadcasts
the buckets while the client's HTTP calls are in flight, as WeightSync.sync does."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
import torch
from transformers import AutoModelForCausalLM

from arealite.config import GenerationHyperparameters, InferenceEngineConfig
from arealite.rollout import RemoteSGLangEngine, WeightUpdateError
from arealite.types import ModelRequest, WeightUpdateMeta
from arealite.utils.net import free_ports
from arealite.weight_sync.group import broadcast, init_custom_process_group
from tests.tolerance import assert_close

pytestmark = pytest.mark.timeout(180)
LONG = 1000  # tokens of the answer a sync lands in (the tiny model's context is 1024)
ATTEMPTS = 5


def running_on(servers) -> int:
    """Requests the servers are generating (held ones included while paused in place)."""
    return sum(s.get("/get_server_info")[1]["internal_states"][0]["num_running"] for s in servers)


def push(engine: RemoteSGLangEngine, pg, meta: WeightUpdateMeta, params: dict[str, torch.Tensor], version: int) -> None:
    names = list(params)
    buckets = [names[i : i + 5] for i in range(0, len(names), 5)]  # several buckets, in order
    meta = dataclasses.replace(
        meta,
        version=version,
        buckets=[[(n, str(params[n].dtype), list(params[n].shape)) for n in bucket] for bucket in buckets],
    )
    engine.pause()
    future = engine.update_weights(meta)
    for bucket in buckets:
        for name in bucket:
            broadcast(pg, params[name].contiguous())
    future.result(timeout=120)
    engine.set_version(version)
    engine.resume()


def greedy(engine: RemoteSGLangEngine):
    request = ModelRequest(
        input_ids=[11, 12, 13, 14], gconfig=GenerationHyperparameters(max_new_tokens=6, temperature=0.0)
    )
    return asyncio.run(engine.agenerate(request))


def test_distributed_update_changes_weights_and_versions(two_servers, tiny_model_dir):
    engine = RemoteSGLangEngine(
        InferenceEngineConfig(setup_timeout=60, request_timeout=120), [s.address for s in two_servers]
    )
    engine.initialize()
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    original = {n: p.detach().clone() for n, p in model.named_parameters()}
    perturbed = {n: p + 0.5 * torch.randn_like(p) for n, p in original.items()}
    meta = WeightUpdateMeta(
        type="distributed",
        master_address="127.0.0.1",
        master_port=free_ports(1)[0],
        group_name="rollout_test_group",
        backend="gloo",
    )
    try:
        with pytest.raises(WeightUpdateError, match="has no buckets"):
            engine.update_weights(meta).result(timeout=10)
        with pytest.raises(WeightUpdateError, match="backend='mpi'"):
            engine.init_weights_update_group(dataclasses.replace(meta, backend="mpi")).result(timeout=10)
        before = greedy(engine)
        joined = engine.init_weights_update_group(meta)  # servers join as ranks 1 and 2
        pg = init_custom_process_group("gloo", "127.0.0.1", meta.master_port, 0, 3, meta.group_name, timeout=60)
        joined.result(timeout=60)

        push(engine, pg, meta, perturbed, version=7)
        after = greedy(engine)
        assert after.output_versions == [7] * after.output_len
        assert after.output_logprobs[0] != pytest.approx(before.output_logprobs[0])

        push(engine, pg, meta, original, version=8)
        restored = greedy(engine)
        assert restored.output_tokens == before.output_tokens
        assert_close(torch.tensor(restored.output_logprobs), torch.tensor(before.output_logprobs), n=64)
        assert restored.output_versions == [8] * restored.output_len

        # pause_mode=in_place (read per call): a long request stays on its server over the
        # broadcast and finishes with the perturbed weights; no flush is asked for (docs/protocol.md §3.9)
        engine.config.pause_mode = "in_place"
        for _ in range(ATTEMPTS):  # the pause must catch the answer running, however busy the machine
            long = ModelRequest(
                input_ids=[11, 12, 13, 14], gconfig=GenerationHyperparameters(max_new_tokens=LONG, temperature=0.0)
            )
            running = engine.loop.submit(engine.agenerate(long))
            while running_on(two_servers) < 1 and not running.done():
                pass
            engine.pause()  # in place: an answer still running stays on its server, where it is
            if running_on(two_servers) == 1:
                break
            engine.resume()  # it ended before the pause landed: again
            running.result(timeout=120)
        assert running_on(two_servers) == 1, f"in {ATTEMPTS} answers of {LONG} tokens none was running at the pause"
        push(engine, pg, meta, perturbed, version=9)
        kept = running.result(timeout=120)
        assert kept.n_interruptions == 0 and (kept.output_len == LONG or kept.stop_reason == "stop")
        switch = kept.output_versions.index(9)
        assert switch >= 1 and kept.output_versions == [8] * switch + [9] * (kept.output_len - switch)
        push(engine, pg, meta, original, version=10)  # the servers are shared: leave them as found
    finally:
        engine.destroy()
