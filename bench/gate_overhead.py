"""Per-call cost of the gate, as ratios to floors measured in the same run.

    python bench/gate_overhead.py [--calls N] [--rounds R]

Rows: `desk.call` with three allowing interceptors and no sinks, against the floor (validate the
input model, call the same tool, validate its output). Rounds of the two alternate, so machine
noise hits both alike; medians of the per-round means are reported. The last line is the figure.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import BaseModel, Field, TypeAdapter

from interceptor_core import Allow, Gate, RunContext, ToolCall, tool


class OrderQuery(BaseModel):
    order_id: str = Field(description="Order ID to inspect")
    include_items: bool = False


class OrderRecord(BaseModel):
    order_id: str
    amount_cents: int
    status: str


async def _get_order(args: OrderQuery) -> OrderRecord:
    return OrderRecord(order_id=args.order_id, amount_cents=4200, status="shipped")


get_order = tool(_get_order, name="get_order", description="Loads an order record by ID")


class AllowTenant:
    """An allowing async interceptor that reads the call, like a real policy would."""

    def __init__(self, name: str) -> None:
        self.name = name

    async def before_tool_call(self, call: ToolCall) -> Allow:
        if call.run.tenant is None:
            raise RuntimeError("no tenant")
        return Allow()


class AllowTenantSync(AllowTenant):
    """The same check as a plain function."""

    def before_tool_call(self, call: ToolCall) -> Allow:  # type: ignore[override]
        if call.run.tenant is None:
            raise RuntimeError("no tenant")
        return Allow()


ARGS = {"order_id": "ACME-42", "include_items": False}


def build_gate(kind: type[AllowTenant] = AllowTenant, count: int = 3) -> Any:
    """`desk` with `count` (0 to 3) allowing interceptors, one per scope level."""
    made = [[kind(name)] if i < count else [] for i, name in enumerate("abc")]
    gate = Gate("bench", interceptors=made[0])
    wf = gate.workflow("support", interceptors=made[1])
    return wf.agent("desk", tools=[get_order], interceptors=made[2])


async def measure(fn: Callable[[], Awaitable[Any]], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        await fn()
    return (time.perf_counter() - start) / calls


ROWS = {
    "floor": "floor (validate in + call + validate out)",
    "gate": "desk.call, 3 allowing async interceptors",
    "gate_sync": "desk.call, 3 allowing sync interceptors",
    "gate_bare": "desk.call, no interceptors",
}


async def run(calls: int, rounds: int) -> dict[str, list[float]]:
    run_ctx = RunContext(tenant="acme", principal="u-1")
    out_adapter = TypeAdapter(OrderRecord)

    async def floor() -> Any:
        args = OrderQuery.model_validate(ARGS)
        return out_adapter.validate_python(await _get_order(args))

    def gated(desk: Any) -> Callable[[], Awaitable[Any]]:
        async def call() -> Any:
            return await desk.call("get_order", ARGS, run=run_ctx)

        return call

    paths: dict[str, Callable[[], Awaitable[Any]]] = {
        "floor": floor,
        "gate": gated(build_gate(AllowTenant)),
        "gate_sync": gated(build_gate(AllowTenantSync)),
        "gate_bare": gated(build_gate(count=0)),
    }
    for key, fn in paths.items():
        result = await fn()
        if key != "floor" and not result.ok:
            raise SystemExit(f"bench setup is wrong: {result}")
        await measure(fn, calls // 5 or 1)  # warm-up
    samples: dict[str, list[float]] = {key: [] for key in paths}
    for _ in range(rounds):
        for key, fn in paths.items():
            samples[key].append(await measure(fn, calls))
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=15)
    opts = parser.parse_args()
    samples = asyncio.run(run(opts.calls, opts.rounds))
    floor = statistics.median(samples["floor"])
    print(f"{'path':<44} {'median µs/call':>15} {'ratio to floor':>15}")
    for key, label in ROWS.items():
        med = statistics.median(samples[key])
        print(f"{label:<44} {med * 1e6:>15.2f} {med / floor:>15.2f}")
    ratio = statistics.median(samples["gate"]) / floor
    print(f"gate overhead: desk.call (3 async interceptors) / floor = {ratio:.2f} (target <= 2.0)")


if __name__ == "__main__":
    main()
