"""Resolve `"package.module:attribute"` strings from configs to Python objects."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def import_object(spec: str) -> Any:
    """Import `module:attr` (or `module.attr`); errors name the spec and the fix."""
    module_name, sep, attr = spec.partition(":")
    if not sep:
        module_name, _, attr = spec.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"{spec!r} is not an import path; write it as 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"cannot import module {module_name!r} from {spec!r}: {e}; is it on PYTHONPATH?") from e
    try:
        return getattr(module, attr)
    except AttributeError as e:
        raise ValueError(f"module {module_name!r} has no attribute {attr!r} (from {spec!r})") from e


def lazy_exports(package: str, exports: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's PEP 562 `__getattr__` and `__dir__` for `exports` ({name: defining module}):
    a name's module is imported on first use, so importing the package stays light."""
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value  # later lookups skip __getattr__
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__
