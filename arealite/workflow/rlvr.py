"""`RLVRWorkflow`: RL with verifiable rewards. One prompt, `group_size` samples, one reward each.

The samples of a group share a `group_id`, so the client sends them to one server (prefix
reuse). Rewards run in a process pool with a timeout; failures are counted in `stats` and
handled by `on_reward_error` (see `arealite.workflow.scoring`), never silently scored 0.
Each sample also records whether it was truncated (`arealite.workflow.truncation`).
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import torch

from arealite.config import GenerationHyperparameters
from arealite.interfaces import GenerationEngine, RewardFn, RolloutWorkflow, Trajectory
from arealite.reward.pool import RewardPool
from arealite.rollout.batch import trajectory_from_tokens
from arealite.types import ModelRequest, ModelResponse
from arealite.workflow.prompt import encode_prompt
from arealite.workflow.scoring import Scorer
from arealite.workflow.seeding import seeded_gconfig
from arealite.workflow.truncation import is_truncated, stop_token_ids


class RLVRWorkflow(RolloutWorkflow):
    """Sample `gconfig.group_size` completions of a prompt and score each with `reward_fn`.

    `reward_fn(prompt, completion, prompt_ids, completion_ids, **data) -> float` must be a
    module-level function (it runs in worker processes); `data` is the record, e.g. `answer`.
    """

    def __init__(
        self,
        reward_fn: RewardFn,
        gconfig: GenerationHyperparameters,
        tokenizer: Any,
        reward_pool: RewardPool | None = None,
        reward_timeout: float = 15.0,
        on_reward_error: str = "reject",
    ) -> None:
        self.gconfig = gconfig
        self.tokenizer = tokenizer
        self.stats: dict[str, int] = {"episodes": 0, "rejected_groups": 0}
        pool = reward_pool or RewardPool(max_workers=2, timeout=reward_timeout)
        self.scorer = Scorer(reward_fn, pool, on_reward_error, self.stats)
        self.stop_ids = stop_token_ids(tokenizer, gconfig)

    async def arun_episode(self, engine: GenerationEngine, data: dict[str, Any]) -> Trajectory | None:
        prompt_ids = encode_prompt(self.tokenizer, data)
        group_id = uuid.uuid4().hex  # one server for the whole group
        # with gconfig.sampling_seed set, sample i gets a seed of its own (reproducible runs)
        version = engine.get_version() if self.gconfig.sampling_seed is not None else 0
        requests = [
            ModelRequest(
                input_ids=list(prompt_ids),
                gconfig=seeded_gconfig(self.gconfig, data, prompt_ids, i, version),
                group_id=group_id,
            )
            for i in range(self.gconfig.group_size)
        ]
        responses: list[ModelResponse] = await asyncio.gather(*(engine.agenerate(r) for r in requests))
        prompt = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        truncated = [is_truncated(r, self.stop_ids) for r in responses]
        rewards = await asyncio.gather(
            *(
                self.scorer.score(
                    prompt,
                    self.tokenizer.decode(r.output_tokens, skip_special_tokens=True),
                    prompt_ids,
                    r.output_tokens,
                    data,
                    cut,
                )
                for r, cut in zip(responses, truncated)
            )
        )
        self.stats["episodes"] += 1
        if any(r is None for r in rewards):
            self.stats["rejected_groups"] += 1
            return None
        traj = trajectory_from_tokens(
            [r.input_tokens for r in responses],
            [r.output_tokens for r in responses],
            [r.output_logprobs for r in responses],
            [r.output_versions for r in responses],
            # the tokens min_new_tokens's ban was on, for the trainer to replay it (arealite/train/logprobs.py)
            output_stop_banned=[r.output_stop_banned for r in responses] if self.gconfig.min_new_tokens else None,
        )
        traj["rewards"] = torch.tensor(rewards, dtype=torch.float32)  # [G]
        traj["truncated"] = torch.tensor(truncated, dtype=torch.bool)  # [G]
        return traj
