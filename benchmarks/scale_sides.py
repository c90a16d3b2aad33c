"""The processes benchmarks/scale.py starts (it runs this file; a person never does).

- `--tcp-recv PORT` / `--tcp-send ADDR PORT BYTES`: the link floor, a timed transfer of a
  large buffer over plain TCP sockets (the sender prints the seconds);
- `--worker server|trainer`: (a)'s two sides, one in each simulated host, as
  `harness.serve_runs` workers: a built-in server (`launch_server_process`), and a trainer
  (FSDPEngine, RemoteSGLangEngine, a disk and a distributed WeightSync) that times one
  `sync` per request;
- `--memory-rank`: one rank of (b), which prints its peak RSS over one optimizer step.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness

CHUNK = 4 << 20  # socket read/write size of the link measurement


# ---- the link floor ------------------------------------------------------------------------


def tcp_receive(port: int) -> None:
    """Accept one connection, read it to EOF, answer the byte count (the sender's clock stops)."""
    with socket.create_server(("", port)) as server:
        conn, _ = server.accept()
        with conn:
            buf, total = bytearray(CHUNK), 0
            while n := conn.recv_into(buf):
                total += n
            conn.sendall(total.to_bytes(8, "big"))


def tcp_send(address: str, port: int, nbytes: int) -> None:
    """Print the seconds from connect to the receiver's answer for `nbytes` bytes."""
    payload = memoryview(bytearray(os.urandom(1024)) * (CHUNK // 1024))
    deadline = time.monotonic() + 30
    while True:  # the receiver may still be starting
        try:
            conn = socket.create_connection((address, port), timeout=60)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    with conn:
        start = time.perf_counter()
        for sent in range(0, nbytes, CHUNK):
            conn.sendall(payload[: min(CHUNK, nbytes - sent)])
        conn.shutdown(socket.SHUT_WR)
        received = int.from_bytes(conn.recv(8), "big")
        seconds = time.perf_counter() - start
    if received != nbytes:
        raise SystemExit(f"the receiver got {received} bytes of {nbytes}")
    print(seconds)


# ---- (a) weight sync: the two sides, each in its own host -------------------------------------


def server_setup(args: argparse.Namespace):
    from arealite.server.process import launch_server_process

    log = os.path.join(args.run_dir, "server.log")
    return launch_server_process(
        args.model_path, port=int(args.port), host=args.host, extra_args=["--skip-server-warmup"],  # it never generates
        env=harness.CPU_ONLY, log_path=log, timeout=600,
    )  # fmt: skip


def trainer_setup(args: argparse.Namespace) -> dict:
    """The trainer side: an engine without optimizer (a sync moves weights only), a rollout
    client of the server, a disk and a distributed WeightSync."""
    from arealite.config import InferenceEngineConfig, TrainEngineConfig
    from arealite.rollout import RemoteSGLangEngine
    from arealite.train.engine import FSDPEngine
    from arealite.weight_sync import WeightSync

    actor = FSDPEngine(TrainEngineConfig(path=args.model_path, optimizer=None)).initialize()
    rollout = RemoteSGLangEngine(InferenceEngineConfig(setup_timeout=600, weight_update_timeout=600), [args.server])
    rollout.initialize()
    syncs = {
        "disk": WeightSync(actor, rollout, "disk", run_dir=args.run_dir, keep_versions=1),
        "distributed": WeightSync(actor, rollout, "distributed", backend="gloo"),
    }
    return {"actor": actor, "rollout": rollout, "syncs": syncs, "version": 0}


def trainer_run(state: dict, request: dict) -> dict:
    state["version"] += 1
    start = time.perf_counter()
    state["syncs"][request["mode"]].sync(state["version"])
    return {"wall": time.perf_counter() - start}


def trainer_teardown(state: dict) -> None:
    for sync in state["syncs"].values():
        sync.close()
    state["rollout"].destroy()
    state["actor"].destroy()


def worker(args: argparse.Namespace) -> None:
    if args.worker == "server":
        harness.serve_runs(lambda: server_setup(args), lambda s, r: {}, lambda s: s.stop())
    else:
        harness.serve_runs(lambda: trainer_setup(args), trainer_run, trainer_teardown)


# ---- (b) one rank of the memory measurement ---------------------------------------------------


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return int(re.search(rf"^{field}:\s+(\d+)", f.read(), re.M).group(1))


def memory_rank(args: argparse.Namespace) -> None:
    """One rank of (b): build the engine, reset the peak, one optimizer step, print the peak."""
    import torch

    from arealite.algo.losses import token_mean
    from arealite.config import OptimizerConfig, TrainEngineConfig
    from arealite.train.engine import FSDPEngine
    from arealite.train.logprobs import packed_token_logprobs

    torch.set_num_threads(1)
    runtime = _status_kib("VmRSS")
    engine = FSDPEngine(TrainEngineConfig(path=args.model_path, optimizer=OptimizerConfig(lr=1e-5))).initialize()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    seqs = max(1, args.seqs // world)  # the same global batch at any rank count
    ids = torch.randint(
        1, engine.hf_config.vocab_size, (seqs, args.seq_len), generator=torch.Generator().manual_seed(1)
    )
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": torch.ones_like(ids)}

    def nll(logits, mb):
        lp = packed_token_logprobs(logits, mb["input_ids"], mb["cu_seqlens"])
        return token_mean(-lp, mb["loss_mask"].bool(), mb["cu_seqlens"]), {}

    built = _status_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS: the peak below is the step's
    engine.train_batch(batch, nll, lambda mb: float(mb["loss_mask"].sum()))
    peak = _status_kib("VmHWM")

    def local_bytes(ts):
        return sum((t.to_local() if hasattr(t, "to_local") else t).nbytes for t in ts)

    params = list(engine.model.parameters())
    adam = [v for s in engine.optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    state_bytes = 2 * local_bytes(params) + local_bytes(adam)  # + gradients: the parameters' sharded shape
    engine.destroy()
    kib = 1024
    print(json.dumps({"runtime": runtime * kib, "built": built * kib, "peak": peak * kib, "state": state_bytes}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tcp-recv", type=int)
    p.add_argument("--tcp-send", nargs=3)
    p.add_argument("--worker", choices=["server", "trainer"])
    p.add_argument("--memory-rank", action="store_true")
    p.add_argument("--seqs", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=64)
    for flag in ("--model-path", "--run-dir", "--host", "--port", "--server"):
        p.add_argument(flag)
    args = p.parse_args()
    if args.tcp_recv is not None:
        tcp_receive(args.tcp_recv)
    elif args.tcp_send:
        tcp_send(args.tcp_send[0], int(args.tcp_send[1]), int(args.tcp_send[2]))
    elif args.worker:
        worker(args)
    elif args.memory_rank:
        memory_rank(args)
    else:
        p.error("scale_sides.py runs as a process of benchmarks/scale.py; run that instead")


if __name__ == "__main__":
    main()
