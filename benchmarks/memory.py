"""Trainer peak memory and time of one actor update as the micro-batch grows: LM head in blocks vs whole logits.

    python benchmarks/memory.py            # Qwen2 with Qwen2.5's 151,936 vocabulary, hidden 128, 2 layers, untied
    python benchmarks/memory.py --smoke    # seconds: a small vocabulary and budget

Memory: each measurement in a fresh process (CPU: its peak resident set size minus its size
before the engine is built; CUDA: `max_memory_allocated`), one PPO actor update (forward,
backward, AdamW step) on one packed micro-batch of `budget` tokens, for three heads:
- full: `actor.head_chunk_tokens=0`, the [N, V] logits and their gradient whole (the trainer before);
- chunked: the default `head_chunk_tokens` (blocks of logits, arealite/train/lm_head.py);
- nohead: the same update with a loss on the final hidden states alone, no LM head at all.
The head's share of the peak is peak(head) - peak(nohead) at the same budget and checkpointing
(it includes the head weight's gradient and Adam state). A process that exceeds its memory
limit (RLIMIT_AS) reports "does not fit"; its share is then given against its lower bound,
the logits and their gradient, 2 * N * V * 4 bytes. Gradient checkpointing on/off for
chunked and nohead. Time: paired alternating repeats in one process holding the actors, at
the smallest budget, and on SmolLM2-135M's shapes (49,152 vocabulary, 30 layers, tied).
Last line: head_share_ratio_32k (chunked head share / full head share at the largest budget).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import load_line, machine_line, order, settle, spread

QWEN = dict(vocab=151936, hidden=128, layers=2, heads=4, kv_heads=2, intermediate=384, tie=False, arch="qwen2")
SMOLLM2 = dict(vocab=49152, hidden=576, layers=30, heads=9, kv_heads=3, intermediate=1536, tie=True, arch="llama")
SMOKE = dict(vocab=4096, hidden=64, layers=1, heads=2, kv_heads=1, intermediate=128, tie=False, arch="qwen2")
SEQ_LEN = 512  # tokens per sequence: a budget is budget // SEQ_LEN sequences in one micro-batch


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def build_model(out_dir: str, shape: dict) -> str:
    """A random model of `shape` saved as an HF folder (weights only: no tokenizer is needed)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    common = dict(vocab_size=shape["vocab"], hidden_size=shape["hidden"], num_hidden_layers=shape["layers"],
                  num_attention_heads=shape["heads"], num_key_value_heads=shape["kv_heads"],
                  intermediate_size=shape["intermediate"], tie_word_embeddings=shape["tie"],
                  max_position_embeddings=8192)  # fmt: skip
    torch.manual_seed(0)
    if shape["arch"] == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common, rope_theta=100000.0))
    else:
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    model.save_pretrained(out_dir)
    return out_dir


def _batch(vocab: int, tokens: int, seq_len: int):
    import torch

    g = torch.Generator().manual_seed(1)
    n = max(tokens // seq_len, 2)
    ids = torch.randint(1, vocab, (n, seq_len), generator=g)
    mask = torch.ones_like(ids)
    loss_mask = mask.clone()
    loss_mask[:, : seq_len // 8] = 0
    return {"input_ids": ids, "attention_mask": mask, "loss_mask": loss_mask,
            "logprobs": -torch.rand(n, seq_len, generator=g) * loss_mask,
            "rewards": (torch.arange(n) % 2).float()}  # fmt: skip


def _actor(path: str, tokens: int, chunk: int | None, gc_on: bool):
    from arealite.config import GenerationHyperparameters, MicroBatchSpec, OptimizerConfig, PPOActorConfig
    from arealite.train.actor import PPOActor

    kw = {} if chunk is None else {"head_chunk_tokens": chunk}
    cfg = PPOActorConfig(path=path, optimizer=OptimizerConfig(lr=1e-5), gradient_checkpointing=gc_on,
                         mb_spec=MicroBatchSpec(max_tokens_per_mb=tokens), **kw)  # fmt: skip
    return PPOActor(cfg, GenerationHyperparameters(group_size=2)).initialize()


def _update(actor, batch, nohead: bool) -> float:
    """One actor update; its wall time."""
    import torch

    from arealite.train.lm_head import accepts_hidden_states

    b = {k: v.clone() for k, v in batch.items()}
    started = time.perf_counter()
    if nohead:  # the backbone's cost alone: a loss on the final hidden states
        loss = accepts_hidden_states(lambda hs, mb: ((hs.hidden.float() ** 2).mean(), {}))
        actor.train_batch(b, loss, lambda mb: 1.0)
    else:
        actor.compute_advantages(b)
        actor.ppo_update(b)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - started


def measure(path: str, mode: str, tokens: int, gc_on: bool, seq_len: int) -> dict:
    """One mode in this process (the child's entry point): build, one update, bytes and seconds."""
    import torch

    cuda = torch.cuda.is_available()
    before = _rss()
    chunk = {"full": 0, "chunked": None, "nohead": 1}[mode]
    actor = _actor(path, tokens, chunk, gc_on)
    batch = _batch(actor.hf_config.vocab_size, tokens, seq_len)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    seconds = _update(actor, batch, mode == "nohead")
    peak = torch.cuda.max_memory_allocated() if cuda else _peak_rss() - before
    return {"mode": mode, "tokens": int(batch["attention_mask"].sum()), "gc": gc_on, "peak": peak, "s": seconds,
            "device": "cuda" if cuda else "cpu", "chunk": actor.config.head_chunk_tokens}  # fmt: skip


def run_child(args, path: str, mode: str, tokens: int, gc_on: bool, limit: int) -> dict:
    cmd = [sys.executable, __file__, "--child", mode, "--model-path", path, "--tokens", str(tokens),
           "--seq-len", str(args.seq_len), "--limit", str(limit)] + (["--gc"] if gc_on else [])  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "TRANSFORMERS_VERBOSITY": "error"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        err = done.stderr[-3000:]
        if "can't allocate memory" in err or "MemoryError" in err or "out of memory" in err:
            return {"mode": mode, "tokens": tokens, "gc": gc_on, "peak": None, "s": None}
        raise SystemExit(f"the {mode} run at {tokens} tokens failed:\n{done.stdout[-2000:]}\n{err}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def time_pairs(path: str, tokens: int, sides: dict[str, int | None], repeats: int, seq_len: int) -> dict:
    """Paired alternating repeats of one update per side, all actors in this process."""
    actors = {name: _actor(path, tokens, chunk, False) for name, chunk in sides.items()}
    batch = _batch(next(iter(actors.values())).hf_config.vocab_size, tokens, seq_len)
    warm = _batch(next(iter(actors.values())).hf_config.vocab_size, 4 * 64, 64)
    for a in actors.values():  # a first, small update apiece (AdamW state), untimed
        _update(a, warm, False)
    out: dict[str, list[float]] = {name: [] for name in sides}
    for r in range(repeats):
        for name in order(r, list(sides)):
            settle()
            out[name].append(_update(actors[name], batch, False))
    for a in actors.values():
        a.destroy()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budgets", type=int, nargs="+", default=None, help="tokens per micro-batch")
    p.add_argument("--repeats", type=int, default=None, help="paired repeats of the timings")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=SEQ_LEN)
    p.add_argument(
        "--limit-gib", type=float, default=None, help="address-space limit per child (default: 80%% of MemAvailable)"
    )
    p.add_argument("--smoke", action="store_true", help="a small vocabulary and budgets (a check that it runs)")
    p.add_argument("--no-smollm2", action="store_true", help="skip the SmolLM2-135M shapes timing")
    p.add_argument("--child", choices=["full", "chunked", "nohead"], help=argparse.SUPPRESS)
    p.add_argument("--model-path", help=argparse.SUPPRESS)
    p.add_argument("--tokens", type=int, help=argparse.SUPPRESS)
    p.add_argument("--gc", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--limit", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        if args.limit:
            resource.setrlimit(resource.RLIMIT_AS, (args.limit, args.limit))
        import torch

        torch.set_num_threads(args.threads)
        print(json.dumps(measure(args.model_path, args.child, args.tokens, args.gc, args.seq_len)))
        return

    shape = SMOKE if args.smoke else QWEN
    budgets = args.budgets or ([256, 3072] if args.smoke else [2048, 8192, 32768])
    repeats = args.repeats or (1 if args.smoke else 3)
    seq_len = 64 if args.smoke else args.seq_len
    args.seq_len = seq_len
    with open("/proc/meminfo") as f:
        avail = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable"))
    limit = int(args.limit_gib * (1 << 30)) if args.limit_gib else int(0.8 * avail)
    print(machine_line())
    print(load_line())
    print(f"model: {shape['arch']} vocab {shape['vocab']:,} hidden {shape['hidden']} layers {shape['layers']} "
          f"heads {shape['heads']}/{shape['kv_heads']} tied {shape['tie']}; {seq_len}-token sequences; "
          f"{args.threads} threads; child address-space limit {limit / (1 << 30):.1f} GiB")  # fmt: skip
    gib = 1 << 30
    with tempfile.TemporaryDirectory() as tmp:
        path = build_model(os.path.join(tmp, "model"), shape)
        rows = {}
        for tokens in budgets:
            for mode, gc_on in (("nohead", False), ("chunked", False), ("full", False), ("nohead", True),
                                ("chunked", True)):  # fmt: skip
                r = run_child(args, path, mode, tokens, gc_on, limit)
                rows[(mode, tokens, gc_on)] = r
                peak = "does not fit" if r["peak"] is None else f"{r['peak'] / gib:7.2f} GiB"
                secs = "" if r["s"] is None else f"{r['s']:7.2f} s"
                print(f"{tokens:>6} tokens gc={'on ' if gc_on else 'off'} {mode:8s} peak {peak:>14} {secs}", flush=True)
        print("head's share of the peak (peak - nohead peak), gc off:")
        ratio = None
        for tokens in budgets:
            base = rows[("nohead", tokens, False)]["peak"]
            ch = rows[("chunked", tokens, False)]["peak"] - base
            full = rows[("full", tokens, False)]["peak"]
            bound = 2 * tokens * shape["vocab"] * 4
            if full is None:
                ratio = ch / bound
                print(f"{tokens:>6}: chunked {ch / gib:.2f} GiB; full does not fit (its logits and their gradient "
                      f"alone: {bound / gib:.2f} GiB); ratio <= {ratio:.3f} (vs that lower bound)")  # fmt: skip
            else:
                ratio = ch / (full - base)
                print(f"{tokens:>6}: chunked {ch / gib:.2f} GiB, full {(full - base) / gib:.2f} GiB: ratio {ratio:.3f}")
        small = budgets[0]
        chunk = rows[("chunked", small, False)]["chunk"]
        sides = {"full": 0, "default": None, "forced": max(small // 2, 1)}
        t = time_pairs(path, small, sides, repeats, seq_len)
        print(f"update time at {small} tokens (default head_chunk_tokens={chunk}; forced={sides['forced']}):")
        for name in sides:
            print(f"  {name:8s} {spread(t[name], '.2f')} s")
        r_def = [a / b for a, b in zip(t["default"], t["full"])]
        r_forced = [a / b for a, b in zip(t["forced"], t["full"])]
        print(f"time_ratio_default_vs_full_{small}={spread(r_def, '.3f')}")
        print(f"time_ratio_forced_chunks_vs_full_{small}={spread(r_forced, '.3f')}")
    if not args.smoke and not args.no_smollm2:
        with tempfile.TemporaryDirectory() as tmp:
            path = build_model(os.path.join(tmp, "smollm2"), SMOLLM2)
            tokens = 2304
            t = time_pairs(path, tokens, {"full": 0, "chunked": None}, 2, 128)
            r = [a / b for a, b in zip(t["chunked"], t["full"])]
            print(f"SmolLM2-135M shapes, {tokens} tokens (18 x 128): full {spread(t['full'])} s, "
                  f"chunked {spread(t['chunked'])} s; chunked/full {spread(r, '.3f')}")  # fmt: skip
    print(f"head_share_ratio_32k={ratio:.4f}")


if __name__ == "__main__":
    main()
