"""Client-side cost of the rollout orchestration (RemoteSGLangEngine + WorkflowExecutor).

    python benchmarks/rollout_overhead.py [--model-path DIR] [--episodes 2000] [--repeats 3]

Three measurements, one run:
1. Against a stub server that answers at once (a tiny aiohttp app in a separate process,
   defined below; it is a stub on purpose: it isolates the client's own cost): trajectories/s
   through submit/wait, with a real workflow building padded trajectories.
2. The same stub holding every request for a while: the peak number of requests in flight
   at the stub, to show the client sustains 1,000+ concurrent requests.
3. Against a real built-in server (`python -m arealite.server`, tiny model unless
   --model-path), 256 requests in flight: the wall time of the same requests sent raw
   (bare aiohttp) and orchestrated (rollout_batch with a workflow), in alternating pairs;
   the client's CPU seconds are printed too. Ends with `overhead_pct=<x>` =
   (median paired orchestrated / raw - 1) * 100; target <= 5.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import aiohttp  # noqa: E402
import torch  # noqa: E402

from arealite.config import GenerationHyperparameters, InferenceEngineConfig  # noqa: E402
from arealite.rollout import RemoteSGLangEngine  # noqa: E402
from arealite.rollout.batch import trajectory_from_tokens  # noqa: E402
from arealite.rollout.protocol import generate_body  # noqa: E402
from arealite.types import ModelRequest  # noqa: E402
from arealite.workflow import RolloutWorkflow  # noqa: E402


# ---- the stub server ------------------------------------------------------------------------


def serve_stub(port: int, delay: float) -> None:
    """SGLang-shaped replies with max_new_tokens tokens, after `delay` seconds."""
    from aiohttp import web

    state = {"in_flight": 0, "peak": 0}

    async def generate(request: web.Request) -> web.Response:
        body = await request.json()
        n = body["sampling_params"]["max_new_tokens"]
        state["in_flight"] += 1
        state["peak"] = max(state["peak"], state["in_flight"])
        try:
            if delay:
                await asyncio.sleep(delay)
        finally:
            state["in_flight"] -= 1
        ids = [(7 * i) % 500 + 3 for i in range(n)]
        meta = {"id": "stub", "finish_reason": {"type": "length", "length": n}, "weight_version": "0",
                "output_token_logprobs": [[-1.0, t, None] for t in ids]}
        return web.json_response({"output_ids": ids, "meta_info": meta})

    async def ok(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def stats(request: web.Request) -> web.Response:
        return web.json_response(state)

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "stub", "max_model_len": 4096}]})

    async def reset(request: web.Request) -> web.Response:
        state["peak"] = 0
        return web.json_response(state)

    app = web.Application()
    app.router.add_post("/generate", generate)
    app.router.add_get("/health", ok)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/stats", stats)
    app.router.add_post("/reset", reset)
    web.run_app(app, host="127.0.0.1", port=port, print=None, backlog=4096)


# ---- helpers --------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd: list[str], port: int, timeout: float = 180.0) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(0.3)
    proc.kill()
    raise RuntimeError(f"{cmd} did not become healthy on port {port}")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()


class BenchWorkflow(RolloutWorkflow):
    """`group_size` samples of a fixed prompt, built into a padded trajectory (no reward)."""

    def __init__(self, gconfig: GenerationHyperparameters) -> None:
        self.gconfig = gconfig

    async def arun_episode(self, engine, data):
        reqs = [ModelRequest(input_ids=data["input_ids"], gconfig=self.gconfig, group_id=data["id"])
                for _ in range(self.gconfig.group_size)]
        resps = await asyncio.gather(*(engine.agenerate(r) for r in reqs))
        traj = trajectory_from_tokens([r.input_tokens for r in resps], [r.output_tokens for r in resps],
                                      [r.output_logprobs for r in resps], [r.output_versions for r in resps])
        traj["rewards"] = torch.zeros(len(resps))
        return traj


def records(n: int) -> list[dict]:
    return [{"id": f"b{i}", "input_ids": [3 + (i * 13 + j) % 400 for j in range(24)]} for i in range(n)]


# ---- measurements ---------------------------------------------------------------------------


def stub_throughput(address: str, episodes: int) -> tuple[float, float]:
    """Trajectories per second, and client CPU seconds per trajectory."""
    gconfig = GenerationHyperparameters(group_size=1, max_new_tokens=16)
    config = InferenceEngineConfig(max_concurrent_rollouts=1024, max_head_offpolicyness=10**6)
    engine = RemoteSGLangEngine(config, [address])
    engine.initialize()
    try:
        workflow = BenchWorkflow(gconfig)
        engine.rollout_batch(records(64), workflow)  # warm up connections
        start_t, cpu = time.perf_counter(), time.process_time()
        for record in records(episodes):
            engine.submit(record, workflow)
        engine.wait(episodes, timeout=600)
        return episodes / (time.perf_counter() - start_t), (time.process_time() - cpu) / episodes
    finally:
        engine.destroy()


def stub_peak_in_flight(address: str, episodes: int) -> int:
    gconfig = GenerationHyperparameters(group_size=1, max_new_tokens=4)
    config = InferenceEngineConfig(max_concurrent_rollouts=episodes, max_head_offpolicyness=10**6)
    engine = RemoteSGLangEngine(config, [address])
    engine.initialize()
    try:
        urllib.request.urlopen(urllib.request.Request(f"http://{address}/reset", data=b"{}"), timeout=5).read()
        engine.rollout_batch(records(episodes), BenchWorkflow(gconfig))
        import json

        with urllib.request.urlopen(f"http://{address}/stats", timeout=5) as r:
            return int(json.loads(r.read())["peak"])
    finally:
        engine.destroy()


async def raw_run(address: str, bodies: list[dict]) -> float:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one(body: dict) -> None:
            async with session.post(f"http://{address}/generate", json=body) as resp:
                await resp.json()

        start_t = time.perf_counter()
        await asyncio.gather(*(one(b) for b in bodies))
        return time.perf_counter() - start_t


def server_overhead(address: str, in_flight: int, repeats: int, max_new_tokens: int) -> dict[str, float]:
    """Median wall times of raw and orchestrated runs, the median of their paired ratios, and
    the client's CPU seconds per run (the part of the cost that is ours, free of the noise
    other processes add to wall time)."""
    gconfig = GenerationHyperparameters(group_size=4, max_new_tokens=max_new_tokens, temperature=0.0)
    data = records(in_flight // gconfig.group_size)
    bodies = [generate_body(r["input_ids"], gconfig, max_new_tokens) for r in data for _ in range(gconfig.group_size)]
    engine = RemoteSGLangEngine(InferenceEngineConfig(max_concurrent_rollouts=in_flight), [address])
    engine.initialize()
    workflow = BenchWorkflow(gconfig)

    def raw() -> tuple[float, float]:
        cpu = time.process_time()
        return asyncio.run(raw_run(address, bodies)), time.process_time() - cpu

    def orchestrated() -> tuple[float, float]:
        cpu, start_t = time.process_time(), time.perf_counter()
        engine.rollout_batch(data, workflow)
        return time.perf_counter() - start_t, time.process_time() - cpu

    runs: dict[str, list[tuple[float, float]]] = {"raw": [], "orchestrated": []}
    try:
        engine.rollout_batch(data[:4], workflow)  # warm up
        for i in range(repeats):  # alternate which goes first, so drift hits both alike
            order = [("raw", raw), ("orchestrated", orchestrated)]
            for name, fn in order if i % 2 == 0 else order[::-1]:
                runs[name].append(fn())
    finally:
        engine.destroy()
    ratios = [o[0] / r[0] for r, o in zip(runs["raw"], runs["orchestrated"])]
    return {
        "raw": statistics.median(w for w, _ in runs["raw"]),
        "orchestrated": statistics.median(w for w, _ in runs["orchestrated"]),
        "ratio": statistics.median(ratios),
        "raw_cpu": statistics.median(c for _, c in runs["raw"]),
        "orchestrated_cpu": statistics.median(c for _, c in runs["orchestrated"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--serve-stub", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--stub-delay", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--model-path", default=None, help="model for the built-in server (default: a tiny one)")
    parser.add_argument("--episodes", type=int, default=2000, help="trajectories in the stub throughput run")
    parser.add_argument("--in-flight", type=int, default=1200, help="requests held open in the concurrency run")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    args = parser.parse_args()
    if args.serve_stub is not None:
        serve_stub(args.serve_stub, args.stub_delay)
        return

    me = [sys.executable, str(Path(__file__).resolve())]
    port = free_port()
    stub = start(me + ["--serve-stub", str(port)], port)
    try:
        rate, cpu = stub_throughput(f"127.0.0.1:{port}", args.episodes)
    finally:
        stop(stub)
    print(f"stub server (answers at once): {rate:.0f} trajectories/s through submit/wait, "
          f"client CPU {cpu * 1e3:.2f} ms per trajectory")

    port = free_port()
    stub = start(me + ["--serve-stub", str(port), "--stub-delay", "2.0"], port)
    try:
        peak = stub_peak_in_flight(f"127.0.0.1:{port}", args.in_flight)
    finally:
        stop(stub)
    print(f"stub server (holds each request 2 s): peak_in_flight={peak}")

    with tempfile.TemporaryDirectory() as tmp:
        model = args.model_path
        if model is None:
            from arealite.tools.tiny_model import build_tiny_model

            model = build_tiny_model(os.path.join(tmp, "tiny"), seed=0)
        port = free_port()
        server = start([sys.executable, "-m", "arealite.server", "--model-path", model, "--port", str(port),
                        "--max-running-requests", "256", "--torch-threads", "1"], port)
        try:
            m = server_overhead(f"127.0.0.1:{port}", 256, args.repeats, args.max_new_tokens)
        finally:
            stop(server)
    print(
        f"built-in server, 256 in flight, {args.max_new_tokens} new tokens, median of {args.repeats}: "
        f"raw {m['raw']:.3f}s, orchestrated {m['orchestrated']:.3f}s, paired ratio {m['ratio']:.3f}; "
        f"client CPU raw {m['raw_cpu']:.3f}s, orchestrated {m['orchestrated_cpu']:.3f}s"
    )
    print(f"overhead_pct={(m['ratio'] - 1) * 100:.2f}")


if __name__ == "__main__":
    main()
