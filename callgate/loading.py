"""`load_object`: what `MODULE:ATTR` on the command line names, imported.

The lowest module of the command line: every command that takes a gate, a policy's tools or an
interceptor by `MODULE:ATTR` imports it from here, and it imports nothing of callgate's own.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import typer

__all__ = ["load_object"]


def load_object(spec: str) -> Any:
    """Import `MODULE:ATTR` (the current directory is importable); raise `typer.BadParameter` naming
    what is missing."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise typer.BadParameter(f"expected MODULE:ATTR, got {spec!r}")
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise typer.BadParameter(f"cannot import module {module_name!r}: {exc}") from exc
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise typer.BadParameter(f"module {module_name!r} has no attribute {attr!r}") from None
    return obj
