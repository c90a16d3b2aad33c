"""The no-progress watchdog: a rollout that cannot move logs a diagnostic after
rollout.stall_timeout and raises it after twice that, naming the cause — paused servers,
a staleness capacity of 0, or a workflow stuck in its own code."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from arealite.config import GenerationHyperparameters, InferenceEngineConfig
from arealite.rollout import RemoteSGLangEngine, RolloutStalledError
from arealite.rollout.batch import trajectory_from_tokens
from arealite.rollout.watchdog import Watchdog
from arealite.types import ModelRequest

pytestmark = pytest.mark.timeout(120)
STALL_S = 1.0
PROBE_S = 2.0  # rollout.health_check_timeout: the diagnostic probes each server at most this long
# docs/reliability.md: raised at 2 x stall_timeout (the watchdog's own clock; the one warning
# below pins the period), plus the diagnostic's probes (at most health_check_timeout). The upper
# bound only tells the watchdog's raise from a later timeout's (request_timeout 60 s), with slack
# for a 2-core machine busy with the suite's other workers, where a raise has come a whole
# stall_timeout late.
RAISE_BOUND_S = 2 * STALL_S + PROBE_S + 15.0


class GenerateOnce:
    """One greedy sample of the record's prompt."""

    async def arun_episode(self, engine, data):
        gconfig = GenerationHyperparameters(max_new_tokens=3, temperature=0.0)
        resp = await engine.agenerate(ModelRequest(input_ids=[5, 6, 7], gconfig=gconfig))
        return trajectory_from_tokens(
            [resp.input_tokens], [resp.output_tokens], [resp.output_logprobs], [resp.output_versions]
        )


class Stuck:
    """A workflow that waits for something that never happens."""

    async def arun_episode(self, engine, data):
        await asyncio.Event().wait()


class Loader:
    """A dataloader of `records`, `batch_size` at a time, forever."""

    def __init__(self, records: list[dict], batch_size: int) -> None:
        self.records, self.batch_size = records, batch_size

    def __iter__(self):
        for i in range(0, len(self.records), self.batch_size):
            yield self.records[i : i + self.batch_size]


@pytest.fixture
def engine(builtin_server):
    config = InferenceEngineConfig(
        setup_timeout=30, request_timeout=60, stall_timeout=STALL_S, health_check_timeout=PROBE_S
    )
    engine = RemoteSGLangEngine(config, [builtin_server.address])
    engine.initialize()
    yield engine
    engine.destroy()


def _raises_after_warning(caplog, call) -> RolloutStalledError:
    start = time.monotonic()
    with caplog.at_level("WARNING", logger="arealite.rollout.watchdog"), pytest.raises(RolloutStalledError) as info:
        call()
    elapsed = time.monotonic() - start
    assert elapsed >= 2 * STALL_S, f"raised after {elapsed:.2f}s, before twice the stall timeout"
    assert elapsed <= RAISE_BOUND_S, f"raised after {elapsed:.2f}s, later than its bound {RAISE_BOUND_S}s"
    warnings = [r.getMessage() for r in caplog.records if r.name == "arealite.rollout.watchdog"]
    assert len(warnings) == 1 and "no progress" in warnings[0], warnings  # logged once, one period before
    print(f"raised after {elapsed:.2f}s")
    print(info.value)
    return info.value


def test_all_servers_paused(engine, builtin_server, caplog):
    assert builtin_server.post("/pause_generation", {"mode": "in_place"})[0] == 200
    try:
        error = _raises_after_warning(
            caplog, lambda: engine.rollout_batch([{"id": "p0"}, {"id": "p1"}], GenerateOnce())
        )
    finally:
        assert builtin_server.post("/continue_generation", {})[0] == 200
    text = str(error)
    assert f"server {builtin_server.address}: in rotation" in text and "paused=True" in text, text
    assert "num_waiting=" in text and "2 running" in text and "rollout.stall_timeout=1.0s" in text, text
    assert "oldest running episode: data id='p" in text and "of GenerateOnce" in text, text
    # the watchdog cancelled the stalled call's episodes: the next batch runs normally
    assert engine.rollout_batch([{"id": "again"}], GenerateOnce())["input_ids"].shape[0] == 1


def test_staleness_capacity_zero(engine, caplog):
    """The trainer forgot set_version after its weight sync: with max_head_offpolicyness=0 no
    episode may start after the first batch."""
    loader = Loader([{"id": f"r{i}"} for i in range(8)], batch_size=2)
    first = engine.prepare_batch(loader, GenerateOnce())
    assert first["input_ids"].shape[0] == 2
    error = _raises_after_warning(caplog, lambda: engine.prepare_batch(loader, GenerateOnce()))
    text = str(error)
    assert "staleness capacity: 0 = min(" in text and "max_head_offpolicyness 0" in text, text
    assert "calls set_version" in text and "0 running" in text, text


def test_stuck_workflow(engine, caplog):
    error = _raises_after_warning(caplog, lambda: engine.rollout_batch([{"id": "stuck-one"}], Stuck()))
    assert "oldest running episode: data id='stuck-one' of Stuck, running for" in str(error), str(error)
    assert not engine.executor._tasks, "the stalled episode was not cancelled"


def test_progress_resets_the_clock(builtin_server, caplog):
    """A rollout slower than stall_timeout overall, but moving, is never a stall."""
    # its own engine, with a stall_timeout several times each step's gap (a sleep and a 1-token
    # /generate): on a 2-core machine busy with the suite's other workers, a step has taken
    # longer than STALL_S end to end
    stall_s = 4.0
    config = InferenceEngineConfig(
        setup_timeout=30, request_timeout=60, stall_timeout=stall_s, health_check_timeout=PROBE_S
    )
    engine = RemoteSGLangEngine(config, [builtin_server.address])
    engine.initialize()

    class Slow:
        async def arun_episode(self, engine, data):
            for _ in range(7):  # 7 x 0.7 s > stall_timeout, each step a /generate call
                await asyncio.sleep(0.7)
                resp = await engine.agenerate(
                    ModelRequest(input_ids=[5, 6], gconfig=GenerationHyperparameters(max_new_tokens=1))
                )
            return {"input_ids": torch.tensor([resp.output_tokens])}

    start = time.monotonic()
    try:
        with caplog.at_level("WARNING", logger="arealite.rollout.watchdog"):
            batch = engine.rollout_batch([{"id": "slow"}], Slow())
    finally:
        engine.destroy()
    assert time.monotonic() - start > stall_s, "the rollout was not slower than stall_timeout overall"
    assert batch["input_ids"].shape == (1, 1)
    assert not [r for r in caplog.records if r.name == "arealite.rollout.watchdog"]


def test_a_late_check_warns_before_it_raises():
    """A caller whose first check comes after twice stall_timeout (its thread starved on a busy
    machine) still logs the diagnostic first; the raise follows at its next check. Driven by
    the watchdog's clock, not by waiting."""
    watchdog = Watchdog(STALL_S)
    waiting_since = watchdog.last_progress = time.monotonic() - 3 * STALL_S  # idle for 3 periods, never checked
    assert watchdog.verdict(waiting_since) == "warn"
    assert watchdog.due(waiting_since) <= time.monotonic()  # the raise is due at once
    assert watchdog.verdict(waiting_since) == "raise"
    watchdog.progress()  # progress starts a new period: neither again until stall_timeout has passed
    assert watchdog.verdict(waiting_since) is None
