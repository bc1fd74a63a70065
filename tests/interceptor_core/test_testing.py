"""interceptor_core.testing: checking one interceptor without a gate."""

from __future__ import annotations

from typing import Any

import pytest

from interceptor_core import Allow, ConfigurationError, Deny, RunContext, Tool, ToolCall
from interceptor_core.testing import RecordingInterceptor, check_after, check_before, make_call

from .conftest import OrderRecord


class TenantOrders:
    name = "tenant-orders"

    async def before_tool_call(self, call: ToolCall) -> Deny | Allow:
        if not call.args["order_id"].startswith((call.run.tenant or "").upper() + "-"):
            return Deny(f"Order {call.args['order_id']} does not belong to tenant {call.run.tenant}.")
        return Allow()

    def after_tool_call(self, call: ToolCall, output: OrderRecord) -> OrderRecord:
        return output.model_copy(update={"internal_note": "[REDACTED]"})


class TestCheckOneInterceptor:
    async def test_check_before_returns_the_decision(self, get_order: Tool[Any, Any], acme: RunContext) -> None:
        """check_before runs the handler as the gate would and returns its decision."""
        assert await check_before(TenantOrders(), get_order, {"order_id": "ACME-1"}, run=acme) == Allow()
        denied = await check_before(TenantOrders(), get_order, {"order_id": "GLOBEX-1"}, run=acme)
        assert denied == Deny("Order GLOBEX-1 does not belong to tenant acme.")

    async def test_check_after_returns_the_output(self, get_order: Tool[Any, Any]) -> None:
        """check_after returns the transformed output."""
        output = OrderRecord(order_id="A-1", amount_cents=1, internal_note="vip")
        redacted = await check_after(TenantOrders(), get_order, {"order_id": "A-1"}, output)
        assert redacted.internal_note == "[REDACTED]"

    async def test_missing_handler_is_named(self, get_order: Tool[Any, Any]) -> None:
        """Asking for a handler the interceptor lacks is a ConfigurationError."""
        with pytest.raises(ConfigurationError, match="no after_tool_call"):
            await check_after(RecordingInterceptor(after=False), get_order, {"order_id": "A"}, None)

    def test_make_call_validates_args(self, get_order: Tool[Any, Any]) -> None:
        """make_call builds the ToolCall an interceptor gets, args validated and read-only."""
        call = make_call(get_order, {"order_id": "A-1"}, agent="desk")
        assert call.args == {"order_id": "A-1"}
        assert str(call.scope) == "test/desk/get_order"
        with pytest.raises(TypeError):
            call.args["order_id"] = "B"  # type: ignore[index]


class TestRecordingInterceptor:
    async def test_records_and_returns_the_chosen_decision(self, get_order: Tool[Any, Any]) -> None:
        """The recorder logs what it saw and answers with its configured decision."""
        recorder = RecordingInterceptor("rec", decision=Deny("stop"))
        assert await check_before(recorder, get_order, {"order_id": "A-1"}) == Deny("stop")
        (seen,) = recorder.calls
        assert (seen.phase, seen.tool, seen.args) == ("before", "get_order", {"order_id": "A-1"})
