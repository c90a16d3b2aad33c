"""Truncated responses: those that ran out of `max_new_tokens` before a stop token.

A truncated response never finished its answer, so a workflow records it per sample
(`truncated` [G] bool in the trajectory) and tells the reward function when it asks for it
(a reward declaring a `truncated` parameter gets it). The trainer can then leave truncated
responses out of the loss (`actor.mask_no_eos_with_zero`), and the step stats report their
fraction (`truncated_frac`).
"""

from __future__ import annotations

from typing import Any

from arealite.config import GenerationHyperparameters
from arealite.types import ModelResponse


def stop_token_ids(tokenizer: Any, gconfig: GenerationHyperparameters) -> frozenset[int]:
    """The tokens that end a response: the tokenizer's EOS and `gconfig.stop_token_ids`."""
    ids = set(gconfig.stop_token_ids)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return frozenset(ids)


def is_truncated(response: ModelResponse, stop_ids: frozenset[int]) -> bool:
    """True when `response` stopped for its length budget without ending on a stop token.

    SGLang checks the length limit before stop tokens, so a stop token that is exactly the
    last token of the budget is reported as `length`: the last token decides then.
    """
    if response.stop_reason == "stop":
        return False
    return not (response.output_tokens and response.output_tokens[-1] in stop_ids)
