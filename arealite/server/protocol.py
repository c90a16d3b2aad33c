"""Parsing `/generate` bodies into per-sequence items, with SGLang 0.5.23's checks.

Unknown top-level keys are ignored; unknown `sampling_params` keys and wrong JSON types are
contract errors (0.5.22+); `null` sampling values mean "default" (0.5.16+). Batch forms
(`text: [..]`, `input_ids: [[..]]`, per-item lists) and `n > 1` expand to one item per
generated sequence, grouped by prompt, with SGLang's rid rules (docs/protocol.md §1.3, §1.4).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from arealite.server.errors import ContractError, RequestError
from arealite.server.limits import I64_MAX, I64_MIN, RequestLimits
from arealite.server.lora import lora_paths
from arealite.server.sampling import SAMPLING_KEYS, SamplingParams

_INT_KEYS = {"max_new_tokens", "min_new_tokens", "top_k", "n", "sampling_seed", "stream_interval"}
_FLOAT_KEYS = {"temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty"}
_F64_MAX_INT = int(1.7976931348623157e308)
_BOOL_KEYS = {"ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim"}


@dataclass
class GenItem:
    """One sequence to generate, before tokenization."""

    index: int  # position in the expanded batch (stream chunks carry it)
    rid: str
    text: str | None
    input_ids: list[int] | None
    params: SamplingParams
    return_logprob: bool
    top_logprobs_num: int
    logprob_start_len: int
    lora_path: str | None = None  # the LoRA adapter's name (server/lora.py)


@dataclass
class GenerateCall:
    items: list[GenItem]
    is_batch: bool  # reply with a JSON array
    stream: bool
    return_text_in_logprobs: bool
    processed_logprobs: bool = False  # arealite's extension: logprobs of the truncated sampling distribution


def _describe(value) -> str:
    if isinstance(value, bool):
        return f"boolean `{str(value).lower()}`"
    if isinstance(value, int):
        return f"integer `{value}`"
    if isinstance(value, float):
        return f"floating point `{value}`"
    if isinstance(value, str):
        return f'string "{value}"'
    if isinstance(value, list):
        return "sequence"
    if value is None:
        return "null"
    return "map"


def _expect(value, kind: str, where: str):
    """Check one JSON value against a contract type (serde's wording); returns it (floats as float)."""
    ok = {
        "i64": isinstance(value, int) and not isinstance(value, bool),
        "f64": isinstance(value, (int, float)) and not isinstance(value, bool),
        "a boolean": isinstance(value, bool),
        "a string": isinstance(value, str),
    }[kind]
    if not ok:
        raise ContractError(f"invalid type: {_describe(value)}, expected {kind} at `{where}`")
    if kind == "i64" and not I64_MIN <= value <= I64_MAX:
        shown = str(value) if abs(value) < 10**30 else f"{str(value)[:12]}... ({len(str(abs(value)))} digits)"
        raise ContractError(f"invalid value: integer `{shown}`, expected i64 at `{where}`")
    if kind == "f64" and isinstance(value, int) and abs(value) > _F64_MAX_INT:  # float() would overflow
        raise ContractError(f"invalid value: number out of range, expected f64 at `{where}`")
    return float(value) if kind == "f64" else value


def parse_sampling_params(raw, where: str = "sampling_params") -> SamplingParams:
    """Build SamplingParams from a JSON object, rejecting unknown keys and wrong types."""
    if raw is None:
        return SamplingParams()
    if not isinstance(raw, dict):
        raise ContractError(f"invalid type: {_describe(raw)}, expected a map at `{where}`")
    values = {}
    for key, value in raw.items():
        if key not in SAMPLING_KEYS:
            expected = ", ".join(f"`{k}`" for k in SAMPLING_KEYS)
            raise ContractError(f"unknown field `{key}`, expected one of {expected} at `{where}`")
        if value is None:
            continue  # 0.5.16+: null means the default
        at = f"{where}.{key}"
        if key in _INT_KEYS:
            values[key] = _expect(value, "i64", at)
        elif key in _FLOAT_KEYS:
            values[key] = _expect(value, "f64", at)
        elif key in _BOOL_KEYS:
            values[key] = _expect(value, "a boolean", at)
        elif key == "stop":
            values[key] = (
                [value] if isinstance(value, str) else [_expect(v, "a string", at) for v in _as_list(value, at)]
            )
        elif key == "stop_token_ids":
            values[key] = [_expect(v, "i64", at) for v in _as_list(value, at)]
        elif key in ("logit_bias", "custom_params"):
            if not isinstance(value, dict):
                raise ContractError(f"invalid type: {_describe(value)}, expected a map at `{at}`")
            values[key] = {k: _expect(v, "f64", at) for k, v in value.items()} if key == "logit_bias" else value
        else:
            values[key] = value
    return SamplingParams(**values)


def _as_list(value, where: str) -> list:
    if not isinstance(value, list):
        raise ContractError(f"invalid type: {_describe(value)}, expected a sequence at `{where}`")
    return value


def _prompts(body: dict) -> tuple[list, bool, bool]:
    """(prompts, are_texts, is_batch) from `text` / `input_ids`."""
    given = [k for k in ("text", "input_ids", "input_embeds") if body.get(k) is not None]
    if len(given) != 1:
        raise RequestError("Either text, input_ids or input_embeds should be provided.")
    if given[0] == "input_embeds":
        raise RequestError("input_embeds is not supported by the built-in arealite server; send input_ids or text.")
    if given[0] == "text":
        text = body["text"]
        items = [text] if isinstance(text, str) else [_expect(t, "a string", "text") for t in _as_list(text, "text")]
        if not items:
            raise RequestError("text cannot be an empty list.")
        for t in items:
            try:
                t.encode("utf-8")
            except UnicodeEncodeError:  # a lone surrogate escape such as "\ud800": no tokenizer takes it
                raise RequestError("text is not valid Unicode (it holds a lone surrogate code point).") from None
        return items, True, not isinstance(text, str)
    ids = _as_list(body["input_ids"], "input_ids")
    if not ids:
        raise RequestError("input_ids cannot be empty.")
    if isinstance(ids[0], list):
        batch = [_i64_list(_as_list(seq, "input_ids"), "input_ids") for seq in ids]
        if any(not seq for seq in batch):
            raise RequestError("input_ids cannot be empty.")
        return batch, False, True
    return [_i64_list(ids, "input_ids")], False, False


def _i64_list(values: list, where: str) -> list[int]:
    """`values` checked as i64 each; a list of plain ints in range passes in one scan."""
    if all(type(v) is int for v in values) and (not values or (min(values) >= I64_MIN and max(values) <= I64_MAX)):
        return values
    return [_expect(v, "i64", where) for v in values]


def _per_item(body: dict, key: str, default, kind: str, size: int, n: int) -> list:
    value = body.get(key)
    if value is None:
        return [default] * size
    if isinstance(value, list):
        if n > 1:
            raise RequestError(f"Cannot use list {key} with parallel_sample_num > 1")
        if len(value) != size:
            raise RequestError(f"{key} has {len(value)} entries but the batch has {size} prompts.")
        return [_expect(v, kind, key) for v in value]
    return [_expect(value, kind, key)] * size


def _rids(body: dict, size: int, is_batch: bool) -> list[str]:
    rid = body.get("rid")
    if rid is None:
        return [uuid.uuid4().hex for _ in range(size)]
    if isinstance(rid, str):
        return [rid] if not is_batch else [f"{rid}_{i}" for i in range(size)]
    rids = [_expect(r, "a string", "rid") for r in _as_list(rid, "rid")]
    if len(rids) != size:
        raise RequestError("The specified rids length mismatch with the batch_size for batch processing.")
    return rids


def _check_range(name: str, values: list[int], low: int, high: int, note: str = "") -> None:
    for value in values:
        if not low <= value <= high:
            raise RequestError(f"{name} must be in [{low}, {high}]{note}, got {value}.")


def parse_generate(body: dict, vocab_size: int, limits: RequestLimits | None = None) -> GenerateCall:
    """Validate a /generate body and expand it to one GenItem per generated sequence.

    Everything that does not need the tokenizer is checked here, before any expansion, so an
    oversized `n` or batch costs nothing; make_reqs checks the token total after tokenizing.
    """
    limits = limits or RequestLimits()
    prompts, are_texts, is_batch = _prompts(body)
    size = len(prompts)
    raw_sp = body.get("sampling_params")
    if isinstance(raw_sp, list):
        if len(raw_sp) != size:
            raise RequestError(f"sampling_params has {len(raw_sp)} entries but the batch has {size} prompts.")
        params = [parse_sampling_params(dict(sp) if isinstance(sp, dict) else sp) for sp in raw_sp]
    else:
        params = [parse_sampling_params(raw_sp)] * size  # one object shared by every item
    for p in {id(p): p for p in params}.values():
        p.verify(vocab_size)
    n = params[0].n
    if any(p.n != n for p in params):
        raise RequestError("The parallel_sample_num should be the same for all samples in sample params.")
    _check_range("n", [n], 1, limits.max_parallel_samples, " (the server's --max-parallel-samples)")
    if size * n > limits.max_request_tokens:  # every sequence needs at least one token
        raise RequestError(
            f"The request asks for {size * n} sequences ({size} prompts x n={n}); the server accepts at most "
            f"{limits.max_request_tokens} tokens per request (--max-request-tokens)."
        )
    return_logprob = _per_item(body, "return_logprob", False, "a boolean", size, n)
    top_num = _per_item(body, "top_logprobs_num", 0, "i64", size, n)
    _check_range(
        "top_logprobs_num",
        top_num,
        0,
        min(vocab_size, limits.max_top_logprobs_num),
        " (the server's --max-top-logprobs-num)",
    )
    start_len = _per_item(body, "logprob_start_len", -1, "i64", size, n)
    for value in start_len:
        if value < -1:
            raise RequestError(
                f"logprob_start_len must be -1 (output logprobs only) or a prompt position >= 0, got {value}."
            )
    stream = _expect(body.get("stream", False), "a boolean", "stream")
    text_in_lp = _expect(body.get("return_text_in_logprobs", False), "a boolean", "return_text_in_logprobs")
    processed = _expect(body.get("processed_logprobs", False), "a boolean", "processed_logprobs")
    rids = _rids(body, size, is_batch)
    loras = lora_paths(body, size)
    if n > 1:
        is_batch = True
    if not are_texts:
        for seq in prompts:
            bad = [t for t in seq if not 0 <= t < vocab_size]
            if bad:
                raise RequestError(f"input_ids contains token id {bad[0]} outside the vocabulary [0, {vocab_size}).")
    items = []
    for i, prompt in enumerate(prompts):
        for _copy in range(n):
            items.append(
                GenItem(
                    index=len(items),
                    rid=rids[i] if n == 1 else uuid.uuid4().hex,  # SGLang regenerates rids for n > 1
                    text=prompt if are_texts else None,
                    input_ids=None if are_texts else prompt,
                    params=params[i],
                    return_logprob=return_logprob[i],
                    top_logprobs_num=top_num[i],
                    logprob_start_len=start_len[i],
                    lora_path=loras[i],
                )
            )
    return GenerateCall(items, is_batch, stream, text_in_lp, processed)


def check_length(prompt_len: int, max_new_tokens: int | None, context_len: int) -> None:
    """SGLang 0.5.23's context checks (§1.5): errors, never silent truncation."""
    if prompt_len >= context_len:
        raise RequestError(
            f"The input ({prompt_len} tokens) is longer than the model's context length ({context_len} tokens)."
        )
    if max_new_tokens is not None and prompt_len + max_new_tokens > context_len:
        raise RequestError(
            f"Requested token count exceeds the model's maximum context length of {context_len} tokens. "
            f"You requested a total of {prompt_len + max_new_tokens} tokens: {prompt_len} tokens from the input "
            f"messages and {max_new_tokens} tokens for the completion. Please reduce the number of tokens in "
            "the input messages or the completion to fit within the limit."
        )
