"""Pausing with in-flight requests: abort (partial outputs, continuation), in_place, retract."""

from __future__ import annotations

import random
import time
from concurrent.futures import ThreadPoolExecutor, wait

import pytest

pytestmark = pytest.mark.timeout(240)
N = 32
BUDGET = 600
KEPT = 600  # tokens of the paused-and-kept requests: still running when the pause arrives, however fast the server


def _state(server) -> dict:
    return server.get("/get_server_info")[1]["internal_states"][0]


def _wait_running(server, n: int) -> None:
    while _state(server)["num_running"] < n:
        time.sleep(0.01)


def _prompts(n: int) -> list[list[int]]:
    rng = random.Random(3)
    return [[rng.randrange(0, 512) for _ in range(rng.randint(3, 12))] for _ in range(n)]


def _body(prompt: list[int], max_new: int) -> dict:
    return {
        "input_ids": prompt,
        "return_logprob": True,
        "sampling_params": {"max_new_tokens": max_new, "temperature": 0, "ignore_eos": True},
    }


def test_pause_abort_with_32_in_flight_then_continue(server):
    prompts = _prompts(N)
    with ThreadPoolExecutor(N + 1) as pool:
        futures = [pool.submit(server.post, "/generate", _body(p, BUDGET)) for p in prompts]
        _wait_running(server, N)
        assert server.post("/pause_generation", {}) == (
            200,
            {"message": "Generation paused successfully.", "status": "ok"},
        )
        try:
            partials, resumed = _check_aborted_and_resubmit(server, pool, futures, prompts)
        finally:
            assert server.post("/continue_generation", {}) == (
                200,
                {"message": "Generation continued successfully.", "status": "ok"},
            )
        continued = [f.result(120)[1] for f in resumed]
    assert all(c["meta_info"]["finish_reason"]["type"] == "length" for c in continued)
    # Nothing lost: partial + continuation is the uninterrupted greedy output.
    with ThreadPoolExecutor(8) as pool:
        whole = list(pool.map(lambda p: server.post("/generate", _body(p, BUDGET))[1]["output_ids"], prompts[:8]))
    for i in range(8):
        assert partials[i] + continued[i]["output_ids"] == whole[i]


@pytest.mark.parametrize("mode", ["in_place", "retract"])
def test_pause_keeps_requests_and_resumes(server, mode):
    prompts = _prompts(6)
    with ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(server.post, "/generate", _body(p, KEPT)) for p in prompts]
        _wait_running(server, 6)
        assert server.post("/pause_generation", {"mode": mode})[0] == 200
        try:
            _check_paused(server, futures, mode)
        finally:
            assert server.post("/continue_generation", {})[0] == 200
        outs = [f.result(120)[1] for f in futures]
    for out in outs:
        meta = out["meta_info"]
        assert meta["finish_reason"]["type"] == "length" and len(out["output_ids"]) == KEPT
        assert meta["num_retractions"] == (1 if mode == "retract" else 0)
        spans = meta["weight_versions"]
        assert [s["version"] for s in spans] == ["default", f"v-{mode}"]
        assert spans[0]["start"] == 0 and spans[0]["end"] == spans[1]["start"] and spans[1]["end"] == KEPT
        assert meta["weight_version"] == f"v-{mode}"
    whole = [server.post("/generate", _body(p, KEPT))[1]["output_ids"] for p in prompts[:3]]
    assert [o["output_ids"] for o in outs[:3]] == whole
    server.post("/update_weight_version", {"new_version": "default"})


def _check_paused(server, futures, mode: str) -> None:
    steps = _state(server)["decode_steps"]
    time.sleep(0.3)
    state = _state(server)
    assert state["decode_steps"] == steps  # nothing steps while paused
    if mode == "retract":
        assert state["num_running"] == 0 and state["num_waiting"] == 6  # KV dropped, requests queued
    else:
        assert state["num_running"] == 6
    assert not any(f.done() for f in futures)
    # A weight-version bump while paused shows up as a second span of weight_versions.
    assert server.post("/update_weight_version", {"new_version": f"v-{mode}", "abort_all_requests": False})[0] == 200


def _check_aborted_and_resubmit(server, pool, futures, prompts):
    # Pause(abort) returns only after every in-flight request was answered (0.5.6+).
    assert _state(server)["num_running"] == 0 and _state(server)["num_waiting"] == 0
    done, _ = wait(futures, timeout=30)
    assert len(done) == N
    partials = []
    for f in futures:
        status, out = f.result()
        meta = out["meta_info"]
        assert status == 200 and meta["finish_reason"]["type"] == "abort"
        assert 0 < len(out["output_ids"]) < BUDGET
        assert [t[1] for t in meta["output_token_logprobs"]] == out["output_ids"]
        partials.append(out["output_ids"])

    # Requests sent while paused wait (no error, no 503) until continue.
    resumed = [
        pool.submit(server.post, "/generate", _body(p + part, BUDGET - len(part))) for p, part in zip(prompts, partials)
    ]
    time.sleep(0.5)
    assert not any(f.done() for f in resumed)
    assert server.get("/ready")[0] == 503 and server.get("/health")[0] == 200
    return partials, resumed
