"""The support-desk example: a gate with every kind of decision, used by `callgate demo`, the
README's tour and `callgate describe callgate.demo:build_gate`.

Tenants' orders carry the tenant as prefix ("ACME-42"); refunds go through a guarded payments
client; lookups of archived orders are answered from a cache. The tenant, refund, SQL and URL
rules come from a policy file next to this module (`support_desk.policy.yaml`): another tenant's
order is refused, refunds above 200.00 need a reviewer, SQL that writes stops the run, pages come
only from the shop's own hosts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from interceptor_core import (
    AgentScope,
    Approval,
    ApprovalRequest,
    Gate,
    Rewrite,
    Substitute,
    ToolCall,
    ToolContext,
    tool,
)
from interceptor_core.policy import Policy, load_policy


class OrderQuery(BaseModel):
    order_id: str = Field(description="Order ID to inspect, e.g. ACME-42")


class OrderRecord(BaseModel):
    order_id: str
    amount_cents: int
    status: str
    internal_note: str


class RefundRequest(BaseModel):
    order_id: str = Field(description="Order ID to refund")
    amount_cents: int = Field(gt=0, description="Amount to refund, in cents")


@dataclass
class PaymentsClient:
    """Stands in for a payment provider's SDK: it has effects, so the gate guards it."""

    refunds: list[tuple[str, int, str]] = field(default_factory=list)

    def refund(self, order_id: str, amount_cents: int, idempotency_key: str) -> str:
        self.refunds.append((order_id, amount_cents, idempotency_key))
        return f"re_{len(self.refunds):04d}"


ORDERS = {
    "ACME-42": OrderRecord(
        order_id="ACME-42", amount_cents=4200, status="shipped", internal_note="VIP, fraud check ok"
    ),
    "ACME-7": OrderRecord(order_id="ACME-7", amount_cents=25000, status="delivered", internal_note="repeat buyer"),
    "GLOBEX-9": OrderRecord(order_id="GLOBEX-9", amount_cents=990, status="shipped", internal_note="none"),
}
ARCHIVED = {"ACME-1": "Order ACME-1 is archived; it was delivered in 2019 and cannot be changed."}


POLICY_FILE = Path(__file__).with_name("support_desk.policy.yaml")
"""The desk's tenant, refund, SQL and URL rules, as a policy file shipped with the package."""


def desk_policy(**options: Any) -> Policy:
    """The desk's policy file, loaded (options as for `load_policy`)."""
    return load_policy(POLICY_FILE, **options)


class InternalNotes:
    """Internal notes never leave the tool: a rule on the output, kept in Python."""

    name = "internal-notes"
    mandatory = True

    def after_tool_call(self, call: ToolCall, output: Any) -> Any:
        if isinstance(output, OrderRecord):
            return output.model_copy(update={"internal_note": "[REDACTED]"})
        return output


class NormalizeOrderId:
    """Order IDs are upper-case; a model that writes "acme-42" gets its arguments rewritten."""

    name = "normalize-order-id"

    def before_tool_call(self, call: ToolCall) -> Rewrite | None:
        order_id = call.args.get("order_id")
        if isinstance(order_id, str) and order_id != order_id.upper():
            return Rewrite({**call.args, "order_id": order_id.upper()})
        return None


class ArchivedOrders:
    """Archived orders are answered from the archive, without touching the live system."""

    name = "archived-orders"

    def before_tool_call(self, call: ToolCall) -> Substitute | None:
        note = ARCHIVED.get(str(call.args.get("order_id")))
        return Substitute(note) if note else None


async def reviewer(request: ApprovalRequest) -> Approval:
    """A simulated reviewer: approves refunds up to 500.00, refuses above."""
    amount = int(request.args["amount_cents"])
    if amount <= 50_000:
        return Approval(approved=True, by="reviewer@acme.example", note="within goodwill budget")
    return Approval(approved=False, by="reviewer@acme.example", note="too large; escalate to finance")


@dataclass
class SupportDesk:
    """The wired example: the gate, its agent scope, and the payments client the tools use."""

    gate: Gate
    desk: AgentScope
    payments: PaymentsClient
    guarded_payments: Any
    """The guarded proxy the `refund` tool uses; any use outside a mediated `refund` is refused."""


def build_desk(**gate_options: Any) -> SupportDesk:
    """Build the example gate, a `support` workflow and its `desk` agent."""
    payments = PaymentsClient()
    gate = Gate(
        "shop",
        interceptors=[NormalizeOrderId(), desk_policy(), InternalNotes()],
        approval_handler=reviewer,
        **gate_options,
    )
    guarded = gate.guard(payments, name="payments", tools=["refund"])

    @tool(description="Loads an order record by ID", timeout_s=10, interceptors=[ArchivedOrders()])
    async def get_order(args: OrderQuery) -> OrderRecord | str:
        if args.order_id not in ORDERS:
            raise LookupError(f"no order {args.order_id}")
        return ORDERS[args.order_id]

    @tool(description="Refunds part or all of an order")
    def refund(args: RefundRequest, ctx: ToolContext) -> str:
        refund_id: str = guarded.refund(args.order_id, args.amount_cents, idempotency_key=ctx.call_id)
        return f"Refunded {args.amount_cents / 100:.2f} on {args.order_id} ({refund_id})."

    @tool(description="Runs a read-only SQL query against the orders database")
    async def run_sql(query: str) -> list[dict[str, Any]]:
        return [{"order_id": o.order_id, "status": o.status} for o in ORDERS.values()]

    @tool(description="Fetches a page of the shop's documentation", timeout_s=5)
    async def fetch_url(url: str) -> str:
        return "Return policy: 30 days from delivery; refunds go back to the original payment method."

    workflow = gate.workflow("support")
    desk = workflow.agent("desk", tools=[get_order, refund, run_sql, fetch_url])
    return SupportDesk(gate=gate, desk=desk, payments=payments, guarded_payments=guarded)


def build_gate() -> Gate:
    """The example gate alone (for `callgate describe callgate.demo:build_gate`)."""
    return build_desk().gate
