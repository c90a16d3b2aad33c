"""ReferenceModel: a frozen copy of the initial policy, for the KL term.

    batch["ref_logp"] = ref.compute_logp(batch)

Its logprobs are taken at the sampling temperature (`gconfig`), like the actor's, so the KL
term compares the two policies on one distribution. It reuses the engine's sharded forward
and never builds an optimizer, whatever the config says.
"""

from __future__ import annotations

import dataclasses

import torch

from arealite.config import GenerationHyperparameters, TrainEngineConfig
from arealite.data.packing import Batch
from arealite.train.engine import FSDPEngine, load_causal_lm
from arealite.train.logprobs import batch_token_logprobs
from arealite.utils.stop_ids import batch_stop_ids


class ReferenceModel(FSDPEngine):
    """FSDPEngine without an optimizer, exposing `compute_logp`."""

    def __init__(
        self, config: TrainEngineConfig, gconfig: GenerationHyperparameters | None = None, build_model=load_causal_lm
    ):
        super().__init__(dataclasses.replace(config, optimizer=None), None, build_model)
        self.gconfig = gconfig if gconfig is not None else GenerationHyperparameters()

    @torch.no_grad()
    def compute_logp(self, batch: Batch, temperature: float | None = None) -> torch.Tensor:
        """Token-aligned logprobs [B, T] under the reference weights (same convention as the actor's),
        at `temperature` (default: the sampling temperature of `gconfig`)."""
        temp = self.gconfig.logprob_temperature if temperature is None else temperature
        stop_ids = batch_stop_ids(batch, self.config.path, self.gconfig.stop_token_ids)  # min_new_tokens's ban
        return batch_token_logprobs(self, batch, temp, self.gconfig.logprob_truncation, stop_ids)
