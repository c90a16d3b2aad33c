"""The rollout dump: every trained sample of a step, as JSONL, for reading and for replay.

    <dump_dir>/step_<n>/rank<r>.jsonl   one line per sample of trainer rank r, in batch order
    <dump_dir>/step_<n>/meta.json       step, version, world size, run directory, the update's
                                        stats (one dict) and tensor dtypes

A line holds `prompt` and `completion` (text: the tokens before the first trained token, and
from it to the end, tool results included) and every tensor of the batch as it went into
`ppo_update`: per-token keys (`input_ids`, `loss_mask`, `logprobs`, `versions`,
`advantages`, ...) as lists of the sample's length, per-sample keys (`rewards`, ...) as
numbers. Floats are written with Python's shortest round-trip repr, so fp32 values read back
bit for bit and the batch rebuilt by `read_batch` equals the trained one (padding aside).
Only the newest `keep_steps` step folders are kept. `meta.json` is written last: a step
folder without it was cut short and is not replayed.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

import torch

from arealite.rollout.batch import pad_value
from arealite.stats.samples import per_sample_tensors, sample_rows

META = "meta.json"


def step_dir(dump_dir: str, step: int) -> str:
    return os.path.join(dump_dir, f"step_{step}")


class RolloutDump:
    """Writes `<dump_dir>/step_<n>/`; `write` is called on every trainer rank after `ppo_update` (collective)."""

    def __init__(
        self, dump_dir: str, tokenizer: Any, run_dir: str = "", rank: int = 0, world_size: int = 1, keep_steps: int = 20
    ) -> None:
        if keep_steps < 0:
            raise ValueError(f"keep_steps={keep_steps} must be >= 0 (0 keeps every step)")
        self.dump_dir = os.path.abspath(dump_dir)
        self.tokenizer = tokenizer
        self.run_dir = os.path.abspath(run_dir) if run_dir else ""
        self.rank, self.world_size, self.keep_steps = rank, world_size, keep_steps

    @classmethod
    def from_config(cls, config: Any, tokenizer: Any, rank: int = 0, world_size: int = 1) -> RolloutDump | None:
        """From a GRPOConfig's `rollout.dump_dir` / `rollout.dump_keep_steps`; None when no dump is asked for."""
        r = config.rollout
        if not r.dump_dir:
            return None
        return cls(r.dump_dir, tokenizer, config.run_dir, rank, world_size, r.dump_keep_steps)

    def write(self, step: int, version: int, batch: dict[str, Any], update_stats: dict[str, float]) -> str:
        """Dump this rank's `batch` (as trained at `step`, weights of `version` before the update)."""
        folder = step_dir(self.dump_dir, step)
        os.makedirs(folder, exist_ok=True)
        rows = sample_rows(batch, self.tokenizer)
        path = os.path.join(folder, f"rank{self.rank}.jsonl")
        with open(path + ".tmp", "w") as f:
            f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
        os.replace(path + ".tmp", path)
        if self.world_size > 1:
            from arealite import world

            world.barrier()  # every rank's file is in place before meta.json marks the step complete
        if self.rank == 0:
            meta = {
                "step": step,
                "version": version,
                "world_size": self.world_size,
                "run_dir": self.run_dir,
                "update_stats": update_stats,
                "dtypes": {k: str(v.dtype).removeprefix("torch.") for k, v in per_sample_tensors(batch).items()},
            }
            with open(os.path.join(folder, META), "w") as f:
                json.dump(meta, f, indent=1)
            self._prune()
        return folder

    def _prune(self) -> None:
        if not self.keep_steps:
            return
        steps = sorted(s for s in dumped_steps(self.dump_dir, complete=False))
        for s in steps[: max(0, len(steps) - self.keep_steps)]:
            shutil.rmtree(step_dir(self.dump_dir, s), ignore_errors=True)


def dumped_steps(dump_dir: str, complete: bool = True) -> list[int]:
    """The steps with a folder in `dump_dir` (with `complete`, only those whose meta.json was written)."""
    if not os.path.isdir(dump_dir):
        return []
    steps = []
    for name in os.listdir(dump_dir):
        done = not complete or os.path.isfile(os.path.join(dump_dir, name, META))
        if name.startswith("step_") and name[5:].isdigit() and done:
            steps.append(int(name[5:]))
    return sorted(steps)


def read_meta(dump_dir: str, step: int) -> dict[str, Any]:
    path = os.path.join(step_dir(dump_dir, step), META)
    if not os.path.isfile(path):
        have = dumped_steps(dump_dir)
        raise FileNotFoundError(
            f"no complete dump of step {step} in {dump_dir} (dumped steps: {have or 'none'}); "
            "raise rollout.dump_keep_steps to keep more steps"
        )
    with open(path) as f:
        return json.load(f)


def read_rows(dump_dir: str, step: int, rank: int = 0) -> list[dict[str, Any]]:
    with open(os.path.join(step_dir(dump_dir, step), f"rank{rank}.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def read_batch(dump_dir: str, step: int, rank: int = 0) -> dict[str, torch.Tensor]:
    """The padded batch rank `rank` trained at `step`, rebuilt from its dump (right-padded as the rollout pads)."""
    dtypes = read_meta(dump_dir, step)["dtypes"]
    rows = read_rows(dump_dir, step, rank)
    width = max(len(r["input_ids"]) for r in rows)
    batch: dict[str, torch.Tensor] = {}
    for key, name in dtypes.items():
        dtype = getattr(torch, name)
        if isinstance(rows[0][key], list):
            t = torch.full((len(rows), width), pad_value(key), dtype=dtype)
            for b, r in enumerate(rows):
                t[b, : len(r[key])] = torch.tensor(r[key], dtype=dtype)
        else:
            t = torch.tensor([r[key] for r in rows], dtype=dtype)
        batch[key] = t
    return batch
