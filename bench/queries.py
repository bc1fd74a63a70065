"""Median time of every named query over a million stored events, and the ingest rate of the store.

    python bench/queries.py [--events N] [--runs R] [--ingest M]

1. Fills a fresh store (a temporary DuckDB file, migrated by `AuditStore`) with N synthetic events
   generated in SQL from `range()` (a week of traffic: 200 producers, 50 tenants, 5,000 principals,
   40 tools, every event type in realistic shares, whole JSON documents, 30% of the calls with
   shadow decisions), plus dead letters, chain breaks and offsets. The rows do not go through the
   gate or the parser: only the reading is timed.
2. Runs every named query R times through `run_query` on a read-only store's cursor (as the
   dashboard does) and prints the median, the slowest run and the rows returned. The target is
   1 s per query. Then the whole coverage check (`callgate coverage --require-exercised`: every
   check, with its violation listings) R times on the file: target 5 s.
3. Ingests M real events (sealed by a `Producer`, encoded as on the wire) through
   `AuditStore.ingest` in batches of 1,000 and of 10,000, into an empty store and into the
   million-event one: events per second, parsing and hashing included.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from figures import report

from consumers import QUERIES, AuditStore, RawRecord, run_query
from consumers.coverage import run_checks
from consumers.reader import FileReader
from consumers.store import connect
from events import (
    ApprovalRequestedEvent,
    BlockedEvent,
    Producer,
    SubstituteEvent,
    ToolDeniedEvent,
    ToolUseEvent,
    encode_event,
)
from events.models import EventBase

PRODUCERS = 200

# One row per i in range($n): producer i % 200, seq i // 200 + 1, times spread over the week before
# $now (increasing with i, as a consumer stores them), the type drawn from a hash of i.
FILL_EVENTS = """
INSERT INTO events
WITH base AS (
    SELECT i,
           CAST(hash(i) % 1000000007 AS BIGINT) AS h,
           'producer-' || (i % 200) AS producer_id,
           i // 200 + 1 AS seq,
           $now::TIMESTAMPTZ - to_microseconds(CAST(($n - i) * (604800000000 // $n) AS BIGINT)) AS time,
           'tenant-' || CAST(hash(i, 1) % 50 AS BIGINT) AS tenant,
           'user-' || CAST(hash(i, 2) % 5000 AS BIGINT) AS principal,
           'tool_' || CAST(hash(i, 3) % 40 AS BIGINT) AS tool,
           'agent-' || CAST(hash(i, 4) % 10 AS BIGINT) AS agent,
           ['tenant-orders', 'policy', 'pii-guard', 'rate-limit', 'sql-guard', 'budget', 'validation',
            'approval', 'registry', 'scope-check', 'geo-fence', 'export-control'][1 + CAST(hash(i, 5) % 12 AS BIGINT)]
           AS interceptor,
           CAST(hash(i, 6) % 100 AS BIGINT) AS s
    FROM range($n) t(i)
),
typed AS (
    SELECT *,
           CASE
               WHEN h % 1000 < 600 THEN 'ToolUse'
               WHEN h % 1000 < 760 THEN 'ToolDenied'
               WHEN h % 1000 < 810 THEN 'Blocked'
               WHEN h % 1000 < 860 THEN 'Substitute'
               WHEN h % 1000 < 925 THEN 'ApprovalRequested'
               WHEN h % 1000 < 990 THEN 'ApprovalResolved'
               WHEN h % 1000 < 995 THEN 'Unmediated'
               ELSE 'ToolsRegistered'
           END AS type
    FROM base
),
shaped AS (
    SELECT *,
           'evt-' || i AS event_id,
           'call-' || (i // 3) AS call_id,
           sha256(producer_id || '/' || seq) AS hash,
           CASE WHEN seq = 1 THEN repeat('0', 64) ELSE sha256(producer_id || '/' || (seq - 1)) END AS prev_hash,
           CASE type
               WHEN 'ToolDenied' THEN ['Order ' || upper(tenant) || '-' || (h % 100000) || ' does not belong to '
                                       || tenant || '.',
                                       'Amount ' || (h % 10000) || ' is over the limit for ' || tool || '.',
                                       'The call to ' || tool || ' needs approval and was refused by lead.',
                                       'PII found in argument /body (' || (h % 7) || ' matches).'][1 + h % 4]
               WHEN 'Blocked' THEN ['DROP statements are never allowed', 'Budget of run exhausted after '
                                    || (h % 500) || ' calls'][1 + h % 2]
               WHEN 'ApprovalRequested' THEN 'refund over ' || (h % 1000)
               WHEN 'ToolUse' THEN CASE WHEN h % 50 = 0 THEN 'TimeoutError: upstream took too long' END
           END AS message,
           -- Shadow mode: 30% of the calls met shadow decisions; a policy file's two shadow rules and a
           -- shadow Python interceptor decided the shadow outcome of 12% of all calls, the enforced chain
           -- that of the other 18%.
           CASE WHEN s < 8 THEN 'refunds-v2' WHEN s < 12 THEN 'geo-strict' END AS shadow_decided_by,
           CASE WHEN s < 5 THEN 'stricter-refunds' WHEN s < 8 THEN 'pii-strict' END AS shadow_rule,
           CASE type WHEN 'ToolUse' THEN 'allowed' WHEN 'ToolDenied' THEN 'denied' WHEN 'Blocked' THEN 'blocked'
                     WHEN 'Substitute' THEN 'substituted' END AS actual
    FROM typed
),
shadowed AS (
    SELECT *,
           CASE WHEN actual IS NOT NULL AND s < 30
                THEN CASE WHEN shadow_decided_by IS NOT NULL
                          THEN ['denied', 'blocked', 'approval', 'denied'][1 + s % 4] ELSE actual END
           END AS shadow_outcome
    FROM shaped
)
SELECT event_id, type, 1, time, producer_id, seq, hash, prev_hash, hash,
       'gate-' || (i % 200 // 20), 'support', agent,
       CASE WHEN type IN ('Unmediated', 'ToolsRegistered') THEN NULL ELSE tool END,
       CASE WHEN type IN ('Unmediated', 'ToolsRegistered') THEN NULL ELSE call_id END,
       NULL, 'run-' || (i // 20), NULL, tenant, principal,
       CASE WHEN h % 10 = 0 THEN md5(event_id) || md5(call_id) END, NULL,
       CASE WHEN type IN ('ToolDenied', 'Blocked', 'Substitute') THEN interceptor END,
       CASE type WHEN 'ToolUse' THEN CASE WHEN message IS NULL THEN 'ok' ELSE 'timeout' END
                 WHEN 'ToolDenied' THEN 'deny' WHEN 'Blocked' THEN 'block'
                 WHEN 'ApprovalResolved' THEN CASE WHEN h % 3 = 0 THEN 'refused' ELSE 'approved' END END,
       message,
       CASE WHEN type = 'ToolUse' THEN (h % 5000) / 10.0 END,
       'callgate.audit', i % 12, i // 12,
       time + INTERVAL 40 MILLISECOND,
       json_object(
           'event_id', event_id, 'type', type, 'schema_version', 1, 'time', time, 'producer_id', producer_id,
           'seq', seq, 'prev_hash', prev_hash, 'hash', hash, 'gate', 'gate-' || (i % 200 // 20),
           'workflow', 'support', 'agent', agent, 'tool', tool, 'call_id', call_id, 'tenant', tenant,
           'principal', principal,
           'decisions', json_array(
               json_object('interceptor', 'tenant-orders', 'scope', 'application', 'kind', 'allow',
                           'phase', 'before', 'duration_ms', 0.01, 'error', NULL),
               json_object('interceptor', interceptor, 'scope', 'agent', 'kind',
                           CASE WHEN type = 'ToolDenied' THEN 'deny' ELSE 'allow' END,
                           'phase', 'before', 'duration_ms', 0.02, 'error', NULL)),
           'args', json_object('order_id', upper(tenant) || '-' || (h % 100000), 'amount_cents', h % 10000,
                               'api_key', '[REDACTED]'),
           'redacted_paths', json_array('/api_key'),
           'message', message,
           'shadow_outcome', shadow_outcome,
           'divergent', CASE WHEN shadow_outcome IS NOT NULL THEN shadow_outcome <> actual END,
           'shadow_decided_by', CASE WHEN shadow_outcome IS NOT NULL THEN shadow_decided_by END,
           'shadow_rule', CASE WHEN shadow_outcome IS NOT NULL THEN shadow_rule END,
           'resource', CASE WHEN type = 'Unmediated' THEN 'payments-db' END,
           'attribute', CASE WHEN type = 'Unmediated' THEN 'execute' END,
           'bound_tools', CASE WHEN type = 'Unmediated' THEN json_array(tool, 'refund') END,
           'site', CASE WHEN type = 'Unmediated' THEN 'app/orders.py:42 in refund_all' END,
           'tools', CASE WHEN type = 'ToolsRegistered' THEN json_array(
               json_object('name', tool, 'description', 'does ' || tool,
                           'input_schema_sha256', md5(tool) || md5(tool),
                           'interceptors', json_array('tenant-orders', interceptor), 'excluded', json_array()),
               json_object('name', 'refund', 'description', 'Refunds an order',
                           'input_schema_sha256', md5('refund') || md5('refund'),
                           'interceptors', json_array('tenant-orders', 'policy'), 'excluded', json_array()))
           END),
       CASE WHEN type = 'ToolUse' THEN ['tenant-orders', interceptor] ELSE [] END,
       shadow_outcome,
       CASE WHEN shadow_outcome IS NOT NULL THEN shadow_outcome <> actual END,
       CASE WHEN shadow_outcome IS NOT NULL THEN shadow_decided_by END,
       CASE WHEN shadow_outcome IS NOT NULL THEN shadow_rule END,
       TRY_CAST(event_id AS UUID)
FROM shadowed
"""

FILL_DEAD_LETTERS = """
INSERT INTO dead_letters
SELECT 'callgate.audit', i % 12, 10000000 + i, 'producer-' || (i % 200),
       CAST('{"type": "Teleported", "n": ' || i || '}' AS BLOB),
       ['not_json', 'unknown_type', 'invalid', 'oversize'][1 + i % 4],
       ['not JSON: Expecting value', 'unknown event type ''Teleported''',
        'invalid ToolUse event: outcome: Field required', 'the value has 5000000 bytes'][1 + i % 4],
       '{"type": "Teleported", "n": ' || i || '}', NULL,
       $now::TIMESTAMPTZ - to_minutes(i)
FROM range(1000) t(i)
"""

FILL_CHAIN_BREAKS = """
INSERT INTO chain_breaks
SELECT 'producer-' || (i % 200), 1000 + i, ['gap', 'tamper', 'conflict'][1 + i % 3], 'synthetic break ' || i,
       NULL, NULL, $now::TIMESTAMPTZ - to_minutes(i)
FROM range(500) t(i)
"""

FILL_OFFSETS = """
INSERT INTO kafka_offsets
SELECT 'callgate.audit', p, $n // 12 + 1, $now::TIMESTAMPTZ FROM range(12) t(p)
"""


def fill(path: Path, n: int) -> None:
    AuditStore(path).close()  # migrations
    con = connect(path)
    now = datetime.now(UTC)
    for sql in (FILL_EVENTS, FILL_OFFSETS):
        con.execute(sql, {"n": n, "now": now})
    for sql in (FILL_DEAD_LETTERS, FILL_CHAIN_BREAKS):
        con.execute(sql, {"now": now})
    con.execute("CHECKPOINT")
    con.close()


def query_params(now: datetime) -> dict[str, list[dict[str, Any]]]:
    """Each query's cases: its defaults, and the filters a security team or a dashboard would use."""
    day = (now - timedelta(days=1)).isoformat()
    week = (now - timedelta(days=7)).isoformat()
    cases: dict[str, list[dict[str, Any]]] = {name: [{}] for name in QUERIES}
    cases["blocked_attempts"] += [
        {"tenant": "tenant-7", "since": week},
        {"text": "does not belong", "limit": 1000},
        {"decided_by": "policy", "offset": 5000},
    ]
    cases["blocked_attempts_count"] += [{"tenant": "tenant-7"}, {"text": "over the limit", "since": day}]
    cases["decision_trends"] = [{"since": day}, {"bucket_minutes": 60}, {}]
    cases["denial_rate"] += [{"by": "interceptor"}, {"by": "tool", "bucket_minutes": 15, "since": day}]
    cases["top_denied"] += [{"by": "principal"}, {"by": "decided_by", "since": day}]
    cases["call_detail"] = [{"call_id": "call-123456"}]
    cases["unmediated"] += [{"tool": "refund", "limit": 1000}]
    cases["registered_tools"] += [{"gate": "gate-3"}]
    cases["exercised_tools"] += [{"since": day}]
    cases["chain_status"] += [{"only_broken": True}]
    cases["event_counts"] += [{"since": day}]
    cases["new_denial_reasons"] += [{"since": week}]
    cases["shadow_impact"] += [{"since": day}, {"decider": "refunds-v2", "tenant": "tenant-7"}]
    cases["shadow_divergence"] += [{"since": week, "bucket_minutes": 60}, {"decider": "geo-strict", "since": day}]
    cases["shadow_calls"] += [
        {"decider": "refunds-v2", "rule": "stricter-refunds", "divergent_only": True},
        {"since": day, "offset": 5000},
        {"shadow_outcome": "blocked", "tenant": "tenant-7", "limit": 1000},
    ]
    middle = (now - timedelta(days=3, hours=12)).isoformat()
    cases["replay_calls"] += [
        {"limit": 10_000},
        {"limit": 10_000, "after_time": middle, "after_event_id": "evt-5"},
        {"tool": "tool_7", "since": week, "limit": 10_000},
    ]
    return cases


def bench_queries(path: Path, runs: int) -> None:
    reader = AuditStore(path, read_only=True)
    con = reader.cursor()
    (total,) = con.execute("SELECT count(*) FROM events").fetchone() or (0,)
    print(f"\n{total:,} events stored; median of {runs} runs per case (target: 1 s)")
    print(f"{'query':<24} {'params':<50} {'median ms':>10} {'max ms':>8} {'rows':>6}")
    worst = 0.0
    for name, cases in query_params(datetime.now(UTC)).items():
        for params in cases:
            times = []
            rows = 0
            for _ in range(runs + 1):  # the first run warms the caches and is not counted
                started = time.perf_counter()
                rows = len(run_query(con, name, params).rows)
                times.append(time.perf_counter() - started)
            median = statistics.median(times[1:]) * 1000
            worst = max(worst, median)
            shown = ", ".join(f"{k}={v}" for k, v in params.items())[:50]
            print(f"{name:<24} {shown:<50} {median:>10.1f} {max(times[1:]) * 1000:>8.1f} {rows:>6}")
    print(f"slowest median: {worst:.1f} ms")
    report("slowest named query over the store", worst, "ms", target="<= 1,000 ms")
    reader.close()


def bench_coverage(path: Path, runs: int) -> None:
    times = []
    checked = None
    for _ in range(runs + 1):  # the first run warms the caches and is not counted
        started = time.perf_counter()
        with FileReader(path) as reader:
            checked = run_checks(reader, require_exercised=True)
        times.append(time.perf_counter() - started)
    assert checked is not None
    verdicts = ", ".join(f"{c.name} {c.status}" for c in checked.checks)
    print(
        f"\ncoverage check (all four, with listings): median {statistics.median(times[1:]):.2f} s, "
        f"max {max(times[1:]):.2f} s over {runs} runs (target: 5 s); {verdicts}"
    )
    report("coverage check (all four, with listings)", statistics.median(times[1:]), "s", target="<= 5 s")


def real_events(n: int) -> list[EventBase]:
    """n events from 4 producers, shaped as the gate writes them (envelope, trail, redacted args)."""
    producers = [Producer() for _ in range(4)]
    out: list[EventBase] = []
    for i in range(n):
        common: dict[str, Any] = {
            "event_id": uuid.uuid4().hex,
            "time": datetime.now(UTC),
            "gate": "bench",
            "workflow": "support",
            "agent": "desk",
            "tool": f"tool_{i % 40}",
            "call_id": uuid.uuid4().hex,
            "run_id": f"run-{i // 20}",
            "tenant": f"tenant-{i % 50}",
            "principal": f"user-{i % 5000}",
            "args": {"order_id": f"ACME-{i}", "amount_cents": i % 10000},
            "decisions": [
                {"interceptor": name, "scope": "application", "kind": "allow", "duration_ms": 0.01}
                for name in ("tenant-orders", "policy", "pii-guard")
            ],
        }
        kind = i % 20
        cls: type[EventBase]
        if kind < 12:
            cls, extra = ToolUseEvent, {"outcome": "ok", "duration_ms": 3.2, "output_digest": "0" * 64}
        elif kind < 16:
            cls, extra = ToolDeniedEvent, {"message": f"Order ACME-{i} is not yours", "decided_by": "tenant-orders"}
            extra["cause"] = "deny"
        elif kind < 17:
            cls, extra = BlockedEvent, {"reason": "DROP is never allowed", "decided_by": "policy", "cause": "block"}
        elif kind < 18:
            cls, extra = SubstituteEvent, {"decided_by": "cache", "result_digest": "1" * 64}
        else:
            cls, extra = ApprovalRequestedEvent, {"reason": "refund over 100", "requested_by": ("policy",)}
        out.append(producers[i % 4].seal(cls, {**common, **extra}))
    return out


def bench_ingest(path: Path | None, events: list[EventBase], label: str) -> None:
    records = [
        RawRecord("callgate.audit", i % 12, i // 12, e.producer_id.encode(), encode_event(e))
        for i, e in enumerate(events)
    ]
    print(f"\ningest of {len(records):,} real events into {label}")
    for size in (1_000, 10_000):
        with tempfile.TemporaryDirectory() as scratch:
            store = AuditStore(path if path is not None else Path(scratch) / "ingest.duckdb")
            before = store.counts().total_events
            started = time.perf_counter()
            # Half the events per batch size, so both sizes store new events in the same store.
            part = records[: len(records) // 2] if size == 1_000 else records[len(records) // 2 :]
            for start in range(0, len(part), size):
                batch = part[start : start + size]
                offsets = {(r.topic, r.partition): r.offset + 1 for r in batch}
                store.ingest(batch, offsets)
            seconds = time.perf_counter() - started
            stored = store.counts().total_events - before
            store.close()
        print(f"  batches of {size:>6,}: {len(part) / seconds:>9,.0f} events/s ({stored:,} stored in {seconds:.2f} s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000, help="synthetic events to store")
    parser.add_argument("--runs", type=int, default=7, help="timed runs per query case")
    parser.add_argument("--ingest", type=int, default=40_000, help="real events to ingest per store")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "audit.duckdb"
        started = time.perf_counter()
        fill(path, options.events)
        size = path.stat().st_size / 1e6
        print(f"filled {options.events:,} synthetic events in {time.perf_counter() - started:.1f} s ({size:.0f} MB)")
        bench_queries(path, options.runs)
        bench_coverage(path, options.runs)
        events = real_events(options.ingest)
        bench_ingest(None, events, "an empty store")
        bench_ingest(path, real_events(options.ingest), f"the store of {options.events:,} events")


if __name__ == "__main__":
    main()
