"""AgentEndpoint over HTTP with the official `openai` client: sessions by base URL or header,
tools, n, seed and logprobs as OpenAI returns them, OpenAI-format 400s for bad requests (the
server keeps serving), 404 for unknown and finished sessions, loopback by default."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import openai
import pytest

from arealite.agent import SESSION_HEADER, AgentEndpoint
from arealite.config import GenerationHyperparameters
from tests.tool_model import CALCULATOR, GREETING, QUESTION

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def endpoint(tool_engine, tool_tokenizer):
    gconfig = GenerationHyperparameters(max_new_tokens=96, temperature=0.0)
    ep = AgentEndpoint(tool_engine, tool_tokenizer, gconfig)
    tool_engine._loop.run(ep.start())
    yield ep
    tool_engine._loop.run(ep.stop())


def _post(url: str, body: bytes, headers: dict | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(url, body, {"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_a_session_answers_like_openai_and_records_every_choice(endpoint):
    assert endpoint.host == "127.0.0.1"
    session = endpoint.open_session()
    client = openai.OpenAI(base_url=session.base_url, api_key="x", max_retries=0)
    call = client.chat.completions.create(model="policy", messages=QUESTION, tools=[CALCULATOR], logprobs=True)
    (tool_call,) = call.choices[0].message.tool_calls
    assert call.choices[0].finish_reason == "tool_calls" and json.loads(tool_call.function.arguments) == {
        "expression": "12*34"
    }
    record = session.client.completions[-1]
    assert [t.logprob for t in call.choices[0].logprobs.content] == record.logprobs  # what was sent is what is kept
    follow = [*QUESTION, call.choices[0].message.model_dump(exclude_none=True)]
    follow.append({"role": "tool", "tool_call_id": tool_call.id, "content": "408"})
    answer = client.chat.completions.create(model="policy", messages=follow, tools=[CALCULATOR])
    assert answer.choices[0].message.content == "408"
    assert session.client.completions[-1].parent is record  # continued token for token, not re-rendered
    many = client.chat.completions.create(model="policy", messages=GREETING, n=3, seed=5, temperature=1.0, max_tokens=4)
    again = client.chat.completions.create(
        model="policy", messages=GREETING, n=3, seed=5, temperature=1.0, max_tokens=4
    )
    assert len(many.choices) == 3 and [c.message.content for c in many.choices] == [
        c.message.content for c in again.choices
    ]  # seeded: reproducible
    assert len(session.client.completions) == 2 + 6


def test_the_session_header_selects_a_session_too(endpoint):
    session = endpoint.open_session()
    client = openai.OpenAI(
        base_url=f"{endpoint.address}/v1", api_key="x", max_retries=0, default_headers={SESSION_HEADER: session.id}
    )
    out = client.chat.completions.create(model="policy", messages=GREETING, tools=[CALCULATOR], max_tokens=4)
    assert out.choices[0].message.content == "hello" and len(session.client.completions) == 1


def test_bad_requests_get_openai_errors_and_the_endpoint_keeps_serving(endpoint):
    session = endpoint.open_session()
    client = openai.OpenAI(base_url=session.base_url, api_key="x", max_retries=0)
    bad = [
        ({"messages": []}, "messages is empty"),
        ({"messages": GREETING, "n": 0}, "n=0"),
        ({"messages": GREETING, "stream": True}, "stream"),
        ({"messages": GREETING, "tool_choice": "required"}, "tool_choice"),
        ({"messages": GREETING, "extra_body": {"no_such_argument": 1}}, "no_such_argument"),
    ]
    for kwargs, words in bad:
        with pytest.raises(openai.BadRequestError, match=words) as info:
            client.chat.completions.create(model="policy", **kwargs)
        assert info.value.status_code == 400 and info.value.body["type"] == "invalid_request_error"
    for body in (b"{not json", b"[1, 2]", b'{"model": "policy"}'):
        status, payload = _post(f"{session.base_url}/chat/completions", body)
        assert status == 400 and payload["error"]["message"], (body, payload)
    status, payload = _post(f"{session.base_url}/reward", b'{"reward": "high"}')
    assert status == 400 and "finite number" in payload["error"]["message"]
    out = client.chat.completions.create(model="policy", messages=GREETING, tools=[CALCULATOR], max_tokens=4)
    assert out.choices[0].message.content == "hello"


def test_unknown_and_finished_sessions_are_404(endpoint):
    session = endpoint.open_session()
    client = openai.OpenAI(base_url=session.base_url, api_key="x", max_retries=0)
    client.chat.completions.create(model="policy", messages=GREETING, tools=[CALCULATOR], max_tokens=4)
    endpoint.close_session(session.id)
    with pytest.raises(openai.NotFoundError, match="unknown or finished"):
        client.chat.completions.create(model="policy", messages=GREETING, tools=[CALCULATOR], max_tokens=4)
    stranger = openai.OpenAI(base_url=f"{endpoint.address}/s/nope/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.NotFoundError):
        stranger.chat.completions.create(model="policy", messages=GREETING)
    status, payload = _post(f"{endpoint.address}/v1/chat/completions", json.dumps({"messages": GREETING}).encode())
    assert status == 404 and SESSION_HEADER in payload["error"]["message"]


def test_per_turn_rewards_and_a_template_that_drops_earlier_reasoning(tool_engine, tool_model_dir):
    """A program on a thinking template (earlier <think> blocks dropped from the history): each
    request is its own chain, every reply is trained, and the rewards it POSTs per turn (by turn
    index or by completion id) land on those turns' tokens."""
    from tests.chat.test_client import thinking_tokenizer

    gconfig = GenerationHyperparameters(max_new_tokens=6, temperature=0.0)
    ep = AgentEndpoint(tool_engine, thinking_tokenizer(tool_model_dir), gconfig)
    tool_engine._loop.run(ep.start())
    try:
        session = ep.open_session()
        client = openai.OpenAI(base_url=session.base_url, api_key="x", max_retries=0)
        messages = list(GREETING)
        first = client.chat.completions.create(model="policy", messages=messages)
        messages += [first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "again"}]
        second = client.chat.completions.create(model="policy", messages=messages)
        url = f"{session.base_url}/reward"
        assert _post(url, json.dumps({"reward": 0.5, "turn": 0}).encode()) == (200, {"ok": True, "turn": 0})
        status, payload = _post(url, json.dumps({"reward": -0.25, "completion_id": second.id}).encode())
        assert (status, payload) == (200, {"ok": True, "turn": 1})
        assert _post(url, b'{"reward": 1.0}') == (200, {"ok": True})
        for body, words in [({"reward": 1.0, "turn": 2}, "turn=2"), ({"reward": 1.0, "completion_id": "x"}, "'x'")]:
            status, payload = _post(url, json.dumps(body).encode())
            assert status == 400 and words in payload["error"]["message"], payload
        assert session.client.stats["new_chains"] == 1
        traj = session.trajectory(session.reward)
    finally:
        tool_engine._loop.run(ep.stop())
    assert traj["chain"].tolist() == [0, 1] and traj["rewards"].tolist() == [1.25, 1.25]
    for k, rec in enumerate(session.client.completions):
        mask = traj["loss_mask"][k].bool()
        assert traj["input_ids"][k][mask].tolist() == rec.output_ids and (traj["turn_ids"][k][mask] == k).all()
    assert traj["turn_rewards"].sum(-1).tolist() == [0.5, 0.75]  # turn 1: -0.25 + the episode's 1.0
