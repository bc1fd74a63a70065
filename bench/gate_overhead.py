"""Per-call cost of the gate and of its audit record, as ratios to floors measured in the same run.

    python bench/gate_overhead.py [--calls N] [--rounds R]

Every path is a coroutine awaited N times in a loop; rounds of all paths alternate, so machine
noise hits them alike; medians of the per-round means are reported.

- gate: `desk.call` with three allowing interceptors and no sinks, against the floor (validate
  the input model, call the same tool, validate its output).
- audit: `desk.call` with one (and three) allowing interceptors and a `MemorySink` (each event
  built, redacted, serialized, hashed and chained), against floor_audit: what any auditing gate
  must do at least, as measured for peer libraries: pydantic validation of the input, the rule,
  `json.dumps` of a small record and its SHA-256. A denying interceptor's path beside it.
- sync tools: the same call of a sync tool in a worker thread (the default) and inline; their
  difference is the thread hop.
- the event's own cost split: redaction, serialization (orjson, against msgspec, pydantic and the
  canonical stdlib form of version 1 when installed) and SHA-256 of one call's event, and the rest
  of building it (ids, envelope, trail, digest, fan-out) as the remainder of the measured total.
- OpenTelemetry: the extra per-call cost of adding `OtelSink` next to the `MemorySink`, as a ratio
  to one bare SDK span (`start_as_current_span` + end) on the same tracer provider.
- signed checkpoints: the audited call (1 interceptor + `MemorySink`) of a gate with a signing key
  at the default cadence (a signed `Checkpoint` every 1,000 events or 5 s), against the same gate
  without a key: its own pair of paths, in many short rounds (default 41 of 500 calls) whose order
  is shuffled each round; the median of the per-round ratios, as the difference is a few percent.

The last lines are the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import random
import statistics
import time
import timeit
from collections.abc import Awaitable, Callable
from typing import Any

from figures import report
from opentelemetry.sdk.trace import TracerProvider
from pydantic import BaseModel, Field, TypeAdapter

from events import MemorySink, canonical_json, parse_event
from events.chain import dumps
from events.otel import OtelSink
from events.signing import SigningKey
from interceptor_core import Allow, Deny, Gate, RunContext, ToolCall, tool


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


def _get_order_sync(args: OrderQuery) -> OrderRecord:
    return OrderRecord(order_id=args.order_id, amount_cents=4200, status="shipped")


get_order_thread = tool(name="get_order", description="Loads an order record by ID")(_get_order_sync)
get_order_inline = tool(name="get_order", description="Loads an order record by ID", inline=True)(_get_order_sync)


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


class DenyOther(AllowTenant):
    """Denies every call: the denied path, with a message the model can act on."""

    async def before_tool_call(self, call: ToolCall) -> Deny:  # type: ignore[override]
        if call.run.tenant is None:
            raise RuntimeError("no tenant")
        return Deny("order ACME-42 belongs to another tenant")


ARGS = {"order_id": "ACME-42", "include_items": False}
RUN = RunContext(tenant="acme", principal="u-1")


def build_desk(
    kind: type[AllowTenant] = AllowTenant,
    count: int = 3,
    sinks: list[object] | None = None,
    tools: Any = None,
    signing_key: Any = None,
) -> Any:
    """`desk` with `count` (0 to 3) interceptors of `kind`, one per scope level."""
    made = [[kind(name)] if i < count else [] for i, name in enumerate("abc")]
    gate = Gate("bench", interceptors=made[0], sinks=sinks or [], signing_key=signing_key)
    wf = gate.workflow("support", interceptors=made[1])
    return wf.agent("desk", tools=tools or [get_order], interceptors=made[2])


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

    async def floor() -> Any:
        args = OrderQuery.model_validate(ARGS)
        return out_adapter.validate_python(await _get_order(args))

    async def floor_audit() -> Any:
        # Validate the input, apply the rule, write a small record and hash it: the least any
        # auditing gate does per call (the peers' measured floor).
        args = OrderQuery.model_validate(ARGS)
        if RUN.tenant is None:
            raise RuntimeError("no tenant")
        record = {"tool": "get_order", "args": args.model_dump(mode="json"), "decision": "allow", "tenant": RUN.tenant}
        hashlib.sha256(json.dumps(record).encode()).hexdigest()
        return await _get_order(args)

    async def bare_span() -> None:
        with tracer.start_as_current_span("execute_tool get_order"):
            pass

    def with_memory(
        kind: type[AllowTenant] = AllowTenant,
        count: int = 1,
        tools: Any = None,
        otel: bool = False,
        signing_key: Any = None,
    ) -> Callable[[], Awaitable[Any]]:
        memory = MemorySink()
        sinks: list[object] = [OtelSink(provider), memory] if otel else [memory]
        return gated(build_desk(kind, count, sinks, tools, signing_key), memory.clear)

    paths: dict[str, Callable[[], Awaitable[Any]]] = {
        "floor": floor,
        "gate": gated(build_desk(AllowTenant)),
        "gate_sync": gated(build_desk(AllowTenantSync)),
        "gate_1": gated(build_desk(AllowTenant, count=1)),
        "gate_bare": gated(build_desk(count=0)),
        "floor_audit": floor_audit,
        "audit_1": with_memory(count=1),
        "audit_3": with_memory(count=3),
        # Checkpoints at the default cadence (every 1,000 events or 5 s), signed with Ed25519.
        "audit_1_signed": with_memory(count=1, signing_key=SigningKey.generate("bench")),
        "audit_denied": with_memory(DenyOther, count=1),
        "sync_thread": with_memory(count=1, tools=[get_order_thread]),
        "sync_inline": with_memory(count=1, tools=[get_order_inline]),
        "audit_3_otel": with_memory(count=3, otel=True),
        "audit_3_for_otel": with_memory(count=3),
        "bare_span": bare_span,
    }
    return paths, provider


ROWS = {
    "floor": ("floor: validate in + call + validate out", "floor"),
    "gate": ("desk.call, 3 allowing async interceptors", "floor"),
    "gate_sync": ("desk.call, 3 allowing sync interceptors", "floor"),
    "gate_1": ("desk.call, 1 allowing interceptor", "floor"),
    "gate_bare": ("desk.call, no interceptors", "floor"),
    "floor_audit": ("floor_audit: validate + rule + json.dumps + SHA-256", "floor_audit"),
    "audit_1": ("desk.call, 1 interceptor + MemorySink", "floor_audit"),
    "audit_3": ("desk.call, 3 interceptors + MemorySink", "floor_audit"),
    "audit_1_signed": ("the same 1 interceptor, signed checkpoints", "audit_1"),
    "audit_denied": ("desk.call, 1 denying interceptor + MemorySink", "floor_audit"),
    "sync_thread": ("sync tool in a worker thread, 1 int. + MemorySink", "floor_audit"),
    "sync_inline": ("sync tool inline=True, 1 int. + MemorySink", "floor_audit"),
    "audit_3_otel": ("desk.call, 3 interceptors + MemorySink + OtelSink", "floor_audit"),
    "bare_span": ("one bare SDK span", "bare_span"),
}


def event_split(memory_event: bytes) -> dict[str, float]:
    """µs per call of each part of one call's event: redaction of its args, serialization of its
    fields (orjson as written; msgspec, pydantic and the canonical stdlib form for comparison) and
    SHA-256 of the bytes."""
    event = parse_event(memory_event)
    fields = json.loads(memory_event)
    redactor = Gate("split", sinks=[MemorySink()])._audit.redactor  # type: ignore[union-attr]
    args = OrderQuery.model_validate(ARGS)
    body = dumps(fields)
    number = 20_000

    def per_call(fn: Callable[[], Any]) -> float:
        return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6

    split = {
        "redact": per_call(lambda: redactor.redact_args("get_order", args.model_dump(mode="json"))),
        "serialize (orjson)": per_call(lambda: dumps(fields)),
        "serialize (pydantic to_json)": per_call(lambda: event.__pydantic_serializer__.to_json(event)),
        "serialize (v1 canonical: model_dump + stdlib)": per_call(
            lambda: canonical_json(event.model_dump(mode="json"))
        ),
        "hash (SHA-256)": per_call(lambda: hashlib.sha256(body).hexdigest()),
    }
    try:
        import msgspec

        encoder = msgspec.json.Encoder()
        split["serialize (msgspec)"] = per_call(lambda: encoder.encode(fields))
    except ImportError:
        pass
    return split


async def run(calls: int, rounds: int) -> dict[str, list[float]]:
    paths, _ = build_paths()
    for fn in paths.values():
        await measure(fn, calls // 5 or 1)  # warm-up
    for key in ("audit_1", "sync_thread", "sync_inline"):
        result = await paths[key]()
        if not result.ok:
            raise SystemExit(f"bench setup is wrong: {key}: {result}")
    if (await paths["audit_denied"]()).kind != "denied":
        raise SystemExit("bench setup is wrong: the denying path allowed")
    samples: dict[str, list[float]] = {key: [] for key in paths}
    for _ in range(rounds):
        for key, fn in paths.items():
            samples[key].append(await measure(fn, calls))
    return samples


async def signed_pair(calls: int, rounds: int) -> tuple[list[float], list[float]]:
    """Seconds per call of the audited call without a key and with one (default cadence), per round:
    two fresh gates, `rounds` rounds of `calls` calls of each, in an order shuffled every round."""
    paths: dict[str, Callable[[], Awaitable[Any]]] = {}
    for name, key in (("no key", None), ("signed", SigningKey.generate("bench"))):
        memory = MemorySink()
        paths[name] = gated(build_desk(AllowTenant, 1, [memory], signing_key=key), memory.clear)
    for fn in paths.values():
        await measure(fn, calls)  # warm-up; the signed gate's checkpoint thread starts here
    samples: dict[str, list[float]] = {name: [] for name in paths}
    order = list(paths)
    shuffle = random.Random(18).shuffle
    for _ in range(rounds):
        shuffle(order)
        for name in order:
            samples[name].append(await measure(paths[name], calls))
    return samples["no key"], samples["signed"]


def one_event() -> bytes:
    """The wire bytes of one allowed call's outcome event, as the audited path writes it."""
    memory = MemorySink()
    desk = build_desk(AllowTenant, 1, [memory])
    asyncio.run(desk.call("get_order", ARGS, run=RUN))
    (sealed,) = [e for e in memory.sealed if e.type == "ToolUse"]
    return bytes(sealed.data)  # type: ignore[union-attr]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--pair-calls", type=int, default=500, help="calls per round of the signed pair")
    parser.add_argument("--pair-rounds", type=int, default=41, help="rounds of the signed pair")
    opts = parser.parse_args()
    samples = asyncio.run(run(opts.calls, opts.rounds))
    unsigned, signed = asyncio.run(signed_pair(opts.pair_calls, opts.pair_rounds))
    med = {key: statistics.median(values) for key, values in samples.items()}
    print(f"{'path':<52} {'median µs/call':>15} {'ratio':>8}  to")
    for key, (label, base) in ROWS.items():
        print(f"{label:<52} {med[key] * 1e6:>15.2f} {med[key] / med[base]:>8.2f}  {base}")

    event_us = (med["audit_1"] - med["gate_1"]) * 1e6
    split = event_split(one_event())
    measured = split["redact"] + split["serialize (orjson)"] + split["hash (SHA-256)"]
    print(f"\nthe event of one call: {event_us:.2f} µs (desk.call + MemorySink - desk.call, 1 interceptor)")
    for part, us in split.items():
        print(f"  {part:<48} {us:>7.2f} µs")
    print(f"  {'build (ids, envelope, trail, digest, fan-out)':<48} {event_us - measured:>7.2f} µs  (the remainder)")

    hop = (med["sync_thread"] - med["sync_inline"]) * 1e6
    otel_extra = med["audit_3_otel"] - med["audit_3_for_otel"]
    print(f"\ngate overhead: desk.call (3 async interceptors) / floor = {med['gate'] / med['floor']:.2f}")
    print(f"audit, 1 interceptor: {med['audit_1'] / med['floor_audit']:.2f} x floor_audit (target <= 4.0, goal 2.0)")
    print(f"audit, 3 interceptors: {med['audit_3'] / med['floor_audit']:.2f} x floor_audit (target <= 5.0)")
    print(f"denied / allowed: {med['audit_denied'] / med['audit_1']:.2f} (target <= 1.0)")
    signed_ratio = statistics.median(b / a for a, b in zip(unsigned, signed, strict=True))
    print(
        f"signed checkpoints / no key: {signed_ratio:.3f}, median of {len(signed)} alternating rounds of "
        f"{opts.pair_calls} calls ({statistics.median(signed) * 1e6:.2f} against "
        f"{statistics.median(unsigned) * 1e6:.2f} µs/call; target <= 1.05)"
    )
    print(f"sync tool's thread hop: {hop:.1f} µs per call")
    print(
        f"OpenTelemetry: OtelSink extra {otel_extra * 1e6:.1f} µs/call / one bare span "
        f"{med['bare_span'] * 1e6:.1f} µs = {otel_extra / med['bare_span']:.2f} (target <= 1.3)"
    )
    report("desk.call, 3 async interceptors", med["gate"] * 1e6, "µs/call", floor=med["floor"] * 1e6, target="<= 2.0")
    floor_us = med["floor_audit"] * 1e6
    report("audited call, 1 interceptor + MemorySink", med["audit_1"] * 1e6, "µs/call", floor=floor_us, target="<= 4.0")
    report(
        "audited call, 3 interceptors + MemorySink", med["audit_3"] * 1e6, "µs/call", floor=floor_us, target="<= 5.0"
    )
    report(
        "denied call, 1 interceptor + MemorySink",
        med["audit_denied"] * 1e6,
        "µs/call",
        floor=med["audit_1"] * 1e6,
        target="<= 1.0 (to the allowed call)",
    )
    # The figure's ratio is that of the medians (bench/figures.py); the median of the per-round
    # ratios printed above differs from it by a few thousandths.
    report(
        "audited call with signed checkpoints (default cadence)",
        statistics.median(signed) * 1e6,
        "µs/call",
        floor=statistics.median(unsigned) * 1e6,
        target="<= 1.05 (to no key)",
    )
    report("sync tool's worker-thread hop", hop, "µs/call", target="inline=True avoids it")
    report("OtelSink extra per call", otel_extra * 1e6, "µs/call", floor=med["bare_span"] * 1e6, target="<= 1.3")


if __name__ == "__main__":
    main()
