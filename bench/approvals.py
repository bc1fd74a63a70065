"""Decision to resume over the embedded broker, and what pending approval requests cost the store.

    python bench/approvals.py [--decisions N] [--events M] [--pending P] [--runs R]

1. Decision to resume: a gate waits on a durable request (`RemoteApprovals` over `KafkaDecisions`);
   the reviewer's desk publishes the decision (`DecisionPublisher`: the events topic, then the
   decisions topic, each acknowledged); the time from the publish call to the tool body starting is
   measured N times (median, p99; target p99 < 1 s). The floor, measured in the same run: one
   record produced (acknowledged) and seen by a reading consumer on the same broker.
2. The store: M ToolUse events and P pending requests ingested into a DuckDB store; the median time
   of `pending_approvals` (first page) and of `approval_request` (one id), against `blocked_attempts`
   over the same store as the floor; and the bytes of a request's event (what the store keeps of it)
   against a tool use's, with the file's growth.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from figures import report
from pydantic import BaseModel

from callgate.broker import EmbeddedBroker
from consumers import AuditStore, RawRecord, run_query
from events import encode_event
from events.chain import Producer, new_event_id
from events.decisions import DecisionPublisher, KafkaDecisions
from events.models import ApprovalRequestedEvent, ApprovalResolvedEvent, EventBase, ToolUseEvent
from interceptor_core import ApprovalRequest, Gate, RequireApproval, RunContext, before_tool_call, tool
from interceptor_core.approvals import PER_PROCESS, RemoteApprovals


class Refund(BaseModel):
    order_id: str
    amount_cents: int


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


async def decision_to_resume(bootstrap: str, n: int) -> tuple[list[float], list[float]]:
    """(decision-to-resume seconds, floor seconds), n each, alternating."""
    topic, decisions_topic = f"bench-{uuid.uuid4().hex[:8]}", f"bench-decisions-{uuid.uuid4().hex[:8]}"
    publisher = DecisionPublisher(bootstrap, topic, decisions_topic)
    producer = Producer()
    resumed: list[float] = []
    floors: list[float] = []
    started_body = asyncio.Event()
    body_at = 0.0

    @tool
    def refund(args: Refund) -> str:
        nonlocal body_at
        body_at = time.perf_counter()
        started_body.set()
        return "ok"

    asked: asyncio.Queue[ApprovalRequest] = asyncio.Queue()
    async with KafkaDecisions(bootstrap, decisions_topic) as source:
        remote = RemoteApprovals(source, claims=PER_PROCESS)  # one process: the claim's round trip is not measured

        async def handler(request: ApprovalRequest) -> Any:
            asked.put_nowait(request)
            return await remote(request)

        ask = before_tool_call(name="ask")(lambda call: RequireApproval("bench"))
        desk = Gate("bench", interceptors=[ask], approval_handler=handler).agent("desk", tools=[refund])
        run = RunContext(tenant="acme", principal="u-1")
        for i in range(n):
            started_body.clear()
            call = asyncio.create_task(
                desk.call("refund", {"order_id": f"A-{i}", "amount_cents": 1}, run=run, call_id=f"c-{i}")
            )
            request = await asked.get()
            decision = decision_for(producer, request)
            sent = time.perf_counter()
            await asyncio.to_thread(publisher.publish, decision)
            await started_body.wait()
            resumed.append(body_at - sent)
            assert (await call).ok
            # The floor: a record produced, acknowledged and seen by the reading consumer.
            changed = source.changed()
            other = decision_for(producer, request, approval_id=uuid.uuid4().hex)
            sent = time.perf_counter()
            await asyncio.to_thread(publisher.publish, other)
            await changed.wait()
            floors.append(time.perf_counter() - sent)
    publisher.close()
    return resumed, floors


def decision_for(producer: Producer, request: ApprovalRequest, approval_id: str | None = None) -> ApprovalResolvedEvent:
    return producer.seal(
        ApprovalResolvedEvent,
        {
            "event_id": new_event_id(),
            "time": datetime.now(UTC),
            "gate": "bench",
            "call_id": request.call_id,
            "approved": True,
            "by": "rev-1",
            "waited_ms": 1.0,
            "approval_id": approval_id or request.approval_id,
            "args_digest": request.args_digest,
            "policy_version": request.policy_version,
        },
    )


def store_events(n: int, pending: int) -> list[EventBase]:
    producer = Producer()
    now = datetime.now(UTC)
    out: list[EventBase] = []
    for i in range(n + pending):
        common: dict[str, Any] = {
            "event_id": new_event_id(),
            "time": now,
            "gate": "bench",
            "workflow": "support",
            "agent": "desk",
            "tool": "refund",
            "call_id": uuid.uuid4().hex,
            "run_id": f"run-{i // 20}",
            "tenant": f"tenant-{i % 50}",
            "principal": f"user-{i % 500}",
            "args": {"order_id": f"ACME-{i}", "amount_cents": i % 10000},
            "decisions": [{"interceptor": "policy", "scope": "application", "kind": "allow", "duration_ms": 0.01}],
        }
        if i < n:
            out.append(producer.seal(ToolUseEvent, {**common, "outcome": "ok", "duration_ms": 1.0}))
        else:
            extra = {
                "reason": "refund over 100",
                "requested_by": ("policy",),
                "approval_id": uuid.uuid4().hex,
                "args_digest": "d" * 64,
                "policy_version": "p" * 64,
                "rule": "big-refunds",
                "expires_at": (now + timedelta(hours=1)).isoformat(),
            }
            out.append(producer.seal(ApprovalRequestedEvent, {**common, **extra}))
    return out


def fill(path: Path, events: list[EventBase]) -> None:
    store = AuditStore(path)
    records = [RawRecord("bench", 0, i, e.producer_id.encode(), encode_event(e)) for i, e in enumerate(events)]
    for start in range(0, len(records), 10_000):
        batch = records[start : start + 10_000]
        store.ingest(batch, {("bench", 0): batch[-1].offset + 1})
    store.close()


def timed(con: Any, name: str, params: dict[str, Any], runs: int) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        run_query(con, name, params)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def store_cost(events: int, pending: int, runs: int) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        plain, asked = Path(scratch) / "plain.duckdb", Path(scratch) / "asked.duckdb"
        fill(plain, store_events(events + pending, 0))
        with_requests = store_events(events, pending)
        fill(asked, with_requests)
        # The file grows by whole blocks: the event bytes (the store's JSON column) say more per request.
        request_bytes = statistics.mean(len(encode_event(e)) for e in with_requests[events:])
        use_bytes = statistics.mean(len(encode_event(e)) for e in with_requests[: min(events, 1000)])
        file_growth = asked.stat().st_size - plain.stat().st_size
        store = AuditStore(asked, read_only=True)
        con = store.cursor()
        some_id = getattr(with_requests[-1], "approval_id", None)
        pending_s = timed(con, "pending_approvals", {"limit": 100}, runs)
        one_s = timed(con, "approval_request", {"approval_id": some_id}, runs)
        floor_s = timed(con, "blocked_attempts", {"limit": 100}, runs)
        rows = run_query(con, "pending_approvals", {"limit": 1000}).rows
        con.close()
        store.close()
    print(f"\nstore of {events:,} tool uses and {pending:,} pending requests ({len(rows):,} listed)")
    print(f"  pending_approvals (first 100): {pending_s * 1000:8.1f} ms")
    print(f"  approval_request (one id):     {one_s * 1000:8.1f} ms")
    print(f"  blocked_attempts (floor):      {floor_s * 1000:8.1f} ms")
    print(f"  event bytes: a request {request_bytes:,.0f}, a tool use {use_bytes:,.0f}")
    print(f"  file size with the requests minus with as many tool uses: {file_growth:,} bytes")
    report("pending_approvals query", pending_s * 1000, "ms", floor=floor_s * 1000, target="< 1 s")
    report("approval_request query", one_s * 1000, "ms", floor=floor_s * 1000, target="< 1 s")
    report("event bytes of a pending request", request_bytes, "B", floor=use_bytes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--decisions", type=int, default=200, help="decisions timed")
    parser.add_argument("--events", type=int, default=200_000, help="tool-use events in the store")
    parser.add_argument("--pending", type=int, default=10_000, help="pending requests in the store")
    parser.add_argument("--runs", type=int, default=7, help="timed runs per query")
    options = parser.parse_args()
    with EmbeddedBroker() as broker:
        resumed, floors = asyncio.run(decision_to_resume(broker.bootstrap, options.decisions))
    median, tail = statistics.median(resumed), p99(resumed)
    floor = statistics.median(floors)
    print(f"decision to resume over the embedded broker, {len(resumed)} decisions:")
    print(f"  median {median * 1000:.1f} ms, p99 {tail * 1000:.1f} ms (floor: produce + consume {floor * 1000:.1f} ms)")
    report("decision to resume, median", median * 1000, "ms", floor=floor * 1000)
    report("decision to resume, p99", tail * 1000, "ms", floor=p99(floors) * 1000, target="< 1000 ms")
    store_cost(options.events, options.pending, options.runs)


if __name__ == "__main__":
    main()
