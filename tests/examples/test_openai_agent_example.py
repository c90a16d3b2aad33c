"""examples/openai_agent_grpo.py through the local launcher for 2 steps: every sample is a run of
examples/openai_agent.py (the `openai` package in a subprocess) against the endpoint; it trains,
logs its steps with the agent failure counters and prints the accuracy line. The model is the
tool-calling test model, which answers the memorized 12*34 through the calculator."""

import pytest

from tests.examples.agent_example_run import run_agent_example

pytestmark = [pytest.mark.heavy, pytest.mark.slow, pytest.mark.timeout(300)]


def test_openai_agent_example_runs_two_steps(tmp_path, tool_model_dir):
    overrides = [
        f"fileroot={tmp_path}", f"actor.path={tool_model_dir}", "launcher.setup_commands=[]", "total_train_steps=2",
        "train_dataset.num_samples=64", "train_dataset.batch_size=2", "gconfig.group_size=2",
        "evaluator.num_samples=2", "stats_logger.plot=false",
    ]  # fmt: skip
    accuracy, rows = run_agent_example(overrides, timeout=280)
    assert all(0.0 <= x <= 1.0 for x in accuracy)
    assert [r["step"] for r in rows] == [0, 1] and all(r["version"] == r["step"] + 1 for r in rows)
    assert rows[-1]["agent/samples"] >= 2 * 2 * 2 and rows[-1]["agent/agent_timeouts"] == 0  # programs ran
    assert all(r["response_len"] > 0 and 0.0 <= r["reward"] <= 1.0 for r in rows)
