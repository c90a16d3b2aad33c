"""`StepBatches`: the training batch of each step, whatever the rollout mode.

`next_batch()` picks the path from `config.rollout`: synchronous (`rollout_batch` on the next
prompts), asynchronous within the staleness bound (`prepare_batch`), lockstep
(`LockstepRollout`), dynamic sampling (`DynamicSampler`, or its filter on asynchronous runs).
Behind it sits the data feed (`DataFeed`): it remembers which prompts are out, retires those
of each returned batch, and is what a checkpoint saves (`state_dict`), so a recovered run
trains every prompt exactly once (`TaggedWorkflow` marks each trajectory with its prompt for
it). Call `drain()` before each weight sync (lockstep lets its batches in flight finish on the
weights they began with; a no-op otherwise).
"""

from __future__ import annotations

from itertools import chain, repeat
from typing import Any

import torch

from arealite.config import InferenceEngineConfig
from arealite.data.feed import INDEX_KEY, DataFeed
from arealite.interfaces import AcceptFn, Batch, GenerationEngine, RolloutRunner, RolloutWorkflow, Trajectory
from arealite.rollout.dynamic_sampling import DynamicSampler
from arealite.rollout.lockstep import LockstepRollout


class StepBatches:
    """One training batch per `next_batch()`; `stats()` says what it trained and dropped."""

    def __init__(
        self,
        rollout: RolloutRunner,
        loader: Any,
        workflow: RolloutWorkflow,
        config: InferenceEngineConfig,
        group_size: int,
    ) -> None:
        self.rollout = rollout
        self.feed = DataFeed(loader)  # remembers prompts handed out but not yet trained (exact recovery)
        self.asynchronous = config.max_head_offpolicyness > 0
        # dynamic sampling: asynchronous runs filter each finished group, synchronous ones per batch
        self.sampler = DynamicSampler(self.feed, group_size) if config.dynamic_sampling else None
        accept = self.sampler.accept if self.sampler and self.asynchronous else None
        self.workflow = TaggedWorkflow(workflow, self.feed, accept)
        self._prompts = chain.from_iterable(repeat(self.feed))  # synchronous runs' prompts, epoch after epoch
        self.lockstep = None
        if config.schedule == "lockstep":
            self.lockstep = LockstepRollout(rollout, self._prompts, self.workflow, config.max_head_offpolicyness)
        self._prompt_ids: list[str] = []

    def next_batch(self) -> Batch:
        """This step's batch; its prompts count as trained from now on. Collective over trainer ranks."""
        if self.lockstep is not None:  # batch b, made entirely by weights b - k; b + 1 starts now
            batch = self.lockstep.next_batch()
        elif self.asynchronous:  # ahead of training, within the staleness bound
            batch = self.rollout.prepare_batch(self.feed, self.workflow)
        elif self.sampler is not None:  # groups whose rewards differ, from as many prompts as needed
            batch = self.sampler.next_batch(self.rollout, self.workflow)
        else:
            batch = self.rollout.rollout_batch(next(self._prompts), self.workflow)
        # synchronous runs hand out exactly this batch's prompts; the others retire the batch's own
        self._prompt_ids = self.feed.consume(batch if self.asynchronous or self.sampler else None)
        return batch

    def drain(self) -> None:
        """Before a weight sync: lockstep's batches in flight finish on the weights they began with."""
        if self.lockstep is not None:
            self.lockstep.drain()

    def stats(self) -> dict[str, Any]:
        """The last batch's prompt ids (every rank's); with dynamic sampling, this rank's cumulative
        `dropped_groups` and `filler_groups`."""
        out: dict[str, Any] = {"prompt_ids": self._prompt_ids}
        if self.sampler is not None:
            out.update(dropped_groups=self.feed.dropped_groups, filler_groups=self.sampler.filler_groups)
        return out

    def state_dict(self) -> dict[str, Any]:
        return self.feed.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.feed.load_state_dict(state)


class TaggedWorkflow(RolloutWorkflow):
    """Runs the wrapped workflow and adds `prompt_index` [G] to its trajectory (what `feed.consume`
    retires); a trajectory `should_accept` refuses is dropped and its prompt retired (`feed.drop`)."""

    def __init__(self, workflow: RolloutWorkflow, feed: DataFeed, should_accept: AcceptFn | None = None) -> None:
        self.workflow = workflow
        self.feed = feed
        self.should_accept = should_accept

    async def arun_episode(self, engine: GenerationEngine, data: dict[str, Any]) -> Trajectory | None:
        inner = {k: v for k, v in data.items() if k != INDEX_KEY}
        traj = await self.workflow.arun_episode(engine, inner)
        if traj is not None and self.should_accept is not None and not self.should_accept(traj):
            self.feed.drop(int(data[INDEX_KEY]))
            return None
        if traj is not None:
            rows = traj["attention_mask"].shape[0]
            traj[INDEX_KEY] = torch.full((rows,), int(data[INDEX_KEY]), dtype=torch.long)
        return traj
