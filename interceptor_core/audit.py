"""The gate's side of the event contract: builds each decision's event, seals it into the
producer's chain and hands it to every sink.

Nothing here raises into the call path: a sink that fails is counted, an event that cannot be
built is logged and counted. Whether the call then goes on is the gate's audit mode: with
"required" (the default) a call does not start while an audit sink cannot take events
(`unavailable()`); with "best_effort" it does, and the counters say what was lost.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

import pydantic_core
from pydantic import BaseModel

from events.chain import Producer, SealedEvent, new_event_id
from events.models import (
    EVENT_TYPES,
    ApprovalRequestedEvent,
    ApprovalResolvedEvent,
    BlockedEvent,
    CheckpointEvent,
    EventBase,
    RegisteredTool,
    SubstituteEvent,
    ToolDeniedEvent,
    ToolsRegisteredEvent,
    ToolUseEvent,
    TurnDecisionEvent,
    UnmediatedEvent,
)
from events.redaction import RedactedArgs, Redactor
from events.sinks import CallStart, CallTracer, SinkStats, TracedCall, sink_label, sink_role
from interceptor_core.approvals import Approval, ApprovalRequest
from interceptor_core.context import RunContext
from interceptor_core.guard import UnmediatedAccess, current_call
from interceptor_core.interceptors import policy_version
from interceptor_core.results import DecisionRecord, ToolResult

if TYPE_CHECKING:
    from events.checkpoints import Checkpointer
    from interceptor_core.gate import AgentScope, CompiledChain, _CallState

log = logging.getLogger("callgate.gate")

_WIRE_TYPES: dict[type[EventBase], str] = {cls: kind for kind, cls in EVENT_TYPES.items()}

AuditMode = Literal["required", "best_effort"]
AUDIT_MODES: tuple[AuditMode, ...] = ("required", "best_effort")
"""`Gate(audit=...)`: "required" refuses new calls while an audit sink cannot take events;
"best_effort" lets them run, and logs and counts what the sinks lose."""


def digest(value: Any) -> str | None:
    """SHA-256 hex of a value's JSON (what the model would read), or None if it has no JSON form."""
    try:
        data = value.encode("utf-8") if isinstance(value, str) else pydantic_core.to_json(value)
    except Exception:
        return None
    return hashlib.sha256(data).hexdigest()


MAX_TEXT = 8192
"""Longest message, reason or error text an event carries; longer ones are cut (after redaction)."""
PACE_LIMIT_S = 1.0
"""The longest a new call waits for a congested sink before it runs anyway."""


def _cap(text: str) -> str:
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + "…[cut]"


def _ms(seconds: float | None) -> float:
    return (seconds or 0.0) * 1000.0


def _reason(sink: object) -> str:
    """Why an audit sink that is not `available` cannot take events, naming it."""
    why = getattr(sink, "unavailable_reason", None)
    return why if isinstance(why, str) and why else f"{sink_label(sink)} cannot store events"


def _has_available(sink: object) -> bool:
    try:
        return hasattr(sink, "available")
    except Exception:
        return True  # it has one; reading it failed (and will say so before every call)


def _state(sink: object) -> tuple[bool, str | None]:
    """(available, why not) of a sink as it reports itself; one without `available` is available."""
    try:
        if getattr(sink, "available", True):
            return True, None
        return False, _reason(sink)
    except Exception as exc:
        return False, f"{sink_label(sink)}: available raised {type(exc).__name__}: {exc}"


def _count(sink: object, name: str) -> int:
    value = getattr(sink, name, 0)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


class Audit:
    """Builds, seals and fans out the events of one gate. Safe from any thread."""

    def __init__(
        self,
        gate: str,
        sinks: Sequence[object],
        redactor: Redactor,
        mode: AuditMode = "required",
        *,
        signing_key: Any = None,
        checkpoint_events: int = 1000,
        checkpoint_s: float = 5.0,
        heartbeat_s: float = 60.0,
    ) -> None:
        self.gate = gate
        self.sinks = tuple(sinks)
        self.mode: AuditMode = mode
        self.roles = tuple(sink_role(s) for s in sinks)
        self.tracers: tuple[CallTracer, ...] = tuple(s for s in sinks if isinstance(s, CallTracer))
        # Audit sinks that can refuse on their own (a failed write, a full disk, queue or spool):
        # with "required", each is asked before every call (a plain attribute read each).
        self.gates: tuple[Any, ...] = tuple(
            s for s, role in zip(sinks, self.roles, strict=True) if role == "audit" and _has_available(s)
        )
        # Sinks whose last emit raised: index -> (why, since, failed count then). Replaced whole,
        # never mutated, so the emit path reads it without a lock.
        self._broken: dict[int, tuple[str, float, int]] = {}
        self._broken_lock = threading.Lock()
        self.must_check = False
        """Whether a new call must ask `unavailable()` first: mode "required" and an audit sink
        that can refuse, or one whose emit raised. Kept current, read once per call."""
        self._recheck()
        # Sinks that can fall behind (a store slower than the agents): new calls wait for them.
        self.pacers = tuple(s for s in sinks if hasattr(type(s), "congested"))
        # A sink that cannot take large records (Kafka's message limit) shrinks the args budget;
        # args are cut after redaction, so the cut text never holds a secret.
        limits = [limit for s in sinks if isinstance(limit := getattr(s, "max_event_bytes", None), int)]
        budget = min(limits) // 2 if limits else None
        # The redactor already cuts at its max_chars; a budget above that never needs checking.
        self.args_budget: int | None = budget if budget is not None and budget < redactor.max_chars else None
        self.redactor = redactor
        self.producer = Producer(collect_leaves=signing_key is not None)
        self.checkpointer: Checkpointer | None = None
        if signing_key is not None:
            from events.checkpoints import Checkpointer

            self.checkpointer = Checkpointer(
                self.producer,
                signing_key,
                self._emit_checkpoint,
                checkpoint_events=checkpoint_events,
                checkpoint_s=checkpoint_s,
                heartbeat_s=heartbeat_s,
            )
        self.emitted = [0] * len(self.sinks)
        self.failed = [0] * len(self.sinks)
        self.unbuilt = 0
        # Observers of every sealed event besides the sinks (the deny-all drill); replaced whole,
        # never mutated, so the emit path reads it without a lock.
        self.taps: tuple[Callable[[SealedEvent], None], ...] = ()

    def unavailable(self) -> str | None:
        """Why the audit path cannot take events now (None when it can): "audit unavailable:
        <sink>: <why>" for the first audit sink that is not `available`, or whose last emit
        raised. Cheap: attribute reads, no lock, no I/O."""
        for sink in self.gates:
            try:
                if not sink.available:
                    return "audit unavailable: " + _reason(sink)
            except Exception as exc:
                # A sink that cannot even say whether it can store is not a sink that can.
                return f"audit unavailable: {sink_label(sink)}: available raised {type(exc).__name__}: {exc}"
        for index, (why, _, _) in self._broken.items():
            if self.roles[index] == "audit":
                return "audit unavailable: " + why
        return None

    def _recheck(self) -> None:
        audit_broken = any(self.roles[index] == "audit" for index in self._broken)
        self.must_check = self.mode == "required" and (bool(self.gates) or audit_broken)

    def _emit_raised(self, index: int, sink: object, exc: Exception) -> None:
        with self._broken_lock:
            if index in self._broken:
                return
            why = f"{sink_label(sink)}: emit raised {type(exc).__name__}: {exc}"
            self._broken = {**self._broken, index: (why, time.monotonic(), self.failed[index] - 1)}
            self._recheck()
        blocks = self.mode == "required" and self.roles[index] == "audit"
        then = "new calls are refused until it takes one again" if blocks else "counted; calls go on"
        log.error("%s (%s)", why, then, exc_info=exc)

    def _emit_worked(self, index: int, sink: object) -> None:
        with self._broken_lock:
            entry = self._broken.get(index)
            if entry is None:
                return
            self._broken = {k: v for k, v in self._broken.items() if k != index}
            self._recheck()
        _, since, failed_then = entry
        log.warning(
            "%s takes events again after %.1f s; %d events failed meanwhile",
            sink_label(sink),
            time.monotonic() - since,
            self.failed[index] - failed_then,
        )

    def congested(self) -> bool:
        """Whether a sink is congested now (cheap: read before every call)."""
        return any(sink.congested for sink in self.pacers)  # type: ignore[attr-defined]

    async def pace(self) -> None:
        """Hold a new call back while a sink is congested, for at most `PACE_LIMIT_S`: the agents
        slow down to the rate the audit store takes instead of the lag growing without bound."""
        deadline = time.monotonic() + PACE_LIMIT_S
        # The sinks drain in threads of their own: there is no event of this loop to await.
        while time.monotonic() < deadline and self.congested():  # noqa: ASYNC110
            await asyncio.sleep(0.005)

    # -- fan-out ---------------------------------------------------------------------------------

    def _emit(self, cls: type[EventBase], fields: dict[str, Any]) -> SealedEvent | None:
        try:
            # Serialized once, hashed over those bytes: what every sink gets. The builders here
            # make valid events (the tests decode every one they look at), so nothing validates
            # them again on the call path.
            event = self.producer.seal_fields(_WIRE_TYPES[cls], fields)
        except Exception:
            # A bug in building the event; the chain did not advance, so nothing looks missing.
            self.unbuilt += 1
            log.exception("callgate could not build a %s event", cls.__name__)
            return None
        broken = self._broken
        for index, sink in enumerate(self.sinks):
            try:
                sink.emit(event)  # type: ignore[attr-defined]
                self.emitted[index] += 1
            except Exception as exc:
                self.failed[index] += 1
                # Logged once per state change: a sink that keeps raising does not flood the log.
                self._emit_raised(index, sink, exc)
            else:
                if broken and index in broken:
                    self._emit_worked(index, sink)
        for tap in self.taps:
            try:
                tap(event)
            except Exception:
                log.exception("an event tap failed")
        checkpointer = self.checkpointer
        if checkpointer is not None and cls is not CheckpointEvent:
            checkpointer.noted()
        return event

    def _emit_checkpoint(self, fields: dict[str, Any]) -> SealedEvent | None:
        envelope = self._envelope(None, None, None, None)
        envelope["parent_call_id"] = None
        envelope.update(fields)
        return self._emit(CheckpointEvent, envelope)

    def stats(self) -> dict[str, SinkStats]:
        """Per sink (keyed `index:ClassName`): see `SinkStats`. `failed` adds the failures inside
        `emit` to what the sink itself reports as never stored (its `failed`)."""
        broken = self._broken
        out: dict[str, SinkStats] = {}
        for index, sink in enumerate(self.sinks):
            entry = broken.get(index)
            available, error = (False, entry[0]) if entry is not None else _state(sink)
            out[f"{index}:{type(sink).__name__}"] = SinkStats(
                emitted=self.emitted[index],
                failed=self.failed[index] + _count(sink, "failed"),
                dropped=_count(sink, "dropped"),
                exported=getattr(sink, "exported", None),
                pending=pending if isinstance(pending := getattr(sink, "pending", None), int) else None,
                available=available,
                error=error,
                role=self.roles[index],
            )
        return out

    # -- envelopes -------------------------------------------------------------------------------

    def _envelope(self, path: Any, call_id: str | None, run: RunContext | None, trace: Any) -> dict[str, Any]:
        parent = current_call.get()
        return {
            "event_id": new_event_id(),
            "time": datetime.now(UTC),
            "gate": self.gate,
            "workflow": path.workflow if path else None,
            "agent": path.agent if path else None,
            "tool": path.tool if path else None,
            "call_id": call_id,
            # A call made from inside another mediated call (an agent used as a tool) names it.
            "parent_call_id": parent.call_id if parent is not None and parent.call_id != call_id else None,
            "run_id": run.run_id if run else None,
            "thread_id": run.thread_id if run else None,
            "tenant": run.tenant if run else None,
            "principal": run.principal if run else None,
            "trace_id": trace[0].trace_id if trace else None,
            "span_id": trace[0].span_id if trace else None,
        }

    def _trail(self, trail: Sequence[DecisionRecord], shadowed: bool = False) -> list[dict[str, Any]]:
        redact = self.redactor.redact_text
        steps = []
        for step in trail:
            fields = {
                "interceptor": step.interceptor,
                "scope": step.scope,
                "kind": step.kind,
                "phase": step.phase,
                "duration_ms": _ms(step.duration_s),
                "error": _cap(redact(step.error)) if step.error else None,
            }
            if step.policy_version is not None:
                # As the model writes them: the optional fields only when they hold something.
                fields["policy_version"] = step.policy_version
                if step.rules:
                    fields["rules"] = [{"id": rule, "decision": kind} for rule, kind in step.rules]
            if shadowed:
                # Only calls with a shadow decision say which steps were enforced (absent: all were).
                fields["enforced"] = step.enforced
            steps.append(fields)
        return steps

    def _args(self, state: _CallState) -> dict[str, Any]:
        source = self._current_args(state)
        # Redacted once per distinct args (approval events and the outcome share it).
        if state.redacted is None or state.redacted[0] is not source:
            state.redacted = (source, self._redact(state.compiled.tool.name, source))
        redacted: RedactedArgs = state.redacted[1]
        return self._args_fields(redacted)

    def _args_fields(self, redacted: RedactedArgs) -> dict[str, Any]:
        budget = self.args_budget
        if budget is not None and redacted.args is not None:
            text = json.dumps(redacted.args, ensure_ascii=False, default=str)
            if len(text) > budget:
                return {
                    "args": {"_truncated": text[:budget]},
                    "redacted_paths": redacted.redacted_paths,
                    "args_truncated": True,
                    "redaction_error": redacted.error,
                }
        return {
            "args": redacted.args,
            "redacted_paths": redacted.redacted_paths,
            "args_truncated": redacted.truncated,
            "redaction_error": redacted.error,
        }

    @staticmethod
    def _current_args(state: _CallState) -> Any:
        return state.call.args_model if state.call is not None else state.raw_args

    def _redact(self, tool: str, source: Any) -> RedactedArgs:
        if isinstance(source, BaseModel):
            data: Any = source.model_dump(mode="json")
        elif isinstance(source, Mapping):
            data = dict(source)
        elif isinstance(source, bytes | str):
            data = {"_raw": source.decode("utf-8", "replace") if isinstance(source, bytes) else source}
        else:
            data = {"_raw": repr(source)}
        return self.redactor.redact_args(tool, data)

    def _call_fields(self, state: _CallState, actual: str | None = None) -> dict[str, Any]:
        fields = self._envelope(state.compiled.path, state.call_id, state.run, state.trace)
        shadow = state.shadow
        fields["decisions"] = self._trail(state.trail, shadow is not None)
        fields.update(self._args(state))
        if state.compiled.tool.crossing is not None:
            fields["crossing"] = state.compiled.tool.crossing
        if shadow is not None and actual is not None:
            outcome, by, rule = shadow.outcome(actual)
            fields.update(shadow_outcome=outcome, divergent=outcome != actual, shadow_decided_by=by, shadow_rule=rule)
        return fields

    # -- one call --------------------------------------------------------------------------------

    def begin(self, state: _CallState) -> None:
        """Start the call's trace (if a tracing sink is configured)."""
        if not self.tracers:
            return
        path = state.compiled.path
        start = CallStart(
            gate=self.gate,
            workflow=path.workflow,
            agent=path.agent,
            tool=path.tool,
            call_id=state.call_id,
            run_id=state.run.run_id,
            tenant=state.run.tenant,
            principal=state.run.principal,
        )
        handles: list[TracedCall] = []
        for tracer in self.tracers:
            try:
                handle = tracer.start_call(start)
            except Exception:
                log.exception("tracing sink %r failed to start a call", tracer)
                continue
            if handle is not None:
                handles.append(handle)
        # The first handle with ids names the call's trace in its events; every handle is ended.
        handles.sort(key=lambda h: h.trace_id is None)
        state.trace = tuple(handles) or None

    def _conclude(self, state: _CallState, event: SealedEvent | None) -> None:
        state.concluded = True
        if not state.trace:
            return
        try:
            outcome = None if event is None else event.event
        except Exception:
            log.exception("callgate built an outcome event it cannot read back")
            outcome = None
        for handle in state.trace:
            try:
                handle.end(outcome)
            except Exception:
                log.exception("tracing sink failed to end a call")

    def outcome(self, state: _CallState, result: ToolResult, cause: str | None, substituted_by: str | None) -> None:
        """The call's one outcome event, from its result."""
        actual: str | None = None
        if state.shadow is not None:
            if result.kind == "denied":
                actual = "approval" if cause == "approval_refused" else "denied"
            elif substituted_by is not None:
                actual = "substituted"
            else:
                actual = "approval" if state.asked else "allowed"
        fields = self._call_fields(state, actual)
        redact = self.redactor.redact_text
        cls: type[EventBase]
        if result.kind == "denied" or cause in ("validation",):
            cls = ToolDeniedEvent
            fields.update(
                message=_cap(redact(result.message or "")),
                decided_by=result.decided_by or "gate",
                cause=cause or "deny",
            )
        elif substituted_by is not None:
            cls = SubstituteEvent
            fields.update(
                decided_by=substituted_by,
                result_digest=digest(result.value) if result.kind == "substituted" else None,
                error=_cap(redact(result.message)) if result.kind == "error" and result.message else None,
            )
        else:
            cls = ToolUseEvent
            failed = result.kind == "error"
            fields.update(
                outcome=("timeout" if state.timed_out else "error") if failed else "ok",
                error=_cap(redact(result.message)) if failed and result.message else None,
                duration_ms=_ms(state.tool_s),
                output_digest=None if failed else digest(result.value),
                output_truncated=result.truncated,
                args_rewritten=state.rewritten,
                cost_usd=result.cost_usd,
            )
        self._conclude(state, self._emit(cls, fields))

    def blocked(self, state: _CallState, reason: str, interceptor: str, cause: str) -> None:
        """The `Blocked` outcome: the run stops at this call."""
        fields = self._call_fields(state, "approval" if cause == "approval_required" else "blocked")
        fields.update(reason=_cap(self.redactor.redact_text(reason)), decided_by=interceptor, cause=cause)
        self._conclude(state, self._emit(BlockedEvent, fields))

    def interrupted(self, state: _CallState, exc: BaseException) -> None:
        """The outcome of a call cut short (cancelled, or an unexpected error in the gate)."""
        fields = self._call_fields(state)
        cancelled = isinstance(exc, asyncio.CancelledError)
        what = "cancelled" if cancelled else f"{type(exc).__name__}: {exc}"
        cls: type[EventBase]
        if state.tool_started is not None:
            cls = ToolUseEvent
            ran_s = state.tool_s if state.tool_s is not None else time.perf_counter() - state.tool_started
            if state.late is not None:
                # A sync body the caller stopped waiting for ran to its end: that is what happened.
                failed, output = state.late
                fields.update(
                    outcome="error" if failed else "ok",
                    error=_cap(self.redactor.redact_text(str(output))) if failed else None,
                    output_digest=None if failed else digest(output),
                )
            else:
                fields.update(outcome="cancelled", error=self.redactor.redact_text(what))
            fields.update(duration_ms=_ms(ran_s), args_rewritten=state.rewritten)
            if cancelled:
                fields["cancelled"] = True
        else:
            cls = ToolDeniedEvent
            fields.update(message=f"call interrupted: {what}", decided_by="gate", cause="interrupted")
        self._conclude(state, self._emit(cls, fields))

    def approval_requested(self, state: _CallState, request: ApprovalRequest) -> None:
        """The durable request: bound to the call by its approval id, argument digest and policy version."""
        fields = self._call_fields(state)
        fields.update(
            reason=_cap(self.redactor.redact_text(request.reason)),
            requested_by=request.requested_by,
            approval_id=request.approval_id,
            args_digest=request.args_digest,
            policy_version=request.policy_version,
            rule=request.rule,
            expires_at=None if request.expires_at is None else request.expires_at.isoformat(),
        )
        self._emit(ApprovalRequestedEvent, fields)

    def paused(self, state: _CallState) -> None:
        """The call paused for approval: its trace ends without an outcome (the resumed call has one)."""
        self._conclude(state, None)

    def approval_resolved(
        self, state: _CallState, request: ApprovalRequest, approval: Approval, waited_s: float, error: str | None
    ) -> None:
        fields = self._envelope(state.compiled.path, state.call_id, state.run, state.trace)
        fields["decisions"] = self._trail(state.trail)
        fields.update(
            approved=approval.approved,
            by=approval.by,
            note=self.redactor.redact_text(approval.note) if approval.note else None,
            waited_ms=_ms(waited_s),
            error=error,
            approval_id=request.approval_id,
            args_digest=request.args_digest,
            policy_version=request.policy_version,
        )
        self._emit(ApprovalResolvedEvent, fields)

    def unknown_tool(
        self,
        scope: AgentScope,
        name: str,
        args: Any,
        run: RunContext,
        result: ToolResult,
        cause: Literal["unknown_tool", "validation"] = "unknown_tool",
        crossing: str | None = None,
    ) -> None:
        """A call refused before any chain: a name the scope does not have ("unknown_tool", decided
        by the registry) or input refused in front of the gate ("validation", see `AgentScope.refuse`)."""
        from interceptor_core.context import ScopePath

        decided_by = "registry" if cause == "unknown_tool" else "validation"
        path = ScopePath(self.gate, scope.workflow_name, scope.name, name)
        fields = self._envelope(path, result.call_id, run, None)
        fields["decisions"] = [
            {"interceptor": decided_by, "scope": "gate", "kind": "deny", "phase": "validation", "duration_ms": 0.0}
        ]
        fields.update(self._args_only(name, args))
        fields.update(message=result.message or "", decided_by=decided_by, cause=cause)
        if crossing is not None:
            fields["crossing"] = crossing
        self._emit(ToolDeniedEvent, fields)

    def _args_only(self, tool: str, args: Any) -> dict[str, Any]:
        return self._args_fields(self._redact(tool, args))

    # -- not about one call ----------------------------------------------------------------------

    def turn_decision(
        self,
        scope: AgentScope,
        run: RunContext,
        turn: int,
        decision: str,
        decided_by: str | None,
        reason: str | None,
        trail: Sequence[DecisionRecord],
        message_count: int,
    ) -> None:
        """The before-turn chain's decision on one model call."""
        from interceptor_core.context import ScopePath

        fields = self._envelope(ScopePath(self.gate, scope.workflow_name, scope.name, ""), None, run, None)
        fields["tool"] = None
        fields["decisions"] = self._trail(trail)
        fields.update(
            turn=turn,
            decision=decision,
            decided_by=decided_by,
            reason=_cap(self.redactor.redact_text(reason)) if reason else None,
            message_count=message_count,
        )
        self._emit(TurnDecisionEvent, fields)

    def unmediated(self, access: UnmediatedAccess) -> None:
        """A guarded resource used around the gate."""
        active = current_call.get()
        run = active.run if active is not None else None
        fields = self._envelope(active.scope if active is not None else None, None, run, None)
        if active is not None:
            fields["call_id"] = active.call_id
            fields["parent_call_id"] = None
        fields.update(
            resource=access.resource,
            attribute=access.attribute,
            bound_tools=access.tools,
            site=access.site,
            active_tool=access.active_tool,
            thread=access.thread,
        )
        self._emit(UnmediatedEvent, fields)

    def tools_registered(self, path: Any, chains: Sequence[CompiledChain], run: RunContext | None = None) -> None:
        """A scope's tools, their schema hashes and effective chains; `run` (the scope's identity,
        if it has one) gives the event its tenant, principal and run id."""
        tools = [
            RegisteredTool(
                name=chain.tool.name,
                description=chain.tool.description,
                input_schema_sha256=hashlib.sha256(
                    pydantic_core.to_json(chain.tool.input_model.model_json_schema())
                ).hexdigest(),
                # A shadow interceptor mediates nothing: coverage does not ask for it in the trail.
                interceptors=tuple(b.name for b in chain.interceptors if not b.shadow),
                excluded=tuple(e.interceptor for e in chain.excluded),
                shadow=tuple(b.name for b in chain.interceptors if b.shadow),
                policies={b.name: v for b in chain.interceptors if (v := policy_version(b.obj)) is not None},
            )
            for chain in chains
        ]
        fields = self._envelope(path, None, run, None)
        fields["tool"] = None
        fields["parent_call_id"] = None
        fields["tools"] = tools
        self._emit(ToolsRegisteredEvent, fields)
