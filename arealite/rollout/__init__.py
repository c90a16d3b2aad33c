"""The rollout client: talks to SGLang-protocol inference servers and runs workflows on them."""

from arealite.rollout.errors import (
    GenerationError,
    RolloutError,
    ServerUnavailable,
    TransientServerError,
    WeightUpdateError,
)
from arealite.rollout.executor import RolloutWorkflowError, WorkflowExecutor
from arealite.rollout.remote_sglang import RemoteSGLangEngine
from arealite.rollout.watchdog import RolloutStalledError

__all__ = [
    "GenerationError",
    "RemoteSGLangEngine",
    "RolloutError",
    "RolloutStalledError",
    "RolloutWorkflowError",
    "ServerUnavailable",
    "TransientServerError",
    "WeightUpdateError",
    "WorkflowExecutor",
]
