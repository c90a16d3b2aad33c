"""Evaluate a saved model on the held-out set, as the training run's evaluator would.

    python -m arealite.eval --model RUN_DIR/weights/v20 --config CFG.yaml [--version V] [key=value ...]

Starts `--n-servers` built-in servers on the model (or uses AREAL_LLM_SERVER_ADDRS when set,
e.g. SGLang servers already serving it), evaluates with the config's `evaluator` and
`gconfig` sections, and prints one JSON line of metrics. `--version` is the weight version
the samples are seeded with; it defaults to N for a folder named `vN` (the run's weight
uploads), so the number equals the one the run logged at that version.
"""

from __future__ import annotations

import json
import os
import re
import sys

from arealite.config import GRPOConfig, load_config


def _take(argv: list[str], flag: str) -> str | None:
    if flag not in argv:
        return None
    i = argv.index(flag)
    if i + 1 >= len(argv):
        raise SystemExit(f"{flag} needs a value")
    value = argv[i + 1]
    del argv[i : i + 2]
    return value


def main(argv: list[str] | None = None) -> dict[str, float]:
    argv = list(sys.argv[1:] if argv is None else argv)
    model = _take(argv, "--model")
    version = _take(argv, "--version")
    n_servers = int(_take(argv, "--n-servers") or 1)
    if model is None:
        raise SystemExit(__doc__)
    if not os.path.isfile(os.path.join(model, "config.json")):
        raise SystemExit(f"--model {model!r} is not an HF model folder (no config.json)")
    if version is None:
        m = re.fullmatch(r"v(\d+)", os.path.basename(os.path.normpath(model)))
        version = m.group(1) if m else "0"
    config = load_config(argv, GRPOConfig, script_sections=True)
    return evaluate_model(config, model, int(version), n_servers)


def evaluate_model(config: GRPOConfig, model: str, version: int, n_servers: int = 1) -> dict[str, float]:
    from transformers import AutoTokenizer

    from arealite.eval.evaluator import Evaluator
    from arealite.eval.task import held_out_records, reward_fn_for
    from arealite.rollout import RemoteSGLangEngine
    from arealite.rollout.remote_sglang import addresses_from_env
    from arealite.server.process import launch_server_process

    servers = []
    addresses = addresses_from_env()
    if not addresses:
        extra = ["--max-running-requests", str(config.server.max_running_requests)]
        servers = [launch_server_process(model, extra_args=extra) for _ in range(n_servers)]
        addresses = [s.address for s in servers]
    rollout = RemoteSGLangEngine(config.rollout, addresses)
    try:
        rollout.initialize()
        rollout.set_version(version)
        tokenizer = AutoTokenizer.from_pretrained(config.tokenizer_path or model)
        evaluator = Evaluator(
            config.evaluator, config.gconfig, held_out_records(config, tokenizer), reward_fn_for(config), tokenizer
        )
        metrics = evaluator.evaluate(rollout)
    finally:
        rollout.destroy()
        for s in servers:
            s.stop()
    print(json.dumps({"model": model, "version": version, **metrics}), flush=True)
    return metrics


if __name__ == "__main__":
    main()
