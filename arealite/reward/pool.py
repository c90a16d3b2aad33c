"""Reward functions run in a process pool, with a timeout.

math-verify (and other checkers) use `signal.alarm`, which only works in a process's main
thread, and a pathological answer can make a checker hang. So rewards run in worker
processes ("spawn": safe next to the rollout threads), and each call gets a deadline: a call
that overruns raises RewardTimeout and its pool is replaced (killing the stuck worker).
A reward function that raises surfaces as RewardError. Callers count both and decide;
neither is ever turned into a 0 here.

A reward function must be picklable: a module-level function, not a lambda or closure.
spawn imports the parent's main module in every worker (a function defined there is pickled as
a reference to `__main__`): for a training script, torch and transformers, seconds of CPU and a
few hundred MB per worker. So workers start without it, and the pool moves to workers that
import it the first time it is given a function that needs it.
Workers die with the process that started them, also when it is SIGKILLed: each watches its
parent and exits once it is gone (so the resource tracker, held open by the workers, ends too).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import multiprocessing
import multiprocessing.context
import multiprocessing.spawn
import os
import pickle
import threading
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from arealite.utils.parent_watch import watch_parent


class RewardError(RuntimeError):
    """The reward function raised (the cause is chained)."""


class RewardTimeout(RewardError):
    """The reward function did not return within the pool's timeout."""


def _call(fn: Callable[..., float], args: tuple, kwargs: dict[str, Any]) -> float:
    value = float(fn(*args, **kwargs))
    if not math.isfinite(value):  # a NaN/inf score would poison group-normalised advantages
        raise ValueError(f"reward returned {value}; a reward must be a finite float")
    return value


def _worker_init(parent: int) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # a reward never needs torch threads
    watch_parent(parent, lambda: os._exit(1))


def _ready() -> int:
    return os.getpid()


LEAN_WORKER = "arealite-reward-worker"  # names the processes started without the main module


def _preparation_data(name: str) -> dict[str, Any]:
    data = _spawn_preparation_data(name)
    if name.startswith(LEAN_WORKER):
        data.pop("init_main_from_path", None)
        data.pop("init_main_from_name", None)
    return data


_spawn_preparation_data = getattr(
    multiprocessing.spawn.get_preparation_data, "arealite_wrapped", multiprocessing.spawn.get_preparation_data
)
_preparation_data.arealite_wrapped = _spawn_preparation_data  # type: ignore[attr-defined]
multiprocessing.spawn.get_preparation_data = _preparation_data  # what spawn asks for each new process


class _LeanProcess(multiprocessing.context.SpawnProcess):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.name = f"{LEAN_WORKER}-{self.name}"


class _LeanContext(multiprocessing.context.SpawnContext):
    """spawn, for workers that do not import the parent's main module."""

    Process = _LeanProcess


def needs_main(fn: Callable[..., float]) -> bool:
    """Whether unpickling `fn` refers to the parent's main module (its code is defined there).
    An unpicklable `fn` is left to the call, which reports it as a RewardError."""
    try:
        return b"__main__" in pickle.dumps(fn)
    except Exception:
        return False


def check_picklable(fn: Callable[..., float]) -> None:
    """Fail early, naming the fix, if `fn` cannot be sent to a worker process."""
    try:
        pickle.dumps(fn)
    except Exception as e:
        raise TypeError(
            f"reward function {fn!r} cannot be sent to a worker process ({e}); define it at module level"
        ) from e


class RewardPool:
    """A lazily started pool of `max_workers` processes that score with a per-call timeout."""

    def __init__(self, max_workers: int = 2, timeout: float = 15.0, startup_timeout: float = 300.0) -> None:
        if max_workers < 1:
            raise ValueError(f"RewardPool(max_workers={max_workers}) needs at least one worker")
        if timeout <= 0:
            raise ValueError(f"RewardPool(timeout={timeout}) must be > 0 seconds")
        self.max_workers = max_workers
        self.timeout = timeout
        self.startup_timeout = startup_timeout
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._warm: dict[int, list[concurrent.futures.Future]] = {}  # id(pool) -> one start-up probe a worker
        self._lock = threading.Lock()
        self.with_main = False  # whether the workers import the parent's main module
        self._lean_fn: Callable[..., float] | None = None  # the last function found not to need it

    def _executor(self, fn: Callable[..., float]) -> concurrent.futures.ProcessPoolExecutor:
        with_main = self.with_main
        if not with_main and fn is not self._lean_fn:  # pickled once per function, not per call
            with_main = needs_main(fn)
            if not with_main:
                self._lean_fn = fn
        with self._lock:
            if with_main and not self.with_main:  # from now on, workers that can unpickle it
                self.with_main = True
                lean, self._pool = self._pool, None
                if lean is not None:
                    self._warm.pop(id(lean), None)
                    lean.shutdown(wait=False)  # its calls in flight finish there
            if self._pool is None:
                self._pool = concurrent.futures.ProcessPoolExecutor(
                    self.max_workers,
                    mp_context=multiprocessing.get_context("spawn") if self.with_main else _LeanContext(),
                    initializer=_worker_init,
                    initargs=(os.getpid(),),
                )
            return self._pool

    def _replace(self, broken: concurrent.futures.ProcessPoolExecutor) -> bool:
        """Kill a pool with a stuck worker; the next call starts a fresh one. False where it was
        already replaced (for another call)."""
        with self._lock:
            if self._pool is not broken:
                return False
            self._pool = None
            self._warm.pop(id(broken), None)
        for process in list(getattr(broken, "_processes", {}).values()):  # no public kill in 3.11
            process.kill()
        broken.shutdown(wait=False, cancel_futures=True)
        return True

    async def _warm_up(self, pool: concurrent.futures.ProcessPoolExecutor) -> None:
        """Wait until every worker has started before timing any call.

        A worker's start (with the parent's main module: often torch and transformers) can
        take longer than a reward's timeout on a loaded machine; counting that start-up
        against the first calls would time them out and replace the pool forever.
        """
        with self._lock:
            ready = self._warm.get(id(pool))
            if ready is None:
                ready = self._warm[id(pool)] = [pool.submit(_ready) for _ in range(self.max_workers)]
        if all(f.done() for f in ready):
            return
        # concurrent futures (not asyncio ones) so that any event loop may wait on them
        done, _ = await asyncio.to_thread(concurrent.futures.wait, ready, self.startup_timeout)
        if len(done) < len(ready):
            self._replace(pool)
            raise RewardError(
                f"reward workers did not start within {self.startup_timeout}s; is the machine overloaded?"
            )
        for f in done:
            f.result()  # surfaces BrokenProcessPool

    async def ascore(self, fn: Callable[..., float], *args: Any, **kwargs: Any) -> float:
        """`fn(*args, **kwargs)` in a worker. Raises RewardTimeout or RewardError."""
        for attempt in range(2):  # a call caught in a pool replaced for another's timeout is retried once
            pool = self._executor(fn)
            try:
                await self._warm_up(pool)
            except BrokenProcessPool:
                self._replace(pool)
                continue
            try:
                future = pool.submit(_call, fn, args, kwargs)
            except (BrokenProcessPool, RuntimeError):
                self._replace(pool)
                continue
            try:
                return await asyncio.wait_for(asyncio.wrap_future(future), self.timeout)
            except asyncio.CancelledError:
                # Cancelled while queued in a pool that another call's timeout replaced: run it
                # again in the new pool. A cancellation of this task itself still propagates.
                task = asyncio.current_task()
                if not future.cancelled() or (task is not None and getattr(task, "cancelling", lambda: 0)()):
                    raise
                continue
            except asyncio.TimeoutError:
                if not self._replace(pool) and attempt == 0:
                    # its pool was killed for another call's timeout while this one waited, and its
                    # clock counted that wait: run it again in the new pool
                    continue
                raise RewardTimeout(f"reward {getattr(fn, '__name__', fn)} took longer than {self.timeout}s") from None
            except BrokenProcessPool:
                self._replace(pool)
                if attempt == 1:
                    raise RewardError(f"reward worker process died running {getattr(fn, '__name__', fn)}") from None
            except Exception as e:
                raise RewardError(f"reward {getattr(fn, '__name__', fn)} raised {type(e).__name__}: {e}") from e
        raise RewardError(f"reward pool could not run {getattr(fn, '__name__', fn)}")

    def score(self, fn: Callable[..., float], *args: Any, **kwargs: Any) -> float:
        """Blocking `ascore`, for use outside an event loop."""
        return asyncio.run(self.ascore(fn, *args, **kwargs))

    def __enter__(self) -> RewardPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the worker processes (waits for the calls in flight)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
