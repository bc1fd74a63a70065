"""Coverage at run time: guarded clients and the coverage report."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from interceptor_core import CoverageError, Gate, UnmediatedAccessError, tool


class Payments:
    def __init__(self) -> None:
        self.refunds: list[str] = []
        self.region = "eu"

    def refund(self, order_id: str) -> str:
        self.refunds.append(order_id)
        return "re_1"


def wired() -> tuple[Gate, Payments, Any, Any]:
    gate = Gate("shop")
    payments = Payments()
    guarded = gate.guard(payments, name="payments", tools=["refund"])

    @tool
    def refund(order_id: str) -> str:
        return guarded.refund(order_id)

    @tool
    async def lookup(order_id: str) -> str:
        return guarded.region  # not a tool the client is bound to

    agent = gate.agent("desk", tools=[refund, lookup])
    return gate, payments, guarded, agent


class TestGuard:
    async def test_mediated_use_is_allowed(self) -> None:
        """Inside a mediated call of a bound tool the client works (here from a worker thread)."""
        gate, payments, _, agent = wired()
        result = await agent.call("refund", {"order_id": "A-1"})
        assert result.ok
        assert payments.refunds == ["A-1"]
        assert gate.coverage().unmediated == ()

    def test_use_outside_the_gate_raises_and_is_recorded(self) -> None:
        """A direct use raises UnmediatedAccessError and coverage lists resource, attribute and site."""
        gate, payments, guarded, _ = wired()
        with pytest.raises(UnmediatedAccessError) as caught:
            guarded.refund("A-1")
        assert payments.refunds == []
        assert caught.value.resource == "payments"
        (access,) = gate.coverage().unmediated
        assert (access.resource, access.attribute, access.tools) == ("payments", "refund", ("refund",))
        assert access.site.startswith(__file__)
        assert access.active_tool is None

    async def test_use_from_another_tool_is_unmediated(self) -> None:
        """A tool the client is not bound to cannot reach it, even inside its own mediated call."""
        gate, _, _, agent = wired()
        result = await agent.call("lookup", {"order_id": "A-1"})
        assert result.kind == "error"
        assert "UnmediatedAccessError" in (result.message or "")
        (access,) = gate.coverage().unmediated
        assert access.active_tool == "lookup"

    async def test_parallel_calls_each_see_their_own_context(self) -> None:
        """Concurrent mediated and unmediated calls are told apart (a context variable, not a flag)."""
        gate, payments, _, agent = wired()
        results = await asyncio.gather(
            *(agent.call("refund" if i % 2 else "lookup", {"order_id": f"A-{i}"}) for i in range(20))
        )
        assert [r.kind for r in results] == ["error", "ok"] * 10
        assert len(payments.refunds) == 10
        assert len(gate.coverage().unmediated) == 10

    async def test_a_method_kept_from_inside_a_call_is_checked_when_used_later(self) -> None:
        """A bound method fetched during a mediated call cannot be used after it."""
        gate = Gate("g")
        payments = Payments()
        guarded = gate.guard(payments, name="payments", tools=["grab"])
        kept: list[Any] = []

        @tool
        def grab() -> str:
            kept.append(guarded.refund)
            return "ok"

        await gate.invoke(grab, {})
        with pytest.raises(UnmediatedAccessError):
            kept[0]("A-1")
        assert payments.refunds == []

    async def test_another_gates_mediation_does_not_count(self) -> None:
        """A guard accepts only calls mediated by its own gate."""
        mine, other = Gate("mine"), Gate("other")
        guarded = mine.guard(Payments(), name="payments", tools=["refund"])

        @tool
        def refund(order_id: str) -> str:
            return guarded.refund(order_id)

        result = await other.invoke(refund, {"order_id": "A-1"})
        assert result.kind == "error"
        assert len(mine.coverage().unmediated) == 1

    def test_guard_covers_calls_items_and_context_managers(self) -> None:
        """Calling the object, indexing it and entering it are all checked."""
        gate = Gate("g")
        entered: list[str] = []

        class Session:
            def __enter__(self) -> Session:
                entered.append("entered")
                return self

            def __exit__(self, *exc: object) -> None:
                return None

        for obj, use in (
            (lambda: 1, lambda g: g()),
            ({"k": 1}, lambda g: g["k"]),
            (Session(), lambda g: g.__enter__()),
        ):
            guarded = gate.guard(obj, name="thing", tools=["t"])
            with pytest.raises(UnmediatedAccessError):
                use(guarded)
        assert entered == []
        assert len(gate.coverage().unmediated) == 3


class TestCoverageReport:
    async def test_report_lists_registered_and_exercised_tools(self) -> None:
        """coverage() knows every registered tool and which were called through the gate."""
        gate, _, _, agent = wired()
        await agent.call("refund", {"order_id": "A-1"})
        report = gate.coverage()
        assert report.registered == {"refund", "lookup"}
        assert report.exercised == {"refund"}
        assert report.never_exercised == {"lookup"}
        assert report.ok
        assert not gate.coverage(require_exercised=True).ok

    def test_assert_coverage_raises_with_the_report(self) -> None:
        """assert_coverage raises CoverageError carrying the report after an unmediated access."""
        gate, _, guarded, _ = wired()
        gate.assert_coverage()
        with pytest.raises(UnmediatedAccessError):
            guarded.refund("A-1")
        with pytest.raises(CoverageError) as caught:
            gate.assert_coverage()
        assert "payments.refund" in str(caught.value)
        assert len(caught.value.report.unmediated) == 1

    async def test_require_exercised_names_the_tools_never_called(self) -> None:
        """With require_exercised, a registered tool nobody called fails the assertion by name."""
        gate, _, _, agent = wired()
        await agent.call("refund", {"order_id": "A-1"})
        with pytest.raises(CoverageError, match="never called through the gate: lookup"):
            gate.assert_coverage(require_exercised=True)
