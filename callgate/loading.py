"""`load_object`: what `MODULE:ATTR` or `FILE.py:ATTR` on the command line names, imported.

The lowest module of the command line: every command that takes a gate, a policy's tools or an
interceptor by `MODULE:ATTR` imports it from here, and it imports nothing of callgate's own.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

import typer

__all__ = ["load_object"]


def load_object(spec: str) -> Any:
    """Import `MODULE:ATTR` or `FILE.py:ATTR` (the current directory is importable; a file is loaded
    as a module of its own name, its folder importable); raise `typer.BadParameter` naming what is
    missing."""
    module_name, _, attr = spec.rpartition(":") if spec.count(":") > 1 else spec.partition(":")
    if not module_name or not attr:
        raise typer.BadParameter(f"expected MODULE:ATTR or FILE.py:ATTR, got {spec!r}")
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        if module_name.endswith(".py") or "/" in module_name or os.sep in module_name:
            module = _load_file(Path(module_name))
        else:
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


def _load_file(path: Path) -> Any:
    """The module a Python file defines, loaded once (under its file name) with its folder importable."""
    if not path.is_file():
        raise ImportError(f"no such file {path}")
    name = path.stem
    loaded = sys.modules.get(name)
    if loaded is not None and Path(getattr(loaded, "__file__", "") or "").resolve() == path.resolve():
        return loaded
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} is not a Python module")
    if str(path.parent.resolve()) not in sys.path:
        sys.path.insert(0, str(path.parent.resolve()))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
