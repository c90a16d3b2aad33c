"""Batches and engines shared by the training tests."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from arealite.algo.truncation import Truncation, kept_set
from arealite.utils.net import free_ports
from tests.devices import train_device_env

REPO_ROOT = Path(__file__).resolve().parents[2]


def plain_next_token_logprobs(x: torch.Tensor, nxt: torch.Tensor, truncation: Truncation | None) -> torch.Tensor:
    """log p(nxt[t]) from rows x [n, V] (logits already / T) written plainly, through autograd: the
    reference the trainer's fused and chunked paths are held to. With a truncation, the
    log-normaliser runs over the kept set of arealite/algo/truncation.py, the target always kept."""
    if truncation is None:
        return torch.log_softmax(x, -1).gather(-1, nxt[:, None]).squeeze(-1)
    keep = kept_set(x, truncation, nxt)
    return x.gather(-1, nxt[:, None]).squeeze(-1) - torch.logsumexp(x.masked_fill(~keep, float("-inf")), -1)


def token_aligned(values: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Row values [N - 1] moved to the token each row predicts ([N]); 0 at each sequence's first token."""
    return torch.cat([values.new_zeros(1), values]).index_fill(0, cu_seqlens[:-1].long(), 0.0)


def make_batch(lens: list[int], prompt_len: int = 3, group_size: int = 2, seed: int = 0, vocab: int = 500) -> dict:
    """A right-padded trajectory batch with random tokens, rewards and behaviour logprobs."""
    g = torch.Generator().manual_seed(seed)
    B, T = len(lens), max(lens)
    lens_t = torch.tensor(lens)
    am = (torch.arange(T)[None] < lens_t[:, None]).long()
    ids = torch.randint(1, vocab, (B, T), generator=g) * am
    lm = am.clone()
    lm[:, :prompt_len] = 0
    rewards = torch.randint(0, 2, (B,), generator=g).float()
    logprobs = (-torch.rand(B, T, generator=g) * 3) * lm
    versions = torch.where(lm.bool(), 0, -1)
    return {"input_ids": ids, "attention_mask": am, "loss_mask": lm, "logprobs": logprobs, "versions": versions,
            "rewards": rewards}  # fmt: skip


def subprocess_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TRANSFORMERS_VERBOSITY="error", HF_HUB_OFFLINE="1")
    env.update(extra)
    return env


PYTHON = sys.executable


def run_ranks(world_size: int, args: list[str], timeout: float = 240.0) -> None:
    """Run tests/train/dist_worker.py as `world_size` trainer ranks (torchrun's env): one GPU
    each when there are enough, else on the CPU with gloo.

    Fails with every rank's output tail if a rank exits non-zero or time runs out; never
    leaves a rank behind.
    """
    import subprocess
    import tempfile
    import time

    port = free_ports(1)[0]
    worker = str(Path(__file__).with_name("dist_worker.py"))
    procs, logs = [], []
    try:
        for rank in range(world_size):
            env = subprocess_env(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
                                 LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                                 **train_device_env(world_size))  # fmt: skip
            log = tempfile.TemporaryFile()
            logs.append(log)
            procs.append(subprocess.Popen([PYTHON, worker, *args], env=env, stdout=log, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + timeout
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            if any(p.poll() not in (None, 0) for p in procs):
                break  # one rank failed: the others would wait for it forever
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    if any(p.returncode != 0 for p in procs):
        tails = []
        for rank, log in enumerate(logs):
            log.seek(0)
            tails.append(
                f"--- rank {rank} (rc {procs[rank].returncode}) ---\n{log.read().decode(errors='replace')[-3000:]}"
            )
        raise AssertionError("trainer ranks failed:\n" + "\n".join(tails))
