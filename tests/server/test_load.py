"""A server with --api-key and tight limits: auth, the running-request bound, and load with
bad requests mixed in (every good one answered, every bad one a 400, bounded memory)."""

from __future__ import annotations

import asyncio
import random
import time
from concurrent.futures import ThreadPoolExecutor

import aiohttp
import psutil
import pytest

from tests.server.conftest import start_server

pytestmark = pytest.mark.timeout(240)
KEY = "sesame"
AUTH = {"Authorization": f"Bearer {KEY}"}
MAX_RUNNING = 16


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    args = ["--api-key", KEY, "--max-running-requests", str(MAX_RUNNING), "--max-total-tokens", "2048"]
    with start_server(model_dir, tmp_path_factory.mktemp("server_logs"), args) as proc:
        yield proc


def test_api_key_like_sglang(server):
    body = {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2}}
    assert server.post("/generate", body) == (401, {"error": "Unauthorized"})
    assert server.post("/generate", body, headers={"Authorization": "Bearer wrong"})[0] == 401
    assert server.get("/get_model_info")[0] == 401
    assert server.post("/generate", body, headers=AUTH)[0] == 200
    assert server.get("/get_model_info", headers=AUTH)[0] == 200
    assert server.get("/health")[0] == 200 and server.get("/health_generate")[0] == 200  # open routes


@pytest.mark.parametrize("max_new_tokens,bound", [(60, MAX_RUNNING), (250, 2048 // 253)])
def test_running_requests_bounded(server, max_new_tokens, bound):
    """At most --max-running-requests run at once, and prompt + max_new_tokens of the running
    requests stays within --max-total-tokens (2048 // 253 = 8 requests of 3 + 250 tokens)."""
    body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": max_new_tokens, "ignore_eos": True}}
    with ThreadPoolExecutor(24) as pool:
        futures = [pool.submit(server.post, "/generate", body, headers=AUTH) for _ in range(24)]
        peak = 0
        while not all(f.done() for f in futures):
            state = server.get("/get_server_info", headers=AUTH)[1]["internal_states"][0]
            peak = max(peak, state["num_running"])
            time.sleep(0.005)
    assert all(
        f.result()[0] == 200 and f.result()[1]["meta_info"]["completion_tokens"] == max_new_tokens for f in futures
    )
    assert peak == bound


BAD_BODIES = [
    {"input_ids": []},
    {"input_ids": [1], "sampling_params": {"top_p": 0}},
    {"input_ids": [1], "sampling_params": {"bogus": 1}},
    {"input_ids": [1] * 1024},
    {"input_ids": [1] * 1000, "sampling_params": {"max_new_tokens": 100}},
    {"input_ids": [1, 99999]},
    {"sampling_params": {"max_new_tokens": 1}},
    {"input_ids": [1], "sampling_params": {"max_new_tokens": 2.5}},
]


async def _run_load(url: str, n_requests: int, n_clients: int, seed: int) -> tuple[int, int, list[str]]:
    """Closed-loop clients; returns (good answered, bad rejected with 400, problems)."""
    rng = random.Random(seed)
    jobs = [
        ("bad", rng.choice(BAD_BODIES))
        if rng.random() < 0.2
        else (
            "good",
            {
                "input_ids": [rng.randrange(512) for _ in range(rng.randint(1, 30))],
                "sampling_params": {"max_new_tokens": rng.randint(1, 6), "ignore_eos": True},
            },
        )
        for _ in range(n_requests)
    ]
    good = bad = 0
    problems: list[str] = []

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal good, bad
        while jobs:
            kind, body = jobs.pop()
            async with session.post(f"{url}/generate", json=body, headers=AUTH) as r:
                reply = await r.json()
            if (
                kind == "good"
                and r.status == 200
                and reply["meta_info"]["completion_tokens"] == body["sampling_params"]["max_new_tokens"]
            ):
                good += 1
            elif kind == "bad" and r.status == 400 and "error" in reply:
                bad += 1
            else:
                problems.append(f"{kind} {body} -> {r.status} {reply}")

    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        await asyncio.gather(*[client(session) for _ in range(n_clients)])
    return good, bad, problems


def test_load_with_bad_requests_mixed_in(server):
    """1,000 requests from 200 concurrent clients, ~20% bad; RSS growth after warm-up <= 10%."""
    proc = psutil.Process(server.proc.pid)
    asyncio.run(_run_load(server.url, 300, 200, seed=0))  # warm-up: allocator and caches settle
    rss_before = proc.memory_info().rss
    good, bad, problems = asyncio.run(_run_load(server.url, 1000, 200, seed=1))
    rss_after = proc.memory_info().rss
    print(
        f"rss_before={rss_before / 2**20:.1f}MiB rss_after={rss_after / 2**20:.1f}MiB "
        f"growth={rss_after / rss_before - 1:+.2%}"
    )
    assert problems == []
    assert good + bad == 1000 and bad > 100
    assert rss_after <= 1.10 * rss_before, (rss_before, rss_after)
    assert server.get("/health")[0] == 200
