"""The stop tokens `gconfig.min_new_tokens` bans: what the servers remove from the distribution
until that many answer tokens are out, so the trainer can replay it (arealite/train/logprobs.py).

Both servers ban the model's EOS ids and `gconfig.stop_token_ids`. The built-in server takes the
EOS ids of the model's config, its tokenizer and its generation config (`eos_token_ids`); vLLM
0.32 those of its tokenizer and generation config (the model config's when the model has no
generation_config.json), which are the same ids whenever the generation config repeats the model
config's, as transformers writes it. arealite's clients never send `ignore_eos`, so EOS is always in.
"""

from __future__ import annotations

import functools
from typing import Any


def eos_token_ids(model_path: str, tokenizer: Any, config: Any) -> set[int]:
    """Every EOS id the model declares: config, generation config and tokenizer."""
    from transformers import GenerationConfig

    ids: set[int] = set()
    sources = [getattr(config, "eos_token_id", None), tokenizer.eos_token_id]
    try:
        sources.append(GenerationConfig.from_pretrained(model_path).eos_token_id)
    except OSError:
        pass
    for value in sources:
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return ids


@functools.cache
def _model_eos_ids(model_path: str) -> frozenset[int]:
    from transformers import AutoConfig, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        config = AutoConfig.from_pretrained(model_path)
    except OSError as e:
        raise ValueError(
            f"replaying gconfig.min_new_tokens's stop-token ban needs the model's EOS ids, read from the model "
            f"folder {model_path!r} (its tokenizer and config), which cannot be read: {e}"
        ) from e
    return frozenset(eos_token_ids(model_path, tokenizer, config))


def banned_stop_ids(model_path: str, stop_token_ids: list[int]) -> list[int]:
    """The ids a server bans for `min_new_tokens` serving the model at `model_path`: its EOS ids
    plus `stop_token_ids` (`gconfig.stop_token_ids`), sorted."""
    return sorted(_model_eos_ids(model_path) | {int(t) for t in stop_token_ids})


def batch_stop_ids(batch: dict, model_path: str, stop_token_ids: list[int]) -> list[int]:
    """`banned_stop_ids` when the batch has `stop_banned` (whatever this rank's rows mark: the update may
    move rows between ranks), else [] (nothing to read)."""
    return banned_stop_ids(model_path, stop_token_ids) if "stop_banned" in batch else []
