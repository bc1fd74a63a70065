"""Tools and runs the gate tests share."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, Field

from interceptor_core import RunContext, Tool, ToolContext, tool


class OrderQuery(BaseModel):
    order_id: str = Field(description="Order ID to inspect or refund")


class OrderRecord(BaseModel):
    order_id: str
    amount_cents: int
    internal_note: str


class Effects:
    """What the tool bodies did, so a test can prove a body ran or never ran."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]


@pytest.fixture
def effects() -> Effects:
    return Effects()


@pytest.fixture
def get_order(effects: Effects) -> Tool[Any, Any]:
    @tool(description="Loads an order record by ID", timeout_s=10)
    async def get_order(args: OrderQuery, ctx: ToolContext) -> OrderRecord:
        effects.calls.append(("get_order", args.order_id))
        return OrderRecord(order_id=args.order_id, amount_cents=4200, internal_note="vip")

    return get_order


@pytest.fixture
def refund(effects: Effects) -> Tool[Any, Any]:
    @tool
    def refund(order_id: str, amount_cents: int) -> str:
        """Refunds an order."""
        effects.calls.append(("refund", (order_id, amount_cents)))
        return f"refunded {amount_cents} on {order_id}"

    return refund


@pytest.fixture
def acme() -> RunContext:
    return RunContext(tenant="acme", principal="u-1")
