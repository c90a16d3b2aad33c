"""Messages to prompts through the chat template, tool calls parsed back, continuation tokens."""

import json

import pytest
from transformers import AutoTokenizer

from arealite.chat.template import (
    check_tools,
    continuation_ids,
    parse_tool_calls,
    render_prompt,
    reply_text,
    template_message,
)
from arealite.workflow.tools import Calculator

CALC = Calculator().schema()
CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "12*34"}'}}
    ],
}


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def qwen(shared_data):
    return AutoTokenizer.from_pretrained(str(shared_data / "tokenizers" / "qwen2.5"))


def test_parse_tool_calls():
    text = (
        'Let me see.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+2"}}\n</tool_call>\n'
        '<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>'
    )
    content, calls, bad = parse_tool_calls(text)
    assert content == "Let me see." and bad == 0
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("calculator", {"expression": "1+2"}),
        ("f", {"x": 1}),
    ]


@pytest.mark.parametrize(
    "body",
    [
        '{"name": "f", "arguments": {"x": 1}',
        '["f"]',
        '{"arguments": {}}',
        '{"name": "f", "arguments": [1]}',
        '{"name": "f", "arguments": "not json"}',
    ],
)
def test_malformed_calls_stay_in_the_content(body):
    text = f"<tool_call>\n{body}\n</tool_call>"
    content, calls, bad = parse_tool_calls(text)
    assert calls == [] and bad == 1 and content == text


def test_unterminated_call_is_content():
    content, calls, bad = parse_tool_calls('<tool_call>\n{"name": "calculator", "argu')
    assert calls == [] and bad == 0 and content.startswith("<tool_call>")


def test_template_message_forms():
    openai_types = pytest.importorskip(
        "openai.types.chat", reason="the openai package is an optional extra: pip install -e .[openai]"
    )
    message = openai_types.ChatCompletionMessage.model_validate(CALL | {"content": None})
    out = template_message(message)  # a pydantic object, as agents append completion.choices[0].message
    assert out == {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "calculator", "arguments": {"expression": "12*34"}}}],
    }
    assert template_message(
        {"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    ) == {"role": "system", "content": "ab"}


@pytest.mark.parametrize(
    "message, error",
    [
        ({"role": "robot", "content": "x"}, "role 'robot'"),
        ({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}, "only text parts"),
        (
            {
                "role": "assistant",
                "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{oops"}}],
            },
            "not JSON",
        ),
    ],
)
def test_bad_messages_name_the_problem(message, error):
    with pytest.raises(ValueError, match=error):
        template_message(message)


def test_bad_tools_name_the_fix():
    with pytest.raises(ValueError, match=r"tools\[0\].*not a function tool"):
        check_tools([{"name": "calculator"}])
    assert check_tools([]) is None


def test_continuation_is_the_rest_of_the_full_rendering(tok):
    """prompt + the model's reply + continuation == the template's rendering of the whole conversation."""
    question = [{"role": "user", "content": "12*34="}]
    prompt = render_prompt(tok, question, [CALC])
    reply = tok.encode(reply_text(tok, question, CALL, [CALC])) + [tok.eos_token_id]  # what a model would emit
    tail = continuation_ids(
        tok, question, [{"role": "tool", "tool_call_id": "call_1", "content": "408"}], [CALC], reply[-1]
    )
    full = question + [CALL, {"role": "tool", "content": "408"}]
    assert tok.decode(prompt + reply + tail) == tok.decode(render_prompt(tok, full, [CALC]))
    # a reply cut by the token budget (no stop token): the end-of-turn marker is part of the continuation
    cut = continuation_ids(tok, question, [{"role": "user", "content": "go on"}], None, last_token=tok.encode("x")[0])
    assert tok.decode(cut) == "<|im_end|>\n<|im_start|>user\ngo on<|im_end|>\n<|im_start|>assistant\n"


def test_qwen25_uses_the_same_tool_markup(tok, qwen):
    """What the tiny model is taught to emit parses as a Qwen2.5 tool call, and the turns after
    the system prompt render identically with both templates."""
    question = [{"role": "user", "content": "12*34="}]
    text = reply_text(qwen, question, CALL, [CALC])
    assert text == reply_text(tok, question, CALL, [CALC])
    _, calls, _ = parse_tool_calls(text)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("calculator", {"expression": "12*34"})]
    conv = [
        template_message(m)
        for m in question + [CALL, {"role": "tool", "content": "408"}, {"role": "assistant", "content": "408"}]
    ]
    turns = [t.apply_chat_template(conv, tools=[CALC], tokenize=False).split("<|im_end|>\n", 1)[1] for t in (tok, qwen)]
    assert turns[0] == turns[1]
