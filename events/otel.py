"""OpenTelemetry tracing of mediated tool calls: one `execute_tool {tool}` span per call.

`OtelSink` is both a sink (`emit` / `flush` / `close`) and a `CallTracer`: the gate calls
`start_call` when a call starts, on the caller's thread and context, so the span is a child of
whatever span the application has current (its own `invoke_agent ...` span, say); the handle's ids
go into every event of the call, and the gate ends it once with the call's outcome event.

What a call's span carries (names in `events.semconv`):

- at start: `gen_ai.operation.name` = "execute_tool", `gen_ai.tool.name`, `gen_ai.tool.call.id`
  (the call id), `gen_ai.tool.type` = "function", `gen_ai.agent.name`, and `callgate.gate`,
  `callgate.workflow`, `callgate.tenant`, `callgate.principal`, `callgate.run_id` (None values
  are left out);
- at end: `callgate.decision` ("allowed", "denied", "substituted" or "blocked"),
  `callgate.event_id`, `callgate.decided_by`, `callgate.outcome` (allowed calls),
  `callgate.cause` (denied and blocked calls), `callgate.message` (denied calls only),
  `callgate.reason` (blocked calls only); on failure, `error.type` and status ERROR (see below);
  one `callgate.decision` span event per step of the decision trail, in order, each timed at the
  step's approximate end (call start plus the durations of the steps before it);
- opt-in only: `gen_ai.tool.call.arguments` (JSON of the *redacted* args of the outcome event,
  `capture_args=True`) and `gen_ai.tool.call.result` (`sha256:<hex>` of the output: the events
  hold no raw output, `capture_results=True`).

A call of an unknown tool is refused before a call starts; its `ToolDenied` event, when emitted,
becomes a zero-duration call span of its own.

`error.type` values: "denied" (a `ToolDenied`), "blocked" (a `Blocked`), "tool_error" (the tool
raised or its output did not match its type), "timeout", "interrupted" (cancelled, or a gate bug
mid-call), "output_withheld" (an after-interceptor failed), "callgate.event_missing" (`end(None)`:
the gate could not build the outcome event). `callgate.unmediated` spans carry
"unmediated_access".

This is the only module of `events` that imports OpenTelemetry; import it only when used.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from datetime import UTC, datetime, timedelta
from importlib import metadata
from time import time_ns
from typing import ClassVar

from opentelemetry import context as otel_context
from opentelemetry import trace as trace_api
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import Event as SdkEvent
from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from events import semconv as sc
from events.chain import SealedEvent, typed
from events.models import (
    ApprovalRequestedEvent,
    ApprovalResolvedEvent,
    BlockedEvent,
    CallEvent,
    EventBase,
    SubstituteEvent,
    ToolDeniedEvent,
    ToolUseEvent,
    UnmediatedEvent,
)
from events.sinks import CallStart, SinkRole

__all__ = ["OtelSink"]

log = logging.getLogger("callgate.events.otel")

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
_INTERNAL = SpanKind.INTERNAL
_ERROR = StatusCode.ERROR
# The most attributes a decision event carries; the fast path below needs the limit to allow them.
_STEP_ATTRIBUTES = 6
# The event types `emit` traces (outcomes reach their span through `TracedCall.end`).
_TRACED_TYPES = frozenset({"Unmediated", "ToolDenied", "ApprovalRequested", "ApprovalResolved"})
_TOOL_USE_ERRORS: dict[str, str] = {
    "error": sc.ERROR_TOOL,
    "timeout": sc.ERROR_TIMEOUT,
    "cancelled": sc.ERROR_INTERRUPTED,
}


class _CallSpan:
    """The `TracedCall` handle `OtelSink.start_call` returns: the span of one call and its ids."""

    __slots__ = ("_call_id", "_live", "_sink", "_start_ns", "span_id", "trace_id")

    def __init__(self, sink: OtelSink, span: Span, call_id: str, start_ns: int) -> None:
        self._sink = sink
        # A one-item list: `list.pop` is atomic, so exactly one `end` gets the span without a lock.
        self._live = [span]
        self._call_id = call_id
        self._start_ns = start_ns
        context = span.get_span_context()
        if context.is_valid:
            self.trace_id: str | None = format(context.trace_id, "032x")
            self.span_id: str | None = format(context.span_id, "016x")
        else:
            # A disabled SDK (OTEL_SDK_DISABLED) or a no-op provider: nothing to correlate with.
            self.trace_id = self.span_id = None

    @property
    def span(self) -> Span | None:
        """The span while the call is open; None once ended."""
        live = self._live
        return live[0] if live else None

    def activate(self) -> None:
        """Make the call's span current in the calling context. The gate calls it inside the tool
        body's own context copy, so spans the tool (or a library it uses) starts nest under
        `execute_tool`; the caller's context is untouched and nothing needs detaching."""
        live = self._live
        if live:
            otel_context.attach(trace_api.set_span_in_context(live[0]))

    def end(self, outcome: EventBase | None) -> None:
        """Set the outcome's attributes and decision events, and end the span. Idempotent; never
        raises; does no I/O itself (the provider's span processor decides when to export)."""
        try:
            span = self._live.pop()
        except IndexError:
            return
        self._sink._end(self, span, outcome)


class OtelSink:
    """A sink that traces each mediated call as one OpenTelemetry `execute_tool {tool}` span.

    - `tracer_provider`: used as is (its processors, exporters, sampler, resource). None: the sink
      builds its own SDK provider from the standard `OTEL_*` environment variables
      (`OTEL_SERVICE_NAME` / `OTEL_RESOURCE_ATTRIBUTES`, default service.name "callgate";
      `OTEL_TRACES_EXPORTER`: "otlp" (default, OTLP/HTTP protobuf configured by
      `OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT` / `_HEADERS` / ...), "console" or "none";
      `OTEL_BSP_*` for the batch processor; `OTEL_TRACES_SAMPLER`). The global tracer provider is
      never set or read.
    - `capture_args` / `capture_results`: put the redacted arguments / the output digest on the
      span. Off by default: spans often go to a wider audience than the audit store.

    Safe from any thread and task. `start_call`, `emit` and `TracedCall.end` never raise and never
    block on I/O (a failure is logged and counted in `failed`); `flush` and `close` do their
    blocking work in the default executor.

    An observability sink (`role`): however it fails, the gate's calls go on; what failed is
    counted in `failed` (and in `Gate.sink_stats()`), never a reason to refuse a call. What the
    provider's exporters fail to send is theirs to report (the SDK logs it).
    """

    role: ClassVar[SinkRole] = "observability"

    def __init__(
        self,
        tracer_provider: trace_api.TracerProvider | None = None,
        *,
        capture_args: bool = False,
        capture_results: bool = False,
        tracer_name: str = "callgate",
    ) -> None:
        self._owns_provider = tracer_provider is None
        self.tracer_provider: trace_api.TracerProvider = (
            tracer_provider if tracer_provider is not None else _provider_from_environment()
        )
        self._tracer = self.tracer_provider.get_tracer(tracer_name, _version())
        self.capture_args = capture_args
        self.capture_results = capture_results
        self.failed = 0
        """Failures inside `start_call`, `emit` or `end` (each logged; the call went on)."""
        # Calls whose span is open, for the approval events that arrive while the call waits.
        # Single dict operations are atomic, so no lock is taken on the call path.
        self._open: dict[str, _CallSpan] = {}
        self._fast_events: bool | None = None
        self._closed = False

    # -- CallTracer ------------------------------------------------------------------------------

    def start_call(self, call: CallStart) -> _CallSpan | None:
        """Start the call's span as a child of the current span (of the caller's context) and
        return its handle; None after `close` or on failure. Never raises; does not change the
        current context (the span is not made current)."""
        if self._closed:
            return None
        try:
            attributes = _call_attributes(
                call.tool, call.call_id, call.gate, call.run_id, call.agent, call.workflow, call.tenant, call.principal
            )
            start_ns = time_ns()
            span = self._tracer.start_span(
                sc.SPAN_NAME_PREFIX + call.tool, kind=_INTERNAL, attributes=attributes, start_time=start_ns
            )
            handle = _CallSpan(self, span, call.call_id, start_ns)
            if span.is_recording():
                self._open[call.call_id] = handle
            return handle
        except Exception:
            self._failure("start a call's span")
            return None

    def _end(self, handle: _CallSpan, span: Span, outcome: EventBase | None) -> None:
        open_calls = self._open
        call_id = handle._call_id
        if open_calls.get(call_id) is handle:
            open_calls.pop(call_id, None)
        end_ns = time_ns()
        try:
            if span.is_recording():
                self._conclude(span, handle._start_ns, end_ns, outcome)
        except Exception:
            self._failure("set a call's outcome on its span")
        try:
            span.end(end_time=end_ns)
        except Exception:
            self._failure("end a call's span")

    def _conclude(self, span: Span, start_ns: int, end_ns: int, outcome: EventBase | None) -> None:
        attributes: dict[str, AttributeValue] = {}
        error_type: str | None = None
        description: str | None = None
        digest: str | None = None
        tool_ns = 0
        if outcome is None:
            error_type = sc.ERROR_EVENT_MISSING
            description = "callgate could not build the call's outcome event"
        elif isinstance(outcome, ToolUseEvent):
            attributes[sc.DECISION] = sc.DECISION_ALLOWED
            attributes[sc.OUTCOME] = outcome.outcome
            if outcome.outcome != "ok":
                error_type = _TOOL_USE_ERRORS.get(outcome.outcome, sc.ERROR_TOOL)
                description = outcome.error
            digest = outcome.output_digest
            tool_ns = int(outcome.duration_ms * 1_000_000)
        elif isinstance(outcome, ToolDeniedEvent):
            attributes[sc.DECISION] = sc.DECISION_DENIED
            attributes[sc.DECIDED_BY] = outcome.decided_by
            attributes[sc.CAUSE] = outcome.cause
            attributes[sc.MESSAGE] = outcome.message
            error_type = sc.ERROR_INTERRUPTED if outcome.cause == "interrupted" else sc.ERROR_DENIED
            description = outcome.message
        elif isinstance(outcome, SubstituteEvent):
            attributes[sc.DECISION] = sc.DECISION_SUBSTITUTED
            attributes[sc.DECIDED_BY] = outcome.decided_by
            digest = outcome.result_digest
            if outcome.error is not None:
                error_type = sc.ERROR_OUTPUT_WITHHELD
                description = outcome.error
        elif isinstance(outcome, BlockedEvent):
            attributes[sc.DECISION] = sc.DECISION_BLOCKED
            attributes[sc.DECIDED_BY] = outcome.decided_by
            attributes[sc.CAUSE] = outcome.cause
            attributes[sc.REASON] = outcome.reason
            error_type = sc.ERROR_BLOCKED
            description = outcome.reason
        else:
            error_type = sc.ERROR_UNEXPECTED_EVENT
            description = f"the call ended with a {type(outcome).__name__} event"

        if outcome is not None:
            attributes[sc.EVENT_ID] = outcome.event_id
            after_failed = bool(outcome.decisions) and self._steps(span, outcome, start_ns, end_ns, tool_ns)
            if after_failed and error_type == sc.ERROR_TOOL:
                error_type = sc.ERROR_OUTPUT_WITHHELD
            if self.capture_args and isinstance(outcome, CallEvent) and outcome.args is not None:
                attributes[sc.GEN_AI_TOOL_CALL_ARGUMENTS] = json.dumps(
                    outcome.args, ensure_ascii=False, separators=(",", ":"), default=str
                )
            if self.capture_results and digest is not None:
                attributes[sc.GEN_AI_TOOL_CALL_RESULT] = "sha256:" + digest
        if error_type is not None:
            attributes[sc.ERROR_TYPE] = error_type
            span.set_status(Status(_ERROR, description))
        span.set_attributes(attributes)

    def _steps(self, span: Span, outcome: EventBase, start_ns: int, end_ns: int, tool_ns: int) -> bool:
        """One span event per decision step; True when an after-interceptor failed."""
        after_failed = False
        at = start_ns
        events: list[SdkEvent] = []
        for step in outcome.decisions:
            if step.phase == "after" and tool_ns:
                at += tool_ns
                tool_ns = 0
            at += int(step.duration_ms * 1_000_000)
            attributes: dict[str, AttributeValue] = {
                sc.STEP_INTERCEPTOR: step.interceptor,
                sc.STEP_SCOPE: step.scope,
                sc.STEP_KIND: step.kind,
                sc.STEP_PHASE: step.phase,
                sc.STEP_DURATION_MS: step.duration_ms,
            }
            if step.error is not None:
                attributes[sc.STEP_ERROR] = step.error
                after_failed = after_failed or step.phase == "after"
            events.append(SdkEvent(sc.DECISION_EVENT, attributes, at if at < end_ns else end_ns))
        fast = self._fast_events
        if fast is None:
            fast = self._fast_events = _sdk_events_fit(span)
        if fast:
            # `Span.add_event` cleans each attribute and takes two locks per event, which costs more
            # than the rest of the call's span. These values are str and float made by the gate,
            # valid as they are; `_sdk_events_fit` checked that the span's limits keep them whole,
            # and the list's own lock keeps it safe beside a concurrent approval event.
            span._events.extend(events)  # type: ignore[attr-defined]
        else:
            for event in events:
                span.add_event(event.name, event.attributes, event.timestamp)
        return after_failed

    # -- Sink ------------------------------------------------------------------------------------

    def emit(self, event: SealedEvent | EventBase) -> None:
        """Trace the events that are not a call's outcome (those reach the span through
        `TracedCall.end`): `Unmediated` becomes a zero-duration `callgate.unmediated` span, status
        ERROR, child of the active call's span if there is one, else of the current span;
        `ApprovalRequested` / `ApprovalResolved` become span events of their call's span while it
        is open (later ones are dropped). Other types are ignored. Never raises, never blocks."""
        if self._closed or getattr(event, "type", None) not in _TRACED_TYPES:
            return
        try:
            event = typed(event)
            if isinstance(event, UnmediatedEvent):
                self._unmediated(event)
            elif isinstance(event, ToolDeniedEvent) and event.cause == "unknown_tool":
                self._unknown_tool(event)
            elif isinstance(event, ApprovalRequestedEvent):
                span = self._open_span(event.call_id)
                if span is not None:
                    span.add_event(
                        sc.APPROVAL_REQUESTED_EVENT,
                        {sc.APPROVAL_REASON: event.reason, sc.APPROVAL_REQUESTED_BY: event.requested_by},
                    )
            elif isinstance(event, ApprovalResolvedEvent):
                span = self._open_span(event.call_id)
                if span is not None:
                    attributes: dict[str, AttributeValue] = {
                        sc.APPROVAL_APPROVED: event.approved,
                        sc.APPROVAL_WAITED_MS: event.waited_ms,
                    }
                    if event.by is not None:
                        attributes[sc.APPROVAL_BY] = event.by
                    if event.error is not None:
                        attributes[sc.APPROVAL_ERROR] = event.error
                    span.add_event(sc.APPROVAL_RESOLVED_EVENT, attributes)
        except Exception:
            self._failure(f"trace a {type(event).__name__} event")

    def _unknown_tool(self, event: ToolDeniedEvent) -> None:
        # The gate refuses a call of an unknown tool before a call starts, so no `start_call` traced
        # it; a zero-duration call span keeps a model that invents tools visible in the trace.
        at = _ns(event.time)
        attributes = _call_attributes(
            event.tool or "",
            event.call_id or "",
            event.gate,
            event.run_id,
            event.agent,
            event.workflow,
            event.tenant,
            event.principal,
        )
        span = self._tracer.start_span(
            sc.SPAN_NAME_PREFIX + (event.tool or ""), kind=_INTERNAL, attributes=attributes, start_time=at
        )
        if span.is_recording():
            self._conclude(span, at, at, event)
        span.end(end_time=at)

    def _open_span(self, call_id: str | None) -> Span | None:
        handle = self._open.get(call_id) if call_id is not None else None
        return handle.span if handle is not None else None

    def _unmediated(self, event: UnmediatedEvent) -> None:
        parent = self._open_span(event.call_id)
        context = trace_api.set_span_in_context(parent) if parent is not None else None
        attributes: dict[str, AttributeValue] = {
            sc.RESOURCE: event.resource,
            sc.ATTRIBUTE: event.attribute,
            sc.BOUND_TOOLS: event.bound_tools,
            sc.SITE: event.site,
            sc.GATE: event.gate,
            sc.EVENT_ID: event.event_id,
            sc.ERROR_TYPE: sc.ERROR_UNMEDIATED,
        }
        optional: tuple[tuple[str, str | None], ...] = (
            (sc.ACTIVE_TOOL, event.active_tool),
            (sc.CALL_ID, event.call_id),
            (sc.THREAD_NAME, event.thread),
            (sc.WORKFLOW, event.workflow),
            (sc.GEN_AI_AGENT_NAME, event.agent),
            (sc.TENANT, event.tenant),
            (sc.PRINCIPAL, event.principal),
            (sc.RUN_ID, event.run_id),
        )
        for key, value in optional:
            if value is not None:
                attributes[key] = value
        at = _ns(event.time)
        span = self._tracer.start_span(
            sc.UNMEDIATED_SPAN, context=context, kind=_INTERNAL, attributes=attributes, start_time=at
        )
        tools = ", ".join(event.bound_tools) or "no tool"
        span.set_status(Status(_ERROR, f"{event.resource}.{event.attribute} used outside a mediated call of {tools}"))
        span.end(end_time=at)

    async def flush(self) -> None:
        """Return once the provider's span processors have exported every ended span (its
        `force_flush`, run in the default executor). Spans of calls still open are not included."""
        if not self._closed:
            await self._force_flush()

    async def close(self) -> None:
        """Flush, then shut the provider down if the sink built it (a provider passed in is only
        flushed: its owner shuts it down). Idempotent; afterwards calls are no longer traced."""
        if self._closed:
            return
        # Set first, before any await, so a concurrent close returns at once.
        self._closed = True
        shutdown = getattr(self.tracer_provider, "shutdown", None)
        if self._owns_provider and shutdown is not None:
            # The SDK's shutdown exports what its batch processors still hold.
            await asyncio.get_running_loop().run_in_executor(None, shutdown)
        else:
            await self._force_flush()

    async def _force_flush(self) -> None:
        force_flush = getattr(self.tracer_provider, "force_flush", None)
        if force_flush is not None and not await asyncio.get_running_loop().run_in_executor(None, force_flush):
            log.warning("OtelSink: the tracer provider did not flush in time")

    def _failure(self, what: str) -> None:
        self.failed += 1
        # Log the first failure and then every thousandth, so a broken exporter cannot flood the log.
        if self.failed == 1 or self.failed % 1000 == 0:
            log.exception("OtelSink failed to %s; %d failures so far", what, self.failed)


def _call_attributes(
    tool: str,
    call_id: str,
    gate: str,
    run_id: str | None,
    agent: str | None,
    workflow: str | None,
    tenant: str | None,
    principal: str | None,
) -> dict[str, AttributeValue]:
    """A call span's start attributes, None values left out."""
    attributes: dict[str, AttributeValue] = {
        sc.GEN_AI_OPERATION_NAME: sc.EXECUTE_TOOL,
        sc.GEN_AI_TOOL_NAME: tool,
        sc.GEN_AI_TOOL_CALL_ID: call_id,
        sc.GEN_AI_TOOL_TYPE: sc.TOOL_TYPE_FUNCTION,
        sc.GATE: gate,
    }
    if run_id is not None:
        attributes[sc.RUN_ID] = run_id
    if agent is not None:
        attributes[sc.GEN_AI_AGENT_NAME] = agent
    if workflow is not None:
        attributes[sc.WORKFLOW] = workflow
    if tenant is not None:
        attributes[sc.TENANT] = tenant
    if principal is not None:
        attributes[sc.PRINCIPAL] = principal
    return attributes


def _ns(moment: datetime) -> int:
    """Nanoseconds since the epoch, exactly (a float timestamp would lose the microseconds)."""
    return (moment - _EPOCH) // _MICROSECOND * 1000


def _sdk_events_fit(span: Span) -> bool:
    """Whether decision events may be appended to the span's event list as they are: an SDK span
    whose limits neither cut attribute values nor allow fewer attributes than a step carries."""
    limits = getattr(span, "_limits", None)
    if limits is None or not callable(getattr(getattr(span, "_events", None), "extend", None)):
        return False
    max_attributes = getattr(limits, "max_event_attributes", None)
    return getattr(limits, "max_attribute_length", None) is None and (
        max_attributes is None or max_attributes >= _STEP_ATTRIBUTES
    )


def _version() -> str | None:
    try:
        return metadata.version("callgate")
    except metadata.PackageNotFoundError:
        return None


def _provider_from_environment() -> SdkTracerProvider:
    """An SDK provider configured by the standard OTEL_* variables (see `OtelSink`)."""
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: "callgate"}))
    provider = SdkTracerProvider(resource=resource)
    names = os.environ.get("OTEL_TRACES_EXPORTER", "otlp")
    for name in (n.strip().lower() for n in names.split(",")):
        exporter: SpanExporter
        if name in ("", "none"):
            continue
        if name == "otlp":
            protocol = os.environ.get(
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
            )
            if protocol.strip().lower() != "http/protobuf":
                log.warning("OtelSink exports OTLP over http/protobuf only; ignoring protocol %r", protocol)
            # Imported here: it loads requests, which a provider passed in never needs.
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter()
        elif name == "console":
            exporter = ConsoleSpanExporter()
        else:
            log.warning("OtelSink: unsupported OTEL_TRACES_EXPORTER value %r ignored", name)
            continue
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider
