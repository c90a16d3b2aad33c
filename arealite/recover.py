"""Checkpoint and recover: a crashed run continues exactly where its last checkpoint left it.

A checkpoint (`<run_dir>/checkpoints/step_<n>/`, `latest` naming the newest) holds everything
the next step depends on: model, optimizer and lr schedule (DCP), every rank's data-feed
position and RNG states, step, weight version and the stats logger's state. It is written to
`step_<n>.partial` and renamed, and a damaged one (checked against its manifest) is skipped for
the newest good one. After loading, the caller syncs the weights to the servers again.
Guarantees and their tests: docs/reliability.md.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import shutil
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from arealite import world
from arealite.config import RecoverConfig

logger = logging.getLogger(__name__)
_MANIFEST = "manifest.json"


class RecoverError(RuntimeError):
    """No checkpoint where one was required, or one that cannot be loaded."""


@dataclass
class RecoverInfo:
    """What a checkpoint says about the run: the last finished step and the weight version."""

    step: int  # the last step whose update is in the checkpoint
    version: int  # weight version of the checkpointed parameters
    extra: dict[str, Any] = field(default_factory=dict)  # caller state (e.g. evaluation history)


class Recover:
    """Saves checkpoints every `config.freq_steps` steps and loads the latest one. Collective."""

    def __init__(self, config: RecoverConfig, run_dir: str, rank: int = 0) -> None:
        self.config = config
        self.root = os.path.join(os.path.abspath(run_dir), "checkpoints")
        self.rank = rank

    # ---- saving -------------------------------------------------------------------------

    def should_save(self, step: int, total_steps: int) -> bool:
        """Every `freq_steps` steps (counting from 1) and after the last step."""
        if self.config.mode == "disabled":
            return False
        done = step + 1
        return done == total_steps or (self.config.freq_steps > 0 and done % self.config.freq_steps == 0)

    def save(
        self, step: int, version: int, actor: Any, dataloader: Any, stats_logger: Any = None, extra: dict | None = None
    ) -> str:
        """Write the checkpoint of finished `step`; collective. Returns its folder."""
        name = f"step_{step}"
        final, partial = os.path.join(self.root, name), os.path.join(self.root, name + ".partial")
        if self.rank == 0:
            shutil.rmtree(partial, ignore_errors=True)
            os.makedirs(partial)
        world.barrier()
        actor.save_checkpoint(os.path.join(partial, "train_state"))
        local = {"dataloader": dataloader.state_dict() if dataloader is not None else None, "rng": rng_state()}
        torch.save(local, os.path.join(partial, f"rank{self.rank}.pt"))
        world.barrier()
        if self.rank == 0:
            meta = {"step": step, "version": version, "world_size": world.world_size(), "extra": extra or {}}
            if stats_logger is not None:
                meta["stats_logger"] = stats_logger.state_dict()
            with open(os.path.join(partial, "meta.json"), "w") as f:
                json.dump(meta, f)
            _write_manifest(partial, self.config.checksum)
            shutil.rmtree(final, ignore_errors=True)
            os.replace(partial, final)
            _write_atomic(os.path.join(self.root, "latest"), name)
            self._prune(keep=name)
        world.barrier()
        return final

    def _prune(self, keep: str) -> None:
        steps = sorted(
            (int(d.split("_")[1]), d)
            for d in os.listdir(self.root)
            if d.startswith("step_") and not d.endswith(".partial")
        )
        for _, d in steps[: max(0, len(steps) - self.config.keep_last)]:
            if d != keep:
                shutil.rmtree(os.path.join(self.root, d), ignore_errors=True)

    # ---- loading ------------------------------------------------------------------------

    def latest(self) -> str | None:
        """The folder of the latest complete checkpoint, or None."""
        pointer = os.path.join(self.root, "latest")
        if not os.path.isfile(pointer):
            return None
        with open(pointer) as f:
            path = os.path.join(self.root, f.read().strip())
        return path if os.path.isfile(os.path.join(path, "meta.json")) else None

    def candidates(self) -> list[str]:
        """Complete checkpoints: the one `latest` names first, then the others newest first."""
        if not os.path.isdir(self.root):
            return []
        steps = sorted(
            ((int(d.split("_")[1]), os.path.join(self.root, d)) for d in os.listdir(self.root)
             if d.startswith("step_") and d.split("_")[1].isdigit() and os.path.isdir(os.path.join(self.root, d))),
            reverse=True,
        )  # fmt: skip
        latest = self.latest()
        return ([latest] if latest else []) + [p for _, p in steps if p != latest]

    def _choose(self) -> tuple[str | None, list[str]]:
        """(rank 0) the newest checkpoint that passes its manifest, and why newer ones did not."""
        rejected = []
        for path in self.candidates():
            problem = verify_checkpoint(path, self.config.checksum)
            if problem is None:
                return path, rejected
            rejected.append(f"{os.path.basename(path)}: {problem}")
            logger.warning("checkpoint %s is unusable (%s); falling back to an older one", path, problem)
        return None, rejected

    def load(self, actor: Any, dataloader: Any, stats_logger: Any = None) -> RecoverInfo | None:
        """Restore the newest good checkpoint per `config.mode`; None when starting fresh. Collective."""
        if self.config.mode == "disabled":
            return None
        path, rejected = _from_rank0(self._choose() if self.rank == 0 else None)
        if path is None:
            if rejected:
                raise RecoverError(
                    f"every checkpoint under {self.root} is damaged ({'; '.join(rejected)}); restore one from a "
                    "backup, or delete the folder (or set recover.mode=disabled) to start over"
                )
            if self.config.mode == "resume":
                raise RecoverError(f"recover.mode=resume but {self.root} holds no checkpoint; use recover.mode=auto")
            return None
        if rejected and self.rank == 0:
            print(f"[recover] skipped damaged checkpoints ({'; '.join(rejected)}); resuming from {path}", flush=True)
        with open(os.path.join(path, "meta.json")) as f:
            meta = json.load(f)
        if meta["world_size"] != world.world_size():
            raise RecoverError(
                f"checkpoint {path} was written by {meta['world_size']} trainer ranks but this run has "
                f"{world.world_size()}; relaunch with launcher.n_trainers={meta['world_size']}"
            )
        actor.load_checkpoint(os.path.join(path, "train_state"))
        local = torch.load(os.path.join(path, f"rank{self.rank}.pt"), weights_only=False)
        if dataloader is not None and local["dataloader"] is not None:
            dataloader.load_state_dict(local["dataloader"])
        set_rng_state(local["rng"])
        if stats_logger is not None and "stats_logger" in meta:
            stats_logger.load_state_dict(meta["stats_logger"], after_step=meta["step"])
        world.barrier()
        return RecoverInfo(step=meta["step"], version=meta["version"], extra=meta.get("extra", {}))


def _from_rank0(value):
    """Rank 0's `value` on every rank (all ranks must load the same checkpoint)."""
    if world.world_size() == 1:
        return value
    import torch.distributed as dist

    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _files(folder: str) -> list[str]:
    found = []
    for root, _, names in os.walk(folder):
        found += [os.path.relpath(os.path.join(root, n), folder) for n in names]
    return sorted(f for f in found if f != _MANIFEST)


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def _write_manifest(folder: str, checksum: bool) -> None:
    entries = {}
    for rel in _files(folder):
        path = os.path.join(folder, rel)
        entries[rel] = {"bytes": os.path.getsize(path), **({"sha256": _sha256(path)} if checksum else {})}
    with open(os.path.join(folder, _MANIFEST), "w") as f:
        json.dump({"files": entries}, f, indent=1)


def verify_checkpoint(folder: str, checksum: bool = True) -> str | None:
    """Why the checkpoint in `folder` must not be loaded, or None when it checks out: its
    meta.json readable, every file of its manifest present, of its size and (with
    `checksum`) of its SHA-256. A checkpoint without a manifest (older arealite) only gets
    the meta.json check."""
    try:
        with open(os.path.join(folder, "meta.json")) as f:
            meta = json.load(f)
        missing = [k for k in ("step", "version", "world_size") if k not in meta]
    except (OSError, ValueError) as e:
        return f"meta.json is unreadable ({type(e).__name__}: {e})"
    if missing:
        return f"meta.json lacks {missing}"
    if not os.path.isfile(os.path.join(folder, _MANIFEST)):
        return None
    try:
        with open(os.path.join(folder, _MANIFEST)) as f:
            entries = json.load(f)["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"{_MANIFEST} is unreadable ({type(e).__name__}: {e})"
    for rel, entry in entries.items():
        path = os.path.join(folder, rel)
        if not os.path.isfile(path):
            return f"{rel} is missing"
        if os.path.getsize(path) != entry.get("bytes"):
            return f"{rel} has {os.path.getsize(path)} bytes, {entry.get('bytes')} were written (truncated or replaced)"
        if checksum and "sha256" in entry and _sha256(path) != entry["sha256"]:
            return f"{rel} does not match its SHA-256 (its bytes changed after it was written)"
    return None


def _write_atomic(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class EngineGroup:
    """Engines checkpointed as one, for `Recover.save/load`'s `actor` argument.

    The actor's state goes to the checkpoint's `train_state/` as before; each other engine
    (e.g. `critic=`) to `train_state.<name>/` beside it, inside the same atomically renamed
    checkpoint folder. Engines given as None are left out.
    """

    def __init__(self, actor: Any, **others: Any) -> None:
        self.actor = actor
        self.others = {name: engine for name, engine in others.items() if engine is not None}

    def save_checkpoint(self, path: str) -> None:
        self.actor.save_checkpoint(path)
        for name, engine in self.others.items():
            engine.save_checkpoint(f"{path}.{name}")

    def load_checkpoint(self, path: str) -> None:
        for name in self.others:
            if not os.path.isdir(f"{path}.{name}"):
                raise RecoverError(
                    f"checkpoint {os.path.dirname(path)} has no {name} state; it was written without a {name}"
                )
        self.actor.load_checkpoint(path)
        for name, engine in self.others.items():
            engine.load_checkpoint(f"{path}.{name}")


def rng_state() -> dict[str, Any]:
    """The state of Python's, NumPy's and torch's default generators (CPU, and CUDA if used)."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `rng_state` returned."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
