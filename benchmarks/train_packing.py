"""Training tokens/s with packed sequences vs a padded batch, on a length-skewed batch.

    PYTHONPATH=. python benchmarks/train_packing.py                  # tiny Qwen2 built on the spot
    PYTHONPATH=. python benchmarks/train_packing.py --model-path DIR --seqs 32 --long-len 1024 [--repeats 7]

Two FSDPEngines in this process, loaded from the same weights with the same optimizer
(AdamW, lr 1e-5, clipping 1.0) and the same loss (mean token NLL on the response tokens),
on the same device with the same dtype policy (fp32 on CPU; bf16 compute, fp32 master
weights on CUDA) and the same torch threads; they differ only in how the batch reaches
the model:
- packed: `engine.train_batch`, the library's path: one row of real tokens per
  micro-batch (`--max-tokens-per-mb`), attention confined per sequence (flash-attn when
  installed on CUDA, else arealite's varlen sdpa);
- padded: the classic `[B, T]` forward with an attention mask (transformers' sdpa),
  padded to the longest sequence, then the same backward, clipping and optimizer step.

Each repeat times one step of each side, alternating which goes first (after one untimed
warm-up step each). Throughput counts real (non-pad) tokens only. Prints every repeat,
the spread (min/IQR/median/max) of each side's step time and of the paired ratios, and
ends with `packed_speedup=<median over repeats of padded time / packed time>`.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness

from arealite.algo.losses import token_mean
from arealite.config import MicroBatchSpec, OptimizerConfig, TrainEngineConfig
from arealite.train.engine import FSDPEngine, load_causal_lm
from arealite.train.logprobs import packed_token_logprobs


def skewed_batch(seqs: int, short_len: int, long_len: int, n_long: int, vocab: int, seed: int = 0) -> dict:
    """Most rows short, `n_long` rows long: the shape of RL rollouts with a few long answers."""
    g = torch.Generator().manual_seed(seed)
    lens = [
        long_len if i < n_long else int(torch.randint(short_len // 2, short_len + 1, (1,), generator=g))
        for i in range(seqs)
    ]
    T = max(lens)
    am = (torch.arange(T)[None] < torch.tensor(lens)[:, None]).long()
    ids = torch.randint(1, vocab, (seqs, T), generator=g) * am
    lm = am.clone()
    lm[:, :8] = 0  # the prompt
    return {"input_ids": ids, "attention_mask": am, "loss_mask": lm}


def _nll(logits: torch.Tensor, mb: dict) -> tuple[torch.Tensor, dict]:
    lp = packed_token_logprobs(logits, mb["input_ids"], mb["cu_seqlens"])
    return token_mean(-lp, mb["loss_mask"].to(lp.device).bool(), mb["cu_seqlens"]), {}


def packed_step(engine: FSDPEngine, batch: dict) -> float:
    """One optimizer step through the library's packed path; returns the loss."""
    return float(engine.train_batch(batch, _nll, lambda mb: float(mb["loss_mask"].sum()))["loss"])


def padded_step(engine: FSDPEngine, batch: dict) -> float:
    """One optimizer step on the padded [B, T] batch (the baseline packing replaces); returns the loss."""
    engine.model.train()
    engine.optimizer.zero_grad(set_to_none=True)
    ids = batch["input_ids"].to(engine.device)
    logits = engine.model(
        input_ids=ids, attention_mask=batch["attention_mask"].to(engine.device), use_cache=False
    ).logits
    scaled = logits[:, :-1].float()  # [B, T-1, V]; position t predicts token t + 1
    lp = scaled.gather(-1, ids[:, 1:, None]).squeeze(-1) - torch.logsumexp(scaled, dim=-1)
    mask = batch["loss_mask"][:, 1:].to(lp.device).float()
    loss = (-lp * mask).sum() / mask.sum()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(list(engine.model.parameters()), 1.0)
    engine.optimizer.step()
    return float(loss.detach())


def timed(step, engine: FSDPEngine, batch: dict) -> tuple[float, float]:
    """(seconds, loss) of one step; waits for the device before reading either clock."""
    sync = torch.cuda.synchronize if engine.device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    loss = step(engine, batch)
    sync()
    return time.perf_counter() - start, loss


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-path", default=None, help="HF model folder; default: a tiny Qwen2 (4 layers, hidden 128)")
    p.add_argument("--seqs", type=int, default=16)
    p.add_argument("--short-len", type=int, default=64)
    p.add_argument("--long-len", type=int, default=512)
    p.add_argument("--n-long", type=int, default=2)
    p.add_argument("--max-tokens-per-mb", type=int, default=2048)
    p.add_argument(
        "--repeats", type=int, default=7, help="paired repeats (one step per side each, after one warm-up step each)"
    )
    # 1 by default: on a shared machine extra OpenMP threads mostly spin, on both sides alike
    p.add_argument("--threads", type=int, default=1, help="torch threads of both sides")
    p.add_argument(
        "--smoke", action="store_true", help="a few seconds: a small batch, 1 repeat (checks the script runs)"
    )
    a = p.parse_args()
    if a.smoke:
        a.seqs, a.short_len, a.long_len, a.repeats = 4, 16, 64, 1
    threads = a.threads
    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory(prefix="train_packing_") as tmp:
        path = a.model_path
        if path is None:
            from arealite.tools.tiny_model import build_tiny_model

            small = (
                dict(layers=2, hidden=64, intermediate=128) if a.smoke else dict(layers=4, hidden=128, intermediate=256)
            )
            path = build_tiny_model(os.path.join(tmp, "m"), **small)
        run(a, path, threads)


def run(a: argparse.Namespace, path: str, threads: int) -> None:
    def engine(build_model) -> FSDPEngine:
        cfg = TrainEngineConfig(path=path, optimizer=OptimizerConfig(lr=1e-5, gradient_clipping=1.0),
                                mb_spec=MicroBatchSpec(max_tokens_per_mb=a.max_tokens_per_mb))  # fmt: skip
        return FSDPEngine(cfg, build_model=build_model).initialize()

    engines = {"packed": engine(load_causal_lm), "padded": engine(lambda p, _attn: load_causal_lm(p, "sdpa"))}
    steps = {"packed": packed_step, "padded": padded_step}
    dev = engines["packed"].device
    batch = skewed_batch(a.seqs, a.short_len, a.long_len, a.n_long, engines["packed"].hf_config.vocab_size - 10)
    real = int(batch["attention_mask"].sum())
    B, T = batch["input_ids"].shape
    print(harness.machine_line())
    print(harness.commit_line())
    print(
        f"resources: one process, both sides on {dev} with {threads} torch thread(s), CPUs "
        f"{sorted(os.sched_getaffinity(0))}; packed attention: {engines['packed'].model.config._attn_implementation}, "
        f"padded: {engines['padded'].model.config._attn_implementation}, "
        f"compute dtype {engines['packed'].compute_dtype}"
    )
    print(
        f"batch: {B} sequences ({a.n_long} of {a.long_len} tokens, the rest {a.short_len // 2}-{a.short_len}), "
        f"{real} real tokens, padded to {B}x{T}={B * T} ({B * T / real:.2f}x); max_tokens_per_mb={a.max_tokens_per_mb}"
    )
    first = {name: timed(steps[name], engines[name], batch) for name in steps}  # warm-up, untimed
    print(
        f"warm-up step loss (same weights, same batch): packed {first['packed'][1]:.4f}, padded "
        f"{first['padded'][1]:.4f}"
    )
    times: dict[str, list[float]] = {"packed": [], "padded": []}
    print("repeat  side     s/step   tokens/s")
    for i in range(a.repeats):
        for name in harness.order(i, list(steps)):
            seconds, _ = timed(steps[name], engines[name], batch)
            times[name].append(seconds)
            print(f"{i:6d}  {name:<7} {seconds:7.3f} {real / seconds:10,.0f}")
    ratios = [pad / pack for pack, pad in zip(times["packed"], times["padded"])]
    for name, ts in times.items():
        print(f"{name:<7} s/step: {harness.spread(ts, '.3f')}")
    print(f"padded / packed step time: {harness.spread(ratios)}")
    print(harness.load_line())
    print(f"packed_speedup={harness.quartiles(ratios)[2]:.2f}")


if __name__ == "__main__":
    main()
