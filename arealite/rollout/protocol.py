"""Moved to arealite/backends/ (sglang.py: SGLang's protocol; contract.py: the shared types).
An import shim kept for one release (docs/CHANGELOG.md); import from arealite.backends."""

from arealite.backends.contract import (
    FINAL_STOP_REASONS,
    Call,
    DistributedCalls,
    GenerateChunk,
    bucket_spec,
    clamp_max_new_tokens,
    error_message,
    group_fields,
    token_versions,
)
from arealite.backends.sglang import SGLangProtocol, generate_body, parse_generate_reply, sampling_params

__all__ = [
    "FINAL_STOP_REASONS",
    "Call",
    "DistributedCalls",
    "GenerateChunk",
    "SGLangProtocol",
    "bucket_spec",
    "clamp_max_new_tokens",
    "error_message",
    "generate_body",
    "group_fields",
    "parse_generate_reply",
    "sampling_params",
    "token_versions",
]
