"""`MicroBatcher`: concurrent single-item calls coalesced into batched ones, with a deadline.

A workflow scores one sample at a time, and many episodes run at once; a reward model is
fastest on batches. `await batcher.submit(item)` queues the item; a batch goes out when
`max_batch_size` items wait or `max_wait` seconds after the first one, with at most
`max_concurrency` batches in flight. `run(items)` returns one result per item, where a
result may be an exception (that item failed alone). A batch that overruns `timeout`, or
whose `run` raises, fails every item in it with `RewardTimeout` / `RewardError`.

One batcher serves one event loop (the futures belong to it); `per_loop` keeps one per loop.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from arealite.reward.pool import RewardError, RewardTimeout

BatchFn = Callable[[list[Any]], Awaitable[Sequence[Any]]]


class MicroBatcher:
    """Coalesces `submit` calls into `run` calls on batches (see the module docstring)."""

    def __init__(
        self, run: BatchFn, max_batch_size: int, max_wait: float, max_concurrency: int, timeout: float, name: str
    ) -> None:
        if max_batch_size < 1 or max_concurrency < 1 or max_wait < 0 or timeout <= 0:
            raise ValueError(
                f"{name}: max_batch_size={max_batch_size} and max_concurrency={max_concurrency} must be >= 1, "
                f"max_wait={max_wait} >= 0 and timeout={timeout} > 0"
            )
        self._run = run
        self.max_batch_size = max_batch_size
        self.max_wait = max_wait
        self.timeout = timeout
        self.name = name
        self._slots = asyncio.Semaphore(max_concurrency)
        self._pending: list[tuple[Any, asyncio.Future]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task] = set()
        self.batches = 0  # batched calls made (tests and stats read it)

    async def submit(self, item: Any) -> Any:
        """The result for `item`; raises RewardError (RewardTimeout) when it failed."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._pending.append((item, future))
        if len(self._pending) >= self.max_batch_size:
            self._flush()
        elif self._timer is None:
            self._timer = loop.call_later(self.max_wait, self._flush)
        return await future

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._pending:
            batch, self._pending = self._pending[: self.max_batch_size], self._pending[self.max_batch_size :]
            task = asyncio.get_running_loop().create_task(self._send(batch))
            self._tasks.add(task)  # keep a reference until done (the loop holds only weak ones)
            task.add_done_callback(self._tasks.discard)

    async def _send(self, batch: list[tuple[Any, asyncio.Future]]) -> None:
        items = [item for item, _ in batch]
        async with self._slots:
            self.batches += 1
            try:
                results = await asyncio.wait_for(self._run(items), self.timeout)
                if len(results) != len(items):
                    raise RewardError(f"{self.name} returned {len(results)} results for {len(items)} items")
            except asyncio.TimeoutError:
                error = RewardTimeout(f"{self.name}: a batch of {len(items)} took longer than {self.timeout}s")
                results = [error] * len(items)
            except Exception as e:  # every item of the batch fails with the cause
                wrapped = e if isinstance(e, RewardError) else RewardError(f"{self.name}: {type(e).__name__}: {e}")
                results = [wrapped] * len(items)
        for (_, future), result in zip(batch, results):
            if future.done():  # its caller was cancelled
                continue
            if isinstance(result, BaseException):
                future.set_exception(result if isinstance(result, RewardError) else RewardError(str(result)))
            else:
                future.set_result(result)


def per_loop(cache: weakref.WeakKeyDictionary, make: Callable[[], Any]) -> Any:
    """`cache`'s object for the running event loop, made on first use (one per loop)."""
    loop = asyncio.get_running_loop()
    found = cache.get(loop)
    if found is None:
        found = cache[loop] = make()
    return found
