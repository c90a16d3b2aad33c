"""The tool-calling and OpenAI-client examples of docs/agents.md (§7, §8; in the README until it was
trimmed), taken from the docs verbatim, run."""

import asyncio
import re
from pathlib import Path

import pytest

from arealite.chat.template import render_prompt
from arealite.config import GenerationHyperparameters
from arealite.workflow.tools import ToolError

pytestmark = pytest.mark.timeout(180)
DOC = Path(__file__).resolve().parents[2] / "docs" / "agents.md"


def section_code(title: str) -> dict:
    """Run the first python block of the docs/agents.md section `title`; returns its namespace."""
    text = DOC.read_text()
    if f"## {title}\n" not in text:
        pytest.fail(f"no '## {title}' section in docs/agents.md")
    section = text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]
    namespace: dict = {}
    exec(
        compile(re.search(r"```python\n(.*?)```", section, re.S).group(1), f"docs/agents.md {title}", "exec"), namespace
    )
    return namespace


def test_readme_tool(tool_tokenizer):
    capital = section_code("7. Tool calling")["Capital"]()
    assert asyncio.run(capital.arun({"country": "Japan"})) == "Tokyo"
    with pytest.raises(ToolError, match="Atlantis"):
        asyncio.run(capital.arun({"country": "Atlantis"}))
    prompt = tool_tokenizer.decode(
        render_prompt(tool_tokenizer, [{"role": "user", "content": "?"}], [capital.schema()])
    )
    assert "capital(country): The capital city of a country." in prompt


def test_readme_agent_workflow(tool_engine, tool_tokenizer):
    workflow_class = section_code("8. Agents written against the OpenAI client, inside a workflow")["AgentWorkflow"]
    workflow = workflow_class(
        GenerationHyperparameters(group_size=2, temperature=0.0, max_new_tokens=80), tool_tokenizer
    )
    record = {"id": "q", "messages": [{"role": "user", "content": "12*34="}], "answer": "408"}
    batch = tool_engine.rollout_batch([record], workflow)
    assert batch["rewards"].tolist() == [1.0, 1.0]  # the tool-calling test model calls, reads 408, answers it
    for row in range(2):
        valid = batch["attention_mask"][row]
        text = tool_tokenizer.decode(batch["input_ids"][row][valid][~batch["loss_mask"][row][valid].bool()])
        assert "<tool_response>\n408\n</tool_response>" in text
