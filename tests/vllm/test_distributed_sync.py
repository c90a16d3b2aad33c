"""A distributed weight sync into a real vLLM server (tests/vllm/conftest.py): `WeightSync` with
`weight_update=distributed` broadcasts a trained actor's weights in buckets over the trainer's gloo
group, and vLLM's weight-transfer routes receive them through arealite's engine
(arealite/backends/vllm_ext/arealite_vllm_transfer.py). Afterwards the server reports the version
and its logprobs of an answer equal the trainer's at the new weights, as closely as after a disk
sync of the same weights (both measured, printed with `-s`), also when the sync first closes an
update a dead trainer left open; bad requests get clear errors, and after a failed call (vLLM then
closes the connection) the client keeps the server in rotation, resumes it and generates.
"""

from __future__ import annotations

import uuid

import pytest
import torch

from arealite.config import GenerationHyperparameters, InferenceEngineConfig, OptimizerConfig, PPOActorConfig
from arealite.rollout import RemoteVLLMEngine, WeightUpdateError
from arealite.types import ModelRequest, WeightUpdateMeta
from tests.tolerance import magnitude, tolerance
from tests.train.helpers import make_batch
from tests.vllm.conftest import LOGPROB_BOUND_SHORT, MOVED_NATS, trainer_logprobs

pytestmark = [pytest.mark.xdist_group("vllm"), pytest.mark.timeout(900)]
PROMPT = [5, 17, 42, 99]
NEW_TOKENS = 24
HIDDEN = 128  # the served tiny model's width: the longest dot product behind a logit
TIMEOUT_S = 120.0  # forming the group and one broadcast, on a busy 2-core machine


def _engine(vllm_server) -> RemoteVLLMEngine:
    config = InferenceEngineConfig(setup_timeout=60.0, request_timeout=300.0, weight_update_timeout=TIMEOUT_S)
    engine = RemoteVLLMEngine(config, [vllm_server.address])
    engine.initialize()
    return engine


def _answer(engine: RemoteVLLMEngine):
    gconfig = GenerationHyperparameters(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, sampling_seed=11)
    return engine.loop.run(engine.agenerate(ModelRequest(rid=uuid.uuid4().hex, input_ids=PROMPT, gconfig=gconfig)))


def _mismatch(trained: str, resp) -> float:
    """max |server - trainer| over the answer's tokens, the trainer at its trained weights (saved
    in `trained`), with min_new_tokens's ban on the stop tokens replayed (tests/vllm/conftest.py)."""
    want = trainer_logprobs(trained, PROMPT + resp.output_tokens, NEW_TOKENS, 1.0, banned=NEW_TOKENS)
    return float((torch.tensor(resp.output_logprobs) - want).abs().max())


def test_a_distributed_sync_serves_the_trainers_new_weights(vllm_server, tmp_path):
    from arealite.train.actor import PPOActor
    from arealite.weight_sync import WeightSync

    config = PPOActorConfig(path=vllm_server.model_dir, dtype="float32", optimizer=OptimizerConfig(lr=3e-2))
    actor = PPOActor(config, GenerationHyperparameters(group_size=2)).initialize()
    train = make_batch([9, 7, 8, 6], seed=12)
    train["rewards"] = torch.tensor([1.0, 0.0, 0.0, 1.0])  # each group of 2 mixed: advantages are not zero
    train["logprobs"] = actor.compute_logp(train)
    actor.compute_advantages(train)
    actor.ppo_update(train)  # lr 3e-2: the weights move far from the server's
    trained = str(tmp_path / "trained")
    actor.save(trained)
    engine = _engine(vllm_server)
    try:
        stale = _mismatch(trained, _answer(engine))
        with WeightSync(actor, engine, "distributed", chunk_mb=1, timeout=TIMEOUT_S) as weight_sync:
            assert len(weight_sync.buckets) >= 2  # the bucket loop runs, not one call
            assert weight_sync.sync(1) == {vllm_server.address: "1"}
            assert vllm_server.call("GET", "/weight_info") == (200, {"weight_version": "1"})
            resp = _answer(engine)
            assert resp.output_versions == [1] * NEW_TOKENS
            distributed = _mismatch(trained, resp)
            # a trainer that died between start and finish left the update open, the model half loaded
            engine.pause()
            assert vllm_server.call("POST", "/start_weight_update")[0] == 200
            assert weight_sync.sync(2) == {vllm_server.address: "2"}  # the next sync closes it first
            reopened = _mismatch(trained, _answer(engine))

        meta = WeightUpdateMeta(type="disk", path=str(tmp_path / "v3"), version=3)  # the same weights, by disk
        actor.save(meta.path)
        engine.pause()
        engine.update_weights(meta).result(timeout=300)
        engine.resume()
        by_disk = _answer(engine)
        disk = _mismatch(trained, by_disk)
    finally:
        engine.destroy()
        vllm_server.restore()
    print(
        f"max |vLLM - trainer| logprob over {NEW_TOKENS} tokens: {stale:.2e} before the sync, {distributed:.2e} "
        f"after the distributed sync ({reopened:.2e} after one that closed an update left open), {disk:.2e} "
        "after a disk sync of the same weights"
    )
    assert stale > MOVED_NATS  # the trainer's weights really differ from the served ones
    assert distributed <= LOGPROB_BOUND_SHORT and reopened <= LOGPROB_BOUND_SHORT
    assert disk <= LOGPROB_BOUND_SHORT
    # the same seed and weights: the same answer, its logprobs equal to fp32 rounding (one server, two loads)
    assert by_disk.output_tokens == resp.output_tokens
    served = torch.tensor(resp.output_logprobs)
    bound = tolerance(torch.float32, HIDDEN) * magnitude(served)
    torch.testing.assert_close(torch.tensor(by_disk.output_logprobs), served, atol=bound, rtol=0)


def test_bad_weight_transfer_requests_get_a_clear_error(vllm_server):
    def post(path: str, body: dict | None = None) -> tuple[int, str]:
        status, reply = vllm_server.call("POST", path, body)
        return status, str(reply)

    # vLLM answers a worker's exception with a 500 that carries its message

    status, reply = post("/init_weight_transfer_engine", {"init_info": {"backend": "gloo", "rank_offset": 1}})
    assert status == 500 and "Invalid init_info for ArealiteWeightTransferEngine" in reply, reply
    fields = dict(master_address="127.0.0.1", master_port=1, rank_offset=1, world_size=2, group_name="g")
    status, reply = post("/init_weight_transfer_engine", {"init_info": {**fields, "backend": "mpi"}})
    assert status == 500 and "init_info.backend='mpi' is not supported" in reply, reply
    status, reply = post("/init_weight_transfer_engine", {"init_info": {**fields, "rank_offset": 2}})
    assert status == 500 and "rank_offset=2 must be in 1..world_size-1" in reply, reply
    assert post("/shutdown_weight_transfer_engine")[0] == 200  # no group, as after a trainer left
    engine = _engine(vllm_server)
    try:
        meta = WeightUpdateMeta(type="distributed", version=3, buckets=[[("model.norm.weight", "float32", [128])]])
        engine.pause()
        with pytest.raises(WeightUpdateError, match=r"POST /init_weight_transfer_engine before /start_weight_update"):
            engine.update_weights(meta).result(timeout=60)
        # vLLM closed the connection that carried the 500; the client's next calls go on a new one
        # (rollout/transport.py), so the server stays in rotation, resumes and serves
        assert engine.pool.healthy == [vllm_server.address]
        engine.resume()
        assert vllm_server.call("GET", "/is_paused") == (200, {"is_paused": False})
        assert len(_answer(engine).output_tokens) == NEW_TOKENS
        assert engine.pool.healthy == [vllm_server.address]
    finally:
        engine.destroy()
        vllm_server.restore()
    assert vllm_server.call("GET", "/weight_info") == (200, {"weight_version": "0"})
