"""The chain, rule by rule, as DESIGN.md lists them."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from interceptor_core import (
    Allow,
    Block,
    Deny,
    Gate,
    Rewrite,
    RunContext,
    Substitute,
    Tool,
    ToolBlockedError,
    ToolCall,
    after_tool_call,
    before_tool_call,
)
from interceptor_core.testing import RecordingInterceptor, SeenCall

from .conftest import Effects, OrderQuery, OrderRecord


def desk_with(tool: Tool[Any, Any], *interceptors: object, **gate_options: Any) -> Any:
    return Gate("shop", interceptors=list(interceptors), **gate_options).agent("desk", tools=[tool])


class TestValidation:
    async def test_invalid_args_are_an_error_result_and_nothing_runs(
        self, get_order: Tool[Any, Any], effects: Effects
    ) -> None:
        """Invalid arguments: an error result carrying the validation message; no interceptor, no tool."""
        recorder = RecordingInterceptor()
        result = await desk_with(get_order, recorder).call("get_order", {"order": 42})
        assert result.kind == "error"
        assert "order_id: Field required" in (result.message or "")
        assert result.decided_by == "validation"
        assert recorder.calls == []
        assert effects.calls == []

    async def test_args_may_be_json_text_or_a_model(self, get_order: Tool[Any, Any]) -> None:
        """A model's raw JSON arguments and an input-model instance are accepted as they are."""
        desk = desk_with(get_order)
        from_json = await desk.call("get_order", '{"order_id": "A-1"}')
        from_model = await desk.call("get_order", OrderQuery(order_id="A-2"))
        assert (from_json.value.order_id, from_model.value.order_id) == ("A-1", "A-2")


class TestOrder:
    async def test_ten_layers_run_as_an_onion(self, effects: Effects) -> None:
        """Before: outer scope to inner, in registration order; after: exactly the reverse."""
        log: list[SeenCall] = []

        def rec(name: str) -> RecordingInterceptor:
            return RecordingInterceptor(name, log=log)

        from interceptor_core import tool

        @tool(interceptors=[rec("t1"), rec("t2")])
        def ping() -> str:
            effects.calls.append(("ping", None))
            return "pong"

        gate = Gate("g", interceptors=[rec("a1"), rec("a2"), rec("a3")])
        wf = gate.workflow("w", interceptors=[rec("w1"), rec("w2")])
        desk = wf.agent("d", tools=[ping], interceptors=[rec("d1"), rec("d2"), rec("d3")])
        result = await desk.call("ping", {})
        order = ["a1", "a2", "a3", "w1", "w2", "d1", "d2", "d3", "t1", "t2"]
        assert result.ok
        assert [s.interceptor for s in log if s.phase == "before"] == order
        assert [s.interceptor for s in log if s.phase == "after"] == order[::-1]
        assert [d.interceptor for d in result.decisions] == order + order[::-1]

    async def test_none_means_allow(self, get_order: Tool[Any, Any]) -> None:
        """An interceptor returning None lets the call through, recorded as allow."""
        result = await desk_with(get_order, before_tool_call(lambda call: None)).call("get_order", {"order_id": "A-1"})
        assert result.ok
        assert result.decisions[0].kind == "allow"


class TestRewrite:
    async def test_rewrite_is_seen_by_later_interceptors_and_the_tool(
        self, get_order: Tool[Any, Any], effects: Effects
    ) -> None:
        """Rewritten args replace the originals for every later interceptor and the tool."""
        upper = before_tool_call(lambda call: Rewrite({"order_id": call.args["order_id"].upper()}))
        later = RecordingInterceptor("later")
        result = await desk_with(get_order, upper, later).call("get_order", {"order_id": "acme-1"})
        assert later.calls[0].args == {"order_id": "ACME-1"}
        assert effects.calls == [("get_order", "ACME-1")]
        assert result.value.order_id == "ACME-1"

    async def test_rewrite_never_switches_off_a_later_deny(self, get_order: Tool[Any, Any], effects: Effects) -> None:
        """A rewrite continues the chain: a later deny still ends it."""
        rewrite = before_tool_call(lambda call: Rewrite({"order_id": "SAFE-1"}))
        deny = before_tool_call(lambda call: Deny("no orders today"))
        result = await desk_with(get_order, rewrite, deny).call("get_order", {"order_id": "X-1"})
        assert (result.kind, result.message) == ("denied", "no orders today")
        assert effects.calls == []

    async def test_rewrite_is_validated_again(self, get_order: Tool[Any, Any], effects: Effects) -> None:
        """Rewritten args that fail the input model fail closed, naming the interceptor."""
        broken = before_tool_call(name="breaker")(lambda call: Rewrite({"order_id": None}))
        result = await desk_with(get_order, broken).call("get_order", {"order_id": "X-1"})
        assert result.kind == "denied"
        assert result.decided_by == "breaker"
        assert "invalid" in (result.decisions[0].error or "")
        assert effects.calls == []

    async def test_rewrite_with_a_model_instance(self, get_order: Tool[Any, Any], effects: Effects) -> None:
        """A rewrite may hand over an instance of the input model."""
        swap = before_tool_call(lambda call: Rewrite(OrderQuery(order_id="M-1")))
        await desk_with(get_order, swap).call("get_order", {"order_id": "X-1"})
        assert effects.calls == [("get_order", "M-1")]

    async def test_args_cannot_be_changed_in_place(self, get_order: Tool[Any, Any], effects: Effects) -> None:
        """call.args is read-only: mutating it fails closed and the tool never sees the change."""

        def sneaky(call: ToolCall) -> None:
            call.args["order_id"] = "OTHER-1"  # type: ignore[index]

        result = await desk_with(get_order, before_tool_call(sneaky)).call("get_order", {"order_id": "X-1"})
        assert result.kind == "denied"
        assert effects.calls == []


class TestTerminalDecisions:
    async def test_deny_ends_the_chain(self, get_order: Tool[Any, Any], effects: Effects) -> None:
        """Deny: later interceptors and the tool never run; the model reads the deny message."""
        later = RecordingInterceptor("later")
        result = await desk_with(get_order, before_tool_call(lambda c: Deny("not yours")), later).call(
            "get_order", {"order_id": "X-1"}
        )
        assert result.kind == "denied"
        assert result.to_model_text() == "not yours"
        assert later.calls == []
        assert effects.calls == []

    async def test_substitute_skips_the_tool_but_not_after_interceptors(
        self, get_order: Tool[Any, Any], effects: Effects
    ) -> None:
        """Substitute: the tool does not run, after-interceptors transform the synthetic result."""
        cached = OrderRecord(order_id="C-1", amount_cents=1, internal_note="secret")
        sub = before_tool_call(name="cache")(lambda c: Substitute(cached))
        redact = after_tool_call(lambda c, out: out.model_copy(update={"internal_note": "[REDACTED]"}))
        later = RecordingInterceptor("later", after=False)
        result = await desk_with(get_order, redact, sub, later).call("get_order", {"order_id": "X-1"})
        assert result.kind == "substituted"
        assert result.decided_by == "cache"
        assert result.value.internal_note == "[REDACTED]"
        assert later.calls == []
        assert effects.calls == []

    async def test_substitute_that_does_not_fit_the_output_type_is_an_error(self, get_order: Tool[Any, Any]) -> None:
        """A synthetic result is held to the tool's declared output type like a real one."""
        sub = before_tool_call(name="cache")(lambda c: Substitute(12))
        result = await desk_with(get_order, sub).call("get_order", {"order_id": "X-1"})
        assert result.kind == "error"
        assert "substitute from 'cache'" in (result.message or "")

    async def test_block_raises_and_the_next_call_is_mediated_as_usual(
        self, get_order: Tool[Any, Any], effects: Effects, acme: RunContext
    ) -> None:
        """Block raises ToolBlockedError naming tool, call and interceptor; the gate keeps no run state."""
        calls = 0

        @before_tool_call(name="tripwire")
        def tripwire(call: ToolCall) -> Block | None:
            nonlocal calls
            calls += 1
            return Block("injection detected") if calls == 1 else None

        desk = desk_with(get_order, tripwire)
        with pytest.raises(ToolBlockedError) as caught:
            await desk.call("get_order", {"order_id": "X-1"}, run=acme, call_id="call-1")
        assert (caught.value.tool, caught.value.call_id, caught.value.interceptor) == (
            "get_order",
            "call-1",
            "tripwire",
        )
        assert caught.value.reason == "injection detected"
        assert effects.calls == []
        again = await desk.call("get_order", {"order_id": "X-1"}, run=acme)
        assert again.ok


class TestFailClosed:
    async def test_raising_interceptor_denies(self, get_order: Tool[Any, Any], effects: Effects) -> None:
        """An interceptor that raises denies the call (default), without leaking its error to the model."""

        @before_tool_call(name="flaky")
        def flaky(call: ToolCall) -> None:
            raise RuntimeError("database password=hunter2 unreachable")

        result = await desk_with(get_order, flaky).call("get_order", {"order_id": "X-1"})
        assert result.kind == "denied"
        assert result.decided_by == "flaky"
        assert "hunter2" not in result.to_model_text()
        assert "RuntimeError" in (result.decisions[0].error or "")
        assert effects.calls == []

    async def test_block_mode_stops_the_run(self, get_order: Tool[Any, Any], effects: Effects) -> None:
        """With on_interceptor_error="block", a failing interceptor raises ToolBlockedError."""
        flaky = before_tool_call(name="flaky")(lambda call: 1 / 0)
        with pytest.raises(ToolBlockedError, match="flaky"):
            await desk_with(get_order, flaky, on_interceptor_error="block").call("get_order", {"order_id": "X-1"})
        assert effects.calls == []

    async def test_non_decision_return_fails_closed(self, get_order: Tool[Any, Any], effects: Effects) -> None:
        """Returning something that is not a decision (here: True) denies the call."""
        truthy = before_tool_call(name="truthy")(lambda call: True)
        result = await desk_with(get_order, truthy).call("get_order", {"order_id": "X-1"})
        assert result.kind == "denied"
        assert "not a decision" in (result.decisions[0].error or "")
        assert effects.calls == []

    async def test_async_interceptor_past_its_timeout_fails_closed(
        self, get_order: Tool[Any, Any], effects: Effects
    ) -> None:
        """An async interceptor that never answers is cut at interceptor_timeout_s and denies."""
        never = asyncio.Event()

        @before_tool_call(name="stuck")
        async def stuck(call: ToolCall) -> None:
            await never.wait()

        result = await desk_with(get_order, stuck, interceptor_timeout_s=0.05).call("get_order", {"order_id": "X-1"})
        assert result.kind == "denied"
        assert "interceptor_timeout_s" in (result.decisions[0].error or "")
        assert effects.calls == []

    async def test_sync_interceptor_past_its_timeout_fails_closed(
        self, get_order: Tool[Any, Any], effects: Effects, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A sync interceptor cannot be cut, but one that ran too long still fails closed (fake clock)."""
        now = [100.0]
        monkeypatch.setattr("interceptor_core.gate._perf", lambda: now[0])

        @before_tool_call(name="slow")
        def slow(call: ToolCall) -> Allow:
            now[0] += 6.0
            return Allow()

        result = await desk_with(get_order, slow, interceptor_timeout_s=5.0).call("get_order", {"order_id": "X-1"})
        assert result.kind == "denied"
        assert "past interceptor_timeout_s" in (result.decisions[0].error or "")
        assert effects.calls == []

    async def test_async_interceptor_that_suspends_still_decides(self, get_order: Tool[Any, Any]) -> None:
        """An async interceptor that really waits (here on a ready event) is awaited to its decision."""
        ready = asyncio.Event()
        ready.set()

        @before_tool_call
        async def waits(call: ToolCall) -> Deny:
            await asyncio.sleep(0)
            await ready.wait()
            return Deny("decided after waiting")

        result = await desk_with(get_order, waits).call("get_order", {"order_id": "X-1"})
        assert result.message == "decided after waiting"


class TestAfterInterceptors:
    async def test_failing_after_interceptor_withholds_the_output(self, get_order: Tool[Any, Any]) -> None:
        """An after-interceptor that raises yields an error result, never the untransformed output."""

        @after_tool_call(name="redactor")
        def redactor(call: ToolCall, output: Any) -> Any:
            raise ValueError("cannot redact")

        result = await desk_with(get_order, redactor).call("get_order", {"order_id": "X-1"})
        assert result.kind == "error"
        assert result.value is None
        assert "vip" not in result.to_model_text()
        assert "redactor" in (result.message or "")

    async def test_after_interceptor_returning_none_withholds_the_output(self, get_order: Tool[Any, Any]) -> None:
        """Forgetting to return the output is a failure, not an empty result."""
        forgetful = after_tool_call(name="forgetful")(lambda call, output: None)
        result = await desk_with(get_order, forgetful).call("get_order", {"order_id": "X-1"})
        assert result.kind == "error"
        assert "forgetful" in (result.message or "")

    async def test_after_interceptors_do_not_run_on_errors(self) -> None:
        """A tool error comes back as is; there is no output for after-interceptors to see."""
        from interceptor_core import tool

        @tool
        def broken() -> str:
            raise KeyError("gone")

        seen = RecordingInterceptor("after-only")
        result = await Gate("g", interceptors=[seen]).invoke(broken, {})
        assert result.kind == "error"
        assert [s.phase for s in seen.calls] == ["before"]

    async def test_async_after_interceptor_transforms(self, get_order: Tool[Any, Any]) -> None:
        """An async after-interceptor's return value is the new output."""

        @after_tool_call
        async def mask(call: ToolCall, output: Any) -> Any:
            return output.model_copy(update={"internal_note": "***"})

        result = await desk_with(get_order, mask).call("get_order", {"order_id": "X-1"})
        assert result.value.internal_note == "***"


class TestResults:
    async def test_model_text_per_kind(self, get_order: Tool[Any, Any]) -> None:
        """to_model_text: JSON for values, 'Tool error: ...' for errors, the message for denials."""
        desk = desk_with(
            get_order, before_tool_call(lambda c: Deny("ask a human") if c.args["order_id"] == "D" else None)
        )
        ok = await desk.call("get_order", {"order_id": "A-1"})
        denied = await desk.call("get_order", {"order_id": "D"})
        error = await desk.call("get_order", {})
        assert ok.to_model_text() == '{"order_id":"A-1","amount_cents":4200,"internal_note":"vip"}'
        assert denied.to_model_text() == "ask a human"
        assert error.to_model_text().startswith("Tool error: Invalid arguments for tool get_order")

    async def test_unknown_tool_is_an_error_result(self, get_order: Tool[Any, Any]) -> None:
        """A model asking for a tool the scope lacks gets an error naming the tools it has."""
        result = await desk_with(get_order).call("delete_everything", {})
        assert result.kind == "error"
        assert "get_order" in (result.message or "")

    async def test_decision_trail_records_scope_kind_and_duration(self, get_order: Tool[Any, Any]) -> None:
        """Each step of the trail names the interceptor, its scope, the decision and a duration."""
        result = await desk_with(get_order, RecordingInterceptor("r", after=False)).call(
            "get_order", {"order_id": "A-1"}
        )
        (step,) = result.decisions
        assert (step.interceptor, step.scope, step.kind, step.phase) == ("r", "application", "allow", "before")
        assert step.duration_s >= 0
