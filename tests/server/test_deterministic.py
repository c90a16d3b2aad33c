"""`--enable-deterministic-inference`: a request's tokens and logprobs do not depend on what
shares its batch. One live server on loopback answers the same seeded request alone and then
in the middle of a crowd of other requests (other lengths, other parameters, joining and
leaving while it decodes); the two answers must be bit-identical."""

from __future__ import annotations

import concurrent.futures

import pytest

from tests.server.conftest import start_server

PROBE = {
    "input_ids": [5, 17, 42, 99, 3],
    "sampling_params": {"max_new_tokens": 24, "temperature": 0.9, "ignore_eos": True, "sampling_seed": 21},
    "return_logprob": True,
}


def _crowd(i: int) -> dict:
    prompt = [(7 * i + j) % 300 + 1 for j in range(3 + 5 * (i % 4))]
    params = {"max_new_tokens": 4 + 6 * (i % 5), "temperature": 0.5 + 0.1 * i, "ignore_eos": True, "sampling_seed": i}
    return {"input_ids": prompt, "sampling_params": params, "return_logprob": True}


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    proc = start_server(model_dir, tmp_path_factory.mktemp("det_logs"), ["--enable-deterministic-inference"])
    yield proc
    proc.stop()


def _answer(reply: dict) -> list:
    return [(t[1], t[0]) for t in reply["meta_info"]["output_token_logprobs"]]


@pytest.mark.timeout(180)
def test_a_request_gets_the_same_bits_alone_and_in_a_crowd(server):
    status, alone = server.post("/generate", PROBE, timeout=120)
    assert status == 200, alone
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        crowd = [pool.submit(server.post, "/generate", _crowd(i), timeout=120) for i in range(10)]
        probe = pool.submit(server.post, "/generate", PROBE, timeout=120)
        rest = [pool.submit(server.post, "/generate", _crowd(i), timeout=120) for i in range(10, 12)]
        replies = [f.result() for f in crowd + rest]
        status, shared = probe.result()
    assert status == 200 and all(s == 200 for s, _ in replies)
    assert _answer(shared) == _answer(alone)  # exact: tokens and every logprob bit
    status, info = server.get("/get_server_info", timeout=30)
    assert info["enable_deterministic_inference"] is True
