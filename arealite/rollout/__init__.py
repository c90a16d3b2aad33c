"""The rollout client: talks to SGLang-protocol or vLLM inference servers and runs workflows on them."""

from arealite.rollout.errors import (
    GenerationError,
    RolloutError,
    ServerUnavailable,
    TransientServerError,
    WeightUpdateError,
)
from arealite.rollout.executor import RolloutWorkflowError, WorkflowExecutor
from arealite.rollout.remote_sglang import RemoteInferenceEngine, RemoteSGLangEngine
from arealite.rollout.remote_vllm import RemoteVLLMEngine
from arealite.rollout.watchdog import RolloutStalledError

__all__ = [
    "GenerationError",
    "RemoteInferenceEngine",
    "RemoteSGLangEngine",
    "RemoteVLLMEngine",
    "RolloutError",
    "RolloutStalledError",
    "RolloutWorkflowError",
    "ServerUnavailable",
    "TransientServerError",
    "WeightUpdateError",
    "WorkflowExecutor",
]
