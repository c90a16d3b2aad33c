"""Sampling parameters (SGLang's `sampling_params`, 0.5.23 semantics) and the batched sampler.

Logprobs follow SGLang 0.5.x: log_softmax(logits / temperature) at the chosen token, after the
frequency/presence/repetition penalties and the min_new_tokens stop-token mask, but BEFORE
top-k/top-p/min-p truncation. Greedy (temperature < 1e-6) is argmax and reports logprobs at
temperature 1, as SGLang rewrites greedy to temperature=1, top_k=1. A request with the
top-level `processed_logprobs: true` (an arealite extension, docs/protocol.md §1.6) gets the
logprobs of the distribution each token was drawn from instead: the truncated, renormalised
one (arealite/algo/truncation.py), which is what the trainer recomputes with
`gconfig.truncated_logprobs`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from functools import cached_property

import torch

from arealite.algo.truncation import TOP_K_ALL, Truncation, sorted_keep, truncation_columns

GREEDY_EPS = 1e-6
MAX_STOP_STRINGS = 32  # 0.5.23 caps the stop list
MAX_LOGIT_BIAS = 100.0  # OpenAI's range for logit_bias values; beyond it fp32 logits overflow to inf


@dataclass
class SamplingParams:
    """Validated per-request sampling parameters (field names and defaults as SGLang 0.5.23)."""

    max_new_tokens: int | None = None  # None: 128, capped at the context left (set by the server)
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = TOP_K_ALL
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    n: int = 1
    sampling_seed: int | None = None
    logit_bias: dict[str, float] | None = None
    stream_interval: int | None = None
    custom_params: dict | None = None
    # Accepted so SGLang clients don't break; they cannot be honoured here and must stay unset.
    stop_regex: str | list[str] | None = None
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    structural_tag: str | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_EPS

    @cached_property
    def truncation(self) -> Truncation:
        """top-k / top-p / min-p as one Truncation (read once: these fields never change after parsing)."""
        return Truncation(self.top_k, self.top_p, self.min_p)

    @property
    def needs_penalties(self) -> bool:
        return self.frequency_penalty != 0.0 or self.presence_penalty != 0.0 or self.repetition_penalty != 1.0

    @cached_property
    def changes_logits(self) -> bool:
        """Whether penalties, a logit bias or min_new_tokens may change this request's logits."""
        return self.needs_penalties or bool(self.logit_bias) or self.min_new_tokens > 0

    def verify(self, vocab_size: int) -> None:
        """Raise ValueError with SGLang's wording for an out-of-range value."""
        _check(
            math.isfinite(self.temperature) and self.temperature >= 0,
            f"temperature must be non-negative, got {self.temperature}.",
        )
        _check(0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}.")
        _check(0 <= self.min_p <= 1, f"min_p must be in [0, 1], got {self.min_p}.")
        _check(self.top_k == -1 or self.top_k >= 1, f"top_k must be -1 (disable), or at least 1, got {self.top_k}.")
        _check(
            -2 <= self.frequency_penalty <= 2, f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}."
        )
        _check(-2 <= self.presence_penalty <= 2, f"presence_penalty must be in [-2, 2], got {self.presence_penalty}.")
        _check(
            0 < self.repetition_penalty <= 2, f"repetition_penalty must be in (0, 2], got {self.repetition_penalty}."
        )
        if self.max_new_tokens is not None:
            _check(self.max_new_tokens >= 0, f"max_new_tokens must be at least 0, got {self.max_new_tokens}.")
            _check(
                0 <= self.min_new_tokens <= self.max_new_tokens,
                f"min_new_tokens must be in [0, max_new_tokens({self.max_new_tokens})], got {self.min_new_tokens}.",
            )
        _check(self.min_new_tokens >= 0, f"min_new_tokens must be at least 0, got {self.min_new_tokens}.")
        _check(self.n >= 1, f"n must be at least 1, got {self.n}.")
        _check(
            len(self.stop) <= MAX_STOP_STRINGS,
            f"stop must have at most {MAX_STOP_STRINGS} strings, got {len(self.stop)}.",
        )
        _check(all(s for s in self.stop), "stop strings must be non-empty.")
        for t in self.stop_token_ids:
            _check(0 <= t < vocab_size, f"stop_token_ids entry {t} is outside the vocabulary [0, {vocab_size}).")
        for k, bias in (self.logit_bias or {}).items():
            _check(
                k.isascii() and k.isdigit() and len(k) <= 12 and int(k) < vocab_size,
                f"logit_bias key {k[:40]!r} is not a token id in [0, {vocab_size}).",
            )
            _check(
                -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS,
                f"logit_bias values must be in [-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}], got {bias} for token {k}.",
            )
        if self.stream_interval is not None:
            _check(self.stream_interval >= 1, f"stream_interval must be at least 1, got {self.stream_interval}.")
        for name in ("stop_regex", "json_schema", "regex", "ebnf", "structural_tag"):
            _check(getattr(self, name) is None, f"{name} is not supported by the built-in arealite server; remove it.")


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


SAMPLING_KEYS = tuple(f.name for f in fields(SamplingParams))


@dataclass
class SampleOutput:
    """What one sampler step chose, for B rows."""

    tokens: torch.Tensor  # [B] long
    logprobs: torch.Tensor  # [B] fp32, log_softmax(logits / T) at tokens
    top_ids: torch.Tensor | None  # [B, K] long, K = max top_logprobs_num in the batch
    top_logprobs: torch.Tensor | None  # [B, K] fp32


def apply_penalties(
    logits: torch.Tensor, counts: torch.Tensor, seen: torch.Tensor, params: list[SamplingParams]
) -> None:
    """In place: OpenAI frequency/presence penalties on output-token counts [B, V], and the
    CTRL repetition penalty on tokens `seen` [B, V] (prompt + output), as SGLang's penalizers."""
    freq = logits.new_tensor([p.frequency_penalty for p in params])[:, None]
    pres = logits.new_tensor([p.presence_penalty for p in params])[:, None]
    rep = logits.new_tensor([p.repetition_penalty for p in params])[:, None]
    logits -= freq * counts + pres * (counts > 0)
    penalized = torch.where(logits > 0, logits / rep, logits * rep)
    logits.copy_(torch.where(seen & (rep != 1.0), penalized, logits))


class UniformStream:
    """One request's uniform [0, 1) draws, from its own seeded generator.

    Drawn `CHUNK` at a time and handed out one per sampled token: the same seed gives the same
    stream, whichever batch the request shares, and a decode step of B rows costs one list
    pop per row instead of B generator calls (a tenth of a tiny model's decode step)."""

    CHUNK = 64

    def __init__(self, seed: int):
        self.generator = torch.Generator().manual_seed(seed)
        self._left: list[float] = []

    def next(self) -> float:
        if not self._left:
            self._left = torch.rand(self.CHUNK, generator=self.generator).tolist()[::-1]
        return self._left.pop()


def sample(
    logits: torch.Tensor,
    params: list[SamplingParams],
    streams: list[UniformStream],
    top_logprobs_num: int = 0,
    processed: list[bool] | None = None,
) -> SampleOutput:
    """Choose one token per row of fp32 `logits` [B, V] (already penalized and masked);
    `streams[i]` gives row i its uniform draw (greedy rows draw nothing). Row i reports
    processed logprobs (of the truncated, renormalised distribution it was sampled from)
    when `processed[i]`, else SGLang's log_softmax(logits / T)."""
    temps = [1.0 if p.greedy else p.temperature for p in params]
    scaled = logits if all(t == 1.0 for t in temps) else logits / logits.new_tensor(temps)[:, None]
    logprobs_all = torch.log_softmax(scaled, dim=-1)  # [B, V]
    sampled_rows = [i for i, p in enumerate(params) if not p.greedy]
    uniforms = scaled.new_tensor([streams[i].next() for i in sampled_rows])
    keep = None  # [len(sampled_rows), V] support of the sampled rows, when something truncates
    if len(sampled_rows) == len(params):  # the usual RL batch: every row samples
        tokens, keep = _sample_truncated(scaled, params, uniforms)
    else:
        tokens = scaled.argmax(dim=-1)
        if sampled_rows:
            rows = torch.tensor(sampled_rows, dtype=torch.long, device=logits.device)
            tokens[rows], keep = _sample_truncated(scaled[rows], [params[i] for i in sampled_rows], uniforms)
    if processed is not None and any(processed):
        logprobs_all = _processed_logprobs(scaled, logprobs_all, tokens, params, processed, sampled_rows, keep)
    chosen = logprobs_all.gather(1, tokens[:, None])[:, 0]
    top_ids = top_lp = None
    if top_logprobs_num > 0:
        top_lp, top_ids = logprobs_all.topk(min(top_logprobs_num, logits.shape[-1]), dim=-1)
    return SampleOutput(tokens, chosen, top_ids, top_lp)


def _processed_logprobs(
    scaled: torch.Tensor,
    logprobs_all: torch.Tensor,
    tokens: torch.Tensor,
    params: list[SamplingParams],
    processed: list[bool],
    sampled_rows: list[int],
    keep: torch.Tensor | None,
) -> torch.Tensor:
    """Log-softmax over each processed row's support [B, V] (-inf outside it): the support the
    sampler used (`keep`, rows `sampled_rows`), or the argmax alone for a greedy row (SGLang
    runs greedy as top_k=1). Rows whose support is the whole vocabulary keep `logprobs_all`."""
    support = torch.ones_like(scaled, dtype=torch.bool)
    if keep is not None:
        support[torch.tensor(sampled_rows, dtype=torch.long, device=scaled.device)] = keep
    greedy = [i for i, p in enumerate(params) if p.greedy and processed[i]]
    if greedy:
        rows = torch.tensor(greedy, dtype=torch.long, device=scaled.device)
        support[rows] = False
        support[rows, tokens[rows]] = True
    cut = [i for i in range(len(params)) if processed[i] and not bool(support[i].all())]
    if not cut:
        return logprobs_all
    rows = torch.tensor(cut, dtype=torch.long, device=scaled.device)
    out = logprobs_all.clone()
    out[rows] = torch.log_softmax(scaled[rows].masked_fill(~support[rows], float("-inf")), dim=-1)
    return out


def _sample_truncated(
    scaled: torch.Tensor, params: list[SamplingParams], uniforms: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Inverse-CDF sampling from softmax(scaled) [n, V] after top-k, top-p and min-p truncation
    (arealite/algo/truncation.py). Returns the tokens [n] and the kept support [n, V] in vocabulary
    order, or None when no row truncates."""
    probs = torch.softmax(scaled, dim=-1)
    vocab = probs.shape[-1]
    truncations = [p.truncation for p in params]
    if not any(t.cuts(vocab) for t in truncations):
        # Nothing to truncate: skip the O(V log V) sort, which dominates on real vocabularies.
        cdf = probs.cumsum(-1)
        idx = torch.searchsorted(cdf, uniforms[:, None] * cdf[:, -1:], right=True)
        return idx.clamp(max=vocab - 1)[:, 0], None
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    keep = sorted_keep(sorted_probs, *truncation_columns(truncations, probs))
    kept = sorted_probs * keep
    cdf = kept.cumsum(-1)
    targets = uniforms[:, None] * cdf[:, -1:]
    idx = torch.searchsorted(cdf, targets, right=True).clamp(max=vocab - 1)
    # searchsorted can land on a zeroed (truncated) slot only through rounding; step back to a kept one.
    idx = torch.minimum(idx, keep.sum(-1, keepdim=True) - 1)
    return order.gather(1, idx)[:, 0], torch.zeros_like(keep).scatter_(-1, order, keep)
