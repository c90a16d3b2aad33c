"""Command line of the built-in server, with `sglang.launch_server`'s flag names.

    python -m arealite.server --model-path DIR [--host 127.0.0.1] [--port 30000] ...

A few SGLang flags that have no meaning here (`--tp-size`, `--mem-fraction-static`, ...)
are accepted and ignored, so a launcher can build one command line for either server.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import os
import signal

import torch
from transformers import AutoTokenizer

from arealite.server.limits import RequestLimits
from arealite.server.lora import AdapterSet
from arealite.server.model_runner import DTYPES, MODEL_IMPLS, ModelRunner
from arealite.server.prefill_plan import CPU_OVERHEAD_TOKENS, GPU_OVERHEAD_TOKENS
from arealite.server.scheduler import Scheduler, SchedulerLimits
from arealite.server.state import ServerState
from arealite.utils.parent_watch import parent_from_env, watch_parent
from arealite.utils.stop_ids import eos_token_ids

# SGLang flags accepted for command-line compatibility; they do not change this server.
IGNORED_VALUE_FLAGS = (
    "--max-loras-per-batch",
    "--lora-backend",
    "--tp-size",
    "--tensor-parallel-size",
    "--dp-size",
    "--mem-fraction-static",
    "--load-format",
    "--attention-backend",
    "--sampling-backend",
    "--chunked-prefill-size",
    "--schedule-policy",
    "--cuda-graph-max-bs",
)
IGNORED_BOOL_FLAGS = (
    "--disable-radix-cache",
    "--trust-remote-code",
    "--enable-metrics",
    "--disable-cuda-graph",
    "--log-requests",
    "--enable-memory-saver",
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m arealite.server", description="Built-in SGLang-protocol inference server (transformers)."
    )
    p.add_argument("--model-path", required=True, help="HF model directory")
    p.add_argument("--tokenizer-path", default=None, help="defaults to --model-path")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--dtype", default="auto", choices=sorted(DTYPES))
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument(
        "--model-impl",
        default="auto",
        choices=MODEL_IMPLS,
        help="forward: arealite (lean, Qwen2/Llama/Mistral), transformers (any model), auto (arealite where supported)",
    )
    p.add_argument("--context-length", type=int, default=None, help="defaults to the model's max_position_embeddings")
    p.add_argument("--random-seed", type=int, default=None, help="seeds sampling; defaults to 0 for reproducible runs")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on every route but /health*")
    p.add_argument("--max-running-requests", type=int, default=64)
    p.add_argument(
        "--max-total-tokens", type=int, default=None, help="budget of prompt + max_new_tokens over running requests"
    )
    p.add_argument("--max-prefill-tokens", type=int, default=16384, help="padded tokens in one prefill forward")
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--weight-version", default="default")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error", "critical"])
    p.add_argument("--skip-server-warmup", action="store_true")
    p.add_argument("--stream-interval", type=int, default=1, help="tokens between stream chunks")
    p.add_argument("--torch-threads", type=int, default=None, help="torch intra-op threads (arealite only)")
    # Caps on what one request may ask (limits.py); a request over a cap gets a 4xx naming it.
    p.add_argument("--max-request-bytes", type=int, default=64 << 20, help="largest request body; larger ones get 413")
    p.add_argument("--max-json-depth", type=int, default=32, help="deepest JSON nesting of a request body")
    p.add_argument(
        "--max-parallel-samples", type=int, default=256, help="largest `n` (sampling_params.n) of one request"
    )
    p.add_argument(
        "--max-request-tokens",
        type=int,
        default=None,
        help="prompt + max_new_tokens summed over one request's sequences; defaults to --max-total-tokens",
    )
    p.add_argument("--max-top-logprobs-num", type=int, default=256, help="largest top_logprobs_num")
    p.add_argument(
        "--enable-lora", action="store_true", help="serve LoRA adapters (/load_lora_adapter, lora_path in /generate)"
    )
    p.add_argument(
        "--lora-paths", nargs="+", default=None, help="adapters to load at start: NAME=PATH or PATH (named PATH)"
    )
    p.add_argument("--max-lora-rank", type=int, default=None, help="refuse adapters of a higher rank")
    p.add_argument(
        "--lora-target-modules",
        nargs="+",
        default=None,
        help="refuse adapters of other layers (names such as q_proj, or all)",
    )
    p.add_argument("--max-loaded-loras", type=int, default=None, help="the most adapters loaded at once")
    p.add_argument(
        "--dist-timeout",
        type=float,
        default=60.0,
        help=(
            "seconds a weight-update group may wait to form and per collective, unless /init_weights_update_group "
            "sends its own `timeout`"
        ),
    )
    p.add_argument(
        "--enable-deterministic-inference",
        action="store_true",
        help="numerics independent of batch composition: each sequence runs through the model alone (slower)",
    )
    for flag in IGNORED_VALUE_FLAGS:
        p.add_argument(flag, default=None, help=argparse.SUPPRESS)
    for flag in IGNORED_BOOL_FLAGS:
        p.add_argument(flag, action="store_true", help=argparse.SUPPRESS)
    return p


def check_args(args: argparse.Namespace) -> None:
    """Reject values that would only fail later, naming the flag and what to pass."""
    for flag in (
        "max_running_requests",
        "max_prefill_tokens",
        "stream_interval",
        "max_request_bytes",
        "max_json_depth",
        "max_parallel_samples",
    ):
        if getattr(args, flag) < 1:
            raise SystemExit(f"--{flag.replace('_', '-')} must be at least 1, got {getattr(args, flag)}")
    if not args.dist_timeout > 0:
        raise SystemExit(f"--dist-timeout must be > 0 seconds, got {args.dist_timeout}")
    if args.max_top_logprobs_num < 0:
        raise SystemExit(f"--max-top-logprobs-num must be at least 0, got {args.max_top_logprobs_num}")
    for flag in (
        "context_length",
        "max_total_tokens",
        "torch_threads",
        "max_request_tokens",
        "max_lora_rank",
        "max_loaded_loras",
    ):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise SystemExit(f"--{flag.replace('_', '-')} must be at least 1 (or omitted), got {value}")
    if not os.path.isdir(args.model_path):
        raise SystemExit(f"--model-path {args.model_path!r} is not a directory; pass a local HF model folder")


def lora_path_entry(entry: str) -> tuple[str, str]:
    """(name, path) of one `--lora-paths` entry: NAME=PATH, PATH, or SGLang's JSON form."""
    if entry.lstrip().startswith("{"):
        spec = json.loads(entry)
        return spec["lora_name"], spec["lora_path"]
    name, sep, path = entry.partition("=")
    return (name, path) if sep else (entry, entry)


def build_state(args: argparse.Namespace) -> ServerState:
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    runner = ModelRunner(args.model_path, args.dtype, device, args.model_impl, args.enable_deterministic_inference)
    if args.enable_lora or args.lora_paths:  # SGLang: --lora-paths implies --enable-lora
        runner.lora = AdapterSet(
            runner.model, runner.lock, True, args.max_lora_rank, args.lora_target_modules, args.max_loaded_loras
        )
        for entry in args.lora_paths or ():
            runner.lora.load(*lora_path_entry(entry))
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer_path or args.model_path)
    model_max = int(getattr(runner.config, "max_position_embeddings", 0) or 4096)
    context_len = args.context_length or model_max
    if context_len > model_max:
        logging.getLogger("arealite.server").warning(
            "--context-length %d exceeds max_position_embeddings %d", context_len, model_max
        )
    max_total = args.max_total_tokens or args.max_running_requests * context_len
    overhead = CPU_OVERHEAD_TOKENS if device == "cpu" else GPU_OVERHEAD_TOKENS  # prefill_plan.py
    limits = SchedulerLimits(args.max_running_requests, max_total, args.max_prefill_tokens, overhead)
    scheduler = Scheduler(
        runner, tokenizer, eos_token_ids(args.model_path, tokenizer, runner.config), limits, args.weight_version
    )
    seed = 0 if args.random_seed is None else args.random_seed
    request_limits = RequestLimits(
        max_request_bytes=args.max_request_bytes,
        max_json_depth=args.max_json_depth,
        max_parallel_samples=args.max_parallel_samples,
        max_request_tokens=args.max_request_tokens or max_total,
        max_top_logprobs_num=args.max_top_logprobs_num,
    )
    return ServerState(
        args=args,
        runner=runner,
        tokenizer=tokenizer,
        scheduler=scheduler,
        context_len=context_len,
        model_path=args.model_path,
        served_model_name=args.served_model_name or args.model_path,
        weight_version=args.weight_version,
        seed_source=torch.Generator().manual_seed(seed),
        limits=request_limits,
    )


def main(argv: list[str] | None = None) -> None:
    from arealite.server.app import serve

    args = build_parser().parse_args(argv)
    check_args(args)
    logging.basicConfig(level=args.log_level.upper(), format="[%(asctime)s %(name)s %(levelname)s] %(message)s")
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    parent = parent_from_env()
    if parent is not None:  # started by launch_server_process: stop (SIGTERM, graceful) once it is gone
        watch_parent(parent, lambda: os.kill(os.getpid(), signal.SIGTERM))
    state = build_state(args)
    # What startup built (imports, model, tokenizer) lives as long as the server; frozen, it
    # leaves the collector, so a full collection while serving, which stalls every request in
    # flight, scans only what serving made.
    gc.collect()
    gc.freeze()
    state.scheduler.start()

    async def run() -> None:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        await serve(state, args.host, args.port, args.skip_server_warmup)

    try:
        asyncio.run(run())
    except asyncio.CancelledError:
        pass
