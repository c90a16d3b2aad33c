"""Property tests of `StalenessBudget` (arealite/rollout/staleness.py): random schedules of
starts, finishes, trained batches and version bumps, checked against the bound's definition."""

from __future__ import annotations

from collections import deque

from hypothesis import given, settings
from hypothesis import strategies as st

from arealite.rollout.staleness import UNBOUNDED, StalenessBudget

ks = st.integers(0, 3)
batch_sizes = st.integers(1, 5)
ops = st.lists(st.sampled_from(["start", "accept", "reject", "train"]), max_size=200)


def _simulate(k: int, batch_size: int, schedule: list[str], v0: int = 7):
    """Play `schedule` against a budget the way the executor does; yields the state after each op.

    Running episodes finish in any order (the oldest or the newest, by the op index); a
    trained batch drops its stale trajectories back to the queue first, then bumps the version.
    """
    budget, version = StalenessBudget(k, batch_size), v0
    budget.room(version)  # counting begins at v0
    running: list[int] = []  # start versions
    ready: deque[int] = deque()  # start versions (= the oldest token's version) of accepted ones
    trained: list[tuple[int, int]] = []  # (start version, version it was trained at)
    for i, op in enumerate(schedule):
        if op == "start" and budget.room(version) > 0:
            budget.start()
            running.append(version)
        elif op in ("accept", "reject") and running:
            started = running.pop(0 if i % 2 else -1)
            budget.finish(accepted=op == "accept")
            if op == "accept":
                ready.append(started)
        elif op == "train" and len(ready) >= batch_size:
            for started in [s for s in ready if budget.is_stale(s, version)]:
                ready.remove(started)
                budget.requeue()
            if len(ready) >= batch_size:
                trained += [(ready.popleft(), version) for _ in range(batch_size)]
                version += 1
        yield budget, version, running, ready, trained


@settings(max_examples=200, deadline=None)
@given(ks, batch_sizes, ops)
def test_started_episodes_never_exceed_the_bound(k, batch_size, schedule):
    """accepted + running <= (k + v - v0 + 1) * B at every moment."""
    for budget, version, running, ready, trained in _simulate(k, batch_size, schedule):
        assert budget.running == len(running)
        assert budget.accepted == len(ready) + len(trained)
        assert budget.accepted + budget.running <= (k + version - budget.base_version + 1) * batch_size


@settings(max_examples=200, deadline=None)
@given(ks, batch_sizes, ops)
def test_no_trained_sample_is_more_than_k_versions_old(k, batch_size, schedule):
    for *_, trained in _simulate(k, batch_size, schedule):
        assert all(started >= at - k for started, at in trained)


@given(ks, batch_sizes, st.integers(0, 20), st.integers(0, 5))
def test_each_version_frees_one_batch(k, batch_size, started, bumps):
    budget = StalenessBudget(k, batch_size)
    first = budget.room(3)
    assert first == (k + 1) * batch_size
    for _ in range(started):
        budget.start()
    assert budget.room(3 + bumps) == first - started + bumps * batch_size


@given(st.integers(0, 3), st.integers(-1, 50))
def test_no_batch_size_means_no_bound(k, version):
    assert StalenessBudget(k).room(version) == UNBOUNDED


@given(ks, st.integers(-1, 30), st.integers(0, 30))
def test_stale_means_more_than_k_behind(k, oldest, version):
    budget = StalenessBudget(k, 4)
    assert budget.is_stale(oldest, version) == (oldest < version - k)
    assert not budget.is_stale(None, version)  # a trajectory with no generated token
