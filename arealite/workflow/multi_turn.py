"""`MultiTurnWorkflow`: answer, get feedback when wrong, try again — up to `max_turns` turns.

Each of the `group_size` samples is a conversation. After a wrong answer (reward <= 0) the
user replies with `feedback` and the model answers again, seeing its earlier attempts. The
sample's reward is the reward of its last answer times `turn_discount ** (turns - 1)`, so a
correct first answer is worth most; each answer's own reward, times `turn_discount ** turn`,
is kept as its turn's reward (`turn_ids`, `turn_rewards`: for `actor.adv_estimator=turn_loo`).
The trajectory is one sequence per sample:

    prompt | answer 1 | feedback 1 | answer 2 | ...      loss_mask: 0 | 1 | 0 | 1 | ...

Only the model's own tokens are trained on (and carry logprobs and versions); the model's
tokens are never re-tokenized, the feedback is appended as the chat template renders it.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from typing import Any

import torch

from arealite.config import GenerationHyperparameters
from arealite.interfaces import GenerationEngine, RewardFn, RolloutWorkflow, Trajectory
from arealite.reward.pool import RewardPool
from arealite.rollout.batch import trajectory_from_tokens
from arealite.types import ModelRequest
from arealite.workflow.prompt import encode_messages
from arealite.workflow.scoring import Scorer
from arealite.workflow.seeding import seeded_gconfig
from arealite.workflow.truncation import is_truncated, stop_token_ids

_PLACEHOLDER = "\ue000"  # a private-use character standing for the model's answer in the template


@dataclass
class _Conversation:
    prompt_ids: list[int]
    tokens: list[int] = field(default_factory=list)  # everything after the prompt
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    stop_banned: list[bool] = field(default_factory=list)  # sampled under min_new_tokens's ban (each answer's own)
    turn_ids: list[int] = field(default_factory=list)  # the answer each token belongs to, -1 on feedback
    turn_rewards: dict[int, float] = field(default_factory=dict)
    turns: int = 0
    truncated: bool = False  # the last answer ran out of its token budget

    def add(
        self,
        tokens: list[int],
        logprobs: list[float] | None = None,
        versions: list[int] | None = None,
        stop_banned: list[bool] | None = None,
    ) -> None:
        model = logprobs is not None
        self.stop_banned += stop_banned if stop_banned is not None else [False] * len(tokens)
        self.tokens += tokens
        self.logprobs += logprobs if model else [0.0] * len(tokens)
        self.versions += versions if versions is not None else [-1] * len(tokens)
        self.loss_mask += [int(model)] * len(tokens)
        self.turn_ids += [self.turns if model else -1] * len(tokens)


class MultiTurnWorkflow(RolloutWorkflow):
    """Up to `max_turns` answers per sample, with `feedback` after each wrong one."""

    def __init__(
        self,
        reward_fn: RewardFn,
        gconfig: GenerationHyperparameters,
        tokenizer: Any,
        max_turns: int = 2,
        turn_discount: float = 0.9,
        feedback: str = "Your answer is incorrect. Think again and give your final answer.",
        reward_pool: RewardPool | None = None,
        reward_timeout: float = 15.0,
        on_reward_error: str = "reject",
    ) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns={max_turns} must be >= 1")
        if not 0.0 < turn_discount <= 1.0:
            raise ValueError(f"turn_discount={turn_discount} must be in (0, 1]")
        self.gconfig = gconfig
        self.tokenizer = tokenizer
        self.max_turns = max_turns
        self.turn_discount = turn_discount
        self.feedback = feedback
        self.stats: dict[str, int] = {"episodes": 0, "rejected_groups": 0, "turns": 0}
        pool = reward_pool or RewardPool(max_workers=2, timeout=reward_timeout)
        self.scorer = Scorer(reward_fn, pool, on_reward_error, self.stats)
        self.stop_ids = stop_token_ids(tokenizer, gconfig)

    async def arun_episode(self, engine: GenerationEngine, data: dict[str, Any]) -> Trajectory | None:
        messages = data.get("messages") or [{"role": "user", "content": data["prompt"]}]
        group_id = uuid.uuid4().hex
        version = engine.get_version() if self.gconfig.sampling_seed is not None else 0
        results = await asyncio.gather(
            *(
                self._converse(engine, list(messages), data, group_id, i, version)
                for i in range(self.gconfig.group_size)
            )
        )
        self.stats["episodes"] += 1
        if any(r is None for r in results):
            self.stats["rejected_groups"] += 1
            return None
        convs = [conv for conv, _ in results]
        traj = trajectory_from_tokens(
            [c.prompt_ids for c in convs],
            [c.tokens for c in convs],
            [c.logprobs for c in convs],
            [c.versions for c in convs],
            output_loss_mask=[c.loss_mask for c in convs],
            output_turn_ids=[c.turn_ids for c in convs],
            turn_rewards=[c.turn_rewards for c in convs],
            output_stop_banned=[c.stop_banned for c in convs] if self.gconfig.min_new_tokens else None,
        )
        traj["rewards"] = torch.tensor([reward for _, reward in results], dtype=torch.float32)  # [G]
        traj["num_turns"] = torch.tensor([c.turns for c in convs], dtype=torch.long)  # [G]
        traj["truncated"] = torch.tensor([c.truncated for c in convs], dtype=torch.bool)  # [G]
        return traj

    async def _converse(
        self,
        engine: GenerationEngine,
        messages: list[dict[str, str]],
        data: dict[str, Any],
        group_id: str,
        index: int,
        version: int,
    ) -> tuple[_Conversation, float] | None:
        conv = _Conversation(prompt_ids=encode_messages(self.tokenizer, messages))
        for turn in range(self.max_turns):
            context = conv.prompt_ids + conv.tokens
            # with gconfig.sampling_seed set, each answer of each sample gets a seed of its own (as ToolUseWorkflow)
            gconfig = seeded_gconfig(self.gconfig, data, conv.prompt_ids, index * self.max_turns + turn, version)
            resp = await engine.agenerate(ModelRequest(input_ids=context, gconfig=gconfig, group_id=group_id))
            conv.add(resp.output_tokens, resp.output_logprobs, resp.output_versions, resp.output_stop_banned)
            conv.turns = turn + 1
            conv.truncated = is_truncated(resp, self.stop_ids)
            self.stats["turns"] += 1
            # the reward sees this answer and everything before it (earlier attempts, feedback)
            prompt = self.tokenizer.decode(context, skip_special_tokens=False)
            answer = self.tokenizer.decode(resp.output_tokens, skip_special_tokens=True)
            reward = await self.scorer.score(prompt, answer, context, resp.output_tokens, data, conv.truncated)
            if reward is None:
                return None
            conv.turn_rewards[turn] = reward * self.turn_discount**turn
            if reward > 0 or turn == self.max_turns - 1:
                return conv, reward * self.turn_discount**turn
            conv.add(self.feedback_ids(messages, resp.output_tokens[-1] if resp.output_tokens else None))
            messages = messages + [{"role": "assistant", "content": answer}, {"role": "user", "content": self.feedback}]
        raise AssertionError("unreachable: the last turn always returns")

    def feedback_ids(self, messages: list[dict[str, str]], last_token: int | None) -> list[int]:
        """Tokens between the model's answer and its next answer: the end of the assistant
        turn (minus the stop token the model already produced, `last_token`), the feedback
        turn, and the generation prompt."""
        conv = messages + [{"role": "assistant", "content": _PLACEHOLDER}]
        render = self.tokenizer.apply_chat_template
        before = render(conv, tokenize=False)
        after = render(conv + [{"role": "user", "content": self.feedback}], tokenize=False, add_generation_prompt=True)
        if _PLACEHOLDER not in before or not after.startswith(before):
            raise ValueError(
                "this tokenizer's chat template does not render a conversation as a prefix of its continuation; "
                "MultiTurnWorkflow needs one that does (ChatML/Qwen/Llama templates do)"
            )
        tail = before[before.rindex(_PLACEHOLDER) + len(_PLACEHOLDER) :] + after[len(before) :]
        if last_token is not None and last_token in self.tokenizer.all_special_ids:
            stop_text = self.tokenizer.convert_ids_to_tokens(last_token)
            if tail.startswith(stop_text):
                tail = tail[len(stop_text) :]
        return list(self.tokenizer.encode(tail, add_special_tokens=False))
