"""Trainer memory with a LoRA adapter vs full fine-tuning, on the same model and batch.

    python benchmarks/lora_memory.py                 # a small Qwen2 built on the spot (8 layers, hidden 512)
    python benchmarks/lora_memory.py --model-path DIR --rank 16
    python benchmarks/lora_memory.py --smoke         # seconds: the smallest model, one step

Each mode runs in its own process (so one's peak cannot hide the other's): an FSDPEngine in a
world of one, `--steps` optimizer steps on one fixed batch (mean token NLL). Measured:
- train state: parameters + gradients + AdamW state, in bytes (what LoRA shrinks: the base
  weights stay, their gradients and Adam moments go). Gradients are counted as the bytes of
  the trainable parameters, which FSDP2 gives gradients of the same (sharded) shape and
  dtype; the AdamW state is summed over the optimizer's tensors after the last step;
- peak: on CUDA `torch.cuda.max_memory_allocated`; on the CPU the process's peak resident
  set size minus its size before the engine was built (the Python and torch runtime cancel).
Prints both modes and ends with `lora_memory_ratio=<x>` (LoRA train state / full train
state) after `lora_peak_memory_ratio=<x>`. Ratios below 1 are savings. The peak ratio falls
with the share of the train state in the peak: activations, which LoRA does not shrink, grow
with the tokens per step (`--seqs`, `--seq-len`).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile

SMOKE = dict(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128, seqs=4, seq_len=32, steps=1)
DEFAULT = dict(layers=8, hidden=512, heads=8, kv_heads=4, intermediate=1536, seqs=4, seq_len=128, steps=3)


def _rss_bytes() -> int:
    """Peak resident set size of this process (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def _current_rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return _rss_bytes()


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def measure(mode: str, model_path: str, rank: int, seqs: int, seq_len: int, steps: int) -> dict:
    """One mode in this process: build, train `steps`, report bytes (the child's entry point)."""
    import torch

    from arealite.algo.losses import token_mean
    from arealite.config import LoRAConfig, OptimizerConfig, TrainEngineConfig
    from arealite.train.engine import FSDPEngine
    from arealite.train.logprobs import packed_token_logprobs

    torch.manual_seed(0)
    cuda = torch.cuda.is_available()
    if mode == "lora":  # the baseline includes importing peft: count the training, not the import
        from arealite.train.lora import require_peft

        require_peft()
    before = _current_rss_bytes()
    lora = LoRAConfig(rank=rank, alpha=2.0 * rank) if mode == "lora" else None
    engine = FSDPEngine(TrainEngineConfig(path=model_path, optimizer=OptimizerConfig(lr=1e-4), lora=lora)).initialize()
    vocab = engine.hf_config.vocab_size
    ids = torch.randint(1, vocab, (seqs, seq_len), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    loss_mask = mask.clone()
    loss_mask[:, : seq_len // 4] = 0
    batch = {"input_ids": ids, "attention_mask": mask, "loss_mask": loss_mask}

    def nll(logits, mb):
        lp = packed_token_logprobs(logits, mb["input_ids"], mb["cu_seqlens"])
        return token_mean(-lp, mb["loss_mask"].bool(), mb["cu_seqlens"]), {}

    if cuda:
        torch.cuda.reset_peak_memory_stats()
    for _ in range(steps):
        engine.train_batch(batch, nll, lambda mb: float(mb["loss_mask"].sum()))
    params = list(engine.model.parameters())
    grad_bytes = sum(_local(p).nbytes for p in params if p.requires_grad)
    state = [v for s in engine.optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    out = {
        "mode": mode,
        "device": "cuda" if cuda else "cpu",
        "trainable_params": sum(p.numel() for p in params if p.requires_grad),
        "total_params": sum(p.numel() for p in params),
        "param_bytes": sum(_local(p).nbytes for p in params),
        "grad_bytes": grad_bytes,
        "optimizer_state_bytes": sum(_local(t).nbytes for t in state),
    }
    out["train_state_bytes"] = out["param_bytes"] + out["grad_bytes"] + out["optimizer_state_bytes"]
    out["peak_bytes"] = torch.cuda.max_memory_allocated() if cuda else _rss_bytes() - before
    return out


def run_mode(mode: str, args: argparse.Namespace, model_path: str) -> dict:
    """`measure` in a fresh process; returns its JSON line."""
    cmd = [sys.executable, __file__, "--child", mode, "--model-path", model_path, "--rank", str(args.rank),
           "--seqs", str(args.seqs), "--seq-len", str(args.seq_len), "--steps", str(args.steps)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "TRANSFORMERS_VERBOSITY": "error"}
    env.setdefault("PYTHONPATH", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the {mode} run failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-path", default=None, help="HF model folder; default: a random Qwen2 built on the spot")
    p.add_argument("--rank", type=int, default=8, help="LoRA rank (alpha = 2 * rank, the default target modules)")
    p.add_argument("--seqs", type=int, default=None)
    p.add_argument("--seq-len", type=int, default=None)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--smoke", action="store_true", help="the smallest model and one step (a check that it runs)")
    p.add_argument("--child", choices=["full", "lora"], help=argparse.SUPPRESS)
    args = p.parse_args()
    sizes = SMOKE if args.smoke else DEFAULT
    for key in ("seqs", "seq_len", "steps"):
        if getattr(args, key) is None:
            setattr(args, key, sizes[key])
    if args.child:
        import torch

        torch.set_num_threads(args.threads)
        print(json.dumps(measure(args.child, args.model_path, args.rank, args.seqs, args.seq_len, args.steps)))
        return

    with tempfile.TemporaryDirectory() as tmp:
        model_path = args.model_path
        if model_path is None:
            from arealite.tools.tiny_model import build_tiny_model

            shape = {k: sizes[k] for k in ("layers", "hidden", "heads", "kv_heads", "intermediate")}
            model_path = build_tiny_model(
                os.path.join(tmp, "model"), vocab_size=4096 if not args.smoke else 512, **shape
            )
        results = {mode: run_mode(mode, args, model_path) for mode in ("full", "lora")}
    mib = 1 << 20
    print(
        f"model {model_path or 'built on the spot'}; rank {args.rank}; {args.seqs} x {args.seq_len} tokens; "
        f"{args.steps} steps; device {results['full']['device']}"
    )
    for mode, r in results.items():
        print(
            f"{mode:5s} trainable {r['trainable_params']:>11,} of {r['total_params']:,} params | params "
            f"{r['param_bytes'] / mib:8.2f} MiB grads {r['grad_bytes'] / mib:8.2f} MiB "
            f"adam {r['optimizer_state_bytes'] / mib:8.2f} MiB "
            f"| train state {r['train_state_bytes'] / mib:8.2f} MiB | peak {r['peak_bytes'] / mib:8.2f} MiB"
        )
    full, lora = results["full"], results["lora"]
    print(f"lora_optimizer_state_ratio={lora['optimizer_state_bytes'] / full['optimizer_state_bytes']:.4f}")
    print(f"lora_peak_memory_ratio={lora['peak_bytes'] / max(full['peak_bytes'], 1):.3f}")
    print(f"lora_memory_ratio={lora['train_state_bytes'] / full['train_state_bytes']:.3f}")


if __name__ == "__main__":
    main()
