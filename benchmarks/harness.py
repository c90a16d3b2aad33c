"""What the benchmarks here share: paired alternating repeats, their spread, pinned side
processes, and the lines a reader needs to judge a figure (machine, load, resources).

A benchmark compares two (or more) sides. Each side runs in its own long-lived process,
started once and pinned to a CPU set before it imports anything, so every thread and child
process it starts (servers, reward workers) inherits the same affinity. The driver then asks
the sides for one timed run each, in turn, `repeats` times, reversing the order every other
repeat: drift in machine load hits every side alike, and each repeat gives one paired ratio.
Start-up (imports, model load, server launch) is paid once per side, before any clock.

Deliberately absent: statistical tests. We print min / quartiles / median / max of the
paired ratios; a reader sees the noise next to the figure.
"""

from __future__ import annotations

import atexit
import functools
import gc
import json
import os
import platform
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The CPU benchmarks compare sides on the same CPU cores; on a GPU machine one side would
# otherwise pick the GPU up (the built-in server and the trainer use CUDA when they see it).
CPU_ONLY = {"CUDA_VISIBLE_DEVICES": ""}


# ---- figures ---------------------------------------------------------------------------------


def quartiles(xs: Sequence[float]) -> tuple[float, float, float, float, float]:
    """(min, p25, median, p75, max); the quartiles are the inclusive method (exact for n < 4 too)."""
    if not xs:
        raise ValueError("no values to summarise")
    xs = sorted(xs)

    def at(q: float) -> float:  # linear between order statistics; an exact hit never touches a neighbour (inf)
        pos = q * (len(xs) - 1)
        lo = int(pos)
        frac = pos - lo
        return xs[lo] if frac == 0 else xs[lo] + (xs[lo + 1] - xs[lo]) * frac

    return xs[0], at(0.25), at(0.5), at(0.75), xs[-1]


def spread(xs: Sequence[float], fmt: str = ".2f") -> str:
    """`median M (min A, IQR P25-P75, max B; n=N)`."""
    lo, p25, med, p75, hi = quartiles(xs)
    return f"median {med:{fmt}} (min {lo:{fmt}}, IQR {p25:{fmt}}-{p75:{fmt}}, max {hi:{fmt}}; n={len(xs)})"


def order(repeat: int, names: Sequence[Any]) -> list[Any]:
    """The sides in run order for repeat `repeat`: as given, reversed on odd repeats."""
    return list(names) if repeat % 2 == 0 else list(names)[::-1]


def settle() -> None:
    """Before a timed run: collect the garbage of earlier runs and freeze what survives, so
    the run's own collections scan only what it allocates (timeit keeps earlier garbage out of
    a timing the same way). Called by every side of a comparison alike."""
    gc.collect()
    gc.freeze()
    _unfreeze_at_exit()


@functools.cache
def _unfreeze_at_exit() -> None:
    """Once: at exit the frozen objects are collected as usual (extensions check for leaks)."""
    atexit.register(gc.unfreeze)


# ---- context lines -------------------------------------------------------------------------


def load_line() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} (1/5/15 min) on {os.cpu_count()} CPUs"


def machine_line() -> str:
    """CPU model, CPUs, python, torch, and the accelerator if any."""
    import torch

    cpu = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return (
        f"machine: {cpu}, {os.cpu_count()} CPUs, {gpu}, python {platform.python_version()}, torch {torch.__version__}"
    )


def commit_line() -> str:
    try:
        out = subprocess.run(
            ["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        )
        dirty = subprocess.run(
            ["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return f"commit: {out.stdout.strip() or 'unknown'}{' (with local changes)' if dirty.stdout.strip() else ''}"
    except (OSError, subprocess.SubprocessError):
        return "commit: unknown"


def build_warm_start(config: str) -> str:
    """The actor model of a job's config (a path under the repository), built with the job's
    own `launcher.setup_commands` when absent, before any clock; returns its path."""
    from arealite.config import GRPOConfig, load_config

    spec = load_config(["--config", os.path.join(REPO, config)], GRPOConfig)
    model = os.path.join(REPO, spec.actor.path)
    if not os.path.isfile(os.path.join(model, "config.json")):
        for cmd in spec.launcher.setup_commands:
            print(f"building {model} with {config}'s setup: {cmd}", flush=True)
            subprocess.run(cmd, shell=True, cwd=REPO, check=True)
    return model


def cpu_set(spec: str | None) -> set[int]:
    """`--cpus` ("0,1" or "0-3"); None means every CPU this process may use."""
    if not spec:
        return set(os.sched_getaffinity(0))
    cpus: set[int] = set()
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    missing = cpus - os.sched_getaffinity(0)
    if missing:
        raise SystemExit(
            f"--cpus {spec}: CPUs {sorted(missing)} are not available here (have {sorted(os.sched_getaffinity(0))})"
        )
    return cpus


def process_tree(pid: int) -> list[str]:
    """One line per process under `pid` (itself included): name, CPU affinity, OS threads."""
    import psutil

    root = psutil.Process(pid)
    lines = []
    for proc in [root, *root.children(recursive=True)]:
        try:
            cmd = proc.cmdline()
            what = " ".join(os.path.basename(c) for c in cmd[:4]) if cmd else proc.name()
            lines.append(
                f"pid {proc.pid} [{what[:70]}]: cpus {sorted(proc.cpu_affinity())}, {proc.num_threads()} OS threads"
            )
        except psutil.Error:
            continue
    return lines


def tree_cpu_seconds(pid: int | None = None) -> float:
    """User + system CPU seconds of `pid` (default: this process) and its live descendants."""
    import psutil

    root = psutil.Process(pid)
    total = 0.0
    for proc in [root, *root.children(recursive=True)]:
        try:
            t = proc.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            continue
    return total


# ---- side processes --------------------------------------------------------------------------


class SideProcess:
    """A benchmark side in its own process, pinned to `cpus`, answering one run per request.

    `argv` re-runs a script in worker mode (the script calls `serve_runs`). The worker's
    stdout carries one JSON line per run; everything it or its libraries print goes to
    `log_path`. `wrap` turns the command into one that runs elsewhere (a simulated host:
    tests/multinode/netns.py's `Host.wrap`).
    """

    def __init__(
        self, name: str, argv: list[str], cpus: set[int], log_path: str, env: dict[str, str] | None = None,
        wrap: Callable[[list[str]], list[str]] | None = None,
    ):  # fmt: skip
        self.name = name
        self.log_path = log_path
        full_env = {
            **os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error",
            "PYTHONPATH": os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p), **(env or {}),
        }  # fmt: skip
        self._log = open(log_path, "w")
        cmd = [sys.executable, *argv]
        self.proc = subprocess.Popen(
            wrap(cmd) if wrap else cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True,
            env=full_env, preexec_fn=lambda: os.sched_setaffinity(0, cpus),
        )  # fmt: skip
        self._ready: dict | None = None

    @property
    def ready(self) -> dict:
        """What the worker reported once set up (`{"resources": [...]}`); waits for it.

        Starting several sides first and reading `ready` afterwards lets them set up in parallel.
        """
        if self._ready is None:
            self._ready = self._read()
        return self._ready

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(timeout=30)
            raise SystemExit(
                f"side {self.name} exited with code {self.proc.returncode}; log {self.log_path}:\n{self.log_tail()}"
            )
        return json.loads(line)

    def run(self, **request: Any) -> dict:
        """One timed run; returns the worker's result."""
        self.ready  # noqa: B018  (the set-up line comes first)
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def log_tail(self, n: int = 3000) -> str:
        self._log.flush()
        with open(self.log_path, errors="replace") as f:
            return f.read()[-n:]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()  # the worker's loop ends on EOF and cleans up
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()

    def __enter__(self) -> SideProcess:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def run_paired(plan: dict[str, tuple[SideProcess, dict]], repeats: int) -> dict[str, list[dict]]:
    """`repeats` rounds of one run per entry of `plan` (name -> (side, request)), in
    alternating order; prints each run's wall time (the result's "wall") with the load."""
    runs: dict[str, list[dict]] = {name: [] for name in plan}
    for i in range(repeats):
        for name in order(i, list(plan)):
            side, request = plan[name]
            runs[name].append(side.run(**request))
            print(f"repeat {i}: {name:<12} {runs[name][-1]['wall']:7.2f} s  ({load_line()})", flush=True)
    return runs


def serve_runs(
    setup: Callable[[], Any], run: Callable[[Any, dict], dict], teardown: Callable[[Any], None] | None = None
) -> None:
    """Worker side of `SideProcess`: `state = setup()`, then `run(state, request)` per stdin line.

    The first line written is {"resources": [...]} describing this process tree once set up.
    """
    results = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # library prints go to the log, not into the result channel
    sys.stdout = sys.stderr
    state = setup()
    try:
        results.write(json.dumps({"resources": process_tree(os.getpid())}) + "\n")
        results.flush()
        for line in sys.stdin:
            out = run(state, json.loads(line))
            results.write(json.dumps(out) + "\n")
            results.flush()
    finally:
        if teardown is not None:
            teardown(state)
