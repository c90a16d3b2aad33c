"""Soak: the built-in server's memory over a long run of requests with weight updates.

    PYTHONPATH=. python benchmarks/soak.py [--minutes 10] [--model-path DIR] [--in-flight 16] [--smoke]

One built-in server (1 torch thread, CPU) and one rollout client (`RemoteSGLangEngine`) keep
`--in-flight` requests going (random prompts of 1-40 tokens, 1-48 new tokens, temperature 0,
0.7 or 1, seeded) for `--minutes`, with a disk weight update (pause, load, resume) every
`--update-every` seconds, as in a long training run. Every `--sample-every` seconds the
server's RSS and the number of requests completed so far are recorded.

The figure is the least-squares slope of the server's RSS against requests completed, in MB
per 1,000 requests, over the samples after the warm-up (the first `--warmup-minutes`: the
first forwards of each shape allocate once), printed with its standard error and with the
slopes of the first and second half of the samples, each with its own: a leak of per-request
state shows as a positive slope well outside its standard error in both halves; growth that
levels off (the allocator's heap reaching its working size) shows in the first half only;
flat within noise is the goal.
Every request must come back complete; the script exits non-zero if one fails. The CI test
tests/reliability/test_soak.py is the 20-second version of this with a generous bound.
Last line: `rss_mb_per_1k_requests=<slope>`.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness


def slope(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares slope of ys on xs and its standard error (nan with fewer than 3 points)."""
    n = len(xs)
    if n < 3:
        return float("nan"), float("nan")
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return float("nan"), float("nan")
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    residual = sum((y - my - b * (x - mx)) ** 2 for x, y in zip(xs, ys))
    return b, (residual / (n - 2) / sxx) ** 0.5


class Load:
    """A client thread keeping `in_flight` random requests going until `stop` is set."""

    def __init__(self, engine, in_flight: int, seed: int) -> None:
        self.engine, self.in_flight, self.rng = engine, in_flight, random.Random(seed)
        self.done, self.failed = 0, []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _request(self):
        from arealite.config import GenerationHyperparameters
        from arealite.types import ModelRequest

        prompt = [self.rng.randrange(3, 500) for _ in range(self.rng.randint(1, 40))]
        g = GenerationHyperparameters(
            max_new_tokens=self.rng.randint(1, 48), temperature=self.rng.choice([0.0, 0.7, 1.0])
        )
        return ModelRequest(input_ids=prompt, gconfig=g)

    def _run(self) -> None:
        pending = set()
        while not self.stop.is_set() or pending:
            while not self.stop.is_set() and len(pending) < self.in_flight:
                pending.add(self.engine.loop.submit(self.engine.agenerate(self._request())))
            for future in [f for f in pending if f.done()]:
                pending.discard(future)
                if future.exception() is not None:
                    self.failed.append(future.exception())
                self.done += 1
            time.sleep(0.01)


def soak(a: argparse.Namespace, model_path: str) -> None:
    import psutil

    from arealite.config import InferenceEngineConfig
    from arealite.rollout import RemoteSGLangEngine
    from arealite.server.process import launch_server_process
    from arealite.types import WeightUpdateMeta

    server = launch_server_process(
        model_path, extra_args=["--torch-threads", "1", "--skip-server-warmup", "--log-level", "warning"],
        env=harness.CPU_ONLY,
    )  # fmt: skip
    engine = RemoteSGLangEngine(InferenceEngineConfig(setup_timeout=60, request_timeout=300), [server.address])
    engine.initialize()
    proc = psutil.Process(server.proc.pid)
    load = Load(engine, a.in_flight, a.seed)
    samples: list[tuple[float, int, float]] = []  # (seconds, requests done, RSS MB)
    start = time.monotonic()
    load.thread.start()
    version, next_update, next_sample = 0, start + a.update_every, start
    try:
        while (now := time.monotonic()) < start + 60 * a.minutes:
            if now >= next_update:
                version += 1
                engine.pause()
                engine.update_weights(WeightUpdateMeta(type="disk", path=model_path, version=version)).result(120)
                engine.set_version(version)
                engine.resume()
                next_update = now + a.update_every
            if now >= next_sample:
                samples.append((now - start, load.done, proc.memory_info().rss / 2**20))
                next_sample = now + a.sample_every
            time.sleep(0.05)
        load.stop.set()
        load.thread.join(300)
    finally:
        load.stop.set()
        engine.destroy()
        server.stop()
    report(a, samples, load, version, engine.stats.get("interruptions", 0))


def report(a: argparse.Namespace, samples: list, load: Load, version: int, interruptions: int) -> None:
    print(harness.machine_line())
    print(harness.commit_line())
    print(
        f"soak: {a.minutes:g} min, {load.done} requests ({len(load.failed)} failed), {version} weight updates, "
        f"{interruptions} interrupted requests, {a.in_flight} in flight; server 1 torch thread"
    )
    print("  t (s)  requests  RSS (MB)")
    for t, n, rss in samples[:: max(1, len(samples) // 20)]:
        print(f"{t:7.0f} {n:9d} {rss:9.1f}")
    kept = [s for s in samples if s[0] >= 60 * a.warmup_minutes]
    half = len(kept) // 2
    per_k = [(n / 1000, rss) for _, n, rss in kept]
    b, se = slope(*zip(*per_k)) if len(per_k) >= 3 else (float("nan"), float("nan"))
    b1, se1 = slope(*zip(*per_k[:half])) if half >= 3 else (float("nan"), float("nan"))
    b2, se2 = slope(*zip(*per_k[half:])) if len(per_k) - half >= 3 else (float("nan"), float("nan"))
    if kept:
        print(
            f"after the {a.warmup_minutes:g}-min warm-up: RSS {kept[0][2]:.1f} -> {kept[-1][2]:.1f} MB over "
            f"{kept[-1][1] - kept[0][1]} requests; slope {b:+.3f} MB per 1,000 requests (standard error "
            f"{se:.3f}; first half {b1:+.3f} (se {se1:.3f}), second half {b2:+.3f} (se {se2:.3f}); {len(kept)} samples)"
        )
    print(harness.load_line())
    if load.failed:
        raise SystemExit(f"{len(load.failed)} requests failed, first: {load.failed[0]!r}")
    print(f"rss_mb_per_1k_requests={b:.3f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-path", default=None, help="HF model folder; default: a tiny Qwen2 built on the spot")
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--warmup-minutes", type=float, default=1.0, help="samples before this are left out of the slope")
    p.add_argument("--in-flight", type=int, default=16)
    p.add_argument("--update-every", type=float, default=2.0, help="seconds between weight updates")
    p.add_argument("--sample-every", type=float, default=5.0, help="seconds between RSS samples")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--smoke", action="store_true", help="6 seconds (checks the script runs; the slope means nothing)")
    a = p.parse_args()
    if a.smoke:
        a.minutes, a.warmup_minutes, a.sample_every = 0.1, 0.0, 1.0
    with tempfile.TemporaryDirectory(prefix="soak_") as tmp:
        path = a.model_path
        if path is None:
            from arealite.tools.tiny_model import build_tiny_model

            path = build_tiny_model(os.path.join(tmp, "m"))
        soak(a, path)


if __name__ == "__main__":
    main()
