"""Declaring a config field: `setting()` (default plus help text) and the checks sections share.

A section validates itself in `__post_init__` with `check_choices` (every `Literal` field
holds one of its values) and `check_positive`; both raise `ConfigError` naming the dotted key.
"""

from __future__ import annotations

import typing
from dataclasses import MISSING, field, fields
from typing import Any

from arealite.config.loading import ConfigError, choices


def key(owner: str, name: str) -> str:
    """The dotted key of field `name` of section `owner` ("": a top-level field)."""
    return f"{owner}.{name}" if owner else name


def setting(default: Any = MISSING, help: str = "", *, factory: Any = MISSING) -> Any:
    """A config field with its help text (`--help`, `arealite.config.help`): `setting(4, "...")`,
    or `setting(factory=list, help="...")` for a mutable default."""
    if factory is not MISSING:
        return field(default_factory=factory, metadata={"help": help})
    return field(default=default, metadata={"help": help})


def check_choices(config: Any, owner: str) -> None:
    """Every `Literal` field of `config` holds one of its values (None where the type allows it)."""
    hints = typing.get_type_hints(type(config))
    for f in fields(config):
        allowed, value = choices(hints[f.name]), getattr(config, f.name)
        if allowed is not None and value is not None and value not in allowed:
            raise ConfigError(f"{key(owner, f.name)}={value!r} is not supported; choose one of {list(allowed)}")


def check_positive(owner: str, name: str, value: float | int, allow_zero: bool = False) -> None:
    """`value` > 0 (>= 0 with `allow_zero`), else a ConfigError naming `owner.name`."""
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigError(f"{key(owner, name)}={value!r} must be {bound}")
