"""Lockstep's promise at a weight sync: the batch generating ahead is never interrupted.

Batch 1 is launched by `next_batch()` for batch 0 and runs long answers; training is "held"
until the servers report decode steps beyond those of batch 0 and the client still has
requests outstanding, so batch 1 is provably mid-generation when the sync comes. `drain()`
must then let it finish on the weights it began with: the pause interrupts nothing, and every
token of batch 1 carries version 0. Without the drain the pause aborts batch 1's requests,
which resume on version 1 (mixed versions, interruptions counted), and this test fails.
"""

from __future__ import annotations

import json
import shutil
import time
import urllib.request

import pytest
from transformers import AutoTokenizer

from arealite.config import GenerationHyperparameters, InferenceEngineConfig
from arealite.rollout import RemoteSGLangEngine
from arealite.rollout.lockstep import LockstepRollout
from arealite.server.process import launch_server_process
from arealite.types import WeightUpdateMeta
from arealite.workflow import RLVRWorkflow
from tests.e2e.varied_reward import even_token_fraction
from tests.rollout.conftest import SERVER_ARGS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(480)]
BUDGET = 300  # long answers: generation of batch 1 spans the sync on any machine
GROUP = 2


def _decode_steps(address: str) -> int:
    with urllib.request.urlopen(f"http://{address}/get_server_info", timeout=10) as r:
        return int(json.load(r)["internal_states"][0]["decode_steps"])


@pytest.fixture
def server(tiny_model_dir):
    """Its own server: the decode-step count must be this test's alone."""
    proc = launch_server_process(tiny_model_dir, extra_args=list(SERVER_ARGS), timeout=300)
    yield proc
    proc.stop()


def test_sync_waits_for_the_batch_in_flight(server, tiny_model_dir, tmp_path):
    weights = tmp_path / "weights"
    shutil.copytree(tiny_model_dir, weights)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    batches = iter(
        [[{"id": f"b{b}r{i}", "prompt": f"Batch {b} question {i}: count to ten.", "answer": "0"} for i in range(2)]
         for b in range(3)]
    )  # fmt: skip
    gconfig = GenerationHyperparameters(group_size=GROUP, max_new_tokens=BUDGET, min_new_tokens=BUDGET)
    workflow = RLVRWorkflow(even_token_fraction, gconfig, tokenizer)
    addresses = [server.address]
    engine = RemoteSGLangEngine(InferenceEngineConfig(setup_timeout=60, request_timeout=120), addresses)
    engine.initialize()
    try:
        engine.update_weights(WeightUpdateMeta(type="disk", path=str(weights), version=0)).result(timeout=60)
        engine.set_version(0)
        lockstep = LockstepRollout(engine, batches, workflow, k=1)
        lockstep.next_batch()  # batch 0; batch 1 starts now on version 0
        after_batch0 = sum(_decode_steps(a) for a in addresses)
        deadline = time.monotonic() + 60
        while sum(_decode_steps(a) for a in addresses) < after_batch0 + 3 and time.monotonic() < deadline:
            time.sleep(0.02)  # "training": held until batch 1 is decoding
        in_flight = sum(engine.pool.outstanding(a) for a in addresses)
        assert in_flight > 0, "batch 1 finished before the sync; raise BUDGET"
        lockstep.drain()
        engine.pause()
        engine.update_weights(WeightUpdateMeta(type="disk", path=str(weights), version=1)).result(timeout=60)
        engine.set_version(1)
        engine.resume()
        batch1 = lockstep.next_batch()
        lockstep.drain()  # batch 2 finishes before the engine goes
        interruptions = engine.stats["interruptions"]
    finally:
        engine.destroy()
    mask = batch1["loss_mask"].bool()
    assert interruptions == 0, f"{interruptions} requests were interrupted by the sync"
    assert mask.sum() > 0 and (batch1["versions"][mask] == 0).all(), "batch 1 mixes weight versions"
