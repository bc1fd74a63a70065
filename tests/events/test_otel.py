"""OtelSink: one `execute_tool` span per mediated call, through real gates and real SDK pipelines."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry.context import Context
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import SpanKind, StatusCode

from events import REDACTED
from events import semconv as sc
from events.otel import OtelSink
from events.sinks import CallStart, CallTracer, MemorySink, Sink
from interceptor_core import (
    AgentScope,
    Allow,
    Approval,
    ApprovalRequest,
    Block,
    Deny,
    Gate,
    RequireApproval,
    RunContext,
    Substitute,
    ToolBlockedError,
    ToolCall,
    UnmediatedAccessError,
    after_tool_call,
    before_tool_call,
    tool,
)

CARD = "4111 1111 1111 1111"
RUN = RunContext(tenant="acme", principal="u-1")


@tool(description="Loads an order record by ID")
async def get_order(order_id: str, note: str = "") -> dict[str, str]:
    return {"order_id": order_id, "status": "shipped"}


@tool(description="Always fails")
async def broken(order_id: str) -> str:
    raise RuntimeError(f"database down for {order_id}")


@before_tool_call(name="audit-log")
def audit_log(call: ToolCall) -> Allow:
    return Allow()


@before_tool_call(name="tenant-orders")
def tenant_orders(call: ToolCall) -> Allow | Deny:
    order_id = str(call.args["order_id"])
    if call.run.tenant is None or not order_id.startswith(call.run.tenant.upper() + "-"):
        return Deny(f"Order {order_id} does not belong to tenant {call.run.tenant}.")
    return Allow()


@before_tool_call(name="kill-switch")
def kill_switch(call: ToolCall) -> Block | None:
    return Block("refunds are frozen") if call.args["order_id"] == "ACME-666" else None


@before_tool_call(name="big-refund")
def big_refund(call: ToolCall) -> RequireApproval | None:
    return RequireApproval("large order") if call.args["order_id"] == "ACME-9000" else None


@after_tool_call(name="strip-notes")
def strip_notes(call: ToolCall, output: Any) -> Any:
    return output


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider
    provider.shutdown()


@pytest.fixture
def memory() -> MemorySink:
    return MemorySink()


def desk(sinks: list[object], interceptors: list[object] | None = None, **options: Any) -> AgentScope:
    gate = Gate("shop", interceptors=interceptors or [audit_log, tenant_orders, kill_switch], sinks=sinks, **options)
    return gate.agent("desk", tools=[get_order, broken])


def attributes(span: ReadableSpan) -> Mapping[str, Any]:
    assert span.attributes is not None
    return span.attributes


def call_spans(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name.startswith(sc.SPAN_NAME_PREFIX)]


def only_call_span(exporter: InMemorySpanExporter) -> ReadableSpan:
    (span,) = call_spans(exporter)
    return span


def everything_on(span: ReadableSpan) -> str:
    """Every attribute value of the span and its events, as one string."""
    values = [str(v) for v in attributes(span).values()]
    values += [str(v) for event in span.events for v in (event.attributes or {}).values()]
    return " ".join(values)


class FailingProcessor(SpanProcessor):
    """A span processor that raises when a span starts: the SDK lets that out of `start_span`."""

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        raise RuntimeError("processor broken")


class TestCallSpan:
    async def test_one_span_per_call_with_gen_ai_attributes(
        self, provider: TracerProvider, exporter: InMemorySpanExporter
    ) -> None:
        """A call leaves one INTERNAL `execute_tool {tool}` span with the GenAI and callgate start attributes."""
        agent = desk([OtelSink(provider)])
        run = RunContext(tenant="acme", principal="u-1")
        result = await agent.call("get_order", {"order_id": "ACME-42"}, run=run)
        span = only_call_span(exporter)
        assert span.name == "execute_tool get_order"
        assert span.kind is SpanKind.INTERNAL
        attrs = attributes(span)
        assert attrs[sc.GEN_AI_OPERATION_NAME] == "execute_tool"
        assert attrs[sc.GEN_AI_TOOL_NAME] == "get_order"
        assert attrs[sc.GEN_AI_TOOL_CALL_ID] == result.call_id
        assert attrs[sc.GEN_AI_TOOL_TYPE] == "function"
        assert attrs[sc.GEN_AI_AGENT_NAME] == "desk"
        assert (attrs[sc.GATE], attrs[sc.TENANT], attrs[sc.PRINCIPAL]) == ("shop", "acme", "u-1")
        assert attrs[sc.RUN_ID] == run.run_id
        assert sc.WORKFLOW not in attrs
        assert (attrs[sc.DECISION], attrs[sc.OUTCOME]) == ("allowed", "ok")
        assert span.status.status_code is StatusCode.UNSET
        assert sc.ERROR_TYPE not in attrs

    async def test_workflow_is_recorded_when_present(
        self, provider: TracerProvider, exporter: InMemorySpanExporter
    ) -> None:
        """A call through a workflow scope names the workflow on its span."""
        gate = Gate("shop", sinks=[OtelSink(provider)])
        agent = gate.workflow("support").agent("desk", tools=[get_order])
        await agent.call("get_order", {"order_id": "ACME-1"}, run=RUN)
        assert attributes(only_call_span(exporter))[sc.WORKFLOW] == "support"

    async def test_span_is_a_child_of_the_applications_current_span(
        self, provider: TracerProvider, exporter: InMemorySpanExporter
    ) -> None:
        """The call's span has the application's current span as parent, in the same trace."""
        agent = desk([OtelSink(provider)])
        tracer = provider.get_tracer("app")
        with tracer.start_as_current_span("invoke_agent desk") as agent_span:
            await agent.call("get_order", {"order_id": "ACME-42"}, run=RUN)
        span = only_call_span(exporter)
        parent = agent_span.get_span_context()
        assert span.parent is not None
        assert span.parent.span_id == parent.span_id
        assert span.context is not None
        assert span.context.trace_id == parent.trace_id

    async def test_spans_the_tool_starts_nest_under_the_call(
        self, provider: TracerProvider, exporter: InMemorySpanExporter
    ) -> None:
        """A span started inside the tool body (sync or async) is a child of `execute_tool`."""
        tracer = provider.get_tracer("tool-library")

        @tool
        async def fetch(url: str) -> str:
            with tracer.start_as_current_span("GET"):
                await asyncio.sleep(0)
            return "ok"

        @tool
        def query(sql: str) -> str:
            with tracer.start_as_current_span("SELECT"):
                return "rows"

        agent = Gate("shop", sinks=[OtelSink(provider)]).agent("desk", tools=[fetch, query])
        await agent.call("fetch", {"url": "https://example.test"}, run=RUN)
        await agent.call("query", {"sql": "select 1"}, run=RUN)
        spans = {s.name: s for s in exporter.get_finished_spans()}
        for inner, outer in (("GET", "execute_tool fetch"), ("SELECT", "execute_tool query")):
            assert spans[inner].parent is not None
            assert spans[outer].context is not None
            assert spans[inner].parent.span_id == spans[outer].context.span_id

    async def test_two_tracing_sinks_each_get_their_span(self, memory: MemorySink) -> None:
        """With two OtelSinks every call's span is ended and exported by both; events name the first."""
        first, second = InMemorySpanExporter(), InMemorySpanExporter()
        providers = []
        for exporter in (first, second):
            provider = TracerProvider(shutdown_on_exit=False)
            provider.add_span_processor(SimpleSpanProcessor(exporter))
            providers.append(provider)
        agent = desk([OtelSink(providers[0]), OtelSink(providers[1]), memory])
        await agent.call("get_order", {"order_id": "ACME-42"}, run=RUN)
        (one,), (two,) = call_spans(first), call_spans(second)
        assert one.context is not None
        assert memory.events[-1].span_id == format(one.context.span_id, "016x")
        assert two.name == one.name
        for provider in providers:
            provider.shutdown()

    async def test_every_event_of_the_call_carries_the_span_ids(
        self, provider: TracerProvider, exporter: InMemorySpanExporter, memory: MemorySink
    ) -> None:
        """trace_id and span_id in each event of the call are the span's ids, as W3C lowercase hex."""

        async def approve(request: ApprovalRequest) -> Approval:
            return Approval(approved=True, by="reviewer")

        agent = desk([OtelSink(provider), memory], [tenant_orders, big_refund], approval_handler=approve)
        result = await agent.call("get_order", {"order_id": "ACME-9000"}, run=RUN)
        span = only_call_span(exporter)
        assert span.context is not None
        mine = [e for e in memory.events if e.call_id == result.call_id]
        assert [e.type for e in mine] == ["ApprovalRequested", "ApprovalResolved", "ToolUse"]  # type: ignore[attr-defined]
        for event in mine:
            assert event.trace_id == format(span.context.trace_id, "032x")
            assert event.span_id == format(span.context.span_id, "016x")
        assert attributes(span)[sc.EVENT_ID] == mine[-1].event_id

    async def test_one_span_event_per_decision(self, provider: TracerProvider, exporter: InMemorySpanExporter) -> None:
        """Each step of the decision trail becomes one `callgate.decision` span event, in order."""
        agent = desk([OtelSink(provider)], [audit_log, tenant_orders, kill_switch, strip_notes])
        await agent.call("get_order", {"order_id": "ACME-42"}, run=RUN)
        span = only_call_span(exporter)
        assert [e.name for e in span.events] == [sc.DECISION_EVENT] * 4
        steps = [dict(e.attributes or {}) for e in span.events]
        assert [s[sc.STEP_INTERCEPTOR] for s in steps] == ["audit-log", "tenant-orders", "kill-switch", "strip-notes"]
        assert [s[sc.STEP_PHASE] for s in steps] == ["before", "before", "before", "after"]
        assert {s[sc.STEP_KIND] for s in steps} == {"allow"}
        assert {s[sc.STEP_SCOPE] for s in steps} == {"application"}
        assert all(isinstance(s[sc.STEP_DURATION_MS], float) for s in steps)
        assert all(sc.STEP_ERROR not in s for s in steps)
        assert span.start_time is not None
        assert span.end_time is not None
        stamps = [e.timestamp for e in span.events]
        assert stamps == sorted(stamps)
        assert span.start_time <= stamps[0] <= stamps[-1] <= span.end_time

    async def test_denial_sets_error_type_status_and_message(
        self, provider: TracerProvider, exporter: InMemorySpanExporter
    ) -> None:
        """A Deny ends the span with status ERROR, error.type "denied", the decider and the model's message."""
        agent = desk([OtelSink(provider)])
        result = await agent.call("get_order", {"order_id": "GLOBEX-1"}, run=RUN)
        assert result.kind == "denied"
        span = only_call_span(exporter)
        attrs = attributes(span)
        assert attrs[sc.ERROR_TYPE] == sc.ERROR_DENIED
        assert (attrs[sc.DECISION], attrs[sc.DECIDED_BY], attrs[sc.CAUSE]) == ("denied", "tenant-orders", "deny")
        assert attrs[sc.MESSAGE] == result.message
        assert span.status.status_code is StatusCode.ERROR
        assert span.status.description == result.message
        assert [dict(e.attributes or {})[sc.STEP_KIND] for e in span.events] == ["allow", "deny"]

    async def test_tool_error_sets_error_type_and_status(
        self, provider: TracerProvider, exporter: InMemorySpanExporter
    ) -> None:
        """A tool that raises ends the span with status ERROR, error.type "tool_error" and outcome "error"."""
        agent = desk([OtelSink(provider)])
        result = await agent.call("broken", {"order_id": "ACME-1"}, run=RUN)
        assert result.kind == "error"
        attrs = attributes(only_call_span(exporter))
        assert (attrs[sc.ERROR_TYPE], attrs[sc.DECISION], attrs[sc.OUTCOME]) == ("tool_error", "allowed", "error")
        assert sc.MESSAGE not in attrs
        assert only_call_span(exporter).status.status_code is StatusCode.ERROR

    async def test_timeout_sets_error_type_timeout(
        self, provider: TracerProvider, exporter: InMemorySpanExporter
    ) -> None:
        """A tool that runs past its timeout ends the span with error.type "timeout"."""

        @tool(timeout_s=0.01)
        async def stuck(order_id: str) -> str:
            await asyncio.Event().wait()
            return order_id

        gate = Gate("shop", sinks=[OtelSink(provider)])
        await gate.agent("desk", tools=[stuck]).call("stuck", {"order_id": "ACME-1"}, run=RUN)
        attrs = attributes(only_call_span(exporter))
        assert (attrs[sc.ERROR_TYPE], attrs[sc.OUTCOME]) == ("timeout", "timeout")

    async def test_failing_after_interceptor_is_output_withheld(
        self, provider: TracerProvider, exporter: InMemorySpanExporter
    ) -> None:
        """An after-interceptor that fails sets error.type "output_withheld" and its step carries the error."""

        @after_tool_call(name="leaky")
        def leaky(call: ToolCall, output: Any) -> Any:
            raise ValueError("cannot scrub")

        await desk([OtelSink(provider)], [leaky]).call("get_order", {"order_id": "ACME-1"}, run=RUN)
        span = only_call_span(exporter)
        assert attributes(span)[sc.ERROR_TYPE] == sc.ERROR_OUTPUT_WITHHELD
        (step,) = [dict(e.attributes or {}) for e in span.events]
        assert step[sc.STEP_KIND] == "error"
        assert "cannot scrub" in str(step[sc.STEP_ERROR])

    async def test_substitute_is_recorded(self, provider: TracerProvider, exporter: InMemorySpanExporter) -> None:
        """A Substitute ends the span without error, decision "substituted", decided by the interceptor."""

        @before_tool_call(name="cache")
        def cache(call: ToolCall) -> Substitute:
            return Substitute({"order_id": "ACME-1", "status": "cached"})

        await desk([OtelSink(provider)], [cache]).call("get_order", {"order_id": "ACME-1"}, run=RUN)
        span = only_call_span(exporter)
        assert (attributes(span)[sc.DECISION], attributes(span)[sc.DECIDED_BY]) == ("substituted", "cache")
        assert span.status.status_code is StatusCode.UNSET

    async def test_block_ends_the_span_with_error(
        self, provider: TracerProvider, exporter: InMemorySpanExporter, memory: MemorySink
    ) -> None:
        """A Block raises ToolBlockedError from the call and its span ends with error.type "blocked"."""
        sink = OtelSink(provider)
        agent = desk([sink, memory])
        with pytest.raises(ToolBlockedError):
            await agent.call("get_order", {"order_id": "ACME-666"}, run=RUN)
        span = only_call_span(exporter)
        attrs = attributes(span)
        assert (attrs[sc.ERROR_TYPE], attrs[sc.DECISION], attrs[sc.DECIDED_BY]) == ("blocked", "blocked", "kill-switch")
        assert attrs[sc.REASON] == "refunds are frozen"
        assert sc.MESSAGE not in attrs
        assert span.status.status_code is StatusCode.ERROR
        assert sink._open == {}

    async def test_approval_requests_and_answers_are_span_events(
        self, provider: TracerProvider, exporter: InMemorySpanExporter
    ) -> None:
        """ApprovalRequested and ApprovalResolved become span events of the call's span, between its decisions."""

        async def approve(request: ApprovalRequest) -> Approval:
            return Approval(approved=True, by="reviewer")

        agent = desk([OtelSink(provider)], [tenant_orders, big_refund], approval_handler=approve)
        await agent.call("get_order", {"order_id": "ACME-9000"}, run=RUN)
        span = only_call_span(exporter)
        names = [e.name for e in span.events]
        assert names.count(sc.APPROVAL_REQUESTED_EVENT) == 1
        assert names.count(sc.APPROVAL_RESOLVED_EVENT) == 1
        requested = next(e for e in span.events if e.name == sc.APPROVAL_REQUESTED_EVENT)
        resolved = next(e for e in span.events if e.name == sc.APPROVAL_RESOLVED_EVENT)
        assert dict(requested.attributes or {})[sc.APPROVAL_REQUESTED_BY] == ("big-refund",)
        assert dict(resolved.attributes or {})[sc.APPROVAL_APPROVED] is True
        assert dict(resolved.attributes or {})[sc.APPROVAL_BY] == "reviewer"

    async def test_arguments_are_not_on_the_span_by_default(
        self, provider: TracerProvider, exporter: InMemorySpanExporter
    ) -> None:
        """Without capture_args no argument value reaches the span, nor the output digest without capture_results."""
        await desk([OtelSink(provider)]).call("get_order", {"order_id": "ACME-42", "note": "hello"}, run=RUN)
        span = only_call_span(exporter)
        assert sc.GEN_AI_TOOL_CALL_ARGUMENTS not in attributes(span)
        assert sc.GEN_AI_TOOL_CALL_RESULT not in attributes(span)
        assert "hello" not in everything_on(span)

    async def test_captured_arguments_are_the_redacted_ones(
        self, provider: TracerProvider, exporter: InMemorySpanExporter, memory: MemorySink
    ) -> None:
        """With capture_args the span holds the JSON of the event's redacted args: a card number never appears."""
        agent = desk([OtelSink(provider, capture_args=True), memory])
        await agent.call("get_order", {"order_id": "ACME-42", "note": f"card {CARD}"}, run=RUN)
        span = only_call_span(exporter)
        captured = json.loads(str(attributes(span)[sc.GEN_AI_TOOL_CALL_ARGUMENTS]))
        assert captured["order_id"] == "ACME-42"
        assert REDACTED in captured["note"]
        assert captured == memory.of_type("ToolUse")[0].args  # type: ignore[attr-defined]
        assert CARD not in everything_on(span)
        assert CARD.replace(" ", "") not in everything_on(span)

    async def test_captured_result_is_the_output_digest(
        self, provider: TracerProvider, exporter: InMemorySpanExporter, memory: MemorySink
    ) -> None:
        """With capture_results the span holds `sha256:` and the event's output digest, never the output."""
        await desk([OtelSink(provider, capture_results=True), memory]).call(
            "get_order", {"order_id": "ACME-42"}, run=RUN
        )
        digest = memory.of_type("ToolUse")[0].output_digest  # type: ignore[attr-defined]
        span = only_call_span(exporter)
        assert attributes(span)[sc.GEN_AI_TOOL_CALL_RESULT] == f"sha256:{digest}"
        assert "shipped" not in everything_on(span)

    async def test_calls_work_when_sampled_out(self, exporter: InMemorySpanExporter, memory: MemorySink) -> None:
        """With a sampler that drops everything the call works, nothing is exported and the events still get ids."""
        provider = TracerProvider(sampler=ALWAYS_OFF, shutdown_on_exit=False)
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        sink = OtelSink(provider)
        result = await desk([sink, memory]).call("get_order", {"order_id": "ACME-42"}, run=RUN)
        assert result.ok
        assert exporter.get_finished_spans() == ()
        (event,) = memory.of_type("ToolUse")
        assert event.trace_id is not None
        assert event.span_id is not None
        assert sink.failed == 0
        provider.shutdown()


class TestTracedCall:
    def call(self, tool_name: str = "get_order") -> CallStart:
        return CallStart("shop", None, "desk", tool_name, "c-1", "r-1", "acme", None)

    def test_the_sink_is_a_sink_and_a_call_tracer(self, provider: TracerProvider) -> None:
        """OtelSink satisfies both the Sink and the CallTracer protocols the gate looks for."""
        sink = OtelSink(provider)
        assert isinstance(sink, Sink)
        assert isinstance(sink, CallTracer)

    def test_ids_are_w3c_lowercase_hex(self, provider: TracerProvider) -> None:
        """The handle's trace_id has 32 and span_id 16 lowercase hex digits."""
        handle = OtelSink(provider).start_call(self.call())
        assert handle is not None
        assert handle.trace_id is not None
        assert handle.span_id is not None
        assert len(handle.trace_id) == 32
        assert len(handle.span_id) == 16
        assert handle.trace_id == handle.trace_id.lower()
        int(handle.trace_id + handle.span_id, 16)
        handle.end(None)

    def test_end_is_idempotent(self, provider: TracerProvider, exporter: InMemorySpanExporter) -> None:
        """Ending a handle twice exports one span and counts no failure."""
        sink = OtelSink(provider)
        handle = sink.start_call(self.call())
        assert handle is not None
        handle.end(None)
        handle.end(None)
        assert len(exporter.get_finished_spans()) == 1
        assert sink.failed == 0

    def test_end_without_an_event_marks_the_event_missing(
        self, provider: TracerProvider, exporter: InMemorySpanExporter
    ) -> None:
        """end(None) ends the span with status ERROR and error.type "callgate.event_missing"."""
        sink = OtelSink(provider)
        handle = sink.start_call(self.call())
        assert handle is not None
        handle.end(None)
        span = only_call_span(exporter)
        assert attributes(span)[sc.ERROR_TYPE] == sc.ERROR_EVENT_MISSING
        assert span.status.status_code is StatusCode.ERROR
        assert sink._open == {}

    def test_a_failing_pipeline_is_counted_not_raised(self, memory: MemorySink) -> None:
        """A span processor that raises makes start_call return None and count a failure; nothing raises."""
        provider = TracerProvider(shutdown_on_exit=False)
        provider.add_span_processor(FailingProcessor())
        sink = OtelSink(provider)
        assert sink.start_call(self.call()) is None
        assert sink.failed == 1
        provider.shutdown()

    async def test_a_failing_pipeline_does_not_break_the_call(self, memory: MemorySink) -> None:
        """A call through a sink whose pipeline raises still succeeds; its events carry no trace ids."""
        provider = TracerProvider(shutdown_on_exit=False)
        provider.add_span_processor(FailingProcessor())
        sink = OtelSink(provider)
        result = await desk([sink, memory]).call("get_order", {"order_id": "ACME-42"}, run=RUN)
        assert result.ok
        (event,) = memory.of_type("ToolUse")
        assert (event.trace_id, event.span_id) == (None, None)
        assert sink.failed == 1
        provider.shutdown()


class TestEmit:
    def test_unmediated_use_becomes_an_error_span(
        self, provider: TracerProvider, exporter: InMemorySpanExporter
    ) -> None:
        """A guarded client used outside a call leaves a zero-duration error span under the current span."""
        gate = Gate("shop", sinks=[OtelSink(provider)])
        gate.agent("desk", tools=[get_order])
        payments = gate.guard({"region": "eu"}, name="payments", tools=["refund"])
        with provider.get_tracer("app").start_as_current_span("job") as job, pytest.raises(UnmediatedAccessError):
            payments.keys()
        (span,) = [s for s in exporter.get_finished_spans() if s.name == sc.UNMEDIATED_SPAN]
        attrs = attributes(span)
        assert (attrs[sc.RESOURCE], attrs[sc.ATTRIBUTE], attrs[sc.BOUND_TOOLS]) == ("payments", "keys", ("refund",))
        assert str(attrs[sc.SITE]).startswith(__file__)
        assert attrs[sc.ERROR_TYPE] == sc.ERROR_UNMEDIATED
        assert span.status.status_code is StatusCode.ERROR
        assert span.start_time == span.end_time
        assert span.parent is not None
        assert span.parent.span_id == job.get_span_context().span_id

    async def test_unmediated_use_inside_another_call_nests_under_that_call(
        self, provider: TracerProvider, exporter: InMemorySpanExporter
    ) -> None:
        """A guarded client used inside a call of a tool it is not bound to leaves its span under that call's span."""
        gate = Gate("shop", sinks=[OtelSink(provider)])
        payments = gate.guard({"region": "eu"}, name="payments", tools=["refund"])

        @tool
        async def lookup(order_id: str) -> str:
            return str(payments.keys())

        result = await gate.agent("desk", tools=[lookup]).call("lookup", {"order_id": "ACME-1"}, run=RUN)
        assert result.kind == "error"
        call_span = only_call_span(exporter)
        (span,) = [s for s in exporter.get_finished_spans() if s.name == sc.UNMEDIATED_SPAN]
        assert span.parent is not None
        assert call_span.context is not None
        assert span.parent.span_id == call_span.context.span_id
        assert attributes(span)[sc.ACTIVE_TOOL] == "lookup"

    async def test_unknown_tool_leaves_a_denied_call_span(
        self, provider: TracerProvider, exporter: InMemorySpanExporter, memory: MemorySink
    ) -> None:
        """A call of an unknown tool (refused before any call starts) leaves a zero-duration denied call span."""
        result = await desk([OtelSink(provider), memory]).call("delete_everything", {"all": True}, run=RUN)
        span = only_call_span(exporter)
        attrs = attributes(span)
        assert span.name == "execute_tool delete_everything"
        assert attrs[sc.GEN_AI_TOOL_CALL_ID] == result.call_id
        assert (attrs[sc.DECISION], attrs[sc.CAUSE], attrs[sc.DECIDED_BY]) == ("denied", "unknown_tool", "registry")
        assert attrs[sc.ERROR_TYPE] == sc.ERROR_DENIED
        assert attrs[sc.EVENT_ID] == memory.of_type("ToolDenied")[0].event_id
        assert span.start_time == span.end_time

    def test_a_failing_pipeline_is_counted_not_raised(self) -> None:
        """An Unmediated event whose span cannot start is counted in `failed`; only the guard's own error is raised."""
        provider = TracerProvider(shutdown_on_exit=False)
        provider.add_span_processor(FailingProcessor())
        sink = OtelSink(provider)
        gate = Gate("shop", sinks=[sink])
        payments = gate.guard({"region": "eu"}, name="payments", tools=["refund"])
        with pytest.raises(UnmediatedAccessError):
            payments.keys()
        assert sink.failed == 1
        provider.shutdown()

    async def test_other_events_leave_no_span(
        self, provider: TracerProvider, exporter: InMemorySpanExporter, memory: MemorySink
    ) -> None:
        """ToolsRegistered, outcome events and approval events of closed calls add nothing when emitted again."""
        sink = OtelSink(provider)
        await desk([sink, memory]).call("get_order", {"order_id": "ACME-1"}, run=RUN)
        before = len(exporter.get_finished_spans())
        for event in memory.events:
            sink.emit(event)
        assert len(exporter.get_finished_spans()) == before
        assert sink.failed == 0


class TestLifecycle:
    async def test_flush_and_close_are_idempotent(
        self, provider: TracerProvider, exporter: InMemorySpanExporter
    ) -> None:
        """flush and close may be called repeatedly; after close, calls are no longer traced."""
        sink = OtelSink(provider)
        agent = desk([sink])
        await agent.call("get_order", {"order_id": "ACME-1"}, run=RUN)
        await sink.flush()
        await sink.flush()
        await sink.close()
        await sink.close()
        await sink.flush()
        await agent.call("get_order", {"order_id": "ACME-2"}, run=RUN)
        assert len(call_spans(exporter)) == 1

    async def test_close_leaves_a_provider_passed_in_running(
        self, provider: TracerProvider, exporter: InMemorySpanExporter
    ) -> None:
        """Closing the sink does not shut down a provider it was given."""
        await OtelSink(provider).close()
        with provider.get_tracer("app").start_as_current_span("after"):
            pass
        assert [s.name for s in exporter.get_finished_spans()] == ["after"]

    async def test_own_provider_reads_the_environment(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Without a provider, the sink builds an SDK one: service.name from OTEL_SERVICE_NAME, else "callgate"."""
        monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
        monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
        monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
        sink = OtelSink()
        assert isinstance(sink.tracer_provider, TracerProvider)
        assert sink.tracer_provider.resource.attributes["service.name"] == "callgate"
        await sink.close()
        monkeypatch.setenv("OTEL_SERVICE_NAME", "billing-agent")
        sink = OtelSink()
        assert isinstance(sink.tracer_provider, TracerProvider)
        assert sink.tracer_provider.resource.attributes["service.name"] == "billing-agent"
        await sink.close()
        await sink.close()

    def test_importing_events_loads_no_opentelemetry(self) -> None:
        """`import events`, `events.semconv` and `interceptor_core` load no opentelemetry module."""
        code = (
            "import sys, events, events.semconv, interceptor_core; "
            "print(' '.join(m for m in sys.modules if m.split('.')[0] == 'opentelemetry'))"
        )
        loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        assert loaded.strip() == ""


class _Collector(BaseHTTPRequestHandler):
    """An OTLP/HTTP endpoint that keeps the body of every POST to /v1/traces."""

    bodies: list[bytes]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.path == "/v1/traces":
            self.bodies.append(body)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        return None


@pytest.fixture
def collector() -> Iterator[tuple[str, list[bytes]]]:
    bodies: list[bytes] = []
    handler = type("Handler", (_Collector,), {"bodies": bodies})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name="otlp-collector", daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces", bodies
    server.shutdown()
    server.server_close()
    thread.join()


class TestOtlpExport:
    async def test_spans_reach_an_otlp_http_endpoint(
        self, monkeypatch: pytest.MonkeyPatch, collector: tuple[str, list[bytes]]
    ) -> None:
        """With OTEL_EXPORTER_OTLP_TRACES_ENDPOINT set, flush delivers the call's span as OTLP/HTTP protobuf."""
        endpoint, bodies = collector
        monkeypatch.delenv("OTEL_TRACES_EXPORTER", raising=False)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", endpoint)
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
        monkeypatch.setenv("OTEL_SERVICE_NAME", "callgate-test")
        sink = OtelSink()
        try:
            result = await desk([sink]).call("get_order", {"order_id": "ACME-42"}, run=RUN)
            await sink.flush()
        finally:
            await sink.close()
        spans = []
        for body in bodies:
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            for resource_spans in request.resource_spans:
                service = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
                assert service["service.name"] == "callgate-test"
                spans += [s for scope in resource_spans.scope_spans for s in scope.spans]
        (span,) = spans
        assert span.name == "execute_tool get_order"
        attrs = {a.key: a.value.string_value for a in span.attributes}
        assert attrs[sc.GEN_AI_TOOL_CALL_ID] == result.call_id
        assert attrs[sc.DECISION] == "allowed"
        assert len(span.events) == 3
