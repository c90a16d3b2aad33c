"""Training tokens/s with packed sequences vs a padded batch, on a length-skewed batch.

    python benchmarks/train_packing.py                  # tiny Qwen2 built on the spot, 2 threads
    python benchmarks/train_packing.py --model-path DIR --seqs 32 --long-len 1024

Both sides run in this process on the same FSDPEngine (same weights, same optimizer, same
loss: mean token NLL on the response tokens), alternating steps so machine noise hits both:
- packed: `engine.train_batch`, one row of real tokens with per-sequence attention,
  micro-batches by `--max-tokens-per-mb`;
- padded: the classic `[B, T]` forward with an attention mask, padded to the longest
  sequence, then the same backward and optimizer step.
Throughput counts real (non-pad) tokens only. Prints best and median step times and ends
with `packed_speedup=<x>` (best padded time / best packed time).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch

from arealite.algo.losses import token_mean
from arealite.config import MicroBatchSpec, OptimizerConfig, TrainEngineConfig
from arealite.train.engine import FSDPEngine
from arealite.train.logprobs import packed_token_logprobs


def skewed_batch(seqs: int, short_len: int, long_len: int, n_long: int, vocab: int, seed: int = 0) -> dict:
    """Most rows short, `n_long` rows long: the shape of RL rollouts with a few long answers."""
    g = torch.Generator().manual_seed(seed)
    lens = [long_len if i < n_long else int(torch.randint(short_len // 2, short_len + 1, (1,), generator=g)) for i in range(seqs)]
    T = max(lens)
    am = (torch.arange(T)[None] < torch.tensor(lens)[:, None]).long()
    ids = torch.randint(1, vocab, (seqs, T), generator=g) * am
    lm = am.clone()
    lm[:, :8] = 0
    return {"input_ids": ids, "attention_mask": am, "loss_mask": lm}


def _nll(logits, mb):
    lp = packed_token_logprobs(logits, mb["input_ids"], mb["cu_seqlens"])
    return token_mean(-lp, mb["loss_mask"].bool(), mb["cu_seqlens"]), {}


def packed_step(engine: FSDPEngine, batch: dict) -> None:
    engine.train_batch(batch, _nll, lambda mb: float(mb["loss_mask"].sum()))


def padded_step(engine: FSDPEngine, batch: dict) -> None:
    """One optimizer step on the padded [B, T] batch (the baseline packing replaces)."""
    engine.model.train()
    engine.optimizer.zero_grad(set_to_none=True)
    logits = engine.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False).logits
    lp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, batch["input_ids"][:, 1:, None]).squeeze(-1)
    mask = batch["loss_mask"][:, 1:].float()
    ((-lp * mask).sum() / mask.sum()).backward()
    torch.nn.utils.clip_grad_norm_(list(engine.model.parameters()), 1.0)
    engine.optimizer.step()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-path", default=None, help="HF model folder; default: a tiny Qwen2 (4 layers, hidden 128)")
    p.add_argument("--seqs", type=int, default=16)
    p.add_argument("--short-len", type=int, default=64)
    p.add_argument("--long-len", type=int, default=512)
    p.add_argument("--n-long", type=int, default=2)
    p.add_argument("--max-tokens-per-mb", type=int, default=2048)
    p.add_argument("--steps", type=int, default=4, help="timed steps per side (after one warm-up each)")
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    path = a.model_path
    if path is None:
        from arealite.tools.tiny_model import build_tiny_model

        path = build_tiny_model(os.path.join(tempfile.mkdtemp(), "m"), layers=4, hidden=128, intermediate=256)
    cfg = TrainEngineConfig(path=path, optimizer=OptimizerConfig(lr=1e-5),
                            mb_spec=MicroBatchSpec(max_tokens_per_mb=a.max_tokens_per_mb))  # fmt: skip
    engine = FSDPEngine(cfg).initialize()
    batch = skewed_batch(a.seqs, a.short_len, a.long_len, a.n_long, engine.hf_config.vocab_size - 10)
    real = int(batch["attention_mask"].sum())
    B, T = batch["input_ids"].shape
    print(f"batch: {B} sequences, {real} real tokens, padded to {B}x{T}={B * T} ({B * T / real:.2f}x)")
    times: dict[str, list[float]] = {"packed": [], "padded": []}
    steps = {"packed": packed_step, "padded": padded_step}
    for i in range(a.steps + 1):
        for name in ("packed", "padded") if i % 2 == 0 else ("padded", "packed"):
            t0 = time.perf_counter()
            steps[name](engine, batch)
            if i > 0:  # the first round warms up allocators and kernels
                times[name].append(time.perf_counter() - t0)
    for name, ts in times.items():
        best, med = min(ts), statistics.median(ts)
        print(f"{name:>6}: best {best:.3f} s/step ({real / best:,.0f} tokens/s), median {med:.3f} s/step")
    print(f"packed_speedup={min(times['padded']) / min(times['packed']):.2f}")


if __name__ == "__main__":
    main()
