"""`--help` for a config dataclass tree: every field with its type, default and help text.

The help text of a field is its trailing comment in the dataclass's source, plus the
comment-only lines directly below it (continuations of a long comment), so a field is
documented in exactly one place, beside its definition. `field_help` returns them;
`config_help` renders the whole tree, one line per leaf field, grouped by section with the
section class's docstring.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import textwrap
import tokenize
import typing
from typing import Any


def _class_field_help(klass: type) -> dict[str, str]:
    """Field name -> help text of the fields defined in `klass`'s own body."""
    source = textwrap.dedent(inspect.getsource(klass))
    lines = source.splitlines()
    comments: dict[int, str] = {}  # line number (1-based) -> comment text
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    body = ast.parse(source).body[0]
    assert isinstance(body, ast.ClassDef)
    out: dict[str, str] = {}
    for node in body.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        end = node.end_lineno or node.lineno
        parts = [comments[end]] if end in comments else []
        nxt = end + 1
        while parts and nxt <= len(lines) and lines[nxt - 1].strip().startswith("#"):
            parts.append(comments[nxt])  # a continuation line of the field's comment
            nxt += 1
        out[node.target.id] = " ".join(p for p in parts if p)
    return out


def field_help(cls: type) -> dict[str, str]:
    """Help text of every field of dataclass `cls`, inherited fields included ("" when undocumented)."""
    merged: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass) and klass is not object:
            merged.update(_class_field_help(klass))
    return {f.name: merged.get(f.name, "") for f in dataclasses.fields(cls)}


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
