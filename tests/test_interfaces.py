"""The typed interfaces (arealite/interfaces.py) match their implementations.

Every member of `InferenceEngine` and `TrainEngine` exists on the class that implements it,
with the Protocol's parameter names in the Protocol's order (extra trailing parameters with
defaults are allowed), so the documented contract cannot drift from the code. Static: no
server, no model.
"""

import inspect

import pytest

from arealite.interfaces import (
    GenerationEngine,
    InferenceEngine,
    RolloutRunner,
    RolloutWorkflow,
    TrainEngine,
    WeightSyncTarget,
)
from arealite.rollout import RemoteSGLangEngine
from arealite.rollout.step_batches import TaggedWorkflow
from arealite.train import PPOActor, PPOCritic, ReferenceModel
from arealite.train.engine import FSDPEngine
from arealite.workflow import MultiTurnWorkflow, RLVRWorkflow, ToolUseWorkflow


def _members(protocol: type) -> dict[str, object]:
    """The Protocol's methods and properties, its bases' included (not typing's machinery)."""
    own = {}
    for cls in reversed(protocol.__mro__):
        if cls is not protocol and not getattr(cls, "_is_protocol", False):
            continue
        own.update({k: v for k, v in vars(cls).items() if not k.startswith("_")})
    return {k: v for k, v in own.items() if callable(v) or isinstance(v, property)}


def _params(fn) -> list[inspect.Parameter]:
    return [p for p in inspect.signature(fn).parameters.values() if p.name != "self"]


def _check(protocol: type, impl: type) -> list[str]:
    problems = []
    for name, member in _members(protocol).items():
        got = inspect.getattr_static(impl, name, None)
        if got is None:
            problems.append(f"{impl.__name__} lacks {name}")
            continue
        if isinstance(member, property):
            if not isinstance(got, property):
                problems.append(f"{impl.__name__}.{name} is not a property")
            continue
        want = _params(member)
        have = _params(got)
        if [p.name for p in have[: len(want)]] != [p.name for p in want]:
            problems.append(f"{impl.__name__}.{name}{inspect.signature(got)} != {name}{inspect.signature(member)}")
        extra = [p for p in have[len(want) :] if p.default is inspect.Parameter.empty]
        if extra:
            problems.append(f"{impl.__name__}.{name} requires parameters the interface lacks: {extra}")
        if inspect.iscoroutinefunction(member) != inspect.iscoroutinefunction(got):
            problems.append(f"{impl.__name__}.{name}: async differs from the interface")
    return problems


@pytest.mark.parametrize(
    "protocol, impl",
    [
        (InferenceEngine, RemoteSGLangEngine),
        (GenerationEngine, RemoteSGLangEngine),
        (WeightSyncTarget, RemoteSGLangEngine),
        (RolloutRunner, RemoteSGLangEngine),
        (TrainEngine, FSDPEngine),
        (TrainEngine, PPOActor),
        (TrainEngine, PPOCritic),
        (TrainEngine, ReferenceModel),
    ],
)
def test_implementation_has_every_member_with_the_same_parameters(protocol, impl):
    assert _members(protocol), f"{protocol.__name__} lists no members: the check would be empty"
    assert _check(protocol, impl) == []


@pytest.mark.parametrize("protocol, method", [(TrainEngine, FSDPEngine.initialize)])
def test_protocol_attributes_are_set_by_the_implementation(protocol, method):
    """Data members (`device`, `compute_dtype`) are instance attributes set by these methods; the
    rollout client's Protocols have none (what a part needs from the client's config it is given)."""
    source = inspect.getsource(method)
    names = {k for cls in protocol.__mro__ for k in vars(cls).get("__annotations__", {})}
    assert names
    for name in names:
        assert f"self.{name} =" in source, name


def test_inference_engine_is_the_three_audiences():
    """Each audience's Protocol is small, and InferenceEngine is exactly their union."""
    parts = [GenerationEngine, WeightSyncTarget, RolloutRunner]
    assert not any(vars(p).get("__annotations__") for p in (InferenceEngine, *parts))  # no data members
    assert set(_members(InferenceEngine)) == set().union(*(_members(p) for p in parts))
    assert len(_members(GenerationEngine)) == 2
    assert "agenerate" not in _members(WeightSyncTarget) and "agenerate" not in _members(RolloutRunner)


def test_check_catches_a_drifted_signature():
    """The checker itself fails on a renamed parameter, a missing member and a sync agenerate."""

    class Drifted:
        def agenerate(self, request):  # renamed parameter, and not async
            ...

    problems = " ".join(_check(InferenceEngine, Drifted))
    assert "Drifted.agenerate(self, request)" in problems
    assert "async differs" in problems
    assert "Drifted lacks get_version" in problems


@pytest.mark.parametrize("workflow", [RLVRWorkflow, MultiTurnWorkflow, ToolUseWorkflow, TaggedWorkflow])
def test_workflows_subclass_rolloutworkflow(workflow):
    assert issubclass(workflow, RolloutWorkflow)
    assert inspect.iscoroutinefunction(workflow.arun_episode)
    assert [p.name for p in _params(workflow.arun_episode)] == ["engine", "data"]


def test_rolloutworkflow_is_abstract():
    class NoEpisode(RolloutWorkflow):
        pass

    with pytest.raises(TypeError, match="arun_episode"):
        NoEpisode()
