"""Sinks given to a gate after it was built (`Gate.add_sink`), a scope's identity on its
`ToolsRegistered` events, and calls refused in front of the gate (`AgentScope.refuse`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from events import JsonlSink, MemorySink, read_jsonl, verify_chain
from interceptor_core import ConfigurationError, Deny, Gate, RunContext, ToolCall, before_tool_call, tool


@tool
def echo(text: str) -> str:
    """Echoes its text."""
    return text


@before_tool_call
def no_secrets(call: ToolCall) -> Deny | None:
    return Deny("no secrets") if call.args.get("text") == "secret" else None


ACME = RunContext(tenant="acme", principal="ops-bot")


class TestAddSink:
    async def test_a_plain_gate_takes_a_sink_and_audits_every_call(self) -> None:
        """A gate built without sinks, given one: each call leaves its outcome event in a chain that verifies."""
        gate = Gate("plain", interceptors=[no_secrets])
        memory = MemorySink()
        gate.add_sink(memory)
        desk = gate.agent("desk", tools=[echo])
        assert (await desk.call("echo", {"text": "hi"})).ok
        assert (await desk.call("echo", {"text": "secret"})).kind == "denied"
        assert [e.type for e in memory.events] == ["ToolsRegistered", "ToolUse", "ToolDenied"]
        assert verify_chain(memory.events).ok

    async def test_scopes_built_before_are_announced_to_the_new_sink(self) -> None:
        """An agent scope made before the sink was added still has its ToolsRegistered first."""
        gate = Gate("plain")
        desk = gate.agent("desk", tools=[echo])
        memory = MemorySink()
        gate.add_sink(memory)
        await desk.call("echo", {"text": "hi"})
        assert [(e.type, e.agent) for e in memory.events] == [("ToolsRegistered", "desk"), ("ToolUse", "desk")]
        assert gate.coverage().registered == {"echo"}

    async def test_a_second_sink_joins_the_first_before_any_event(self, tmp_path: Path) -> None:
        """A gate with a sink of its own takes another before first use; both get the same chain."""
        memory = MemorySink()
        gate = Gate("both", sinks=[memory])
        gate.add_sink(JsonlSink(tmp_path / "audit.jsonl"))
        await gate.agent("desk", tools=[echo]).call("echo", {"text": "hi"})
        await gate.close()
        written = read_jsonl(tmp_path / "audit.jsonl")
        assert [e.hash for e in written] == [e.hash for e in memory.events]
        assert len(gate.sink_stats()) == 2

    def test_refused_once_events_were_emitted(self) -> None:
        """After the first event a new sink would start mid-chain: ConfigurationError, nothing added."""
        gate = Gate("busy", sinks=[MemorySink()])
        gate.agent("desk", tools=[echo])
        with pytest.raises(ConfigurationError, match="emitted events already"):
            gate.add_sink(MemorySink())
        assert len(gate.sinks) == 1

    async def test_refused_once_calls_were_mediated(self) -> None:
        """A gate that already mediated calls without an audit refuses a sink (they would be missing)."""
        gate = Gate("used")
        await gate.agent("desk", tools=[echo]).call("echo", {"text": "hi"})
        with pytest.raises(ConfigurationError, match="mediated calls already"):
            gate.add_sink(MemorySink())

    def test_a_sink_that_cannot_start_is_refused_naming_it(self, tmp_path: Path) -> None:
        """Checked as the constructor's sinks are: a JSONL file in a missing directory is refused."""
        gate = Gate("plain")
        with pytest.raises(ConfigurationError, match="cannot start"):
            gate.add_sink(JsonlSink(tmp_path / "missing" / "audit.jsonl"))
        with pytest.raises(ConfigurationError, match="no emit"):
            gate.add_sink(object())
        assert gate.sinks == ()


class TestScopeIdentity:
    async def test_tools_registered_carries_the_scope_identity(self) -> None:
        """`gate.agent(..., identity=run)`: its ToolsRegistered events (at creation and for tools
        added later) name the tenant and principal."""
        memory = MemorySink()
        gate = Gate("proxy", sinks=[memory])
        desk = gate.agent("desk", tools=[], identity=ACME)
        desk.add_tools([echo])
        registered = [(e.tenant, e.principal, e.run_id) for e in memory.events if e.type == "ToolsRegistered"]
        assert registered == [("acme", "ops-bot", ACME.run_id)] * 2

    def test_without_identity_the_fields_stay_empty(self) -> None:
        """A scope with no identity registers its tools as before: no tenant, no principal."""
        memory = MemorySink()
        Gate("plain", sinks=[memory]).workflow("w").agent("desk", tools=[echo])
        (event,) = memory.events
        assert (event.tenant, event.principal) == (None, None)


class TestRefuse:
    def test_records_one_small_denial(self) -> None:
        """`scope.refuse`: an error result, one ToolDenied decided by validation, no args, tool untouched."""
        memory = MemorySink()
        desk = Gate("proxy", sinks=[memory]).agent("desk", tools=[echo])
        result = desk.refuse("x" * 64 + "…", "tool name of 5000000 chars", run=ACME, call_id="c-1")
        assert (result.kind, result.message, result.call_id) == ("error", "tool name of 5000000 chars", "c-1")
        denied = memory.events[-1]
        assert denied.type == "ToolDenied"
        assert (denied.cause, denied.decided_by, denied.tenant, denied.call_id) == (
            "validation",
            "validation",
            "acme",
            "c-1",
        )
        assert denied.args == {}
        assert verify_chain(memory.events).ok
