"""ToolUseWorkflow on a real server: the agent loop through the chat client, tool results
loss-masked, errors shown to the model and counted, rewards on the final answer."""

import asyncio

import pytest

from arealite.config import GenerationHyperparameters
from arealite.data.arithmetic import arithmetic_reward_fn
from arealite.workflow import ToolUseWorkflow
from arealite.workflow.tools import Calculator, DisabledTool, ToolError

pytestmark = pytest.mark.timeout(180)
RECORD = {"id": "q", "messages": [{"role": "user", "content": "12*34="}], "answer": "408"}
GREEDY = GenerationHyperparameters(group_size=2, temperature=0.0, max_new_tokens=80)


def _runs(row):
    runs = []
    for value in row.tolist():
        if not runs or runs[-1][0] != value:
            runs.append([value, 0])
        runs[-1][1] += 1
    return [v for v, _ in runs]


def test_calls_the_calculator_and_trains_on_its_own_tokens(tool_engine, tool_tokenizer):
    workflow = ToolUseWorkflow(arithmetic_reward_fn, GREEDY, tool_tokenizer, [Calculator()], max_turns=3)
    batch = tool_engine.rollout_batch([RECORD], workflow)
    assert batch["rewards"].tolist() == [1.0, 1.0] and batch["num_tool_calls"].tolist() == [1, 1]
    for row in range(2):
        valid = batch["attention_mask"][row]
        mask = batch["loss_mask"][row][valid]
        assert _runs(mask) == [0, 1, 0, 1]  # prompt, call, tool result, answer
        text = tool_tokenizer.decode(batch["input_ids"][row][valid][~mask.bool()])
        assert "<tool_response>\n408\n</tool_response>" in text  # the calculator's output, not trained on
    stats = workflow.stats
    assert (stats["tool_calls"], stats["tool_errors"], stats["turns"], stats["episodes"]) == (2, 0, 4, 1)


def test_turn_reward_rewards_the_calling_turn(tool_engine, tool_tokenizer):
    def turn_reward(messages, data):  # a sub-goal: the call's result is the record's answer
        return 0.25 if messages[-1]["role"] == "tool" and messages[-1]["content"] == data["answer"] else 0.0

    workflow = ToolUseWorkflow(
        arithmetic_reward_fn, GREEDY, tool_tokenizer, [Calculator()], max_turns=3, turn_reward=turn_reward
    )
    batch = tool_engine.rollout_batch([RECORD], workflow)
    assert batch["rewards"].tolist() == [1.25, 1.25]  # the episode's return: the call's 0.25 + the answer's 1.0
    for row in range(2):
        mask = batch["loss_mask"][row].bool()
        turns, rewards = batch["turn_ids"][row], batch["turn_rewards"][row]
        assert sorted(set(turns[mask].tolist())) == [0, 1] and (turns[~mask] == -1).all()
        last_call, last_answer = (int((turns == k).nonzero().max()) for k in (0, 1))
        assert rewards[last_call].item() == 0.25 and rewards[last_answer].item() == 1.0
        assert rewards.sum().item() == 1.25


def test_without_tools_the_first_reply_is_the_answer(tool_engine, tool_tokenizer):
    """tools=[]: the prompt lists none and nothing the model writes is run as a call."""
    workflow = ToolUseWorkflow(arithmetic_reward_fn, GREEDY, tool_tokenizer, [], max_turns=2)
    batch = tool_engine.rollout_batch([RECORD], workflow)
    text = tool_tokenizer.decode(batch["input_ids"][0][batch["attention_mask"][0]])
    assert "# Tools" not in text and "<tool_response>" not in text
    assert workflow.stats["tool_calls"] == 0 and workflow.stats["turns"] == 2
    assert batch["rewards"].tolist() == [0.0, 0.0]


def test_disabled_tool_keeps_the_prompt_and_fails_the_call(tool_engine, tool_tokenizer):
    workflow = ToolUseWorkflow(arithmetic_reward_fn, GREEDY, tool_tokenizer, [DisabledTool(Calculator())], max_turns=2)
    batch = tool_engine.rollout_batch([RECORD], workflow)
    text = tool_tokenizer.decode(batch["input_ids"][0][batch["attention_mask"][0]])
    assert "calculator(expression): Evaluate an arithmetic expression." in text  # listed as before
    assert "<tool_response>\nerror: calculator is unavailable\n</tool_response>" in text
    assert workflow.stats["tool_errors"] == workflow.stats["tool_calls"] == 2


class Flaky(Calculator):
    """The calculator as the model knows it (same schema, so the same prompt), refusing every call."""

    async def arun(self, arguments):
        raise ToolError(f"cannot take {arguments}")


def test_tool_errors_are_shown_and_counted(tool_engine, tool_tokenizer):
    workflow = ToolUseWorkflow(arithmetic_reward_fn, GREEDY, tool_tokenizer, [Flaky()], max_turns=2)
    batch = tool_engine.rollout_batch([RECORD], workflow)
    text = tool_tokenizer.decode(batch["input_ids"][0][batch["attention_mask"][0]])
    assert "error: cannot take {'expression': '12*34'}" in text
    assert workflow.stats["tool_errors"] == 2 and batch["num_tool_calls"].tolist() == [1, 1]


def test_out_of_turns_while_calling_scores_no_answer(tool_engine, tool_tokenizer):
    workflow = ToolUseWorkflow(arithmetic_reward_fn, GREEDY, tool_tokenizer, [Calculator()], max_turns=1)
    batch = tool_engine.rollout_batch([RECORD], workflow)
    assert batch["rewards"].tolist() == [0.0, 0.0] and batch["num_tool_calls"].tolist() == [0, 0]
    assert _runs(batch["loss_mask"][0][batch["attention_mask"][0]]) == [0, 1]


def test_calculator():
    calc = Calculator()
    run = lambda expr: asyncio.run(calc.arun({"expression": expr}))  # noqa: E731
    assert [run("12*34"), run("(1+2)**3 - 4/8"), run("-7 // 2"), run("7 % 3"), run("1.5*2")] == [
        "408",
        "26.5",
        "-4",
        "1",
        "3",
    ]
    for expr, error in [
        ("__import__('os')", "not arithmetic"),
        ("2**1000", "exponent 1000"),
        ("1/0", "division by zero"),
        ("9" * 300, "characters"),
        ("1 +", "cannot parse"),
        ("(10**60)**60", "more than 100 digits"),
    ]:
        with pytest.raises(ToolError, match=error):
            run(expr)
    with pytest.raises(ToolError, match="takes"):
        asyncio.run(calc.arun({"expr": "1"}))


def test_bad_settings(tool_tokenizer):
    with pytest.raises(ValueError, match="max_turns=0"):
        ToolUseWorkflow(arithmetic_reward_fn, GREEDY, tool_tokenizer, [Calculator()], max_turns=0)
    with pytest.raises(ValueError, match="distinct"):
        ToolUseWorkflow(arithmetic_reward_fn, GREEDY, tool_tokenizer, [Calculator(), Calculator()])
