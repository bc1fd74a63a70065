"""The deny-all drill: every route into a tool is refused, effects and silent attempts fail it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from events import MemorySink
from interceptor_core import (
    Agent,
    ConfigurationError,
    Gate,
    ModelTurn,
    RunContext,
    ScriptedModel,
    ToolBlockedError,
    ToolCallRequest,
    tool,
)
from interceptor_core.messages import call
from interceptor_core.testing import DRILL_INTERCEPTOR, DrillFailedError, deny_all

ACME = RunContext(tenant="acme", principal="u-1")


class Effects:
    """What the tool bodies did: the proof that a refused call changed nothing."""

    def __init__(self) -> None:
        self.done: list[str] = []


@pytest.fixture
def effects() -> Effects:
    return Effects()


@pytest.fixture
def sink() -> MemorySink:
    return MemorySink()


@pytest.fixture
def gate(sink: MemorySink) -> Gate:
    return Gate("shop", sinks=[sink])


@pytest.fixture
def tools(effects: Effects) -> dict[str, Any]:
    @tool
    def refund(order_id: str) -> str:
        """Refunds an order."""
        effects.done.append(f"refund {order_id}")
        return "refunded"

    @tool
    async def send_email(to: str) -> str:
        """Sends an e-mail."""
        effects.done.append(f"email {to}")
        return "sent"

    return {"refund": refund, "send_email": send_email}


def denial_events(sink: MemorySink) -> list[Any]:
    return [e for e in sink.events if e.type in ("ToolDenied", "Blocked") and e.decided_by == DRILL_INTERCEPTOR]


class TestRoutes:
    """Every invocation path the gate offers shows one denial per attempt and no effect."""

    async def test_agent_scope_call(
        self, gate: Gate, tools: dict[str, Any], effects: Effects, sink: MemorySink
    ) -> None:
        """A scope's `call` is denied with the drill's message and the body never starts."""
        desk = gate.agent("desk", tools=list(tools.values()))
        async with deny_all(gate) as drill:
            result = await desk.call("refund", {"order_id": "A-1"}, run=ACME)
        assert result.kind == "denied"
        assert "deny-all drill" in (result.message or "")
        assert effects.done == []
        line = drill.report.tool("refund")
        assert (line.attempts, line.denials, line.effects) == (1, 1, 0)
        assert len(denial_events(sink)) == 1

    async def test_gate_invoke(self, gate: Gate, tools: dict[str, Any], effects: Effects) -> None:
        """The direct path is refused as well, including a tool first registered during the drill."""
        async with deny_all(gate) as drill:
            result = await gate.invoke(tools["send_email"], {"to": "a@example.com"}, run=ACME)
        assert result.kind == "denied"
        assert effects.done == []
        assert drill.report.tool("send_email").denials == 1

    async def test_parallel_calls_in_one_turn(self, gate: Gate, tools: dict[str, Any], effects: Effects) -> None:
        """Three calls of one model turn, run concurrently: three denials, no effect."""
        desk = gate.agent("desk", tools=list(tools.values()))
        model = ScriptedModel(
            [
                ModelTurn(
                    tool_calls=[
                        call("refund", {"order_id": "A-1"}),
                        call("refund", {"order_id": "A-2"}),
                        call("send_email", {"to": "b@example.com"}),
                    ]
                ),
                ModelTurn(text="done"),
            ]
        )
        async with deny_all(gate) as drill:
            result = await Agent(desk, model).run("refund both", run=ACME)
        assert [r.result.kind for r in result.tool_calls] == ["denied", "denied", "denied"]
        assert effects.done == []
        assert (drill.report.attempts, drill.report.denials, drill.report.effects) == (3, 3, 0)

    async def test_retry_of_a_failed_call(self, gate: Gate, tools: dict[str, Any], effects: Effects) -> None:
        """The model retries the denied call, and the same call id is tried again: each is denied."""
        desk = gate.agent("desk", tools=list(tools.values()))
        model = ScriptedModel(
            [
                ModelTurn(tool_calls=[ToolCallRequest("c1", "refund", {"order_id": "A-1"})]),
                ModelTurn(tool_calls=[ToolCallRequest("c2", "refund", {"order_id": "A-1"})]),
                ModelTurn(text="gave up"),
            ]
        )
        async with deny_all(gate) as drill:
            await Agent(desk, model).run("refund", run=ACME)
            for _ in range(2):
                await desk.call("refund", {"order_id": "A-1"}, run=ACME, call_id="retry-1")
        assert effects.done == []
        line = drill.report.tool("refund")
        assert (line.attempts, line.denials, line.effects) == (4, 4, 0)

    async def test_nested_agent_used_as_a_tool(self, gate: Gate, tools: dict[str, Any], effects: Effects) -> None:
        """The outer call of an agent-as-tool is denied, so the inner agent never calls its tools."""
        inner = Agent(
            gate.agent("billing", tools=[tools["refund"]]),
            ScriptedModel([ModelTurn(tool_calls=[call("refund", {"order_id": "A-1"})]), ModelTurn(text="ok")]),
        )
        outer = gate.agent("front", tools=[inner.as_tool("billing", "Ask billing.")])
        model = ScriptedModel(
            [ModelTurn(tool_calls=[call("billing", {"prompt": "refund A-1"})]), ModelTurn(text="done")]
        )
        async with deny_all(gate) as drill:
            result = await Agent(outer, model).run("help", run=ACME)
        assert [r.result.kind for r in result.tool_calls] == ["denied"]
        assert effects.done == []
        assert drill.report.tool("billing").denials == 1
        assert drill.report.tool("refund").attempts == 0

    async def test_block_mode_stops_the_agent_loop(self, gate: Gate, tools: dict[str, Any], effects: Effects) -> None:
        """With mode="block" the first call raises ToolBlockedError and is recorded as Blocked."""
        desk = gate.agent("desk", tools=list(tools.values()))
        model = ScriptedModel([ModelTurn(tool_calls=[call("refund", {"order_id": "A-1"})]), ModelTurn(text="done")])
        async with deny_all(gate, mode="block") as drill:
            with pytest.raises(ToolBlockedError):
                await Agent(desk, model).run("refund", run=ACME)
        assert effects.done == []
        assert drill.report.tool("refund").denials == 1

    def test_sync_context_manager(self, gate: Gate, tools: dict[str, Any], effects: Effects) -> None:
        """The drill works as a plain `with` around code that runs its own event loops."""
        desk = gate.agent("desk", tools=list(tools.values()))
        with deny_all(gate) as drill:
            asyncio.run(desk.call("refund", {"order_id": "A-1"}, run=ACME))
            asyncio.run(desk.call("send_email", {"to": "x@example.com"}, run=ACME))
        assert effects.done == []
        assert drill.report.ok
        assert [t.tool for t in drill.report.tools] == ["refund", "send_email"]


class TestVerdict:
    """The drill fails on an effect or a silent attempt, and leaves the gate as it found it."""

    async def test_a_body_started_around_the_gate_fails_the_drill(
        self, gate: Gate, tools: dict[str, Any], effects: Effects
    ) -> None:
        """Calling a tool's function directly during the drill is an effect: DrillFailedError names it."""
        desk = gate.agent("desk", tools=list(tools.values()))
        with pytest.raises(DrillFailedError, match="refund") as failed:
            async with deny_all(gate):
                desk.tools["refund"].fn("A-1")
        assert effects.done == ["refund A-1"]
        line = failed.value.report.tool("refund")
        assert (line.attempts, line.effects) == (0, 1)

    async def test_a_watched_foreign_body_counts(self, gate: Gate) -> None:
        """A body the gate does not own (a framework's function) is watched with `watch`."""
        drill = deny_all(gate, check=False)
        async with drill:
            handler = drill.watch("delete_file", lambda path: f"deleted {path}")
            handler("/tmp/x")
        assert not drill.report.ok
        assert drill.report.tool("delete_file").effects == 1

    async def test_a_gate_without_sinks_cannot_pass(self, tools: dict[str, Any], effects: Effects) -> None:
        """No sinks, no denial events: every attempt is listed as undenied."""
        silent = Gate("silent")
        desk = silent.agent("desk", tools=[tools["refund"]])
        drill = deny_all(silent, check=False)
        async with drill:
            result = await desk.call("refund", {"order_id": "A-1"}, run=ACME)
        assert result.kind == "denied"
        assert effects.done == []
        assert not drill.report.ok
        assert not drill.report.audited
        assert len(drill.report.tool("refund").undenied_calls) == 1
        assert "without a denial event" in drill.report.describe()

    async def test_the_gate_is_restored(self, gate: Gate, tools: dict[str, Any], effects: Effects) -> None:
        """After the drill the interceptor is gone and the tools run and are their own functions again."""
        desk = gate.agent("desk", tools=list(tools.values()))
        original = desk.tools["refund"].fn
        async with deny_all(gate):
            assert desk.tools["refund"].fn is not original
        assert desk.tools["refund"].fn is original
        assert gate.interceptors == ()
        result = await desk.call("refund", {"order_id": "A-1"}, run=ACME)
        assert result.kind == "ok"
        assert effects.done == ["refund A-1"]

    async def test_an_error_inside_the_block_wins(self, gate: Gate, tools: dict[str, Any]) -> None:
        """An exception raised in the drill's block propagates as is, and the gate is restored."""
        desk = gate.agent("desk", tools=list(tools.values()))

        async def failing() -> None:
            async with deny_all(gate):
                desk.tools["refund"].fn("A-1")
                raise KeyError("boom")

        with pytest.raises(KeyError):
            await failing()
        assert gate.interceptors == ()

    def test_the_interceptor_is_mandatory(self, gate: Gate, tools: dict[str, Any]) -> None:
        """No scope created during the drill may exclude it."""
        with deny_all(gate), pytest.raises(ConfigurationError, match=DRILL_INTERCEPTOR):
            gate.agent("sneaky", tools=[tools["refund"]], exclude=[DRILL_INTERCEPTOR])

    def test_bad_mode(self, gate: Gate) -> None:
        """An unknown mode is a ConfigurationError naming it."""
        with pytest.raises(ConfigurationError, match="'allow'"):
            deny_all(gate, mode="allow")

    def test_describe_lists_every_tool(self, gate: Gate, tools: dict[str, Any]) -> None:
        """The report's text has a line per tool with attempts, denials and effects."""
        desk = gate.agent("desk", tools=list(tools.values()))
        with deny_all(gate) as drill:
            asyncio.run(desk.call("refund", {"order_id": "A-1"}, run=ACME))
        text = drill.report.describe()
        assert "passed" in text
        assert "refund" in text.splitlines()[2]
        assert text.splitlines()[2].split()[1:] == ["1", "1", "0"]
