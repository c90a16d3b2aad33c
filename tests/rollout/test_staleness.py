"""Bounded staleness: no trained token is more than max_head_offpolicyness versions behind.

The trainer is played by the test: after each batch it pushes weights from disk (a copy of
the tiny model) as the next version, exactly as WeightSync.sync does.
"""

from __future__ import annotations

import shutil

import pytest
from transformers import AutoTokenizer

from arealite.config import GenerationHyperparameters, InferenceEngineConfig
from arealite.reward.math import gsm8k_reward_fn
from arealite.rollout import RemoteSGLangEngine
from arealite.types import WeightUpdateMeta
from arealite.workflow import RLVRWorkflow

pytestmark = pytest.mark.timeout(240)


class ListLoader:
    """The smallest dataloader: batches of records, a batch_size, a fresh pass per iter()."""

    def __init__(self, records: list[dict], batch_size: int) -> None:
        self.records, self.batch_size = records, batch_size

    def __iter__(self):
        for i in range(0, len(self.records) - self.batch_size + 1, self.batch_size):
            yield self.records[i : i + self.batch_size]


def sync(engine: RemoteSGLangEngine, weights: str, version: int) -> None:
    engine.pause()
    engine.update_weights(WeightUpdateMeta(type="disk", path=weights, version=version)).result(timeout=60)
    engine.set_version(version)
    engine.resume()


@pytest.fixture(scope="module")
def weights_dir(tiny_model_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("weights") / "model"
    shutil.copytree(tiny_model_dir, path)
    return str(path)


# in_place keeps requests on the servers across syncs, so trajectories mix versions
@pytest.mark.parametrize("k,mode", [(0, "abort"), (1, "abort"), (4, "abort"), (0, "in_place"), (1, "in_place")])
def test_trained_batches_respect_staleness_bound(k, mode, two_servers, tiny_model_dir, weights_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    records = [{"id": f"r{i}", "prompt": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(40)]
    loader = ListLoader(records, batch_size=2)
    workflow = RLVRWorkflow(gsm8k_reward_fn, GenerationHyperparameters(group_size=2, max_new_tokens=6), tokenizer)
    config = InferenceEngineConfig(
        max_head_offpolicyness=k, max_concurrent_rollouts=16, setup_timeout=60, request_timeout=60, pause_mode=mode
    )
    engine = RemoteSGLangEngine(config, [s.address for s in two_servers])
    engine.initialize()
    try:
        sync(engine, weights_dir, 0)  # servers report version 0 from here on
        lags = []
        for version in range(5):
            batch = engine.prepare_batch(loader, workflow)
            assert batch["input_ids"].shape[0] == 2 * 2
            produced = batch["versions"][batch["loss_mask"].bool()]
            assert produced.numel() > 0
            assert produced.max() <= version
            assert produced.min() >= version - k, f"token {version - produced.min()} versions behind, k={k}"
            lags.append(version - int(produced.min()))
            sync(engine, weights_dir, version + 1)
        if k == 0:
            assert lags == [0] * 5  # fully on-policy
        if k == 4:
            assert max(lags) >= 1  # generation really ran ahead of training
        assert engine.executor.stats["failed"] == 0
        if mode == "in_place":
            assert engine.stats["interruptions"] == 0
    finally:
        engine.destroy()
