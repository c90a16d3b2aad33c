"""An agent program as people write them: the official `openai` package and a tool loop.

It knows nothing of arealite. `OpenAI()` reads its endpoint from OPENAI_BASE_URL; the task
(a JSON object with `messages`) comes on stdin. The model may call a calculator; the program
runs the calls, sends the results back, and prints the model's final answer. Trained by
examples/openai_agent_grpo.py, which scores that answer (docs/agents.md).

    echo '{"messages": [{"role": "user", "content": "47*83="}]}' | OPENAI_BASE_URL=... python examples/openai_agent.py
"""

import json
import re
import sys

from openai import OpenAI

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. 12*34"}},
            "required": ["expression"],
        },
    },
}
MAX_TURNS = 3


def calculate(arguments: str) -> str:
    """Products and sums of integers only; anything else is an error the model reads."""
    try:
        expression = json.loads(arguments)["expression"]
    except (json.JSONDecodeError, KeyError, TypeError):
        return 'error: arguments must be {"expression": "<a*b>"}'
    match = re.fullmatch(r"\s*(-?\d+)\s*([*+-])\s*(-?\d+)\s*", str(expression))
    if not match:
        return f"error: cannot evaluate {expression!r}"
    a, op, b = int(match[1]), match[2], int(match[3])
    return str(a * b if op == "*" else a + b if op == "+" else a - b)


def main() -> None:
    task = json.loads(sys.stdin.read())
    client = OpenAI()
    messages = list(task["messages"])
    answer = ""
    for _ in range(MAX_TURNS):
        reply = client.chat.completions.create(model="policy", messages=messages, tools=[CALCULATOR])
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            answer = message.content or ""
            break
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": calculate(call.function.arguments)})
    print(json.dumps({"answer": answer}))


if __name__ == "__main__":
    main()
