"""The cost of `--enable-deterministic-inference`: built-in server throughput with and without it.

    PYTHONPATH=. python benchmarks/deterministic_server.py [--model-path DIR] [--concurrency 32] \
        [--requests 128] [--repeats 5] [--threads 1] [--engine-cpus 0] [--client-cpus 1] [--smoke]

Two built-in servers of the same model, one default and one deterministic (each sequence runs
through the model alone, arealite/server/deterministic.py), pinned to the same `--engine-cpus`
with the same `--threads`, serve the same mixed workload (server_throughput.py's: prompts of
16-128 tokens, budgets of 16-256 new tokens, temperature 1) from `--concurrency` closed-loop
HTTP clients, alternating which goes first in each of `--repeats` paired repeats. Prints
every repeat, the spread (min/IQR/median/max) of the paired ratios deterministic / default
tok/s, and last `deterministic_throughput_ratio=<median>`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness
from server_throughput import affinity, serve_all, workload


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-path", default=None, help="defaults to a fresh tiny Qwen2 (arealite.tools.tiny_model)")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--requests", type=int, default=128, help="requests per run")
    p.add_argument("--repeats", type=int, default=5, help="paired repeats (both servers, alternating order)")
    p.add_argument("--threads", type=int, default=1, help="torch threads of each server")
    p.add_argument("--engine-cpus", default=None, help="CPUs of both servers (default: CPU 0 of ours)")
    p.add_argument("--client-cpus", default=None, help="CPUs of the HTTP clients (default: our other CPUs)")
    p.add_argument("--smoke", action="store_true", help="a few seconds: 4 short requests, 1 repeat")
    args = p.parse_args()
    if args.smoke:
        args.concurrency, args.requests, args.repeats = 4, 4, 1
    ours = sorted(os.sched_getaffinity(0))
    engine_cpus = harness.cpu_set(args.engine_cpus) if args.engine_cpus else {ours[0]}
    client_cpus = harness.cpu_set(args.client_cpus) if args.client_cpus else (set(ours) - engine_cpus or engine_cpus)
    with tempfile.TemporaryDirectory(prefix="deterministic_server_") as tmp:
        model = args.model_path
        if model is None:
            from arealite.tools.tiny_model import build_tiny_model

            model = build_tiny_model(os.path.join(tmp, "model"))
        run(args, model, engine_cpus, client_cpus, tmp)


def run(args: argparse.Namespace, model: str, engine_cpus: set[int], client_cpus: set[int], tmp: str) -> None:
    import aiohttp

    from arealite.server.process import launch_server_process

    with open(os.path.join(model, "config.json")) as f:
        work = workload(args.requests, json.load(f)["vocab_size"])
    if args.smoke:
        work = [(p[:16], 8) for p, _ in work]
    print(harness.machine_line())
    print(harness.commit_line())
    print(
        f"workload: {len(work)} requests, budgets {min(b for _, b in work)}-{max(b for _, b in work)} new tokens, "
        f"temperature 1.0, EOS stops; concurrency {args.concurrency}; {args.repeats} paired repeats"
    )
    env = {"OMP_NUM_THREADS": str(args.threads), **harness.CPU_ONLY}
    common = ["--torch-threads", str(args.threads), "--max-running-requests", str(args.concurrency)]
    common += ["--random-seed", "0", "--skip-server-warmup"]
    servers = {}
    with affinity(engine_cpus):
        for name, extra in (("default", []), ("deterministic", ["--enable-deterministic-inference"])):
            log = os.path.join(tmp, f"{name}.log")
            servers[name] = launch_server_process(model, extra_args=common + extra, env=env, log_path=log)
    try:
        with affinity(client_cpus):
            rates = _measure(args, servers, work, aiohttp)
    finally:
        for server in servers.values():
            server.stop()
    ratios = [d / b for d, b in zip(rates["deterministic"], rates["default"])]
    for name, r in rates.items():
        print(f"{name:<13} tok/s: {harness.spread(r, '.0f')}")
    print(f"deterministic / default: {harness.spread(ratios)}")
    print(harness.load_line())
    print(f"deterministic_throughput_ratio={harness.quartiles(ratios)[2]:.2f}")


def _measure(args, servers: dict, work: list, aiohttp) -> dict[str, list[float]]:
    loop = asyncio.new_event_loop()

    async def new_session():
        return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600), connector=aiohttp.TCPConnector(limit=0))

    session = loop.run_until_complete(new_session())
    for server in servers.values():  # warm up both before any clock
        loop.run_until_complete(serve_all(session, server.url, work[: args.concurrency], args.concurrency))
    rates: dict[str, list[float]] = {name: [] for name in servers}
    print(
        f"resources: both servers pinned to CPUs {sorted(os.sched_getaffinity(servers['default'].proc.pid))}, "
        f"{args.threads} torch thread(s) each; clients on CPUs {sorted(os.sched_getaffinity(0))}"
    )
    print("repeat  side           seconds  tokens   tok/s")
    for i in range(args.repeats):
        for name in harness.order(i, list(servers)):
            seconds, tokens = loop.run_until_complete(serve_all(session, servers[name].url, work, args.concurrency))
            rates[name].append(tokens / seconds)
            print(f"{i:6d}  {name:<13} {seconds:8.2f} {tokens:7d} {tokens / seconds:7.0f}")
    loop.run_until_complete(session.close())
    loop.close()
    return rates


if __name__ == "__main__":
    main()
