"""Moved to arealite/backends/vllm.py. An import shim kept for one release (docs/CHANGELOG.md)."""

from arealite.backends.vllm import (
    CLOSE_UPDATE_METHOD,
    MAX_TEMPERATURE,
    PAUSE_QUERIES,
    RELOAD_METHOD,
    WORKER_EXTENSION,
    VLLMProtocol,
    gconfig_refusals,
    parse_generate_reply,
    sampling_params,
)
from arealite.config import GenerationHyperparameters


def check_gconfig(gconfig: GenerationHyperparameters) -> None:
    """ValueError naming each sampling setting a vLLM server would refuse (backends.vllm.gconfig_refusals)."""
    refused = gconfig_refusals(gconfig)
    if refused:
        raise ValueError("; ".join(refused))


__all__ = [
    "CLOSE_UPDATE_METHOD",
    "MAX_TEMPERATURE",
    "PAUSE_QUERIES",
    "RELOAD_METHOD",
    "WORKER_EXTENSION",
    "VLLMProtocol",
    "check_gconfig",
    "parse_generate_reply",
    "sampling_params",
]
