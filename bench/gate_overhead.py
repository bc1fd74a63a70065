"""Per-call cost of the gate, as ratios to floors measured in the same run.

    python bench/gate_overhead.py [--calls N] [--rounds R]

Every path is a coroutine awaited N times in a loop; rounds of all paths alternate, so machine
noise hits them alike; medians of the per-round means are reported.

- gate: `desk.call` with three allowing interceptors and no sinks, against the floor (validate
  the input model, call the same tool, validate its output).
- events: the same call with a `MemorySink` (events built, redacted, chained), against a floor that
  does the minimum an auditing gate must do: validate input, call, build one event of the same
  size, serialize it canonically and SHA-256 it.
- OpenTelemetry: the extra per-call cost of adding `OtelSink` next to the `MemorySink`, as a ratio
  to one bare SDK span (`start_as_current_span` + end) on the same tracer provider.

The last lines are the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import statistics
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from figures import report
from opentelemetry.sdk.trace import TracerProvider
from pydantic import BaseModel, Field, TypeAdapter

from events import MemorySink, ToolUseEvent, canonical_json
from events.otel import OtelSink
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
RUN = RunContext(tenant="acme", principal="u-1")


def build_desk(kind: type[AllowTenant] = AllowTenant, count: int = 3, sinks: list[object] | None = None) -> Any:
    """`desk` with `count` (0 to 3) allowing interceptors, one per scope level."""
    made = [[kind(name)] if i < count else [] for i, name in enumerate("abc")]
    gate = Gate("bench", interceptors=made[0], sinks=sinks or [])
    wf = gate.workflow("support", interceptors=made[1])
    return wf.agent("desk", tools=[get_order], interceptors=made[2])


async def measure(fn: Callable[[], Awaitable[Any]], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        await fn()
    return (time.perf_counter() - start) / calls


def gated(desk: Any, after: Callable[[], None] | None = None) -> Callable[[], Awaitable[Any]]:
    async def call() -> Any:
        result = await desk.call("get_order", ARGS, run=RUN)
        if after is not None:
            after()
        return result

    return call


def build_paths() -> tuple[dict[str, Callable[[], Awaitable[Any]]], TracerProvider]:
    out_adapter = TypeAdapter(OrderRecord)
    provider = TracerProvider()  # no processors: the span's own cost, nothing exported
    tracer = provider.get_tracer("bench")
    memory, memory_otel = MemorySink(), MemorySink()

    async def floor() -> Any:
        args = OrderQuery.model_validate(ARGS)
        return out_adapter.validate_python(await _get_order(args))

    async def audit_floor() -> Any:
        args = OrderQuery.model_validate(ARGS)
        output = out_adapter.validate_python(await _get_order(args))
        event = ToolUseEvent(
            event_id="e" * 32,
            time=datetime.now(UTC),
            producer_id="p" * 32,
            seq=1,
            prev_hash="0" * 64,
            gate="bench",
            workflow="support",
            agent="desk",
            tool="get_order",
            call_id="c" * 32,
            run_id=RUN.run_id,
            tenant=RUN.tenant,
            principal=RUN.principal,
            decisions=[
                {"interceptor": n, "scope": "application", "kind": "allow", "duration_ms": 0.001} for n in "abc"
            ],
            args=args.model_dump(mode="json"),
            outcome="ok",
            duration_ms=0.01,
            output_digest="d" * 64,
        )
        data = event.model_dump(mode="json")
        del data["hash"]
        hashlib.sha256(canonical_json(data)).hexdigest()
        return output

    async def bare_span() -> None:
        with tracer.start_as_current_span("execute_tool get_order"):
            pass

    paths: dict[str, Callable[[], Awaitable[Any]]] = {
        "floor": floor,
        "gate": gated(build_desk(AllowTenant)),
        "gate_sync": gated(build_desk(AllowTenantSync)),
        "gate_bare": gated(build_desk(count=0)),
        "audit_floor": audit_floor,
        "gate_memory": gated(build_desk(sinks=[memory]), memory.clear),
        "gate_memory_otel": gated(build_desk(sinks=[OtelSink(provider), memory_otel]), memory_otel.clear),
        "bare_span": bare_span,
    }
    return paths, provider


ROWS = {
    "floor": "floor: validate in + call + validate out",
    "gate": "desk.call, 3 allowing async interceptors",
    "gate_sync": "desk.call, 3 allowing sync interceptors",
    "gate_bare": "desk.call, no interceptors",
    "audit_floor": "audit floor: + build, serialize, hash 1 event",
    "gate_memory": "desk.call + MemorySink",
    "gate_memory_otel": "desk.call + MemorySink + OtelSink",
    "bare_span": "one bare SDK span",
}


async def run(calls: int, rounds: int) -> dict[str, list[float]]:
    paths, _ = build_paths()
    for fn in paths.values():
        await measure(fn, calls // 5 or 1)  # warm-up
    result = await paths["gate_memory"]()
    if not result.ok:
        raise SystemExit(f"bench setup is wrong: {result}")
    samples: dict[str, list[float]] = {key: [] for key in paths}
    for _ in range(rounds):
        for key, fn in paths.items():
            samples[key].append(await measure(fn, calls))
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=15)
    opts = parser.parse_args()
    samples = asyncio.run(run(opts.calls, opts.rounds))
    med = {key: statistics.median(values) for key, values in samples.items()}
    print(f"{'path':<48} {'median µs/call':>15} {'ratio':>8}  to")
    for key, label in ROWS.items():
        base = "audit_floor" if key in ("audit_floor", "gate_memory", "gate_memory_otel") else "floor"
        if key == "bare_span":
            base = "bare_span"
        print(f"{label:<48} {med[key] * 1e6:>15.2f} {med[key] / med[base]:>8.2f}  {base}")
    otel_extra = med["gate_memory_otel"] - med["gate_memory"]
    print(f"gate overhead: desk.call (3 async interceptors) / floor = {med['gate'] / med['floor']:.2f} (target <= 2.0)")
    print(
        f"events: desk.call + MemorySink / audit floor = {med['gate_memory'] / med['audit_floor']:.2f} (target <= 1.5)"
    )
    print(
        f"OpenTelemetry: OtelSink extra {otel_extra * 1e6:.1f} µs/call / one bare span "
        f"{med['bare_span'] * 1e6:.1f} µs = {otel_extra / med['bare_span']:.2f} (target <= 1.3)"
    )
    report("desk.call, 3 async interceptors", med["gate"] * 1e6, "µs/call", floor=med["floor"] * 1e6, target="<= 2.0")
    report(
        "desk.call + MemorySink", med["gate_memory"] * 1e6, "µs/call", floor=med["audit_floor"] * 1e6, target="<= 1.5"
    )
    report("OtelSink extra per call", otel_extra * 1e6, "µs/call", floor=med["bare_span"] * 1e6, target="<= 1.3")


if __name__ == "__main__":
    main()
