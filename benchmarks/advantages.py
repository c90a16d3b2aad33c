"""GAE on one packed batch: (a) the reverse-time Python loop that verl / AReaL / OpenRLHF
use (one step per token position, vectorized over the batch, padded [B, T]), (b) the
vectorized torch reference `gae_packed_torch`, (c) the Triton kernel when CUDA is present.

Prints each CPU time (best and median of --repeats alternating runs; the ratio uses the
best, the run least disturbed by other processes on a shared machine), the CUDA times (mean
over back-to-back calls) and ends with `reference_vs_loop=<x>` and, on CUDA, `triton_vs_loop=<x>`.

    python benchmarks/advantages.py                    # 1,024 sequences x 1,024 tokens, 1 thread
    python benchmarks/advantages.py --seqs 64 --tokens 16384 --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import torch

from arealite.algo.advantages import gae_packed_torch, gae_packed_triton, triton_available

H200_BYTES_PER_S = 4.3e12


def make_batch(seqs: int, tokens: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Equal-length sequences: a prompt (loss_mask 0), then model turns separated by
    environment turns (loss_mask 0), like a multi-turn agent trace."""
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(tokens)
    prompt = torch.randint(tokens // 16, tokens // 4, (seqs, 1), generator=g)
    turn_phase = torch.randint(0, 256, (seqs, 1), generator=g)
    env = ((t + turn_phase) % 256) >= 224  # 32 env tokens every 256
    mask = (t >= prompt) & ~env  # [B, T]
    return {
        "rewards": torch.randn(seqs * tokens, generator=g),
        "values": torch.randn(seqs * tokens, generator=g),
        "loss_mask": mask.reshape(-1),
        "cu_seqlens": torch.arange(0, seqs * tokens + 1, tokens, dtype=torch.int32),
    }


def gae_loop(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float):
    """Reverse-time loop over t on padded [B, T]; env tokens keep the running carry (verl's
    multi-turn variant)."""
    mask = mask.to(values.dtype)
    next_value = torch.zeros_like(values[:, 0])  # [B]
    running = torch.zeros_like(values[:, 0])
    reversed_adv = []
    for t in reversed(range(values.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        candidate = delta + gamma * lam * running
        next_value = values[:, t] * mask[:, t] + (1 - mask[:, t]) * next_value
        running = candidate * mask[:, t] + (1 - mask[:, t]) * running
        reversed_adv.append(running)
    advantages = torch.stack(reversed_adv[::-1], dim=1) * mask
    return advantages, advantages + values


def cpu_times(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, tuple[float, float]]:
    """(best, median) seconds per function; calls alternate so both see the same machine load."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():
        fn()  # warm-up: allocator, caches
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: (min(ts), statistics.median(ts)) for name, ts in times.items()}


def cuda_time(fn: Callable[[], object], calls: int) -> float:
    """Mean seconds per call over `calls` back-to-back calls, timed with CUDA events."""
    fn()  # warm-up: Triton compile, allocator
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / calls


def cuda_graph_time(fn: Callable[[], object], calls: int) -> float | None:
    """Device seconds per call with host overhead removed: `calls` calls captured in one CUDA
    graph, replayed and timed with CUDA events. None if capture fails."""
    try:
        fn()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
        graph.replay()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
    except RuntimeError as e:
        print(f"cuda graph timing unavailable: {e}")
        return None
    return start.elapsed_time(end) / 1e3 / calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqs", type=int, default=1024)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--gamma", type=float, default=1.0)
    ap.add_argument("--lam", type=float, default=0.95)
    ap.add_argument("--repeats", type=int, default=15)
    # One thread by default: on a shared machine a multi-threaded op stalls whenever one of its
    # workers is descheduled, which swamps the figures. Both paths get the same count.
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    b = make_batch(args.seqs, args.tokens)
    padded = {k: b[k].view(args.seqs, args.tokens) for k in ("rewards", "values", "loss_mask")}
    packed = (b["rewards"], b["values"], b["loss_mask"], b["cu_seqlens"], args.gamma, args.lam)
    print(f"batch: {args.seqs} sequences x {args.tokens} tokens, loss-masked fraction "
          f"{b['loss_mask'].float().mean():.3f}, gamma={args.gamma} lam={args.lam}, torch threads={args.threads}")

    want, _ = gae_loop(padded["rewards"], padded["values"], padded["loss_mask"], args.gamma, args.lam)
    got, _ = gae_packed_torch(*packed)
    torch.testing.assert_close(got.view_as(want), want, rtol=1e-4, atol=1e-3)

    cpu = cpu_times({
        "loop": lambda: gae_loop(padded["rewards"], padded["values"], padded["loss_mask"], args.gamma, args.lam),
        "reference": lambda: gae_packed_torch(*packed),
    }, args.repeats)
    for name, (best, median) in cpu.items():
        print(f"cpu {name:<10} best {best * 1e3:9.2f} ms  median {median * 1e3:9.2f} ms")
    lines = [f"reference_vs_loop={cpu['loop'][0] / cpu['reference'][0]:.1f}"]

    if torch.cuda.is_available() and triton_available():
        dev = {k: v.cuda() for k, v in padded.items()}
        cu = b["cu_seqlens"].cuda()
        flat = [dev[k].reshape(-1) for k in ("rewards", "values", "loss_mask")]
        got, _ = gae_packed_triton(*flat, cu, args.gamma, args.lam)
        torch.testing.assert_close(got.cpu().view_as(want), want, rtol=1e-4, atol=1e-3)
        cuda_loop = cuda_time(lambda: gae_loop(dev["rewards"], dev["values"], dev["loss_mask"], args.gamma, args.lam), 3)
        def triton_call() -> object:
            return gae_packed_triton(*flat, cu, args.gamma, args.lam, check_cu_seqlens=False)

        tri = cuda_time(triton_call, 200)
        tri_device = cuda_graph_time(triton_call, 50)
        # bytes: read rewards, values, loss_mask, cu_seqlens; write advantages and returns (fp32)
        moved = sum(t.numel() * t.element_size() for t in (*flat, cu)) + 2 * 4 * flat[0].numel()
        bound = moved / H200_BYTES_PER_S
        print(f"cuda loop      {cuda_loop * 1e3:9.3f} ms per call")
        print(f"cuda triton    {tri * 1e6:9.1f} us per call (back-to-back calls incl. host overhead)")
        if tri_device is not None:
            print(f"cuda triton    {tri_device * 1e6:9.1f} us per call on the device (CUDA graph replay)")
        print(f"bytes moved {moved / 1e6:.1f} MB -> H200 bandwidth time {bound * 1e6:.1f} us; "
              f"triton / bandwidth time = {tri / bound:.2f} per call"
              + ("" if tri_device is None else f", {tri_device / bound:.2f} on the device"))
        lines.append(f"triton_vs_loop={cuda_loop / tri:.1f}")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
