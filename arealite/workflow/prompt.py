"""Turning a data record into prompt token ids."""

from __future__ import annotations

from typing import Any


def encode_prompt(tokenizer: Any, data: dict[str, Any]) -> list[int]:
    """Prompt ids from `input_ids`, chat `messages` (with the generation prompt), or `prompt` text."""
    if "input_ids" in data:
        return [int(t) for t in data["input_ids"]]
    if "messages" in data:
        return encode_messages(tokenizer, data["messages"])
    if "prompt" in data:
        return list(tokenizer.encode(data["prompt"], add_special_tokens=False))
    raise ValueError(
        f"data record (keys {sorted(data)}) has no prompt; give it 'messages' (chat), 'prompt' (text) or 'input_ids'"
    )


def encode_messages(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    # tokenize=False then encode: transformers 5 returns a BatchEncoding for tokenize=True
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer.encode(text, add_special_tokens=False))
