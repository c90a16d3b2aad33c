"""Client-side cost of the rollout orchestration (RemoteSGLangEngine + WorkflowExecutor).

    PYTHONPATH=. python benchmarks/rollout_overhead.py [--model-path DIR] [--pairs 15] [--in-flight 128] \
        [--max-new-tokens 128] [--batches 8] [--smoke]

Three measurements, one run:
1. Against a stub server that answers at once (a tiny aiohttp app in a separate process,
   defined below; a stub on purpose: it isolates the client's own cost): trajectories/s
   through submit/wait with a real workflow building padded trajectories, and the client's
   CPU milliseconds per trajectory.
2. The same stub holding every request for 2 s: the peak number of requests in flight at
   the stub, to show the client sustains 1,000+ concurrent requests.
3. The overhead against a real built-in server (tiny model unless --model-path): the same
   `--in-flight` greedy requests of `--max-new-tokens` tokens (deterministic: both sides
   get the same tokens, so the server does the same work) sent
   - raw: a bare POST + JSON parse of every request, gathered, over the client's own HTTP
     transport (`arealite.rollout.transport.Transport`), and
   - orchestrated: `rollout_batch` with a workflow that turns the replies into a padded
     trajectory batch (the path a training script takes),
   - and, for reference, the same bare loop over an aiohttp `ClientSession` (what a script
     without arealite would use): its client CPU is printed beside, not in the figure,
   `--pairs` times each, alternating which goes first; a timed run is `--batches` rounds of
   them, so that a run's CPU seconds are large next to psutil's clock tick (a hundredth of a
   second) and to the run-to-run noise of the client's CPU.

The figure, and why it is CPU time: on a shared 2-core machine the paired wall-time ratio
of 3. swings by +-20% from one pair to the next (other processes take the cores), far more
than the few percent to resolve. CPU seconds are steadier. So:
    overhead_pct = median over pairs of
        (client CPU s, orchestrated - client CPU s, raw) / server CPU s of the raw run x 100,
the client work the orchestration adds per unit of generation work. With the client on its
own core (as a trainer is) and a busy single-threaded server, the wall time can grow by
this much through the client's own work at most: it would, exactly, if none of that work
overlapped generation. What it does not see is a change in the server's work (requests
arriving more spread out, batched worse): both sides' server CPU seconds and decode steps
are printed next to it for that, and the paired wall-time overhead too. Target: <= 3 with an IQR
narrower than 1 point.

Equal conditions for 3.: both sides run on the same kind of event loop thread with the
same HTTP transport (`arealite.rollout.loop.EventLoopThread`,
`arealite.rollout.transport.Transport`), created once and warmed
with a full-size run (every connection open), reused for every run; the server has its own CPU (the first of
ours, 1 torch thread, CPU only) and the client the others. The tiny model is the worst case for the
ratio: its generation is very cheap per token, a real model's far dearer, while the client's
cost per token stays the same.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness

STUB_HOLD_S = 2.0


# ---- the stub server (imports nothing heavy: it starts in a fraction of a second) -------------


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
                "output_token_logprobs": [[-1.0, t, None] for t in ids]}  # fmt: skip
        return web.json_response({"output_ids": ids, "meta_info": meta})

    async def ok(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def stats(request: web.Request) -> web.Response:
        return web.json_response(state)

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "stub", "max_model_len": 4096}]})

    app = web.Application()
    app.router.add_post("/generate", generate)
    app.router.add_get("/health", ok)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/stats", stats)
    web.run_app(app, host="127.0.0.1", port=port, print=None, backlog=4096)


def start_stub(delay: float):
    """The stub in a subprocess; returns (process, address) once /health answers."""
    import subprocess

    from arealite.utils.net import free_ports, wait_healthy

    port = free_ports(1)[0]
    cmd = [sys.executable, os.path.abspath(__file__), "--serve-stub", str(port), "--stub-delay", str(delay)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if wait_healthy(f"127.0.0.1:{port}", timeout=60, alive=lambda: proc.poll() is None, interval=0.1):
        return proc, f"127.0.0.1:{port}"
    proc.kill()
    raise RuntimeError(f"the stub server did not answer /health on port {port}")


def stop(proc) -> None:
    proc.terminate()
    proc.wait(timeout=15)


# ---- the workflow ---------------------------------------------------------------------------


def bench_workflow(group_size: int, max_new_tokens: int, temperature: float):
    """`group_size` samples of a record's prompt, built into a padded trajectory (no reward)."""
    import torch

    from arealite.config import GenerationHyperparameters
    from arealite.interfaces import RolloutWorkflow
    from arealite.rollout.batch import trajectory_from_tokens
    from arealite.types import ModelRequest

    gconfig = GenerationHyperparameters(group_size=group_size, max_new_tokens=max_new_tokens, temperature=temperature)

    class BenchWorkflow(RolloutWorkflow):
        async def arun_episode(self, engine, data):
            reqs = [
                ModelRequest(input_ids=data["input_ids"], gconfig=gconfig, group_id=data["id"])
                for _ in range(group_size)
            ]
            resps = await asyncio.gather(*(engine.agenerate(r) for r in reqs))
            traj = trajectory_from_tokens(
                [r.input_tokens for r in resps],
                [r.output_tokens for r in resps],
                [r.output_logprobs for r in resps],
                [r.output_versions for r in resps],
            )
            traj["rewards"] = torch.zeros(len(resps))
            return traj

    return BenchWorkflow(), gconfig


def records(n: int) -> list[dict]:
    return [{"id": f"b{i}", "input_ids": [3 + (i * 13 + j) % 400 for j in range(24)]} for i in range(n)]


def engine_for(address: str, **config):
    from arealite.config import InferenceEngineConfig
    from arealite.rollout import RemoteSGLangEngine

    engine = RemoteSGLangEngine(InferenceEngineConfig(**config), [address])
    engine.initialize()
    return engine


# ---- 1 and 2: the stub ----------------------------------------------------------------------


def stub_throughput(address: str, episodes: int) -> tuple[float, float]:
    """Trajectories per second, and client CPU seconds per trajectory."""
    workflow, _ = bench_workflow(1, 16, 1.0)
    engine = engine_for(address, max_concurrent_rollouts=1024, max_head_offpolicyness=10**6)
    try:
        engine.rollout_batch(records(64), workflow)  # warm up connections
        start_t, cpu = time.perf_counter(), time.process_time()
        for record in records(episodes):
            engine.submit(record, workflow)
        engine.wait(episodes, timeout=600)
        return episodes / (time.perf_counter() - start_t), (time.process_time() - cpu) / episodes
    finally:
        engine.destroy()


def stub_peak_in_flight(address: str, episodes: int) -> int:
    workflow, _ = bench_workflow(1, 4, 1.0)
    engine = engine_for(address, max_concurrent_rollouts=episodes, max_head_offpolicyness=10**6)
    try:
        engine.rollout_batch(records(episodes), workflow)
        with urllib.request.urlopen(f"http://{address}/stats", timeout=5) as r:
            return int(json.loads(r.read())["peak"])
    finally:
        engine.destroy()


# ---- 3: the real server ---------------------------------------------------------------------


def server_overhead(
    address: str, server_pid: int, in_flight: int, pairs: int, max_new_tokens: int, batches: int
) -> dict[str, list[float]]:
    """Per-run wall, client CPU and server CPU seconds of the raw and orchestrated sides, `pairs` each;
    a run is `batches` rounds of `in_flight` requests, one after the other."""
    import aiohttp

    from arealite.backends.sglang import generate_body
    from arealite.rollout.loop import EventLoopThread
    from arealite.rollout.transport import KEEPALIVE_S, Transport

    group = 4
    workflow, gconfig = bench_workflow(group, max_new_tokens, 0.0)  # greedy: the same tokens on both sides
    data = records(in_flight // group)
    bodies = [generate_body(r["input_ids"], gconfig, max_new_tokens) for r in data for _ in range(group)]
    engine = engine_for(address, max_concurrent_rollouts=len(data))
    raw_loop = EventLoopThread("raw-client")  # the same machinery the engine runs on
    raw_loop.start()

    async def open_clients():
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S)
        transport = Transport()
        await transport.open()
        return transport, aiohttp.ClientSession(connector=connector)

    transport, session = raw_loop.run(open_clients())

    async def raw_all() -> None:
        async def one(body: dict) -> None:
            await transport.request("POST", address, "/generate", body)

        await asyncio.gather(*(one(b) for b in bodies))

    async def aiohttp_all() -> None:
        async def one(body: dict) -> None:
            async with session.post(f"http://{address}/generate", json=body) as resp:
                json.loads(await resp.read())

        await asyncio.gather(*(one(b) for b in bodies))

    def decode_steps() -> int:
        with urllib.request.urlopen(f"http://{address}/get_server_info", timeout=30) as r:
            return int(json.loads(r.read())["internal_states"][0]["decode_steps"])

    def timed(fn) -> tuple[float, float, float, int]:
        steps, server = decode_steps(), harness.tree_cpu_seconds(server_pid)
        cpu, start = time.process_time(), time.perf_counter()
        fn()
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        return wall, cpu, harness.tree_cpu_seconds(server_pid) - server, decode_steps() - steps

    def raw_run() -> None:
        for _ in range(batches):
            raw_loop.run(raw_all())

    def orchestrated_run() -> None:
        for _ in range(batches):
            engine.rollout_batch(data, workflow)

    def aiohttp_run() -> None:
        for _ in range(batches):
            raw_loop.run(aiohttp_all())

    sides = {"raw": raw_run, "orchestrated": orchestrated_run, "aiohttp": aiohttp_run}
    keys = ("", "_cpu", "_server_cpu", "_steps")
    out: dict[str, list[float]] = {f"{n}{x}": [] for n in sides for x in keys}
    try:
        for fn in sides.values():  # warm up: every connection of every client open, allocators warm
            fn()
        for i in range(pairs):
            for name in harness.order(i, list(sides)):
                for x, value in zip(keys, timed(sides[name])):
                    out[f"{name}{x}"].append(value)
    finally:
        raw_loop.run(transport.close())
        raw_loop.run(session.close())
        raw_loop.stop()
        engine.destroy()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve-stub", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--stub-delay", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--model-path", default=None, help="model for the built-in server (default: a tiny one)")
    parser.add_argument("--episodes", type=int, default=2000, help="trajectories in the stub throughput run")
    parser.add_argument("--stub-in-flight", type=int, default=1200, help="requests held open in the concurrency run")
    parser.add_argument("--in-flight", type=int, default=128, help="requests per run against the real server")
    parser.add_argument("--pairs", type=int, default=15, help="paired runs (raw and orchestrated, alternating order)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument(
        "--batches", type=int, default=8, help="rounds of --in-flight requests per timed run (more: finer CPU figures)"
    )
    parser.add_argument("--smoke", action="store_true", help="a few seconds: small runs, 2 pairs")
    args = parser.parse_args()
    if args.serve_stub is not None:
        serve_stub(args.serve_stub, args.stub_delay)
        return
    if args.smoke:
        args.episodes, args.stub_in_flight, args.in_flight, args.pairs, args.max_new_tokens = 64, 64, 16, 2, 32
        args.batches = 1
    cpus = sorted(os.sched_getaffinity(0))
    server_cpus, client_cpus = {cpus[0]}, set(cpus[1:]) or {cpus[0]}
    print(harness.machine_line())
    print(harness.commit_line())
    print(f"resources: stub / built-in server on CPU {sorted(server_cpus)} (1 torch thread), client (this process: "
          f"its event loop threads) on CPUs {sorted(client_cpus)}")  # fmt: skip
    stub_measurements(args, server_cpus, client_cpus)
    m = real_server_measurement(args, server_cpus, client_cpus)
    report(args, m)


def stub_measurements(args: argparse.Namespace, server_cpus: set[int], client_cpus: set[int]) -> None:
    """1 and 2 of the module docstring: the stub server, so only the client's cost shows."""
    os.sched_setaffinity(0, server_cpus)  # the servers started below inherit it
    stub, address = start_stub(0.0)
    os.sched_setaffinity(0, client_cpus)
    try:
        rate, cpu = stub_throughput(address, args.episodes)
    finally:
        stop(stub)
    print(f"stub server (answers at once): {rate:.0f} trajectories/s through submit/wait, "
          f"client CPU {cpu * 1e3:.2f} ms per trajectory")  # fmt: skip
    os.sched_setaffinity(0, server_cpus)
    stub, address = start_stub(STUB_HOLD_S)
    os.sched_setaffinity(0, client_cpus)
    try:
        peak = stub_peak_in_flight(address, args.stub_in_flight)
    finally:
        stop(stub)
    print(f"stub server (holds each request {STUB_HOLD_S:.0f} s): peak_in_flight={peak}")


def real_server_measurement(
    args: argparse.Namespace, server_cpus: set[int], client_cpus: set[int]
) -> dict[str, list[float]]:
    """3 of the module docstring: raw vs orchestrated against a built-in server on its own CPU."""
    from arealite.server.process import launch_server_process

    with tempfile.TemporaryDirectory() as tmp:
        model = args.model_path
        if model is None:
            from arealite.tools.tiny_model import build_tiny_model

            model = build_tiny_model(os.path.join(tmp, "tiny"), seed=0)
        os.sched_setaffinity(0, server_cpus)
        server = launch_server_process(
            model,
            extra_args=["--max-running-requests", str(args.in_flight), "--torch-threads", "1"],
            env=harness.CPU_ONLY,
            log_path=os.path.join(tmp, "server.log"),
        )
        os.sched_setaffinity(0, client_cpus)
        with server:
            return server_overhead(
                server.address, server.proc.pid, args.in_flight, args.pairs, args.max_new_tokens, args.batches
            )


def report(args: argparse.Namespace, m: dict[str, list[float]]) -> None:
    pct = [(o / r - 1) * 100 for r, o in zip(m["raw"], m["orchestrated"])]
    # psutil counts CPU time in clock ticks (USER_HZ, a hundredth of a second on Linux): a pair
    # whose server used less than a tick has no measurable denominator and is left out of the
    # figure (it happens only in tiny runs).
    triples = [t for t in zip(m["raw_cpu"], m["orchestrated_cpu"], m["raw_server_cpu"]) if t[2] > 0]
    if not triples:
        raise SystemExit("every raw run used less server CPU than the clock resolves: raise --max-new-tokens")
    cpu_pct = [(o - r) / s * 100 for r, o, s in triples]
    print(
        f"built-in server, {args.in_flight} requests in flight, {args.max_new_tokens} new tokens, "
        f"{args.batches} rounds per run, {args.pairs} pairs:"
    )
    requests = args.in_flight * args.batches
    for name in ("raw", "orchestrated", "aiohttp"):
        per = [c / requests * 1e3 for c in m[name + "_cpu"]]
        print(f"  {name:<12} client CPU ms per request: {harness.spread(per, '.3f')}")
    ratio = [o / a for o, a in zip(m["orchestrated_cpu"], m["aiohttp_cpu"])]
    print(f"  orchestrated client CPU / bare aiohttp client CPU (paired; reference): {harness.spread(ratio, '.3f')}")
    for name in ("raw", "orchestrated"):
        print(f"  {name:<12} wall s: {harness.spread(m[name], '.3f')}")
        print(f"  {name:<12} client CPU s: {harness.spread(m[name + '_cpu'], '.3f')}")
        print(f"  {name:<12} server CPU s: {harness.spread(m[name + '_server_cpu'], '.3f')}")
        print(f"  {name:<12} server decode steps: {harness.spread(m[name + '_steps'], '.0f')}")
    print(f"  wall-time overhead, % (paired; for reference, noisy on a shared machine): {harness.spread(pct, '.2f')}")
    if len(triples) < len(pct):
        print(f"  {len(pct) - len(triples)} pairs left out: their raw server CPU was below one clock tick")
    print(f"  extra client CPU / server CPU, % (paired; the figure): {harness.spread(cpu_pct, '.2f')}")
    print(harness.load_line())
    print(f"overhead_pct={harness.quartiles(cpu_pct)[2]:.2f}")


if __name__ == "__main__":
    main()
