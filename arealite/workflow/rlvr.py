"""`RLVRWorkflow`: RL with verifiable rewards. One prompt, `group_size` samples, one reward each.

The samples of a group share a `group_id`, so the client sends them to one server (prefix
reuse). Rewards run in a process pool with a timeout (`RewardPool`). A reward that raises or
times out is counted in `stats` and handled by `on_reward_error`:
- "reject" (default): the whole group is dropped (a group with a missing reward would bias
  group-relative advantages);
- "raise": the episode fails, and with it the batch;
- "zero": scored 0.0 — only when asked for, and still counted.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

import torch

from arealite.config import GenerationHyperparameters
from arealite.reward.pool import RewardError, RewardPool, RewardTimeout, check_picklable
from arealite.rollout.batch import trajectory_from_tokens
from arealite.types import ModelRequest, ModelResponse
from arealite.workflow.base import RolloutWorkflow
from arealite.workflow.prompt import encode_prompt

RewardFn = Callable[..., float]  # fn(prompt, completion, prompt_ids, completion_ids, **data) -> float
ON_REWARD_ERROR = ("reject", "raise", "zero")
_POSITIONAL = ("prompt", "completion", "prompt_ids", "completion_ids")


class RLVRWorkflow(RolloutWorkflow):
    """Sample `gconfig.group_size` completions of a prompt and score each with `reward_fn`."""

    def __init__(
        self,
        reward_fn: RewardFn,
        gconfig: GenerationHyperparameters,
        tokenizer: Any,
        reward_pool: RewardPool | None = None,
        reward_timeout: float = 15.0,
        on_reward_error: str = "reject",
    ) -> None:
        if on_reward_error not in ON_REWARD_ERROR:
            raise ValueError(f"on_reward_error={on_reward_error!r} is not supported; choose one of {list(ON_REWARD_ERROR)}")
        check_picklable(reward_fn)
        self.reward_fn = reward_fn
        self.gconfig = gconfig
        self.tokenizer = tokenizer
        self.reward_pool = reward_pool or RewardPool(max_workers=2, timeout=reward_timeout)
        self.on_reward_error = on_reward_error
        self.stats: dict[str, int] = {"episodes": 0, "reward_errors": 0, "reward_timeouts": 0, "rejected_groups": 0}

    async def arun_episode(self, engine: Any, data: dict[str, Any]) -> dict[str, torch.Tensor] | None:
        prompt_ids = encode_prompt(self.tokenizer, data)
        group_id = uuid.uuid4().hex
        requests = [
            ModelRequest(input_ids=list(prompt_ids), gconfig=self.gconfig, group_id=group_id)
            for _ in range(self.gconfig.group_size)
        ]
        responses: list[ModelResponse] = await asyncio.gather(*(engine.agenerate(r) for r in requests))
        rewards = await asyncio.gather(*(self.score(prompt_ids, r, data) for r in responses))
        self.stats["episodes"] += 1
        if any(r is None for r in rewards):
            self.stats["rejected_groups"] += 1
            return None
        traj = trajectory_from_tokens(
            [r.input_tokens for r in responses],
            [r.output_tokens for r in responses],
            [r.output_logprobs for r in responses],
            [r.output_versions for r in responses],
        )
        traj["rewards"] = torch.tensor(rewards, dtype=torch.float32)  # [G]
        return traj

    async def score(self, prompt_ids: list[int], response: ModelResponse, data: dict[str, Any]) -> float | None:
        """The reward of one sample, or None when it failed and failures reject the group."""
        prompt = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        completion = self.tokenizer.decode(response.output_tokens, skip_special_tokens=True)
        extra = {k: v for k, v in data.items() if k not in _POSITIONAL}
        try:
            return await self.reward_pool.ascore(
                self.reward_fn, prompt, completion, list(prompt_ids), list(response.output_tokens), **extra
            )
        except RewardError as e:
            self.stats["reward_timeouts" if isinstance(e, RewardTimeout) else "reward_errors"] += 1
            if self.on_reward_error == "raise":
                raise
            return 0.0 if self.on_reward_error == "zero" else None
