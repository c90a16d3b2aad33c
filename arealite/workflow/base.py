"""`RolloutWorkflow`: one episode, from a data record to a scored trajectory.

A workflow is the only thing a user writes to change what an episode is (one answer, a
multi-turn dialogue, tool calls, another reward). It has one async method; the executor
runs many episodes concurrently on the rollout event loop, so an episode must `await` its
model calls (`engine.agenerate`) and never block the loop (run CPU-heavy scoring in a
process pool, as RLVRWorkflow does).
"""

from __future__ import annotations

from typing import Any

import torch


class RolloutWorkflow:
    """Base class of rollout workflows. Subclasses implement `arun_episode`."""

    async def arun_episode(self, engine: Any, data: dict[str, Any]) -> dict[str, torch.Tensor] | None:
        """Run one episode on `data` and return its trajectory, or None to reject it.

        `engine` offers `await engine.agenerate(ModelRequest) -> ModelResponse` and
        `engine.get_version()`. The trajectory is a dict of `[G, T]` tensors with
        `input_ids, attention_mask, loss_mask, logprobs, versions` plus `rewards [G]`
        (see `arealite.rollout.batch.trajectory_from_tokens`), G rows being the samples of one
        group; every trajectory a workflow returns must have the same keys. Optional: `truncated
        [G]` bool (`arealite.workflow.truncation`), read by `actor.mask_no_eos_with_zero` and
        the step stats.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement async arun_episode(engine, data)")
