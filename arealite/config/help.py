"""`--help` for a config dataclass tree: every field with its type, default and help text.

A field's help text is its metadata (`field(metadata={"help": ...})`, written
`setting(default, "help")` in `arealite.config.fields`), so a field is documented once, beside its
definition, and read without parsing source. A `Literal` type shows the field's choices.
`config_help` renders the whole tree, one line per leaf field, grouped by section with the
section class's docstring.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from typing import Any


def field_help(cls: type) -> dict[str, str]:
    """Help text of every field of dataclass `cls`, inherited fields included ("" when undocumented)."""
    return {f.name: f.metadata.get("help", "") for f in dataclasses.fields(cls)}


def _section_class(tp: Any) -> type | None:
    """The dataclass inside a field type (`X` or `X | None`), or None for a leaf."""
    for arg in typing.get_args(tp) or (tp,):
        if isinstance(arg, type) and dataclasses.is_dataclass(arg):
            return arg
    return None


def _type_name(tp: Any) -> str:
    return tp.__name__ if isinstance(tp, type) and not typing.get_args(tp) else str(tp).replace("typing.", "")


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return "(required)"


def leaf_fields(cls: type, prefix: str = "") -> list[tuple[str, str, Any, str]]:
    """(dotted name, type, default, help) of every leaf field under `cls`, sections expanded."""
    hints = typing.get_type_hints(cls)
    helps = field_help(cls)
    out: list[tuple[str, str, Any, str]] = []
    for f in dataclasses.fields(cls):
        sub = _section_class(hints[f.name])
        if sub is not None:
            out += leaf_fields(sub, f"{prefix}{f.name}.")
        else:
            out.append((prefix + f.name, _type_name(hints[f.name]), _default(f), helps[f.name]))
    return out


def config_help(cls: type, prog: str = "SCRIPT") -> str:
    """The text `--help` prints: usage, then every section and its leaf fields."""
    hints = typing.get_type_hints(cls)
    helps = field_help(cls)
    lines = [
        f"usage: {prog} [--config FILE.yaml] [key=value ...]",
        "",
        "Every field below can be set in the YAML file or overridden as section.key=value.",
        "",
    ]
    top = [row for row in leaf_fields(cls) if "." not in row[0]]
    if top:
        lines.append(f"{cls.__name__}: {_first_line(cls)}")
        lines += _rows(top)
    for f in dataclasses.fields(cls):
        sub = _section_class(hints[f.name])
        if sub is None:
            continue
        default = _default(f)
        state = " (absent by default: set any of its keys to add it)" if default is None else ""
        lines += ["", f"{f.name}: {helps[f.name] or _first_line(sub)}{state}"]
        lines += _rows(leaf_fields(sub, f"{f.name}."))
    return "\n".join(lines) + "\n"


def _first_line(klass: type) -> str:
    return (inspect.getdoc(klass) or "").splitlines()[0] if inspect.getdoc(klass) else ""


def _rows(rows: list[tuple[str, str, Any, str]]) -> list[str]:
    out = []
    for name, tp, default, help_text in rows:
        out.append(f"  {name}: {tp} = {default!r}")
        if help_text:
            out.append(f"      {help_text}")
    return out
