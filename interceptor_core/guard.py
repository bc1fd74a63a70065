"""Coverage at run time: the mediated context, guarded clients and the coverage report."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from interceptor_core.exceptions import UnmediatedAccessError

if TYPE_CHECKING:
    from interceptor_core.context import ToolContext


current_call: ContextVar[ToolContext | None] = ContextVar("callgate_mediated_call", default=None)
"""Set in a tool body's context while the gate runs it: a context variable, so parallel calls and
worker threads each see their own."""


@dataclass(frozen=True, slots=True)
class UnmediatedAccess:
    """One use of a guarded resource outside a mediated call of the tools it is bound to."""

    resource: str
    attribute: str
    tools: tuple[str, ...]
    site: str
    active_tool: str | None
    thread: str


@dataclass(frozen=True, slots=True)
class CoverageReport:
    """What the gate saw: tools registered, tools called through it, unmediated accesses.

    `ok` is true when nothing was reached unmediated (and, with `require_exercised`, every
    registered tool was called through the gate).
    """

    registered: frozenset[str]
    exercised: frozenset[str]
    unmediated: tuple[UnmediatedAccess, ...]
    require_exercised: bool = False
    never_exercised: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "never_exercised", self.registered - self.exercised)

    @property
    def ok(self) -> bool:
        """True when the report shows no violation."""
        return not self.unmediated and not (self.require_exercised and self.never_exercised)

    def summary(self) -> str:
        """A few lines a person can act on."""
        lines = [
            f"coverage: {len(self.registered)} tools registered, {len(self.exercised)} called through the gate, "
            f"{len(self.unmediated)} unmediated accesses"
        ]
        lines += [
            f"  unmediated: {u.resource}.{u.attribute} (bound to {', '.join(u.tools) or 'no tool'}) at {u.site}"
            + (f" during a call of {u.active_tool}" if u.active_tool else " outside any mediated call")
            for u in self.unmediated
        ]
        if self.require_exercised and self.never_exercised:
            lines.append(f"  never called through the gate: {', '.join(sorted(self.never_exercised))}")
        return "\n".join(lines)


def _call_site(depth: int) -> str:
    """file:line of the frame that used the guarded object (cheap: no traceback objects)."""
    try:
        frame = sys._getframe(depth)
    except ValueError:
        return "<unknown>"
    return f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"


class CoverageLedger:
    """The gate's record of registered tools, exercised tools and unmediated accesses; thread-safe."""

    def __init__(self, on_unmediated: Callable[[UnmediatedAccess], None] | None = None) -> None:
        self._lock = threading.Lock()
        self.registered: set[str] = set()
        self.exercised: set[str] = set()
        self.unmediated: list[UnmediatedAccess] = []
        self.on_unmediated = on_unmediated

    def register(self, names: Iterable[str]) -> None:
        with self._lock:
            self.registered.update(names)

    def record_unmediated(self, access: UnmediatedAccess) -> None:
        with self._lock:
            self.unmediated.append(access)
        if self.on_unmediated is not None:
            self.on_unmediated(access)

    def report(self, *, require_exercised: bool = False) -> CoverageReport:
        with self._lock:
            return CoverageReport(
                registered=frozenset(self.registered),
                # The gate adds to `exercised` without the lock; copying a set is atomic under the GIL.
                exercised=frozenset(self.exercised.copy()),
                unmediated=tuple(self.unmediated),
                require_exercised=require_exercised,
            )


class Guarded:
    """A proxy over a client that has effects; usable only inside a mediated call of its tools.

    Every attribute read, call, item access and context-manager entry checks the mediated context;
    outside it, the access is recorded and `UnmediatedAccessError` is raised. Callables fetched
    from it (bound methods) are checked again when they are called, so a method kept from inside a
    call cannot be used after it.
    """

    __slots__ = ("_cg_gate_id", "_cg_ledger", "_cg_name", "_cg_target", "_cg_tools")

    def __init__(self, target: Any, *, name: str, tools: Iterable[str], gate_id: int, ledger: CoverageLedger) -> None:
        object.__setattr__(self, "_cg_target", target)
        object.__setattr__(self, "_cg_name", name)
        object.__setattr__(self, "_cg_tools", frozenset(tools))
        object.__setattr__(self, "_cg_gate_id", gate_id)
        object.__setattr__(self, "_cg_ledger", ledger)

    def _cg_check(self, attribute: str, depth: int = 3) -> None:
        mediated = current_call.get()
        if mediated is not None and mediated.gate_id == self._cg_gate_id and mediated.scope.tool in self._cg_tools:
            return
        access = UnmediatedAccess(
            resource=self._cg_name,
            attribute=attribute,
            tools=tuple(sorted(self._cg_tools)),
            site=_call_site(depth),
            active_tool=mediated.scope.tool if mediated is not None else None,
            thread=threading.current_thread().name,
        )
        self._cg_ledger.record_unmediated(access)
        where = f"during a call of tool {mediated.scope.tool!r}" if mediated else "outside any mediated tool call"
        raise UnmediatedAccessError(
            f"{self._cg_name}.{attribute} was used {where}; it is reserved to the tools "
            f"{', '.join(sorted(self._cg_tools)) or '(none)'} called through the gate ({access.site})",
            resource=self._cg_name,
            attribute=attribute,
            tool=mediated.scope.tool if mediated else None,
            call_id=mediated.call_id if mediated else None,
        )

    def __getattr__(self, attribute: str) -> Any:
        self._cg_check(attribute)
        value = getattr(self._cg_target, attribute)
        if callable(value):
            return _GuardedCallable(self, attribute, value)
        return value

    def __setattr__(self, attribute: str, value: Any) -> None:
        self._cg_check(attribute)
        setattr(self._cg_target, attribute, value)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self._cg_check("__call__")
        return self._cg_target(*args, **kwargs)

    def __getitem__(self, key: Any) -> Any:
        self._cg_check("__getitem__")
        return self._cg_target[key]

    def __enter__(self) -> Any:
        self._cg_check("__enter__")
        return self._cg_target.__enter__()

    def __exit__(self, *exc: Any) -> Any:
        return self._cg_target.__exit__(*exc)

    async def __aenter__(self) -> Any:
        self._cg_check("__aenter__")
        return await self._cg_target.__aenter__()

    async def __aexit__(self, *exc: Any) -> Any:
        return await self._cg_target.__aexit__(*exc)

    def __repr__(self) -> str:
        return f"<guarded {self._cg_name} for {', '.join(sorted(self._cg_tools))}>"


class _GuardedCallable:
    __slots__ = ("_attribute", "_fn", "_guard")

    def __init__(self, guard: Guarded, attribute: str, fn: Callable[..., Any]) -> None:
        self._guard = guard
        self._attribute = attribute
        self._fn = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self._guard._cg_check(self._attribute)
        return self._fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<guarded {self._guard._cg_name}.{self._attribute}>"
