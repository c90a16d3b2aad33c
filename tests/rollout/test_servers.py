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


def test_unless_left_cancels_the_call_when_the_server_leaves_or_the_caller_is_cancelled():
    import asyncio

    async def main() -> None:
        pool = ServerPool(["a:1"])
        assert await pool.unless_left("a:1", asyncio.sleep(0, result=7)) == 7
        call = asyncio.ensure_future(asyncio.sleep(60))
        leave = asyncio.get_running_loop().call_later(0.01, pool.take_out, "a:1", "test")
        assert await pool.unless_left("a:1", call) is None
        await asyncio.sleep(0)
        assert call.cancelled()
        leave.cancel()
        pool.mark_up("a:1")
        call = asyncio.ensure_future(asyncio.sleep(60))
        caller = asyncio.ensure_future(pool.unless_left("a:1", call))
        await asyncio.sleep(0.01)
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        await asyncio.sleep(0)
        assert call.cancelled()  # the call does not outlive its caller

    asyncio.run(main())


def test_a_server_leaving_abandons_its_own_calls_only():
    """Many calls in flight to two servers: taking one out returns None for each of its calls
    (cancelled) at once, while the other server's calls go on to their results."""
    import asyncio

    async def main() -> None:
        pool = ServerPool(["a:1", "b:2"])
        release = asyncio.Event()

        async def call(i: int) -> int:
            await release.wait()
            return i

        inner = {(a, i): asyncio.ensure_future(call(i)) for a in ("a:1", "b:2") for i in range(50)}
        callers = {key: asyncio.ensure_future(pool.unless_left(key[0], c)) for key, c in inner.items()}
        await asyncio.sleep(0.01)
        pool.take_out("a:1", "test")
        await asyncio.sleep(0.01)
        assert all(callers[("a:1", i)].done() and callers[("a:1", i)].result() is None for i in range(50))
        assert not any(callers[("b:2", i)].done() for i in range(50))
        release.set()
        assert [await callers[("b:2", i)] for i in range(50)] == list(range(50))
        assert all(inner[("a:1", i)].cancelled() for i in range(50))
        assert await pool.unless_left("a:1", call(7)) is None  # out of rotation: not even started
        pool.mark_up("a:1")
        assert await pool.unless_left("a:1", call(7)) == 7

    asyncio.run(main())
