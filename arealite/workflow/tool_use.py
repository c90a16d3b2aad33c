"""`ToolUseWorkflow`: the model solves a task with tools it calls; it is trained on its own tokens only.

Each of the `group_size` samples is an agent loop written against the OpenAI chat API
(`arealite.chat.ChatClient`): ask the model with the tools listed; if it calls tools, run
them and append their results as `tool` messages; ask again; up to `max_turns` replies. The
last reply (when it calls no tool) is the answer, scored by `reward_fn` on the record: the last
turn's reward; `turn_reward(messages, data)` rewards each earlier reply (docs/agents.md §7).

The trajectory is one sequence per sample (per chain, docs/agents.md §2) from the client's records:

    prompt | call | tool result | answer         loss_mask: 0 | 1 | 0 | 1

Tool results (and the chat template's turn markers around them) carry loss mask 0,
logprob 0 and version -1; the model's tokens are never re-tokenized. A tool that rejects
its input (`ToolError`), an unknown tool or arguments that are not JSON give the model an
`error: ...` result and are counted in `stats["tool_errors"]`. With `tools=[]` the prompt
lists no tool and no call is parsed: the first reply is the answer. To measure the same model
on the same prompt without the tool's help, wrap the tool in `DisabledTool`.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import torch

from arealite.chat import ChatClient
from arealite.chat.template import render_prompt
from arealite.config import GenerationHyperparameters
from arealite.interfaces import GenerationEngine, RewardFn, RolloutWorkflow, Trajectory
from arealite.reward.pool import RewardPool
from arealite.rollout.batch import concat_padded
from arealite.workflow.scoring import Scorer
from arealite.workflow.seeding import seeded_gconfig
from arealite.workflow.tools import Tool, ToolError


class ToolUseWorkflow(RolloutWorkflow):
    """`group_size` agent loops per record, each with up to `max_turns` replies and the `tools`."""

    def __init__(
        self,
        reward_fn: RewardFn,
        gconfig: GenerationHyperparameters,
        tokenizer: Any,
        tools: Sequence[Tool],
        max_turns: int = 3,
        reward_pool: RewardPool | None = None,
        reward_timeout: float = 15.0,
        on_reward_error: str = "reject",
        turn_reward: Callable[[list[Any], dict[str, Any]], float] | None = None,
    ) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns={max_turns} must be >= 1 (replies per sample, the answer included)")
        names = [t.name for t in tools]
        if len(set(names)) != len(names) or not all(names):
            raise ValueError(f"tool names {names} must be non-empty and distinct")
        self.gconfig = gconfig
        self.tokenizer = tokenizer
        self.tools = {t.name: t for t in tools}
        self.schemas = [t.schema() for t in tools] or None
        self.max_turns = max_turns
        self.turn_reward = turn_reward
        self.stats: dict[str, int] = {
            "episodes": 0,
            "rejected_groups": 0,
            "turns": 0,
            "tool_calls": 0,
            "tool_errors": 0,
        }
        pool = reward_pool or RewardPool(max_workers=2, timeout=reward_timeout)
        self.scorer = Scorer(reward_fn, pool, on_reward_error, self.stats)

    async def arun_episode(self, engine: GenerationEngine, data: dict[str, Any]) -> Trajectory | None:
        messages = data.get("messages") or [{"role": "user", "content": data["prompt"]}]
        group_id = uuid.uuid4().hex  # one server for the whole group
        prompt_ids = render_prompt(self.tokenizer, messages, self.schemas)
        version = engine.get_version() if self.gconfig.sampling_seed is not None else 0
        results = await asyncio.gather(
            *(
                self._agent(engine, list(messages), data, group_id, prompt_ids, i, version)
                for i in range(self.gconfig.group_size)
            )
        )
        self.stats["episodes"] += 1
        if any(r is None for r in results):
            self.stats["rejected_groups"] += 1
            return None
        traj = concat_padded([t for t, _ in results])
        calls = [[calls] * t["chain"].numel() for t, calls in results]  # every row (chain) of a sample
        traj["num_tool_calls"] = torch.tensor(sum(calls, []), dtype=torch.long)  # [rows]
        return traj

    async def _agent(
        self,
        engine: GenerationEngine,
        messages: list[Any],
        data: dict[str, Any],
        group_id: str,
        prompt_ids: list[int],
        index: int,
        version: int,
    ) -> tuple[dict[str, torch.Tensor], int] | None:
        """One sample: the agent loop, then its reward; None when the reward failed (reject)."""
        client = ChatClient(engine, self.tokenizer, self.gconfig, group_id)
        calls = 0
        turn_rewards: list[float] = []
        for turn in range(self.max_turns):
            # each reply of each sample gets a seed of its own (reproducible runs); None: server-chosen
            seed = seeded_gconfig(self.gconfig, data, prompt_ids, index * self.max_turns + turn, version).sampling_seed
            completion = await client.chat.completions.create(
                model="policy", messages=messages, tools=self.schemas, seed=seed
            )
            message = completion.choices[0].message
            messages.append(message)
            self.stats["turns"] += 1
            if not message.tool_calls or turn == self.max_turns - 1:
                break
            for call in message.tool_calls:
                result = await self._run(call.function.name, call.function.arguments)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
                calls += 1
            turn_rewards.append(0.0 if self.turn_reward is None else float(self.turn_reward(messages, data)))
        last = client.completions[-1]
        answer = "" if message.tool_calls else (message.content or "")  # out of turns while still calling: no answer
        prompt = self.tokenizer.decode(last.prompt_ids, skip_special_tokens=False)
        reward = await self.scorer.score(prompt, answer, last.prompt_ids, last.output_ids, data)
        if reward is None:
            return None
        turn_rewards += [0.0] * (len(client.completions) - len(turn_rewards))  # the answer: `reward`
        return client.trajectory(reward, turn_rewards=turn_rewards), calls

    async def _run(self, name: str, arguments: str) -> str:
        """The result text of one call; what went wrong is shown to the model as `error: ...`."""
        self.stats["tool_calls"] += 1
        tool = self.tools.get(name)
        try:
            if tool is None:
                have = f"available: {sorted(self.tools)}" if self.tools else "no tools are available"
                raise ToolError(f"no tool named {name!r}; {have}")
            try:
                args = json.loads(arguments)
            except json.JSONDecodeError as e:
                raise ToolError(f"arguments are not JSON: {e}") from None
            return await tool.arun(args)
        except ToolError as e:
            self.stats["tool_errors"] += 1
            return f"error: {e}"
