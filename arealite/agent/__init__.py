"""Agents that are separate programs: an OpenAI-compatible endpoint over the rollout client
(`AgentEndpoint`, one session per episode) and the workflow that runs a program per sample
against it (`AgentProgramWorkflow`)."""

from arealite.agent.endpoint import SESSION_HEADER, AgentEndpoint, AgentSession
from arealite.agent.workflow import AgentProgramWorkflow

__all__ = ["SESSION_HEADER", "AgentEndpoint", "AgentSession", "AgentProgramWorkflow"]
