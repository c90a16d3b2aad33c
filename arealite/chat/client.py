"""`ChatClient`: an OpenAI-compatible chat client over the rollout client, for training agents.

    client = ChatClient(engine, tokenizer, gconfig)
    completion = await client.chat.completions.create(model="policy", messages=[...], tools=[...])
    trajectory = client.trajectory(reward)    # the conversation: one training row per chain

`create` takes `openai.AsyncOpenAI`'s arguments and returns a `ChatCompletion` (the `openai`
class when installed). Each choice is one `engine.agenerate`; a request that continues an
earlier completion continues its tokens (never re-tokenized), so the loss mask covers exactly
the model's tokens; a request whose history the template renders otherwise (it drops earlier
reasoning; the agent compacted it) starts a new chain, trained as a further row of the episode.
Streaming, `tool_choice="required"`, top logprobs and response formats
raise a clear error (docs/agents.md).
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import time
import uuid
from collections.abc import Sequence
from typing import Any

from arealite.chat.record import CompletionRecord, conversation_trajectory, episode_trajectory
from arealite.chat.template import (
    check_tools,
    continuation_ids,
    parse_tool_calls,
    render_prompt,
    render_text,
    template_message,
)
from arealite.config import GenerationHyperparameters
from arealite.interfaces import GenerationEngine
from arealite.types import ModelRequest, ModelResponse

_UNSUPPORTED = {  # accepted by OpenAI, refused here unless left at their default
    "stream": (None, False),
    "response_format": (None,),
    "logit_bias": (None,),
    "presence_penalty": (None, 0, 0.0),
    "top_logprobs": (None, 0),
    "function_call": (None,),
    "functions": (None,),
    "stream_options": (None,),
}
_IGNORED = ("user", "metadata", "store", "service_tier", "extra_headers", "extra_query", "extra_body", "timeout")


class ChatClient:
    """OpenAI-style `chat.completions.create` over a `GenerationEngine`, recording every completion.

    `engine` offers `await engine.agenerate(ModelRequest)` (the rollout client). `gconfig`
    holds the default sampling settings; `create`'s `temperature`, `top_p`, `max_tokens`,
    `stop`, `seed` and `frequency_penalty` override them per call. Every request carries
    `group_id`, so one client's calls go to one server (prefix reuse).
    """

    def __init__(
        self,
        engine: GenerationEngine,
        tokenizer: Any,
        gconfig: GenerationHyperparameters | None = None,
        group_id: str | None = None,
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.gconfig = gconfig or GenerationHyperparameters()
        self.group_id = group_id or uuid.uuid4().hex
        self.completions: list[CompletionRecord] = []  # every choice of every completion, in order
        self._replies: dict[str, CompletionRecord] = {}  # conversation key (up to the reply) -> its record
        self.stats: dict[str, int] = {"completions": 0, "continued": 0, "new_chains": 0, "malformed_tool_calls": 0}
        self.chat = _Namespace(completions=_Namespace(create=self.create))

    async def create(
        self,
        *,
        messages: list[Any],
        model: str = "arealite",
        tools: list[Any] | None = None,
        tool_choice: Any = None,
        temperature: float | None = None,
        top_p: float | None = None,
        max_tokens: int | None = None,
        max_completion_tokens: int | None = None,
        stop: str | list[str] | None = None,
        n: int | None = None,
        seed: int | None = None,
        frequency_penalty: float | None = None,
        logprobs: bool | None = None,
        parallel_tool_calls: bool | None = None,
        **kwargs: Any,
    ) -> Any:
        """One chat completion; the arguments and the result follow OpenAI's API."""
        self._check_kwargs(kwargs)
        if not messages:
            raise ValueError("messages is empty; give at least one message")
        if tool_choice not in (None, "auto", "none"):
            raise NotImplementedError(f"tool_choice={tool_choice!r} is not supported; use 'auto' or 'none'")
        n = 1 if n is None else int(n)
        if n < 1:
            raise ValueError(f"n={n} must be >= 1")
        tools = None if tool_choice == "none" else check_tools(tools)
        msgs = [template_message(m) for m in messages]
        gconfig = self._gconfig(temperature, top_p, max_tokens or max_completion_tokens, stop, frequency_penalty)
        prompt_ids, parent = self._prompt(msgs, tools)
        completion_id = f"chatcmpl-{uuid.uuid4().hex}"
        base_seed = gconfig.sampling_seed if seed is None else int(seed)  # choice i samples with base + i
        requests = [
            ModelRequest(
                input_ids=list(prompt_ids),
                gconfig=gconfig if base_seed is None else dataclasses.replace(gconfig, sampling_seed=base_seed + i),
                group_id=self.group_id,
            )
            for i in range(n)
        ]
        responses: list[ModelResponse] = list(await asyncio.gather(*(self.engine.agenerate(r) for r in requests)))
        choices = [
            self._choice(i, resp, completion_id, msgs, tools, prompt_ids, parent, bool(logprobs))
            for i, resp in enumerate(responses)
        ]
        out_tokens = sum(r.output_len for r in responses)
        payload = {
            "id": completion_id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": choices,
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": out_tokens,
                "total_tokens": len(prompt_ids) + out_tokens,
            },
        }
        return chat_completion(payload)

    def trajectory(
        self, reward: float = 0.0, last: CompletionRecord | None = None, turn_rewards: Sequence[float] | None = None
    ) -> dict:
        """The episode as training rows (loss mask 1 on the model's tokens only): one per chain of
        completions, each completion trained in exactly one, with `turn_ids` (turn k is
        `self.completions[k]`), `turn_rewards` (`turn_rewards[k]`, one per completion, plus `reward`
        on the last turn), `chain` [R] and `rewards` [R] (the episode's return on every row).
        With `last`: only the conversation ending there, as one row with `rewards` [1] = `reward`."""
        if last is not None:
            return conversation_trajectory(last, reward)
        if not self.completions:
            raise ValueError("this client has no completions yet; call chat.completions.create first")
        return episode_trajectory(self.completions, turn_rewards, reward)

    def record(self, completion_id: str, index: int = 0) -> CompletionRecord:
        """The record of choice `index` of the completion with id `completion_id`."""
        for rec in self.completions:
            if rec.id == f"{completion_id}-{index}":
                return rec
        raise KeyError(f"no completion {completion_id!r} with choice {index} was made by this client")

    # ---- internals ----

    def _check_kwargs(self, kwargs: dict[str, Any]) -> None:
        for name, value in kwargs.items():
            if name in _IGNORED:
                continue
            if name in _UNSUPPORTED:
                if value not in _UNSUPPORTED[name]:
                    raise NotImplementedError(f"ChatClient does not support {name}={value!r}; leave it unset")
                continue
            raise TypeError(f"create() got an unexpected keyword argument {name!r}")

    def _gconfig(self, temperature, top_p, max_tokens, stop, frequency_penalty) -> GenerationHyperparameters:
        changes: dict[str, Any] = {"group_size": 1}
        if temperature is not None:
            changes["temperature"] = float(temperature)
        if top_p is not None:
            changes["top_p"] = float(top_p)
        if max_tokens is not None:
            changes["max_new_tokens"] = int(max_tokens)
        if stop is not None:
            changes["stop"] = [stop] if isinstance(stop, str) else list(stop)
        if frequency_penalty is not None:
            changes["frequency_penalty"] = float(frequency_penalty)
        return dataclasses.replace(self.gconfig, **changes)

    def _prompt(
        self, msgs: list[dict[str, Any]], tools: list[dict] | None
    ) -> tuple[list[int], CompletionRecord | None]:
        """The prompt of `msgs`: the continuation of the latest earlier completion they extend, else rendered afresh."""
        for i in range(len(msgs) - 1, -1, -1):
            if msgs[i]["role"] != "assistant":
                continue
            parent = self._replies.get(_key(tools, msgs[: i + 1]))
            if parent is None:
                continue
            last = parent.output_ids[-1] if parent.output_ids else None
            try:
                extra = continuation_ids(self.tokenizer, parent.messages, msgs[i + 1 :], tools, last)
            except ValueError:
                break  # a template that cannot continue token for token: render afresh
            ids = parent.prompt_ids + parent.output_ids + extra
            if not self._renders_as(msgs, tools, ids):
                self.stats["new_chains"] += 1
                break  # the template renders this history otherwise (drops earlier reasoning): a new chain
            self.stats["continued"] += 1
            return ids, parent
        return render_prompt(self.tokenizer, msgs, tools), None

    def _renders_as(self, msgs: list[dict[str, Any]], tools: list[dict] | None, ids: list[int]) -> bool:
        """Whether the template renders `msgs` (with the generation prompt) as exactly the text of `ids`:
        the model then sees in training what a fresh rendering of the request would show it."""
        text = self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        return text == render_text(self.tokenizer, msgs, tools)

    def _choice(
        self,
        index: int,
        resp: ModelResponse,
        completion_id: str,
        msgs: list[dict[str, Any]],
        tools: list[dict] | None,
        prompt_ids: list[int],
        parent: CompletionRecord | None,
        want_logprobs: bool,
    ) -> dict[str, Any]:
        text = self.tokenizer.decode(resp.output_tokens, skip_special_tokens=True)
        content, calls, malformed = parse_tool_calls(text) if tools else (text, [], 0)
        self.stats["malformed_tool_calls"] += malformed
        self.stats["completions"] += 1
        wire_calls = [
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            }
            for c in calls
        ]
        message = {"role": "assistant", "content": content or None, "refusal": None, "tool_calls": wire_calls or None}
        record = CompletionRecord(
            id=f"{completion_id}-{index}",
            messages=msgs,
            tools=tools,
            prompt_ids=list(prompt_ids),
            output_ids=list(resp.output_tokens),
            logprobs=list(resp.output_logprobs),
            versions=list(resp.output_versions),
            stop_banned=list(resp.output_stop_banned) if self.gconfig.min_new_tokens else None,
            stop_reason=resp.stop_reason,
            message=template_message(message),
            parent=parent,
        )
        self.completions.append(record)
        self._replies[_key(tools, msgs + [record.message])] = record
        finish = "tool_calls" if calls else ("length" if resp.stop_reason == "length" else "stop")
        return {
            "index": index,
            "finish_reason": finish,
            "message": message,
            "logprobs": self._logprobs(resp) if want_logprobs else None,
        }

    def _logprobs(self, resp: ModelResponse) -> dict[str, Any]:
        content = []
        for tok, lp in zip(resp.output_tokens, resp.output_logprobs):
            piece = self.tokenizer.decode([tok], skip_special_tokens=False)
            content.append({"token": piece, "logprob": float(lp), "bytes": list(piece.encode()), "top_logprobs": []})
        return {"content": content, "refusal": None}


def _key(tools: list[dict] | None, msgs: list[dict[str, Any]]) -> str:
    """A conversation's identity for matching: roles, text and tool calls (not their ids)."""
    canon = [
        {
            "role": m["role"],
            "content": m.get("content") or "",
            "tool_calls": [[c["function"]["name"], c["function"]["arguments"]] for c in m.get("tool_calls", [])],
        }
        for m in msgs
    ]
    return json.dumps({"tools": tools, "messages": canon}, sort_keys=True, ensure_ascii=False)


class _Namespace:
    """`client.chat.completions.create`: attribute paths shaped like the OpenAI client's."""

    def __init__(self, **attrs: Any) -> None:
        self.__dict__.update(attrs)


class ChatObject:
    """Attribute access to an OpenAI-shaped dict: the result type when `openai` is not installed."""

    def __init__(self, data: dict[str, Any]) -> None:
        self._data = data

    def __getattr__(self, name: str) -> Any:
        try:
            value = self._data[name]
        except KeyError:
            raise AttributeError(f"{type(self).__name__} has no field {name!r}") from None
        return _wrap(value)

    def model_dump(self, exclude_none: bool = False) -> dict[str, Any]:
        return _drop_none(self._data) if exclude_none else copy.deepcopy(self._data)

    def __repr__(self) -> str:
        return f"ChatObject({self._data!r})"


def _wrap(value: Any) -> Any:
    if isinstance(value, dict):
        return ChatObject(value)
    if isinstance(value, list):
        return [_wrap(v) for v in value]
    return value


def _drop_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value]
    return value


def chat_completion(payload: dict[str, Any]) -> Any:
    """`payload` (OpenAI's wire form) as `openai.types.chat.ChatCompletion`, or a ChatObject without `openai`."""
    try:
        from openai.types.chat import ChatCompletion
    except ImportError:
        return ChatObject(payload)
    return ChatCompletion.model_validate(payload)
