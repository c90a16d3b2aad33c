"""Moved to arealite/rollout/client.py. An import shim kept for one release (docs/CHANGELOG.md)."""

from arealite.rollout.client import RemoteVLLMEngine, rollout_client

__all__ = ["RemoteVLLMEngine", "rollout_client"]
