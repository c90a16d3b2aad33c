"""PPOCritic: a value head on the training engine, for GAE advantages.

The critic is the causal LM's backbone with a scalar head (`AutoModelForTokenClassification`
with one label, freshly initialized; the LM head is dropped). Values are token-aligned like
logprobs: `values[b, t]` estimates the return of the state *before* token t is generated,
so it is read from the hidden state at position t - 1 (0 at t = 0 and on padding).

    batch["values"] = critic.compute_values(batch)
    actor.compute_advantages(batch)          # GAE: writes advantages and returns
    critic.ppo_update(batch)                 # clipped value loss against returns
"""

from __future__ import annotations

from functools import partial

import torch

from arealite.algo.losses import AGGREGATIONS, clipped_value_loss
from arealite.config import PPOCriticConfig
from arealite.data.packing import Batch
from arealite.train.engine import FSDPEngine


def load_value_model(path: str, attn_implementation: str, seed: int = 0) -> torch.nn.Module:
    """The backbone at `path` with a new scalar head (no dropout: values must be deterministic).

    The head is drawn from a generator seeded by `seed` alone: the same seed gives the same
    critic whatever the process drew before, and the process's random state is left as it was."""
    from transformers import AutoConfig, AutoModelForTokenClassification

    config = AutoConfig.from_pretrained(path, num_labels=1)
    config.classifier_dropout = 0.0
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return AutoModelForTokenClassification.from_pretrained(
            path, config=config, dtype=torch.float32, attn_implementation=attn_implementation
        )


def packed_token_values(scores: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Head outputs [N, 1] (position i saw tokens <= i) -> token-aligned values [N] in fp32."""
    v = scores[:, 0].float()
    v = torch.cat([v.new_zeros(1), v[:-1]])
    return v.index_fill(0, cu_seqlens[:-1].long().to(v.device), 0.0)


class PPOCritic(FSDPEngine):
    """FSDPEngine over a value model. `total_train_steps` counts training steps."""

    def __init__(self, config: PPOCriticConfig, total_train_steps: int | None = None, build_model=None):
        build_model = build_model or partial(load_value_model, seed=config.seed or 0)
        optimizer_steps = None if total_train_steps is None else total_train_steps * config.ppo_n_minibatches
        super().__init__(config, optimizer_steps, build_model)
        self.config: PPOCriticConfig = config

    @torch.no_grad()
    def compute_values(self, batch: Batch) -> torch.Tensor:
        """Token-aligned values [B, T] at the current weights; 0 at t = 0 and on padding."""
        return self.forward(batch, lambda scores, mb: packed_token_values(scores, mb["cu_seqlens"]))

    def ppo_update(self, batch: Batch) -> dict[str, float]:
        """`ppo_n_minibatches` optimizer steps of the clipped value loss; the update's stats (one dict).

        Needs `values` (the values the advantages were computed with) and `returns`.
        """
        for key, hint in (("values", "critic.compute_values(batch)"), ("returns", "actor.compute_advantages(batch)")):
            if key not in batch:
                raise KeyError(f"critic.ppo_update needs batch[{key!r}]; set it with {hint} first")
        agg = AGGREGATIONS[self.config.loss_agg_mode]
        loss_fn = partial(value_loss, config=self.config)
        weight_fn = lambda mb: agg.weight(mb["loss_mask"].bool(), mb["cu_seqlens"])  # noqa: E731
        n = self.config.ppo_n_minibatches
        return self.train_minibatches(batch, loss_fn, weight_fn, n, "critic.ppo_n_minibatches")


def value_loss(scores: torch.Tensor, mb: Batch, config: PPOCriticConfig) -> tuple[torch.Tensor, dict]:
    """The clipped value loss on one packed micro-batch; scores [N, 1]."""
    dev = scores.device
    cu = mb["cu_seqlens"].to(dev)
    values = packed_token_values(scores, cu)
    loss, stats = clipped_value_loss(
        values, mb["values"].to(dev).float(), mb["returns"].to(dev).float(), mb["loss_mask"].to(dev).bool(), cu,
        config.value_eps_clip, AGGREGATIONS[config.loss_agg_mode].reduce,
    )  # fmt: skip
    return loss, stats
