"""Per-step statistics: a jsonl file per run, a progress bar showing a handful of them (or one
short line per step without it; every key with `print_stats`), optional tensorboard and wandb;
PNG plots at the end (`arealite.stats.plots`); a few sampled completions per evaluation
(`log_samples`).

Only the main process (rank 0) writes. Values are plain floats: reduce across ranks before
calling `commit` (`StatsTracker.export()` and the actor's stats already are). tensorboard and
wandb are imported only when enabled; wandb never needs the network in `offline` mode.
On recovery, `load_state_dict(state, after_step)` drops the rows the crashed run wrote after
its checkpoint, so `stats.jsonl` holds every step exactly once.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from arealite.stats import console
from arealite.stats.jsonl import plain, stats_path, truncate_after

SAMPLES_FILE = "samples.jsonl"  # the completions shown by log_samples, one JSON object each


class StatsLogger:
    """Writes `<run_dir>/stats.jsonl` and shows a few numbers of each step on the console."""

    def __init__(
        self,
        run_dir: str,
        rank: int = 0,
        jsonl: bool = True,
        tensorboard: bool = False,
        wandb_mode: str = "disabled",
        total_steps: int | None = None,
        progress_bar: bool = False,
        run_name: str = "",
        config: dict | None = None,
        print_stats: bool = False,
    ):
        self.run_dir = run_dir
        self.rank = rank
        self._use_jsonl = jsonl
        self._print_stats = print_stats
        self._total_steps = total_steps
        self._held_out: float | None = None  # the latest evaluation's pass@1, shown until the next
        self._elapsed_before = 0.0  # time spent by earlier (crashed) attempts of this run
        self._start = time.monotonic()
        self._file = self._tb = self._wandb = self._bar = None
        if rank != 0:
            return
        os.makedirs(run_dir, exist_ok=True)
        if jsonl:
            self._file = open(self.jsonl_path, "a", buffering=1)
        if tensorboard:
            self._tb = _tensorboard_writer(os.path.join(run_dir, "tensorboard"))
        if wandb_mode != "disabled":
            self._wandb = _wandb_run(run_dir, wandb_mode, run_name, config)
        if progress_bar and total_steps:
            from tqdm import tqdm

            self._bar = tqdm(total=total_steps, desc="train", unit="step", file=sys.stderr, dynamic_ncols=False)
            console.attach(self._bar, events=print_stats)

    @classmethod
    def from_config(cls, config: Any, rank: int) -> StatsLogger:
        """From a GRPOConfig: its `stats_logger` section, run directory and step count."""
        from omegaconf import OmegaConf

        sl = config.stats_logger
        return cls(
            config.run_dir, rank, sl.jsonl, sl.tensorboard, sl.wandb_mode, config.total_train_steps, sl.progress_bar,
            f"{config.experiment_name}/{config.trial_name}", OmegaConf.to_container(OmegaConf.structured(config)),
            sl.print_stats,
        )  # fmt: skip

    @property
    def jsonl_path(self) -> str:
        return stats_path(self.run_dir)

    def elapsed(self) -> float:
        return self._elapsed_before + time.monotonic() - self._start

    def commit(self, step: int, stats: dict[str, Any]) -> None:
        """Record the stats of one finished step."""
        if self.rank != 0:
            return
        row = {"step": step, "elapsed_s": round(self.elapsed(), 3)}
        row.update({k: plain(v) for k, v in stats.items()})
        if self._file is not None:
            self._file.write(json.dumps(row) + "\n")
        numeric = {
            k: v for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step"
        }
        if self._tb is not None:
            for k, v in numeric.items():
                self._tb.add_scalar(k, v, step)
        if self._wandb is not None:
            self._wandb.log(numeric, step=step)
        if isinstance(row.get("eval/pass@1"), float):
            self._held_out = row["eval/pass@1"]
        brief = self.brief(row)
        if self._bar is not None:
            self._bar.n = min(step + 1, self._bar.total)
            self._bar.set_postfix(brief, refresh=False)
            self._bar.refresh()
        else:  # no bar (a log file, a notebook): one short line per step instead
            total = f"/{self._total_steps}" if self._total_steps else ""
            print(f"[step {step}{total}] " + " ".join(f"{k}={v}" for k, v in brief.items()), flush=True)
        if self._print_stats:
            shown = " ".join(
                f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                for k, v in row.items()
                if not isinstance(v, (list, dict))
            )
            console.write(f"[stats] {shown}")

    def brief(self, row: dict[str, Any]) -> dict[str, str]:
        """The handful of numbers the console shows for a step: its index, the batch reward, the
        latest held-out pass@1 and the step's seconds (each only when known)."""
        out = {"step": str(row["step"])}
        if isinstance(row.get("reward"), float):
            out["reward"] = f"{row['reward']:.3f}"
        if self._held_out is not None:
            out["held_out"] = f"{self._held_out:.3f}"
        if isinstance(row.get("time/step"), float):
            out["s/step"] = f"{row['time/step']:.2f}"
        return out

    def log_samples(self, step: int, samples: list[dict[str, Any]]) -> None:
        """Show a few completions (`arealite.stats.samples.shown_samples`) of `step`: printed,
        appended to `<run_dir>/samples.jsonl`, and as a tensorboard text and a wandb table."""
        if self.rank != 0 or not samples:
            return
        rows = [{"step": step, **{k: plain(v) for k, v in s.items()}} for s in samples]
        with open(os.path.join(self.run_dir, SAMPLES_FILE), "a") as f:
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
        for r in rows:
            numbers = " ".join(f"{k}={v:.4g}" for k, v in r.items() if isinstance(v, float))
            console.write(f"[sample] step={step} {numbers}\n  prompt: {_clip(r['prompt'])!r}\n  completion: "
                          f"{_clip(r['completion'])!r}")  # fmt: skip
        columns = list(rows[0])
        if self._tb is not None:
            lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
            lines += ["| " + " | ".join(_cell(r.get(c)) for c in columns) + " |" for r in rows]
            self._tb.add_text("samples", "\n".join(lines), step)
        if self._wandb is not None:
            import wandb

            self._wandb.log({"samples": wandb.Table(columns=columns, data=[[r.get(c) for c in columns] for r in rows])},
                            step=step)  # fmt: skip

    # ---- recovery -------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {"elapsed_s": self.elapsed()}

    def load_state_dict(self, state: dict[str, Any], after_step: int) -> None:
        """Continue the clock of a recovered run and drop rows of steps after `after_step`."""
        self._elapsed_before = float(state.get("elapsed_s", 0.0))
        self._start = time.monotonic()
        if self.rank != 0:
            return
        if self._file is not None:
            self._file.close()
            truncate_after(self.run_dir, after_step)
            self._file = open(self.jsonl_path, "a", buffering=1)
        if self._bar is not None:
            self._bar.n = after_step + 1
            self._bar.refresh()

    def __enter__(self) -> StatsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()  # idempotent: a loop that already closed with plot=True is not affected

    def close(self, plot: bool = False) -> str | None:
        """Close every sink; with `plot`, write `<run_dir>/plots.png` and return its path."""
        if self._bar is not None:
            console.detach(self._bar)
            self._bar.close()
            self._bar = None
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None
        if plot and self.rank == 0 and os.path.isfile(self.jsonl_path):
            from arealite.stats.plots import plot_run

            try:
                return plot_run(self.run_dir)
            except ImportError as e:  # a finished run must not fail over its picture
                hint = f"pip install matplotlib, then python -m arealite.stats.plots {self.run_dir}"
                print(f"[stats] no plots: {e}; {hint}")
        return None


def _clip(text: str, limit: int = 400) -> str:
    return text if len(text) <= limit else text[: limit // 2] + " ... " + text[-limit // 2 :]


def _cell(value: Any) -> str:
    """A markdown table cell: pipes escaped, newlines as <br>."""
    return str(value).replace("|", "\\|").replace("\n", "<br>")


def _tensorboard_writer(log_dir: str):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as e:
        raise ImportError(
            "stats_logger.tensorboard=true needs the tensorboard package: pip install tensorboard "
            "(or set stats_logger.tensorboard=false)"
        ) from e
    return SummaryWriter(log_dir)


def _wandb_run(run_dir: str, mode: str, name: str, config: dict | None):
    if mode not in ("offline", "online"):
        raise ValueError(f"stats_logger.wandb_mode={mode!r} is not supported; use disabled, offline or online")
    try:
        import wandb
    except ImportError as e:
        raise ImportError(
            f"stats_logger.wandb_mode={mode} needs the wandb package: pip install wandb (or set wandb_mode=disabled)"
        ) from e
    return wandb.init(mode=mode, dir=run_dir, name=name or None, config=config or {}, reinit=True)
