"""Loading configs: `--config file.yaml` plus `key=value` overrides into real dataclasses.

Works for any dataclass tree (omegaconf does the merging). An unknown key fails naming its
dotted path and the closest valid names; a key that was renamed or removed fails naming its
new spelling (`RENAMED`); a wrong type fails naming the field and the expected type;
validation in the dataclasses' `__post_init__` raises `ConfigError`. `-h` / `--help` prints
every field with its type, default and help text (`arealite.config.help`) and exits 0.
A script's own settings are a subclass of the experiment config (examples/tools_grpo.py);
readers of the shared sections alone (launchers, replay) load with `script_sections=True`.
"""

from __future__ import annotations

import difflib
import os
import sys
import typing
from dataclasses import fields, is_dataclass
from typing import Any, Literal, TypeVar

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError


class ConfigError(ValueError):
    """A configuration value is missing, unknown or of the wrong type."""


C = TypeVar("C")

# Keys that no longer exist, with what to write instead (each value is stated once). Kept through
# 0.1.x only: cutting 0.2.0 empties it (docs/CHANGELOG.md).
RENAMED: dict[str, str] = {
    "actor.group_size": "the group size is gconfig.group_size (stated once, read by the actor too)",
    "actor.temperature": "the temperature is gconfig.temperature (stated once; the trainer's logprobs use it)",
    "actor.max_new_tokens": "the budget is gconfig.max_new_tokens (stated once; the overlong penalty reads it)",
    "actor.adv_norm": (
        "use actor.group_norm (mean_std | mean | rloo | none) and actor.whiten_advantages (true | false): "
        "group -> group_norm=mean_std; group_mean -> group_norm=mean; rloo -> group_norm=rloo; "
        "group_baseline_batch -> group_norm=mean whiten_advantages=true; batch -> group_norm=none "
        "whiten_advantages=true; none -> group_norm=none"
    ),
}
HELP_FLAGS = ("-h", "--help")


def choices(annotation: Any) -> tuple[Any, ...] | None:
    """The values a `Literal[...]` (or `Literal[...] | None`) annotation allows; None for other types."""
    options = typing.get_args(annotation) if typing.get_origin(annotation) is not Literal else ()
    for arg in (annotation, *options):  # X, or the members of X | None
        if typing.get_origin(arg) is Literal:
            return typing.get_args(arg)
    return None


def _dataclass_keys(cls: type) -> list[str]:
    return [f.name for f in fields(cls)]


def _field_type(cls: type, name: str) -> type | None:
    """The dataclass type of field `name` of `cls` (unwrapping `X | None`), or None."""
    import typing

    hints = typing.get_type_hints(cls)
    tp = hints.get(name)
    for arg in typing.get_args(tp) or (tp,):
        if isinstance(arg, type) and is_dataclass(arg):
            return arg
    return None


def _check_keys(cls: type, data: Any, prefix: str) -> None:
    """Fail on the first unknown key, naming its dotted path and the closest valid names."""
    if not isinstance(data, dict):
        return
    valid = _dataclass_keys(cls)
    for key, value in data.items():
        path = f"{prefix}{key}"
        if key not in valid and path in RENAMED:
            raise ConfigError(f"config key '{path}' was removed: {RENAMED[path]}")
        if key not in valid:
            close = difflib.get_close_matches(str(key), valid, n=3, cutoff=0.5)
            hint = f"; did you mean {' or '.join(prefix + c for c in close)}?" if close else ""
            raise ConfigError(
                f"unknown config key '{path}'{hint} Valid keys under '{prefix.rstrip('.') or cls.__name__}': {valid}"
            )
        sub = _field_type(cls, key)
        if sub is not None:
            _check_keys(sub, value, f"{path}.")
        _check_choice(cls, key, value, path)


def _check_choice(cls: type, key: str, value: Any, path: str) -> None:
    """A `Literal` field's value is one of its choices (before omegaconf's terser message)."""
    allowed = choices(typing.get_type_hints(cls).get(key))
    interpolated = isinstance(value, str) and value.startswith("${")
    if allowed is not None and value is not None and value not in allowed and not interpolated:
        raise ConfigError(f"{path}={value!r} is not supported; choose one of {list(allowed)}")


def _parse_argv(argv: list[str]) -> tuple[str | None, list[str]]:
    config_path: str | None = None
    overrides: list[str] = []
    it = iter(argv)
    for arg in it:
        if arg == "--config":
            config_path = next(it, None)
            if config_path is None:
                raise ConfigError("--config needs a YAML file path: --config configs/x.yaml")
        elif arg.startswith("--config="):
            config_path = arg.split("=", 1)[1]
        elif "=" in arg and not arg.startswith("-"):
            overrides.append(arg)
        else:
            raise ConfigError(f"cannot parse argument {arg!r}; expected --config FILE or key=value overrides")
    return config_path, overrides


def load_config(argv: list[str], cls: type[C], prog: str | None = None, script_sections: bool = False) -> C:
    """Build a `cls` instance from `--config FILE.yaml` plus `key=value` overrides.

    Raises ConfigError naming the dotted path of an unknown key (with close matches) or the
    new spelling of a removed one, the field and expected type of a wrongly typed value, or a
    missing config file. With `-h` / `--help` in `argv`, prints the config help (usage line
    naming `prog`, default: this process's script) and exits 0. With `script_sections`, a
    top-level section `cls` lacks is left out instead (the training script's own subclass of
    `cls` reads and checks it); everything else is checked as usual.
    """
    if any(arg in HELP_FLAGS for arg in argv):
        from arealite.config.help import config_help

        sys.stdout.write(config_help(cls, prog=prog or f"python {os.path.basename(sys.argv[0]) or 'SCRIPT'}"))
        sys.stdout.flush()
        raise SystemExit(0)
    config_path, overrides = _parse_argv(list(argv))
    layers: list[DictConfig] = []
    if config_path is not None:
        if not os.path.isfile(config_path):
            raise ConfigError(f"config file {config_path!r} does not exist (cwd: {os.getcwd()})")
        try:
            loaded = OmegaConf.load(config_path)
        except Exception as e:  # yaml syntax errors
            raise ConfigError(f"cannot parse config file {config_path!r}: {e}") from e
        layers.append(loaded)
    if overrides:
        try:
            layers.append(OmegaConf.from_dotlist(overrides))
        except OmegaConfBaseException as e:
            raise ConfigError(f"cannot parse overrides {overrides}: {e}") from e
    if script_sections:
        layers = [_without_unknown_sections(cls, layer) for layer in layers]
    for layer in layers:
        _check_keys(cls, OmegaConf.to_container(layer, resolve=False), "")
    schema = OmegaConf.structured(cls)
    try:
        merged = OmegaConf.merge(schema, *layers)
        return OmegaConf.to_object(merged)  # type: ignore[return-value]
    except ConfigError as e:
        raise ConfigError(_with_real_path(str(e), cls, merged)) from e
    except (ValidationError, ConfigKeyError) as e:
        key = getattr(e, "full_key", None) or "?"
        expected = _expected_type(cls, str(key))
        msg = str(e).splitlines()[0]
        raise ConfigError(f"config field '{key}' expects {expected}: {msg}") from e


def _without_unknown_sections(cls: type, layer: DictConfig) -> DictConfig:
    """`layer` without its top-level mappings whose key is no field of `cls` (a script's sections)."""
    known = set(_dataclass_keys(cls))
    unknown = [k for k, v in layer.items() if k not in known and isinstance(v, DictConfig)]
    if not unknown:
        return layer
    return OmegaConf.create({k: v for k, v in layer.items() if k not in unknown})


def _failing_section(cls: type, node: Any, prefix: str = "") -> str | None:
    """The dotted path of the innermost section whose own validation fails, or None."""
    for f in fields(cls):
        sub = _field_type(cls, f.name)
        child = node.get(f.name) if sub is not None else None
        if child is None:
            continue
        path = f"{prefix}{f.name}"
        inner = _failing_section(sub, child, path + ".")
        if inner is not None:
            return inner
        try:
            OmegaConf.to_object(child)
        except ConfigError:
            return path
    return None


def _with_real_path(message: str, cls: type, merged: DictConfig) -> str:
    """A section validates itself under one name (`actor.dtype`, `dataset.type`); name the key the
    user wrote instead (`ref.dtype`, `valid_dataset.type`)."""
    import re

    section = _failing_section(cls, merged)
    m = re.match(r"([A-Za-z_][\w.]*)\.(\w+)=", message)
    if section is None or m is None or m.group(1) == section:
        return message
    return section + message[len(m.group(1)) :]


def _expected_type(cls: type, dotted: str) -> str:
    import typing

    owner: Any = cls
    parts = dotted.split(".")
    for part in parts[:-1]:
        nxt = _field_type(owner, part)
        if nxt is None:
            return "a valid value"
        owner = nxt
    try:
        tp = typing.get_type_hints(owner).get(parts[-1])
    except Exception:
        return "a valid value"
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def save_config(config: Any, path: str) -> None:
    """Write the resolved config as YAML (the run directory's record of what ran)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        f.write(OmegaConf.to_yaml(OmegaConf.structured(config)))
