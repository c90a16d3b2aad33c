"""Supervised warm start: fine-tune `sft.base_path` on the training set, write `actor.path`.

    python -m arealite.tools.sft_warmstart --config configs/tiny_cpu.yaml [key=value ...]

Reads the same experiment config as the training script: the records come from
`train_dataset` (mapped by `sft.records_fn` when set), the optimizer settings from `sft`
(steps, batch_size, lr, seed), the output folder is `actor.path`. Does nothing when
`actor.path` already holds a model, so it can sit in `launcher.setup_commands` and run only
on the first launch. Deterministic for a seed: one process, a seeded data order, fp32 on CPU.

Used for the CPU main job, where a random tiny model must first learn the answer format
(deliberately under-trained, so GRPO has something left to learn).
"""

from __future__ import annotations

import os
import random
import shutil
import sys
import time

from arealite.config import GRPOConfig, MicroBatchSpec, OptimizerConfig, TrainEngineConfig, load_config


def has_model(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "config.json")) and any(
        f.endswith(".safetensors") for f in os.listdir(path)
    )


def run_warm_start(config: GRPOConfig) -> str:
    """Fine-tune and save to `config.actor.path`; returns that path. Collective if distributed."""
    import torch
    from transformers import AutoTokenizer

    from arealite.data.loader import load_records
    from arealite.train.engine import FSDPEngine
    from arealite.train.sft import sft_batch, sft_step
    from arealite.utils.imports import import_object

    sft = config.sft
    if not sft.base_path:
        raise ValueError("sft.base_path is empty; set it to the HF model folder to fine-tune")
    torch.manual_seed(sft.seed)
    engine = FSDPEngine(
        TrainEngineConfig(
            path=sft.base_path,
            optimizer=OptimizerConfig(lr=sft.lr, gradient_clipping=1.0),
            mb_spec=MicroBatchSpec(max_tokens_per_mb=config.actor.mb_spec.max_tokens_per_mb),
        ),
        total_optimizer_steps=sft.steps,
    ).initialize()
    tokenizer = AutoTokenizer.from_pretrained(sft.base_path)
    records = load_records(config.train_dataset, split="train", seed=config.seed)
    if sft.records_fn:  # e.g. demonstrations of a tool-calling format (configs/tiny_cpu_tools.yaml)
        records = import_object(sft.records_fn)(records, tokenizer, config)
    rng = random.Random(sft.seed)
    started = time.monotonic()
    for step in range(sft.steps):
        stats = sft_step(engine, sft_batch(rng.sample(records, min(sft.batch_size, len(records))), tokenizer))
        if step % 10 == 0 or step == sft.steps - 1:
            print(
                f"[sft] step {step} loss={stats['loss']:.4f} token_accuracy={stats['token_accuracy']:.3f}", flush=True
            )
    # write next to the target, then rename: a killed warm start never leaves a half model behind
    partial = config.actor.path.rstrip("/") + ".partial"
    engine.save(partial)
    if os.path.isdir(config.actor.path):
        shutil.rmtree(config.actor.path)
    os.replace(partial, config.actor.path)
    print(f"[sft] wrote {config.actor.path} after {sft.steps} steps in {time.monotonic() - started:.1f}s", flush=True)
    engine.destroy()
    return config.actor.path


def main(argv: list[str] | None = None) -> int:
    config = load_config(sys.argv[1:] if argv is None else argv, GRPOConfig, script_sections=True)
    if has_model(config.actor.path):
        print(f"[sft] {config.actor.path} already holds a model; skipping the warm start", flush=True)
        return 0
    run_warm_start(config)
    return 0


if __name__ == "__main__":
    sys.exit(main())
