"""On-policy distillation against plain GRPO on the same student, at equal wall time, over seeds.

    PYTHONPATH=. python benchmarks/distill.py [--seeds 1 2 3] [--steps 40] [--plot docs/figures/distill.png]

Each seed S runs the distillation job (configs/tiny_cpu_distill.yaml: the reasoning job's
trained 2-layer policy as the teacher, a 1-layer student warm-started by the same SFT) and the
same job with `distill=null` (GRPO on the verifiable reward), one after the other, with
`seed=S gconfig.sampling_seed=S+6`. Held-out pass@1 (every `evaluator.freq_steps` steps) is set
against training wall time: the steps' own time (`time/step`), evaluation off the clock. At
equal wall time compares the two at the shorter run's training time: each arm's last
evaluation at or before it. A run whose stats already hold its last evaluation is read, not
re-run (delete runs/tiny_cpu_distill/<arm>_s<S> to repeat it). Prints one line per seed and the
medians; `--plot` draws the curves (one line per run).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = "configs/tiny_cpu_distill.yaml"
ARMS = {"distill": [], "grpo": ["distill=null"]}


def run_dir(arm: str, seed: int) -> str:
    return os.path.join(REPO, "runs", "tiny_cpu_distill", f"{arm}_s{seed}")


def curve(path: str) -> list[tuple[float, int, float]]:
    """(training seconds before the evaluation, step, pass@1) for each evaluation of a run."""
    rows = [json.loads(line) for line in open(os.path.join(path, "stats.jsonl"))]
    out, clock = [], 0.0
    for row in sorted(rows, key=lambda r: r["step"]):
        if "eval/pass@1" in row:
            out.append((clock, int(row["step"]), float(row["eval/pass@1"])))
        clock += float(row.get("time/step", 0.0))
    return out


def finished(path: str, steps: int) -> bool:
    try:
        return any(step == steps for _, step, _ in curve(path))
    except (OSError, ValueError, KeyError):
        return False


def launch(arm: str, seed: int, steps: int) -> None:
    cmd = [
        sys.executable, "-m", "arealite.launcher.local", "examples/gsm8k_grpo.py", "--config", CONFIG,
        f"trial_name={arm}_s{seed}", f"seed={seed}", f"gconfig.sampling_seed={seed + 6}",
        f"total_train_steps={steps}", "stats_logger.progress_bar=false", *ARMS[arm],
    ]  # fmt: skip
    print("$", " ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, cwd=REPO, check=True, stdout=subprocess.DEVNULL)


def at(points: list[tuple[float, int, float]], seconds: float) -> float:
    """pass@1 of the last evaluation at or before `seconds` of training."""
    return [p for t, _, p in points if t <= seconds + 1e-9][-1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--plot", default="")
    a = p.parse_args(argv)
    curves: dict[tuple[str, int], list] = {}
    for seed in a.seeds:
        for arm in ARMS:  # the two arms of a seed side by side in time: the machine's load is shared
            if not finished(run_dir(arm, seed), a.steps):
                launch(arm, seed, a.steps)
            curves[arm, seed] = curve(run_dir(arm, seed))
    gains = []
    for seed in a.seeds:
        d, g = curves["distill", seed], curves["grpo", seed]
        budget = min(d[-1][0], g[-1][0])
        pd, pg = at(d, budget), at(g, budget)
        gains.append(pd - pg)
        print(
            f"seed={seed} start={d[0][2]:.3f} wall_s={budget:.0f} distill_pass@1={pd:.3f} grpo_pass@1={pg:.3f} "
            f"(distill {d[-1][0]:.0f}s for {d[-1][1]} steps, grpo {g[-1][0]:.0f}s for {g[-1][1]} steps)"
        )
    print(f"distill_minus_grpo_at_equal_wall_time median={statistics.median(gains):.3f} all={gains}")
    if a.plot:
        plot(curves, a.plot)
    return 0


def plot(curves: dict[tuple[str, int], list], out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for (arm, seed), points in sorted(curves.items()):
        color = "tab:blue" if arm == "distill" else "tab:orange"
        label = f"{'distillation' if arm == 'distill' else 'GRPO'}" if seed == min(s for _, s in curves) else None
        ax.plot([t for t, _, _ in points], [q for _, _, q in points], "o-", color=color, alpha=0.7, label=label)
    ax.set_xlabel("training wall time (s), evaluation off the clock")
    ax.set_ylabel("held-out pass@1")
    ax.set_title("1-layer student: distilling the reasoning job's policy vs GRPO")
    ax.legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, dpi=100)
    print(f"plot: {out}")


if __name__ == "__main__":
    sys.exit(main())
