"""What the gate emits: one outcome event per call, approvals around it, coverage events, redaction."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from events import OUTCOME_TYPES, MemorySink, verify_chain
from interceptor_core import (
    Approval,
    ApprovalRequest,
    Block,
    Deny,
    Gate,
    RequireApproval,
    RunContext,
    Substitute,
    Tool,
    ToolApprovalRequiredError,
    ToolBlockedError,
    ToolCall,
    UnmediatedAccessError,
    before_tool_call,
    tool,
)


def types(sink: MemorySink) -> list[str]:
    return [e.type for e in sink.events if e.type != "ToolsRegistered"]  # type: ignore[attr-defined]


def desk(*interceptors: object, tools: list[Tool[Any, Any]], **options: Any) -> tuple[Any, MemorySink]:
    sink = MemorySink()
    gate = Gate("shop", interceptors=list(interceptors), sinks=[sink], **options)
    return gate.workflow("support").agent("desk", tools=tools), sink


@tool
def refund(order_id: str, amount_cents: int) -> str:
    """Refunds an order."""
    return f"refunded {amount_cents}"


@tool(timeout_s=0.05)
async def hang() -> str:
    await asyncio.Event().wait()
    return ""


@tool
def broken(secret_hint: str) -> str:
    raise RuntimeError(f"upstream said: token ghp_{'a' * 36} rejected")


ACME = RunContext(tenant="acme", principal="u-1", thread_id="t-9")
ARGS = {"order_id": "A-1", "amount_cents": 100}


class TestOneOutcomePerCall:
    async def test_allowed_call_is_one_tool_use(self) -> None:
        """A call that ran leaves exactly one ToolUse carrying envelope, trail and digest."""
        agent, sink = desk(before_tool_call(name="check")(lambda c: None), tools=[refund])
        result = await agent.call("refund", ARGS, run=ACME, call_id="c-1")
        assert types(sink) == ["ToolUse"]
        event = sink.events[-1]
        assert (event.gate, event.workflow, event.agent, event.tool) == ("shop", "support", "desk", "refund")
        assert (event.call_id, event.run_id, event.tenant, event.principal, event.thread_id) == (
            "c-1",
            ACME.run_id,
            "acme",
            "u-1",
            "t-9",
        )
        assert event.outcome == "ok"  # type: ignore[attr-defined]
        assert event.output_digest is not None  # type: ignore[attr-defined]
        assert [d.interceptor for d in event.decisions] == ["check"]
        assert result.ok

    async def test_denied_call_has_no_tool_use(self) -> None:
        """A Deny leaves one ToolDenied with the message the model got, and no ToolUse."""
        agent, sink = desk(before_tool_call(name="tenant")(lambda c: Deny("not yours")), tools=[refund])
        await agent.call("refund", ARGS, run=ACME)
        assert types(sink) == ["ToolDenied"]
        event = sink.events[-1]
        assert (event.message, event.decided_by, event.cause) == ("not yours", "tenant", "deny")  # type: ignore[attr-defined]

    async def test_substitute_and_block(self) -> None:
        """Substitute leaves a Substitute event with a digest; Block a Blocked event with the reason."""
        agent, sink = desk(before_tool_call(name="cache")(lambda c: Substitute("cached")), tools=[refund])
        await agent.call("refund", ARGS)
        assert types(sink) == ["Substitute"]
        assert sink.events[-1].result_digest is not None  # type: ignore[attr-defined]
        agent, sink = desk(before_tool_call(name="sql")(lambda c: Block("DROP TABLE")), tools=[refund])
        with pytest.raises(ToolBlockedError):
            await agent.call("refund", ARGS)
        assert types(sink) == ["Blocked"]
        assert (sink.events[-1].reason, sink.events[-1].cause) == ("DROP TABLE", "block")  # type: ignore[attr-defined]

    async def test_approved_call(self) -> None:
        """An approved call: ApprovalRequested, ApprovalResolved, then ToolUse."""

        async def yes(request: ApprovalRequest) -> Approval:
            return Approval(approved=True, by="lead")

        agent, sink = desk(
            before_tool_call(name="limit")(lambda c: RequireApproval("big")), tools=[refund], approval_handler=yes
        )
        await agent.call("refund", ARGS)
        assert types(sink) == ["ApprovalRequested", "ApprovalResolved", "ToolUse"]
        resolved = sink.events[-2]
        assert (resolved.approved, resolved.by) == (True, "lead")  # type: ignore[attr-defined]
        assert len({e.call_id for e in sink.events[-3:]}) == 1

    async def test_refused_and_unanswerable_approvals(self) -> None:
        """A refusal ends in ToolDenied; no handler at all in Blocked (approval_required)."""

        async def no(request: ApprovalRequest) -> bool:
            return False

        ask = before_tool_call(name="limit")(lambda c: RequireApproval("big"))
        agent, sink = desk(ask, tools=[refund], approval_handler=no)
        await agent.call("refund", ARGS)
        assert types(sink) == ["ApprovalRequested", "ApprovalResolved", "ToolDenied"]
        assert sink.events[-1].cause == "approval_refused"  # type: ignore[attr-defined]
        agent, sink = desk(ask, tools=[refund])
        with pytest.raises(ToolApprovalRequiredError):
            await agent.call("refund", ARGS)
        assert types(sink) == ["Blocked"]
        assert sink.events[-1].cause == "approval_required"  # type: ignore[attr-defined]

    async def test_validation_failure_interceptor_error_and_unknown_tool_are_denials(self) -> None:
        """Invalid args, a failing interceptor and an unknown tool each leave one ToolDenied with its cause."""
        flaky = before_tool_call(name="flaky")(lambda c: 1 / 0 if c.args["order_id"] == "X" else None)
        agent, sink = desk(flaky, tools=[refund])
        await agent.call("refund", {"order_id": "A-1"})
        await agent.call("refund", {"order_id": "X", "amount_cents": 1})
        await agent.call("wire_money", {"to": "elsewhere"})
        assert types(sink) == ["ToolDenied"] * 3
        assert [e.cause for e in sink.events[1:]] == ["validation", "interceptor_error", "unknown_tool"]  # type: ignore[attr-defined]
        assert "ZeroDivisionError" in (sink.events[2].decisions[0].error or "")
        assert sink.events[3].args == {"to": "elsewhere"}  # type: ignore[attr-defined]

    async def test_tool_errors_and_timeouts(self) -> None:
        """A tool that raises or times out leaves a ToolUse with outcome error or timeout."""
        agent, sink = desk(tools=[broken, hang])
        await agent.call("broken", {"secret_hint": "x"})
        await agent.call("hang", {})
        assert [(e.type, e.outcome) for e in sink.events[1:]] == [("ToolUse", "error"), ("ToolUse", "timeout")]  # type: ignore[attr-defined]

    async def test_cancelled_call_still_leaves_an_outcome(self) -> None:
        """A call cancelled while its tool runs leaves a ToolUse with outcome cancelled."""
        started = asyncio.Event()

        @tool
        async def slow() -> str:
            started.set()
            await asyncio.Event().wait()
            return ""

        agent, sink = desk(tools=[slow])
        task = asyncio.create_task(agent.call("slow", {}))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert [(e.type, e.outcome) for e in sink.events[1:]] == [("ToolUse", "cancelled")]  # type: ignore[attr-defined]

    async def test_many_concurrent_calls_one_outcome_each_and_a_whole_chain(self) -> None:
        """Under 200 concurrent calls of mixed fate, each call id has one outcome and the chain verifies."""

        def decide(call: ToolCall) -> Any:
            n = call.args["amount_cents"]
            return [None, Deny("no"), Substitute("cached"), RequireApproval("ask")][n % 4]

        async def approve(request: ApprovalRequest) -> bool:
            await asyncio.sleep(0)
            return request.args["amount_cents"] % 8 == 3

        agent, sink = desk(before_tool_call(name="mix")(decide), tools=[refund], approval_handler=approve)
        await asyncio.gather(*(agent.call("refund", {"order_id": "A", "amount_cents": n}) for n in range(200)))
        outcomes = Counter(e.call_id for e in sink.events if e.type in OUTCOME_TYPES)  # type: ignore[attr-defined]
        assert len(outcomes) == 200
        assert set(outcomes.values()) == {1}
        assert verify_chain(sink.events).ok
        assert [e.seq for e in sink.events] == list(range(1, len(sink.events) + 1))


class TestWhatLeavesTheProcess:
    async def test_args_are_redacted_with_paths(self) -> None:
        """Card numbers and secret-named keys never reach a sink; redacted_paths lists them."""

        @tool
        def send_email(to: str, body: str, api_key: str) -> str:
            return "sent"

        agent, sink = desk(tools=[send_email])
        await agent.call(
            "send_email", {"to": "a@b.example", "body": "card 4111 1111 1111 1111 thanks", "api_key": "k-123"}
        )
        event = sink.events[-1]
        text = event.model_dump_json()
        assert "4111 1111 1111 1111" not in text
        assert "k-123" not in text
        assert set(event.redacted_paths) == {"/body", "/api_key"}  # type: ignore[attr-defined]

    async def test_error_text_is_redacted(self) -> None:
        """A token in a tool's error message is redacted in the event (the model still gets the error)."""
        agent, sink = desk(tools=[broken])
        result = await agent.call("broken", {"secret_hint": "x"})
        assert "ghp_" in (result.message or "")
        assert "ghp_" not in (sink.events[-1].error or "")  # type: ignore[attr-defined]

    async def test_failing_sink_never_raises_into_the_call(self) -> None:
        """A sink whose emit raises is counted and never raises into the call; with
        audit="best_effort" the call and the other sinks carry on."""

        class Broken:
            def emit(self, event: Any) -> None:
                raise OSError("disk gone")

            async def flush(self) -> None: ...

            async def close(self) -> None: ...

        good = MemorySink()
        gate = Gate("shop", sinks=[Broken(), good], audit="best_effort")
        result = await gate.agent("desk", tools=[refund]).call("refund", ARGS)
        assert result.ok
        stats = gate.sink_stats()
        assert stats["0:Broken"].failed == 2  # ToolsRegistered and ToolUse
        assert (stats["0:Broken"].available, stats["0:Broken"].error) == (
            False,
            "Broken: emit raised OSError: disk gone",
        )
        assert stats["1:MemorySink"].emitted == 2
        assert types(good) == ["ToolUse"]

    async def test_failing_sink_blocks_calls_when_the_audit_is_required(self) -> None:
        """By default a sink whose emit raised is unavailable: the next call ends Blocked."""

        class Broken:
            def emit(self, event: Any) -> None:
                raise OSError("disk gone")

        good = MemorySink()
        gate = Gate("shop", sinks=[Broken(), good])
        with pytest.raises(ToolBlockedError, match="audit unavailable: Broken: emit raised OSError: disk gone"):
            await gate.agent("desk", tools=[refund]).call("refund", ARGS)
        assert types(good) == ["Blocked"]


class TestCoverageEvents:
    def test_agent_scope_registers_its_tools_and_chains(self) -> None:
        """Creating an agent scope emits ToolsRegistered with each tool's schema hash and chain."""
        check = before_tool_call(name="check")(lambda c: None)
        noisy = before_tool_call(name="noisy")(lambda c: None)
        sink = MemorySink()
        gate = Gate("shop", interceptors=[check, noisy], sinks=[sink])
        gate.agent("desk", tools=[refund], exclude=["noisy"])
        (event,) = sink.events
        assert event.type == "ToolsRegistered"  # type: ignore[attr-defined]
        (registered,) = event.tools  # type: ignore[attr-defined]
        assert (registered.name, registered.interceptors, registered.excluded) == ("refund", ("check",), ("noisy",))
        assert len(registered.input_schema_sha256) == 64

    async def test_unmediated_access_is_an_event(self) -> None:
        """A guarded client used around the gate emits Unmediated with resource, attribute and site."""
        sink = MemorySink()
        gate = Gate("shop", sinks=[sink])
        payments = gate.guard({"balance": 1}, name="payments", tools=["refund"])
        with pytest.raises(UnmediatedAccessError):
            payments["balance"]
        (event,) = sink.events
        assert (event.type, event.resource, event.attribute, event.bound_tools) == (  # type: ignore[attr-defined]
            "Unmediated",
            "payments",
            "__getitem__",
            ("refund",),
        )
        assert __file__ in event.site  # type: ignore[attr-defined]

    async def test_nested_calls_name_their_parent(self) -> None:
        """A call made from inside a mediated tool body carries the outer call's id as parent_call_id."""
        sink = MemorySink()
        gate = Gate("shop", sinks=[sink])
        inner = gate.agent("inner", tools=[refund])

        @tool
        async def delegate() -> str:
            result = await inner.call("refund", ARGS)
            return result.to_model_text()

        outer = gate.agent("outer", tools=[delegate])
        await outer.call("delegate", {}, call_id="outer-1")
        uses = [e for e in sink.events if e.type == "ToolUse"]  # type: ignore[attr-defined]
        assert [(e.tool, e.parent_call_id) for e in uses] == [("refund", "outer-1"), ("delegate", None)]


class CongestedSink(MemorySink):
    """A sink that says it is congested until told otherwise, counting how often it was asked."""

    def __init__(self) -> None:
        super().__init__()
        self.is_congested = True
        self.asked = 0

    @property
    def congested(self) -> bool:
        self.asked += 1
        return self.is_congested


class TestPacing:
    async def test_a_call_waits_while_a_sink_is_congested(self) -> None:
        """A new call does not start while a sink is congested, and runs once it no longer is."""
        ran: list[str] = []

        @tool
        async def lookup(order_id: str) -> str:
            ran.append(order_id)
            return "ok"

        sink = CongestedSink()
        agent = Gate("shop", sinks=[sink]).agent("desk", tools=[lookup])
        call = asyncio.create_task(agent.call("lookup", {"order_id": "A-1"}, run=ACME))
        while sink.asked < 5:
            await asyncio.sleep(0.001)  # sleep-ok: yields to the held call, which polls the sink
        assert ran == []
        sink.is_congested = False
        result = await call
        assert result.kind == "ok"
        assert ran == ["A-1"]
        assert [e.type for e in sink.events][-1] == "ToolUse"  # type: ignore[attr-defined]

    async def test_a_call_waits_at_most_the_pace_limit(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """A sink that stays congested holds each call back for PACE_LIMIT_S, then the call runs."""
        import interceptor_core.audit as audit

        monkeypatch.setattr(audit, "PACE_LIMIT_S", 0.02)
        sink = CongestedSink()
        agent = Gate("shop", sinks=[sink]).agent("desk", tools=[refund])
        result = await agent.call("refund", ARGS, run=ACME)
        assert result.kind == "ok"
        assert sink.asked > 1
