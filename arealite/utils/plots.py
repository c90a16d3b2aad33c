"""PNG plots of a run's `stats.jsonl`: reward, held-out accuracy, loss, train-inference
mismatch and timings per step.

    python -m arealite.utils.plots RUN_DIR        # writes RUN_DIR/plots.png

matplotlib is imported here only (Agg backend, no display needed). A panel whose keys a run
never logged says so instead of disappearing, so a missing metric is visible.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from arealite.utils.stats_logger import read_stats

# (title, x key, [y keys]); the first present y key family is drawn
PANELS: list[tuple[str, str, list[str]]] = [
    ("reward (train batch)", "step", ["reward"]),
    ("held-out accuracy", "eval/version", ["eval/pass@1", "eval/pass@k", "eval/maj@k"]),
    ("loss", "step", ["loss"]),
    ("train-inference mismatch |logprobs - prox_logp|", "step", ["logprob_mismatch", "logprob_mismatch_max"]),
    ("seconds per step", "step", ["time/rollout", "time/train", "time/weight_sync", "time/eval", "time/save", "time/step"]),
]


def _series(rows: list[dict[str, Any]], x: str, y: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for r in rows:
        if isinstance(r.get(x), (int, float)) and isinstance(r.get(y), (int, float)):
            xs.append(r[x])
            ys.append(r[y])
    return xs, ys


def _keys_like(rows: list[dict[str, Any]], pattern: str) -> list[str]:
    """`eval/pass@k` stands for whichever `eval/pass@<k>` the run logged."""
    if "@k" not in pattern:
        return [pattern]
    prefix = pattern.split("@k")[0] + "@"
    found = sorted({k for r in rows for k in r if k.startswith(prefix) and k != prefix + "1"})
    return found or [pattern]


def plot_run(run_dir: str, out_path: str | None = None) -> str:
    """Draw the panels from `<run_dir>/stats.jsonl` into one PNG; returns its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_stats(run_dir)
    fig, axes = plt.subplots(len(PANELS), 1, figsize=(8, 2.6 * len(PANELS)), squeeze=False)
    for ax, (title, x, ys) in zip(axes[:, 0], PANELS):
        drawn = 0
        for pattern in ys:
            for y in _keys_like(rows, pattern):
                xs, vs = _series(rows, x, y)
                if xs:
                    ax.plot(xs, vs, marker="o" if len(xs) < 30 else None, markersize=3, label=y)
                    drawn += 1
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("weight version" if x == "eval/version" else "step", fontsize=8)
        if drawn:
            ax.legend(fontsize=7, loc="best")
        else:
            ax.text(0.5, 0.5, "not logged in this run", ha="center", va="center", transform=ax.transAxes)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    out_path = out_path or os.path.join(run_dir, "plots.png")
    fig.savefig(out_path, dpi=90)
    plt.close(fig)
    return out_path


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or not os.path.isfile(os.path.join(argv[0], "stats.jsonl")):
        print("usage: python -m arealite.utils.plots RUN_DIR   (a folder holding stats.jsonl)", file=sys.stderr)
        return 2
    print(plot_run(argv[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
