"""Calling a reward function from a workflow: in a process pool, failures counted and handled.

A reward that raises or times out is counted in `stats` and handled by `on_reward_error`:
- "reject" (default): the episode's group is dropped (a group with a missing reward would
  bias group-relative advantages);
- "raise": the episode fails, and with it the batch;
- "zero": scored 0.0 — only when asked for, and still counted.

A reward object with an `ascore` coroutine (an LLM judge, a reward model: `arealite.reward`)
is awaited in the workflow's event loop instead, so that it can batch concurrent samples;
its failures are counted and handled the same way.

A reward function that declares a `truncated` parameter also gets whether the response ran
out of its token budget before a stop token (`arealite.workflow.truncation`); others are
called exactly as before.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from arealite.interfaces import RewardFn
from arealite.reward.pool import RewardError, RewardPool, RewardTimeout, check_picklable

ON_REWARD_ERROR = ("reject", "raise", "zero")
_POSITIONAL = ("prompt", "completion", "prompt_ids", "completion_ids")


class Scorer:
    """Scores completions with `reward_fn` in `pool`; keeps failure counts in `stats`."""

    def __init__(self, reward_fn: RewardFn, pool: RewardPool, on_reward_error: str, stats: dict[str, int]) -> None:
        if on_reward_error not in ON_REWARD_ERROR:
            raise ValueError(
                f"on_reward_error={on_reward_error!r} is not supported; choose one of {list(ON_REWARD_ERROR)}"
            )
        check_picklable(reward_fn)
        self.reward_fn = reward_fn
        self.pool = pool
        self.on_reward_error = on_reward_error
        self.stats = stats
        self.in_process = inspect.iscoroutinefunction(getattr(reward_fn, "ascore", None))  # batches on its own
        self.wants_truncated = _declares(getattr(reward_fn, "ascore", reward_fn), "truncated")
        stats.setdefault("reward_errors", 0)
        stats.setdefault("reward_timeouts", 0)

    async def score(
        self,
        prompt: str,
        completion: str,
        prompt_ids: list[int],
        completion_ids: list[int],
        data: dict[str, Any],
        truncated: bool = False,
    ) -> float | None:
        """The reward, or None when it failed and failures reject the group."""
        extra = {k: v for k, v in data.items() if k not in _POSITIONAL}
        if self.wants_truncated:
            extra["truncated"] = bool(truncated)
        try:
            if self.in_process:
                return await self.reward_fn.ascore(prompt, completion, list(prompt_ids), list(completion_ids), **extra)
            return await self.pool.ascore(
                self.reward_fn, prompt, completion, list(prompt_ids), list(completion_ids), **extra
            )
        except RewardError as e:
            self.stats["reward_timeouts" if isinstance(e, RewardTimeout) else "reward_errors"] += 1
            if self.on_reward_error == "raise":
                raise
            return 0.0 if self.on_reward_error == "zero" else None


def _declares(fn: Callable[..., Any], name: str) -> bool:
    """Whether `fn` names parameter `name` explicitly (a bare **kwargs does not count)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # some builtins and C callables have no signature
        return False
    p = params.get(name)
    return p is not None and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
