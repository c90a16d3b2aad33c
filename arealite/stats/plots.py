"""PNG plots of a run's `stats.jsonl`: reward, held-out accuracy, entropy, response length,
truncated fraction, train-inference mismatch, staleness, loss and KL, timings per step, and
what dynamic sampling dropped.

    python -m arealite.stats.plots RUN_DIR        # writes RUN_DIR/plots.png

matplotlib is imported here only (Agg backend, no display needed). A panel whose keys a run
never logged says so instead of disappearing, so a missing metric is visible. A y key ending
in `*` draws every logged key with that prefix (`time/*`: whatever timings the loop reports).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from arealite.stats.jsonl import read_stats

# (title, x key, [y keys]); every y key (or key family) the run logged is drawn
PANELS: list[tuple[str, str, list[str]]] = [
    ("reward (train batch, mean)", "step", ["reward"]),
    ("held-out accuracy", "eval/version", ["eval/pass@1", "eval/pass@k", "eval/maj@k"]),
    ("policy entropy (nats per response token)", "step", ["entropy"]),
    ("response length (tokens)", "step", ["response_len", "response_len_p50", "response_len_p95", "response_len_max"]),
    ("truncated fraction (hit max_new_tokens without a stop)", "step", ["truncated_frac"]),
    ("train-inference mismatch |logprobs - prox_logp|", "step", ["logprob_mismatch", "logprob_mismatch_max"]),
    ("staleness of trained tokens (versions behind)", "step", ["staleness", "staleness_max"]),
    ("loss; KL to the reference model", "step", ["loss", "critic/loss", "kl", "kl_ref"]),
    ("seconds per step", "step", ["time/*"]),
    ("dynamic sampling: groups dropped / filled in (cumulative)", "step", ["dropped_groups", "filler_groups"]),
]
COLUMNS = 2


def _series(rows: list[dict[str, Any]], x: str, y: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for r in rows:
        if isinstance(r.get(x), (int, float)) and isinstance(r.get(y), (int, float)):
            xs.append(r[x])
            ys.append(r[y])
    return xs, ys


def _keys_like(rows: list[dict[str, Any]], pattern: str) -> list[str]:
    """`eval/pass@k` stands for whichever `eval/pass@<k>` the run logged; `prefix*` for every
    key with that prefix (sorted, `time/step` last so the total sits on top of its parts)."""
    if pattern.endswith("*"):
        found = sorted(
            {k for r in rows for k in r if k.startswith(pattern[:-1])}, key=lambda k: (k.endswith("/step"), k)
        )
        return found or [pattern]
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
    n_rows = -(-len(PANELS) // COLUMNS)
    fig, axes = plt.subplots(n_rows, COLUMNS, figsize=(6.5 * COLUMNS, 2.7 * n_rows), squeeze=False)
    for ax, (title, x, ys) in zip(axes.flat, PANELS):
        drawn = 0
        for pattern in ys:
            for y in _keys_like(rows, pattern):
                xs, vs = _series(rows, x, y)
                if xs:
                    sparse = x == "step" and len(xs) < len(rows) // 4  # e.g. time/eval: points, no line
                    style = {"marker": "o", "markersize": 3} if sparse or len(xs) < 30 else {}
                    if sparse:
                        style["linestyle"] = "none"
                    ax.plot(xs, vs, linewidth=1, label=y, **style)
                    drawn += 1
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("weight version" if x == "eval/version" else "step", fontsize=8)
        ax.tick_params(labelsize=8)
        if drawn:
            ax.legend(fontsize=7, loc="best")
        else:
            ax.text(0.5, 0.5, "not logged in this run", ha="center", va="center", transform=ax.transAxes)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(PANELS) :]:
        ax.set_visible(False)
    fig.suptitle(os.path.basename(os.path.abspath(run_dir)), fontsize=11)
    fig.tight_layout()
    out_path = out_path or os.path.join(run_dir, "plots.png")
    fig.savefig(out_path, dpi=90)
    plt.close(fig)
    return out_path


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or not os.path.isfile(os.path.join(argv[0], "stats.jsonl")):
        print("usage: python -m arealite.stats.plots RUN_DIR   (a folder holding stats.jsonl)", file=sys.stderr)
        return 2
    print(plot_run(argv[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
