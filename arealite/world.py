"""The trainer's world of ranks: process-group setup from torchrun's environment, or one plain process.

`init_distributed()` is idempotent. Under torchrun (RANK/WORLD_SIZE/MASTER_ADDR set) it joins
the job with `env://`; in a plain `python` process or a notebook it creates a world of one
on an in-memory store, so the same training code runs unchanged. The backend is gloo on
CPU; on CUDA it is nccl for GPU tensors with gloo beside it for CPU tensors (object
collectives, metadata).

Device (`arealite.devices`): GPU LOCAL_RANK when CUDA is usable, else the CPU;
`AREALITE_TRAIN_DEVICE=cpu` forces the CPU. With more local ranks than visible GPUs,
`init_distributed` refuses naming both numbers.

A lost rank (hung, stopped, or its host gone silent) makes every other rank's collective time
out after `timeout` seconds. With more than one rank, `init_distributed` then names it: the
ranks whose collective timed out check in with rank 0 over a gloo group of their own within
`LOST_RANK_WINDOW` seconds, and each prints `lost trainer rank R (host H)` for every rank that
did not, before its traceback (`sys.excepthook`).

Deliberately absent: tensor/sequence parallelism and multi-dimensional meshes; arealite's
trainer is data-parallel FSDP2 only.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from datetime import timedelta
from types import TracebackType

import torch
import torch.distributed as dist

from arealite.devices import DEVICE_ENV, check_gpus_for_ranks, requested_train_device

_TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
LOST_RANK_WINDOW = 10.0  # seconds the ranks whose collective timed out have to check in with rank 0


def visible_gpu_count() -> int:
    """CUDA devices this process can use (0 without CUDA)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def device_type() -> str:
    """'cuda' or 'cpu': `$AREALITE_TRAIN_DEVICE` when set, else 'cuda' iff a GPU is visible."""
    requested = requested_train_device()
    if requested == "auto":
        return "cuda" if visible_gpu_count() > 0 else "cpu"
    if requested == "cuda" and visible_gpu_count() == 0:
        raise RuntimeError(f"{DEVICE_ENV}=cuda but no CUDA device is visible; unset it to train on the CPU")
    return requested


def default_backend() -> str:
    """`cpu:gloo,cuda:nccl` when training on CUDA, else `gloo`."""
    return "cpu:gloo,cuda:nccl" if device_type() == "cuda" else "gloo"


def init_distributed(backend: str | None = None, timeout: float = 1800.0) -> tuple[int, int]:
    """Join torchrun's job, or start a single-process world; returns (rank, world_size).

    A no-op when already initialized. `backend` defaults to `default_backend()`. On CUDA
    the current device is set to LOCAL_RANK before the group is created; with more local
    ranks than visible GPUs it raises RuntimeError naming both numbers.
    """
    if not dist.is_initialized():
        _init(backend, timeout)
    return rank(), world_size()


def _init(backend: str | None, timeout: float) -> None:
    backend = backend or default_backend()
    if device_type() == "cuda":
        local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", local_rank() + 1))
        check_gpus_for_ranks(max(local_ranks, local_rank() + 1), visible_gpu_count())
        torch.cuda.set_device(local_rank())
    if all(v in os.environ for v in _TORCHRUN_VARS):
        dist.init_process_group(backend, init_method="env://", timeout=timedelta(seconds=timeout))
        if dist.get_world_size() > 1:
            _watch_for_lost_ranks()
        return
    missing = [v for v in _TORCHRUN_VARS if v not in os.environ]
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise RuntimeError(
            f"WORLD_SIZE={os.environ['WORLD_SIZE']} but {missing} are unset; start the trainer with "
            "torchrun (or the arealite launchers), or unset WORLD_SIZE for a single process"
        )
    # A world of one needs no rendezvous: an in-process store avoids picking a port.
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=timeout))


def is_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if is_initialized() else 1


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def is_main() -> bool:
    return rank() == 0


def device() -> torch.device:
    """The device this rank computes on: its CUDA device, or the CPU (see `device_type`)."""
    if device_type() == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def barrier() -> None:
    if is_initialized() and world_size() > 1:
        dist.barrier()


def all_reduce(t: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """All-reduce `t` in place (sum | max | min) when there is more than one rank; returns `t`."""
    ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
    if op not in ops:
        raise ValueError(f"op={op!r} is not supported; use one of {list(ops)}")
    if is_initialized() and world_size() > 1:
        dist.all_reduce(t, op=ops[op])
    return t


def destroy_distributed() -> None:
    if is_initialized():
        dist.destroy_process_group()


class _LostRankWatch:
    """Names the ranks that stopped answering when a collective times out (see the module doc).

    The check-in goes through the job's rendezvous store (MASTER_ADDR:MASTER_PORT), not a
    process group: a gloo group closes every pair once one receive times out.
    """

    PREFIX = "arealite/lost_ranks/"

    def __init__(self) -> None:
        addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        window = timedelta(seconds=LOST_RANK_WINDOW)
        self.store = dist.TCPStore(addr, port, is_master=False, timeout=window)
        self.store.set(f"{self.PREFIX}host/{dist.get_rank()}", socket.gethostname())
        self.previous = sys.excepthook

    def lost_ranks(self) -> list[int]:
        """Check in; rank 0 waits up to the window for the others and tells them who did not."""
        me, n, p = dist.get_rank(), dist.get_world_size(), self.PREFIX
        try:
            if me == 0:
                deadline = time.monotonic() + LOST_RANK_WINDOW
                pending = [f"{p}alive/{r}" for r in range(1, n)]
                while pending and time.monotonic() < deadline:
                    pending = [k for k in pending if not self.store.check([k])]
                    time.sleep(0.05)
                lost = sorted(int(k.rpartition("/")[2]) for k in pending)
                self.store.set(f"{p}verdict", ",".join(map(str, lost)))
                return lost
            self.store.set(f"{p}alive/{me}", "1")
            self.store.wait([f"{p}verdict"], timedelta(seconds=LOST_RANK_WINDOW + 5.0))
            return [int(r) for r in self.store.get(f"{p}verdict").decode().split(",") if r]
        except (RuntimeError, dist.DistError):  # the store is gone or rank 0 never answered
            return [0] if me != 0 else []

    def host(self, rank: int) -> str:
        try:
            return self.store.get(f"{self.PREFIX}host/{rank}").decode()
        except (RuntimeError, dist.DistError):
            return "unknown"

    def __call__(self, kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        if isinstance(exc, RuntimeError) and "timed out" in str(exc).lower():
            for r in self.lost_ranks():
                print(
                    f"[arealite] lost trainer rank {r} (host {self.host(r)}): it did not reach the collective that "
                    f"timed out on rank {dist.get_rank()} (dist_timeout), nor check in within {LOST_RANK_WINDOW:.0f}s; "
                    "see that rank's log, its host, and whether it hung or was stopped",
                    file=sys.stderr,
                    flush=True,
                )
        self.previous(kind, exc, tb)


def _watch_for_lost_ranks() -> None:
    sys.excepthook = _LostRankWatch()
