"""The typed contracts between arealite's parts (docs/architecture.md §7).

- What generates (the rollout client, `RemoteSGLangEngine`), by audience: `GenerationEngine` (what a
  workflow gets), `WeightSyncTarget` (what the weight sync drives), `RolloutRunner` (what the
  training script calls); `InferenceEngine` is all three.
- `TrainEngine`: what trains (`FSDPEngine` and its subclasses: actor, critic, reference).
- `RolloutWorkflow`: one episode, from a data record to a scored trajectory. The only thing
  a user writes to change what an episode is (one answer, a multi-turn dialogue, tool calls,
  another reward).

Each interface is implemented once in the library; tests/test_interfaces.py checks that the
implementations keep every member with the same parameter names. This module imports only
torch, `config` and `types`, so anything may depend on it.
"""

from __future__ import annotations

import concurrent.futures
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import Any, Protocol, runtime_checkable

import torch

from arealite.types import ModelRequest, ModelResponse, WeightUpdateMeta

# What one episode returns: `[G, T]` tensors `input_ids, attention_mask, loss_mask, logprobs,
# versions` plus `rewards [G]`, G rows being the samples of one group (docs/architecture.md §5).
Trajectory = dict[str, torch.Tensor]
# Trajectories stacked and right-padded by the executor: `[B, T]` per token, `[B]` per sample.
Batch = dict[str, Any]
# reward_fn(prompt, completion, prompt_ids, completion_ids, **record) -> float
RewardFn = Callable[..., float]
# should_accept(trajectory) -> keep it? (dynamic sampling)
AcceptFn = Callable[[Trajectory], bool]
# loss_fn(logits [N, V] of one packed micro-batch, that micro-batch) -> (scalar loss, stats); one marked
# `train.lm_head.accepts_hidden_states` may get the hidden states the logits come from (head_chunk_tokens)
LossFn = Callable[[torch.Tensor, Batch], tuple[torch.Tensor, dict[str, Any]]]
# loss_weight_fn(packed micro-batch) -> its weight in the global mean (e.g. its loss tokens)
LossWeightFn = Callable[[Batch], float]
# post_hook(logits [N, V], packed micro-batch) -> per-token result [N, ...] (marked: as loss_fn)
PostHook = Callable[[torch.Tensor, Batch], torch.Tensor]


@runtime_checkable
class GenerationEngine(Protocol):
    """What a workflow gets: one sample at a time, and the weight version it comes from."""

    async def agenerate(self, req: ModelRequest) -> ModelResponse:
        """One sample for `req`, surviving interruptions and server failures."""
        ...

    def get_version(self) -> int: ...


@runtime_checkable
class WeightSyncTarget(Protocol):
    """What the weight sync (`arealite.weight_sync`) drives: the servers' weights and version,
    on trainer rank 0 unless noted."""

    def get_version(self) -> int: ...

    def set_version(self, version: int) -> None: ...

    def pause(self) -> None:
        """Stop starting episodes and pause generation on every server."""
        ...

    def resume(self, wait: bool = True) -> None:
        """Let the servers generate again; `wait=False` returns before they answered."""
        ...

    def update_weights(self, meta: WeightUpdateMeta) -> concurrent.futures.Future:
        """Load new weights on every server (non-blocking)."""
        ...

    def init_weights_update_group(
        self, meta: WeightUpdateMeta, members: list[str] | None = None
    ) -> concurrent.futures.Future:
        """Have the servers join the trainer's weight-update process group (non-blocking)."""
        ...

    def confirm_version(self, version: int) -> dict[str, str]:
        """{server: weight_version} of the servers in rotation; raises if one reports another."""
        ...

    def set_lora_adapter(self, name: str | None) -> None:
        """Generate with the LoRA adapter loaded as `name` (every trainer rank)."""
        ...

    def current_weight_group(self) -> tuple[WeightUpdateMeta | None, list[str]]:
        """The weight-update group the servers last joined (None if none) and its members."""
        ...

    def weight_group_candidates(self) -> list[str]:
        """Servers a new weight-update group should hold (alive now)."""
        ...

    def leave_weights_update_group(self) -> None: ...

    def exclude_dead(self, addresses: list[str]) -> list[str]:
        """Take the servers of `addresses` that are not alive out of rotation; returns them."""
        ...


@runtime_checkable
class RolloutRunner(Protocol):
    """What the training script uses: episodes run on data, trajectories back as batches."""

    def submit(
        self, data: dict[str, Any], workflow: RolloutWorkflow, should_accept: AcceptFn | None = None
    ) -> None: ...

    def wait(self, count: int, timeout: float | None = None) -> Batch: ...

    def rollout_batch(
        self, data: list[dict[str, Any]], workflow: RolloutWorkflow, should_accept: AcceptFn | None = None
    ) -> Batch:
        """Run `workflow` on every record of `data` now; their trajectories in order."""
        ...

    def submit_batch(
        self, data: list[dict[str, Any]], workflow: RolloutWorkflow, should_accept: AcceptFn | None = None
    ) -> concurrent.futures.Future:
        """`rollout_batch` without waiting for it: a future of the batch (the lockstep schedule)."""
        ...

    def prepare_batch(
        self, dataloader: Iterable[Any], workflow: RolloutWorkflow, should_accept: AcceptFn | None = None
    ) -> Batch:
        """The next training batch, generated asynchronously within the staleness bound."""
        ...


@runtime_checkable
class InferenceEngine(GenerationEngine, WeightSyncTarget, RolloutRunner, Protocol):
    """The rollout client (`RemoteSGLangEngine`) as one type: all three audiences' verbs."""


@runtime_checkable
class TrainEngine(Protocol):
    """A model being trained or evaluated: `FSDPEngine` and its subclasses."""

    device: torch.device
    compute_dtype: torch.dtype

    @property
    def model(self) -> torch.nn.Module: ...

    @property
    def has_lora(self) -> bool:
        """Whether it trains a LoRA adapter: `save` then writes the adapter alone (a peft folder)."""
        ...

    def train_batch(self, batch: Batch, loss_fn: LossFn, loss_weight_fn: LossWeightFn) -> dict[str, float]:
        """One optimizer step on `batch`; collective over trainer ranks."""
        ...

    def forward(self, batch: Batch, post_hook: PostHook | None = None) -> torch.Tensor:
        """Per-token outputs aligned with the padded batch; collective."""
        ...

    def save(self, path: str) -> None:
        """Write the weights as an HF folder (a peft folder with LoRA); collective."""
        ...

    def load(self, path: str) -> None: ...

    def get_version(self) -> int: ...

    def set_version(self, version: int) -> None: ...


class RolloutWorkflow(ABC):
    """One episode: a data record in, a trajectory (or None to reject it) out.

    The executor runs many episodes concurrently on the rollout event loop, so an episode
    must `await` its model calls (`engine.agenerate`) and never block the loop (run
    CPU-heavy scoring in a process pool, as RLVRWorkflow does).
    """

    @abstractmethod
    async def arun_episode(self, engine: GenerationEngine, data: dict[str, Any]) -> Trajectory | None:
        """Run one episode on `data` and return its trajectory, or None to reject it.

        The trajectory is a dict of `[G, T]` tensors with `input_ids, attention_mask,
        loss_mask, logprobs, versions` plus `rewards [G]` (see
        `arealite.rollout.batch.trajectory_from_tokens`), G rows being the samples of one
        group; every trajectory a workflow returns must have the same keys. Optional:
        `truncated [G]` bool (`arealite.workflow.truncation`), read by
        `actor.mask_no_eos_with_zero` and the step stats.
        """
