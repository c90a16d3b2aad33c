"""The README's tool-calling and OpenAI-client examples, taken from the docs verbatim, run."""

import asyncio
import re
from pathlib import Path

import pytest

from arealite.chat.template import render_prompt
from arealite.config import GenerationHyperparameters
from arealite.workflow.tools import ToolError

pytestmark = pytest.mark.timeout(180)
README = Path(__file__).resolve().parents[2] / "README.md"


def section_code(title: str) -> dict:
    """Run the first python block of the README section `title`; returns its namespace."""
    text = README.read_text()
    if f"## {title}\n" not in text:
        pytest.fail(f"no '## {title}' section in README.md")
    section = text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]
    namespace: dict = {}
    exec(compile(re.search(r"```python\n(.*?)```", section, re.S).group(1), f"README {title}", "exec"), namespace)
    return namespace


def test_readme_tool(tool_tokenizer):
    capital = section_code("Tool calling")["Capital"]()
    assert asyncio.run(capital.arun({"country": "Japan"})) == "Tokyo"
    with pytest.raises(ToolError, match="Atlantis"):
        asyncio.run(capital.arun({"country": "Atlantis"}))
    prompt = tool_tokenizer.decode(
        render_prompt(tool_tokenizer, [{"role": "user", "content": "?"}], [capital.schema()])
    )
    assert "capital(country): The capital city of a country." in prompt


def test_readme_agent_workflow(tool_engine, tool_tokenizer):
    workflow_class = section_code("Training agents written against the OpenAI client")["AgentWorkflow"]
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
