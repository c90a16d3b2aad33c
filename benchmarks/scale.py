"""Cost curves: how weight sync, trainer memory and the rollout client scale.

    PYTHONPATH=. python benchmarks/scale.py [--out runs/scale] [--repeats 3] [--parts abc] [--smoke]

(a) Weight-sync seconds per GB, disk and distributed, across hosts: the trainer side (an
    FSDPEngine in a world of one, a RemoteSGLangEngine, two WeightSyncs) in one simulated
    host, a built-in server (`launch_server_process`) in another (tests/multinode/netns.py:
    network namespaces on a private bridge; needs root), for Qwen2 models of ~10M to ~315M
    parameters. The floor is the link: a timed TCP transfer of 1 GiB between the same two
    hosts with plain sockets, run in every repeat beside the two syncs (alternating order).
    `weight_sync_vs_floor` = the median over repeats of the distributed sync's seconds per GB
    over the same repeat's link seconds per GB, largest model (goal <= 3); the disk sync's
    is printed beside it (its bytes never cross the link: the hosts share one file system).
(b) Trainer memory per rank at 1 and 2 ranks (gloo) for the largest model: peak RSS over one
    real optimizer step (AdamW) of arealite's FSDP2 engine, the peak reset once the engine
    is built. `fsdp_mem_2ranks_vs_1` = the larger rank's peak at 2 ranks over the peak at 1
    (goal <= 0.6: parameters, gradients and Adam state sharded).
(c) Client CPU per trajectory at 256, 1,024 and 4,096 requests in flight across 4 stub
    servers (benchmarks/rollout_overhead.py's stub, holding each request `stub_hold(n)`
    seconds: long enough for the client to put all n requests of a round in flight at once).
    `client_cpu_flatness` = the CPU per trajectory at the most in flight over that at the
    fewest (goal: flat, 1.0).
The processes it starts (link ends, sync sides, memory ranks) are in scale_sides.py.
Writes one plot per part to `--out`. Without root (or `ip netns`), (a) runs both sides on
loopback and says so. The last line is `weight_sync_vs_floor=<x>`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness

SIDES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scale_sides.py")  # the processes it starts

# (a)'s models: Qwen2 shapes from ~10M to ~315M parameters (vocabulary 512, fp32)
SIZES = [
    dict(layers=3, hidden=512, heads=8, kv_heads=4, intermediate=1536),
    dict(layers=3, hidden=768, heads=12, kv_heads=4, intermediate=3072),
    dict(layers=6, hidden=1024, heads=16, kv_heads=8, intermediate=4096),
    dict(layers=20, hidden=1024, heads=16, kv_heads=8, intermediate=4096),
]
SMOKE_SIZES = [dict(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128)]
LEVELS, SMOKE_LEVELS = (256, 1024, 4096), (16, 64)
STUBS = 4
HOLD_PER_REQUEST_S = 0.0025  # longer than the client's CPU per request on a busy core, so a whole round is in flight


def stub_hold(in_flight: int) -> float:
    """Seconds a stub holds each request at `in_flight` requests: all of a round overlap."""
    return max(0.25, in_flight * HOLD_PER_REQUEST_S)


SERVER_PORT, LINK_PORT = 30000, 30001  # each simulated host has its own ports: fixed ones are free there


def free_port(hosts, fixed: int) -> int:
    """A port to listen on: `fixed` in a simulated host, a free one on the shared loopback."""
    from arealite.utils.net import free_ports

    return fixed if hosts else free_ports(1)[0]


# ---- the link floor --------------------------------------------------------------------------


class LinkSide:
    """The floor as a side of `harness.run_paired`: one timed TCP transfer of `nbytes` from
    hosts[0] to hosts[1] (loopback when `hosts` is None) per run, by two plain processes."""

    def __init__(self, hosts, nbytes: int) -> None:
        self.hosts, self.nbytes = hosts, nbytes

    def run(self) -> dict:
        hosts, script, port = self.hosts, SIDES, str(free_port(self.hosts, LINK_PORT))
        recv = [sys.executable, script, "--tcp-recv", port]
        send = [sys.executable, script, "--tcp-send", hosts[1].addr if hosts else "127.0.0.1", port, str(self.nbytes)]
        receiver = subprocess.Popen(hosts[1].wrap(recv) if hosts else recv)
        done = subprocess.run(hosts[0].wrap(send) if hosts else send, capture_output=True, text=True, timeout=300)
        receiver.wait(timeout=60)
        if done.returncode != 0:
            raise SystemExit(f"the link measurement failed: {done.stderr[-2000:]}")
        return {"wall": float(done.stdout.split()[-1])}


# ---- (a) weight sync across hosts -------------------------------------------------------------


def sync_curve_point(model: str, hosts, link: LinkSide, repeats: int, logs: str) -> dict[str, list[float]]:
    """Seconds per sync, disk and distributed, and per link transfer: `repeats` paired runs."""
    cpus = set(os.sched_getaffinity(0))
    server_host, port = hosts[1].addr if hosts else "127.0.0.1", str(free_port(hosts, SERVER_PORT))
    trainer_host = hosts[0].addr if hosts else "127.0.0.1"
    run_dir = tempfile.mkdtemp(prefix="scale_sync_", dir=logs)
    script = SIDES
    common = ["--model-path", model, "--run-dir", run_dir]
    server = harness.SideProcess(
        "server", [script, "--worker", "server", "--host", server_host, "--port", port, *common], cpus,
        os.path.join(logs, "sync_server.log"), env=harness.CPU_ONLY, wrap=hosts[1].wrap if hosts else None,
    )  # fmt: skip
    try:  # the trainer starts beside the server: its rollout client waits for /health
        trainer = harness.SideProcess(
            "trainer", [script, "--worker", "trainer", "--server", f"{server_host}:{port}", *common], cpus,
            os.path.join(logs, "sync_trainer.log"), env={**harness.CPU_ONLY, "MASTER_ADDR": trainer_host},
            wrap=hosts[0].wrap if hosts else None,
        )  # fmt: skip
        with trainer:
            print("  server:", *server.ready["resources"], sep="\n    ")
            print("  trainer:", *trainer.ready["resources"], sep="\n    ")
            plan = {mode: (trainer, {"mode": mode}) for mode in ("distributed", "disk")}
            plan["link"] = (link, {})
            runs = harness.run_paired(plan, repeats)
    finally:
        server.close()
        subprocess.run(["rm", "-rf", run_dir], check=False)
    return {mode: [r["wall"] for r in rs] for mode, rs in runs.items()}


def parameter_count(path: str) -> int:
    """Parameters in an HF folder's safetensors files, read from their headers."""
    total = 0
    for name in sorted(os.listdir(path)):
        if name.endswith(".safetensors"):
            with open(os.path.join(path, name), "rb") as f:
                header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
            total += sum(math.prod(t["shape"]) for k, t in header.items() if k != "__metadata__")
    return total


def build_models(sizes: list[dict], folder: str) -> list[str]:
    """Each size as a model folder, by arealite's tiny-model builder in a process of its own
    (building a 300M-parameter model would leave its memory with this process)."""
    from arealite.launcher.process import with_package_path

    paths = []
    for i, shape in enumerate(sizes):
        paths.append(os.path.join(folder, f"m{i}"))
        flags = [f"--{k.replace('_', '-')}={v}" for k, v in shape.items()]
        cmd = [sys.executable, "-m", "arealite.tools.tiny_model", paths[-1], *flags]
        subprocess.run(cmd, check=True, capture_output=True, env=with_package_path(None))
    return paths


def weight_sync_part(args, hosts, models: list[tuple[str, int]], logs: str) -> dict:
    """(a): per model, paired repeats of a distributed sync, a disk sync and a link transfer;
    each sync's seconds per GB over the same repeat's link seconds per GB."""
    where = f"hosts {hosts[0].hostname} ({hosts[0].addr}) -> {hosts[1].hostname} ({hosts[1].addr})" if hosts else (
        "loopback (no network namespaces here)")  # fmt: skip
    link = LinkSide(hosts, args.link_mb << 20)
    link_gb = link.nbytes / 1e9
    print(f"(a) weight sync, {where}; the floor: {args.link_mb} MiB over TCP between the same hosts in every repeat")
    rows = []
    for path, n in models:
        gb = n * 4 / 1e9  # fp32 on the CPU
        print(f"  model {n / 1e6:.1f}M parameters ({gb:.3f} GB fp32), {args.repeats} paired repeats:")
        walls = sync_curve_point(path, hosts, link, args.repeats, logs)
        floor = [w / link_gb for w in walls["link"]]
        row = {"params": n, "gb": gb, "link": harness.quartiles(floor)[2]}
        print(f"  {'link':<12} s per GB: {harness.spread(floor, '.3f')} ({1 / row['link']:.2f} GB/s)")
        for mode in ("distributed", "disk"):
            per_gb = [w / gb for w in walls[mode]]
            row[mode] = harness.quartiles(per_gb)[2]
            row[f"{mode}_vs_floor"] = [x / f for x, f in zip(per_gb, floor)]
            print(f"  {mode:<12} s per GB: {harness.spread(per_gb, '.3f')}; "
                  f"vs the floor (paired): {harness.spread(row[f'{mode}_vs_floor'])}")  # fmt: skip
        rows.append(row)
    return {"where": where, "rows": rows}


# ---- (b) trainer memory per rank --------------------------------------------------------------


def start_memory_run(model: str, ranks: int, args: argparse.Namespace, logs: str) -> list:
    """Start the `ranks` processes of one run (plain processes with torchrun's variables)."""
    from arealite.utils.net import free_ports

    port, procs = free_ports(1)[0], []
    for rank in range(ranks):
        path = os.pathsep.join(p for p in (harness.REPO, os.environ.get("PYTHONPATH")) if p)
        env = {**os.environ, **harness.CPU_ONLY, "RANK": str(rank), "LOCAL_RANK": str(rank),
               "WORLD_SIZE": str(ranks), "LOCAL_WORLD_SIZE": str(ranks), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1", "TRANSFORMERS_VERBOSITY": "error",
               "PYTHONPATH": path}  # fmt: skip
        cmd = [sys.executable, SIDES, "--memory-rank", "--model-path", model,
               "--seqs", str(args.seqs), "--seq-len", str(args.seq_len)]  # fmt: skip
        log = open(os.path.join(logs, f"memory_{ranks}ranks_rank{rank}.log"), "w")
        procs.append((subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=log, text=True), log))
    return procs


def finish_memory_run(procs: list) -> list[dict]:
    """Every rank's figures, once the run is over."""
    out = []
    for proc, log in procs:
        stdout, _ = proc.communicate(timeout=1800)
        log.close()
        if proc.returncode != 0:
            raise SystemExit(
                f"a memory rank exited {proc.returncode} (-9: killed, likely out of memory); see {log.name}"
            )
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def memory_report(args, n: int, result: dict[int, list[dict]]) -> dict:
    print(f"(b) trainer memory per rank, {n / 1e6:.1f}M parameters, one AdamW step on {args.seqs} x {args.seq_len} "
          "tokens (split over the ranks), gloo, 1 torch thread per rank:")  # fmt: skip
    mib = 1 << 20
    for ranks, per_rank in result.items():
        for i, r in enumerate(per_rank):
            print(f"  {ranks} rank(s), rank {i}: peak RSS {r['peak'] / mib:8.1f} MiB over the step (runtime before "
                  f"the engine {r['runtime'] / mib:.1f}, engine built {r['built'] / mib:.1f}); params + grads + "
                  f"Adam {r['state'] / mib:.1f} MiB")  # fmt: skip
    one, two = result[1][0], max(result[2], key=lambda r: r["peak"])
    print(f"  2 ranks vs 1, train state: {two['state'] / one['state']:.3f}; peak RSS less the runtime: "
          f"{(two['peak'] - two['runtime']) / (one['peak'] - one['runtime']):.3f}")  # fmt: skip
    return {"ranks": result, "ratio": two["peak"] / one["peak"]}


# ---- (c) client CPU per trajectory ------------------------------------------------------------


def stub_peak(address: str) -> int:
    with urllib.request.urlopen(f"http://{address}/stats", timeout=30) as r:
        return int(json.loads(r.read())["peak"])


def client_part(args, levels: tuple[int, ...]) -> dict:
    """Client CPU seconds per trajectory at each level of requests in flight, paired repeats;
    each level has its own client and its own 4 stubs (set up once, reused in every repeat)."""
    from rollout_overhead import bench_workflow, records, start_stub, stop

    from arealite.config import InferenceEngineConfig
    from arealite.rollout import RemoteSGLangEngine

    workflow, _ = bench_workflow(1, 16, 1.0)
    stubs = {n: [start_stub(stub_hold(n)) for _ in range(STUBS)] for n in levels}
    engines, per_run = {}, max(levels) * args.client_rounds  # trajectories per timed run at every level
    try:
        for n in levels:
            # a stub answering thousands of requests on a busy core may be slow to answer /health: not a failure here
            config = InferenceEngineConfig(
                max_concurrent_rollouts=n, max_head_offpolicyness=10**6, health_check_timeout=120.0
            )
            engines[n] = RemoteSGLangEngine(config, [address for _, address in stubs[n]])
            engines[n].initialize()
            engines[n].rollout_batch(records(n), workflow)  # warm up: every connection open
        cpu: dict[int, list[float]] = {n: [] for n in levels}
        for i in range(args.repeats):
            for n in harness.order(i, levels):
                start = time.process_time()
                for _ in range(per_run // n):
                    engines[n].rollout_batch(records(n), workflow)
                cpu[n].append((time.process_time() - start) / per_run)
        peaks = {n: sum(stub_peak(address) for _, address in stubs[n]) for n in levels}
    finally:
        for engine in engines.values():
            engine.destroy()
        for proc, _ in (stub for group in stubs.values() for stub in group):
            stop(proc)
    print(f"(c) client CPU per trajectory, {STUBS} stub servers per level, {per_run} trajectories per timed run, "
          f"{args.repeats} repeats in alternating order:")  # fmt: skip
    for n in levels:
        stats = ", ".join(f"{k} {v}" for k, v in engines[n].stats.items())
        print(f"  {n:>5} in flight (stubs hold {stub_hold(n):.2f} s, peak {peaks[n]} at once): ms "
              f"{harness.spread([c * 1e3 for c in cpu[n]], '.3f')}; client: {stats}")  # fmt: skip
    med = {n: harness.quartiles(cpu[n])[2] for n in levels}
    flatness = med[max(levels)] / med[min(levels)]
    return {"levels": list(levels), "ms": [med[n] * 1e3 for n in levels], "flatness": flatness}


# ---- plots and main ---------------------------------------------------------------------------


def plot(out: str, sync: dict | None, memory: dict | None, client: dict | None) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []

    def save(fig, name: str) -> None:
        fig.tight_layout()
        fig.savefig(os.path.join(out, name), dpi=120)
        plt.close(fig)
        written.append(os.path.join(out, name))

    if sync:
        fig, ax = plt.subplots(figsize=(6, 4))
        x = [r["params"] / 1e6 for r in sync["rows"]]
        for mode in ("distributed", "disk"):
            ax.plot(x, [r[mode] for r in sync["rows"]], "o-", label=mode)
        ax.plot(x, [r["link"] for r in sync["rows"]], "k--", label="link floor (TCP)")
        ax.set(
            xscale="log",
            xlabel="parameters (M)",
            ylabel="seconds per GB (fp32)",
            title=f"weight sync, {sync['where']}"[:70],
        )
        ax.legend()
        save(fig, "weight_sync.png")
    if memory:
        fig, ax = plt.subplots(figsize=(6, 4))
        labels, peaks, states = [], [], []
        for ranks, rs in memory["ranks"].items():
            for i, r in enumerate(rs):
                labels.append(f"{ranks} rank(s)\nrank {i}")
                peaks.append(r["peak"] / 2**30)
                states.append(r["state"] / 2**30)
        ax.bar(labels, peaks, label="peak RSS over the step")
        ax.bar(labels, states, width=0.4, label="params + grads + Adam")
        ax.set(ylabel="GiB", title="trainer memory per rank (FSDP2, gloo)")
        ax.legend()
        save(fig, "fsdp_memory.png")
    if client:
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(client["levels"], client["ms"], "o-")
        ax.set_xticks(client["levels"], [f"{n:,}" for n in client["levels"]])
        ax.minorticks_off()
        ax.set(xscale="log", ylim=(0, max(client["ms"]) * 1.3), xlabel="requests in flight (4 servers)",
               ylabel="client CPU ms per trajectory", title="rollout client CPU")  # fmt: skip
        save(fig, "client_cpu.png")
    return written


def hosts_or_none():
    """A two-host network when namespaces work here, else None (with the reason printed)."""
    sys.path.insert(0, harness.REPO)
    from tests.multinode import netns

    reason = netns.unavailable_reason()
    if reason:
        print(f"network namespaces unavailable ({reason}): weight sync over loopback")
        return None
    netns.remove_leftovers()  # of a run that was SIGKILLed
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds through the `finally` that removes them
    return netns.Network(2).create()


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.path.join(harness.REPO, "runs", "scale"), help="plots and logs")
    p.add_argument("--repeats", type=int, default=3, help="paired repeats of every timed figure")
    p.add_argument("--parts", default="abc", help="which of (a) weight sync, (b) memory, (c) client to run")
    p.add_argument("--link-mb", type=int, default=1024, help="MiB sent in the link measurement")
    p.add_argument("--seqs", type=int, default=4, help="(b): sequences per optimizer step (over all ranks)")
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--client-rounds", type=int, default=1, help="(c): rounds of the largest level per timed run")
    p.add_argument("--smoke", action="store_true", help="seconds: the smallest model, few requests, one repeat")
    p.add_argument("--model-path", help="measure this HF model folder only (default: build the sizes of SIZES)")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    if args.smoke:
        args.repeats, args.link_mb, args.seq_len, args.client_rounds = 1, 64, 16, 1
    logs = os.path.join(args.out, "logs")
    os.makedirs(logs, exist_ok=True)
    print(harness.machine_line())
    print(harness.commit_line())
    print(harness.load_line())
    sync = memory = client = None
    with tempfile.TemporaryDirectory(prefix="scale_models_") as folder:
        paths = [args.model_path] if args.model_path else build_models(SMOKE_SIZES if args.smoke else SIZES, folder)
        models = [(path, parameter_count(path)) for path in paths]
        print("models:", ", ".join(f"{n / 1e6:.1f}M" for _, n in models), "parameters")
        # (b) one run at a time in the full run (the 1-rank run alone takes ~6 GB of a shared machine), alone;
        # in the smoke run both start at once and overlap the rest (only seconds matter there)
        pending = {}
        if "b" in args.parts and args.smoke:
            pending = {ranks: start_memory_run(models[-1][0], ranks, args, logs) for ranks in (1, 2)}
        elif "b" in args.parts:
            result = {ranks: finish_memory_run(start_memory_run(models[-1][0], ranks, args, logs)) for ranks in (1, 2)}
            memory = memory_report(args, models[-1][1], result)
            print(harness.load_line())
        if "c" in args.parts:
            client = client_part(args, SMOKE_LEVELS if args.smoke else LEVELS)
            print(harness.load_line())
        if "a" in args.parts:
            network = hosts_or_none()
            try:
                sync = weight_sync_part(args, network.hosts if network else None, models, logs)
            finally:
                if network:
                    network.close()
            print(harness.load_line())
        if pending:
            memory = memory_report(args, models[-1][1], {r: finish_memory_run(p) for r, p in pending.items()})
    print("plots:", *plot(args.out, sync, memory, client))
    if client:
        print(f"client_cpu_flatness={client['flatness']:.3f}")
    if memory:
        print(f"fsdp_mem_2ranks_vs_1={memory['ratio']:.3f}")
    if sync:
        last = sync["rows"][-1]
        print(f"disk_sync_vs_floor={harness.quartiles(last['disk_vs_floor'])[2]:.2f}")
        print(f"weight_sync_vs_floor={harness.quartiles(last['distributed_vs_floor'])[2]:.2f}")


if __name__ == "__main__":
    main()
