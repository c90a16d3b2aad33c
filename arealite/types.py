"""Plain records passed between the rollout client, workflows and the trainer."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from arealite.config import GenerationHyperparameters


@dataclass
class ModelRequest:
    """One generation request: a prompt as token ids and how to sample from it."""

    input_ids: list[int]
    gconfig: GenerationHyperparameters = field(default_factory=GenerationHyperparameters)
    rid: str = field(default_factory=lambda: uuid.uuid4().hex)
    group_id: str | None = None  # samples sharing a group_id go to the same server
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class ModelResponse:
    """The outcome of a request, after any abort/resubmit cycles.

    `output_versions[i]` is the weight version that produced `output_tokens[i]`;
    `output_stop_banned[i]` whether it was sampled with the stop tokens banned
    (`gconfig.min_new_tokens`: the first that many tokens of the request, over all its segments).
    """

    input_tokens: list[int]
    output_tokens: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    output_versions: list[int] = field(default_factory=list)
    output_stop_banned: list[bool] = field(default_factory=list)
    stop_reason: str = "length"  # stop | length | abort
    latency: float = 0.0
    server: str = ""
    n_interruptions: int = 0  # how many times the request was aborted and resubmitted

    @property
    def input_len(self) -> int:
        return len(self.input_tokens)

    @property
    def output_len(self) -> int:
        return len(self.output_tokens)


@dataclass
class WeightUpdateMeta:
    """How to push new weights to the servers."""

    type: str = "disk"  # disk | distributed | lora
    path: str = ""  # disk: a shared folder the servers can read (lora: the adapter's folder)
    lora_name: str = ""  # lora: the name the servers load the adapter under; /generate selects it by this name
    keep_versions: int = 0  # disk: v<N> folders kept beside `path` once the servers confirm it (0: all)
    version: int = 0
    # distributed: the process group the servers join with the trainer's rank 0
    master_address: str = "127.0.0.1"
    master_port: int = 0
    group_name: str = "arealite_weight_update"
    weight_chunk_mb: int = 256
    backend: str = "gloo"  # distributed: process-group backend the servers join with (gloo | nccl)
    # distributed: seconds the group may take to form and one collective may wait (rollout.weight_update_timeout)
    timeout: float = 45.0
    # distributed: the trainer's broadcast buckets in order, each a list of (name, dtype, shape);
    # the client sends one /update_weights_from_distributed call per bucket
    buckets: list[list[tuple[str, str, list[int]]]] = field(default_factory=list)
