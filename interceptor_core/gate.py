"""The gate: scopes, the compiled interceptor chain per tool, and the one mediated call path."""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import functools
import inspect
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NoReturn, assert_never

from pydantic import BaseModel, ValidationError

from events.redaction import Redactor
from events.sinks import SINK_ROLES, SinkStartError, SinkStats, sink_label, sink_role
from interceptor_core._eager import InContext, finish, start
from interceptor_core.approvals import Approval, ApprovalHandler, ApprovalRequest, approval_id_for, args_digest, expiry
from interceptor_core.audit import AUDIT_MODES, Audit, AuditMode
from interceptor_core.context import RunContext, ScopePath, ToolCall, ToolContext, new_id
from interceptor_core.decisions import Allow, Block, Deny, PolicyDecision, RequireApproval, Rewrite, Substitute
from interceptor_core.exceptions import (
    ConfigurationError,
    CoverageError,
    ToolApprovalRequiredError,
    ToolBlockedError,
)
from interceptor_core.guard import CoverageLedger, CoverageReport, Guarded, current_call
from interceptor_core.interceptors import BoundInterceptor, ScopeLevel, bind_interceptor, policy_version
from interceptor_core.results import TRUNCATION_MARK, DecisionRecord, ToolResult
from interceptor_core.tools import Tool

log = logging.getLogger("callgate.gate")
OnInterceptorError = Literal["deny", "block"]
_DECISIONS = (Allow, Rewrite, Deny, Substitute, Block, RequireApproval)

# Called with every Gate built (the pytest plugin collects them); a tuple replaced whole.
_gate_observers: tuple[Callable[[Gate], None], ...] = ()


def observe_gates(observer: Callable[[Gate], None]) -> Callable[[], None]:
    """Call `observer(gate)` for every `Gate` built from now on (in the building thread, at the end
    of `Gate.__init__`); returns a function that stops it. An observer must not raise."""
    global _gate_observers
    _gate_observers = (*_gate_observers, observer)

    def stop() -> None:
        global _gate_observers
        _gate_observers = tuple(o for o in _gate_observers if o is not observer)

    return stop


_perf = time.perf_counter


@dataclass(frozen=True, slots=True)
class Exclusion:
    """An interceptor an inner scope switched off for a tool: who, where it lived, who excluded it."""

    interceptor: str
    scope: ScopeLevel
    excluded_by: str


@dataclass(frozen=True, slots=True)
class CompiledChain:
    """The effective chain of one tool at one scope, resolved once (and again when the gate changes)."""

    tool: Tool[Any, Any]
    path: ScopePath
    interceptors: tuple[BoundInterceptor, ...]
    """Every interceptor on the chain, outer scope first."""
    before: tuple[BoundInterceptor, ...]
    after: tuple[BoundInterceptor, ...]
    excluded: tuple[Exclusion, ...]
    generation: int


@dataclass(frozen=True, slots=True)
class _Level:
    level: ScopeLevel
    name: str
    interceptors: tuple[BoundInterceptor, ...]
    exclude: tuple[str, ...]


def _bind_all(interceptors: Iterable[object], level: ScopeLevel) -> tuple[BoundInterceptor, ...]:
    return tuple(bind_interceptor(obj, level) for obj in interceptors)


def _check_excludes(exclude: Sequence[str], outer: Sequence[_Level], where: str) -> None:
    """An exclude must name an interceptor of an outer scope, and never a mandatory one."""
    for name in exclude:
        matches = [b for level in outer for b in level.interceptors if b.name == name]
        if not matches:
            known = sorted({b.name for level in outer for b in level.interceptors})
            raise ConfigurationError(
                f"{where} excludes {name!r}, which is no interceptor of its outer scopes "
                f"(they have: {', '.join(known) or 'none'})",
                interceptor=name,
            )
        for bound in matches:
            if bound.mandatory:
                raise ConfigurationError(
                    f"{where} excludes {name!r}, which is mandatory at the {bound.scope} scope",
                    interceptor=name,
                )


def _compile(levels: Sequence[_Level], tool: Tool[Any, Any], path: ScopePath, generation: int) -> CompiledChain:
    chain: list[BoundInterceptor] = []
    excluded: list[Exclusion] = []
    for index, level in enumerate(levels):
        inner_excludes = {name: inner.name for inner in levels[index + 1 :] for name in inner.exclude}
        for bound in level.interceptors:
            # A mandatory interceptor added to the gate after a scope was built may share a name an
            # inner scope excluded; mandatory wins.
            if bound.name in inner_excludes and not bound.mandatory:
                excluded.append(Exclusion(bound.name, bound.scope, inner_excludes[bound.name]))
                continue
            chain.append(bound)
    return CompiledChain(
        tool=tool,
        path=path,
        interceptors=tuple(chain),
        before=tuple(b for b in chain if b.before is not None),
        after=tuple(b for b in reversed(chain) if b.after is not None),
        excluded=tuple(excluded),
        generation=generation,
    )


def _validation_text(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors(include_url=False):
        loc = ".".join(str(p) for p in error["loc"]) or "(arguments)"
        parts.append(f"{loc}: {error['msg']}")
    return "; ".join(parts)


@dataclass(slots=True)
class ShadowVerdict:
    """What a call's shadow decisions would have done, in chain order (a call with none has None).

    `ended`: the first shadow decision that would have ended the call ("denied", "blocked",
    "substituted"), with the interceptor and the policy rule behind it; `asked`: the first that
    would have asked a human.
    """

    ended: tuple[str, str, str | None] | None = None
    asked: tuple[str, str | None] | None = None

    def note(self, decision: object, by: str, rule: str | None) -> None:
        """Take one shadow decision into account (only the first of each kind counts)."""
        match decision:
            case Deny():
                end = "denied"
            case Block():
                end = "blocked"
            case Substitute():
                end = "substituted"
            case RequireApproval():
                if self.asked is None:
                    self.asked = (by, rule)
                return
            case _:
                return
        if self.ended is None:
            self.ended = (end, by, rule)

    def outcome(self, actual: str) -> tuple[str, str | None, str | None]:
        """(shadow outcome, interceptor, rule) given what happened: allowed, denied, blocked,
        substituted or approval. Every shadow decision came before the enforced chain ended, so
        one that would have ended the call wins; else the enforced end; else an approval."""
        if self.ended is not None:
            return self.ended
        if actual in ("denied", "blocked", "substituted", "approval"):
            return actual, None, None
        if self.asked is not None:
            return "approval", self.asked[0], self.asked[1]
        return "allowed", None, None


class _CallState:
    """One call in flight: what its result and its events are built from."""

    __slots__ = (
        "asked",
        "call",
        "call_id",
        "compiled",
        "concluded",
        "given",
        "late",
        "pausable",
        "raw_args",
        "redacted",
        "rewritten",
        "run",
        "shadow",
        "timed_out",
        "tool_s",
        "tool_started",
        "trace",
        "trail",
    )

    def __init__(self, compiled: CompiledChain, call_id: str, run: RunContext) -> None:
        self.compiled = compiled
        self.call_id = call_id
        self.run = run
        self.trail: list[DecisionRecord] = []
        self.call: ToolCall | None = None
        self.raw_args: Any = None
        self.rewritten = False
        self.timed_out = False
        self.tool_started: float | None = None
        self.tool_s: float | None = None
        self.concluded = False
        self.trace: tuple[Any, ...] | None = None
        self.redacted: Any = None
        self.asked = False
        self.shadow: ShadowVerdict | None = None
        # A sync body that outlived its caller's cancellation: (failed, output or error text).
        self.late: tuple[bool, Any] | None = None
        # An approval the caller's own flow gave before the call (AgentScope.call's `approval`).
        self.given: Approval | ApprovalHandler | None = None
        # The caller pauses its run when nobody can approve now, and resumes it with this call id.
        self.pausable = False


def _start_sinks(sinks: Sequence[object]) -> None:
    """Call each sink's `start()` (if it has one): a sink that cannot store anything fails here,
    when the gate is built, not at its first event."""
    for sink in sinks:
        start = getattr(sink, "start", None)
        if not callable(start):
            continue
        try:
            started = start()
        except SinkStartError as exc:
            raise ConfigurationError(str(exc)) from exc
        except Exception as exc:
            raise ConfigurationError(f"{sink_label(sink)} cannot start: {type(exc).__name__}: {exc}") from exc
        if inspect.isawaitable(started):
            close = getattr(started, "close", None)
            if callable(close):
                close()
            raise ConfigurationError(f"{sink_label(sink)}.start() is async; the gate starts sinks when it is built")


class Gate:
    """The application scope and the one path every tool call takes.

    A gate is not bound to an event loop: build scopes anywhere; one gate serves many
    `asyncio.run` calls and threads at once. It keeps no per-run state.

    - `interceptors`: application-scope interceptors, outermost.
    - `approval_handler`: answers `RequireApproval`; no answer within `approval_timeout_s` is a
      refusal. Without a handler such calls raise `ToolApprovalRequiredError`.
    - `interceptor_timeout_s`: an interceptor running longer fails closed, as one that raises or
      returns something that is not a decision does: `on_interceptor_error` "deny" (default; the
      model reads a denial) or "block" (the run stops with `ToolBlockedError`).
    - `sinks`: where events go. Each sink's `start()`, if it has one, is called here; a sink that
      cannot start (an unwritable path, a missing directory) raises `ConfigurationError` naming it.
      A sink's `role` is "audit" (the default) or "observability".
    - `audit`: "required" (default): while an audit sink cannot take events (its writes fail, its
      disk, queue or spool is full, its `emit` raised), new calls end `Blocked` with cause
      "audit_unavailable" and the reason "audit unavailable: <sink>: <why>", and no tool body
      runs, until it takes events again. "best_effort": calls go on; the sinks log each change of
      state once and `sink_stats()` counts what was lost. Observability sinks never block.
    """

    def __init__(
        self,
        name: str,
        *,
        interceptors: Sequence[object] = (),
        sinks: Sequence[object] = (),
        approval_handler: ApprovalHandler | None = None,
        approval_timeout_s: float = 300.0,
        interceptor_timeout_s: float = 5.0,
        on_interceptor_error: OnInterceptorError = "deny",
        redactor: Redactor | None = None,
        audit: AuditMode = "required",
        signing_key: object | None = None,
        checkpoint_events: int = 1000,
        checkpoint_s: float = 5.0,
        heartbeat_s: float = 60.0,
    ) -> None:
        if audit not in AUDIT_MODES:
            raise ConfigurationError(f"audit must be 'required' or 'best_effort', got {audit!r}")
        if on_interceptor_error not in ("deny", "block"):
            raise ConfigurationError(f"on_interceptor_error must be 'deny' or 'block', got {on_interceptor_error!r}")
        if interceptor_timeout_s <= 0 or approval_timeout_s <= 0:
            raise ConfigurationError("interceptor_timeout_s and approval_timeout_s must be positive")
        self.name = name
        self.approval_handler = approval_handler
        self.approval_timeout_s = approval_timeout_s
        self.interceptor_timeout_s = interceptor_timeout_s
        self.on_interceptor_error: OnInterceptorError = on_interceptor_error
        for sink in sinks:
            if not callable(getattr(sink, "emit", None)):
                raise ConfigurationError(f"sink {sink!r} has no emit(event) method")
            if sink_role(sink) not in SINK_ROLES:
                raise ConfigurationError(
                    f"sink {sink_label(sink)} has role {sink_role(sink)}: a sink is 'audit' or 'observability'"
                )
        key = _signing_key(signing_key)
        if checkpoint_events < 1 or checkpoint_s <= 0 or heartbeat_s <= 0:
            raise ConfigurationError(
                "checkpoint_events must be at least 1, checkpoint_s and heartbeat_s positive; got "
                f"{checkpoint_events!r}, {checkpoint_s!r}, {heartbeat_s!r}"
            )
        if key is not None and not sinks:
            raise ConfigurationError("signing_key needs an audit sink: the checkpoints are events")
        _start_sinks(sinks)
        self.sinks = tuple(sinks)
        self.audit_mode: AuditMode = audit
        self.redactor = redactor if redactor is not None else Redactor()
        self._audit_options: dict[str, Any] = {
            "signing_key": key,
            "checkpoint_events": checkpoint_events,
            "checkpoint_s": checkpoint_s,
            "heartbeat_s": heartbeat_s,
        }
        # No sinks, no events: the call path then skips building them altogether.
        self._audit: Audit | None = (
            Audit(name, self.sinks, self.redactor, audit, **self._audit_options) if self.sinks else None
        )
        self._level = _Level("application", name, _bind_all(interceptors, "application"), ())
        self._lock = threading.Lock()
        self._generation = 0
        self._workflows: dict[str, Workflow] = {}
        self._agents: list[AgentScope] = []
        self._direct: dict[str, CompiledChain] = {}
        self._ledger = CoverageLedger(on_unmediated=self._audit.unmediated if self._audit else None)
        self._exercised = self._ledger.exercised
        for observer in _gate_observers:
            observer(self)

    # -- scopes ---------------------------------------------------------------------------------

    def workflow(self, name: str, *, interceptors: Sequence[object] = (), exclude: Sequence[str] = ()) -> Workflow:
        """A workflow scope under this gate. Raises `ConfigurationError` for a bad exclude."""
        wf = Workflow(self, name, interceptors=interceptors, exclude=exclude)
        with self._lock:
            self._workflows[name] = wf
        return wf

    def agent(
        self,
        name: str,
        *,
        tools: Sequence[Tool[Any, Any]],
        interceptors: Sequence[object] = (),
        exclude: Sequence[str] = (),
        identity: RunContext | None = None,
    ) -> AgentScope:
        """An agent scope directly under the gate (no workflow). `identity`: see `AgentScope`."""
        return AgentScope(self, None, name, tools=tools, interceptors=interceptors, exclude=exclude, identity=identity)

    def add_interceptor(self, interceptor: object, *, first: bool = False) -> None:
        """Add an application-scope interceptor (outermost if `first`); every scope picks it up on
        its next call. Safe from any thread."""
        bound = bind_interceptor(interceptor, "application")
        with self._lock:
            current = self._level.interceptors
            ordered = (bound, *current) if first else (*current, bound)
            self._level = _Level("application", self.name, ordered, ())
            self._generation += 1
        self._announce_chains()

    def remove_interceptor(self, interceptor: object) -> None:
        """Remove an application-scope interceptor added earlier (matched by identity)."""
        with self._lock:
            kept = tuple(b for b in self._level.interceptors if b.obj is not interceptor)
            if len(kept) == len(self._level.interceptors):
                raise ConfigurationError(f"{interceptor!r} is not an interceptor of gate {self.name!r}")
            self._level = _Level("application", self.name, kept, ())
            self._generation += 1
        self._announce_chains()

    @property
    def interceptors(self) -> tuple[object, ...]:
        """The application-scope interceptors, in order."""
        return tuple(b.obj for b in self._level.interceptors)

    def _announce_chains(self) -> None:
        # Every scope's chains changed: the audit says so (a ToolsRegistered per agent scope), so a
        # reader checking trails against registered chains sees the new ones. Direct tools are
        # announced when `invoke` recompiles them.
        with self._lock:
            agents = list(self._agents)
        for scope in agents:
            self._announce(scope)

    def _adopt(self, chain: CompiledChain) -> None:
        """Let the policies of a new chain check the tool, and hear of their reloads.

        Raises `ConfigurationError` (a `PolicyError`) for a policy that does not fit the tool.
        """
        tool = chain.tool
        for bound in chain.interceptors:
            check = getattr(bound.obj, "check_tool", None)
            if check is None or policy_version(bound.obj) is None:
                continue
            check(tool.name, tool.input_model)
            bound.obj.on_change(self._policy_reloaded)  # type: ignore[attr-defined]

    def _policy_reloaded(self) -> None:
        # A policy of some chain reloaded: chains recompile (direct tools announce on their next
        # call) and every scope announces them, so the store knows which version decided a call.
        with self._lock:
            self._generation += 1
        self._announce_chains()

    def _announce(self, scope: AgentScope) -> None:
        """One ToolsRegistered event with `scope`'s tools and their current chains (none without sinks)."""
        if self._audit is not None:
            path = ScopePath(self.name, scope.workflow_name, scope.name, "")
            self._audit.tools_registered(path, [scope._chain(name) for name in scope.tools], scope.identity)

    def _register_agent(self, scope: AgentScope) -> None:
        with self._lock:
            self._agents.append(scope)
        self._ledger.register(scope.tools)
        self._announce(scope)

    # -- the direct path ------------------------------------------------------------------------

    async def invoke(
        self,
        tool: Tool[Any, Any],
        args: Mapping[str, Any] | BaseModel | str,
        *,
        run: RunContext | None = None,
        call_id: str | None = None,
    ) -> ToolResult:
        """Call `tool` through the application and tool scopes only (no workflow, no agent)."""
        compiled = self._direct.get(tool.name)
        if compiled is None or compiled.tool is not tool or compiled.generation != self._generation:
            levels = (self._level, _Level("tool", tool.name, _bind_all(tool.interceptors, "tool"), ()))
            _check_excludes(tool.exclude_interceptors, levels[:1], f"tool {tool.name!r}")
            levels = (levels[0], _Level("tool", tool.name, levels[1].interceptors, tool.exclude_interceptors))
            compiled = _compile(levels, tool, ScopePath(self.name, None, None, tool.name), self._generation)
            self._adopt(compiled)
            with self._lock:
                known = self._direct.get(tool.name)
                self._direct[tool.name] = compiled
            self._ledger.register((tool.name,))
            if self._audit is not None and (
                known is None or known.tool is not tool or known.generation != compiled.generation
            ):
                self._audit.tools_registered(ScopePath(self.name, None, None, ""), [compiled])
        return await self._execute(compiled, args, run if run is not None else RunContext(), call_id)

    # -- coverage -------------------------------------------------------------------------------

    def guard(self, obj: Any, *, name: str, tools: Iterable[str]) -> Any:
        """Wrap a client that has effects so only mediated calls of `tools` may use it.

        `tools` are tool names; they need not be registered yet. Any other use raises
        `UnmediatedAccessError` and is recorded for `coverage()`.
        """
        return Guarded(obj, name=name, tools=tools, gate_id=id(self), ledger=self._ledger)

    def coverage(self, *, require_exercised: bool = False) -> CoverageReport:
        """Registered tools, tools called through the gate, and every unmediated access so far."""
        return self._ledger.report(require_exercised=require_exercised)

    def assert_coverage(self, *, require_exercised: bool = False) -> CoverageReport:
        """Raise `CoverageError` (with the report) on any unmediated access, or, with
        `require_exercised`, on a registered tool never called through the gate."""
        report = self.coverage(require_exercised=require_exercised)
        if not report.ok:
            raise CoverageError(report)
        return report

    # -- describe -------------------------------------------------------------------------------

    def describe(self) -> list[dict[str, Any]]:
        """Each scope, its tools and the effective chain per tool, with the excludes that applied."""
        with self._lock:
            agents = list(self._agents)
            direct = list(self._direct.values())
        out: list[dict[str, Any]] = [
            {
                "scope": "application",
                "path": self.name,
                "interceptors": [b.name for b in self._level.interceptors],
                "tools": [],
            }
        ]
        for wf in self._workflows.values():
            out.append(
                {
                    "scope": "workflow",
                    "path": f"{self.name}/{wf.name}",
                    "interceptors": [b.name for b in wf._level.interceptors],
                    "exclude": list(wf._level.exclude),
                    "tools": [],
                }
            )
        for scope in agents:
            out.append(
                {
                    "scope": "agent",
                    "path": "/".join(p for p in (self.name, scope.workflow_name, scope.name) if p),
                    "interceptors": [b.name for b in scope._level.interceptors],
                    "exclude": list(scope._level.exclude),
                    "tools": [_describe_chain(scope._chain(t)) for t in scope.tools],
                }
            )
        if direct:
            out.append(
                {
                    "scope": "direct",
                    "path": f"{self.name} (gate.invoke)",
                    "interceptors": [],
                    "tools": [_describe_chain(c) for c in direct],
                }
            )
        return out

    # -- sinks ----------------------------------------------------------------------------------

    @property
    def producer_id(self) -> str | None:
        """The id this gate's events carry (None without sinks: no events are built)."""
        return self._audit.producer.producer_id if self._audit else None

    def sink_stats(self) -> dict[str, SinkStats]:
        """Per sink (keyed `index:ClassName`): events handed to it, never stored (`failed`: its
        emit raised, or it gave up on them), dropped, stored, still pending, whether it takes
        events now and why not (`SinkStats`). Safe from any thread; no I/O (a Kafka sink's
        `pending` may wait for the batch it is spooling)."""
        return self._audit.stats() if self._audit else {}

    def add_sink(self, sink: object) -> None:
        """Send this gate's events to `sink` too, for a gate built before its sinks were known (a
        factory that takes no `sinks=`, a module-level gate that `callgate mcp-proxy --events`
        fronts). Checked and started as the constructor's sinks are: `ConfigurationError` for an
        object without `emit`, an unknown role, or a sink whose `start()` fails; then nothing changes.

        Only before first use: once the gate has emitted an event or mediated a call, a sink added
        then would hold a chain with a hole, so that is a `ConfigurationError` too. Scopes built
        already are announced to the new sinks (one `ToolsRegistered` per agent scope). Not safe
        while another thread uses the gate: call it where the gate is set up.
        """
        if self._audit is not None and self._audit.producer.seq:
            raise ConfigurationError(
                f"gate {self.name!r} has emitted events already; a sink added now would miss the start of "
                "its chain: give sinks= when the gate is built"
            )
        if self._exercised:
            raise ConfigurationError(
                f"gate {self.name!r} has mediated calls already, unaudited; add sinks before the first call"
            )
        if not callable(getattr(sink, "emit", None)):
            raise ConfigurationError(f"sink {sink!r} has no emit(event) method")
        if sink_role(sink) not in SINK_ROLES:
            raise ConfigurationError(
                f"sink {sink_label(sink)} has role {sink_role(sink)}: a sink is 'audit' or 'observability'"
            )
        _start_sinks([sink])
        old = self._audit
        audit = Audit(self.name, (*self.sinks, sink), self.redactor, self.audit_mode, **self._audit_options)
        if old is not None:
            audit.taps = old.taps  # a running deny-all drill keeps seeing every event
        with self._lock:
            self.sinks = (*self.sinks, sink)
            self._audit = audit
            self._ledger.on_unmediated = audit.unmediated
            agents = list(self._agents)
            direct = list(self._direct.values())
        for scope in agents:
            self._announce(scope)
        for compiled in direct:
            audit.tools_registered(ScopePath(self.name, None, None, ""), [compiled])

    async def flush(self) -> None:
        """Drain every sink."""
        for sink in self.sinks:
            flush = getattr(sink, "flush", None)
            if flush is not None:
                await flush()

    async def close(self) -> None:
        """Emit the closing checkpoint (with a signing key), then flush and close every sink;
        idempotent."""
        if self._audit is not None and self._audit.checkpointer is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._audit.checkpointer.close)
        for sink in self.sinks:
            close = getattr(sink, "close", None)
            if close is not None:
                await close()

    # -- the call path --------------------------------------------------------------------------

    async def _execute(
        self,
        compiled: CompiledChain,
        args: Mapping[str, Any] | BaseModel | str,
        run: RunContext,
        call_id: str | None,
        approval: Approval | ApprovalHandler | None = None,
        pause: bool = False,
    ) -> ToolResult:
        state = _CallState(compiled, call_id or new_id(), run)
        if approval is not None:
            state.given = approval
        state.pausable = pause
        audit = self._audit
        if audit is None:
            return await self._run_call(state, args)
        if audit.pacers and audit.congested():
            await audit.pace()
        audit.begin(state)
        try:
            if audit.must_check and (why := audit.unavailable()) is not None:
                # Fail closed: a call whose decision cannot be recorded does not run.
                state.raw_args = args
                self._block(state, why, "audit", "audit_unavailable")
            return await self._run_call(state, args)
        except BaseException as exc:
            # Cancellation (or a bug) mid-call: the call still leaves its one outcome event.
            if not state.concluded:
                if state.pausable and isinstance(exc, ToolApprovalRequiredError):
                    audit.paused(state)  # its body paused (see `_run_tool`): the resumed call has it
                else:
                    audit.interrupted(state, exc)
            raise

    async def _run_call(self, state: _CallState, args: Mapping[str, Any] | BaseModel | str) -> ToolResult:
        compiled = state.compiled
        tool = compiled.tool
        trail = state.trail
        self._exercised.add(tool.name)  # atomic under the GIL; no lock on the call path

        # 1. Validate.
        try:
            if isinstance(args, tool.input_model):
                model = args
            elif isinstance(args, str | bytes):
                model = tool.input_model.model_validate_json(args)
            else:
                model = tool.input_model.model_validate(args)
        except ValidationError as exc:
            state.raw_args = args
            message = f"Invalid arguments for tool {tool.name}: {_validation_text(exc)}"
            trail.append(DecisionRecord("validation", "gate", "deny", 0.0, "validation", message))
            return self._result(state, "error", message=message, decided_by="validation", cause="validation")

        call = state.call = ToolCall(tool, model, state.run, state.call_id, compiled.path)

        # 2. Before-interceptors, outer scope to inner.
        approvals: list[tuple[str, str]] = []
        substituted_by: str | None = None
        output: Any = None
        timeout = self.interceptor_timeout_s
        for bound in compiled.before:
            if bound.shadow:
                await self._shadow_before(state, bound, call)
                continue
            started = _perf()
            try:
                decision = bound.before(call)  # type: ignore[misc]
                if bound.before_async or inspect.isawaitable(decision):
                    done, decision_or_pending = start(decision)
                    decision = decision_or_pending if done else await finish(decision, decision_or_pending, timeout)
                elapsed = _perf() - started
                if elapsed > timeout:
                    raise TimeoutError(f"ran {elapsed:.3f} s, past interceptor_timeout_s={timeout}")
            except Exception as exc:
                failure = _failure_text(exc, timeout)
                trail.append(DecisionRecord(bound.name, bound.scope, "error", _perf() - started, "before", failure))
                return self._fail_closed(state, bound, failure)
            elapsed = _perf() - started
            if decision is None or type(decision) is Allow:
                trail.append(DecisionRecord(bound.name, bound.scope, "allow", elapsed))
                continue
            if type(decision) is PolicyDecision:
                ruling = decision
                decision = ruling.decision
                if ruling.args is not None:
                    try:
                        call._replace_args(
                            ruling.args
                            if isinstance(ruling.args, tool.input_model)
                            else tool.input_model.model_validate(ruling.args)
                        )
                    except ValidationError as exc:
                        failure = f"rewrote the arguments into invalid ones: {_validation_text(exc)}"
                        trail.append(DecisionRecord(bound.name, bound.scope, "error", elapsed, "before", failure))
                        return self._fail_closed(state, bound, failure)
                    state.rewritten = True
                trail.append(
                    DecisionRecord(
                        bound.name,
                        bound.scope,
                        ruling.kind,
                        elapsed,
                        "before",
                        ruling.error,
                        ruling.policy_version,
                        ruling.rules,
                    )
                )
                if ruling.shadow is not None:
                    # The policy's shadow rules: a step of their own, recorded and not applied.
                    shadow_kind = ruling.shadow.kind
                    trail.append(
                        DecisionRecord(
                            bound.name,
                            bound.scope,
                            shadow_kind,
                            0.0,
                            "before",
                            None,
                            ruling.policy_version,
                            ruling.shadow_rules,
                            False,
                        )
                    )
                    if state.shadow is None:
                        state.shadow = ShadowVerdict()
                    state.shadow.note(ruling.shadow, bound.name, ruling.shadow_decided_by)
                if type(decision) is Allow:
                    continue
            elif isinstance(decision, _DECISIONS):
                trail.append(DecisionRecord(bound.name, bound.scope, decision.kind, elapsed))
            else:
                failure = f"returned {type(decision).__name__}, not a decision"
                trail.append(DecisionRecord(bound.name, bound.scope, "error", elapsed, "before", failure))
                return self._fail_closed(state, bound, failure)
            match decision:
                case Allow():
                    continue
                case Rewrite(args=new_args):
                    try:
                        if isinstance(new_args, tool.input_model):
                            call._replace_args(new_args)
                        else:
                            call._replace_args(tool.input_model.model_validate(new_args))
                    except ValidationError as exc:
                        failure = f"rewrote the arguments into invalid ones: {_validation_text(exc)}"
                        trail[-1] = DecisionRecord(bound.name, bound.scope, "error", elapsed, "before", failure)
                        return self._fail_closed(state, bound, failure)
                    state.rewritten = True
                case Deny(message=message):
                    return self._result(state, "denied", message=message, decided_by=bound.name, cause="deny")
                case Substitute(result=result):
                    output, substituted_by = result, bound.name
                    break
                case Block(reason=reason):
                    self._block(state, reason, bound.name, "block")
                case RequireApproval(reason=reason):
                    approvals.append((bound.name, reason))
                case _:
                    assert_never(decision)

        # 3. Approval, once the whole chain has run.
        if approvals and substituted_by is None:
            refusal = await self._ask_approval(state, call, approvals)
            if refusal is not None:
                return self._result(state, "denied", message=refusal, decided_by="approval", cause="approval_refused")

        # 4. The tool, in its own context (in the calling task), mediated.
        ctx = ToolContext(state.run, state.call_id, compiled.path, gate_id=id(self))
        if substituted_by is None:
            state.tool_started = _perf()
            failed, output = await self._run_tool(tool, call.args_model, ctx, state)
            state.tool_s = _perf() - state.tool_started
            if failed:
                _skip(trail, compiled.after)
                return self._result(state, "error", message=output, cost=ctx.cost_usd, cause="tool")

        # 5. After-interceptors, inner scope to outer; then validate and cut.
        for index, bound in enumerate(compiled.after):
            if bound.shadow:
                await self._shadow_after(state, bound, call, output)
                continue
            started = _perf()
            try:
                output = bound.after(call, output)  # type: ignore[misc]
                if bound.after_async or inspect.isawaitable(output):
                    done, output_or_pending = start(output)
                    output = output_or_pending if done else await finish(output, output_or_pending, timeout)
                if output is None and tool.output_type is not None:
                    raise TypeError("after_tool_call returned None; return the output, transformed or not")
            except Exception as exc:
                failure = _failure_text(exc, timeout)
                trail.append(DecisionRecord(bound.name, bound.scope, "error", _perf() - started, "after", failure))
                _skip(trail, compiled.after[index + 1 :])
                return self._result(
                    state,
                    "error",
                    message=f"output withheld: after-interceptor {bound.name!r} failed",
                    decided_by=bound.name,
                    cost=ctx.cost_usd,
                    substituted_by=substituted_by,
                    cause="after",
                )
            trail.append(DecisionRecord(bound.name, bound.scope, "allow", _perf() - started, "after"))
        try:
            value = tool.output_adapter.validate_python(output)
        except ValidationError as exc:
            source = "output" if substituted_by is None else f"substitute from {substituted_by!r}"
            return self._result(
                state,
                "error",
                message=f"{source} of tool {tool.name} does not match its declared type: {_validation_text(exc)}",
                decided_by="output",
                cost=ctx.cost_usd,
                substituted_by=substituted_by,
                cause="output",
            )
        truncated = False
        limit = tool.max_result_chars
        if limit is not None and isinstance(value, str) and len(value) > limit:
            value, truncated = value[:limit] + TRUNCATION_MARK, True
        return self._result(
            state,
            "ok" if substituted_by is None else "substituted",
            value=value,
            decided_by=substituted_by,
            truncated=truncated,
            cost=ctx.cost_usd,
            substituted_by=substituted_by,
        )

    async def _unknown_tool(
        self, scope: AgentScope, name: str, args: Any, run: RunContext | None, call_id: str | None
    ) -> ToolResult:
        result = ToolResult(
            kind="error",
            message=f"Unknown tool {name!r}; available tools: {', '.join(scope.tools) or 'none'}",
            tool_name=name,
            call_id=call_id or new_id(),
            decided_by="registry",
        )
        if self._audit is not None:
            self._audit.unknown_tool(scope, name, args, run if run is not None else RunContext(), result)
        return result

    def _result(
        self,
        state: _CallState,
        kind: Literal["ok", "error", "denied", "substituted"],
        *,
        value: Any = None,
        message: str | None = None,
        decided_by: str | None = None,
        truncated: bool = False,
        cost: float = 0.0,
        substituted_by: str | None = None,
        cause: str | None = None,
    ) -> ToolResult:
        tool = state.compiled.tool
        result = ToolResult(
            kind=kind,
            value=value,
            message=message,
            tool_name=tool.name,
            call_id=state.call_id,
            decided_by=decided_by,
            decisions=tuple(state.trail),
            truncated=truncated,
            cost_usd=cost,
            max_chars=tool.max_result_chars,
        )
        if self._audit is not None:
            self._audit.outcome(state, result, cause, substituted_by)
        return result

    def _block(
        self,
        state: _CallState,
        reason: str,
        interceptor: str,
        cause: str,
        error: type[ToolBlockedError | ToolApprovalRequiredError] = ToolBlockedError,
    ) -> NoReturn:
        if self._audit is not None:
            self._audit.blocked(state, reason, interceptor, cause)
        raise error(reason, tool=state.compiled.tool.name, call_id=state.call_id, interceptor=interceptor)

    def _fail_closed(self, state: _CallState, bound: BoundInterceptor, failure: str) -> ToolResult:
        tool = state.compiled.tool.name
        if self.on_interceptor_error == "block":
            reason = f"interceptor {bound.name!r} failed ({failure}); failing closed"
            self._block(state, reason, bound.name, "interceptor_error")
        # The model learns that a check failed, not the check's internals.
        message = f"The call to {tool} was refused: the policy check {bound.name!r} could not be completed."
        return self._result(state, "denied", message=message, decided_by=bound.name, cause="interceptor_error")

    async def _ask_approval(self, state: _CallState, call: ToolCall, approvals: list[tuple[str, str]]) -> str | None:
        """Ask the handler; None when approved, else the refusal the model reads."""
        reason = "; ".join(reason for _, reason in approvals)
        requested_by = tuple(name for name, _ in approvals)
        state.asked = True
        handler = self.approval_handler
        given = state.given
        if given is not None and not isinstance(given, Approval):
            handler, given = given, None  # the handler the caller's own flow asks for this call
        audit = self._audit
        request = self._approval_request(state, call, reason, requested_by)
        if handler is None and given is None:
            if not state.pausable:
                self._block(state, reason, ", ".join(requested_by), "approval_required", ToolApprovalRequiredError)
            # A pause: the durable request is the record; the call's one outcome comes when its
            # run resumes it (same call id, with the answer), in this process or another.
            if audit is not None:
                audit.approval_requested(state, request)
                audit.paused(state)
            state.concluded = True
            raise ToolApprovalRequiredError(
                reason, tool=call.tool_name, call_id=call.call_id, interceptor=", ".join(requested_by)
            )
        held = None
        if audit is not None:
            held = await self._recorded(handler, request) if given is None else None
            if held is None:
                audit.approval_requested(state, request)
            else:
                request = held  # asked again (a resumed call): the request stands as first recorded
        started = _perf()
        error: str | None = None
        answer: Any = None
        try:
            if given is not None:
                answer = given
            elif handler is not None:
                answer = handler(request)
            if inspect.isawaitable(answer):
                async with asyncio.timeout(self.approval_timeout_s):
                    answer = await answer
        except TimeoutError:
            error = f"no answer within {self.approval_timeout_s} s"
        except Exception as exc:
            error = f"approval handler raised {type(exc).__name__}: {exc}"
        match answer:
            case bool():
                approval = Approval(approved=answer)
            case Approval():
                approval = answer
            case _:
                if error is None:
                    error = f"approval handler returned {type(answer).__name__}, not bool or Approval"
                approval = Approval(approved=False)
        waited = _perf() - started
        state.trail.append(
            DecisionRecord("approval", "gate", "allow" if approval.approved else "deny", waited, "approval", error)
        )
        if audit is not None and approval.event_id is None:
            # A reviewer's decision was recorded where it was taken; anything else is recorded here,
            # on a request this producer recorded (a store takes an unsigned decision only from the
            # producer that asked: see consumers.store.UNVERIFIED_DECISION).
            if held is not None:
                audit.approval_requested(state, request)
            audit.approval_resolved(state, request, approval, waited, error)
        if approval.approved:
            return None
        refusal = f"The call to {call.tool_name} needs approval ({reason}) and was refused"
        if error is not None:
            refusal += " (no decision was given)"
        elif approval.by:
            refusal += f" by {approval.by}"
        return refusal + (f": {approval.note}" if approval.note else ".")

    async def _recorded(self, handler: ApprovalHandler | None, request: ApprovalRequest) -> ApprovalRequest | None:
        """This request with the expiry it was recorded with, when the handler can tell that it is
        recorded already (`RemoteApprovals.recorded`: the same approval id, call id, argument digest
        and policy version), else None."""
        recorded = getattr(handler, "recorded", None)
        if recorded is None:
            return None
        try:
            async with asyncio.timeout(self.approval_timeout_s):
                held = recorded(request)
                if inspect.isawaitable(held):
                    held = await held
        except Exception as exc:
            log.warning("approval %s: cannot tell whether it is recorded already: %s", request.approval_id, exc)
            return None
        if not isinstance(held, ApprovalRequest):
            return None
        binding = (held.approval_id, held.call_id, held.args_digest, held.policy_version)
        if binding != (request.approval_id, request.call_id, request.args_digest, request.policy_version):
            return None
        # Only the recorded expiry is taken, and never past this gate's own: what the handler says
        # cannot lengthen the wait or widen the request.
        expiries = [at for at in (held.expires_at, request.expires_at) if at is not None]
        return dataclasses.replace(request, expires_at=min(expiries) if expiries else None)

    def _approval_request(
        self, state: _CallState, call: ToolCall, reason: str, requested_by: tuple[str, ...]
    ) -> ApprovalRequest:
        """The request bound to this exact call: the digest of its validated arguments, the policy
        version and rules that asked (policy files among `requested_by`), and its expiry."""
        digest = args_digest(call.args_model.model_dump(mode="json"))
        versions: list[str] = []
        rules: list[str] = []
        for record in state.trail:
            if record.interceptor in requested_by and record.enforced and record.policy_version is not None:
                versions.append(record.policy_version)
                rules.extend(rule for rule, kind in record.rules if kind == "require_approval")
        version = ",".join(dict.fromkeys(versions)) or None
        return ApprovalRequest(
            tool=call.tool_name,
            args=call.args,
            reason=reason,
            run=call.run,
            call_id=call.call_id,
            requested_by=requested_by,
            approval_id=approval_id_for(call.call_id, digest, version),
            args_digest=digest,
            policy_version=version,
            rule=",".join(dict.fromkeys(rules)) or None,
            expires_at=expiry(self.approval_timeout_s),
        )

    async def _shadow_before(self, state: _CallState, bound: BoundInterceptor, call: ToolCall) -> None:
        """Run a shadow interceptor's before-hook and record what it decided; apply nothing, and
        never fail the call for it (an error or a timeout is recorded, that is all)."""
        started = _perf()
        timeout = self.interceptor_timeout_s
        if state.shadow is None:
            state.shadow = ShadowVerdict()
        try:
            decision = bound.before(call)  # type: ignore[misc]
            if bound.before_async or inspect.isawaitable(decision):
                done, decision_or_pending = start(decision)
                decision = decision_or_pending if done else await finish(decision, decision_or_pending, timeout)
            elapsed = _perf() - started
            if elapsed > timeout:
                raise TimeoutError(f"ran {elapsed:.3f} s, past interceptor_timeout_s={timeout}")
        except Exception as exc:
            failure = _failure_text(exc, timeout)
            state.trail.append(
                DecisionRecord(bound.name, bound.scope, "error", _perf() - started, "before", failure, None, (), False)
            )
            return
        elapsed = _perf() - started
        version: str | None = None
        rules: tuple[tuple[str, str], ...] = ()
        error: str | None = None
        rule: str | None = None
        kind: str
        if decision is None:
            decision = Allow()
        if type(decision) is PolicyDecision:
            ruling = decision
            decision, kind, version, rules, error, rule = (
                ruling.decision,
                ruling.kind,
                ruling.policy_version,
                ruling.rules,
                ruling.error,
                ruling.decided_by,
            )
        elif isinstance(decision, _DECISIONS):
            kind = decision.kind
        else:
            failure = f"returned {type(decision).__name__}, not a decision"
            state.trail.append(
                DecisionRecord(bound.name, bound.scope, "error", elapsed, "before", failure, None, (), False)
            )
            return
        state.trail.append(
            DecisionRecord(bound.name, bound.scope, kind, elapsed, "before", error, version, rules, False)
        )
        state.shadow.note(decision, bound.name, rule)

    async def _shadow_after(self, state: _CallState, bound: BoundInterceptor, call: ToolCall, output: Any) -> None:
        """Run a shadow after-hook on the output and record it; what it returns is dropped."""
        started = _perf()
        timeout = self.interceptor_timeout_s
        if state.shadow is None:
            state.shadow = ShadowVerdict()
        kind, failure = "allow", None
        try:
            returned = bound.after(call, output)  # type: ignore[misc]
            if bound.after_async or inspect.isawaitable(returned):
                done, returned_or_pending = start(returned)
                if not done:
                    await finish(returned, returned_or_pending, timeout)
        except Exception as exc:
            kind, failure = "error", _failure_text(exc, timeout)
        state.trail.append(
            DecisionRecord(bound.name, bound.scope, kind, _perf() - started, "after", failure, None, (), False)
        )

    async def _run_tool(
        self, tool: Tool[Any, Any], args: BaseModel, ctx: ToolContext, state: _CallState
    ) -> tuple[bool, Any]:
        """Run the tool body; (False, output) or (True, error text). Never raises its errors."""
        pos, kwargs = tool.bind(args, ctx)
        context = contextvars.copy_context()
        context.run(current_call.set, ctx)
        for handle in state.trace or ():
            try:
                context.run(handle.activate)
            except Exception:
                log.exception("tracing sink failed to activate a call's span")
        runner: Awaitable[Any]
        scope: asyncio.Timeout | None = None
        body: _SyncBody | None = None
        try:
            if tool.is_async:
                # Eager start in the tool's own context, and the rest in that context too, in this
                # task: a body that never suspends needs no task and no timer, and one that enters a
                # cancel scope or a timeout leaves it in the task that entered it (anyio, under httpx
                # and MCP clients, refuses anything else).
                coro = tool.fn(*pos, **kwargs)
                try:
                    pending = context.run(coro.send, None)
                except StopIteration as stop:
                    return False, stop.value
                runner = InContext(coro, context, pending)
            elif tool.inline:
                # Declared never to block: run here, on the event loop, with no thread hop.
                return False, context.run(tool.fn, *pos, **kwargs)
            else:
                # The worker thread keeps running if the timeout fires first: threads cannot be
                # killed. Shielded, so a cancelled caller can still wait for what the body did.
                body = _SyncBody()
                thread = asyncio.get_running_loop().run_in_executor(
                    None, functools.partial(context.run, body.run, tool.fn, pos, kwargs)
                )
                runner = asyncio.shield(thread)
            scope = asyncio.timeout(tool.timeout_s)
            async with scope:
                return False, await runner
        except asyncio.CancelledError:
            # The caller was cancelled (the timeout turns its own into TimeoutError). A sync body
            # that started cannot be stopped: wait for it and keep its real outcome for the
            # record; one still queued never runs.
            if body is not None:
                if body.outlives_caller():
                    state.late = await _outcome_of(thread)
                else:
                    thread.add_done_callback(_retrieve)  # it ends with the CancelledError it raised
            raise
        except ToolBlockedError:
            # A tool body that is itself an agent (`Agent.as_tool`) was blocked: the run it shares
            # with its caller must stop too, so this is not turned into an error result.
            raise
        except ToolApprovalRequiredError as exc:
            # A tool body that is itself an agent whose own call paused for approval: a caller
            # that pauses (`pause_for_approval`) pauses with it, and resumes the call later.
            if state.pausable:
                raise
            return True, f"{type(exc).__name__}: {exc}"
        except TimeoutError as exc:
            if scope is not None and scope.expired():
                state.timed_out = True
                return True, f"timed out after {tool.timeout_s} s"
            return True, f"{type(exc).__name__}: {exc}"
        except Exception as exc:
            return True, f"{type(exc).__name__}: {exc}"


def _signing_key(value: object | None) -> Any:
    """The gate's `SigningKey` from what `signing_key=` was given (a key or a path to its file)."""
    if value is None:
        return None
    from events.signing import SigningError, signing_key

    try:
        return signing_key(value)  # type: ignore[arg-type]
    except (SigningError, OSError, TypeError, ValueError) as exc:
        raise ConfigurationError(f"signing_key: {exc}") from None


class _SyncBody:
    """A sync tool body on its worker thread, and whether it started: decided under a lock, so a
    body a cancelled caller gives up on while it is still queued never runs."""

    __slots__ = ("abandoned", "lock", "started")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.started = False
        self.abandoned = False

    def run(self, fn: Callable[..., Any], pos: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        with self.lock:
            if self.abandoned:
                raise asyncio.CancelledError
            self.started = True
        return fn(*pos, **kwargs)

    def outlives_caller(self) -> bool:
        """True when the body has started (the caller must wait for it); else it never will."""
        with self.lock:
            self.abandoned = not self.started
            return self.started


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


async def _outcome_of(thread: asyncio.Future[Any]) -> tuple[bool, Any]:
    # Waits through further cancellations too: the body's effect happens either way, and the
    # record must say what it was.
    while True:
        try:
            return False, await asyncio.shield(thread)
        except asyncio.CancelledError:
            if thread.cancelled():
                return True, "cancelled"
            continue
        except Exception as exc:
            return True, f"{type(exc).__name__}: {exc}"


def _skip(trail: list[DecisionRecord], after: Sequence[BoundInterceptor]) -> None:
    # After-interceptors the call never reached (the tool failed, or an earlier one did) are on
    # the trail as "skipped": the trail names every interceptor of the chain, so a reader checking
    # it against the registered chain sees they were on the path.
    for bound in after:
        trail.append(DecisionRecord(bound.name, bound.scope, "skipped", 0.0, "after", None, None, (), not bound.shadow))


def _failure_text(exc: BaseException, timeout: float) -> str:
    if isinstance(exc, TimeoutError) and not str(exc):
        return f"no decision within interceptor_timeout_s={timeout}"
    return f"{type(exc).__name__}: {exc}"


def _describe_link(bound: BoundInterceptor, tool: str) -> dict[str, Any]:
    link: dict[str, Any] = {"interceptor": bound.name, "scope": bound.scope, "mandatory": bound.mandatory}
    if policy_version(bound.obj) is not None:
        link["policy"] = bound.obj.describe(tool)  # type: ignore[attr-defined]
    return link


def _describe_chain(chain: CompiledChain) -> dict[str, Any]:
    tool = chain.tool
    schema = tool.input_model.model_json_schema()
    required = set(schema.get("required", []))
    fields = [
        f"{name}{'' if name in required else '?'}: {prop.get('type', prop.get('$ref', 'any'))}"
        for name, prop in schema.get("properties", {}).items()
    ]
    return {
        "tool": tool.name,
        "description": tool.description,
        "inputs": fields,
        "chain": [_describe_link(b, tool.name) for b in chain.interceptors],
        "excluded": [
            {"interceptor": e.interceptor, "scope": e.scope, "excluded_by": e.excluded_by} for e in chain.excluded
        ],
    }


class Workflow:
    """A workflow scope: interceptors that apply to every agent under it, and excludes of the
    application's. Raises `ConfigurationError` when an exclude names no application interceptor or
    a mandatory one."""

    def __init__(
        self, gate: Gate, name: str, *, interceptors: Sequence[object] = (), exclude: Sequence[str] = ()
    ) -> None:
        self.gate = gate
        self.name = name
        _check_excludes(exclude, (gate._level,), f"workflow {name!r}")
        self._level = _Level("workflow", name, _bind_all(interceptors, "workflow"), tuple(exclude))

    def agent(
        self,
        name: str,
        *,
        tools: Sequence[Tool[Any, Any]],
        interceptors: Sequence[object] = (),
        exclude: Sequence[str] = (),
        identity: RunContext | None = None,
    ) -> AgentScope:
        """An agent scope under this workflow. `identity`: see `AgentScope`."""
        return AgentScope(
            self.gate, self, name, tools=tools, interceptors=interceptors, exclude=exclude, identity=identity
        )

    def __repr__(self) -> str:
        return f"Workflow({self.gate.name}/{self.name})"


class AgentScope:
    """An agent's scope: its tools and the chain each call of them meets.

    `await scope.call(tool_name, args, run=...)` is the mediated path; safe from many tasks and
    threads at once. An unknown tool name is an error result (the model may ask for anything),
    not an exception. `identity` (optional) is whom the scope acts for, such as the tenant and
    principal of a gateway serving one client: its `ToolsRegistered` events carry that
    `RunContext`'s tenant, principal and run id. Calls still carry the `run` they are given.
    """

    def __init__(
        self,
        gate: Gate,
        workflow: Workflow | None,
        name: str,
        *,
        tools: Sequence[Tool[Any, Any]],
        interceptors: Sequence[object] = (),
        exclude: Sequence[str] = (),
        identity: RunContext | None = None,
    ) -> None:
        self.gate = gate
        self.workflow = workflow
        self.name = name
        self.identity = identity
        outer = [gate._level] + ([workflow._level] if workflow else [])
        _check_excludes(exclude, outer, f"agent {name!r}")
        self._level = _Level("agent", name, _bind_all(interceptors, "agent"), tuple(exclude))
        self._tools: dict[str, Tool[Any, Any]] = {}
        self._tool_levels: dict[str, _Level] = {}
        for t in tools:
            self._admit(t, outer, self._tools, self._tool_levels)
        self._chains: dict[str, CompiledChain] = {}
        for t in tools:
            self._chain(t.name)
        gate._register_agent(self)

    def _admit(
        self,
        t: Tool[Any, Any],
        outer: Sequence[_Level],
        tools: dict[str, Tool[Any, Any]],
        levels: dict[str, _Level],
    ) -> None:
        if not isinstance(t, Tool):
            raise ConfigurationError(
                f"agent {self.name!r} was given {t!r}, which is not a Tool (decorate it with @tool)"
            )
        if t.name in tools:
            raise ConfigurationError(f"agent {self.name!r} has two tools named {t.name!r}", tool=t.name)
        _check_excludes(t.exclude_interceptors, [*outer, self._level], f"tool {t.name!r} in agent {self.name!r}")
        tools[t.name] = t
        levels[t.name] = _Level("tool", t.name, _bind_all(t.interceptors, "tool"), t.exclude_interceptors)

    def add_tools(self, tools: Sequence[Tool[Any, Any]]) -> None:
        """Add tools to this scope after it was built (say, tools an MCP server announced later).

        Checked like the constructor's tools: `ConfigurationError` for something that is not a
        `Tool`, a name the scope already has, or a bad exclude; then nothing is added. Before this
        returns, the new tools are registered for coverage and one `ToolsRegistered` event lists
        them, so no call of them can come first. Safe from several threads; calls in flight are
        not disturbed.
        """
        gate = self.gate
        outer = [gate._level] + ([self.workflow._level] if self.workflow else [])
        with gate._lock:
            added: dict[str, Tool[Any, Any]] = {}
            new_tools, new_levels = dict(self._tools), dict(self._tool_levels)
            for t in tools:
                self._admit(t, outer, new_tools, new_levels)
                added[t.name] = t
            # Levels first: a call that finds the tool also finds its level.
            self._tool_levels = new_levels
            self._tools = new_tools
        chains = [self._chain(name) for name in added]
        gate._ledger.register(added)
        if gate._audit is not None and chains:
            path = ScopePath(gate.name, self.workflow_name, self.name, "")
            gate._audit.tools_registered(path, chains, self.identity)

    @property
    def workflow_name(self) -> str | None:
        """The enclosing workflow's name, if any."""
        return self.workflow.name if self.workflow else None

    @property
    def tools(self) -> dict[str, Tool[Any, Any]]:
        """The scope's tools by name (a copy)."""
        return dict(self._tools)

    def tool_definitions(self) -> list[dict[str, Any]]:
        """`Tool.definition()` of every tool, in registration order, whatever the run."""
        return [t.definition() for t in self._tools.values()]

    def definitions(self, run: RunContext | None = None) -> list[dict[str, Any]]:
        """`Tool.definition()` of the tools some path of the chain can allow for `run`, in
        registration order: what a model is shown. A tool that a mandatory policy denies or blocks
        for this run whatever the arguments is left out. Hiding is only for the model: the gate
        still mediates every call, of a hidden tool too."""
        tools = self._tools
        return [tools[name].definition() for name in self.shown_tools(run)]

    def shown_tools(self, run: RunContext | None = None) -> list[str]:
        """The names of the tools `definitions(run)` lists, in registration order."""
        run = run if run is not None else RunContext()
        shown = []
        for name in self._tools:
            chain = self._chain(name)
            if not any(
                policy_version(b.obj) is not None and b.obj.hides(name, run, chain.path)  # type: ignore[attr-defined]
                for b in chain.interceptors
            ):
                shown.append(name)
        return shown

    def _chain(self, tool_name: str) -> CompiledChain:
        chain = self._chains.get(tool_name)
        gate = self.gate
        if chain is None or chain.generation != gate._generation:
            levels = [gate._level]
            if self.workflow is not None:
                levels.append(self.workflow._level)
            levels += [self._level, self._tool_levels[tool_name]]
            path = ScopePath(gate.name, self.workflow_name, self.name, tool_name)
            chain = _compile(levels, self._tools[tool_name], path, gate._generation)
            gate._adopt(chain)
            self._chains[tool_name] = chain
        return chain

    def call(
        self,
        tool_name: str,
        args: Mapping[str, Any] | BaseModel | str,
        *,
        run: RunContext | None = None,
        call_id: str | None = None,
        approval: Approval | ApprovalHandler | None = None,
        pause_for_approval: bool = False,
    ) -> Coroutine[Any, Any, ToolResult]:
        """Call one of this scope's tools through the whole chain.

        Returns a `ToolResult`; raises `ToolBlockedError` on `Block` and
        `ToolApprovalRequiredError` when approval is needed and nobody can give it.
        `approval`: an answer the caller's own approval flow already gave for this call (a
        framework's deferred tool approvals); if the chain requires approval, it is used instead of
        asking the gate's `approval_handler`, and recorded as the handler's answer would be
        (`ApprovalRequested`, `ApprovalResolved`). The whole chain still runs first. An
        `ApprovalHandler` instead (a framework's resume that defers to the reviewers' desk, a
        `RemoteApprovals`) is asked for this call in place of the gate's `approval_handler`.
        `pause_for_approval`: the caller pauses its run when approval is needed and nobody can give
        it now, and resumes the call later with the same call id and the answer (a framework's
        interrupt): the call then records the durable `ApprovalRequested` and no outcome before
        raising `ToolApprovalRequiredError` (without it, the outcome is `Blocked`). A tool body
        that raises `ToolApprovalRequiredError` itself (an agent run as a tool, whose own call
        paused) pauses such a call too: no outcome, the error raised; otherwise it is an error.
        """
        # A plain function returning the gate's coroutine: one coroutine less per call.
        if tool_name not in self._tools:
            return self.gate._unknown_tool(self, tool_name, args, run, call_id)
        return self.gate._execute(
            self._chain(tool_name),
            args,
            run if run is not None else RunContext(),
            call_id,
            approval,
            pause_for_approval,
        )

    def refuse(
        self,
        tool_name: str,
        message: str,
        *,
        run: RunContext | None = None,
        call_id: str | None = None,
        crossing: str | None = None,
    ) -> ToolResult:
        """Record a call that a transport in front of the gate refused before any chain ran (the
        MCP proxy's bounds on tool names and argument sizes): one `ToolDenied` event, decided by
        validation, with `message`, `tool_name` as the event's tool and no arguments. No tool runs
        and no interceptor is asked. Returns the `error` result (its message is `message`). Keep
        `tool_name` and `message` short: they are stored as given (the caller cuts what it refuses).
        `crossing` names the kind of MCP crossing refused when it was not a tool call."""
        result = ToolResult(
            kind="error", message=message, tool_name=tool_name, call_id=call_id or new_id(), decided_by="validation"
        )
        audit = self.gate._audit
        if audit is not None:
            audit.unknown_tool(
                self, tool_name, {}, run if run is not None else RunContext(), result, "validation", crossing
            )
        return result

    def __repr__(self) -> str:
        return f"AgentScope({'/'.join(p for p in (self.gate.name, self.workflow_name, self.name) if p)})"
