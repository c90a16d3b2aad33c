"""Per-sample sampling seeds, for runs that replay exactly.

A seeded request is sampled from its own generator on the server, so its tokens depend only
on the weights, the prompt and its seed — not on which server ran it or what else was in the
batch. `sample_seed` derives that seed from stable facts (a base seed, the prompt's id, the
sample's index in its group, the weight version), so a recovered run or a standalone
evaluation draws exactly what the original run drew.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

_SEED_BITS = 62  # the built-in server adds the copy index to a seed; stay clear of int64 overflow


def sample_seed(base: int, key: str, index: int, version: int = 0) -> int:
    """A stable seed for sample `index` of the prompt `key` at weight `version`.

    Uses a cryptographic hash, not Python's `hash()`, which is salted per process.
    """
    digest = hashlib.blake2b(f"{base}|{key}|{index}|{version}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> (64 - _SEED_BITS)


def prompt_key(data: dict[str, Any], prompt_ids: list[int]) -> str:
    """The record's `id`, or (records without one) its prompt tokens."""
    if "id" in data:
        return str(data["id"])
    return hashlib.blake2b(repr(list(prompt_ids)).encode(), digest_size=16).hexdigest()


def seeded_gconfig(gconfig: Any, data: dict[str, Any], prompt_ids: list[int], index: int, version: int) -> Any:
    """`gconfig` with its `sampling_seed` replaced by this sample's own seed (unchanged when unset)."""
    base = getattr(gconfig, "sampling_seed", None)
    if base is None:
        return gconfig
    return dataclasses.replace(gconfig, sampling_seed=sample_seed(base, prompt_key(data, prompt_ids), index, version))
