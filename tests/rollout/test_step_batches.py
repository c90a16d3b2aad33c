"""`StepBatches` (arealite/rollout/step_batches.py) in every mode against a fake rollout client:
each prompt is trained at most once, and a run recovered from `state_dict()` trains the same
prompts as the uninterrupted one. No server, no model."""

from __future__ import annotations

import asyncio
import concurrent.futures

import pytest
import torch

from arealite.config import InferenceEngineConfig
from arealite.data.loader import create_dataloader
from arealite.interfaces import RolloutWorkflow
from arealite.rollout.batch import concat_padded
from arealite.rollout.step_batches import StepBatches

GROUP = 2


class Episode(RolloutWorkflow):
    """A group of 2 one-token answers; their rewards differ for ids divisible by 3 only."""

    async def arun_episode(self, engine, data):
        i = int(data["id"])
        ones = torch.ones(GROUP, 2, dtype=torch.long)
        rewards = torch.tensor([0.0, 1.0]) if i % 3 == 0 else torch.ones(GROUP)
        return {"input_ids": ones * i, "attention_mask": ones, "loss_mask": ones, "rewards": rewards}


class FakeRollout:
    """The RolloutRunner verbs StepBatches uses, running episodes one after another."""

    def _run(self, records, workflow):
        trajectories = [asyncio.run(workflow.arun_episode(None, r)) for r in records]
        return [t for t in trajectories if t is not None]

    def rollout_batch(self, data, workflow, should_accept=None):
        return concat_padded(self._run(data, workflow))

    def submit_batch(self, data, workflow):
        future = concurrent.futures.Future()
        future.set_result(self.rollout_batch(data, workflow))
        return future

    def prepare_batch(self, feed, workflow, should_accept=None):
        if getattr(self, "_it", None) is None or self._feed is not feed:
            self._feed, self._it = feed, (r for _ in iter(int, 1) for batch in feed for r in batch)
        kept = []
        while len(kept) < feed.batch_size:
            kept += self._run([next(self._it)], workflow)
        return concat_padded(kept)


MODES = {
    "sync": {},
    "async": {"max_head_offpolicyness": 1},
    "lockstep": {"max_head_offpolicyness": 1, "schedule": "lockstep"},
    "dynamic_sync": {"dynamic_sampling": True},
    "dynamic_async": {"dynamic_sampling": True, "max_head_offpolicyness": 1},
}


def _batches(mode: str) -> StepBatches:
    loader = create_dataloader([{"id": str(i)} for i in range(90)], batch_size=3, shuffle=False)
    return StepBatches(FakeRollout(), loader, Episode(), InferenceEngineConfig(**MODES[mode]), GROUP)


def _train(batches: StepBatches, steps: int) -> list[list[str]]:
    trained = []
    for _ in range(steps):
        batch = batches.next_batch()
        ids = batches.stats()["prompt_ids"]
        assert sorted(ids) == sorted({str(int(i)) for i in batch["input_ids"][:, 0]})  # what was returned
        trained.append(ids)
        batches.drain()
    return trained


@pytest.mark.parametrize("mode", list(MODES))
def test_every_mode_trains_each_prompt_once_and_recovers_exactly(mode):
    whole = _train(_batches(mode), 6)
    flat = [i for step in whole for i in step]
    assert len(flat) == len(set(flat)) == 6 * 3
    if mode.startswith("dynamic"):
        assert all(int(i) % 3 == 0 for i in flat)  # only groups whose rewards differ
        assert _batches(mode).stats().keys() >= {"dropped_groups", "filler_groups"}
    if mode == "sync":
        assert flat == [str(i) for i in range(18)]
    if mode == "lockstep":  # deterministic: the loader's order
        assert flat == [str(i) for i in range(18)]

    first = _batches(mode)
    head = _train(first, 2)
    state = first.state_dict()
    resumed = _batches(mode)
    resumed.load_state_dict(state)
    if mode in ("async", "dynamic_async", "lockstep"):  # prompts handed out ahead come back, in order
        tail = _train(resumed, 4)
        assert head == whole[:2] and sorted(i for s in head + tail for i in s) == sorted(flat)
    else:
        assert head + _train(resumed, 4) == whole
