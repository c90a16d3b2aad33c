"""Output tokens/s of the built-in server vs HF `model.generate`: batched by budget, in arrival order, alone.

    PYTHONPATH=. python benchmarks/server_throughput.py [--model-path DIR] [--concurrency 32] \
        [--requests 256] [--repeats 5] [--threads 1] [--engine-cpus 0] [--client-cpus 1] \
        [--sorted-batch-sizes 16 32 64 128 256] [--server-concurrencies 32 64 128 256] [--smoke]

The workload is `--requests` requests of mixed lengths (prompts of 16-128 random tokens,
each with its own budget of 16-256 new tokens; EOS also ends a request), the same on every
side, sampled the same way: temperature 1.0, no top-k/top-p, no penalties. Three sides,
each on the same `--engine-cpus` with the same `--threads` torch threads (CPU only: CUDA
devices are hidden), alternating
within each of `--repeats` paired repeats (every side reloads nothing between repeats):

- server: `python -m arealite.server` (continuous batching) driven by closed-loop HTTP
  clients, one warm aiohttp session, running in this process on `--client-cpus` (the
  client is the user's program, as a trainer would be). Its number of clients is searched
  as the baseline's batch size is: every value of `--server-concurrencies` is timed 3
  times on the whole workload, and the fastest is used.
  Its forward is the lean one (`/get_server_info`'s `model_impl` is printed).
- sorted (the baseline): the strongest use of `model.generate` a reviewer would name: the
  requests sorted by budget (then prompt length), so each batch's rows need about the same
  number of steps and the same padding, in batches of left-padded prompts with
  `max_new_tokens` = the largest budget of the batch (generate takes one budget per call),
  each row's output cut to its own budget afterwards. Its batch size is searched: every
  size of `--sorted-batch-sizes` is timed 3 times on the whole workload before the
  repeats (up to the whole workload in one batch), and the fastest is used. A worker
  process on `--engine-cpus`.
- batched: the same in arrival order, in batches of `--concurrency` (32; a weaker baseline:
  each batch runs to its largest budget), printed beside.
- sequential: `model.generate` one request at a time (each with its own budget), on the
  first 8 requests, in the same worker.

Before every timed run, calibration included, this process (the HTTP clients) and the
generate worker collect their garbage and freeze what survives (`harness.settle`), so no run
pays a full collection of an earlier run's garbage; the server process is left as it is.
Throughput counts useful tokens only (each request's output up to its budget or EOS).
Prints every repeat, the spread (min/IQR/median/max) of the paired ratios, then
`speedup_at_<N>=<median server / sequential>` (N: the server's searched client count),
`speedup_vs_batched_generate=<median server / batched>` and last
`speedup_vs_sorted_batched_generate=<median server / sorted>`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import contextmanager

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness

SEQUENTIAL_REQUESTS = 8


def workload(n: int, vocab: int, seed: int = 0) -> list[tuple[list[int], int]]:
    """(prompt token ids, max_new_tokens) pairs of mixed lengths."""
    rng = random.Random(seed)
    return [([rng.randrange(3, vocab) for _ in range(rng.randint(16, 128))], rng.randint(16, 256)) for _ in range(n)]


# ---- the transformers side (a worker process) ------------------------------------------------


def hf_setup(args: argparse.Namespace):
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    eos = GenerationConfig.from_pretrained(args.model).eos_token_id
    return model, eos


def _useful(row: list[int], budget: int, eos: int) -> int:
    """Tokens of a generated row that the request asked for: up to its budget, EOS included."""
    row = row[:budget]
    return row.index(eos) + 1 if eos in row else len(row)


def hf_run(state, req: dict) -> dict:
    """Generate every request of `req["work"]`, batched by `req["batch"]`; returns seconds and useful tokens."""
    import torch

    model, eos = state
    work, batch = req["work"], req["batch"]
    if req.get("sort"):  # by budget, then prompt length: a batch's rows finish together, pad alike
        work = sorted(work, key=lambda w: (w[1], len(w[0])))
    torch.manual_seed(req["seed"])
    harness.settle()
    tokens, start = 0, time.perf_counter()
    with torch.inference_mode():
        for i in range(0, len(work), batch):
            chunk = work[i : i + batch]
            width = max(len(p) for p, _ in chunk)
            ids = torch.tensor([[0] * (width - len(p)) + p for p, _ in chunk])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in chunk])
            out = model.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=max(b for _, b in chunk), do_sample=True,
                temperature=1.0, top_k=0, top_p=1.0, eos_token_id=eos, pad_token_id=0,
            )  # fmt: skip
            tokens += sum(_useful(row, b, eos) for row, (_, b) in zip(out[:, width:].tolist(), chunk))
    return {"seconds": time.perf_counter() - start, "tokens": tokens}


# ---- the server side (HTTP clients in this process) ------------------------------------------


async def serve_all(session, url: str, work: list[tuple[list[int], int]], concurrency: int) -> tuple[float, int]:
    """`concurrency` closed-loop clients over `work`; returns (seconds, useful tokens)."""
    queue = list(reversed(work))
    tokens = 0

    async def client() -> None:
        nonlocal tokens
        while queue:
            prompt, budget = queue.pop()
            params = {"max_new_tokens": budget, "temperature": 1.0, "top_p": 1.0, "top_k": -1}
            async with session.post(f"{url}/generate", json={"input_ids": prompt, "sampling_params": params}) as r:
                out = await r.json()
            tokens += out["meta_info"]["completion_tokens"]

    start = time.perf_counter()
    await asyncio.gather(*[client() for _ in range(concurrency)])
    return time.perf_counter() - start, tokens


@contextmanager
def affinity(cpus: set[int]):
    """Run the block with this process pinned to `cpus` (children started inside inherit it)."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-path", default=None, help="defaults to a fresh tiny Qwen2 (arealite.tools.tiny_model)")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument(
        "--requests", type=int, default=256, help="requests per run; many per client, so the steady state dominates"
    )
    p.add_argument("--repeats", type=int, default=5, help="paired repeats (all sides, alternating order)")
    p.add_argument("--threads", type=int, default=1, help="torch threads of the server and of the generate worker")
    p.add_argument(
        "--engine-cpus", default=None, help="CPUs of the server and of the generate worker (default: CPU 0 of ours)"
    )
    p.add_argument("--client-cpus", default=None, help="CPUs of the HTTP clients (default: our other CPUs)")
    p.add_argument(
        "--sorted-batch-sizes", type=int, nargs="+", default=[16, 32, 64, 128, 256],
        help="batch sizes searched for the sorted generate baseline (3 timed runs each, the fastest kept)",
    )  # fmt: skip
    p.add_argument(
        "--server-concurrencies", type=int, nargs="+", default=[32, 64, 128, 256],
        help="client counts searched for the server (3 timed runs each, the fastest kept)",
    )  # fmt: skip
    p.add_argument(
        "--smoke", action="store_true", help="a few seconds: 4 short requests, 1 repeat (checks the script runs)"
    )
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        harness.serve_runs(lambda: hf_setup(args), hf_run)
        return
    if args.smoke:
        args.concurrency, args.requests, args.repeats, args.sorted_batch_sizes = 4, 4, 1, [2, 4]
        args.server_concurrencies = [2, 4]
    ours = sorted(os.sched_getaffinity(0))
    engine_cpus = harness.cpu_set(args.engine_cpus) if args.engine_cpus else {ours[0]}
    client_cpus = harness.cpu_set(args.client_cpus) if args.client_cpus else (set(ours) - engine_cpus or engine_cpus)
    with tempfile.TemporaryDirectory(prefix="server_throughput_") as tmp:
        model = args.model_path
        if model is None:
            from arealite.tools.tiny_model import build_tiny_model

            model = build_tiny_model(os.path.join(tmp, "model"))
        run(args, model, engine_cpus, client_cpus, tmp)


def run(args: argparse.Namespace, model: str, engine_cpus: set[int], client_cpus: set[int], tmp: str) -> None:
    import json

    import aiohttp

    from arealite.server.process import launch_server_process

    with open(os.path.join(model, "config.json")) as f:  # not transformers: its import costs seconds
        work = workload(args.requests, json.load(f)["vocab_size"])
    if args.smoke:
        work = [(p[:16], 8) for p, _ in work]
    seq_work = work[:SEQUENTIAL_REQUESTS]
    print(harness.machine_line())
    print(harness.commit_line())
    print(
        f"workload: {len(work)} requests, prompts {min(len(p) for p, _ in work)}-{max(len(p) for p, _ in work)} "
        f"tokens, budgets {min(b for _, b in work)}-{max(b for _, b in work)} new tokens "
        f"(sum {sum(b for _, b in work)}), temperature 1.0, EOS stops; server clients searched over "
        f"{args.server_concurrencies}, {args.concurrency} beside the one-at-a-time and arrival-order baselines; "
        f"{args.repeats} paired repeats"
    )
    argv = [os.path.abspath(__file__), "--worker", "--model", model, "--threads", str(args.threads)]
    env = {"OMP_NUM_THREADS": str(args.threads), **harness.CPU_ONLY}
    server_args = [
        "--torch-threads",
        str(args.threads),
        "--max-running-requests",
        str(max(args.concurrency, *args.server_concurrencies, 1)),
        "--random-seed",
        "0",
    ]
    with affinity(engine_cpus):  # the worker and the server inherit it, every thread included
        hf = harness.SideProcess("generate", argv, engine_cpus, os.path.join(tmp, "generate.log"), env)
        server = launch_server_process(model, extra_args=server_args, env=env, log_path=os.path.join(tmp, "server.log"))
    with hf, server, affinity(client_cpus):
        print(
            f"resources: server and generate worker each pinned to CPUs {sorted(engine_cpus)} with {args.threads} "
            f"torch thread(s); HTTP clients (this process) on CPUs {sorted(client_cpus)}"
        )
        for line in harness.process_tree(server.proc.pid) + hf.ready["resources"]:
            print(f"  {line}")
        loop = asyncio.new_event_loop()

        async def new_session() -> aiohttp.ClientSession:  # aiohttp wants a running loop
            return aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=3600), connector=aiohttp.TCPConnector(limit=0)
            )

        session = loop.run_until_complete(new_session())

        async def server_info() -> dict:
            async with session.get(f"{server.url}/get_server_info") as r:
                return await r.json()

        info = loop.run_until_complete(server_info())
        print(f"server forward: {info['model_impl']}")
        # warm up both sides (allocators, the session's connections) before any clock
        loop.run_until_complete(serve_all(session, server.url, work[: args.concurrency], args.concurrency))
        hf.run(work=work[: args.concurrency], batch=args.concurrency, seed=0)
        best = calibrate(
            "sorted generate", "batch", lambda b, i: tuple(hf.run(work=work, batch=b, seed=i, sort=True).values()),
            args.sorted_batch_sizes,
        )  # fmt: skip
        clients = calibrate(
            "server", "clients", lambda c, _i: loop.run_until_complete(serve_all(session, server.url, work, c)),
            args.server_concurrencies,
        )  # fmt: skip
        sides = {
            "server": lambda i: loop.run_until_complete(serve_all(session, server.url, work, clients)),
            "sorted": lambda i: tuple(hf.run(work=work, batch=best, seed=i, sort=True).values()),
            "batched": lambda i: tuple(hf.run(work=work, batch=args.concurrency, seed=i).values()),
            "sequential": lambda i: tuple(hf.run(work=seq_work, batch=1, seed=i).values()),
        }
        rates: dict[str, list[float]] = {name: [] for name in sides}
        print("repeat  side        seconds  tokens   tok/s")
        for i in range(args.repeats):
            for name in harness.order(i, list(sides)):
                harness.settle()  # this process's earlier garbage stays out of the HTTP clients' timing
                seconds, tokens = sides[name](i)
                rates[name].append(tokens / seconds)
                print(f"{i:6d}  {name:<10} {seconds:8.2f} {tokens:7d} {tokens / seconds:7.0f}")
        loop.run_until_complete(session.close())
        loop.close()
    report(args, rates, clients)


def calibrate(side: str, unit: str, timed: Callable[[int, int], tuple[float, int]], values: list[int]) -> int:
    """The value of one side's knob (generate's batch size, the server's client count) with the
    highest median throughput over 3 timed runs each, `timed(value, seed) -> (seconds, tokens)`,
    on the whole workload (a sample would favour small batches: its batches are fewer and emptier)."""
    medians = {}
    for value in values:
        rates = []
        for seed in range(3):
            harness.settle()
            seconds, tokens = timed(value, seed)
            rates.append(tokens / seconds)
        medians[value] = sorted(rates)[1]
        print(f"calibration, {side}, {unit} {value}: {harness.spread(rates, '.0f')} tok/s")
    best = max(medians, key=medians.get)
    print(f"{side} runs with {unit} {best}, the fastest")
    return best


def report(args: argparse.Namespace, rates: dict[str, list[float]], clients: int) -> None:
    vs_sorted = [s / b for s, b in zip(rates["server"], rates["sorted"])]
    vs_batched = [s / b for s, b in zip(rates["server"], rates["batched"])]
    vs_seq = [s / q for s, q in zip(rates["server"], rates["sequential"])]
    for name, r in rates.items():
        print(f"{name:<10} tok/s: {harness.spread(r, '.0f')}")
    print(f"server ({clients} clients) / sequential generate: {harness.spread(vs_seq)}")
    print(f"server / batched generate:    {harness.spread(vs_batched)}  (arrival order, batch {args.concurrency})")
    print(f"server / sorted generate:     {harness.spread(vs_sorted)}  (the baseline)")
    print(harness.load_line())
    print(f"speedup_at_{clients}={harness.quartiles(vs_seq)[2]:.2f}")
    print(f"speedup_vs_batched_generate={harness.quartiles(vs_batched)[2]:.2f}")
    print(f"speedup_vs_sorted_batched_generate={harness.quartiles(vs_sorted)[2]:.2f}")


if __name__ == "__main__":
    main()
