"""The trainer and the built-in server agree: same weights and temperature -> same logprobs,
before and after a disk weight sync. Both are pinned to fp32 (the bf16 figure GPU users get
is measured by tests/gpu/test_cuda.py); the bound is on the max |diff| over every token:
fp32 rounding through the model's 64-long dot products, relative to the largest |logprob|."""

from __future__ import annotations

import os

import pytest
import torch

from arealite.config import GenerationHyperparameters, OptimizerConfig, PPOActorConfig
from arealite.server.process import launch_server_process
from arealite.train.actor import PPOActor
from arealite.types import WeightUpdateMeta
from tests.train.helpers import make_batch
from tests.train.server_utils import (
    batch_from_results,
    generate,
    max_abs_logprob_diff,
    max_parity_bound,
    mean_abs_logprob_diff,
)

torch.set_num_threads(2)
PROMPTS = [[5, 17, 42, 99], [300, 12], [7, 8, 9, 10, 11, 12], [250]]
HIDDEN = 64  # the tiny model's hidden size: the longest dot product behind a logit


def parity_bound(batch) -> float:
    return max_parity_bound(batch, HIDDEN)


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    proc = launch_server_process(
        tiny_model_dir, extra_args=["--dtype", "float32", "--torch-threads", "1", "--skip-server-warmup"]
    )
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def actor(tiny_model_dir):
    config = PPOActorConfig(path=tiny_model_dir, dtype="float32", optimizer=OptimizerConfig(lr=3e-2))
    return PPOActor(config, GenerationHyperparameters(group_size=2)).initialize()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_compute_logp_matches_server_logprobs(server, actor, temperature):
    results = generate(server, PROMPTS, {"max_new_tokens": 16, "temperature": temperature, "ignore_eos": True})
    batch = batch_from_results(PROMPTS, results)
    assert int(batch["loss_mask"].sum()) == 16 * len(PROMPTS)
    diff = max_abs_logprob_diff(actor.compute_logp(batch, temperature=temperature), batch)
    bound = parity_bound(batch)
    print(f"temperature={temperature} max_abs_logprob_diff={diff:.2e} bound={bound:.2e}")
    assert diff <= bound, f"trainer vs server max |logprob diff| = {diff} > {bound}"


@pytest.mark.timeout(180)
def test_disk_weight_sync_then_logprobs_still_match(server, actor, tmp_path):
    train = make_batch([9, 7, 8, 6], seed=12)
    train["rewards"] = torch.tensor([1.0, 0.0, 0.0, 1.0])
    train["logprobs"] = actor.compute_logp(train)
    actor.compute_advantages(train)
    actor.ppo_update(train)  # lr 3e-2: the weights move far from the server's

    params = {"max_new_tokens": 12, "temperature": 1.0, "ignore_eos": True}
    batch = batch_from_results(PROMPTS, generate(server, PROMPTS, params))
    assert mean_abs_logprob_diff(actor.compute_logp(batch), batch) > 1e-2  # stale server

    meta = WeightUpdateMeta(type="disk", path=str(tmp_path / "v1"), version=1)
    actor.save(meta.path)
    status, body = server.post("/update_weights_from_disk", {"model_path": meta.path, "weight_version": "1"})
    assert status == 200 and body["success"], body
    actor.set_version(1)
    results = generate(server, PROMPTS, params)
    assert all(r["meta_info"]["weight_version"] == "1" for r in results)
    batch = batch_from_results(PROMPTS, results)
    assert max_abs_logprob_diff(actor.compute_logp(batch), batch) <= parity_bound(batch)
    assert actor.get_version() == 1


@pytest.mark.timeout(240)
def test_disk_sync_keeps_the_newest_versions_after_the_servers_confirm(server, actor, tmp_path):
    from arealite.config import InferenceEngineConfig
    from arealite.rollout import RemoteSGLangEngine
    from arealite.weight_sync import WeightSync

    rollout = RemoteSGLangEngine(InferenceEngineConfig(setup_timeout=60, request_timeout=120), [server.address])
    rollout.initialize()
    try:
        weight_sync = WeightSync(actor, rollout, "disk", str(tmp_path), keep_versions=2)
        (tmp_path / "weights").mkdir()
        (tmp_path / "weights" / "v9").mkdir()  # left over from a crashed attempt: above the versions synced
        (tmp_path / "weights" / "notes").mkdir()  # not a version folder: left alone
        for version in range(11, 15):
            weight_sync.sync(version)
            status, info = server.get("/get_model_info")
            assert status == 200 and info["weight_version"] == str(version)
            kept = sorted(p.name for p in (tmp_path / "weights").iterdir())
            assert kept == sorted(["notes", *(f"v{v}" for v in range(max(11, version - 1), version + 1))]), kept
    finally:
        rollout.destroy()
    with pytest.raises(ValueError, match="keep_versions=0"):
        WeightSync(actor, rollout, "disk", str(tmp_path), keep_versions=0)


def test_prune_weight_versions_keeps_the_window_below_the_current_version(tmp_path):
    from arealite.weight_sync.sync import prune_weight_versions

    for name in ("v1", "v2", "v3", "v4", "v5", "v6", "v10", "vx", "latest"):
        (tmp_path / name).mkdir()
    deleted = prune_weight_versions(str(tmp_path), keep=3, current=5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "v3", "v4", "v5", "vx"]
    assert sorted(os.path.basename(p) for p in deleted) == ["v1", "v10", "v2", "v6"]
    assert prune_weight_versions(str(tmp_path / "missing"), keep=3, current=5) == []


@pytest.mark.timeout(180)
@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_min_new_tokens_ban_is_replayed_by_the_trainer(server, actor, top_p):
    """`gconfig.min_new_tokens` with extra `stop_token_ids`: the server samples the first answer
    tokens without the stop ids and reports that distribution's logprobs; the rollout client marks
    those tokens (`output_stop_banned`), and `PPOActor.compute_logp` under the same gconfig replays
    the ban (the model's EOS and the stop ids; before top-p), to fp32 rounding. A third of the
    vocabulary as stop ids makes the ban move each banned logprob by far more than the bound."""
    from arealite.config import InferenceEngineConfig
    from arealite.rollout import RemoteSGLangEngine
    from arealite.rollout.batch import trajectory_from_tokens
    from arealite.types import ModelRequest

    gconfig = GenerationHyperparameters(
        group_size=1, max_new_tokens=14, min_new_tokens=10, temperature=0.8, top_p=top_p,
        stop_token_ids=list(range(100, 280)), sampling_seed=5,
    )  # fmt: skip
    engine = RemoteSGLangEngine(InferenceEngineConfig(setup_timeout=60, request_timeout=120), [server.address])
    engine.initialize()
    try:
        resps = [engine.loop.run(engine.agenerate(ModelRequest(p, gconfig))) for p in PROMPTS]
    finally:
        engine.destroy()
    assert all(r.output_len >= 10 for r in resps) and all(r.output_stop_banned[:10] == [True] * 10 for r in resps)
    assert all(not any(r.output_stop_banned[10:]) for r in resps)
    batch = trajectory_from_tokens(
        [r.input_tokens for r in resps], [r.output_tokens for r in resps], [r.output_logprobs for r in resps],
        [r.output_versions for r in resps], output_stop_banned=[r.output_stop_banned for r in resps],
    )  # fmt: skip
    actor.gconfig = gconfig
    try:
        diff = max_abs_logprob_diff(actor.compute_logp(batch), batch)
        unbanned = {k: v for k, v in batch.items() if k != "stop_banned"}
        ignored = max_abs_logprob_diff(actor.compute_logp(unbanned), batch)
    finally:
        actor.gconfig = GenerationHyperparameters(group_size=2)
    bound = parity_bound(batch)
    print(f"top_p={top_p}: ban replayed max |diff| {diff:.2e} (bound {bound:.2e}); not replayed {ignored:.2e}")
    assert diff <= bound, f"trainer vs server max |logprob diff| = {diff} > {bound}"
    assert ignored > 100 * bound  # the ban matters here: a trainer ignoring it fails above
