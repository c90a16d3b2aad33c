"""Chat messages and tool schemas to prompt tokens, through the tokenizer's chat template, and
tool calls parsed back out of a completion.

Messages arrive in OpenAI's wire form (dicts, or the `openai` package's pydantic objects) and
are handed to the template in the form Hugging Face templates expect: text content, and tool
call arguments as a dict rather than a JSON string.

Tool calls use the markup of Qwen2.5's template (Hermes style), which the tiny test model's
template follows too:

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "12*34"}}
    </tool_call>

A conversation that goes on after a completion is never re-tokenized: `continuation_ids`
renders only the text between the end of the model's reply and the next generation prompt,
so the next prompt is the previous prompt + the model's own tokens + that text.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

ROLES = ("system", "developer", "user", "assistant", "tool")
_PLACEHOLDER = "\ue000"  # a private-use character standing for the model's reply in the template
_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


@dataclass
class ParsedToolCall:
    """One tool call found in a completion: the function's name and its arguments as JSON text."""

    name: str
    arguments: str


def as_dict(message: Any) -> dict[str, Any]:
    """A message as a plain dict (pydantic objects from the `openai` package are dumped)."""
    if hasattr(message, "model_dump"):
        return message.model_dump(exclude_none=True)
    if isinstance(message, dict):
        return message
    raise TypeError(f"a chat message must be a dict or an openai message object, not {type(message).__name__}")


def _text(content: Any, role: str) -> str:
    """OpenAI content (a string, None, or a list of parts) as text; only text parts are supported."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        part = as_dict(part)
        if part.get("type") not in ("text", "input_text"):
            raise ValueError(
                f"{role} message has a content part of type {part.get('type')!r}; only text parts are supported"
            )
        parts.append(part["text"])
    return "".join(parts)


def _arguments(raw: Any, name: str) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    try:
        value = json.loads(raw or "{}")
    except json.JSONDecodeError as e:
        raise ValueError(f"tool call {name!r} has arguments that are not JSON ({raw!r}): {e}") from e
    if not isinstance(value, dict):
        raise ValueError(f"tool call {name!r} has arguments {raw!r}; they must be a JSON object")
    return value


def template_message(message: Any) -> dict[str, Any]:
    """One message in the form chat templates expect (tool call arguments as dicts)."""
    m = as_dict(message)
    role = m.get("role")
    if role not in ROLES:
        raise ValueError(f"message role {role!r} is not supported; use one of {list(ROLES)}")
    out: dict[str, Any] = {"role": "system" if role == "developer" else role, "content": _text(m.get("content"), role)}
    if role == "assistant" and m.get("tool_calls"):
        calls = []
        for call in m["tool_calls"]:
            fn = as_dict(call)["function"]
            fn = as_dict(fn)
            calls.append(
                {
                    "type": "function",
                    "function": {"name": fn["name"], "arguments": _arguments(fn.get("arguments"), fn["name"])},
                }
            )
        out["tool_calls"] = calls
    if role == "tool" and m.get("tool_call_id"):
        out["tool_call_id"] = m["tool_call_id"]
    return out


def check_tools(tools: list[Any] | None) -> list[dict[str, Any]] | None:
    """OpenAI tool definitions (`{"type": "function", "function": {"name", "description", "parameters"}}`)."""
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        t = as_dict(tool)
        fn = t.get("function")
        if t.get("type") != "function" or not isinstance(fn, dict) or not fn.get("name"):
            raise ValueError(
                f"tools[{i}] = {t!r} is not a function tool; write it as "
                '{"type": "function", "function": {"name": ..., "description": ..., "parameters": {...}}}'
            )
        out.append({"type": "function", "function": {"description": "", **fn}})
    return out


def _render(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict] | None, generation_prompt: bool) -> str:
    # tokenize=False then encode: transformers 5 returns a BatchEncoding for tokenize=True
    return tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=generation_prompt, tokenize=False)


def render_text(tokenizer: Any, messages: list[Any], tools: list[dict] | None = None) -> str:
    """The prompt text of `messages` (and `tools`) with the assistant's generation prompt."""
    return _render(tokenizer, [template_message(m) for m in messages], tools, True)


def render_prompt(tokenizer: Any, messages: list[Any], tools: list[dict] | None = None) -> list[int]:
    """Prompt token ids of `messages` (and `tools`) with the assistant's generation prompt."""
    text = _render(tokenizer, [template_message(m) for m in messages], tools, True)
    return list(tokenizer.encode(text, add_special_tokens=False))


def continuation_ids(
    tokenizer: Any,
    history: list[Any],
    new_messages: list[Any],
    tools: list[dict] | None = None,
    last_token: int | None = None,
) -> list[int]:
    """Tokens between the model's reply to `history` and its next reply, after `new_messages`.

    That is: the end of the assistant turn (minus the stop token the model already produced,
    `last_token`), the new messages (tool results, a user turn) and the generation prompt.
    Raises ValueError when the template does not render a conversation as a prefix of its
    continuation (then the conversation cannot be extended token for token).
    """
    conv = [template_message(m) for m in history] + [{"role": "assistant", "content": _PLACEHOLDER}]
    before = _render(tokenizer, conv, tools, False)
    after = _render(tokenizer, conv + [template_message(m) for m in new_messages], tools, True)
    if _PLACEHOLDER not in before or not after.startswith(before):
        raise ValueError(
            "this tokenizer's chat template does not render a conversation as a prefix of its continuation; "
            "a conversation can then not be extended token for token (ChatML/Qwen/Llama templates do this)"
        )
    tail = before[before.rindex(_PLACEHOLDER) + len(_PLACEHOLDER) :] + after[len(before) :]
    if last_token is not None and last_token in tokenizer.all_special_ids:
        stop_text = tokenizer.convert_ids_to_tokens(last_token)
        if tail.startswith(stop_text):
            tail = tail[len(stop_text) :]
    return list(tokenizer.encode(tail, add_special_tokens=False))


def reply_text(tokenizer: Any, history: list[Any], reply: Any, tools: list[dict] | None = None) -> str:
    """The text the template renders for the assistant `reply` after `history`, without the
    end-of-turn marker: what a model should generate (before its stop token) to produce it.
    Used to build supervised demonstrations in exactly the template's format."""
    conv = [template_message(m) for m in history]
    prompt = _render(tokenizer, conv, tools, True)
    full = _render(tokenizer, conv + [template_message(reply)], tools, False)
    marker = _render(tokenizer, conv + [{"role": "assistant", "content": _PLACEHOLDER}], tools, False)
    end = marker[marker.rindex(_PLACEHOLDER) + len(_PLACEHOLDER) :]  # e.g. "<|im_end|>\n"
    if not full.startswith(prompt) or not full.endswith(end):
        raise ValueError("this tokenizer's chat template renders the assistant turn in a way reply_text cannot isolate")
    return full[len(prompt) : len(full) - len(end)]


def parse_tool_calls(text: str) -> tuple[str, list[ParsedToolCall], int]:
    """Split a completion into (content, tool calls, number of malformed calls).

    A `<tool_call>` block whose body is not a JSON object with a string `name` (and an
    object, or JSON text of one, as `arguments`) stays in the content and is counted, so the
    caller sees what the model wrote.
    """
    calls: list[ParsedToolCall] = []
    malformed = 0
    kept: list[str] = []
    pos = 0
    for match in _TOOL_CALL.finditer(text):
        call = _parse_call(match.group(1))
        if call is None:
            malformed += 1
            continue
        kept.append(text[pos : match.start()])
        pos = match.end()
        calls.append(call)
    kept.append(text[pos:])
    return "".join(kept).strip(), calls, malformed


def _parse_call(body: str) -> ParsedToolCall | None:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    return ParsedToolCall(obj["name"], json.dumps(args, ensure_ascii=False))
