"""Bad configuration, missing files, empty data and over-long prompts: each fails at once
with an error that names the offending value and says what to do."""

from __future__ import annotations

import pytest

from arealite.config import (
    ConfigError,
    DatasetConfig,
    GenerationHyperparameters,
    GRPOConfig,
    InferenceEngineConfig,
    PPOActorConfig,
    load_config,
)
from arealite.data.loader import create_dataloader, filter_by_prompt_length, load_records
from arealite.data.math_datasets import DatasetError
from arealite.rollout import GenerationError, RemoteSGLangEngine, RolloutWorkflowError
from arealite.server.process import ServerStartError, launch_server_process
from arealite.workflow import RLVRWorkflow

from .rewards import one

pytestmark = pytest.mark.timeout(90)


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["actor.optimizer.lrr=0.1"], "did you mean actor.optimizer.lr"),
        (["gconfig.max_new_token=8"], "did you mean gconfig.max_new_tokens"),
        (["rollout.max_head_offpolicyness=-1"], "rollout.max_head_offpolicyness=-1 must be >= 0"),
        (["total_train_steps=ten"], "'total_train_steps' expects int"),
        (["gconfig.temperature=hot"], "'gconfig.temperature' expects float"),
        (["gconfig.top_p=0"], "gconfig.top_p=0.0 must be in (0, 1]"),
        (["train_dataset.type=csv"], "choose one of"),
        (["--config", "/nonexistent/run.yaml"], "'/nonexistent/run.yaml' does not exist"),
        (["total_train_steps"], "expected --config FILE or key=value"),
    ],
)
def test_bad_config_is_named(argv, expected):
    with pytest.raises(ConfigError) as info:
        load_config(argv, GRPOConfig)
    assert expected in str(info.value)


def test_a_client_wait_shorter_than_a_server_restart_is_refused():
    """With restarts, the client's wait for a server back in rotation (rollout.setup_timeout) must
    outlast the launcher's wait for the restarted server's start; the defaults leave that room."""
    config = load_config(["launcher.max_server_restarts=1"], GRPOConfig)
    launcher, rollout = config.launcher, config.rollout
    assert rollout.setup_timeout > launcher.server_start_timeout + rollout.health_check_interval
    with pytest.raises(ConfigError) as info:
        load_config(["launcher.max_server_restarts=1", "launcher.server_start_timeout=600"], GRPOConfig)
    message = str(info.value)
    assert "rollout.setup_timeout=300 is shorter" in message and "launcher.server_start_timeout=600" in message
    assert "raise rollout.setup_timeout above 605" in message, message
    load_config(["launcher.server_start_timeout=600"], GRPOConfig)  # no restarts: nothing waits for one


def test_typo_and_wrong_type_in_a_yaml_file_are_named(tmp_path):
    typo = tmp_path / "typo.yaml"
    typo.write_text("gconfig:\n  max_new_token: 8\n")
    with pytest.raises(
        ConfigError, match=r"unknown config key 'gconfig.max_new_token'; did you mean gconfig.max_new_tokens"
    ):
        load_config(["--config", str(typo)], GRPOConfig)
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("train_dataset:\n  batch_size: 8x\n")
    with pytest.raises(ConfigError, match=r"'train_dataset.batch_size' expects int"):
        load_config(["--config", str(wrong)], GRPOConfig)
    broken = tmp_path / "broken.yaml"
    broken.write_text("gconfig: [1, 2\n")
    with pytest.raises(ConfigError, match="cannot parse config file"):
        load_config(["--config", str(broken)], GRPOConfig)


def test_missing_and_empty_dataset_files(tmp_path):
    with pytest.raises(DatasetError, match="does not exist"):
        load_records(DatasetConfig(type="gsm8k", path=str(tmp_path / "missing.jsonl")))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(DatasetError, match="is empty"):
        load_records(DatasetConfig(type="jsonl", path=str(empty)))
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"question": "1+1?", "answer": "2"}\nnot json\n')
    with pytest.raises(DatasetError, match=r"broken.jsonl:2 is not valid JSON"):
        load_records(DatasetConfig(type="gsm8k", path=str(broken)))
    with pytest.raises(DatasetError, match="0 records"):
        create_dataloader([], batch_size=4)


def test_missing_model_folder_is_named(tmp_path):
    missing = str(tmp_path / "no-model-here")
    with pytest.raises(ServerStartError, match="is not a directory"):
        launch_server_process(missing, timeout=60)
    from arealite.train import PPOActor

    with pytest.raises(Exception) as info:  # the trainer: which exception type matters less than the message
        PPOActor(PPOActorConfig(path=missing)).initialize()
    assert missing in str(info.value) and "does not exist" in str(info.value), repr(info.value)


def test_bad_server_addresses_are_named():
    with pytest.raises(ValueError, match="AREAL_LLM_SERVER_ADDRS"):
        RemoteSGLangEngine(InferenceEngineConfig(), [])
    with pytest.raises(ValueError, match="'localhost' is not host:port"):
        RemoteSGLangEngine(InferenceEngineConfig(), ["localhost"])


def test_prompt_longer_than_the_context(builtin_server, tokenizer):
    """The shared server has a 128-token context: a longer prompt is refused by name, and the
    loader's length filter is the documented way to drop such prompts."""
    long = {"id": "long", "messages": [{"role": "user", "content": "1+" * 150 + "1="}], "answer": "151"}
    short = {"id": "short", "messages": [{"role": "user", "content": "1+1="}], "answer": "2"}
    engine = RemoteSGLangEngine(InferenceEngineConfig(setup_timeout=60), [builtin_server.address])
    engine.initialize()
    workflow = RLVRWorkflow(one, GenerationHyperparameters(group_size=2, max_new_tokens=4), tokenizer)
    try:
        with pytest.raises(RolloutWorkflowError) as info:
            engine.rollout_batch([short, long], workflow)
    finally:
        engine.destroy()
        workflow.scorer.pool.close()
    cause = info.value.__cause__
    assert isinstance(cause, GenerationError), repr(cause)
    assert "context length 128" in str(cause) and "max_prompt_tokens" in str(cause)
    assert filter_by_prompt_length([short, long], tokenizer, 100) == [short]
    with pytest.raises(DatasetError, match="max_prompt_tokens=8"):
        filter_by_prompt_length([short, long], tokenizer, 8)
