"""Output tokens/s of the built-in server at several concurrencies vs sequential `model.generate`.

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/server_throughput.py [--model-path DIR] [--max-new-tokens 64]

Both sides run the same weights with the same torch thread count in one run: the baseline
is transformers' `model.generate` (KV cache, greedy, one request at a time) in this
process; the server is `python -m arealite.server` driven by `concurrency` closed-loop HTTP
clients. Every request generates exactly `--max-new-tokens` tokens (EOS ignored). The last
line is `speedup_at_32=<server tok/s at concurrency 32 / sequential tok/s>`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import tempfile
import time

import aiohttp
import torch

from arealite.server.process import launch_server_process


def sequential_generate(model_path: str, prompts: list[list[int]], max_new_tokens: int) -> float:
    """Tokens/s of plain `model.generate`, one prompt after another."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    model.eval()
    kwargs = dict(max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        model.generate(torch.tensor([prompts[0]]), **kwargs)  # warm up
        start = time.perf_counter()
        tokens = 0
        for p in prompts:
            out = model.generate(torch.tensor([p]), **kwargs)
            tokens += out.shape[1] - len(p)
    return tokens / (time.perf_counter() - start)


async def server_throughput(url: str, prompts: list[list[int]], concurrency: int, max_new_tokens: int) -> float:
    """Tokens/s with `concurrency` clients each sending its next request when the last returns."""
    queue = list(prompts)
    tokens = 0

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal tokens
        while queue:
            prompt = queue.pop()
            body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 1.0, "ignore_eos": True}}
            async with session.post(f"{url}/generate", json=body) as r:
                out = await r.json()
            tokens += out["meta_info"]["completion_tokens"]

    timeout = aiohttp.ClientTimeout(total=3600)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        start = time.perf_counter()
        await asyncio.gather(*[client(session) for _ in range(concurrency)])
        return tokens / (time.perf_counter() - start)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-path", default=None, help="defaults to a fresh tiny Qwen2 (arealite.tools.tiny_model)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--baseline-requests", type=int, default=8)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 64])
    a = p.parse_args()
    threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
    torch.set_num_threads(threads)
    if a.model_path is not None:
        run(a, a.model_path, threads)
        return
    from arealite.tools.tiny_model import build_tiny_model

    with tempfile.TemporaryDirectory(prefix="bench_tiny_") as tmp:
        run(a, build_tiny_model(tmp), threads)


def run(a: argparse.Namespace, model_path: str, threads: int) -> None:
    rng = random.Random(0)
    prompts = [[rng.randrange(0, 500) for _ in range(rng.randint(16, 48))] for _ in range(256)]

    baseline = sequential_generate(model_path, prompts[: a.baseline_requests], a.max_new_tokens)
    print(f"threads={threads} max_new_tokens={a.max_new_tokens}")
    print(f"sequential model.generate: {baseline:9.1f} tok/s")
    results = {}
    with launch_server_process(model_path, env={"OMP_NUM_THREADS": str(threads)}) as server:
        asyncio.run(server_throughput(server.url, prompts[:8], 4, 8))  # warm up
        for c in a.concurrency:
            n_requests = max(2 * c, 16)
            results[c] = asyncio.run(server_throughput(server.url, prompts[:n_requests], c, a.max_new_tokens))
            print(f"server concurrency {c:3d}:    {results[c]:9.1f} tok/s  ({results[c] / baseline:5.2f}x)")
    if 32 in results:
        print(f"speedup_at_32={results[32] / baseline:.2f}")


if __name__ == "__main__":
    main()
