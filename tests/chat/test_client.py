"""ChatClient against a real built-in server: OpenAI-shaped results, tool calls, and the
recorded conversation as one training sequence (loss mask on the model's tokens only)."""

import asyncio
import json
import sys

import pytest

from arealite.chat import ChatClient, chat_completion
from arealite.chat.template import render_prompt, render_text
from arealite.config import GenerationHyperparameters
from tests.tool_model import CALCULATOR, GREETING, QUESTION

pytestmark = pytest.mark.timeout(180)
GREEDY = GenerationHyperparameters(temperature=0.0, max_new_tokens=80)


def openai_types():
    return pytest.importorskip(
        "openai.types.chat", reason="the openai package is an optional extra: pip install -e .[openai]"
    )


async def calculator_agent(client, question):
    """Agent code as written against openai.AsyncOpenAI: call, run the tool, call again."""
    messages = list(question)
    first = await client.chat.completions.create(model="policy", messages=messages, tools=[CALCULATOR], logprobs=True)
    message = first.choices[0].message
    messages.append(message)
    for call in message.tool_calls or []:
        expression = json.loads(call.function.arguments)["expression"]
        messages.append({"role": "tool", "tool_call_id": call.id, "content": str(eval(expression, {}))})
    second = await client.chat.completions.create(model="policy", messages=messages, tools=[CALCULATOR])
    return first, second, messages


def test_tool_call_round_trip_with_openai_types(tool_engine, tool_tokenizer):
    types = openai_types()
    client = ChatClient(tool_engine, tool_tokenizer, GREEDY)
    first, second, messages = asyncio.run(calculator_agent(client, QUESTION))

    assert isinstance(first, types.ChatCompletion) and isinstance(second, types.ChatCompletion)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert isinstance(call, types.ChatCompletionMessageToolCall)
    assert call.function.name == "calculator" and json.loads(call.function.arguments) == {"expression": "12*34"}
    assert second.choices[0].finish_reason == "stop" and second.choices[0].message.content == "408"
    assert second.choices[0].message.tool_calls is None

    one, two = client.completions
    assert two.parent is one and client.stats["continued"] == 1
    assert first.usage.completion_tokens == len(one.output_ids) and first.usage.prompt_tokens == len(one.prompt_ids)
    assert [t.logprob for t in choice.logprobs.content] == one.logprobs  # the recorded logprobs are the reported ones
    assert "".join(t.token for t in choice.logprobs.content) == tool_tokenizer.decode(one.output_ids)


def test_conversation_becomes_one_masked_sequence(tool_engine, tool_tokenizer):
    client = ChatClient(tool_engine, tool_tokenizer, GREEDY)
    _, _, messages = asyncio.run(calculator_agent(client, QUESTION))
    traj = client.trajectory(reward=1.0)
    ids, mask = traj["input_ids"][0], traj["loss_mask"][0].bool()
    one, two = client.completions
    n_prompt = len(one.prompt_ids)
    # the whole sequence reads as the template's rendering of the conversation, then the answer
    assert tool_tokenizer.decode(ids) == tool_tokenizer.decode(
        render_prompt(tool_tokenizer, messages, [CALCULATOR]) + two.output_ids
    )
    # loss mask: 0 on the prompt, 1 on the call, 0 on the tool result turn, 1 on the answer
    runs = []
    for value in mask.tolist():
        if not runs or runs[-1][0] != value:
            runs.append([value, 0])
        runs[-1][1] += 1
    assert runs == [
        [False, n_prompt],
        [True, len(one.output_ids)],
        [False, len(two.prompt_ids) - n_prompt - len(one.output_ids)],
        [True, len(two.output_ids)],
    ]
    tool_turn = tool_tokenizer.decode(ids[~mask][n_prompt:])
    assert tool_turn == "\n<|im_start|>user\n<tool_response>\n408\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    version = tool_engine.get_version()
    assert (traj["versions"][0][mask] == version).all() and (traj["versions"][0][~mask] == -1).all()
    assert (traj["logprobs"][0][~mask] == 0).all() and (traj["logprobs"][0][mask] <= 0).all()
    assert traj["rewards"].tolist() == [1.0]


def test_direct_answer_and_choices(tool_engine, tool_tokenizer):
    client = ChatClient(tool_engine, tool_tokenizer, GenerationHyperparameters(max_new_tokens=80))
    done = asyncio.run(
        client.chat.completions.create(
            model="policy", messages=GREETING, tools=[CALCULATOR], temperature=0.0, n=2, seed=5
        )
    )
    assert [c.index for c in done.choices] == [0, 1]
    assert all(
        c.finish_reason == "stop" and c.message.content == "hello" and not c.message.tool_calls for c in done.choices
    )
    assert [r.id for r in client.completions] == [f"{done.id}-0", f"{done.id}-1"] and client.record(
        done.id, 1
    ).parent is None
    short = asyncio.run(
        client.chat.completions.create(model="policy", messages=QUESTION, tools=[CALCULATOR], max_tokens=3)
    )
    assert short.choices[0].finish_reason == "length" and short.usage.completion_tokens == 3
    # under gconfig.min_new_tokens the record marks the tokens sampled without the stop tokens, for the trainer
    banning = ChatClient(tool_engine, tool_tokenizer, GenerationHyperparameters(max_new_tokens=80, min_new_tokens=2))
    done = asyncio.run(banning.chat.completions.create(model="policy", messages=QUESTION, max_tokens=3))
    assert banning.record(done.id, 0).stop_banned == [True, True, False] and client.completions[-1].stop_banned is None


def test_edited_history_starts_a_new_conversation(tool_engine, tool_tokenizer):
    client = ChatClient(tool_engine, tool_tokenizer, GREEDY)
    asyncio.run(client.chat.completions.create(model="policy", messages=GREETING, tools=[CALCULATOR]))
    edited = GREETING + [{"role": "assistant", "content": "good evening"}, {"role": "user", "content": "hi"}]
    asyncio.run(client.chat.completions.create(model="policy", messages=edited, tools=[CALCULATOR]))
    assert client.completions[1].parent is None and client.stats["continued"] == 0
    traj = client.trajectory(0.0)  # two chains, two rows: the first reply is trained too, not dropped
    assert traj["chain"].tolist() == [0, 1]
    assert traj["loss_mask"].sum(-1).tolist() == [len(c.output_ids) for c in client.completions]
    last = client.completions[1]
    assert client.trajectory(0.0, last=last)["loss_mask"].sum() == len(last.output_ids)  # one chain, as asked


# DeepSeek-R1-style: the generation prompt opens <think>, and an earlier assistant turn is rendered
# without its <think>...</think> block (only what follows '</think>'). A request whose history
# holds an earlier reply is then not a token prefix of the conversation the model generated.
THINKING_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\n' + (message['content'] or '').split('</think>')[-1] + '<|im_end|>\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n<think>\n' }}{%- endif %}"
)


def thinking_tokenizer(model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.chat_template = THINKING_TEMPLATE
    return tokenizer


def test_a_template_that_drops_earlier_reasoning_trains_every_chain(tool_engine, tool_model_dir):
    tokenizer = thinking_tokenizer(tool_model_dir)
    client = ChatClient(tool_engine, tokenizer, GenerationHyperparameters(temperature=0.0, max_new_tokens=6))
    messages, requests = list(GREETING), []
    for follow in ("again", "more", None):
        requests.append(list(messages))
        out = asyncio.run(client.chat.completions.create(model="policy", messages=messages))
        messages += [out.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": follow}]
    assert client.stats["new_chains"] == 2 and client.stats["continued"] == 0
    traj = client.trajectory(1.0, turn_rewards=[0.5, 0.0, 0.25])
    assert traj["chain"].tolist() == [0, 1, 2] and traj["rewards"].tolist() == [1.75] * 3
    for k, (rec, request) in enumerate(zip(client.completions, requests)):
        n = len(rec.prompt_ids)
        # each row is what the model saw: the template's own rendering of that request, then its reply
        assert tokenizer.decode(traj["input_ids"][k, :n]) == render_text(tokenizer, request)
        assert traj["input_ids"][k][traj["loss_mask"][k].bool()].tolist() == rec.output_ids  # trained once, here
        assert (traj["turn_ids"][k][traj["loss_mask"][k].bool()] == k).all()
        assert traj["turn_rewards"][k].sum().item() == [0.5, 0.0, 1.25][k]
    assert "<think>" not in render_text(tokenizer, requests[2])[: -len("<think>\n")]  # earlier reasoning dropped


def test_unsupported_arguments_are_refused_before_generating(tool_tokenizer):
    client = ChatClient(None, tool_tokenizer)  # never reaches the engine
    create = client.chat.completions.create
    for kwargs, error in [
        ({"stream": True}, NotImplementedError),
        ({"tool_choice": "required"}, NotImplementedError),
        ({"temprature": 0.5}, TypeError),
        ({"n": 0}, ValueError),
    ]:
        with pytest.raises(error):
            asyncio.run(create(model="m", messages=GREETING, **kwargs))
    with pytest.raises(ValueError, match="messages is empty"):
        asyncio.run(create(model="m", messages=[]))
    with pytest.raises(ValueError, match="no completions yet"):
        client.trajectory(1.0)


def test_results_without_the_openai_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "openai.types.chat", None)  # import fails as if openai were absent
    payload = {
        "id": "x", "object": "chat.completion", "created": 0, "model": "m",
        "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                     "message": {"role": "assistant", "content": "hello", "refusal": None, "tool_calls": None}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }  # fmt: skip
    result = chat_completion(payload)
    assert type(result).__name__ == "ChatObject"
    assert result.choices[0].message.content == "hello" and result.usage.total_tokens == 2
    assert result.choices[0].message.model_dump(exclude_none=True) == {"role": "assistant", "content": "hello"}
    with pytest.raises(AttributeError, match="no field 'nope'"):
        _ = result.nope
