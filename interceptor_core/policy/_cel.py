"""CEL for policy files: one environment with the policy variables and the built-in checks.

The engine is `cel-expr-python`, Google's C++ CEL runtime (type-checked at compile time; about
2 µs per condition here). Built-in functions read the call they run for from a context variable
the policy sets around its evaluation, so one compiled environment serves every call.
"""

from __future__ import annotations

import contextvars
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from cel_expr_python import cel
from cel_expr_python.ext import ext_strings

from events.redaction import Redactor
from interceptor_core.builtins.counters import CallCounter
from interceptor_core.builtins.paths import within
from interceptor_core.builtins.secrets import has_secrets
from interceptor_core.builtins.sql import sql_writes
from interceptor_core.builtins.urls import host_in
from interceptor_core.context import RunContext

_T = cel.Type

VARIABLES: dict[str, Any] = {
    "args": _T.Map(_T.STRING, _T.DYN),
    "tool": _T.STRING,
    "run": _T.Map(_T.STRING, _T.DYN),
    "scope": _T.Map(_T.STRING, _T.DYN),
    "now": _T.TIMESTAMP,
}
"""The names a condition, an expression or a message may use."""

FIELDS: dict[str, frozenset[str] | None] = {
    "args": None,  # the tool's arguments: checked against its input model when the tools are known
    "tool": frozenset(),
    "run": frozenset({"tenant", "principal", "run_id", "thread_id", "metadata"}),
    "scope": frozenset({"gate", "workflow", "agent"}),
    "now": frozenset(),
}
"""The fields of each variable (None: any); `run.metadata` is free-form."""

FUNCTIONS = ("within", "host_in", "sql_writes", "has_secrets", "count_calls")
"""The built-in checks a policy may call, beside CEL's standard library and string extensions."""


@dataclass(slots=True)
class CallScope:
    """What a built-in function needs to know about the call being decided."""

    run: RunContext
    at: float
    counter: CallCounter | None
    redactor: Redactor
    base: str | None


current: contextvars.ContextVar[CallScope] = contextvars.ContextVar("callgate_policy_call")


def _count_calls(tool_glob: str, key: str, window: timedelta) -> int:
    scope = current.get()
    if scope.counter is None:
        raise RuntimeError("count_calls has no counter")
    return scope.counter.count(tool_glob, key, scope.run, window.total_seconds(), scope.at)


def _within(path: Any, roots: list[Any]) -> bool:
    return within(path, [str(root) for root in roots], base=current.get().base)


def _host_in(url: str, hosts: list[Any]) -> bool:
    return host_in(url, [str(host) for host in hosts])


def _sql_writes(query: str, dialect: str | None = None, safe: list[Any] | None = None) -> bool:
    # Without a dialect the query must read as read-only in every dialect sqlglot checks, which
    # costs about four parses; naming the database's dialect (`sql_writes(q, 'postgres')`) is one.
    return sql_writes(query, dialect=dialect, safe_functions=[str(name) for name in safe or ()])


def _has_secrets(value: Any) -> bool:
    return has_secrets(value, redactor=current.get().redactor)


_VALUE_KINDS = (_T.STRING, _T.INT, _T.UINT, _T.DOUBLE, _T.BOOL, _T.BYTES, _T.NULL, _T.LIST, _T.MAP)


def _overloads(name: str, impl: Callable[..., Any], returns: Any, *signatures: list[Any]) -> Any:
    return cel.FunctionDecl(
        name,
        [
            cel.Overload(f"{name}_{'_'.join(t.name().lower() for t in params)}", returns, params, impl=impl)
            for params in signatures
        ],
    )


def _build_env() -> Any:
    strings = _T.List(_T.STRING)
    return cel.NewEnv(
        variables=VARIABLES,
        extensions=[ext_strings.ExtStrings()],
        functions=[
            # A value from `args` is dynamic: the runtime picks the overload by its kind.
            _overloads("within", _within, _T.BOOL, [_T.STRING, strings], [_T.List(_T.DYN), strings]),
            _overloads("host_in", _host_in, _T.BOOL, [_T.STRING, strings]),
            _overloads(
                "sql_writes", _sql_writes, _T.BOOL, [_T.STRING], [_T.STRING, _T.STRING], [_T.STRING, _T.STRING, strings]
            ),
            _overloads("has_secrets", _has_secrets, _T.BOOL, *([kind] for kind in _VALUE_KINDS)),
            _overloads("count_calls", _count_calls, _T.INT, [_T.STRING, _T.STRING, _T.DURATION]),
        ],
    )


ENV: Any = None
"""The policy environment once built (read directly on the call path); `env()` builds it."""


def env() -> Any:
    """The policy environment (built on first use, shared: compiled expressions are immutable)."""
    global ENV
    if ENV is None:
        ENV = _build_env()
    return ENV


class CompileError(Exception):
    """CEL that does not parse or type-check; the message is the engine's, first line first."""


def compile_expression(source: str) -> Any:
    """Compile `source` in the policy environment; `CompileError` with the engine's reason."""
    try:
        return env().compile(source)
    except Exception as exc:  # the engine raises RuntimeError with an INVALID_ARGUMENT status
        raise CompileError(_engine_message(str(exc))) from None


def _engine_message(text: str) -> str:
    # "INVALID_ARGUMENT: ERROR: <input>:1:6: Syntax error: ...\n | args.\n | .....^ [INVALID_ARGUMENT]"
    text = text.replace("INVALID_ARGUMENT: ", "").replace(" [INVALID_ARGUMENT]", "")
    text = re.sub(r"ERROR: <input>:(\d+):(\d+): ", r"column \2: ", text)
    return " ".join(part.strip() for part in text.splitlines() if part.strip() and not part.strip().startswith("|"))


_INT_MIN, _UINT_MAX = -(2**63), 2**64 - 1


def unfaithful(value: Any, path: str) -> str | None:
    """Why the engine could not hold `value` whole, naming where (`path`, then `.key` and `[i]`
    below it); None when it can. The engine's strings end at their first NUL, and it refuses text
    that is not UTF-8 (a lone surrogate) and integers beyond 64 bits: a condition reading such a
    value would judge another value than the one the tool receives, so the policy fails it closed.

    Iterative, so a deeply nested value costs no recursion; about 1 µs for a few short arguments.
    """
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        item, where = stack.pop()
        kind = type(item)
        if kind is str:
            if (why := _text_problem(item)) is not None:
                return f"{where} holds {why}"
        elif kind is dict:
            for key, member in item.items():
                if type(key) is str and (why := _text_problem(key)) is not None:
                    return f"a key of {where} holds {why}"
                stack.append(
                    (member, f"{where}.{key}" if type(key) is str and key.isidentifier() else f"{where}[{key!r}]")
                )
        elif kind is list or kind is tuple:
            stack.extend((member, f"{where}[{index}]") for index, member in enumerate(item))
        elif kind is int and not _INT_MIN <= item <= _UINT_MAX:
            return f"{where} holds an integer beyond 64 bits"
        elif kind is bytes and b"\x00" in item:
            return f"{where} holds a NUL byte"
    return None


def _text_problem(text: str) -> str | None:
    if "\x00" in text:
        return "a NUL character (U+0000)"
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return "a lone surrogate (text that is not valid Unicode)"
    return None


BOOL = _T.BOOL
DYN = _T.DYN
ERROR = _T.ERROR


_STRING_LITERAL = re.compile(
    r"""[rRbB]{0,2}(?:\"\"\"[\s\S]*?\"\"\"|'''[\s\S]*?'''|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*')"""
)
_REFERENCE = re.compile(r"(?<![.\w])([A-Za-z_]\w*)(?:\s*\.\s*([A-Za-z_]\w*))?")
_GUARDED = re.compile(r"\bhas\s*\(\s*args\s*\.\s*([A-Za-z_]\w*)\s*\)")


def references(source: str) -> tuple[set[tuple[str, str | None]], set[str]]:
    """The (variable, first field) pairs an expression names, and the `args` fields it guards with
    `has(args.x)`. A lint over the text with string literals removed: CEL's checker sees maps, not
    records, so `run.tenat` would otherwise only fail when a call runs."""
    code = _STRING_LITERAL.sub('""', source)
    pairs = {(m.group(1), m.group(2)) for m in _REFERENCE.finditer(code) if m.group(1) in VARIABLES}
    return pairs, set(_GUARDED.findall(code))


def uses(source: str, name: str) -> bool:
    """True when the expression names `name` outside string literals (a variable or a function)."""
    code = _STRING_LITERAL.sub('""', source)
    return re.search(rf"(?<![.\w]){re.escape(name)}\b", code) is not None
