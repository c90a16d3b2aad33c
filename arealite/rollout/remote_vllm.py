"""`RemoteVLLMEngine`: the rollout client for vLLM servers, through vLLM's own RL routes.

The same client as `RemoteSGLangEngine` (interruptible generation, per-token weight versions,
staleness control, failover, disk weight sync) with vLLM's wire format
(vllm_protocol.VLLMProtocol; docs/protocol.md §11). AReaL names its vLLM client the same way.
The servers must run as `server_cmd.vllm_command` starts them (the launchers do, with
`server.backend=vllm`).
"""

from __future__ import annotations

from typing import Any

from arealite.rollout.remote_sglang import RemoteInferenceEngine
from arealite.rollout.vllm_protocol import VLLMProtocol


class RemoteVLLMEngine(RemoteInferenceEngine):
    """The rollout client for vLLM servers (module docstring)."""

    protocol_class = VLLMProtocol


def rollout_client(config: Any, addresses: list[str] | None = None) -> RemoteInferenceEngine:
    """The rollout client for an experiment's servers (`config.server.backend`): `RemoteVLLMEngine`
    for vLLM, else `RemoteSGLangEngine` (the built-in server and SGLang speak SGLang's protocol)."""
    from arealite.rollout.remote_sglang import RemoteSGLangEngine

    if config.server.backend == "vllm":
        return RemoteVLLMEngine(config.rollout, addresses)
    return RemoteSGLangEngine(config.rollout, addresses)
