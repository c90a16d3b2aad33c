"""`DataFeed`: the dataloader as the rollout side sees it, remembering which prompts are out.

The asynchronous executor pulls prompts ahead of training, so a dataloader position alone
cannot say which prompts a checkpoint has trained. The feed hands out the loader's batches,
each record numbered (`prompt_index`; `arealite.rollout.step_batches.TaggedWorkflow` copies it
onto the record's trajectory), and `consume(batch)` retires the prompts of a trained batch.
Its `state_dict()` holds the loader's position plus the prompts handed out but not yet
trained; after `load_state_dict` those are handed out again first, so a recovered run trains
every prompt exactly once. A prompt whose group a filter drops (`drop`, asynchronous dynamic
sampling) is retired like a trained one (it was used; it is not retried after a recovery); a
group the workflow itself rejects (a failed reward) stays pending.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from arealite import world

INDEX_KEY = "prompt_index"  # per-record int, per-sequence [B] tensor: which handed-out prompt a row came from


def gather_prompt_ids(records: list[dict[str, Any]]) -> list[str]:
    """The `id`s of every rank's prompts of this step, in rank order; collective."""
    ids = [str(r.get("id", "")) for r in records]
    if not (world.is_initialized() and world.world_size() > 1):
        return ids
    gathered: list[list[str] | None] = [None] * world.world_size()
    dist.all_gather_object(gathered, ids)
    return [i for part in gathered for i in (part or [])]


class DataFeed:
    """Wraps a (stateful) dataloader of record lists; iterable like it (one epoch per `iter`)."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader
        self.batch_size = loader.batch_size
        self._out: dict[int, dict[str, Any]] = {}  # handed out, not yet trained (insertion order)
        self._replay: list[dict[str, Any]] = []
        self._next_index = 0
        self._dropped: queue.SimpleQueue[int] = queue.SimpleQueue()  # filtered out on the rollout thread
        self.dropped_groups = 0  # groups the filter dropped so far

    def __iter__(self) -> Iterator[list[dict[str, Any]]]:
        while self._replay:
            chunk, self._replay = self._replay[: self.batch_size], self._replay[self.batch_size :]
            yield self._hand_out(chunk)
        for batch in self.loader:
            yield self._hand_out(list(batch))

    def _hand_out(self, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for r in records:
            r = {**r, INDEX_KEY: self._next_index}
            self._out[self._next_index] = r
            self._next_index += 1
            out.append(r)
        return out

    def drop(self, index: int) -> None:
        """Retire a handed-out prompt whose group was filtered out; safe from any thread."""
        self._dropped.put(index)

    def _retire_dropped(self) -> None:
        while True:
            try:
                index = self._dropped.get_nowait()
            except queue.Empty:
                return
            if self._out.pop(index, None) is not None:
                self.dropped_groups += 1

    def consume(self, batch: dict[str, torch.Tensor] | None = None) -> list[str]:
        """Retire the prompts of a trained batch (all handed-out ones when `batch` is None, the
        synchronous case); returns every rank's retired prompt ids. Collective."""
        self._retire_dropped()
        if batch is None:
            done = list(self._out)
        else:
            done = sorted(set(batch[INDEX_KEY].tolist()), key=lambda i: i)
        retired = [self._out.pop(i) for i in done if i in self._out]
        return gather_prompt_ids(retired)

    def state_dict(self) -> dict[str, Any]:
        self._retire_dropped()
        pending = [{k: v for k, v in r.items() if k != INDEX_KEY} for r in self._out.values()]
        return {"loader": self.loader.state_dict(), "pending": pending}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loader.load_state_dict(state["loader"])
        self._replay = list(state["pending"])
        self._out.clear()
