"""What the built-in interceptors share: their configuration checks, tool matching, value display.

Private: the public names live in the modules of the checks (`paths`, `urls`, `sql`, `secrets`).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from interceptor_core.exceptions import ConfigurationError

_SHOWN_CHARS = 120
# A denial quotes the value the model sent; a long value is cut so the message stays readable.


def check_identity(name: object, mandatory: object) -> str:
    """`name`, checked to be a non-empty string; `ConfigurationError` if it or `mandatory` is wrong."""
    if not isinstance(name, str) or not name:
        raise ConfigurationError(f"an interceptor's name must be a non-empty string, got {name!r}")
    if not isinstance(mandatory, bool):
        raise ConfigurationError(f"mandatory must be True or False, got {mandatory!r}", interceptor=name)
    return name


def tool_matcher(tools: str | Sequence[str] | None, *, interceptor: str) -> Callable[[str], bool]:
    """A predicate on tool names: does the name match one of the `tools` globs (`fnmatch.fnmatchcase`)?

    None matches every tool; one string is one glob. The globs are compiled here, once, into one
    pattern. Raises `ConfigurationError` for an empty sequence (it would match no tool) or a glob
    that is not a non-empty string.
    """
    if tools is None:
        return _every_tool
    globs = (tools,) if isinstance(tools, str) else tools
    if not isinstance(globs, Sequence):
        raise ConfigurationError(f"tools must be a glob or a sequence of globs, got {tools!r}", interceptor=interceptor)
    if not globs:
        raise ConfigurationError(
            "tools is empty, so the check would apply to no tool; pass None for every tool", interceptor=interceptor
        )
    for glob in globs:
        if not isinstance(glob, str) or not glob:
            raise ConfigurationError(f"a tool glob must be a non-empty string, got {glob!r}", interceptor=interceptor)
    # fnmatch.translate is what fnmatchcase compiles; joined, the globs cost one match per call.
    pattern = re.compile("|".join(f"(?:{fnmatch.translate(glob)})" for glob in globs))

    def matches(tool: str) -> bool:
        return pattern.match(tool) is not None

    return matches


def _every_tool(tool: str) -> bool:
    return True


def field_names(fields: str | Sequence[str], *, interceptor: str) -> tuple[str, ...]:
    """The argument names to check, in order and without repeats; one string is one name.

    Raises `ConfigurationError` for an empty sequence or a name that is not a non-empty string.
    """
    names = (fields,) if isinstance(fields, str) else fields
    if not isinstance(names, Sequence):
        raise ConfigurationError(
            f"fields must be an argument name or a sequence of them, got {fields!r}", interceptor=interceptor
        )
    if not names:
        raise ConfigurationError("fields is empty: name at least one argument to check", interceptor=interceptor)
    for field in names:
        if not isinstance(field, str) or not field:
            raise ConfigurationError(
                f"an argument name must be a non-empty string, got {field!r}", interceptor=interceptor
            )
    return tuple(dict.fromkeys(names))


def each_value(value: Any) -> Iterator[Any]:
    """The values an argument holds: none for None, each item of a list or tuple, else the value itself."""
    if value is None:
        return
    if isinstance(value, list | tuple):
        yield from value
    else:
        yield value


def field_values(args: Mapping[str, Any], fields: tuple[str, ...]) -> Iterator[tuple[str, Any]]:
    """(field, value) for every value the named arguments hold (see `each_value`); a field the
    call does not have is skipped."""
    for field in fields:
        if field in args:
            for value in each_value(args[field]):
                yield field, value


def shown(value: Any) -> str:
    """`repr(value)`, cut to a readable length for a denial message."""
    text = repr(value)
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 1] + "…"
