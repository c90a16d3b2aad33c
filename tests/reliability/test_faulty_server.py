"""A server that answers 500, garbage, or never: each ends in a typed error that names the
server, within a bounded time; nothing hangs."""

from __future__ import annotations

import time

import pytest

from arealite.config import GenerationHyperparameters, InferenceEngineConfig
from arealite.rollout import GenerationError, RemoteSGLangEngine, RolloutError, RolloutWorkflowError, ServerUnavailable
from arealite.workflow import RLVRWorkflow

from .rewards import one

pytestmark = pytest.mark.timeout(60)

FAST_FAILING = dict(
    request_timeout=2.0, request_retries=1, setup_timeout=3.0, health_check_timeout=1.0, health_check_interval=0.5
)
RECORDS = [
    {"id": f"r{i}", "messages": [{"role": "user", "content": f"{i}+1="}], "answer": str(i + 1)} for i in range(2)
]


def _rollout(address: str, tokenizer) -> BaseException:
    """Run one batch against `address`; return the error it raised (it must raise)."""
    engine = RemoteSGLangEngine(InferenceEngineConfig(**FAST_FAILING), [address])
    engine.initialize()
    workflow = RLVRWorkflow(one, GenerationHyperparameters(group_size=2, max_new_tokens=4), tokenizer)
    try:
        with pytest.raises(RolloutWorkflowError) as info:
            engine.rollout_batch(RECORDS, workflow)
    finally:
        engine.destroy()
        workflow.scorer.pool.close()
    return info.value.__cause__


@pytest.mark.parametrize("faulty_server", [("500", "ok")], indirect=True)
def test_500_is_retried_then_fails_naming_the_server(faulty_server, tokenizer):
    cause = _rollout(faulty_server.address, tokenizer)
    assert isinstance(cause, ServerUnavailable), repr(cause)
    assert faulty_server.address in str(cause) and "500" in str(cause) and "request_retries" in str(cause)
    assert faulty_server.hits >= 2 * len(RECORDS)  # every request was retried at least once


@pytest.mark.parametrize("faulty_server", [("garbage", "ok"), ("bad_json", "ok")], indirect=True)
def test_garbage_reply_is_a_generation_error(faulty_server, tokenizer):
    cause = _rollout(faulty_server.address, tokenizer)
    assert isinstance(cause, GenerationError), repr(cause)
    assert "malformed /generate reply" in str(cause) and faulty_server.address in str(cause)


@pytest.mark.parametrize("faulty_server", [("never", "ok")], indirect=True)
def test_server_that_never_answers_times_out(faulty_server, tokenizer):
    start = time.monotonic()
    cause = _rollout(faulty_server.address, tokenizer)
    assert isinstance(cause, ServerUnavailable), repr(cause)
    assert "timed out" in str(cause) and faulty_server.address in str(cause) and "rollout.request_timeout" in str(cause)
    # two attempts of request_timeout plus backoff, not an hour
    assert time.monotonic() - start < 30


@pytest.mark.parametrize("faulty_server", [("never", "never")], indirect=True)
def test_server_that_never_answers_health_fails_startup(faulty_server):
    engine = RemoteSGLangEngine(InferenceEngineConfig(**FAST_FAILING), [faulty_server.address])
    with pytest.raises(ServerUnavailable, match="setup_timeout") as info:
        engine.initialize()
    assert faulty_server.address in str(info.value)


@pytest.mark.parametrize("faulty_server", [("never", "ok")], indirect=True)
def test_server_that_goes_silent_mid_run_leaves_rotation(faulty_server, tokenizer):
    """Healthy at startup, then /health hangs too: it leaves the rotation and, with no
    other server, the batch fails after setup_timeout naming the missing servers."""
    engine = RemoteSGLangEngine(InferenceEngineConfig(**FAST_FAILING), [faulty_server.address])
    engine.initialize()
    faulty_server.health = "never"
    workflow = RLVRWorkflow(one, GenerationHyperparameters(group_size=2, max_new_tokens=4), tokenizer)
    try:
        with pytest.raises(RolloutWorkflowError) as info:
            engine.rollout_batch(RECORDS, workflow)
        assert faulty_server.address in engine.pool.down
        assert engine.stats["failovers"] >= 1
    finally:
        engine.destroy()
        workflow.scorer.pool.close()
    assert isinstance(info.value.__cause__, ServerUnavailable), repr(info.value.__cause__)
    assert "no server in rotation" in str(info.value.__cause__)


@pytest.mark.parametrize("faulty_server", [("never", "ok")], indirect=True)
def test_pause_that_never_answers_is_bounded_and_named(faulty_server, caplog):
    """/pause_generation hangs: pause() returns after rollout.control_timeout, the server taken
    out of rotation with a reason that names the setting."""
    faulty_server.pause = "never"
    engine = RemoteSGLangEngine(InferenceEngineConfig(**FAST_FAILING, control_timeout=1.0), [faulty_server.address])
    engine.initialize()
    try:
        start = time.monotonic()
        with caplog.at_level("WARNING", logger="arealite.rollout.health"):
            engine.pause()
        assert time.monotonic() - start < 10
        # taken out once; its /health answers, so the next probe round may already have let it back
        assert engine.stats["failovers"] == 1, engine.stats
    finally:
        engine.destroy()
    assert "timed out after 1.0s; raise rollout.control_timeout" in caplog.text and faulty_server.address in caplog.text


@pytest.mark.parametrize("faulty_server", [("never", "ok")], indirect=True)
def test_refused_resume_without_waiting_is_raised_by_the_next_batch(faulty_server, tokenizer):
    """resume(wait=False) (the weight sync's last step) returns at once; a server that refuses
    /continue_generation makes the next wait() and rollout_batch() raise that error instead of
    waiting for episodes that can never start; resume() with waiting raises it directly."""
    faulty_server.resume = "400"
    engine = RemoteSGLangEngine(InferenceEngineConfig(**FAST_FAILING), [faulty_server.address])
    engine.initialize()
    workflow = RLVRWorkflow(one, GenerationHyperparameters(group_size=2, max_new_tokens=4), tokenizer)
    try:
        engine.pause()
        engine.resume(wait=False)
        start = time.monotonic()
        with pytest.raises(RolloutError, match="/continue_generation returned 400: cannot continue"):
            engine.wait(1, timeout=30)
        engine.pause()
        engine.resume(wait=False)
        with pytest.raises(RolloutError, match="/continue_generation returned 400"):
            engine.rollout_batch(RECORDS, workflow)
        assert time.monotonic() - start < 10  # well before the stall watchdog or the timeout
        assert faulty_server.hits == 0  # nothing generated on a server that never resumed
        with pytest.raises(RolloutError, match="/continue_generation returned 400"):
            engine.resume()
    finally:
        engine.destroy()
        workflow.scorer.pool.close()
