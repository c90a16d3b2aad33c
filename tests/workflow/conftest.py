"""Servers for workflow tests: the rollout tests' built-in server helper, reused."""

import sys
from pathlib import Path

import pytest

from tests.rollout.conftest import start_servers

# Reward worker processes (spawned; they inherit sys.path) import `tests.workflow.rewards`.
REPO_ROOT = str(Path(__file__).resolve().parents[2])
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)


@pytest.fixture(scope="session")
def server_engine(tiny_model_dir, tmp_path_factory):
    """One built-in server and an initialized RemoteSGLangEngine on it."""
    from arealite.config import InferenceEngineConfig
    from arealite.rollout import RemoteSGLangEngine

    servers = start_servers(tiny_model_dir, tmp_path_factory.mktemp("server-logs"), 1)
    engine = RemoteSGLangEngine(InferenceEngineConfig(setup_timeout=60, request_timeout=60), [servers[0].address])
    try:
        engine.initialize()
        yield engine
    finally:
        engine.destroy()
        servers[0].stop()


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)
