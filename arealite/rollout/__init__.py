"""The rollout client (`RolloutClient`): talks to inference servers through their backend's adapter
(arealite/backends/) and runs workflows on them."""

from arealite.rollout.client import (
    RemoteInferenceEngine,
    RemoteSGLangEngine,
    RemoteVLLMEngine,
    RolloutClient,
    rollout_client,
)
from arealite.rollout.errors import (
    GenerationError,
    RolloutError,
    ServerUnavailable,
    TransientServerError,
    WeightUpdateError,
)
from arealite.rollout.executor import RolloutWorkflowError, WorkflowExecutor
from arealite.rollout.watchdog import RolloutStalledError

__all__ = [
    "GenerationError",
    "RemoteInferenceEngine",
    "RemoteSGLangEngine",
    "RemoteVLLMEngine",
    "RolloutClient",
    "RolloutError",
    "RolloutStalledError",
    "RolloutWorkflowError",
    "ServerUnavailable",
    "TransientServerError",
    "WeightUpdateError",
    "WorkflowExecutor",
    "rollout_client",
]
