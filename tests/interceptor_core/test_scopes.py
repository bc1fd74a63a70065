"""Scopes: cascade, excludes, mandatory interceptors, registration checks, the direct path."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from interceptor_core import (
    ConfigurationError,
    Deny,
    Gate,
    RunContext,
    Tool,
    after_tool_call,
    before_tool_call,
    tool,
)
from interceptor_core.testing import RecordingInterceptor

from .conftest import Effects


class Audit:
    name = "audit"
    mandatory = True

    def before_tool_call(self, call: Any) -> None:
        return None


class TestRegistration:
    def test_interceptor_without_handlers_is_refused(self, get_order: Tool[Any, Any]) -> None:
        """An object with neither handler is a ConfigurationError naming it, at every scope."""

        class Nothing:
            name = "nothing"

        with pytest.raises(ConfigurationError, match=r"'nothing'.*neither"):
            Gate("g", interceptors=[Nothing()])
        gate = Gate("g")
        with pytest.raises(ConfigurationError, match="neither"):
            gate.workflow("w", interceptors=[Nothing()])
        with pytest.raises(ConfigurationError, match="neither"):
            gate.agent("a", tools=[get_order], interceptors=[Nothing()])

    def test_handlers_may_be_sync_or_async_methods(self, get_order: Tool[Any, Any]) -> None:
        """Objects with sync or async handlers both register."""

        class AsyncOnly:
            name = "async-only"

            async def after_tool_call(self, call: Any, output: Any) -> Any:
                return output

        Gate("g", interceptors=[AsyncOnly(), Audit()]).agent("a", tools=[get_order])

    def test_duplicate_tool_names_are_refused(self, get_order: Tool[Any, Any]) -> None:
        """Two tools with one name in a scope would make calls ambiguous."""
        with pytest.raises(ConfigurationError, match="two tools named 'get_order'"):
            Gate("g").agent("a", tools=[get_order, get_order])

    def test_non_tool_is_refused(self) -> None:
        """A plain function in tools= is refused with a hint."""
        with pytest.raises(ConfigurationError, match="@tool"):
            Gate("g").agent("a", tools=[lambda: None])  # type: ignore[list-item]

    def test_bad_gate_options_are_refused(self) -> None:
        """on_interceptor_error accepts only 'deny' or 'block'."""
        with pytest.raises(ConfigurationError, match="on_interceptor_error"):
            Gate("g", on_interceptor_error="allow")  # type: ignore[arg-type]


class TestExcludes:
    async def test_inner_scope_excludes_an_outer_interceptor(self, get_order: Tool[Any, Any]) -> None:
        """An agent's exclude switches off a gate interceptor for its tools only."""
        deny = before_tool_call(name="deny-all")(lambda call: Deny("no"))
        gate = Gate("g", interceptors=[deny])
        free = gate.agent("free", tools=[get_order], exclude=["deny-all"])
        locked = gate.agent("locked", tools=[get_order])
        assert (await free.call("get_order", {"order_id": "A"})).ok
        assert (await locked.call("get_order", {"order_id": "A"})).kind == "denied"

    async def test_workflow_exclude_applies_to_its_agents(self, get_order: Tool[Any, Any]) -> None:
        """A workflow's exclude holds for every agent under it."""
        gate = Gate("g", interceptors=[before_tool_call(name="deny-all")(lambda call: Deny("no"))])
        agent = gate.workflow("w", exclude=["deny-all"]).agent("a", tools=[get_order])
        assert (await agent.call("get_order", {"order_id": "A"})).ok

    async def test_tool_excludes_an_agent_interceptor(self, effects: Effects) -> None:
        """A tool's exclude_interceptors switches off an outer interceptor for that tool."""
        deny = before_tool_call(name="deny-all")(lambda call: Deny("no"))

        @tool(exclude_interceptors=["deny-all"])
        def health() -> str:
            return "up"

        @tool
        def wipe() -> str:
            effects.calls.append(("wipe", None))
            return "wiped"

        agent = Gate("g").agent("a", tools=[health, wipe], interceptors=[deny])
        assert (await agent.call("health", {})).ok
        assert (await agent.call("wipe", {})).kind == "denied"
        assert effects.calls == []

    def test_unknown_exclude_is_refused(self, get_order: Tool[Any, Any]) -> None:
        """Excluding a name no outer scope has is a typo, refused when the scope is created."""
        gate = Gate("g", interceptors=[Audit()])
        with pytest.raises(ConfigurationError, match=r"'audti'.*they have: audit"):
            gate.agent("a", tools=[get_order], exclude=["audti"])
        with pytest.raises(ConfigurationError, match="'nope'"):
            gate.workflow("w", exclude=["nope"])

    def test_inner_interceptor_cannot_be_excluded_from_outside(self, get_order: Tool[Any, Any]) -> None:
        """A workflow cannot exclude what only an agent under it registers."""
        gate = Gate("g")
        with pytest.raises(ConfigurationError, match="'mine'"):
            gate.workflow("w", exclude=["mine"])

    def test_mandatory_interceptor_cannot_be_excluded(self, get_order: Tool[Any, Any]) -> None:
        """Excluding a mandatory interceptor at any inner scope is a ConfigurationError."""
        gate = Gate("g", interceptors=[Audit()])
        with pytest.raises(ConfigurationError, match=r"'audit'.*mandatory"):
            gate.workflow("w", exclude=["audit"])
        with pytest.raises(ConfigurationError, match="mandatory"):
            gate.agent("a", tools=[get_order], exclude=["audit"])

        @tool(exclude_interceptors=["audit"])
        def sneaky() -> str:
            return ""

        with pytest.raises(ConfigurationError, match="mandatory"):
            gate.agent("b", tools=[sneaky])

    def test_mandatory_from_decorator(self, get_order: Tool[Any, Any]) -> None:
        """The decorators accept mandatory=True."""
        guard = before_tool_call(name="guard", mandatory=True)(lambda call: None)
        with pytest.raises(ConfigurationError, match="mandatory"):
            Gate("g", interceptors=[guard]).agent("a", tools=[get_order], exclude=["guard"])

    def test_describe_lists_chains_and_excludes(self, get_order: Tool[Any, Any]) -> None:
        """describe() shows each tool's effective chain and what an inner scope excluded."""
        gate = Gate("g", interceptors=[Audit(), RecordingInterceptor("noisy")])
        gate.workflow("w").agent("a", tools=[get_order], exclude=["noisy"])
        agent = next(s for s in gate.describe() if s["scope"] == "agent")
        (entry,) = agent["tools"]
        assert [c["interceptor"] for c in entry["chain"]] == ["audit"]
        assert entry["excluded"] == [{"interceptor": "noisy", "scope": "application", "excluded_by": "a"}]
        assert agent["path"] == "g/w/a"


class TestDirectPath:
    async def test_invoke_uses_application_and_tool_scopes_only(self, effects: Effects) -> None:
        """gate.invoke meets the gate's and the tool's interceptors, nothing of any agent."""
        log: list[Any] = []
        app = RecordingInterceptor("app", log=log)
        own = RecordingInterceptor("own", log=log)
        agent_level = RecordingInterceptor("agent-level", log=log)

        @tool(interceptors=[own])
        def ping() -> str:
            return "pong"

        gate = Gate("g", interceptors=[app])
        gate.agent("a", tools=[ping], interceptors=[agent_level])
        result = await gate.invoke(ping, {})
        assert result.ok
        assert [(s.interceptor, s.phase) for s in log] == [
            ("app", "before"),
            ("own", "before"),
            ("own", "after"),
            ("app", "after"),
        ]

    async def test_invoke_checks_tool_excludes(self) -> None:
        """A tool excluding an unknown interceptor is refused on the direct path too."""

        @tool(exclude_interceptors=["ghost"])
        def ping() -> str:
            return "pong"

        with pytest.raises(ConfigurationError, match="'ghost'"):
            await Gate("g").invoke(ping, {})


class TestAddedInterceptors:
    async def test_added_interceptor_applies_to_existing_scopes(self, get_order: Tool[Any, Any]) -> None:
        """add_interceptor reaches scopes built before it; remove_interceptor takes it away."""
        gate = Gate("g")
        agent = gate.agent("a", tools=[get_order])
        deny = after_tool_call(name="late")(lambda call, output: output)
        stop = before_tool_call(name="stop", mandatory=True)(lambda call: Deny("drill"))
        gate.add_interceptor(stop, first=True)
        gate.add_interceptor(deny)
        assert (await agent.call("get_order", {"order_id": "A"})).kind == "denied"
        gate.remove_interceptor(stop)
        assert (await agent.call("get_order", {"order_id": "A"})).ok
        with pytest.raises(ConfigurationError):
            gate.remove_interceptor(stop)


class TestLoopIndependence:
    def test_one_gate_serves_many_event_loops_and_threads(self, get_order: Tool[Any, Any]) -> None:
        """A gate built outside any loop serves several asyncio.run calls, also from threads at once."""
        gate = Gate("g", interceptors=[RecordingInterceptor("r")])
        agent = gate.agent("a", tools=[get_order])

        async def some_calls(prefix: str) -> list[str]:
            results = await asyncio.gather(
                *(agent.call("get_order", {"order_id": f"{prefix}-{i}"}, run=RunContext()) for i in range(20))
            )
            return [r.value.order_id for r in results]

        assert asyncio.run(some_calls("first"))[0] == "first-0"
        assert asyncio.run(some_calls("second"))[-1] == "second-19"
        out: dict[int, list[str]] = {}

        def worker(n: int) -> None:
            out[n] = asyncio.run(some_calls(f"t{n}"))

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(out) == [0, 1, 2, 3]
        assert all(len(v) == 20 and v[0] == f"t{n}-0" for n, v in out.items())
