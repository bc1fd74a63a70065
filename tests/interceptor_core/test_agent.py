"""The agent loop: turns, tool results the model reads, limits, budgets, before-turn, nesting."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from events import MemorySink
from interceptor_core import (
    Agent,
    Allow,
    Block,
    ConfigurationError,
    Deny,
    Gate,
    LimitExceededError,
    Message,
    ModelTurn,
    RequireApproval,
    Rewrite,
    RunContext,
    ScriptedModel,
    Substitute,
    ToolApprovalRequiredError,
    ToolBlockedError,
    ToolCallRequest,
    ToolContext,
    TurnDeniedError,
    Usage,
    before_tool_call,
    tool,
)
from interceptor_core.messages import call

ACME = RunContext(tenant="acme", principal="u-1")


class Ledger:
    """What the tools did: the proof that a denied call had no effect."""

    def __init__(self) -> None:
        self.refunds: list[str] = []


@pytest.fixture
def ledger() -> Ledger:
    return Ledger()


@pytest.fixture
def tools(ledger: Ledger) -> list[Any]:
    @tool
    def refund(order_id: str) -> str:
        """Refunds an order."""
        ledger.refunds.append(order_id)
        return f"refunded {order_id}"

    @tool
    def lookup(order_id: str, ctx: ToolContext) -> str:
        """Looks an order up; costs a little."""
        ctx.report_cost(0.4)
        return f"{order_id}: shipped"

    return [refund, lookup]


tenant_only = before_tool_call(name="tenant-only")(
    lambda c: None if str(c.args.get("order_id", "ACME-")).startswith("ACME-") else Deny("Not your order; use ACME-*.")
)


def desk(tools: list[Any], *interceptors: object, **options: Any) -> tuple[Any, MemorySink]:
    sink = MemorySink()
    gate = Gate("shop", interceptors=list(interceptors), sinks=[sink], **options)
    return gate.workflow("support").agent("desk", tools=tools), sink


def outcome_types(sink: MemorySink) -> list[str]:
    return [e.type for e in sink.events if e.type in ("ToolUse", "ToolDenied", "Substitute", "Blocked")]  # type: ignore[attr-defined]


class TestTurns:
    async def test_a_turn_without_tool_calls_ends_the_run(self, tools: list[Any]) -> None:
        """The model's text without tool calls is the final output; the model saw the scope's tools."""
        scope, _ = desk(tools)
        model = ScriptedModel([ModelTurn(text="Hello!", usage=Usage(10, 2))])
        result = await Agent(scope, model, instructions="Be kind.").run("hi", run=ACME)
        assert result.output == "Hello!"
        assert [m.role for m in result.messages] == ["system", "user", "assistant"]
        assert [t["name"] for t in model.calls[0][1]] == ["refund", "lookup"]
        assert result.usage == Usage(10, 2)

    async def test_tool_messages_follow_in_call_order_with_model_text(self, tools: list[Any]) -> None:
        """After the assistant's calls, one tool message per call, in order, carrying to_model_text()."""
        scope, _ = desk(tools)
        first, second = call("lookup", {"order_id": "ACME-1"}), call("refund", {"order_id": "ACME-2"})
        model = ScriptedModel([ModelTurn(tool_calls=[first, second]), ModelTurn(text="done")])
        result = await Agent(scope, model).run("go", run=ACME)
        tool_messages = [m for m in result.messages if m.role == "tool"]
        assert [(m.tool_call_id, m.content) for m in tool_messages] == [
            (first.id, "ACME-1: shipped"),
            (second.id, "refunded ACME-2"),
        ]
        assert [r.request for r in result.tool_calls] == [first, second]

    async def test_calls_of_one_turn_run_concurrently(self) -> None:
        """Two calls that each wait for the other finish only if they run at the same time."""
        ping, pong = asyncio.Event(), asyncio.Event()

        @tool
        async def left() -> str:
            ping.set()
            await pong.wait()
            return "L"

        @tool
        async def right() -> str:
            pong.set()
            await ping.wait()
            return "R"

        scope, _ = desk([left, right])
        model = ScriptedModel([ModelTurn(tool_calls=[call("left"), call("right")]), ModelTurn(text="ok")])
        result = await asyncio.wait_for(Agent(scope, model).run("go"), 10)
        assert [r.result.value for r in result.tool_calls] == ["L", "R"]

    async def test_the_model_corrects_itself_after_a_denial(self, tools: list[Any], ledger: Ledger) -> None:
        """A denial goes back as the call's result; the scripted model reads it and asks again correctly."""
        scope, sink = desk(tools, tenant_only)

        def retry(messages: list[Message]) -> ModelTurn:
            assert messages[-1].content == "Not your order; use ACME-*."
            return ModelTurn(tool_calls=[call("refund", {"order_id": "ACME-9"})])

        model = ScriptedModel(
            [ModelTurn(tool_calls=[call("refund", {"order_id": "GLOBEX-9"})]), retry, ModelTurn(text="Refunded.")]
        )
        result = await Agent(scope, model).run("refund my order", run=ACME)
        assert result.output == "Refunded."
        assert ledger.refunds == ["ACME-9"]
        assert outcome_types(sink) == ["ToolDenied", "ToolUse"]


class TestEndings:
    async def test_block_ends_the_run(self, tools: list[Any], ledger: Ledger) -> None:
        """A Block raises ToolBlockedError out of the run; the model is not called again."""
        scope, _ = desk(tools, before_tool_call(name="kill")(lambda c: Block("refunds frozen")))
        model = ScriptedModel([ModelTurn(tool_calls=[call("refund", {"order_id": "ACME-1"})]), ModelTurn(text="x")])
        with pytest.raises(ToolBlockedError, match="refunds frozen"):
            await Agent(scope, model).run("go")
        assert len(model.calls) == 1
        assert ledger.refunds == []

    async def test_a_turn_past_max_tool_calls_runs_none(self, tools: list[Any], ledger: Ledger) -> None:
        """Denied calls count; a turn that would pass the limit runs none of its calls."""
        scope, sink = desk(tools, tenant_only)
        model = ScriptedModel(
            [
                ModelTurn(tool_calls=[call("refund", {"order_id": "X-1"}), call("refund", {"order_id": "X-2"})]),
                ModelTurn(tool_calls=[call("refund", {"order_id": "ACME-3"})]),
            ]
        )
        with pytest.raises(LimitExceededError, match="max_tool_calls=2"):
            await Agent(scope, model, max_tool_calls=2).run("go")
        assert ledger.refunds == []
        assert outcome_types(sink) == ["ToolDenied", "ToolDenied"]

    async def test_the_budget_stops_the_run_before_the_next_model_call(self, tools: list[Any]) -> None:
        """Once tools reported max_cost_usd, the next model call does not happen."""
        scope, _ = desk(tools)
        lookups = [ModelTurn(tool_calls=[call("lookup", {"order_id": f"ACME-{i}"})]) for i in range(5)]
        model = ScriptedModel(lookups)
        with pytest.raises(LimitExceededError, match="budget"):
            await Agent(scope, model, max_cost_usd=1.0).run("go")
        assert len(model.calls) == 3  # 0.4 + 0.4 + 0.4 >= 1.0 after the third turn's call

    async def test_max_turns(self, tools: list[Any]) -> None:
        """A model that never stops calling tools ends at max_turns."""
        scope, _ = desk(tools)
        model = ScriptedModel([lambda m: ModelTurn(tool_calls=[call("lookup", {"order_id": "ACME-1"})])] * 10)
        with pytest.raises(LimitExceededError, match="max_turns=3"):
            await Agent(scope, model, max_turns=3).run("go")

    async def test_approval_required_without_handler_propagates(self, tools: list[Any]) -> None:
        """ToolApprovalRequiredError leaves the run as it is."""
        scope, _ = desk(tools, before_tool_call(lambda c: RequireApproval("big")))
        model = ScriptedModel([ModelTurn(tool_calls=[call("refund", {"order_id": "ACME-1"})])])
        with pytest.raises(ToolApprovalRequiredError):
            await Agent(scope, model).run("go")


class TestBeforeTurn:
    async def test_rewrite_is_what_the_model_sees(self, tools: list[Any]) -> None:
        """A Rewrite replaces the messages the model is shown for that call."""

        class Redact:
            name = "redact"

            def before_turn(self, messages: list[Message]) -> Rewrite:
                return Rewrite([Message(m.role, (m.content or "").replace("4111", "****")) for m in messages])

        scope, sink = desk(tools)
        model = ScriptedModel([ModelTurn(text="ok")])
        result = await Agent(scope, model, before_turn=[Redact()]).run("card 4111")
        assert model.calls[0][0][-1].content == "card ****"
        assert result.messages[0].content == "card 4111"
        (decision,) = [e for e in sink.events if e.type == "TurnDecision"]  # type: ignore[attr-defined]
        assert (decision.decision, decision.decided_by, decision.turn) == ("rewrite", "redact", 1)  # type: ignore[attr-defined]

    async def test_deny_ends_the_run_without_calling_the_model(self, tools: list[Any]) -> None:
        """A Deny raises TurnDeniedError with the reason; the model is never called."""

        async def no_secrets(messages: list[Message]) -> Deny | None:
            return Deny("prompt holds a secret") if "password" in (messages[-1].content or "") else None

        guard = type("Guard", (), {"name": "no-secrets", "before_turn": staticmethod(no_secrets)})()
        scope, _ = desk(tools)
        model = ScriptedModel([ModelTurn(text="never")])
        with pytest.raises(TurnDeniedError, match="prompt holds a secret"):
            await Agent(scope, model, before_turn=[guard]).run("my password is x")
        assert model.calls == []

    async def test_substitute_is_the_final_output(self, tools: list[Any]) -> None:
        """A Substitute answers instead of the model."""
        canned = type("Canned", (), {"name": "faq", "before_turn": lambda self, m: Substitute("See the FAQ.")})()
        scope, _ = desk(tools)
        model = ScriptedModel([])
        result = await Agent(scope, model, before_turn=[canned]).run("hours?")
        assert result.output == "See the FAQ."
        assert model.calls == []

    async def test_a_failing_before_turn_interceptor_fails_closed(self, tools: list[Any]) -> None:
        """An interceptor that raises or returns a non-decision stops the run."""
        broken = type("Broken", (), {"name": "broken", "before_turn": lambda self, m: 1 / 0})()
        odd = type("Odd", (), {"name": "odd", "before_turn": lambda self, m: Block("nope")})()
        scope, sink = desk(tools)
        for interceptor in (broken, odd):
            with pytest.raises(TurnDeniedError, match="failing closed"):
                await Agent(scope, ScriptedModel([ModelTurn(text="x")]), before_turn=[interceptor]).run("hi")
        assert [e.decision for e in sink.events if e.type == "TurnDecision"] == ["error", "error"]  # type: ignore[attr-defined]

    def test_interceptor_without_before_turn_is_refused(self, tools: list[Any]) -> None:
        """Registering something without before_turn is a ConfigurationError."""
        scope, _ = desk(tools)
        with pytest.raises(ConfigurationError, match="before_turn"):
            Agent(scope, ScriptedModel([]), before_turn=[Allow()])


class TestEveryRouteMeetsThePolicy:
    async def test_the_same_denied_call_on_every_route(self, tools: list[Any], ledger: Ledger) -> None:
        """Direct call, loop, parallel calls, nested agent, retry after an error: one denial each, no effect."""
        scope, sink = desk(tools, tenant_only)
        bad = {"order_id": "GLOBEX-1"}

        def denials() -> int:
            return outcome_types(sink).count("ToolDenied")

        # 1. Direct scope.call.
        await scope.call("refund", bad, run=ACME)
        assert denials() == 1
        # 2. The loop.
        await Agent(scope, ScriptedModel([ModelTurn(tool_calls=[call("refund", bad)]), ModelTurn(text="x")])).run("a")
        assert denials() == 2
        # 3. Parallel calls in one turn (one bad, one good).
        parallel = ModelTurn(tool_calls=[call("refund", bad), call("lookup", {"order_id": "ACME-1"})])
        await Agent(scope, ScriptedModel([parallel, ModelTurn(text="x")])).run("b")
        assert denials() == 3
        # 4. A nested agent: the inner agent's call meets the same application policy.
        inner = Agent(scope, ScriptedModel([ModelTurn(tool_calls=[call("refund", bad)]), ModelTurn(text="inner done")]))
        outer_scope = scope.gate.agent("front", tools=[inner.as_tool("ask_desk", "Ask the desk agent")])
        outer = Agent(
            outer_scope, ScriptedModel([ModelTurn(tool_calls=[call("ask_desk", {"prompt": "p"})]), ModelTurn(text="x")])
        )
        result = await outer.run("c", run=ACME)
        assert result.tool_calls[0].result.value == "inner done"
        assert denials() == 4
        nested = [e for e in sink.events if e.type == "ToolDenied"][-1]  # type: ignore[attr-defined]
        ask_use = [e for e in sink.events if e.type == "ToolUse" and e.tool == "ask_desk"][-1]  # type: ignore[attr-defined]
        assert nested.parent_call_id == ask_use.call_id
        assert nested.run_id == ACME.run_id
        # 5. A retry after a tool error: the error goes back to the model, the retry is still denied.
        bad_args = call("refund", {"order": "missing"})
        await Agent(
            scope,
            ScriptedModel(
                [ModelTurn(tool_calls=[bad_args]), ModelTurn(tool_calls=[call("refund", bad)]), ModelTurn(text="x")]
            ),
        ).run("d")
        assert denials() == 6  # the invalid arguments (validation) and the retry (policy)
        assert ledger.refunds == []

    async def test_a_block_inside_a_nested_agent_stops_the_outer_run(self, tools: list[Any]) -> None:
        """A Block met by an inner agent ends the whole run, not just the inner one."""
        scope, _ = desk(
            tools, before_tool_call(name="kill")(lambda c: Block("frozen") if c.tool_name == "refund" else None)
        )
        inner = Agent(scope, ScriptedModel([ModelTurn(tool_calls=[call("refund", {"order_id": "ACME-1"})])]))
        outer_scope = scope.gate.agent("front", tools=[inner.as_tool("ask_desk", "Ask the desk agent")])
        outer_model = ScriptedModel([ModelTurn(tool_calls=[call("ask_desk", {"prompt": "p"})]), ModelTurn(text="x")])
        with pytest.raises(ToolBlockedError, match="frozen"):
            await Agent(outer_scope, outer_model).run("go")
        assert len(outer_model.calls) == 1


def test_toolcallrequest_is_a_plain_value() -> None:
    """ToolCallRequest compares by value."""
    assert ToolCallRequest("a", "t", {"x": 1}) == ToolCallRequest("a", "t", {"x": 1})
