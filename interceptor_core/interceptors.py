"""Interceptors: any object with a `name` and `before_tool_call` and/or `after_tool_call`.

Handlers may be sync or async. `before_tool_call(call)` returns a `Decision` or `None` (allow);
`after_tool_call(call, output)` returns the output, transformed or not. `mandatory = True` means no
inner scope may exclude the interceptor.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeAlias, overload, runtime_checkable

from interceptor_core.context import ToolCall
from interceptor_core.decisions import Decision
from interceptor_core.exceptions import ConfigurationError

ScopeLevel: TypeAlias = Literal["application", "workflow", "agent", "tool"]

BeforeHandler: TypeAlias = Callable[[ToolCall], "Decision | Awaitable[Decision | None] | None"]
AfterHandler: TypeAlias = Callable[[ToolCall, Any], Any]


@runtime_checkable
class Interceptor(Protocol):
    """The shape the gate looks for; both handlers are optional, but one must be there."""

    name: str


@dataclass(frozen=True, slots=True)
class BoundInterceptor:
    """An interceptor as registered at one scope, its handlers looked up once.

    Built at registration so the call path does no attribute probing or `inspect` work.
    """

    name: str
    scope: ScopeLevel
    obj: object
    before: Callable[..., Any] | None
    before_async: bool
    after: Callable[..., Any] | None
    after_async: bool
    mandatory: bool
    shadow: bool = False
    """In shadow mode: evaluated and recorded on every call, never applied, never failing it."""


def policy_version(obj: object) -> str | None:
    """The version of a policy file (`interceptor_core.policy.Policy`), None for any other interceptor.

    Read when asked, never cached: a policy's version changes when it reloads.
    """
    version = getattr(obj, "version", None)
    if isinstance(version, str) and getattr(obj, "is_policy", False) is True:
        return version
    return None


def bind_interceptor(obj: object, scope: ScopeLevel) -> BoundInterceptor:
    """Check `obj` is an interceptor and look its handlers up; `ConfigurationError` if not."""
    name = getattr(obj, "name", None)
    if name is None:
        name = type(obj).__name__
    if not isinstance(name, str) or not name:
        raise ConfigurationError(f"interceptor {obj!r} has a name that is not a non-empty string: {name!r}")
    before = getattr(obj, "before_tool_call", None)
    after = getattr(obj, "after_tool_call", None)
    if before is not None and not callable(before):
        raise ConfigurationError(f"before_tool_call of interceptor {name!r} is not callable", interceptor=name)
    if after is not None and not callable(after):
        raise ConfigurationError(f"after_tool_call of interceptor {name!r} is not callable", interceptor=name)
    if before is None and after is None:
        raise ConfigurationError(
            f"interceptor {name!r} ({type(obj).__name__}) has neither before_tool_call nor after_tool_call",
            interceptor=name,
        )
    mode = getattr(obj, "mode", None)
    if mode not in (None, "enforce", "shadow"):
        raise ConfigurationError(
            f"interceptor {name!r} has mode {mode!r}; it must be 'enforce' or 'shadow'", interceptor=name
        )
    return BoundInterceptor(
        name=name,
        scope=scope,
        obj=obj,
        before=before,
        before_async=before is not None and inspect.iscoroutinefunction(before),
        after=after,
        after_async=after is not None and inspect.iscoroutinefunction(after),
        mandatory=bool(getattr(obj, "mandatory", False)),
        shadow=mode == "shadow",
    )


class Shadow:
    """An interceptor in shadow mode (see `shadow`): the same name and handlers, `mode = "shadow"`."""

    mode = "shadow"

    def __init__(self, inner: object) -> None:
        bound = bind_interceptor(inner, "application")
        self.inner = inner
        self.name = bound.name
        self.mandatory = bound.mandatory
        if bound.before is not None:
            self.before_tool_call = bound.before
        if bound.after is not None:
            self.after_tool_call = bound.after

    def __repr__(self) -> str:
        return f"shadow({self.inner!r})"


def shadow(interceptor: object) -> Shadow:
    """`interceptor` in shadow mode: evaluated on every call it meets, at its place in the chain,
    and recorded in the trail (`enforced: false`), but never applied. It does not deny, block,
    substitute, rewrite or ask a human, and if it raises or times out that is recorded as an error
    without failing the call. Each outcome event then says what the call would have had
    (`shadow_outcome`, `divergent`). Raises `ConfigurationError` for something that is not an
    interceptor. Setting `mode = "shadow"` on an interceptor's class does the same."""
    return Shadow(interceptor)


class FunctionInterceptor:
    """An interceptor made from plain functions by the `before_tool_call`/`after_tool_call` decorators."""

    def __init__(
        self,
        name: str,
        *,
        before: BeforeHandler | None = None,
        after: AfterHandler | None = None,
        mandatory: bool = False,
    ) -> None:
        self.name = name
        self.mandatory = mandatory
        # Only the handlers given exist as attributes, so the gate sees exactly what was declared.
        if before is not None:
            self.before_tool_call = before
        if after is not None:
            self.after_tool_call = after

    def __repr__(self) -> str:
        return f"FunctionInterceptor({self.name!r})"


@overload
def before_tool_call(fn: BeforeHandler, /) -> FunctionInterceptor: ...
@overload
def before_tool_call(
    *, name: str | None = None, mandatory: bool = False
) -> Callable[[BeforeHandler], FunctionInterceptor]: ...
def before_tool_call(
    fn: BeforeHandler | None = None, /, *, name: str | None = None, mandatory: bool = False
) -> FunctionInterceptor | Callable[[BeforeHandler], FunctionInterceptor]:
    """Make an interceptor from a function `(call) -> Decision | None` (sync or async).

    Usable bare or with `name=` (default: the function's name) and `mandatory=`.
    """

    def build(f: BeforeHandler) -> FunctionInterceptor:
        return FunctionInterceptor(name or str(getattr(f, "__name__", "before")), before=f, mandatory=mandatory)

    return build(fn) if fn is not None else build


@overload
def after_tool_call(fn: AfterHandler, /) -> FunctionInterceptor: ...
@overload
def after_tool_call(
    *, name: str | None = None, mandatory: bool = False
) -> Callable[[AfterHandler], FunctionInterceptor]: ...
def after_tool_call(
    fn: AfterHandler | None = None, /, *, name: str | None = None, mandatory: bool = False
) -> FunctionInterceptor | Callable[[AfterHandler], FunctionInterceptor]:
    """Make an interceptor from a function `(call, output) -> output` (sync or async)."""

    def build(f: AfterHandler) -> FunctionInterceptor:
        return FunctionInterceptor(name or str(getattr(f, "__name__", "after")), after=f, mandatory=mandatory)

    return build(fn) if fn is not None else build
