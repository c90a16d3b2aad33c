"""`VersionGate`: the rollout client's weight version, LoRA adapter and pause state.

Shared by the parts of the client: generation stamps tokens with the version and waits out a
pause before resubmitting; the executor bounds staleness by the version and starts nothing
while paused; health probes of servers in rotation stop while paused. The version is read
from the trainer's thread too, hence the lock; the pause event lives on the event loop.
"""

from __future__ import annotations

import asyncio
import threading


class VersionGate:
    """Version (thread-safe), LoRA adapter name and paused/unpaused state of the client."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._version = 0
        self._lora_name: str | None = None  # the adapter every /generate asks for (weight_update=lora)
        self.paused = False
        self._unpaused: asyncio.Event | None = None

    def open(self) -> None:
        """Create the pause event on the running event loop (the client's initialize)."""
        self._unpaused = asyncio.Event()
        self._unpaused.set()

    @property
    def version(self) -> int:
        with self._lock:
            return self._version

    @version.setter
    def version(self, version: int) -> None:
        with self._lock:
            self._version = int(version)

    @property
    def lora_name(self) -> str | None:
        with self._lock:
            return self._lora_name

    @lora_name.setter
    def lora_name(self, name: str | None) -> None:
        with self._lock:
            self._lora_name = name or None

    def pause(self) -> None:
        """On the loop: new submissions and resubmissions wait until `unpause`."""
        self.paused = True
        if self._unpaused is not None:
            self._unpaused.clear()

    def unpause(self) -> None:
        self.paused = False
        if self._unpaused is not None:
            self._unpaused.set()

    async def wait_unpaused(self) -> None:
        if self._unpaused is None:
            raise RuntimeError("the rollout client is not initialized; call initialize() or use it in a with block")
        await self._unpaused.wait()
