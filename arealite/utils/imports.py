"""Resolve `"package.module:attribute"` strings from configs to Python objects."""

from __future__ import annotations

import importlib
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
