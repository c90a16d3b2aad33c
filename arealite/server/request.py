"""One generation request as the scheduler sees it: prompt, parameters, and growing output."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from arealite.server.sampling import SamplingParams, UniformStream

# finish_reason objects exactly as SGLang serializes them (docs/protocol.md §1.6).
ABORT_RUNNING = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
ABORT_WAITING = {"type": "abort", "message": "Abort in waiting queue"}


@dataclass
class Req:
    """A single sequence to generate. Output lists only ever grow, so a reader on another
    thread may safely take `output_ids[:n]` for an `n` it was told about."""

    rid: str
    prompt: list[int]
    params: SamplingParams
    max_new_tokens: int  # resolved: never None here
    return_logprob: bool = False
    top_logprobs_num: int = 0
    logprob_start_len: int = -1
    seed: int = 0
    stream: bool = False
    lora: object | None = None  # the LoRA adapter (server/lora.py) this sequence generates with; None: base model
    processed_logprobs: bool = False  # report logprobs of the truncated sampling distribution (sampling.py)
    # Called from the scheduler thread with (req, n_output_tokens, finished).
    on_event: Callable[[Req, int, bool], None] | None = None

    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    output_top: list[list[tuple[float, int]]] = field(default_factory=list)
    output_versions: list[str] = field(default_factory=list)
    input_logprobs: list[float | None] = field(default_factory=list)
    finish_reason: dict | None = None
    num_retractions: int = 0
    started: bool = False  # prefilled at least once (a queued abort has no prompt_tokens)
    created: float = field(default_factory=time.perf_counter)
    uniforms: UniformStream | None = None  # this request's sampling draws (seeded)
    counts: torch.Tensor | None = None  # [V] output-token counts, for penalties
    seen: torch.Tensor | None = None  # [V] bool, prompt + output tokens, for repetition penalty

    def __post_init__(self) -> None:
        self.uniforms = UniformStream(self.seed)

    @property
    def tokens(self) -> list[int]:
        """Everything the model has to have seen before the next sample."""
        return self.prompt + self.output_ids

    def emit(self, finished: bool) -> None:
        if self.on_event is not None:
            self.on_event(self, len(self.output_ids), finished)

    def finish(self, reason: dict) -> None:
        self.finish_reason = reason
        self.emit(True)

    def weight_version_spans(self, n: int) -> list[dict]:
        """0.5.20+'s `weight_versions`: [{version, start, end}] over output-token ranges."""
        spans: list[dict] = []
        start = 0
        for version, run in itertools.groupby(self.output_versions[:n]):
            end = start + len(list(run))
            spans.append({"version": version, "start": start, "end": end})
            start = end
        return spans
