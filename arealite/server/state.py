"""What the HTTP handlers share: the model, tokenizer, scheduler, and the pause/update gate.

`Gate` is SGLang's pause flag plus its model-update read/write lock (docs/protocol.md §2.5, §3.1) in one
asyncio condition, so "not paused and no update pending" is checked and a reader counted
atomically: a generate call holds a read slot from submission until it is answered; a
weight update takes the write slot (waiting for in-flight requests; new ones queue behind
it, writer preference) unless the server is paused, in which case it runs at once (0.5.6+).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from arealite.server.limits import RequestLimits
from arealite.server.model_runner import ModelRunner
from arealite.server.scheduler import Scheduler


class Gate:
    def __init__(self) -> None:
        self.cond = asyncio.Condition()
        self.paused = False
        self.readers = 0
        self.writer = False
        self.writers_waiting = 0

    async def enter(self) -> None:
        """Wait until not paused and no update is pending or running, then count a reader."""
        async with self.cond:
            await self.cond.wait_for(lambda: not self.paused and not self.writer and self.writers_waiting == 0)
            self.readers += 1

    async def leave(self) -> None:
        async with self.cond:
            self.readers -= 1
            self.cond.notify_all()

    async def set_paused(self, paused: bool) -> None:
        async with self.cond:
            self.paused = paused
            self.cond.notify_all()

    async def wait_drained(self, timeout: float) -> bool:
        """True once no generate call is in flight; False after `timeout` seconds."""
        async with self.cond:
            try:
                await asyncio.wait_for(self.cond.wait_for(lambda: self.readers == 0), timeout)
                return True
            except asyncio.TimeoutError:
                return False

    async def acquire_update(self) -> bool:
        """Take the write slot; returns False (nothing taken) when paused, where updates skip the lock."""
        async with self.cond:
            if self.paused:
                return False
            self.writers_waiting += 1
            try:
                await self.cond.wait_for(lambda: not self.writer and self.readers == 0)
            finally:
                self.writers_waiting -= 1
            self.writer = True
            return True

    async def release_update(self) -> None:
        async with self.cond:
            self.writer = False
            self.cond.notify_all()


@dataclass
class ServerState:
    args: object  # the parsed CLI namespace (cli.py)
    runner: ModelRunner
    tokenizer: object
    scheduler: Scheduler
    context_len: int
    model_path: str
    served_model_name: str
    weight_version: str
    seed_source: object  # torch.Generator drawing per-request seeds
    limits: RequestLimits = field(default_factory=RequestLimits)
    gate: Gate = field(default_factory=Gate)
    ready: bool = False
    active_rids: set[str] = field(default_factory=set)
    started_at: float = field(default_factory=time.time)
    pause_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def set_weight_version(self, version: str) -> None:
        self.weight_version = version
        self.scheduler.weight_version = version

    def next_seed(self) -> int:
        import torch

        return int(torch.randint(0, 2**62, (1,), generator=self.seed_source).item())

    async def run_blocking(self, fn, *args):
        """Run blocking work (weight loading, collective receives) off the event loop."""
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)
