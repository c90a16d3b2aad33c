"""On-policy distillation against plain GRPO on the same student, at equal wall time, over seeds.

    python examples/distill_vs_grpo.py [--seeds 1 2 3] [--steps 15] [--plot docs/figures/distill.png]
        [--arms distill distillrw grpo]

Each seed S runs the distillation job (configs/tiny_cpu_distill.yaml: the reasoning job's
trained policy as the teacher, that job's SFT warm start as the student; `--config
configs/tiny_cpu_distill_small.yaml`: a 1-layer student, half the teacher's depth) and, by default, GRPO
(`distill=null`: the verifiable reward alone) on the same student; `--arms` adds `distillrw`,
the same distillation with `distill.reward_weight=1` (the reward's advantage added). The runs go
one after the other, with `seed=S gconfig.sampling_seed=S+6`. Held-out pass@1 (every
`evaluator.freq_steps` steps) is set against training wall time: the steps' own time
(`time/step`), evaluation off the clock. At equal wall time compares each arm with GRPO at the
shorter run's training time: each arm's last evaluation at or before it. A run whose stats
already hold its last evaluation is read, not re-run (delete runs/<experiment_name>/<arm>_s<S>
to repeat it). Prints one line per seed and arm (with the last 5 steps' mean answer length and
fraction cut at the token budget: a student that learns to ramble shows there) and the medians;
`--plot` draws the curves (one line per run).
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
EXPERIMENT = "tiny_cpu_distill"
STUDENT = "the student"  # the plot's title: the config's actor.path
# distillation alone; distillation plus the reward's advantage (weight 1); GRPO on the reward alone
ARMS = {"distill": [], "distillrw": ["distill.reward_weight=1.0"], "grpo": ["distill=null"]}
NAMES = {"distill": "distillation", "distillrw": "distillation + reward", "grpo": "GRPO"}
COLORS = {"distill": "tab:blue", "distillrw": "tab:green", "grpo": "tab:orange"}


def use_config(path: str) -> None:
    """Run `path`'s job, its runs under runs/<its experiment_name>."""
    import yaml

    global CONFIG, EXPERIMENT, STUDENT
    CONFIG = path
    with open(os.path.join(REPO, path)) as f:
        config = yaml.safe_load(f)
    EXPERIMENT, STUDENT = config["experiment_name"], os.path.basename(config["actor"]["path"])
    layers = {who: n_layers(config[section]["path" if section == "actor" else "teacher_path"])
              for who, section in (("student", "actor"), ("teacher", "distill"))}  # fmt: skip
    if None not in layers.values():
        STUDENT = f"{layers['student']}-layer student of a {layers['teacher']}-layer teacher"


def n_layers(model: str) -> int | None:
    """The model folder's layer count, None before the job built it."""
    try:
        with open(os.path.join(REPO, model, "config.json")) as f:
            return int(json.load(f)["num_hidden_layers"])
    except (OSError, ValueError, KeyError):
        return None


def run_dir(arm: str, seed: int) -> str:
    return os.path.join(REPO, "runs", EXPERIMENT, f"{arm}_s{seed}")


def curve(path: str) -> list[tuple[float, int, float]]:
    """(training seconds before the evaluation, step, pass@1) for each evaluation of a run."""
    rows = [json.loads(line) for line in open(os.path.join(path, "stats.jsonl"))]
    out, clock = [], 0.0
    for row in sorted(rows, key=lambda r: r["step"]):
        if "eval/pass@1" in row:
            out.append((clock, int(row["step"]), float(row["eval/pass@1"])))
        clock += float(row.get("time/step", 0.0))
    return out


def kl_curve(path: str) -> list[tuple[float, float]]:
    """(training seconds at the step's start, kl_teacher) for each step of a distillation run."""
    rows = sorted((json.loads(line) for line in open(os.path.join(path, "stats.jsonl"))), key=lambda r: r["step"])
    out, clock = [], 0.0
    for row in rows:
        if "kl_teacher" in row:
            out.append((clock, float(row["kl_teacher"])))
        clock += float(row.get("time/step", 0.0))
    return out


def answers(path: str, last: int = 5) -> tuple[float, float]:
    """(mean answer length, mean fraction cut at the token budget) over a run's last `last` steps."""
    rows = sorted((json.loads(line) for line in open(os.path.join(path, "stats.jsonl"))), key=lambda r: r["step"])
    rows = [r for r in rows if "response_len" in r][-last:]
    return statistics.mean(r["response_len"] for r in rows), statistics.mean(r["truncated_frac"] for r in rows)


def finished(path: str, steps: int) -> bool:
    try:
        return any(step == steps for _, step, _ in curve(path))
    except (OSError, ValueError, KeyError):
        return False


def launch(arm: str, seed: int, steps: int) -> None:
    cmd = [
        sys.executable, "-m", "arealite.launcher.local", "examples/gsm8k_grpo.py", "--config", CONFIG,
        f"experiment_name={EXPERIMENT}", f"trial_name={arm}_s{seed}", f"seed={seed}",
        f"gconfig.sampling_seed={seed + 6}", f"total_train_steps={steps}", "stats_logger.progress_bar=false",
        *ARMS[arm],
    ]  # fmt: skip
    print("$", " ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, cwd=REPO, check=True, stdout=subprocess.DEVNULL)


def at(points: list[tuple[float, int, float]], seconds: float) -> float:
    """pass@1 of the last evaluation at or before `seconds` of training."""
    return [p for t, _, p in points if t <= seconds + 1e-9][-1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--steps", type=int, default=15, help="steps of each distillation arm")
    p.add_argument("--grpo-steps", type=int, default=30, help="steps of GRPO: its steps are cheaper, so it runs longer")
    p.add_argument("--plot", default="")
    p.add_argument("--arms", nargs="+", default=["distill", "grpo"], choices=list(ARMS), help="the arms to compare")
    p.add_argument("--no-run", action="store_true", help="read the finished runs only; launch nothing")
    p.add_argument("--config", default=CONFIG, help="the job's config; its runs go to runs/<experiment_name>")
    a = p.parse_args(argv)
    use_config(a.config)
    curves: dict[tuple[str, int], list] = {}
    for seed in a.seeds:
        for arm in a.arms:  # the arms of a seed side by side in time: the machine's load is shared
            steps = a.grpo_steps if arm == "grpo" else a.steps
            if not finished(run_dir(arm, seed), steps):
                if a.no_run:
                    continue
                launch(arm, seed, steps)
            curves[arm, seed] = curve(run_dir(arm, seed))
    gains: dict[str, list[float]] = {arm: [] for arm in a.arms if arm != "grpo"}
    for seed in a.seeds:
        for arm in gains:
            if (arm, seed) not in curves or ("grpo", seed) not in curves:
                continue
            d, g = curves[arm, seed], curves["grpo", seed]
            budget = min(d[-1][0], g[-1][0])
            pd, pg = at(d, budget), at(g, budget)
            gains[arm].append(pd - pg)
            (dl, dt), (gl, gt) = answers(run_dir(arm, seed)), answers(run_dir("grpo", seed))
            print(
                f"seed={seed} {arm} start={d[0][2]:.3f} wall_s={budget:.0f} {arm}_pass@1={pd:.3f} grpo_pass@1={pg:.3f} "
                f"final {arm}={d[-1][2]:.3f} grpo={g[-1][2]:.3f} ({arm} {d[-1][0]:.0f}s for {d[-1][1]} steps, "
                f"grpo {g[-1][0]:.0f}s for {g[-1][1]}); last 5 steps: answer length {arm}={dl:.0f} grpo={gl:.0f}, "
                f"truncated {arm}={dt:.3f} grpo={gt:.3f}"
            )
    for arm, diffs in gains.items():
        if diffs:
            print(f"{arm}_minus_grpo_at_equal_wall_time median={statistics.median(diffs):.3f} all={diffs}")
    if a.plot:
        plot(curves, a.plot)
    return 0


def plot(curves: dict[tuple[str, int], list], out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, kl_ax) = plt.subplots(1, 2, figsize=(11, 4))
    first = min(seed for _, seed in curves)
    for (arm, seed), points in sorted(curves.items()):
        label = NAMES[arm] if seed == first else None
        ts, ps = [t for t, _, _ in points], [q for _, _, q in points]
        ax.plot(ts, ps, "o-", color=COLORS[arm], alpha=0.7, label=label)
        if arm != "grpo":
            kl = kl_curve(run_dir(arm, seed))
            kl_ax.plot([t for t, _ in kl], [k for _, k in kl], color=COLORS[arm], alpha=0.7, label=label)
    ax.set_xlabel("training wall time (s), evaluation off the clock")
    ax.set_ylabel("held-out pass@1")
    ax.set_title(f"{STUDENT} (the reasoning job's policy)", fontsize=10)
    ax.legend()
    kl_ax.set_xlabel("training wall time (s)")
    kl_ax.set_ylabel("kl_teacher (per-token reverse KL)")
    kl_ax.set_title("the student's disagreement with the teacher")
    kl_ax.legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, dpi=100)
    print(f"plot: {out}")


if __name__ == "__main__":
    sys.exit(main())
