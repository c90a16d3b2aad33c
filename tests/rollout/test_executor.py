"""WorkflowExecutor behaviour on real servers: back-pressure, dynamic sampling, stale
trajectories re-generated, errors surfaced."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time

import pytest
import torch

from arealite.config import GenerationHyperparameters, InferenceEngineConfig
from arealite.interfaces import RolloutWorkflow
from arealite.rollout import RemoteSGLangEngine, RolloutWorkflowError
from arealite.rollout.batch import trajectory_from_tokens
from arealite.types import ModelRequest, WeightUpdateMeta

from .test_staleness import ListLoader

pytestmark = pytest.mark.timeout(180)


class ScriptedRewardWorkflow(RolloutWorkflow):
    """Two samples of `data["input_ids"]`; rewards come from the record. Tracks concurrency."""

    def __init__(self) -> None:
        self.active = 0
        self.max_active = 0

    async def arun_episode(self, engine, data):
        if data.get("explode"):
            raise KeyError("no such field")
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            gconfig = GenerationHyperparameters(max_new_tokens=data.get("budget", 3))
            reqs = [ModelRequest(input_ids=data["input_ids"], gconfig=gconfig, group_id=data["id"]) for _ in range(2)]
            resps = await asyncio.gather(*(engine.agenerate(r) for r in reqs))
        finally:
            self.active -= 1
        traj = trajectory_from_tokens(
            [r.input_tokens for r in resps],
            [r.output_tokens for r in resps],
            [r.output_logprobs for r in resps],
            [r.output_versions for r in resps],
        )
        traj["rewards"] = torch.tensor(data["rewards"], dtype=torch.float32)
        return traj


def make_engine(servers, **kw) -> RemoteSGLangEngine:
    engine = RemoteSGLangEngine(
        InferenceEngineConfig(setup_timeout=60, request_timeout=60, **kw), [s.address for s in servers]
    )
    engine.initialize()
    return engine


def records(n: int, **extra) -> list[dict]:
    return [{"id": f"r{i}", "input_ids": [3, 4, 5 + i % 50], "rewards": [float(i % 2), 1.0], **extra} for i in range(n)]


def test_full_queue_applies_back_pressure(two_servers):
    engine = make_engine(two_servers, max_concurrent_rollouts=3, max_head_offpolicyness=100)
    workflow = ScriptedRewardWorkflow()
    try:
        for record in records(20):
            engine.submit(record, workflow)  # never raises, however full
        batch = engine.wait(20, timeout=120)
    finally:
        engine.destroy()
    assert batch["input_ids"].shape[0] == 40
    assert workflow.max_active <= 3
    assert engine.executor.stats["accepted"] == 20
    stats = engine.export_stats()
    assert stats["rollout/accepted"] == 20 and stats["rollout/requests"] == 40 and stats["rollout/servers_down"] == 0


def test_dynamic_sampling_fills_the_batch(two_servers):
    engine = make_engine(two_servers, max_head_offpolicyness=2)
    workflow = ScriptedRewardWorkflow()
    loader = ListLoader(records(40), batch_size=4)  # half the groups have equal rewards [1, 1]
    try:
        for _ in range(2):
            batch = engine.prepare_batch(loader, workflow, should_accept=lambda t: bool(t["rewards"].std() > 0))
            assert batch["input_ids"].shape[0] == 4 * 2
            assert (batch["rewards"].view(4, 2).std(1) > 0).all()
    finally:
        engine.destroy()
    assert engine.executor.stats["rejected"] >= 4


def test_stale_trajectories_are_regenerated(two_servers, tiny_model_dir):
    engine = make_engine(two_servers, max_head_offpolicyness=0)
    workflow = ScriptedRewardWorkflow()
    try:
        engine.update_weights(WeightUpdateMeta(type="disk", path=tiny_model_dir, version=0)).result(timeout=60)
        for record in records(2):
            engine.submit(record, workflow)
        deadline = time.monotonic() + 60
        while engine.executor.stats["accepted"] < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        # the trainer moves on to version 1 before consuming these version-0 trajectories
        engine.pause()
        engine.update_weights(WeightUpdateMeta(type="disk", path=tiny_model_dir, version=1)).result(timeout=60)
        engine.set_version(1)
        engine.resume()
        batch = engine.wait(2, timeout=60)
    finally:
        engine.destroy()
    assert engine.executor.stats["stale_requeued"] == 2
    assert (batch["versions"][batch["loss_mask"].bool()] == 1).all()


def test_workflow_errors_surface_in_wait(two_servers):
    engine = make_engine(two_servers)
    try:
        with pytest.raises(TimeoutError, match="timed out after 0.2s"):
            engine.wait(1, timeout=0.2)
        engine.submit({"id": "boom", "explode": True}, ScriptedRewardWorkflow())
        with pytest.raises(RolloutWorkflowError, match="id='boom'") as info:
            engine.wait(1, timeout=60)
        assert isinstance(info.value.__cause__, KeyError)
        with pytest.raises(TypeError, match="arun_episode"):
            engine.submit({"id": "x"}, object())
        with pytest.raises(ValueError, match="count=0"):
            engine.wait(0)
    finally:
        engine.destroy()


def test_destroy_fails_a_waiting_rollout_batch(two_servers):
    """The batch (200 episodes, two at a time, of up to 400 tokens) takes many seconds; destroy
    comes once its first episode runs, so the batch cannot have finished before it."""
    engine = make_engine(two_servers, max_concurrent_rollouts=2)
    workflow = ScriptedRewardWorkflow()
    outcome: dict = {}

    def run() -> None:
        try:
            engine.rollout_batch(records(200, budget=400), workflow)
            outcome["result"] = "returned"
        except (concurrent.futures.CancelledError, RolloutWorkflowError) as e:
            outcome["result"] = type(e).__name__

    worker = threading.Thread(target=run)
    worker.start()
    deadline = time.monotonic() + 60
    while workflow.max_active == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert workflow.max_active > 0, "no episode started within 60 s"
    engine.destroy()
    worker.join(timeout=30)
    assert not worker.is_alive(), "rollout_batch hung after destroy()"
    assert outcome["result"] == "CancelledError"


def test_rollout_batch_raises_the_first_failure_without_waiting_for_the_rest():
    """One episode fails while the others are still running: rollout_batch raises its error at
    once (not after the others finish), on a client with a fake transport."""
    from tests.rollout.fakes import FakeTransport

    class FailOrHang(RolloutWorkflow):
        async def arun_episode(self, engine, data):
            if data["fail"]:
                await asyncio.sleep(0.05)
                raise KeyError("broken record")
            await asyncio.sleep(60)

    config = InferenceEngineConfig(setup_timeout=5, health_check_interval=60)
    with RemoteSGLangEngine(config, ["127.0.0.1:1"], transport=FakeTransport()) as engine:
        start = time.monotonic()
        with pytest.raises(RolloutWorkflowError, match="broken record") as info:
            engine.rollout_batch([{"id": i, "fail": i == 7} for i in range(20)], FailOrHang())
        assert time.monotonic() - start < 5
        assert isinstance(info.value.__cause__, KeyError)


@pytest.mark.parametrize("shape", [(1, 40), (3, 7), (16, 600)])
def test_oldest_version_matches_a_plain_loop(shape):
    """The oldest produced version (-1: prompt and pad), None when nothing was produced."""
    from arealite.rollout.episode import oldest_version as _oldest_version

    gen = torch.Generator().manual_seed(0)
    for trial in range(20):
        versions = torch.randint(-1, 6, shape, generator=gen)
        if trial == 0:
            versions.fill_(-1)  # nothing produced
        produced = [v for row in versions.tolist() for v in row if v >= 0]
        assert _oldest_version({"versions": versions}) == (min(produced) if produced else None)
    assert _oldest_version({}) is None
