"""Routing: group affinity, least outstanding work, rotation changes."""

import pytest

from arealite.rollout.servers import ServerPool


def test_group_sticks_to_one_server():
    pool = ServerPool(["a:1", "b:2", "c:3"])
    first = pool.pick("g", 10)
    for _ in range(5):
        assert pool.pick("g", 10) == first


def test_new_groups_go_to_least_loaded():
    pool = ServerPool(["a:1", "b:2"])
    a = pool.pick("g1", 100)
    b = pool.pick("g2", 10)
    assert a != b
    # the server of g2 has less outstanding work, so g3 joins it
    assert pool.pick("g3", 10) == b
    pool.release(a, 100)
    assert pool.outstanding(a) == 0
    assert pool.pick("g4", 1) == a


def test_down_server_leaves_and_rejoins_rotation():
    pool = ServerPool(["a:1", "b:2"])
    server = pool.pick("g", 1)
    pool.release(server, 1)
    pool.mark_down(server)
    other = pool.pick("g", 1)
    assert other != server and pool.down == [server]
    for i in range(10):
        assert pool.pick(f"n{i}", 0) == other
    pool.mark_down(other)
    assert pool.pick("x", 1) is None
    pool.mark_up(server)
    assert pool.pick("x", 1) == server and pool.healthy == [server]


def test_no_addresses_names_the_fix():
    with pytest.raises(ValueError, match="AREAL_LLM_SERVER_ADDRS"):
        ServerPool([])
