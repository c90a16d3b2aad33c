"""`WorkflowExecutor`: runs rollout workflows on the engine's event loop under a staleness bound.

Staleness (DESIGN.md §3, as in AReaL): with `max_head_offpolicyness = k`, batch size `B` and
current version `v`, a queued episode may start only while

    accepted + running < (k + (v - v0) + 1) * B        (v0: the version when counting began)

so batch n (trained at version v0 + n) only holds episodes started at version >= v0 + n - k.
Episodes can finish out of order, so `wait()` also checks each trajectory's `versions`: one
whose oldest token is more than k versions behind the current version is not returned but
re-queued to be generated afresh (counted in `stats["stale_requeued"]`). `k = 0` is fully
synchronous. `max_concurrent_rollouts` bounds episodes in flight; a full queue only delays
submissions (back-pressure), never raises.

Two ways in:
- `submit` + `wait` / `prepare_batch`: the asynchronous queue above.
- `rollout_batch(data)`: run these items now (bounded only by concurrency) and return their
  trajectories in input order; they do not count against the staleness budget.

An optional `should_accept(trajectory) -> bool` filter (dynamic sampling) drops trajectories;
`prepare_batch` keeps pulling data until the batch is full. A workflow that raises makes the
next `wait`/`rollout_batch`/`prepare_batch` raise; nothing is dropped silently.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from arealite.config import InferenceEngineConfig
from arealite.rollout.batch import concat_padded

if TYPE_CHECKING:
    from arealite.rollout.remote_sglang import RemoteSGLangEngine

Trajectory = dict[str, torch.Tensor]
_WAIT_SLICE = 0.5  # seconds prepare_batch waits before topping up the queue again


class RolloutWorkflowError(RuntimeError):
    """A workflow raised while producing a trajectory; the cause is chained."""


@dataclass
class _Episode:
    data: dict[str, Any]
    workflow: Any
    should_accept: Callable[[Trajectory], bool] | None
    ticket: asyncio.Future | None = None  # rollout_batch: where the result goes


def _oldest_version(traj: Trajectory) -> int | None:
    versions = traj.get("versions")
    if versions is None:
        return None
    produced = versions[versions >= 0]
    return int(produced.min()) if produced.numel() else None


def _as_records(batch: Any) -> list[dict[str, Any]]:
    """A dataloader batch as a list of records (accepts a list of dicts or a dict of lists)."""
    if isinstance(batch, dict):
        keys = list(batch)
        return [dict(zip(keys, values)) for values in zip(*(batch[k] for k in keys))]
    return list(batch)


class WorkflowExecutor:
    """Schedules workflow episodes for one engine. See the module docstring."""

    def __init__(self, config: InferenceEngineConfig, engine: RemoteSGLangEngine) -> None:
        self.config = config
        self.engine = engine
        self.batch_size: int | None = config.consumer_batch_size
        self._lock = threading.Condition()
        self._queued: deque[_Episode] = deque()  # submitted, waiting for capacity
        self._ready: deque[tuple[_Episode, Trajectory, int | None]] = deque()  # accepted: (episode, trajectory, oldest version)
        self._sync: deque[_Episode] = deque()  # rollout_batch episodes, waiting for concurrency
        self._tasks: set[asyncio.Task] = set()
        self._running_queued = 0  # started from _queued and not finished
        self._accepted = 0  # accepted since counting began (the staleness budget's usage)
        self._base_version: int | None = None
        self._error: BaseException | None = None
        self._data_iter: Any = None
        self._dataloader: Any = None
        self.stats: dict[str, int] = {"submitted": 0, "accepted": 0, "rejected": 0, "stale_requeued": 0, "failed": 0}

    # ---- capacity (event loop thread) ----------------------------------------------------

    def _concurrency_limit(self) -> int | None:
        return self.config.max_concurrent_rollouts or self.batch_size

    def _capacity(self) -> int:
        limit = self._concurrency_limit()
        free = (limit - len(self._tasks)) if limit else 1 << 30
        if self.batch_size is None:
            return free
        version = self.engine.get_version()
        if self._base_version is None:
            self._base_version = version
        budget = (self.config.max_head_offpolicyness + version - self._base_version + 1) * self.batch_size
        return min(free, budget - self._accepted - self._running_queued)

    def schedule(self) -> None:
        """Start every episode the bounds allow. Runs on the loop; call it after any change."""
        if self.engine.paused:
            return
        loop = asyncio.get_running_loop()
        with self._lock:
            limit = self._concurrency_limit()
            while self._sync and (not limit or len(self._tasks) < limit):
                self._start(loop, self._sync.popleft())
            while self._queued and self._capacity() > 0:
                self._running_queued += 1
                self._start(loop, self._queued.popleft())

    def _start(self, loop: asyncio.AbstractEventLoop, episode: _Episode) -> None:
        task = loop.create_task(self._run(episode))
        self._tasks.add(task)

    async def _run(self, episode: _Episode) -> None:
        try:
            traj = await episode.workflow.arun_episode(self.engine, episode.data)
            if traj is not None and episode.should_accept is not None and not episode.should_accept(traj):
                traj = None
            error = None
        except asyncio.CancelledError:
            if episode.ticket is not None:
                episode.ticket.cancel()  # a rollout_batch waiting on it fails instead of hanging
            raise
        except Exception as e:  # reported to the consumer, never swallowed
            traj, error = None, e
        finally:
            self._tasks.discard(asyncio.current_task())  # type: ignore[arg-type]
        with self._lock:
            self.stats["failed" if error else ("accepted" if traj is not None else "rejected")] += 1
            if episode.ticket is not None:
                if episode.ticket.done():
                    pass
                elif error is not None:
                    episode.ticket.set_exception(error)
                else:
                    episode.ticket.set_result(traj)
            else:
                self._running_queued -= 1
                if error is not None and self._error is None:
                    self._error = RolloutWorkflowError(
                        f"workflow {type(episode.workflow).__name__} failed on data id={episode.data.get('id')!r}: {error}"
                    )
                    self._error.__cause__ = error
                elif traj is not None:
                    self._accepted += 1
                    self._ready.append((episode, traj, _oldest_version(traj)))
            self._lock.notify_all()
        self.schedule()

    async def acancel_all(self) -> None:
        """Cancel running episodes and fail the waiting rollout_batch calls (engine shutdown)."""
        with self._lock:
            waiting, self._sync = list(self._sync), deque()
        for episode in waiting:
            if episode.ticket is not None:
                episode.ticket.cancel()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # ---- the asynchronous queue (caller's thread) ---------------------------------------

    def submit(self, data: dict[str, Any], workflow: Any, should_accept: Callable[[Trajectory], bool] | None = None) -> None:
        """Queue one episode; it starts as soon as the staleness and concurrency bounds allow."""
        if not hasattr(workflow, "arun_episode"):
            raise TypeError(f"workflow {workflow!r} has no arun_episode(engine, data); subclass RolloutWorkflow")
        with self._lock:
            self._queued.append(_Episode(dict(data), workflow, should_accept))
            self.stats["submitted"] += 1
        self.engine.loop.call_soon(self.schedule)

    def _pop_stale(self) -> None:
        """Re-queue ready trajectories that fell more than k versions behind (lock held)."""
        bound = self.engine.get_version() - self.config.max_head_offpolicyness
        fresh = deque()
        for item in self._ready:
            oldest = item[2]
            if oldest is not None and oldest < bound:
                self._accepted -= 1
                self._queued.appendleft(item[0])
                self.stats["stale_requeued"] += 1
            else:
                fresh.append(item)
        if len(fresh) != len(self._ready):
            self._ready = fresh
            self.engine.loop.call_soon(self.schedule)

    def wait(self, count: int, timeout: float | None = None) -> Trajectory:
        """Block until `count` accepted trajectories are ready; return them stacked and padded.

        Raises TimeoutError after `timeout` seconds (the trajectories stay queued), or
        RolloutWorkflowError if a workflow failed.
        """
        if count < 1:
            raise ValueError(f"wait(count={count}): count must be >= 1")
        if self.batch_size is None:
            self.batch_size = count
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while True:
                if self._error is not None:
                    error, self._error = self._error, None
                    raise error
                if len(self._ready) >= count:
                    self._pop_stale()  # only when about to return: it scans every ready trajectory
                if len(self._ready) >= count:
                    taken = [self._ready.popleft()[1] for _ in range(count)]
                    break
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError(f"wait(count={count}) timed out after {timeout}s with {len(self._ready)} ready")
                self._lock.wait(remaining if remaining is not None else 1.0)
        return concat_padded(taken)

    def prepare_batch(
        self, dataloader: Any, workflow: Any, should_accept: Callable[[Trajectory], bool] | None = None
    ) -> Trajectory:
        """The next batch of `dataloader.batch_size` trajectories, generated asynchronously.

        Keeps the loader's iterator between calls (a new epoch starts when it runs out) and
        keeps enough data queued that the staleness bound, not the data, limits generation.
        """
        batch_size = getattr(dataloader, "batch_size", None) or self.batch_size
        if not batch_size:
            raise ValueError("prepare_batch needs a dataloader with a batch_size (or rollout.consumer_batch_size)")
        if self.batch_size is None:
            self.batch_size = batch_size
        if dataloader is not self._dataloader:
            self._dataloader, self._data_iter = dataloader, iter(dataloader)
        while True:
            while self._wants_data():
                for record in self._next_records():
                    self.submit(record, workflow, should_accept)
            try:
                return self.wait(self.batch_size, timeout=_WAIT_SLICE)
            except TimeoutError:
                continue

    def _wants_data(self) -> bool:
        """Whether the queue holds less than what may start now plus one batch in reserve."""
        with self._lock:
            return len(self._queued) < max(0, self._capacity()) + (self.batch_size or 1)

    def _next_records(self) -> list[dict[str, Any]]:
        try:
            return _as_records(next(self._data_iter))
        except StopIteration:
            self._data_iter = iter(self._dataloader)
            try:
                return _as_records(next(self._data_iter))
            except StopIteration:
                raise ValueError("prepare_batch got an empty dataloader") from None

    # ---- synchronous batches ------------------------------------------------------------

    def rollout_batch(
        self, data: list[dict[str, Any]], workflow: Any, should_accept: Callable[[Trajectory], bool] | None = None
    ) -> Trajectory:
        """Run one episode per item now; return the accepted trajectories in input order."""
        if not data:
            raise ValueError("rollout_batch got no data; pass a non-empty list of records")
        return self.engine.loop.run(self._arollout_batch(_as_records(data), workflow, should_accept))

    async def _arollout_batch(
        self, data: list[dict[str, Any]], workflow: Any, should_accept: Callable[[Trajectory], bool] | None
    ) -> Trajectory:
        loop = asyncio.get_running_loop()
        tickets = []
        with self._lock:
            for record in data:
                episode = _Episode(dict(record), workflow, should_accept, ticket=loop.create_future())
                self._sync.append(episode)
                tickets.append(episode.ticket)
                self.stats["submitted"] += 1
        self.schedule()
        try:
            results = await asyncio.gather(*tickets)
        except Exception as e:
            raise RolloutWorkflowError(f"workflow {type(workflow).__name__} failed in rollout_batch: {e}") from e
        accepted = [traj for traj in results if traj is not None]
        if not accepted:
            raise RolloutWorkflowError(f"rollout_batch: all {len(data)} episodes were rejected; nothing to return")
        return concat_padded(accepted)
