"""`with RemoteSGLangEngine(...)`: initialized inside, its event-loop thread and session gone after, errors included."""

import threading

import pytest

from arealite.config import InferenceEngineConfig
from arealite.rollout import RemoteSGLangEngine, ServerUnavailable
from arealite.utils.net import free_ports

pytestmark = pytest.mark.timeout(120)


def _loop_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "arealite-rollout"]


def test_with_block_releases_the_loop_on_error(two_servers):
    before = len(_loop_threads())
    with (
        pytest.raises(RuntimeError, match="a failing cell"),
        RemoteSGLangEngine(InferenceEngineConfig(setup_timeout=30), [two_servers[0].address]) as rollout,
    ):
        assert rollout.loop.running and len(_loop_threads()) == before + 1
        raise RuntimeError("a failing cell")
    assert not rollout.loop.running and len(_loop_threads()) == before


def test_failed_start_leaves_no_thread():
    before = len(_loop_threads())
    config = InferenceEngineConfig(setup_timeout=1)
    with (
        pytest.raises(ServerUnavailable, match="setup_timeout"),
        RemoteSGLangEngine(config, [f"127.0.0.1:{free_ports(1)[0]}"]),
    ):
        pytest.fail("the block must not run when no server answers")
    assert len(_loop_threads()) == before
