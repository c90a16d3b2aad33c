"""Fixtures for multi-node tests: `network(n)` gives n namespaced hosts, always torn down.

Every test in this package carries the `multinode` marker (`python -m pytest -m multinode`)
and is skipped, with the reason, where namespaces cannot be made (not root, no iproute2).
Leftovers of an earlier run that was killed before its finalizers ran are removed first.
"""

from __future__ import annotations

import pytest

from tests.multinode.netns import Network, remove_leftovers, unavailable_reason


@pytest.fixture(scope="session")
def netns_ready() -> None:
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    remove_leftovers()


@pytest.fixture
def network(netns_ready):
    """`network(n)` -> a created Network of n hosts; everything in it is removed after the test."""
    made: list[Network] = []

    def _make(n: int) -> Network:
        net = Network(n)
        made.append(net)
        return net.create()

    yield _make
    errors = []
    for net in made:
        try:
            net.close()
        except RuntimeError as e:
            errors.append(str(e))
    assert not errors, f"teardown left processes: {errors}"
