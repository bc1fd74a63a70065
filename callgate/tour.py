"""`callgate demo`: the support desk, call by call, with the decision each call met."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from callgate.demo import POLICY_FILE, build_desk
from interceptor_core import RunContext, ToolBlockedError, UnmediatedAccessError

CALLS: list[tuple[str, str, dict[str, Any]]] = [
    ("acme", "get_order", {"order_id": "ACME-42"}),
    ("acme", "get_order", {"order_id": "acme-7"}),
    ("acme", "get_order", {"order_id": "GLOBEX-9"}),
    ("acme", "get_order", {"order_id": "ACME-1"}),
    ("acme", "get_order", {"order": "ACME-42"}),
    ("acme", "refund", {"order_id": "ACME-42", "amount_cents": 1200}),
    ("acme", "refund", {"order_id": "ACME-7", "amount_cents": 25000}),
    ("acme", "refund", {"order_id": "ACME-7", "amount_cents": 90000}),
    ("acme", "run_sql", {"query": "select status from orders"}),
    ("acme", "fetch_url", {"url": "https://docs.shop.example/returns"}),
    ("acme", "fetch_url", {"url": "https://docs.shop.example@evil.example/returns"}),
    ("acme", "run_sql", {"query": "select 1; /* tidy up */ DROP TABLE orders"}),
]


async def run_tour(console: Console) -> bool:
    """Run every call of `CALLS`, print a table and the coverage report; True when coverage holds."""
    wired = build_desk()
    console.print(f"policy file: {POLICY_FILE} (check it: callgate policy check {POLICY_FILE})", markup=False)
    table = Table(title="support desk (tenant acme) through the gate")
    for column in ("tool", "args", "outcome", "decided by", "what the model reads"):
        table.add_column(column, overflow="fold")
    for tenant, tool_name, args in CALLS:
        run = RunContext(tenant=tenant, principal=f"agent@{tenant}")
        try:
            result = await wired.desk.call(tool_name, args, run=run)
            outcome, decided_by, text = result.kind, result.decided_by or "", result.to_model_text()
            # A policy file names the rule that decided: desk-policy (tenant-orders).
            rules = [rule for step in result.decisions if step.interceptor == decided_by for rule, _ in step.rules]
            if rules:
                decided_by += f" ({', '.join(rules)})"
        except ToolBlockedError as exc:
            outcome, decided_by, text = "blocked", exc.interceptor or "", f"(run stopped) {exc.reason}"
        table.add_row(tool_name, str(args), outcome, decided_by, text if len(text) <= 90 else text[:90] + "…")
    console.print(table)

    console.print(f"payments client effects: {wired.payments.refunds}")
    try:
        # A code path that goes around the gate: the guard refuses it and coverage records it.
        wired.guarded_payments.refund("ACME-42", 1, idempotency_key="outside")
    except UnmediatedAccessError as exc:
        console.print(f"[yellow]a direct use of the payments client is refused:[/yellow] {exc.message}")
    report = wired.gate.coverage()
    console.print(report.summary())
    # The tour goes around the gate on purpose once; coverage must have caught exactly that.
    return len(report.unmediated) == 1 and report.exercised == report.registered
