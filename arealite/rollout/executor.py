"""`WorkflowExecutor`: runs rollout workflows on the engine's event loop under a staleness bound.

`submit` + `wait` / `prepare_batch`: episodes start as the staleness budget allows
(staleness.py), and a finished trajectory whose oldest token is more than k versions behind is
re-queued (`stats["stale_requeued"]`); k = 0 is synchronous. `rollout_batch(data)`: these
items now, in input order, outside the budget. A workflow's error is raised by the next
`wait`/`rollout_batch`/`prepare_batch`; a wait without progress for `rollout.stall_timeout`
logs why and raises after twice that (watchdog.py). The episode records and the dataloader's
record stream are in episode.py.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from arealite.config import InferenceEngineConfig
from arealite.interfaces import AcceptFn, Batch, GenerationEngine, RolloutWorkflow, Trajectory
from arealite.rollout.batch import concat_padded
from arealite.rollout.episode import Episode, Ready, RecordStream, RolloutWorkflowError, as_records, oldest_version
from arealite.rollout.gate import VersionGate
from arealite.rollout.loop import EventLoopThread
from arealite.rollout.staleness import StalenessBudget
from arealite.rollout.watchdog import RolloutStalledError, Watchdog, report_stall

_WAIT_SLICE = 0.5  # seconds prepare_batch waits before topping up the queue again
_POLL_S = 1.0  # longest a waiting call sleeps between looks at its state


class WorkflowExecutor:
    """Schedules workflow episodes. See the module docstring.

    `engine` is what the workflows generate with (the rollout client, as a GenerationEngine);
    `gate` holds the version and pause state the bounds read; `diagnose(snapshot, idle)` writes
    the stall diagnostic (watchdog.Diagnosis).
    """

    def __init__(
        self,
        config: InferenceEngineConfig,
        gate: VersionGate,
        loop: EventLoopThread,
        engine: GenerationEngine,
        diagnose: Callable[[dict[str, Any], float], Awaitable[str]],
    ) -> None:
        self.config = config
        self.engine = engine
        self._gate = gate
        self._loop = loop
        self._diagnose = diagnose
        self.budget = StalenessBudget(config.max_head_offpolicyness, config.consumer_batch_size)
        self._lock = threading.Condition()
        self._queued: deque[Episode] = deque()  # submitted, waiting for capacity
        self._ready: deque[Ready] = deque()  # accepted, waiting for `wait`
        self._sync: deque[Episode] = deque()  # rollout_batch episodes, waiting for concurrency
        self._tasks: dict[asyncio.Task, Episode] = {}  # running episodes
        # the loop a `schedule` call from `submit` is on its way to (a loop of an earlier
        # initialize never ran it: compared by identity, it posts again)
        self._schedule_posted_to: asyncio.AbstractEventLoop | None = None
        self.watchdog = Watchdog(config.stall_timeout)
        self._failure: BaseException | None = None  # the next wait / rollout_batch raises it
        self._records: RecordStream | None = None  # prepare_batch's dataloader, read on between calls
        self.stats: dict[str, int] = {"submitted": 0, "accepted": 0, "rejected": 0, "stale_requeued": 0, "failed": 0}

    @property
    def batch_size(self) -> int | None:
        return self.budget.batch_size

    @batch_size.setter
    def batch_size(self, value: int | None) -> None:
        self.budget.batch_size = value

    # ---- capacity (event loop thread) ----------------------------------------------------

    def _concurrency_limit(self) -> int | None:
        return self.config.max_concurrent_rollouts or self.batch_size

    def _capacity(self) -> int:
        limit = self._concurrency_limit()
        free = (limit - len(self._tasks)) if limit else 1 << 30
        return min(free, self.budget.room(self._gate.version))

    def schedule(self) -> None:
        """Start every episode the bounds allow. Runs on the loop; call it after any change."""
        loop = asyncio.get_running_loop()
        with self._lock:
            self._schedule_posted_to = None  # a submit from now on posts another call
            if self._gate.paused:
                return
            limit = self._concurrency_limit()
            while self._sync and (not limit or len(self._tasks) < limit):
                self._start(loop, self._sync.popleft())
            while self._queued and self._capacity() > 0:
                self.budget.start()
                self._start(loop, self._queued.popleft())

    def _start(self, loop: asyncio.AbstractEventLoop, episode: Episode) -> None:
        episode.started = time.monotonic()
        self._tasks[loop.create_task(self._run(episode))] = episode
        self.watchdog.progress()

    async def _run(self, episode: Episode) -> None:
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
            self._tasks.pop(asyncio.current_task(), None)  # type: ignore[arg-type]
            self.watchdog.progress()
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
                self.budget.finish(accepted=traj is not None)
                if error is not None:
                    failure = RolloutWorkflowError(
                        f"workflow {type(episode.workflow).__name__} failed on data id={episode.data.get('id')!r}: "
                        f"{error}"
                    )
                    failure.__cause__ = error
                    self._failure = self._failure or failure
                elif traj is not None:
                    self._ready.append(Ready(episode, traj, oldest_version(traj)))
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

    def submit(self, data: dict[str, Any], workflow: RolloutWorkflow, should_accept: AcceptFn | None = None) -> None:
        """Queue one episode; it starts as soon as the staleness and concurrency bounds allow."""
        if not hasattr(workflow, "arun_episode"):
            raise TypeError(f"workflow {workflow!r} has no arun_episode(engine, data); subclass RolloutWorkflow")
        loop = self._loop.loop  # raises if the client is not initialized
        with self._lock:
            self._queued.append(Episode(dict(data), workflow, should_accept))
            self.stats["submitted"] += 1
            posted, self._schedule_posted_to = self._schedule_posted_to is loop, loop
        if not posted:  # one wake-up of the loop (a thread-safe call) per burst of submits, not one each
            loop.call_soon_threadsafe(self.schedule)

    def _pop_stale(self) -> None:
        """Re-queue ready trajectories that fell more than k versions behind (lock held)."""
        version = self._gate.version
        fresh = deque()
        for item in self._ready:
            if self.budget.is_stale(item.oldest, version):
                self.budget.requeue()
                self._queued.appendleft(item.episode)
                self.stats["stale_requeued"] += 1
            else:
                fresh.append(item)
        if len(fresh) != len(self._ready):
            self._ready = fresh
            self._loop.call_soon(self.schedule)

    def report(self, error: BaseException) -> None:
        """Have the consumer's next (or current) `wait` / `rollout_batch` raise `error`: a
        failure of a call nobody waits on (`resume(wait=False)`). The first failure wins."""
        with self._lock:
            if self._failure is None:
                self._failure = error
            self._lock.notify_all()

    def _take_failure(self) -> BaseException | None:
        """(lock held) The first failure (reported, or a queued workflow's), once."""
        error, self._failure = self._failure, None
        return error

    def wait(self, count: int, timeout: float | None = None) -> Batch:
        """Block until `count` accepted trajectories are ready; return them stacked and padded.

        Raises TimeoutError after `timeout` seconds (the trajectories stay queued),
        RolloutWorkflowError if a workflow failed, or RolloutStalledError when nothing
        progressed for twice rollout.stall_timeout.
        """
        return self._wait(count, timeout, time.monotonic())

    def _wait(self, count: int, timeout: float | None, waiting_since: float) -> Batch:
        if count < 1:
            raise ValueError(f"wait(count={count}): count must be >= 1")
        if self.batch_size is None:
            self.batch_size = count
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:  # the watchdog's diagnostic needs the loop, which needs this lock: check outside it
                taken = self._take_ready(count, deadline, self.watchdog.due(waiting_since), timeout)
            if taken is not None:
                return concat_padded(taken)
            self._check_stall(waiting_since)

    def _take_ready(self, count: int, deadline: float, wake: float, timeout: float | None) -> list[Trajectory] | None:
        """(lock held) `count` ready trajectories, or None once `wake` (a watchdog check) is due."""
        while True:
            failure = self._take_failure()
            if failure is not None:
                raise failure
            if len(self._ready) >= count:
                self._pop_stale()  # only when about to return: it scans every ready trajectory
            if len(self._ready) >= count:
                return [self._ready.popleft().trajectory for _ in range(count)]
            now = time.monotonic()
            if now >= deadline:
                raise TimeoutError(f"wait(count={count}) timed out after {timeout}s with {len(self._ready)} ready")
            if now >= wake:
                return None
            self._lock.wait(min(deadline, wake, now + _POLL_S) - now)

    # ---- the no-progress watchdog -----------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """Queue sizes, the staleness budget's terms and the oldest running episode (diagnostics)."""
        with self._lock:
            limit = self._concurrency_limit()
            free = (limit - len(self._tasks)) if limit else None
            version = self._gate.version
            base = version if self.budget.base_version is None else self.budget.base_version
            oldest = min(self._tasks.values(), key=lambda e: e.started, default=None)
            return {
                "queued": len(self._queued), "sync_waiting": len(self._sync), "running": len(self._tasks),
                "ready": len(self._ready), "free": "unbounded" if free is None else free, "version": version,
                "base": base, "k": self.config.max_head_offpolicyness, "batch_size": self.batch_size,
                "accepted": self.budget.accepted, "running_queued": self.budget.running,
                "capacity": self._capacity() if self.batch_size is not None else None,
                "oldest": None if oldest is None else (
                    oldest.data.get("id"), type(oldest.workflow).__name__, time.monotonic() - oldest.started),
            }  # fmt: skip

    def _check_stall(self, waiting_since: float) -> None:
        """From a caller's thread: log or raise the diagnostic when the watchdog says so."""
        verdict = self.watchdog.verdict(waiting_since)
        if verdict is None:
            return
        snapshot, idle = self.snapshot(), self.watchdog.idle(waiting_since)
        try:
            text = self._loop.run(self._diagnose(snapshot, idle), timeout=self.config.health_check_timeout + 5)
        except Exception as e:
            text = (
                f"rollout made no progress for {idle:.0f}s (rollout.stall_timeout={self.config.stall_timeout}s); "
                f"{snapshot} (server states unavailable: {e!r})"
            )
        report_stall(verdict, text)

    def prepare_batch(self, dataloader: Any, workflow: RolloutWorkflow, should_accept: AcceptFn | None = None) -> Batch:
        """The next batch of `dataloader.batch_size` trajectories, generated asynchronously.

        Keeps the loader's iterator between calls (a new epoch starts when it runs out) and
        keeps enough data queued that the staleness bound, not the data, limits generation.
        """
        batch_size = getattr(dataloader, "batch_size", None) or self.batch_size
        if not batch_size:
            raise ValueError("prepare_batch needs a dataloader with a batch_size (or rollout.consumer_batch_size)")
        if self.batch_size is None:
            self.batch_size = batch_size
        if self._records is None or dataloader is not self._records.dataloader:
            self._records = RecordStream(dataloader)
        waiting_since = time.monotonic()
        while True:
            while self._wants_data():
                for record in self._records.next_records():
                    self.submit(record, workflow, should_accept)
            try:
                return self._wait(self.batch_size, _WAIT_SLICE, waiting_since)
            except TimeoutError:
                continue

    def _wants_data(self) -> bool:
        """Whether the queue holds less than what may start now plus one batch in reserve."""
        with self._lock:
            return len(self._queued) < max(0, self._capacity()) + (self.batch_size or 1)

    # ---- synchronous batches ------------------------------------------------------------

    def rollout_batch(
        self, data: list[dict[str, Any]], workflow: RolloutWorkflow, should_accept: AcceptFn | None = None
    ) -> Batch:
        """Run one episode per item now; return the accepted trajectories in input order."""
        if not data:
            raise ValueError("rollout_batch got no data; pass a non-empty list of records")
        return self._loop.run(self._arollout_batch(as_records(data), workflow, should_accept))

    def submit_batch(
        self, data: list[dict[str, Any]], workflow: RolloutWorkflow, should_accept: AcceptFn | None = None
    ) -> concurrent.futures.Future:
        """`rollout_batch` without waiting: a future of the batch (rollout/lockstep.py)."""
        if not data:
            raise ValueError("submit_batch got no data; pass a non-empty list of records")
        return self._loop.submit(self._arollout_batch(as_records(data), workflow, should_accept))

    async def _arollout_batch(
        self, data: list[dict[str, Any]], workflow: RolloutWorkflow, should_accept: AcceptFn | None
    ) -> Batch:
        loop = asyncio.get_running_loop()
        tickets = []
        with self._lock:
            for record in data:
                episode = Episode(dict(record), workflow, should_accept, ticket=loop.create_future())
                self._sync.append(episode)
                tickets.append(episode.ticket)
                self.stats["submitted"] += 1
        self.schedule()
        waiting_since = time.monotonic()
        failure: BaseException | None = None
        pending = set(tickets)
        try:
            while True:
                wake = min(self.watchdog.due(waiting_since), time.monotonic() + _POLL_S)
                timeout = max(0.0, wake - time.monotonic())
                done, pending = await asyncio.wait(pending, timeout=timeout, return_when=asyncio.FIRST_EXCEPTION)
                if not pending or any(t.cancelled() or t.exception() is not None for t in done):
                    break  # all done, or one failed: gather below raises it
                with self._lock:
                    failure = self._take_failure()
                if failure is not None:  # e.g. a server refused to resume: these episodes would never start
                    await self._adrop(tickets)
                    break
                await self._acheck_stall(waiting_since, tickets)
            results = [] if failure is not None else await asyncio.gather(*tickets)
        except RolloutStalledError:
            raise
        except Exception as e:
            raise RolloutWorkflowError(f"workflow {type(workflow).__name__} failed in rollout_batch: {e}") from e
        if failure is not None:
            raise failure
        accepted = [traj for traj in results if traj is not None]
        if not accepted:
            raise RolloutWorkflowError(f"rollout_batch: all {len(data)} episodes were rejected; nothing to return")
        return concat_padded(accepted)

    async def _acheck_stall(self, waiting_since: float, tickets: list[asyncio.Future]) -> None:
        """On the loop: log or raise the diagnostic; on raising, cancel this call's episodes."""
        verdict = self.watchdog.verdict(waiting_since)
        if verdict is None:
            return
        text = await self._diagnose(self.snapshot(), self.watchdog.idle(waiting_since))
        if verdict == "raise":
            await self._adrop(tickets)
        report_stall(verdict, text)

    async def _adrop(self, tickets: list[asyncio.Future]) -> None:
        """Cancel a failing rollout_batch call's episodes, queued or running."""
        mine = set(tickets)
        with self._lock:
            self._sync = deque(e for e in self._sync if e.ticket not in mine)
        ours = [task for task, episode in self._tasks.items() if episode.ticket in mine]
        for task in ours:
            task.cancel()
        await asyncio.gather(*ours, return_exceptions=True)
