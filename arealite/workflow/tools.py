"""Tools a model can call in a `ToolUseWorkflow`, and a calculator.

A tool has a name, a description and a JSON schema of its arguments (what the chat template
shows the model), and an async `arun(arguments) -> str` whose result is appended to the
conversation as a `tool` message. A tool that cannot do what was asked raises `ToolError`;
the model then reads `error: <message>` as the result, as agent frameworks do.
`DisabledTool` keeps a tool in the prompt but fails every call: the baseline without the tool.

`calculator_demonstrations` turns arithmetic records into supervised examples of calling the
calculator, for the warm start of the tool-use example (`sft.records_fn`).
"""

from __future__ import annotations

import ast
import math
import operator
from abc import ABC, abstractmethod
from typing import Any

from arealite.chat.template import render_prompt, reply_text


class ToolError(Exception):
    """A tool could not do what the call asked; the message is shown to the model."""


class Tool(ABC):
    """One callable tool. Subclasses set `name`, `description`, `parameters` and write `arun`."""

    name: str = ""
    description: str = ""
    parameters: dict[str, Any] = {"type": "object", "properties": {}}

    def schema(self) -> dict[str, Any]:
        """The OpenAI function-tool definition of this tool (what `tools=[...]` takes)."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    @abstractmethod
    async def arun(self, arguments: dict[str, Any]) -> str:
        """Run the call; the returned text is the tool message. Raise ToolError on bad input.

        Runs on the rollout event loop: anything slow or CPU-heavy must be awaited elsewhere
        (a process pool, a subprocess), never computed here.
        """


class DisabledTool(Tool):
    """`tool` as the model sees it (same name and schema, so the same prompt), but every call
    fails with `error: <name> is unavailable`: the same model and task without the tool."""

    def __init__(self, tool: Tool) -> None:
        self.name, self.description, self.parameters = tool.name, tool.description, tool.parameters

    async def arun(self, arguments: dict[str, Any]) -> str:
        raise ToolError(f"{self.name} is unavailable")


_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}


class Calculator(Tool):
    """Evaluates an arithmetic expression: numbers, + - * / // % **, parentheses.

    Parsed with `ast`, never `eval`; bounded so a call cannot stall the event loop (at most
    `max_chars` characters, exponents up to `max_exponent`, integers up to `max_digits` digits).
    """

    name = "calculator"
    description = "Evaluate an arithmetic expression."
    parameters = {
        "type": "object",
        "properties": {"expression": {"type": "string", "description": "e.g. 12*34"}},
        "required": ["expression"],
    }

    def __init__(self, max_chars: int = 200, max_exponent: int = 64, max_digits: int = 100) -> None:
        self.max_chars = max_chars
        self.max_exponent = max_exponent
        self.max_digits = max_digits

    async def arun(self, arguments: dict[str, Any]) -> str:
        expression = arguments.get("expression")
        if not isinstance(expression, str):
            raise ToolError(f"calculator takes {{'expression': '<arithmetic>'}}, got {arguments!r}")
        return self.evaluate(expression)

    def evaluate(self, expression: str) -> str:
        """The value of `expression` as text: an integer when it is one, else a float."""
        if len(expression) > self.max_chars:
            raise ToolError(f"expression of {len(expression)} characters; at most {self.max_chars}")
        try:
            tree = ast.parse(expression.strip(), mode="eval")
        except SyntaxError as e:
            raise ToolError(f"cannot parse {expression!r}: {e.msg}") from None
        value = self._value(tree.body)
        if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
            value = int(value)
        return str(value)

    def _value(self, node: ast.AST) -> int | float:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](self._value(node.operand))
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = self._value(node.left), self._value(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > self.max_exponent:
                raise ToolError(f"exponent {right} is too large; at most {self.max_exponent}")
            try:
                value = _BINARY[type(node.op)](left, right)
            except ZeroDivisionError:
                raise ToolError("division by zero") from None
            except OverflowError:
                raise ToolError("the result is too large") from None
            if isinstance(value, int) and abs(value).bit_length() > self.max_digits * 3.33:
                raise ToolError(f"the result has more than {self.max_digits} digits")
            if isinstance(value, complex) or (isinstance(value, float) and not math.isfinite(value)):
                raise ToolError("the result is not a finite real number")
            return value
        raise ToolError(f"{ast.unparse(node)!r} is not arithmetic; use numbers, + - * / // % ** and parentheses")


def calculator_demonstrations(
    records: list[dict[str, Any]], tokenizer: Any, config: Any = None
) -> list[dict[str, Any]]:
    """Supervised examples of solving arithmetic records (`{"messages": [user "a*b="], "answer"}`)
    with the calculator: per record, the call (prompt: the question with the tool listed) and
    the answer (prompt: the question, the call and its result). In the chat template's own
    format, so the warm-started model calls tools exactly as `ToolUseWorkflow` parses them.
    Signature of `sft.records_fn`; `config` is unused.
    """
    tools = [Calculator().schema()]
    out = []
    for r in records:
        question = r["messages"]
        expression = question[-1]["content"].strip().rstrip("=").strip()
        call = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"type": "function", "function": {"name": "calculator", "arguments": {"expression": expression}}}
            ],
        }
        result = {"role": "tool", "content": str(r["answer"])}
        answer = {"role": "assistant", "content": str(r["answer"])}
        after_call = question + [call, result]
        out.append(
            {
                "input_ids": render_prompt(tokenizer, question, tools),
                "completion": reply_text(tokenizer, question, call, tools),
            }
        )
        out.append(
            {
                "input_ids": render_prompt(tokenizer, after_call, tools),
                "completion": reply_text(tokenizer, after_call, answer, tools),
            }
        )
    return out
