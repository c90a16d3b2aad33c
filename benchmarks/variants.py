"""The RL lab: every algorithm variant of configs/variants.yaml, several seeds each, on the
arithmetic task of the main job; which ones learn, with their spread over seeds.

    python benchmarks/variants.py [--seeds 1 2 3] [--quick] [--variants grpo ppo ...] [--jobs 2]
    python benchmarks/variants.py --matrix configs/corrections.yaml   # the peers' rollout corrections

Each run is the main job as a user starts it (`python -m arealite.launcher.local
examples/gsm8k_grpo.py --config BASE OVERRIDES...`: a built-in server and one trainer),
with the matrix's common overrides, the variant's and the seed's. Prints one line per variant

    variant=<name> pass1_mean=<m> pass1_min=<lo> pass1_max=<hi> seconds_mean=<s>

(the final held-out pass@1 over seeds, and the mean wall time of one run; for a run whose step
stats report masked or truncated fractions, their means over steps and seeds, per side), then
`variants_learning=<k>/<n>`: a variant learns when its mean final pass@1 is >= 0.8 and its
worst seed >= 0.7. Writes `results.json` and `variants.png` (the held-out pass@1 curves, the
mean over seeds with a min-max band) to --out. A synchronous run keeps about one core busy
(server and trainer take turns), so `--jobs 2` runs two at once on two cores; the runs with
the most training steps start first, so that the matrix does not end on one long run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
MATRIX = REPO / "configs" / "variants.yaml"
LEARNS_MEAN, LEARNS_WORST = 0.8, 0.7
FRACTIONS = {  # what a correction or trust region cut, per side (algo/rollout_correction.py, algo/trust_region.py)
    f"{name}{side}"
    for name in ("rollout_is_clipped_frac", "rollout_rs_masked_frac", "trust_region_masked_frac")
    for side in ("_high", "_low")
} | {"behav_imp_weight_capped_frac", "clip_frac"}


@dataclass
class Run:
    variant: str
    seed: int
    args: list[str]
    curve: list[tuple[int, float]] = field(default_factory=list)  # (version, held-out pass@1)
    seconds: float = float("nan")
    error: str = ""
    fractions: dict[str, float] = field(default_factory=dict)  # mean over steps of each *_frac* stat

    @property
    def final(self) -> float:
        return self.curve[-1][1] if self.curve else float("nan")


def load_matrix(path: Path, quick: bool, names: list[str] | None) -> dict[str, list[str]]:
    """variant -> the launcher's arguments after the script (`--config BASE` and the overrides)."""
    spec = yaml.safe_load(path.read_text())
    variants = spec["variants"]
    unknown = sorted(set(names or []) - set(variants))
    if unknown:
        raise SystemExit(f"unknown variants {unknown} (not in {path}); choose from {sorted(variants)}")
    common, last = list(spec.get("common", [])), (list(spec.get("quick", [])) if quick else [])
    return {  # --quick's schedule wins over a variant's own
        name: ["--config", str(REPO / v["base"]), *common, *v.get("overrides", []), *last]
        for name, v in variants.items()
        if not names or name in names
    }


def run_one(run: Run, out: Path, timeout: float) -> Run:
    """One launch; reads the held-out pass@1 curve from its stats.jsonl."""
    trial = f"{run.variant}-s{run.seed}"
    cmd = [
        sys.executable, "-m", "arealite.launcher.local", "examples/gsm8k_grpo.py", *run.args,
        f"seed={run.seed}", f"gconfig.sampling_seed={run.seed}",
        f"fileroot={out / 'runs'}", "experiment_name=lab", f"trial_name={trial}",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    start = time.perf_counter()
    with open(out / f"{trial}.log", "w") as log:
        try:
            proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    run.seconds = time.perf_counter() - start
    stats = out / "runs" / "lab" / trial / "stats.jsonl"
    if code != 0:
        run.error = f"exit {code}, see {out / (trial + '.log')}"
    if stats.exists():
        rows = [json.loads(line) for line in stats.read_text().splitlines() if line.strip()]
        run.curve = [(int(r["eval/version"]), float(r["eval/pass@1"])) for r in rows if "eval/pass@1" in r]
        keys = sorted({k for r in rows for k in r if k.split("/")[-1] in FRACTIONS})
        run.fractions = {k: statistics.fmean(float(r[k]) for r in rows if k in r) for k in keys}
    return run


def setup_once(arg_lists, out: Path) -> None:
    """Run every base config's `launcher.setup_commands` once, in order, from the repository root:
    concurrent launches would otherwise build the same model folders at the same time."""
    bases = dict.fromkeys(args[args.index("--config") + 1] for args in arg_lists)
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    with open(out / "setup.log", "w") as log:
        for base in bases:
            for command in yaml.safe_load(Path(base).read_text()).get("launcher", {}).get("setup_commands", []):
                if subprocess.run(
                    ["bash", "-c", command], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT
                ).returncode:
                    raise SystemExit(f"setup command {command!r} of {base} failed; see {out / 'setup.log'}")


def planned_steps(args: list[str]) -> int:
    """The run's total_train_steps (the last override wins), 0 when the base config sets it."""
    steps = [int(a.split("=", 1)[1]) for a in args if a.startswith("total_train_steps=")]
    return steps[-1] if steps else 0


def summary(name: str, runs: list[Run]) -> tuple[str, bool]:
    finals = [r.final for r in runs]
    secs = [r.seconds for r in runs]
    ok = all(f == f for f in finals)  # no NaN: every seed finished with an evaluation
    mean, lo, hi = (statistics.fmean(finals), min(finals), max(finals)) if ok else (float("nan"),) * 3
    learns = ok and mean >= LEARNS_MEAN and lo >= LEARNS_WORST
    line = (
        f"variant={name} pass1_mean={mean:.4f} pass1_min={lo:.4f} pass1_max={hi:.4f} "
        f"seconds_mean={statistics.fmean(secs):.1f}"
    )
    keys = sorted({k for r in runs for k in r.fractions})
    for k in keys:
        line += f" {k.split('/')[-1]}={statistics.fmean(r.fractions[k] for r in runs if k in r.fractions):.5f}"
    return line, learns


def plot(by_variant: dict[str, list[Run]], path: Path, title: str, threshold: bool) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for name, runs in by_variant.items():
        versions = sorted({v for r in runs for v, _ in r.curve if len(r.curve)})
        per_version = [[dict(r.curve)[v] for r in runs if v in dict(r.curve)] for v in versions]
        if not versions:
            continue
        (line,) = ax.plot(versions, [statistics.fmean(p) for p in per_version], label=name)
        ax.fill_between(versions, [min(p) for p in per_version], [max(p) for p in per_version],
                        color=line.get_color(), alpha=0.15)  # fmt: skip
    if threshold:  # the lab's "learns" bar; another matrix's schedule is not sized for it
        ax.axhline(LEARNS_MEAN, color="grey", linestyle=":", linewidth=1)
    ax.set(xlabel="policy version (training steps)", ylabel="held-out pass@1", ylim=(0, 1))
    ax.set_title(f"{title}: mean over seeds, band = min..max", fontsize=10)
    ax.legend(fontsize=8, ncol=2, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--matrix", type=Path, default=MATRIX)
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--variants", nargs="+", default=None, help="a subset of the matrix's variants")
    p.add_argument("--quick", action="store_true", help="the matrix's quick overrides, one seed unless --seeds")
    p.add_argument("--smoke", action="store_true", help="2 steps of GRPO, 1 seed: checks the plumbing only")
    p.add_argument("--jobs", type=int, default=2, help="runs at once")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per run")
    p.add_argument("--out", type=Path, default=REPO / "runs" / "variants")
    p.add_argument("--extra", nargs="*", default=[], help="overrides added to every run")
    p.add_argument("--model-path", default=None, help="train this model instead of building the main job's")
    a = p.parse_args(argv)
    if a.model_path:  # every variant's actor (and critic, reference) starts from it; nothing to build
        a.extra = [f"actor.path={a.model_path}", "launcher.setup_commands=[]", *a.extra]
    seeds = a.seeds if not (a.quick or a.smoke) or "--seeds" in (argv or sys.argv) else a.seeds[:1]
    names = a.variants or (["grpo"] if a.smoke else None)
    if a.smoke:
        a.jobs = 1
    matrix = load_matrix(a.matrix, a.quick, names)
    if a.smoke:
        smoke = ["total_train_steps=2", "evaluator.freq_steps=2", "evaluator.num_samples=8", "evaluator.k=1"]
        matrix = {n: [*args, *smoke] for n, args in matrix.items()}
    a.out.mkdir(parents=True, exist_ok=True)
    if not a.model_path:  # each base config's setup once, before runs that share its folders start
        setup_once(matrix.values(), a.out)
        a.extra = ["launcher.setup_commands=[]", *a.extra]
    runs = [Run(n, s, [*args, *a.extra]) for s in seeds for n, args in matrix.items()]
    order = sorted(runs, key=lambda r: -planned_steps(r.args))  # longest first (stable: seed-major otherwise)
    print(f"{len(runs)} runs ({len(matrix)} variants x {len(seeds)} seeds), {a.jobs} at a time; logs in {a.out}")
    t0 = time.perf_counter()
    with ThreadPoolExecutor(a.jobs) as pool:
        for done in as_completed([pool.submit(run_one, r, a.out, a.timeout) for r in order]):
            r = done.result()
            status = r.error or f"pass@1 {r.final:.3f}"
            print(f"  {r.variant} seed {r.seed}: {status} ({r.seconds:.0f} s)", flush=True)
    by_variant = {n: [r for r in runs if r.variant == n] for n in matrix}
    (a.out / "results.json").write_text(json.dumps(
        {n: [{"seed": r.seed, "curve": r.curve, "seconds": r.seconds, "error": r.error} for r in rs]
         for n, rs in by_variant.items()}, indent=1))  # fmt: skip
    title = yaml.safe_load(a.matrix.read_text()).get("title", "variants on the arithmetic task")
    plot(by_variant, a.out / "variants.png", title, threshold=a.matrix.resolve() == MATRIX)
    print(f"matrix wall time {time.perf_counter() - t0:.0f} s; figure {a.out / 'variants.png'}")
    learning = 0
    for name, rs in by_variant.items():
        line, learns = summary(name, rs)
        learning += learns
        print(line, flush=True)
    print(f"variants_learning={learning}/{len(by_variant)}", flush=True)


if __name__ == "__main__":
    main()
