"""Moved to arealite/rollout/client.py. An import shim kept for one release (docs/CHANGELOG.md)."""

from arealite.rollout.client import RemoteInferenceEngine, RemoteSGLangEngine, addresses_from_env

__all__ = ["RemoteInferenceEngine", "RemoteSGLangEngine", "addresses_from_env"]
