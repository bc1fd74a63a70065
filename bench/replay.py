"""Stored calls replayed per second by `callgate replay` with a 10-rule policy, over a million events.

    python bench/replay.py [--events N] [--runs R] [--api-events M]

1. Fills a fresh store (a temporary DuckDB file, migrated by `AuditStore`) with N synthetic events
   generated in SQL from `range()`, the way bench/queries.py does: a week of traffic, 200
   producers, 50 tenants, 5,000 principals, 40 tools; about 82% outcome events (allowed, denied,
   blocked, substituted, approvals, and denials that never reached the chain), the rest approvals,
   registrations and unmediated uses; whole JSON documents with redacted arguments and decision
   trails whose deciding step is the policy's own name, so the candidate replaces it.
2. Replays the whole store R times (`callgate.replay_engine.replay` on a `FileCalls`, as
   `callgate replay --db` does) with bench/policy.py's ten plain rules as the candidate, and reports
   the median rate in stored calls per second (target: 20,000). The floor is reading alone: the
   same source, every call read and parsed, nothing decided.
3. With M > 0, replays the first M events' worth of calls through a live read API (`--api`, the
   `replay_calls` query paged 10,000 at a time) once, for the rate of that path.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from figures import report
from policy import policy_text

from callgate.replay_engine import ApiCalls, FileCalls, PolicyCandidate, ReplayReport, Window, replay
from consumers import AuditStore
from consumers.store import connect
from interceptor_core.policy import Policy

# One row per i in range($n), times increasing with i over the week before $now. `kind` picks the
# recorded outcome; the trail's deciding step is `bench-policy` (the candidate's name) for the
# policy's own decisions, `cache` for substitutes.
FILL = """
INSERT INTO events (event_id, type, schema_version, time, producer_id, seq, hash, prev_hash, content_hash,
                    gate, workflow, agent, tool, call_id, parent_call_id, run_id, thread_id, tenant, principal,
                    trace_id, span_id, decided_by, outcome, message, duration_ms, kafka_topic, kafka_partition,
                    kafka_offset, ingested_at, event, trail)
WITH base AS (
    SELECT i,
           CAST(hash(i) % 1000000007 AS BIGINT) AS h,
           'producer-' || (i % 200) AS producer_id,
           i // 200 + 1 AS seq,
           $now::TIMESTAMPTZ - to_microseconds(CAST(($n - i) * (604800000000 // $n) AS BIGINT)) AS time,
           'tenant-' || CAST(hash(i, 1) % 50 AS BIGINT) AS tenant,
           CASE WHEN hash(i, 2) % 200 = 0 THEN 'banned-' ELSE 'user-' END || CAST(hash(i, 2) % 5000 AS BIGINT)
               AS principal,
           'tool_' || CAST(hash(i, 3) % 40 AS BIGINT) AS tool,
           CASE WHEN hash(i, 4) % 50 = 0 THEN 'other' ELSE 'desk' END AS agent
    FROM range($n) t(i)
),
typed AS (
    SELECT *,
           CASE
               WHEN h % 1000 < 560 THEN 'allowed'
               WHEN h % 1000 < 620 THEN 'approved'
               WHEN h % 1000 < 720 THEN 'denied'
               WHEN h % 1000 < 735 THEN 'refused'
               WHEN h % 1000 < 760 THEN 'invalid'
               WHEN h % 1000 < 790 THEN 'blocked'
               WHEN h % 1000 < 820 THEN 'substituted'
               WHEN h % 1000 < 900 THEN 'asked'
               WHEN h % 1000 < 980 THEN 'answered'
               WHEN h % 1000 < 995 THEN 'unmediated'
               ELSE 'registered'
           END AS kind
    FROM base
),
shaped AS (
    SELECT *,
           CASE kind WHEN 'allowed' THEN 'ToolUse' WHEN 'approved' THEN 'ToolUse' WHEN 'denied' THEN 'ToolDenied'
                     WHEN 'refused' THEN 'ToolDenied' WHEN 'invalid' THEN 'ToolDenied' WHEN 'blocked' THEN 'Blocked'
                     WHEN 'substituted' THEN 'Substitute' WHEN 'asked' THEN 'ApprovalRequested'
                     WHEN 'answered' THEN 'ApprovalResolved' WHEN 'unmediated' THEN 'Unmediated'
                     ELSE 'ToolsRegistered' END AS type,
           CASE kind WHEN 'denied' THEN 'deny' WHEN 'refused' THEN 'approval_refused' WHEN 'invalid' THEN 'validation'
                     WHEN 'blocked' THEN 'block' END AS cause,
           CASE kind WHEN 'denied' THEN 'bench-policy' WHEN 'refused' THEN 'approval' WHEN 'invalid' THEN 'validation'
                     WHEN 'blocked' THEN 'bench-policy' WHEN 'substituted' THEN 'cache' END AS decided_by,
           'evt-' || i AS event_id,
           'call-' || i AS call_id,
           sha256(producer_id || '/' || seq) AS hash,
           CASE WHEN seq = 1 THEN repeat('0', 64) ELSE sha256(producer_id || '/' || (seq - 1)) END AS prev_hash,
           CASE WHEN h % 33 = 0 THEN 'GLOBEX' ELSE upper(tenant) END || '-' || (h % 100000) AS order_id,
           h % 12000 AS amount_cents,
           CASE WHEN h % 97 = 0 THEN 'drop table orders' ELSE 'select status from orders where id = '
                || (h % 100000) END AS query,
           CASE WHEN h % 89 = 0 THEN 'https://evil.example/x' ELSE 'https://docs.example.com/returns' END AS url
    FROM typed
),
trailed AS (
    SELECT *,
           CASE kind
               WHEN 'allowed' THEN json_array(json_object('interceptor', 'bench-policy', 'scope', 'application',
                   'kind', 'allow', 'phase', 'before', 'duration_ms', 0.01, 'error', NULL))
               WHEN 'approved' THEN json_array(json_object('interceptor', 'bench-policy', 'scope', 'application',
                   'kind', 'require_approval', 'phase', 'before', 'duration_ms', 0.01, 'error', NULL),
                   json_object('interceptor', 'approval', 'scope', 'gate', 'kind', 'allow', 'phase', 'approval',
                   'duration_ms', 900.0, 'error', NULL))
               WHEN 'refused' THEN json_array(json_object('interceptor', 'bench-policy', 'scope', 'application',
                   'kind', 'require_approval', 'phase', 'before', 'duration_ms', 0.01, 'error', NULL),
                   json_object('interceptor', 'approval', 'scope', 'gate', 'kind', 'deny', 'phase', 'approval',
                   'duration_ms', 900.0, 'error', NULL))
               WHEN 'denied' THEN json_array(json_object('interceptor', 'bench-policy', 'scope', 'application',
                   'kind', 'deny', 'phase', 'before', 'duration_ms', 0.01, 'error', NULL))
               WHEN 'blocked' THEN json_array(json_object('interceptor', 'bench-policy', 'scope', 'application',
                   'kind', 'block', 'phase', 'before', 'duration_ms', 0.01, 'error', NULL))
               WHEN 'substituted' THEN json_array(json_object('interceptor', 'bench-policy', 'scope', 'application',
                   'kind', 'allow', 'phase', 'before', 'duration_ms', 0.01, 'error', NULL),
                   json_object('interceptor', 'cache', 'scope', 'agent', 'kind', 'substitute', 'phase', 'before',
                   'duration_ms', 0.01, 'error', NULL))
               WHEN 'invalid' THEN json_array(json_object('interceptor', 'validation', 'scope', 'gate',
                   'kind', 'deny', 'phase', 'validation', 'duration_ms', 0.0, 'error', 'amount_cents: required'))
               ELSE json_array()
           END AS decisions
    FROM shaped
)
SELECT event_id, type, 1, time, producer_id, seq, hash, prev_hash, hash,
       'gate-' || (i % 200 // 20), 'support', agent,
       CASE WHEN type IN ('Unmediated', 'ToolsRegistered') THEN NULL ELSE tool END,
       CASE WHEN type IN ('Unmediated', 'ToolsRegistered') THEN NULL ELSE call_id END,
       NULL, 'run-' || (i // 20), NULL, tenant, principal, NULL, NULL,
       decided_by,
       CASE WHEN type = 'ToolUse' THEN 'ok' ELSE cause END,
       CASE WHEN type IN ('ToolDenied', 'Blocked') THEN 'refused by bench-policy' END,
       CASE WHEN type = 'ToolUse' THEN (h % 5000) / 10.0 END,
       'callgate.audit', i % 12, i // 12,
       time + INTERVAL 40 MILLISECOND,
       json_object(
           'event_id', event_id, 'type', type, 'schema_version', 1, 'time', time, 'producer_id', producer_id,
           'seq', seq, 'prev_hash', prev_hash, 'hash', hash, 'gate', 'gate-' || (i % 200 // 20),
           'workflow', 'support', 'agent', agent, 'tool', tool, 'call_id', call_id, 'run_id', 'run-' || (i // 20),
           'tenant', tenant, 'principal', principal, 'decisions', decisions,
           'args', json_object('order_id', order_id, 'amount_cents', amount_cents, 'query', query, 'url', url,
                               'path', '/srv/data/exports/' || (h % 1000) || '.csv', 'note', 'customer asked twice',
                               'api_key', '[REDACTED]'),
           'redacted_paths', json_array('/api_key'),
           'args_truncated', false,
           'cause', cause, 'decided_by', decided_by,
           'tools', CASE WHEN type = 'ToolsRegistered' THEN json_array(
               json_object('name', tool, 'description', 'does ' || tool,
                           'input_schema_sha256', md5(tool) || md5(tool),
                           'interceptors', json_array('bench-policy', 'cache'), 'excluded', json_array()))
           END),
       CASE WHEN type IN ('ToolUse', 'ToolDenied', 'Substitute', 'Blocked')
            THEN CAST(json_extract_string(decisions, '$[*].interceptor') AS VARCHAR[]) ELSE [] END
FROM trailed
"""


def fill(path: Path, n: int) -> None:
    """A migrated store at `path` holding `n` synthetic events."""
    AuditStore(path).close()  # migrations
    con = connect(path)
    con.execute(FILL, {"n": n, "now": datetime.now(UTC)})
    con.execute("CHECKPOINT")
    con.close()


class ReadOnly:
    """The floor: every call read and parsed, nothing decided."""

    def __init__(self, source: FileCalls) -> None:
        self.source = source

    def run(self) -> int:
        return sum(len(batch) for batch in self.source.calls())


def replay_file(path: Path, text: str) -> ReplayReport:
    source = FileCalls(path, Window())
    try:
        return replay(source, PolicyCandidate(Policy.from_text(text)), max_new_blocks=1.0)
    finally:
        source.close()


def bench_file(path: Path, runs: int) -> None:
    text = policy_text(False)
    floors, rates = [], []
    last: ReplayReport | None = None
    for _ in range(runs):
        source = FileCalls(path, Window())
        started = time.perf_counter()
        read = ReadOnly(source).run()
        floors.append(read / (time.perf_counter() - started))
        source.close()
        started = time.perf_counter()
        last = replay_file(path, text)
        rates.append(last.checked / (time.perf_counter() - started))
    assert last is not None
    floor, rate = statistics.median(floors), statistics.median(rates)
    print(
        f"\nreplay --db of {last.read:,} stored calls ({last.checked:,} checked, {sum(last.skipped.values()):,} "
        f"skipped) with the 10-rule policy, median of {runs} runs:"
    )
    print(f"  reading alone (floor): {floor:>10,.0f} calls/s")
    print(f"  replay:                {rate:>10,.0f} calls/s (target: 20,000)")
    print(f"  {last.summary()}")
    for name, summary in last.changes.items():
        print(f"    {name:<20} {summary.count:>9,}")
    report(
        "replay --db, 10-rule policy",
        rate,
        "calls/s",
        floor=floor,
        target=">= 20,000 calls/s",
        higher_is_better=True,
    )


def bench_api(path: Path, limit_events: int) -> None:
    from consumers.api import ApiServer, HealthStatus, build_app
    from consumers.metrics import MaterializerMetrics
    from consumers.runner import StoreQueryRunner

    store = AuditStore(path)
    try:
        con = store.cursor()
        (first,) = con.execute("SELECT min(time) FROM events").fetchone() or (None,)
        (until,) = con.execute(
            "SELECT time FROM events ORDER BY time LIMIT 1 OFFSET $k", {"k": limit_events}
        ).fetchone() or (None,)
        con.close()
        window = Window(since=first, until=until)
        app = build_app(StoreQueryRunner(store), MaterializerMetrics(), lambda: HealthStatus(True))
        with ApiServer(app, port=0) as server:
            source = ApiCalls(server.url, window)
            started = time.perf_counter()
            done = replay(source, PolicyCandidate(Policy.from_text(policy_text(False))), max_new_blocks=1.0)
            seconds = time.perf_counter() - started
    finally:
        store.close()
    rate = done.read / seconds
    print(f"\nreplay --api of {done.read:,} stored calls (pages of 10,000): {rate:,.0f} calls/s")
    report("replay --api, 10-rule policy", rate, "calls/s", target="(for comparison)", higher_is_better=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000, help="synthetic events to store")
    parser.add_argument("--runs", type=int, default=3, help="timed replays of the whole store")
    parser.add_argument("--api-events", type=int, default=200_000, help="events replayed through the read API")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-replay-") as scratch:
        path = Path(scratch) / "audit.duckdb"
        started = time.perf_counter()
        fill(path, options.events)
        print(f"filled {options.events:,} events in {time.perf_counter() - started:.1f} s")
        bench_file(path, options.runs)
        if options.api_events > 0:
            bench_api(path, min(options.api_events, options.events - 1))


if __name__ == "__main__":
    main()
