"""Dynamic sampling (DAPO): train only on groups whose rewards differ, sampling more prompts
until the batch is full (`rollout.dynamic_sampling`).

Synchronous runs train the first `batch_size` prompts of the feed's stream whose groups'
rewards differ; the surplus of the last round goes back to the front of the stream, so which
prompts a step trains depends only on data order, rewards and seeds (a recovered run repeats
the uninterrupted one). Asynchronous runs filter each episode as it finishes. Dropped prompts
are retired and counted (`feed.dropped_groups`). After `MAX_SAMPLED_BATCHES` batches' worth of
prompts a step fills up with equal-reward groups (`filler_groups`) instead of sampling forever.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator
from itertools import chain, repeat
from typing import Any

from arealite.data.feed import INDEX_KEY, DataFeed
from arealite.interfaces import Batch, RolloutRunner, RolloutWorkflow
from arealite.rollout.batch import concat_padded

MAX_SAMPLED_BATCHES = 8  # a step samples at most this many batches' worth of prompts looking for signal
ROUND_MARGIN = 1.25  # a round samples this much more than the acceptance rate says is missing


def rewards_differ(trajectory: Batch) -> bool:
    """True when the group's `rewards` [G] are not all equal (exact comparison)."""
    rewards = trajectory["rewards"]
    return bool(rewards.numel() > 1 and (rewards != rewards[0]).any())


def informative_rows(batch: Batch, group_size: int) -> list[list[int]]:
    """The rows of each group (`group_size` consecutive samples; a sample's further chains, rows with
    `chain` > 0, go with it) whose rewards differ, in order."""
    n = len(_starts(batch))
    if n % group_size:
        raise ValueError(f"batch of {n} samples is not a whole number of groups of {group_size}")
    return [rows for rows in _groups(batch, group_size) if rewards_differ({"rewards": batch["rewards"][rows]})]


class DynamicSampler:
    """Batches of groups whose rewards differ, from `feed`; see the module docstring.

    Synchronous: `next_batch`, with a workflow whose rows carry `prompt_index` (`TaggedWorkflow`
    of `arealite.rollout.step_batches`). Asynchronous: `TaggedWorkflow(workflow, feed,
    sampler.accept)` and `prepare_batch`.
    """

    def __init__(self, feed: DataFeed, group_size: int) -> None:
        self.feed = feed
        self.group_size = group_size
        self.batch_size = feed.batch_size  # groups per batch on this rank
        self._dropped_in_a_row = 0
        self._stream: Iterator[dict[str, Any]] = (r for prompts in chain.from_iterable(repeat(feed)) for r in prompts)
        self._front: deque[dict[str, Any]] = deque()  # handed out, not trained: sampled again first
        self._rate = 1.0  # groups accepted per prompt sampled, in the last step
        self.filler_groups = 0  # equal-reward groups trained because the search bound was reached

    def accept(self, trajectory: Batch) -> bool:
        """`should_accept` for asynchronous runs (called on the rollout thread only)."""
        if rewards_differ(trajectory):
            self._dropped_in_a_row = 0
            return True
        if self._dropped_in_a_row >= MAX_SAMPLED_BATCHES * self.batch_size:
            self.filler_groups += 1
            return True
        self._dropped_in_a_row += 1
        return False

    def _take(self, n: int) -> list[dict[str, Any]]:
        out = [self._front.popleft() for _ in range(min(n, len(self._front)))]
        out += [next(self._stream) for _ in range(n - len(out))]
        return out

    def next_batch(self, rollout: RolloutRunner, workflow: RolloutWorkflow) -> Batch:
        """One batch of groups whose rewards differ (see the bound above), sampled at the current weights."""
        batch_size = self.batch_size
        kept: list[Batch] = []
        sampled = accepted = 0
        budget = MAX_SAMPLED_BATCHES * batch_size
        while len(kept) < batch_size:
            missing = batch_size - len(kept)
            if sampled >= budget:
                raise RuntimeError(
                    f"dynamic sampling: {sampled} prompts gave only {len(kept)} of {batch_size} groups; "
                    "the workflow rejected the rest (see its reward errors)"
                )
            rate = accepted / sampled if sampled else self._rate  # this step's so far, else the last step's
            want = math.ceil(ROUND_MARGIN * missing / max(rate, 1.0 / MAX_SAMPLED_BATCHES))
            prompts = self._take(max(missing, min(want, budget - sampled)))
            sampled += len(prompts)
            batch = rollout.rollout_batch(prompts, workflow)
            groups = informative_rows(batch, self.group_size)
            accepted += len(groups)
            taken = groups[:missing]
            if sampled >= budget and len(taken) < missing:  # the bound: fill up with equal-reward groups
                others = [rows for rows in _groups(batch, self.group_size) if rows not in groups]
                fillers = others[: missing - len(taken)]
                self.filler_groups += len(fillers)
                taken = sorted(taken + fillers)
            kept += [{k: v[rows] for k, v in batch.items()} for rows in taken]
            trained = {int(batch[INDEX_KEY][rows[0]]) for rows in taken}
            # the prompts up to the last one trained are used up; those after it go back to the stream
            position = {int(p[INDEX_KEY]): j for j, p in enumerate(prompts)}
            used = position[max(trained, key=position.__getitem__)] + 1 if len(kept) == batch_size else len(prompts)
            for p in prompts[:used]:
                if int(p[INDEX_KEY]) not in trained:
                    self.feed.drop(int(p[INDEX_KEY]))  # equal rewards (or a group the workflow rejected)
            self._front.extendleft(reversed(prompts[used:]))
        self._rate = accepted / sampled
        return concat_padded(kept)


def _starts(batch: Batch) -> list[int]:
    """The first row of every sample (all rows without `chain`)."""
    rows = batch["rewards"].shape[0]
    if "chain" not in batch:
        return list(range(rows))
    return [i for i, c in enumerate(batch["chain"].tolist()) if c == 0]


def _groups(batch: Batch, group_size: int) -> list[list[int]]:
    starts = _starts(batch) + [batch["rewards"].shape[0]]
    return [list(range(starts[g], starts[g + group_size])) for g in range(0, len(starts) - 1, group_size)]
