"""AgentProgramWorkflow end to end: a real subprocess using the `openai` package talks to the real
endpoint in front of a real built-in server; what it was sent is exactly what is trained on,
and programs that hang, crash or report no reward are killed / rejected and counted."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
import torch

from arealite.agent import AgentProgramWorkflow
from arealite.config import GenerationHyperparameters
from tests.tool_model import QUESTION

PROGRAM = [sys.executable, str(Path(__file__).with_name("agent_program.py"))]
GCONFIG = GenerationHyperparameters(group_size=2, max_new_tokens=96, temperature=0.0, sampling_seed=3)
pytestmark = pytest.mark.timeout(240)


def _env() -> dict[str, str]:
    repo = str(Path(__file__).resolve().parents[2])
    return {"PYTHONPATH": f"{repo}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "OMP_NUM_THREADS": "1"}


def test_an_openai_program_becomes_a_trajectory_of_exactly_the_tokens_it_was_sent(
    tool_engine, tool_tokenizer, tmp_path
):
    log = tmp_path / "received.jsonl"
    workflow = AgentProgramWorkflow(
        PROGRAM, tool_tokenizer, GCONFIG, timeout=120, env={**_env(), "AGENT_LOG": str(log)}
    )
    batch = tool_engine.rollout_batch([{"messages": QUESTION, "answer": "408"}], workflow)
    assert batch["input_ids"].shape[0] == 2 and batch["rewards"].tolist() == [1.0, 1.0]  # the program's reward line
    received = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["turns"] for r in received] == [3, 3]  # each program: a tool call, its result, the answer
    # the model's tokens carry exactly the logprobs each program received, in order, to the bit
    trained = sorted(batch["logprobs"][row][batch["loss_mask"][row].bool()].tolist() for row in range(2))
    assert trained == sorted(r["logprobs"] for r in received)
    for row in range(2):
        mask = batch["loss_mask"][row].bool()
        assert (batch["versions"][row][mask] == 0).all() and (batch["versions"][row][~mask] == -1).all()
        assert (batch["logprobs"][row][~mask] == 0).all()
        trained = tool_tokenizer.decode(batch["input_ids"][row][mask])
        everything = tool_tokenizer.decode(batch["input_ids"][row][batch["attention_mask"][row].bool()])
        assert '"calculator"' in trained and "408" in trained and "12*34" not in trained.split("<tool_call>")[0]
        assert "<tool_response>" in everything and "<tool_response>" not in trained  # the tool result is masked
    assert workflow.stats["samples"] == 2 and workflow.stats["rejected_groups"] == 0
    assert not workflow.endpoint.sessions  # every session closed after its program ended


def test_hung_crashed_and_silent_programs_are_killed_rejected_and_counted(tool_engine, tool_tokenizer, tmp_path):
    pid_file = tmp_path / "child.pid"
    g1 = GenerationHyperparameters(group_size=1, max_new_tokens=96, temperature=0.0)
    workflow = AgentProgramWorkflow(PROGRAM, tool_tokenizer, g1, timeout=25, env=_env())  # python + openai start slowly
    records = [
        {"messages": QUESTION, "answer": "408", "mode": "hang", "pid_file": str(pid_file)},
        {"messages": QUESTION, "answer": "408", "mode": "crash"},
        {"messages": QUESTION, "answer": "408", "mode": "silent"},
        {"messages": QUESTION, "answer": "408", "mode": "http_reward"},
    ]
    started = time.monotonic()
    batch = tool_engine.rollout_batch(records, workflow)
    assert time.monotonic() - started < 90  # the hung program did not run its 600 s
    assert batch["rewards"].tolist() == [1.5]  # only the program that POSTed its reward is trained on
    stats = workflow.stats
    assert (stats["agent_timeouts"], stats["agent_crashes"], stats["agent_no_reward"]) == (1, 1, 1), stats
    assert stats["rejected_groups"] == 3 and stats["episodes"] == 4
    child = int(pid_file.read_text())
    for _ in range(50):  # the hung program's own child was killed with it (its process group)
        if not os.path.exists(f"/proc/{child}") or _zombie(child):
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the hung program's child {child} outlived the timeout")


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except FileNotFoundError:
        return True


def test_a_reward_function_scores_the_final_reply(tool_engine, tool_tokenizer):
    from tests.agent.rewards import exact_answer

    workflow = AgentProgramWorkflow(PROGRAM, tool_tokenizer, GCONFIG, reward_fn=exact_answer, timeout=120, env=_env())
    batch = tool_engine.rollout_batch([{"messages": QUESTION, "answer": "409", "mode": "http_reward"}], workflow)
    assert batch["rewards"].tolist() == [0.0, 0.0]  # the function's verdict (409 is wrong), not the program's 0.5
    assert torch.equal(batch["loss_mask"].sum(-1) > 0, torch.tensor([True, True]))


def test_bad_settings_are_refused(tool_tokenizer):
    with pytest.raises(ValueError, match="command is empty"):
        AgentProgramWorkflow([], tool_tokenizer, GCONFIG)
    with pytest.raises(ValueError, match="timeout=0"):
        AgentProgramWorkflow(PROGRAM, tool_tokenizer, GCONFIG, timeout=0)
