"""What the workflow executor (executor.py) schedules: one episode, its accepted trajectory, and
the records a dataloader hands out, as plain data and pure functions."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, NamedTuple

from arealite.interfaces import AcceptFn, RolloutWorkflow, Trajectory


class RolloutWorkflowError(RuntimeError):
    """A workflow raised while producing a trajectory; the cause is chained."""


@dataclass
class Episode:
    data: dict[str, Any]
    workflow: RolloutWorkflow
    should_accept: AcceptFn | None
    ticket: asyncio.Future | None = None  # rollout_batch: where the result goes
    started: float = 0.0  # monotonic time the episode started running


class Ready(NamedTuple):
    """An accepted trajectory waiting for `wait`, with the version of its oldest token."""

    episode: Episode
    trajectory: Trajectory
    oldest: int | None


def oldest_version(traj: Trajectory) -> int | None:
    """The smallest version >= 0 (-1 marks prompt and pad), once per trajectory on the loop."""
    versions = traj.get("versions")
    if versions is None:
        return None
    produced = versions[versions >= 0]
    return int(produced.min()) if produced.numel() else None


def as_records(batch: Any) -> list[dict[str, Any]]:
    """A dataloader batch as a list of records (accepts a list of dicts or a dict of lists)."""
    if isinstance(batch, dict):
        keys = list(batch)
        return [dict(zip(keys, values)) for values in zip(*(batch[k] for k in keys))]
    return list(batch)


class RecordStream:
    """A dataloader's batches as lists of records, without end: a new epoch starts when one runs out."""

    def __init__(self, dataloader: Any) -> None:
        self.dataloader = dataloader
        self._iter = iter(dataloader)

    def next_records(self) -> list[dict[str, Any]]:
        try:
            return as_records(next(self._iter))
        except StopIteration:
            self._iter = iter(self.dataloader)
            try:
                return as_records(next(self._iter))
            except StopIteration:
                raise ValueError("prepare_batch got an empty dataloader") from None
