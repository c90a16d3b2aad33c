"""GAE on one packed batch: (a) the reverse-time Python loop that verl / AReaL / OpenRLHF
use (one step per token position, vectorized over the batch, padded [B, T]), (b) the
vectorized torch reference `gae_packed_torch`, (c) on CUDA, the public dispatcher
`gae_packed` (the Triton kernel, cu_seqlens checked in the kernel) and the torch reference
on the GPU, against the bandwidth floor of the GPU it runs on.

Both sides of each comparison run alternately, `--repeats` paired rounds (>= 5), so both see
the same machine load; every figure is min / median / max over the rounds and each ratio is
the median of the per-round ratios. The floor is the bytes the kernel must move divided by
the bandwidth of a device-to-device copy measured here. Ends with `reference_vs_loop=<x>` on
a CPU machine, and on CUDA with `triton_vs_torch_gpu=<x>` (torch time / Triton time) then
`triton_vs_floor=<x>` (Triton time / floor; 1 is the hardware limit).

    python benchmarks/advantages.py                 # 1,024 sequences x 1,024 tokens, 1 CPU thread
    python benchmarks/advantages.py --smoke         # a tiny batch: checks the script in seconds
    python benchmarks/advantages.py --seqs 64 --tokens 16384 --threads 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch

from arealite.algo.advantages import backend, gae_packed, gae_packed_torch, triton_available


def make_batch(seqs: int, tokens: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Equal-length sequences: a prompt (loss_mask 0), then model turns separated by
    environment turns (loss_mask 0), like a multi-turn agent trace."""
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(tokens)
    prompt = torch.randint(max(tokens // 16, 1), max(tokens // 4, 2), (seqs, 1), generator=g)
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


def paired(fns: dict[str, Callable[[], float]], repeats: int) -> dict[str, list[float]]:
    """Seconds per call of each timer, `repeats` rounds, the timers alternating within a round."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for timer in fns.values():
        timer()  # warm-up: allocator, caches, Triton compile
    for _ in range(repeats):
        for name, timer in fns.items():
            times[name].append(timer())
    return times


def spread(ts: list[float], unit: float = 1e3, name: str = "ms") -> str:
    return f"min {min(ts) * unit:9.3f}  median {statistics.median(ts) * unit:9.3f}  max {max(ts) * unit:9.3f} {name}"


def median_ratio(num: list[float], den: list[float]) -> float:
    """The median over rounds of num/den (each round's pair ran back to back)."""
    return statistics.median(a / b for a, b in zip(num, den))


def wall(fn: Callable[[], object]) -> Callable[[], float]:
    def timer() -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    return timer


def cuda_per_call(fn: Callable[[], object], calls: int) -> Callable[[], float]:
    """Seconds per call over `calls` back-to-back calls (host overhead included), CUDA events."""

    def timer() -> float:
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3 / calls

    return timer


def copy_bandwidth(nbytes: int, repeats: int) -> float:
    """Bytes per second of a device-to-device copy (read + write), best of `repeats`."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").uniform_()
    dst = torch.empty_like(src)
    per_copy = min(cuda_per_call(lambda: dst.copy_(src), 10)() for _ in range(repeats))
    return 2 * src.numel() * 4 / per_copy


def device_only(fn: Callable[[], object], calls: int) -> float | None:
    """Device seconds per call with the host overhead removed (calls replayed from a CUDA graph)."""
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


def check(got: torch.Tensor, want: torch.Tensor, tokens: int) -> None:
    """The paths agree up to fp32 rounding of a scan over `tokens` steps, relative to the magnitude."""
    bound = 8 * torch.finfo(torch.float32).eps * tokens**0.5 * float(want.abs().max())
    err = float((got.cpu().view_as(want) - want).abs().max())
    if err > bound:
        raise SystemExit(f"results disagree: max |diff| {err:.3e} > {bound:.3e}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqs", type=int, default=1024)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--gamma", type=float, default=1.0)
    ap.add_argument("--lam", type=float, default=0.95)
    ap.add_argument("--repeats", type=int, default=7, help="paired rounds (at least 5)")
    ap.add_argument("--calls", type=int, default=100, help="back-to-back CUDA calls per timed round")
    # One thread by default: on a shared machine a multi-threaded op stalls whenever one of its
    # workers is descheduled, which swamps the figures. Both paths get the same count.
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--smoke", action="store_true", help="a tiny batch and few calls: checks the script in seconds")
    args = ap.parse_args()
    if args.smoke:
        args.seqs, args.tokens, args.repeats, args.calls = 16, 128, 5, 5
    if args.repeats < 5:
        ap.error(f"--repeats {args.repeats}: at least 5 paired rounds are needed for a spread")
    torch.set_num_threads(args.threads)
    cuda = torch.cuda.is_available() and triton_available()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"resources: {args.threads} torch CPU thread(s) of {os.cpu_count()}, load average {load:.2f}; "
        f"device {torch.cuda.get_device_name() if cuda else 'none (CPU only)'}; torch {torch.__version__}"
    )
    b = make_batch(args.seqs, args.tokens)
    padded = {k: b[k].view(args.seqs, args.tokens) for k in ("rewards", "values", "loss_mask")}
    packed = (b["rewards"], b["values"], b["loss_mask"], b["cu_seqlens"], args.gamma, args.lam)
    print(
        f"batch: {args.seqs} sequences x {args.tokens} tokens, loss-masked fraction "
        f"{b['loss_mask'].float().mean():.3f}, gamma={args.gamma} lam={args.lam}; {args.repeats} paired rounds"
    )

    want, _ = gae_loop(padded["rewards"], padded["values"], padded["loss_mask"], args.gamma, args.lam)
    check(gae_packed_torch(*packed)[0], want, args.tokens)
    cpu = paired({
        "loop": wall(lambda: gae_loop(padded["rewards"], padded["values"], padded["loss_mask"], args.gamma, args.lam)),
        "reference": wall(lambda: gae_packed_torch(*packed)),
    }, args.repeats)  # fmt: skip
    for name, ts in cpu.items():
        print(f"cpu {name:<12} {spread(ts)}")
    lines = [f"reference_vs_loop={median_ratio(cpu['loop'], cpu['reference']):.1f}"]

    if cuda:
        dev = {k: v.cuda() for k, v in b.items()}
        flat = (dev["rewards"], dev["values"], dev["loss_mask"], dev["cu_seqlens"], args.gamma, args.lam)
        assert backend(dev["values"].device) == "triton"
        check(gae_packed(*flat)[0], want, args.tokens)
        check(gae_packed_torch(*flat)[0], want, args.tokens)
        gpu = paired({
            "triton": cuda_per_call(lambda: gae_packed(*flat), args.calls),
            "torch_gpu": cuda_per_call(lambda: gae_packed_torch(*flat), max(args.calls // 10, 2)),
        }, args.repeats)  # fmt: skip
        # bytes the kernel must move: read rewards, values, loss_mask, cu_seqlens; write advantages and returns
        moved = sum(dev[k].numel() * dev[k].element_size() for k in dev) + 2 * 4 * dev["values"].numel()
        bandwidth = copy_bandwidth(max(moved, 1 << 26) if not args.smoke else 1 << 22, args.repeats)
        floor = moved / bandwidth
        for name, ts in gpu.items():
            print(f"cuda {name:<11} {spread(ts, 1e6, 'us')} per call (back-to-back, host overhead included)")
        on_device = device_only(lambda: gae_packed(*flat), max(args.calls // 4, 2))
        if on_device is not None:
            print(f"cuda triton      {on_device * 1e6:9.1f} us per call on the device alone (CUDA graph replay)")
        print(
            f"floor: {moved / 1e6:.2f} MB moved at {bandwidth / 1e12:.2f} TB/s (device copy measured here) = "
            f"{floor * 1e6:.2f} us"
        )
        lines.append(f"triton_vs_torch_gpu={median_ratio(gpu['torch_gpu'], gpu['triton']):.1f}")
        lines.append(f"triton_vs_floor={statistics.median(gpu['triton']) / floor:.2f}")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
