"""Misbehaving reward functions. Module-level, so reward worker processes can import them."""

import time


def raises(prompt, completion, prompt_ids, completion_ids, **data):
    raise RuntimeError("reward checker crashed")


def hangs_on_first(prompt, completion, prompt_ids, completion_ids, **data):
    """Hangs for the record marked `hang`, answers 1.0 at once for every other record."""
    if data.get("hang"):
        time.sleep(120)
    return 1.0


def nan(prompt, completion, prompt_ids, completion_ids, **data):
    return float("nan")


def one(prompt, completion, prompt_ids, completion_ids, **data):
    return 1.0
