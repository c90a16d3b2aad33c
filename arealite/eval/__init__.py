"""Held-out evaluation: pass@1, pass@k and maj@k through the inference servers.

In training: `Evaluator(config.evaluator, ...)`. Standalone, on a saved checkpoint:
`python -m arealite.eval --model RUN_DIR/weights/v20 --config CFG.yaml [key=value ...]`.
"""

from arealite.eval.evaluator import Evaluator, eval_gconfig
from arealite.eval.metrics import extract_answer, pass_at_k, prompt_metrics

__all__ = ["Evaluator", "eval_gconfig", "extract_answer", "pass_at_k", "prompt_metrics"]
