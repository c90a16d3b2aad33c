"""A server lost mid-run (SIGKILL while it holds requests): the batch completes on the
survivor, the loss is counted, and the next batch runs without it."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from arealite.config import GenerationHyperparameters, InferenceEngineConfig
from arealite.rollout import RemoteSGLangEngine
from arealite.workflow import RLVRWorkflow

from .conftest import start_builtin
from .rewards import one

pytestmark = pytest.mark.timeout(180)
RECORDS = [
    {"id": f"r{i}", "messages": [{"role": "user", "content": f"{i}+3="}], "answer": str(i + 3)} for i in range(8)
]


def test_server_killed_mid_batch(tiny_model_dir, tokenizer, tmp_path):
    with ThreadPoolExecutor(2) as pool:  # side by side: each start costs seconds
        servers = list(pool.map(lambda i: start_builtin(tiny_model_dir, tmp_path / f"s{i}"), range(2)))
    config = InferenceEngineConfig(
        setup_timeout=60, request_timeout=60, health_check_timeout=2.0, health_check_interval=1.0
    )
    engine = RemoteSGLangEngine(config, [s.address for s in servers])
    workflow = RLVRWorkflow(one, GenerationHyperparameters(group_size=2, max_new_tokens=64), tokenizer)
    victim = servers[0]
    result: dict = {}
    try:
        engine.initialize()

        def run_batch() -> None:
            try:
                result["batch"] = engine.rollout_batch(RECORDS, workflow)
            except BaseException as e:
                result["error"] = e

        thread = threading.Thread(target=run_batch, daemon=True)
        thread.start()
        deadline = time.monotonic() + 60
        while engine.pool.outstanding(victim.address) == 0 and "batch" not in result and time.monotonic() < deadline:
            time.sleep(0.01)
        assert engine.pool.outstanding(victim.address) > 0, "the victim never received work"
        victim.proc.kill()
        victim.proc.wait(30)
        thread.join(120)
        assert not thread.is_alive(), "the batch hung after losing a server"
        assert "error" not in result, repr(result.get("error"))
        batch = result["batch"]
        assert batch["rewards"].shape[0] == len(RECORDS) * 2  # nothing lost
        assert engine.stats["failovers"] >= 1
        assert engine.pool.down == [victim.address]

        again = engine.rollout_batch(RECORDS[:2], workflow)  # the survivor carries on alone
        assert again["rewards"].shape[0] == 4
        assert {engine.pool.is_healthy(s.address) for s in servers} == {False, True}
    finally:
        engine.destroy()
        workflow.scorer.pool.close()
        for s in servers:
            s.stop()
