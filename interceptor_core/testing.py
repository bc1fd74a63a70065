"""Helpers for testing interceptors and gates: no broker, no model, no network.

- `check_before(interceptor, tool, args)` / `check_after(interceptor, tool, args, output)` run one
  interceptor's handler exactly as the gate would call it, without a gate, and hand back what it
  returned (`None` becomes `Allow()`); whatever it raises propagates, so a test sees it.
- `RecordingInterceptor` records every call it sees and returns a decision you choose.
- `deny_all(gate)` is the deny-all drill: every call through the gate is refused while it runs,
  and a tool body that starts anyway, or an attempt that leaves no denial event, fails it.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from interceptor_core.context import RunContext, ScopePath, ToolCall, new_id
from interceptor_core.decisions import Allow, Block, Decision, Deny
from interceptor_core.exceptions import ConfigurationError
from interceptor_core.interceptors import bind_interceptor
from interceptor_core.tools import Tool


def make_call(
    tool: Tool[Any, Any],
    args: Mapping[str, Any] | BaseModel,
    *,
    run: RunContext | None = None,
    call_id: str | None = None,
    gate: str = "test",
    workflow: str | None = None,
    agent: str | None = None,
) -> ToolCall:
    """A `ToolCall` as an interceptor would receive it; `args` are validated against the tool's model."""
    model = args if isinstance(args, tool.input_model) else tool.input_model.model_validate(args)
    return ToolCall(
        tool,
        model,
        run if run is not None else RunContext(),
        call_id or new_id(),
        ScopePath(gate, workflow, agent, tool.name),
    )


async def check_before(
    interceptor: object,
    tool: Tool[Any, Any],
    args: Mapping[str, Any] | BaseModel,
    *,
    run: RunContext | None = None,
    **scope: Any,
) -> Decision | object:
    """Run `interceptor.before_tool_call` on a call of `tool` with `args`; return its decision
    (`Allow()` for `None`, anything else as returned, so a test can catch a non-decision)."""
    bound = bind_interceptor(interceptor, "application")
    if bound.before is None:
        raise ConfigurationError(f"interceptor {bound.name!r} has no before_tool_call", interceptor=bound.name)
    result = bound.before(make_call(tool, args, run=run, **scope))
    if inspect.isawaitable(result):
        result = await result
    return Allow() if result is None else result


async def check_after(
    interceptor: object,
    tool: Tool[Any, Any],
    args: Mapping[str, Any] | BaseModel,
    output: Any,
    *,
    run: RunContext | None = None,
    **scope: Any,
) -> Any:
    """Run `interceptor.after_tool_call` on `output` of a call of `tool`; return the new output."""
    bound = bind_interceptor(interceptor, "application")
    if bound.after is None:
        raise ConfigurationError(f"interceptor {bound.name!r} has no after_tool_call", interceptor=bound.name)
    result = bound.after(make_call(tool, args, run=run, **scope), output)
    if inspect.isawaitable(result):
        result = await result
    return result


@dataclass(frozen=True, slots=True)
class SeenCall:
    """One call a `RecordingInterceptor` saw: which handler, the tool, the args as it saw them."""

    phase: str
    interceptor: str
    tool: str
    call_id: str
    args: dict[str, Any]
    output: Any = None


class RecordingInterceptor:
    """Records every call it sees, in order, and returns `decision` (default: allow).

    `log` may be shared between several recorders to capture their relative order. Safe from
    several tasks and threads.
    """

    def __init__(
        self,
        name: str = "recorder",
        *,
        decision: Decision | None = None,
        log: list[SeenCall] | None = None,
        mandatory: bool = False,
        after: bool = True,
    ) -> None:
        self.name = name
        self.decision = decision
        self.mandatory = mandatory
        self.log: list[SeenCall] = log if log is not None else []
        self._lock = threading.Lock()
        if not after:
            # No after handler at all, so the gate sees a before-only interceptor.
            self.after_tool_call = None  # type: ignore[assignment]

    def before_tool_call(self, call: ToolCall) -> Decision | None:
        with self._lock:
            self.log.append(SeenCall("before", self.name, call.tool_name, call.call_id, dict(call.args)))
        return self.decision

    def after_tool_call(self, call: ToolCall, output: Any) -> Any:
        with self._lock:
            self.log.append(SeenCall("after", self.name, call.tool_name, call.call_id, dict(call.args), output))
        return output

    @property
    def calls(self) -> list[SeenCall]:
        """What this recorder saw (a shared log filtered to it)."""
        return [seen for seen in self.log if seen.interceptor == self.name]


# -- the deny-all drill ---------------------------------------------------------------------------

DRILL_INTERCEPTOR = "callgate-deny-all-drill"
"""The name the drill's interceptor decides under (`decided_by` of its denial events)."""

_DENIAL_TYPES = frozenset({"ToolDenied", "Blocked"})


class DrillFailedError(AssertionError):
    """The deny-all drill saw a tool effect, or an attempt that left no denial event; the message
    lists every tool with its attempts, denials and effects. `report` is the whole `DrillReport`."""

    def __init__(self, report: DrillReport) -> None:
        super().__init__(report.describe())
        self.report = report


@dataclass(frozen=True, slots=True)
class ToolDrill:
    """One tool in a drill: calls the gate mediated (`attempts`), denial events for them
    (`denials`), and tool bodies that started anyway (`effects`), with the call ids."""

    tool: str
    attempts: int
    denials: int
    effects: int
    undenied_calls: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """No effect, and a denial event for every attempt."""
        return self.effects == 0 and not self.undenied_calls


@dataclass(frozen=True, slots=True)
class DrillReport:
    """What a deny-all drill saw, per tool (sorted by name); `ok` when no tool failed."""

    gate: str
    tools: tuple[ToolDrill, ...]
    audited: bool

    @property
    def ok(self) -> bool:
        return all(tool.ok for tool in self.tools)

    @property
    def attempts(self) -> int:
        return sum(tool.attempts for tool in self.tools)

    @property
    def denials(self) -> int:
        return sum(tool.denials for tool in self.tools)

    @property
    def effects(self) -> int:
        return sum(tool.effects for tool in self.tools)

    def tool(self, name: str) -> ToolDrill:
        """The line of one tool (zeros for a tool the drill never saw)."""
        for tool in self.tools:
            if tool.tool == name:
                return tool
        return ToolDrill(name, 0, 0, 0)

    def describe(self) -> str:
        """A table a person reads: one line per tool, and what failed."""
        head = f"deny-all drill on gate {self.gate!r}: " + ("passed" if self.ok else "FAILED")
        if not self.audited:
            head += " (the gate has no sinks, so it wrote no denial events)"
        lines = [head, f"  {'tool':<32} {'attempts':>8} {'denials':>8} {'effects':>8}"]
        for tool in self.tools:
            flag = "" if tool.ok else "  <- " + ", ".join(_drill_problems(tool))
            lines.append(f"  {tool.tool:<32} {tool.attempts:>8} {tool.denials:>8} {tool.effects:>8}{flag}")
        if not self.tools:
            lines.append("  (no tool was called during the drill)")
        return "\n".join(lines)


def _drill_problems(tool: ToolDrill) -> list[str]:
    problems = []
    if tool.effects:
        problems.append(f"{tool.effects} effect(s)")
    if tool.undenied_calls:
        problems.append(f"{len(tool.undenied_calls)} attempt(s) without a denial event")
    return problems


class DenyAllDrill:
    """The deny-all drill: while active, every call through `gate` is refused, and every tool body
    that starts anyway is recorded as an effect.

    Use it through `deny_all(gate)`, as a context manager (sync or async). On entry it installs a
    mandatory, outermost application-scope interceptor that denies (or, with `mode="block"`, blocks)
    every call, listens to the gate's events, and wraps the body of every tool the gate knows
    (`Tool.fn` of its agent scopes and direct tools) so a start is recorded. Bodies the gate does not
    own (a framework's function, an MCP server's handler) can be watched with `watch(tool, fn)`.
    On exit everything is restored; then, with `check=True`, a failed drill raises
    `DrillFailedError` (unless the block already raised).

    A drill passes when no effect happened and every attempt (a call the drill's interceptor saw)
    has a `ToolDenied` or `Blocked` event decided by it; a gate without sinks writes no events, so
    its drill cannot pass. Tools registered after entry are refused too, but only watched through
    `watch`. Safe from any thread and task.
    """

    name = DRILL_INTERCEPTOR
    mandatory = True

    def __init__(self, gate: Any, *, mode: str = "deny", check: bool = True) -> None:
        if mode not in ("deny", "block"):
            raise ConfigurationError(f"deny_all mode must be 'deny' or 'block', got {mode!r}")
        self.gate = gate
        # Not `mode`: on an interceptor that names enforce or shadow (`interceptor_core.shadow`).
        self.refusal = mode
        self.check = check
        self._lock = threading.Lock()
        self._attempts: dict[str, list[str]] = {}
        self._denied: set[str] = set()
        self._denials: dict[str, int] = {}
        self._effects: dict[str, int] = {}
        self._ran: dict[str, int] = {}
        self._restore: list[tuple[Tool[Any, Any], Any]] = []
        self._active = False
        self._report: DrillReport | None = None

    # -- the interceptor and the tap ------------------------------------------------------------

    def before_tool_call(self, call: ToolCall) -> Decision:
        with self._lock:
            self._attempts.setdefault(call.tool_name, []).append(call.call_id)
        reason = f"deny-all drill: every call to {call.tool_name} is refused while the drill runs"
        return Block(reason) if self.refusal == "block" else Deny(reason)

    def _tap(self, event: Any) -> None:
        kind = getattr(event, "type", None)
        tool_name = getattr(event, "tool", None)
        if tool_name is None:
            return
        with self._lock:
            if kind in _DENIAL_TYPES and getattr(event, "decided_by", None) == DRILL_INTERCEPTOR:
                self._denied.add(str(event.call_id))
                self._denials[tool_name] = self._denials.get(tool_name, 0) + 1
            elif kind == "ToolUse":
                self._ran[tool_name] = self._ran.get(tool_name, 0) + 1

    # -- effects --------------------------------------------------------------------------------

    def record_effect(self, tool: str) -> None:
        """Count one effect of `tool` (what `watch` wrappers call when a body starts)."""
        with self._lock:
            self._effects[tool] = self._effects.get(tool, 0) + 1

    def watch(self, tool: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """`fn` wrapped so each start counts as an effect of `tool` (sync or async kept)."""
        return _recording(fn, lambda: self.record_effect(tool))

    def _wrap_tools(self) -> None:
        tools: dict[int, Tool[Any, Any]] = {}
        for scope in list(self.gate._agents):
            for tool in scope.tools.values():
                tools[id(tool)] = tool
        for compiled in list(self.gate._direct.values()):
            tools[id(compiled.tool)] = compiled.tool
        for tool in tools.values():
            original = tool.fn
            tool.fn = self.watch(tool.name, original)
            self._restore.append((tool, original))

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        """Install the drill (what entering the context manager does); `ConfigurationError` if it
        is already running."""
        if self._active:
            raise ConfigurationError("this deny-all drill is already running")
        self._wrap_tools()
        audit = self.gate._audit
        if audit is not None:
            audit.taps = (*audit.taps, self._tap)
        self.gate.add_interceptor(self, first=True)
        self._active = True

    def stop(self) -> DrillReport:
        """Remove the drill, restore every tool body, and return the report (idempotent)."""
        if self._active:
            self._active = False
            self.gate.remove_interceptor(self)
            audit = self.gate._audit
            if audit is not None:
                audit.taps = tuple(t for t in audit.taps if t != self._tap)
            for tool, original in reversed(self._restore):
                tool.fn = original
            self._restore.clear()
            self._report = self._build_report()
        return self.report

    @property
    def report(self) -> DrillReport:
        """The report: final after the drill stopped, as it stands while it runs."""
        return self._report if self._report is not None else self._build_report()

    def _build_report(self) -> DrillReport:
        with self._lock:
            names = sorted(set(self._attempts) | set(self._effects) | set(self._ran))
            tools = tuple(
                ToolDrill(
                    name,
                    attempts=len(self._attempts.get(name, ())),
                    denials=self._denials.get(name, 0),
                    # A ToolUse event means the body ran even where no wrapper saw it start.
                    effects=max(self._effects.get(name, 0), self._ran.get(name, 0)),
                    undenied_calls=tuple(c for c in self._attempts.get(name, ()) if c not in self._denied),
                )
                for name in names
            )
        return DrillReport(self.gate.name, tools, audited=self.gate._audit is not None)

    def _finish(self, failed: bool) -> None:
        report = self.stop()
        if self.check and not failed and not report.ok:
            raise DrillFailedError(report)

    def __enter__(self) -> DenyAllDrill:
        self.start()
        return self

    def __exit__(self, exc_type: object, *exc_info: object) -> None:
        self._finish(exc_type is not None)

    async def __aenter__(self) -> DenyAllDrill:
        return self.__enter__()

    async def __aexit__(self, exc_type: object, *exc_info: object) -> None:
        self._finish(exc_type is not None)


def deny_all(gate: Any, *, mode: str = "deny", check: bool = True) -> DenyAllDrill:
    """The deny-all drill on `gate` (see `DenyAllDrill`): `with deny_all(gate) as drill: ...` or
    `async with`. `mode="block"` blocks instead of denying (the run stops at the first call);
    `check=False` leaves the verdict to the caller (`drill.report.ok`)."""
    return DenyAllDrill(gate, mode=mode, check=check)


def _recording(fn: Callable[..., Any], record: Callable[[], None]) -> Callable[..., Any]:
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def watched_async(*args: Any, **kwargs: Any) -> Any:
            record()
            return await fn(*args, **kwargs)

        return watched_async

    @functools.wraps(fn)
    def watched(*args: Any, **kwargs: Any) -> Any:
        record()
        return fn(*args, **kwargs)

    return watched
