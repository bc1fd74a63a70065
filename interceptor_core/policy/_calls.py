"""The calls of built-in functions in a policy expression, and what their constant arguments say.

CEL's checker sees `count_calls('refund', 'tenantt', duration('1h'))` as well typed, and a missing
argument only as "no matching overload". Reading the calls' arguments as written lets a policy
check name the mistake: the wrong number of arguments, a key that does not exist, a window given
as text, a dialect sqlglot does not know, a host entry with a scheme, a root that cannot be one.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass

from interceptor_core.builtins.counters import KEYS
from interceptor_core.builtins.paths import PathsWithin
from interceptor_core.builtins.sql import ReadOnlySQL
from interceptor_core.builtins.urls import HostAllowList
from interceptor_core.exceptions import ConfigurationError

ARITY: dict[str, tuple[tuple[int, ...], str]] = {
    "within": ((2,), "a path (or a list of paths) and a list of directories"),
    "host_in": ((2,), "a URL and a list of hosts"),
    "sql_writes": ((1, 2, 3), "the SQL, then optionally its dialect and a list of functions known to be safe"),
    "has_secrets": ((1,), "the value to look in"),
    "count_calls": ((3,), "a tool glob, a key (tenant, principal, run or global) and a window (duration('1h'))"),
}
"""How many arguments each built-in takes, and what they are (for the error)."""

_NAME = re.compile(r"(?<![.\w])(" + "|".join(ARITY) + r")\s*\(")
_QUOTED = re.compile(r"""[rR]?(?:"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*')""")


@dataclass(frozen=True, slots=True)
class Call:
    """One call of a built-in as written: its name and its arguments' source texts."""

    name: str
    args: tuple[str, ...]


def calls(source: str) -> Iterator[Call]:
    """Every call of a built-in in `source`, nested ones included (string literals are skipped)."""
    masked = _QUOTED.sub(lambda m: "\0" * len(m.group(0)), source)
    for match in _NAME.finditer(masked):
        args = _split_args(source, masked, match.end())
        if args is not None:
            yield Call(match.group(1), args)


def _split_args(source: str, masked: str, start: int) -> tuple[str, ...] | None:
    depth, begin, parts = 0, start, []
    for index in range(start, len(masked)):
        ch = masked[index]
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            if depth == 0:
                parts.append(source[begin:index].strip())
                return tuple(part for part in parts if part) if parts != [""] else ()
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(source[begin:index].strip())
            begin = index + 1
    return None


def constant(text: str) -> object:
    """The value of a literal string or list of strings; `...` when the text is not a constant."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return ...
    if isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        return value
    return ...


def problems(source: str) -> list[str]:
    """What is wrong with the built-in calls of `source`, one sentence each (none: nothing known)."""
    found: list[str] = []
    for call in calls(source):
        counts, what = ARITY[call.name]
        if len(call.args) not in counts:
            expected = " or ".join(str(n) for n in counts)
            found.append(
                f"{call.name} takes {expected} argument{'s' if counts != (1,) else ''} ({what}), got {len(call.args)}"
            )
            continue
        found.extend(_constant_problems(call))
    return found


def _constant_problems(call: Call) -> Iterator[str]:
    values = [constant(arg) for arg in call.args]
    try:
        match call.name:
            case "count_calls":
                key, window = values[1], call.args[2]
                if isinstance(key, str) and key not in KEYS:
                    yield f"count_calls key {key!r} does not exist (keys: {', '.join(KEYS)})"
                if isinstance(constant(window), str):
                    yield f"count_calls window {window} is text: write duration({window}) for a window"
            case "sql_writes":
                if len(values) >= 2 and isinstance(values[1], str):
                    safe = values[2] if len(values) == 3 and isinstance(values[2], list) else ()
                    ReadOnlySQL("query", dialect=values[1], safe_functions=safe)
            case "host_in":
                hosts = values[1]
                if isinstance(hosts, list):
                    for entry in hosts:
                        if "://" in entry or "/" in entry:
                            yield f"host_in entry {entry!r} is not a host: write the host alone, without scheme or path"
                    HostAllowList("url", hosts)
            case "within":
                roots = values[1]
                if isinstance(roots, list):
                    PathsWithin("path", roots)
    except ConfigurationError as exc:
        yield f"{call.name}: {exc.message}"
