"""Training step time with packed sequences vs the strongest padded practice, same token budget.

    PYTHONPATH=. python benchmarks/train_packing.py                  # tiny Qwen2 built on the spot
    PYTHONPATH=. python benchmarks/train_packing.py --lengths 512,512,64,40 [--repeats 7]
    PYTHONPATH=. python benchmarks/train_packing.py --lengths walk --seqs 128    # the reasoning job's answers
    PYTHONPATH=. python benchmarks/train_packing.py --lengths my_module:lengths   # any length source

Two FSDPEngines in this process, loaded from the same weights with the same optimizer
(AdamW, lr 1e-5, clipping 1.0) and the same loss (mean token NLL over every response token
of the batch), on the same device with the same dtype policy (fp32 on CPU; bf16 compute,
fp32 master weights on CUDA) and the same torch threads; they differ only in how the batch
reaches the model:
- packed: `engine.train_batch`, the library's path: micro-batches of whole sequences of at
  most `--max-tokens-per-mb` real tokens, each one packed row; attention confined per
  sequence (flash-attn on CUDA when installed, else arealite's varlen sdpa);
- bucketed (the baseline): what `group_by_length` does, the strongest padded practice: rows
  sorted by length, cut into micro-batches whose padded size (rows x longest row) fits the
  same token budget, each padded only to its own longest row; right padding with causal sdpa
  and no mask (a real token never sees a pad, so no mask is needed and none is paid for);
  one backward per micro-batch, each weighted by its share of the batch's loss tokens; its
  log-probs come from the packed side's function (each padded row a sequence), so the two
  sides differ in the layout only, not in the loss kernel.

Lengths: `--lengths` takes `skewed` (default: `--seqs` rows, `--n-long` of `--long-len`
tokens, the rest `--short-len`/2 to `--short-len`: RL rollouts with a few long answers),
`walk` (`--seqs` rows of the reasoning job's correct answers, drawn by
`arealite.data.walk.response_lengths` with the task settings of configs/tiny_cpu_reasoning.yaml),
a comma list of integers, or `module:function` (a function of the seed returning a list of
lengths), so the same comparison runs on another workload's lengths.

Each repeat times one step of each side, alternating which goes first (after one untimed
warm-up step each, whose losses are printed: equal, so both sides compute the same thing).
Prints every repeat, the spread (min/IQR/median/max) of each side's step time and of the
paired ratios, the padding share of each side, and ends with
`packed_speedup_vs_bucketed=<median over repeats of bucketed time / packed time>` (with
`--lengths walk` also under the name `packed_speedup_reasoning`).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import tempfile
import time
from collections.abc import Callable

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness

from arealite.algo.losses import token_mean
from arealite.config import MicroBatchSpec, OptimizerConfig, TrainEngineConfig
from arealite.data.packing import select
from arealite.train.engine import FSDPEngine, load_causal_lm
from arealite.train.logprobs import packed_token_logprobs

PROMPT = 8  # tokens at the start of every row outside the loss


def skewed_lengths(seqs: int, short_len: int, long_len: int, n_long: int, seed: int = 0) -> list[int]:
    """Most rows short, `n_long` rows long: the shape of RL rollouts with a few long answers."""
    g = torch.Generator().manual_seed(seed)
    short = torch.randint(short_len // 2, short_len + 1, (seqs,), generator=g).tolist()
    return [long_len if i < n_long else short[i] for i in range(seqs)]


def walk_lengths(seqs: int, seed: int = 0) -> list[int]:
    """Rows of the reasoning job: a prompt, then a correct answer of its long-tailed length."""
    from arealite.config import GRPOConfig, load_config
    from arealite.data.walk import response_lengths

    config = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs", "tiny_cpu_reasoning.yaml")
    task = load_config(["--config", config], GRPOConfig).train_dataset
    return [PROMPT + n for n in response_lengths(seqs, seed, task.median_steps, task.max_steps)]


def lengths_from(spec: str, a: argparse.Namespace) -> list[int]:
    """`--lengths`: `skewed`, `walk`, `L1,L2,...`, or `module:function` (called with the seed)."""
    if spec == "skewed":
        return skewed_lengths(a.seqs, a.short_len, a.long_len, a.n_long, a.seed)
    if spec == "walk":
        return walk_lengths(a.seqs, a.seed)
    if ":" in spec:
        module, _, name = spec.partition(":")
        source: Callable[[int], list[int]] = getattr(importlib.import_module(module), name)
        lengths = [int(n) for n in source(a.seed)]
    else:
        lengths = [int(n) for n in spec.split(",") if n.strip()]
    bad = [n for n in lengths if n <= PROMPT]
    if not lengths or bad:
        raise SystemExit(f"--lengths {spec!r}: need at least one length, each > {PROMPT} (got {bad or 'none'})")
    return lengths


def batch_of(lengths: list[int], vocab: int, seed: int = 0) -> dict:
    """A right-padded batch with rows of `lengths`: random tokens, the first PROMPT ones out of the loss."""
    g = torch.Generator().manual_seed(seed)
    T = max(lengths)
    am = (torch.arange(T)[None] < torch.tensor(lengths)[:, None]).long()
    ids = torch.randint(1, vocab, (len(lengths), T), generator=g) * am
    lm = am.clone()
    lm[:, :PROMPT] = 0
    return {"input_ids": ids, "attention_mask": am, "loss_mask": lm}


def bucketed_micro_batches(lengths: list[int], budget: int) -> list[list[int]]:
    """Rows sorted by length (longest first), cut where rows x longest row would pass `budget`."""
    groups: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        if groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] <= budget:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def _nll(logits: torch.Tensor, mb: dict) -> tuple[torch.Tensor, dict]:
    lp = packed_token_logprobs(logits, mb["input_ids"], mb["cu_seqlens"])
    return token_mean(-lp, mb["loss_mask"].to(lp.device).bool(), mb["cu_seqlens"]), {}


def packed_step(engine: FSDPEngine, batch: dict, groups: list[list[int]]) -> tuple[float, float]:
    """One optimizer step through the library's packed path; returns (loss, its masked share)."""
    stats = engine.train_batch(batch, _nll, lambda mb: float(mb["loss_mask"].sum()))
    return float(stats["loss"]), float(stats["masked_share"])


def bucketed_step(engine: FSDPEngine, batch: dict, groups: list[list[int]]) -> tuple[float, float]:
    """One optimizer step over the length-sorted padded micro-batches `groups`; returns (loss, padding share)."""
    engine.model.train()
    engine.optimizer.zero_grad(set_to_none=True)
    total = float(batch["loss_mask"][:, 1:].sum())
    loss_sum, real, slots = 0.0, 0, 0
    for n, rows in enumerate(groups):
        engine.model.set_requires_gradient_sync(n == len(groups) - 1)  # as the engine does
        mb = select(batch, rows)  # padded to this micro-batch's longest row
        ids = mb["input_ids"].to(engine.device)
        logits = engine.model(input_ids=ids, use_cache=False).logits  # causal, no mask: pads come last
        b, t = ids.shape
        # the packed side's log-prob function on the padded rows laid end to end: each row a sequence
        rows_cu = torch.arange(0, b * t + 1, t, device=ids.device)
        lp = packed_token_logprobs(logits.view(b * t, -1), ids.view(-1), rows_cu).view(b, t)[:, 1:]
        mask = mb["loss_mask"][:, 1:].to(lp.device).float()
        loss = (-lp * mask).sum() / total
        loss.backward()
        loss_sum += float(loss.detach())
        real, slots = real + int(mb["attention_mask"].sum()), slots + ids.numel()
    torch.nn.utils.clip_grad_norm_(list(engine.model.parameters()), 1.0)
    engine.optimizer.step()
    return loss_sum, 1.0 - real / slots


def timed(step, engine: FSDPEngine, batch: dict, groups: list[list[int]]) -> tuple[float, tuple[float, float]]:
    """(seconds, (loss, padding share)) of one step; waits for the device before reading either clock."""
    sync = torch.cuda.synchronize if engine.device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    loss = step(engine, batch, groups)
    sync()
    return time.perf_counter() - start, loss


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-path", default=None, help="HF model folder; default: a tiny Qwen2 (4 layers, hidden 128)")
    p.add_argument("--lengths", default="skewed", help="skewed | walk | L1,L2,... | module:function (of the seed)")
    p.add_argument("--seqs", type=int, default=16, help="skewed, walk: rows")
    p.add_argument("--short-len", type=int, default=64, help="skewed: short rows have short-len/2 to short-len tokens")
    p.add_argument("--long-len", type=int, default=512, help="skewed: tokens of a long row")
    p.add_argument("--n-long", type=int, default=2, help="skewed: long rows")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-tokens-per-mb", type=int, default=2048, help="the token budget of a micro-batch, both sides")
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
        a.seqs, a.short_len, a.long_len, a.repeats = 4, 24, 64, 1
    torch.set_num_threads(a.threads)
    lengths = lengths_from(a.lengths, a)
    with tempfile.TemporaryDirectory(prefix="train_packing_") as tmp:
        path = a.model_path
        if path is None:
            from arealite.tools.tiny_model import build_tiny_model

            small = (
                dict(layers=2, hidden=64, intermediate=128) if a.smoke else dict(layers=4, hidden=128, intermediate=256)
            )
            path = build_tiny_model(os.path.join(tmp, "m"), **small)
        run(a, path, lengths)


def run(a: argparse.Namespace, path: str, lengths: list[int]) -> None:
    def engine(build_model) -> FSDPEngine:
        cfg = TrainEngineConfig(path=path, optimizer=OptimizerConfig(lr=1e-5, gradient_clipping=1.0),
                                mb_spec=MicroBatchSpec(max_tokens_per_mb=a.max_tokens_per_mb))  # fmt: skip
        return FSDPEngine(cfg, build_model=build_model).initialize()

    if max(lengths) > a.max_tokens_per_mb:
        raise SystemExit(f"a row of {max(lengths)} tokens exceeds --max-tokens-per-mb {a.max_tokens_per_mb}")
    engines = {"packed": engine(load_causal_lm), "bucketed": engine(lambda p, _attn: load_causal_lm(p, "sdpa"))}
    steps = {"packed": packed_step, "bucketed": bucketed_step}
    groups = bucketed_micro_batches(lengths, a.max_tokens_per_mb)
    batch = batch_of(lengths, engines["packed"].hf_config.vocab_size - 10, a.seed)
    describe(a, engines, lengths, groups)
    first = {name: timed(steps[name], engines[name], batch, groups) for name in steps}  # warm-up, untimed
    print(
        f"warm-up step loss (same weights, same batch): packed {first['packed'][1][0]:.4f}, "
        f"bucketed {first['bucketed'][1][0]:.4f}"
    )
    print(
        f"waste: packed {first['packed'][1][1]:.3f} of the attention scores computed are masked out (the "
        f"trainer's masked_share step stat; no padding), bucketed {first['bucketed'][1][1]:.3f} of the rows "
        f"computed are padding (every layer)"
    )
    real = sum(lengths)
    times: dict[str, list[float]] = {name: [] for name in steps}
    print("repeat  side      s/step   tokens/s")
    for i in range(a.repeats):
        for name in harness.order(i, list(steps)):
            seconds, _ = timed(steps[name], engines[name], batch, groups)
            times[name].append(seconds)
            print(f"{i:6d}  {name:<8} {seconds:7.3f} {real / seconds:10,.0f}")
    ratios = [pad / pack for pack, pad in zip(times["packed"], times["bucketed"])]
    for name, ts in times.items():
        print(f"{name:<8} s/step: {harness.spread(ts, '.3f')}")
    print(f"bucketed / packed step time: {harness.spread(ratios)}")
    print(harness.load_line())
    print(f"packed_speedup_vs_bucketed={harness.quartiles(ratios)[2]:.2f}")
    if a.lengths == "walk":  # the same figure, named for the reasoning workload
        print(f"packed_speedup_reasoning={harness.quartiles(ratios)[2]:.2f}")


def describe(a: argparse.Namespace, engines: dict, lengths: list[int], groups: list[list[int]]) -> None:
    """The context lines: machine, commit, resources, the lengths and both sides' padding."""
    real, B, T = sum(lengths), len(lengths), max(lengths)
    padded = sum(len(g) * lengths[g[0]] for g in groups)
    print(harness.machine_line())
    print(harness.commit_line())
    print(
        f"resources: one process, both sides on {engines['packed'].device} with {torch.get_num_threads()} torch "
        f"thread(s), CPUs {sorted(os.sched_getaffinity(0))}; packed attention: "
        f"{engines['packed'].model.config._attn_implementation}, bucketed: "
        f"{engines['bucketed'].model.config._attn_implementation} (causal, no mask); compute dtype "
        f"{engines['packed'].compute_dtype}"
    )
    print(
        f"lengths ({a.lengths}): {B} rows, {real} real tokens, min {min(lengths)}, median "
        f"{sorted(lengths)[B // 2]}, max {T}; one padded [B, T] batch would be {B * T} ({B * T / real:.2f}x)"
    )
    print(
        f"bucketed: {len(groups)} micro-batches of at most {a.max_tokens_per_mb} padded tokens "
        f"(rows x longest: {', '.join(f'{len(g)}x{lengths[g[0]]}' for g in groups)}), {padded} tokens"
    )


if __name__ == "__main__":
    main()
