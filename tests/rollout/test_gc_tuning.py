"""rollout.gc_full_threshold: CPython's third GC threshold is raised while a client runs, never
lowered, and restored when the last client in the process is destroyed."""

from __future__ import annotations

import gc

import pytest

from arealite.config import InferenceEngineConfig
from arealite.rollout import RemoteSGLangEngine, gc_tuning


@pytest.fixture
def thresholds(monkeypatch):
    """Python's defaults and no holder for the test (a client another test left alive in this
    process must not count); the process's thresholds and holders back afterwards."""
    before = gc.get_threshold()
    for name, value in (("_holders", 0), ("_saved", None), ("_ours", None)):
        monkeypatch.setattr(gc_tuning, name, value)
    gc.set_threshold(700, 10, 10)
    yield
    gc.set_threshold(*before)


def test_held_while_any_holder_lives_and_restored_by_the_last(thresholds):
    assert gc_tuning.hold(1000)
    assert gc.get_threshold() == (700, 10, 1000)
    assert gc_tuning.hold(50)  # a second client: never lowers it
    assert gc.get_threshold() == (700, 10, 1000)
    gc_tuning.release()
    assert gc.get_threshold() == (700, 10, 1000)  # one client still runs
    gc_tuning.release()
    assert gc.get_threshold() == (700, 10, 10)
    gc_tuning.release()  # an extra release is harmless
    assert gc.get_threshold() == (700, 10, 10)


def test_zero_leaves_the_interpreter_alone_and_a_higher_setting_wins(thresholds):
    assert not gc_tuning.hold(0)
    assert gc.get_threshold() == (700, 10, 10)
    gc.set_threshold(700, 10, 5000)  # the user's own, higher: kept
    assert gc_tuning.hold(1000)
    assert gc.get_threshold() == (700, 10, 5000)
    gc_tuning.release()
    assert gc.get_threshold() == (700, 10, 5000)


def test_a_change_made_while_held_is_not_undone(thresholds):
    assert gc_tuning.hold(1000)
    gc.set_threshold(2000, 20, 20)  # someone else tunes the GC meanwhile
    gc_tuning.release()
    assert gc.get_threshold() == (2000, 20, 20)


def test_a_new_client_raises_it_again_after_a_change(thresholds):
    assert gc_tuning.hold(1000)
    gc.set_threshold(700, 10, 10)  # lowered behind the first client's back
    assert gc_tuning.hold(1000)
    assert gc.get_threshold() == (700, 10, 1000)
    gc_tuning.release()
    gc_tuning.release()
    assert gc.get_threshold() == (700, 10, 10)


def test_the_client_holds_it_from_initialize_to_destroy(thresholds, two_servers):
    addresses = [s.address for s in two_servers]
    with RemoteSGLangEngine(InferenceEngineConfig(), addresses) as engine:
        assert gc.get_threshold() == (700, 10, InferenceEngineConfig().gc_full_threshold)
        engine.initialize()  # twice: still one hold
    assert gc.get_threshold() == (700, 10, 10)
    with RemoteSGLangEngine(InferenceEngineConfig(gc_full_threshold=0), addresses):
        assert gc.get_threshold() == (700, 10, 10)
    with pytest.raises(Exception, match="gc_full_threshold"):
        InferenceEngineConfig(gc_full_threshold=-1)
