"""The materializer's figures: ingest rate against an Arrow floor, peak memory, end-to-end lag.

    python bench/materialize.py [--events N] [--rate R] [--fast-rate R] [--seconds S] [--no-lag] [--rounds K]

1. Throughput: N events (default 200,000) are published to a topic of the embedded broker; then
   `callgate materialize --drain` runs as a child process and drains them into a fresh store:
   events per second (from its first batch to its end, as the child reports it), against the floor
   measured in the same round: the same rows (up to 200,000 of them) inserted into DuckDB through
   Arrow in one go and checkpointed, with no Kafka and no parsing, into a table of DuckDB's own
   choices (the floor the target is set against) and, reported beside it, into one whose event
   JSON is compressed with zstd as the store's is. Beside the rates, the CPU each spent per event
   (row), all its threads together, and the cores that kept busy on average (CPU over wall): the
   drain's work runs on several threads at once, the floor's insert on one. The child's peak RSS is
   reported for a 50,000-event drain and for the full one, at the store's default memory limit. K alternating
   rounds (default 3), each of both drains and both floors: the figures are the medians of the
   rounds, the ratios the medians of each round's ratio (a loaded moment moves a single drain or
   floor by a quarter; a round's drain and floor share most of it).
2. Lag: a gate emits R decisions per second (default 2,000) through a KafkaSink for S seconds while
   `callgate materialize --api` runs; the lag of an event is the time from its decision (`time`)
   to its commit in the store (`ingested_at`, the moment it is visible through the read API):
   p50 and p99. Then the same at `--fast-rate` (default 10,000 events/s): events sealed by a
   producer at their emission (the gate's own call path does not run at that rate beside a broker
   and a materializer on two cores) through the same KafkaSink. For each rate, the CPU time the
   producer (this process), the broker and the materializer spent per event, against what two
   cores give per event at that rate. `--no-lag` skips both.
3. Per-event Python cost of reading a record into its row (`read_event`: parse, verify the hash,
   keep the JSON; then the row), for the same events sealed as schema version 1 (before: the hash
   needs the canonical JSON rebuilt from the parsed event) and version 2 (after: the hash is over
   the bytes received). Medians of alternating rounds.
4. The staged columns of a batch of 10,240 events `read_wire` read, built in Python (`_event_row`,
   `_events_table`: the store's way) against extracted by DuckDB's JSON functions from the wire bytes
   staged through Arrow (`_EXTRACT_SQL`): wall µs per event, medians of alternating rounds, the two
   tables checked equal.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
from figures import report

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gate_overhead import ARGS, RUN, build_desk
from pipeline import make_events

from callgate.broker import EmbeddedBroker, free_port
from consumers.store import AuditStore, _event_row, _events_table, _json_array, connect
from events import MemorySink, Producer, ToolUseEvent, encode_event
from events.chain import new_event_id
from events.codec import ReadEvent, read_event
from events.fast_read import read_wire
from events.kafka import KafkaSink

CLI = [sys.executable, "-c", "from callgate.cli import main; main()"]


async def publish(bootstrap: str, topic: str, n: int, spool: Path) -> None:
    sink = KafkaSink(bootstrap, topic, spool / topic, partitions=3)
    for start in range(0, n, 10_000):
        for event in make_events(min(10_000, n - start)):
            sink.emit(event)
        if not await sink.flush(timeout=600):
            raise SystemExit("publishing did not finish")
    await sink.close()


def drain(bootstrap: str, topic: str, db: Path, expected: int) -> tuple[float, int, float]:
    """Seconds of ingest (first batch to the end, as the child reports it), its peak RSS in MiB, and the
    CPU seconds it spent over its ingest (all its threads, as it reports them)."""
    group = f"bench-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen(
        [*CLI, "materialize", "--bootstrap", bootstrap, "--topic", topic, "--db", str(db), "--group", group, "--drain"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    output = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.stdout.close()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"materialize --drain exited {proc.returncode}: {output}")
    seconds = float(output.rsplit(" in ", 1)[1].split(" s ")[0])
    cpu_seconds = float(output.rsplit(" in ", 1)[1].split(" (", 1)[1].split(" s of CPU")[0])
    stored = int(output.split("materialized ", 1)[1].split(" records", 1)[0])
    if stored < expected:
        raise SystemExit(f"the drain read {stored} records of {expected}: {output}")
    return seconds, usage.ru_maxrss // 1024, cpu_seconds


def floor_rows(n: int) -> pa.Table:
    """The staged rows of `n` bench events (the floor's input: built once, not timed)."""
    return _events_table(
        [
            _event_row(ReadEvent(event, event.hash, event.model_dump_json()), ord_, "t", 0, ord_)
            for ord_, event in enumerate(make_events(n))
        ]
    )


def arrow_floor(staged: pa.Table, db: Path, *, zstd_json: bool = False) -> tuple[float, float]:
    """Seconds, and CPU seconds (all of DuckDB's threads), to insert `staged` into a new DuckDB file `db`
    (replacing one left there) through Arrow in one go and checkpoint it: into a table of DuckDB's own
    choices (`CREATE TABLE AS`), or (`zstd_json`) one whose event JSON is compressed with zstd, as the
    store's `events` is (migration 11)."""
    for stale in (db, db.with_name(db.name + ".wal")):
        stale.unlink(missing_ok=True)
    con = connect(db, read_only=False)
    con.register("staged", staged)
    if zstd_json:
        columns = con.execute("DESCRIBE SELECT * FROM staged").fetchall()
        compressed = {"event", "event_json"}
        ddl = ", ".join(
            f'"{column}" {kind}' + (" USING COMPRESSION zstd" if column in compressed else "")
            for column, kind, *_ in columns
        )
        con.execute(f"CREATE TABLE events ({ddl})")
    start, start_cpu = time.perf_counter(), time.process_time()
    if zstd_json:
        con.execute("INSERT INTO events SELECT * FROM staged")
    else:
        con.execute("CREATE TABLE events AS SELECT * FROM staged")
    con.execute("CHECKPOINT")
    elapsed, cpu = time.perf_counter() - start, time.process_time() - start_cpu
    con.close()
    return elapsed, cpu


def cpu_seconds(pid: int) -> float:
    """User and system CPU time a running process has used (Linux `/proc`)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def lag(
    bootstrap: str, broker_pid: int, rate: int, seconds: float, tmp: Path, *, sealed: bool
) -> tuple[float, float, int, dict[str, float]]:
    """p50 and p99 of the lag of `rate` events/s for `seconds`, how many were counted, and the CPU
    each process spent per event (µs) from the first paced event until the last one was visible:
    the producer (this process: the gate or the sealing, and the KafkaSink), the broker and the
    materializer. Through the gate's call path, or (`sealed`) events sealed by a producer as they are
    emitted, in groups of 1 ms."""
    topic = f"lag-{uuid.uuid4().hex[:8]}"
    db = tmp / f"{topic}.duckdb"
    port = free_port("127.0.0.1")
    sink = KafkaSink(bootstrap, topic, tmp / f"{topic}-spool", partitions=3)
    desk = build_desk(sinks=[MemorySink(), sink])
    await desk.call("get_order", ARGS, run=RUN)  # creates the topic before the consumer subscribes
    await sink.flush(timeout=60)
    producer = Producer()
    proc = subprocess.Popen(
        [
            *CLI,
            "materialize",
            "--bootstrap",
            bootstrap,
            "--topic",
            topic,
            "--db",
            str(db),
            "--api",
            f"127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
    )
    try:
        await _until_stored(port, 1, 120)
        total = int(rate * seconds)
        group = max(1, rate // 1000) if sealed else 1
        template = _sealed_fields()
        cpu_before = time.process_time(), cpu_seconds(broker_pid), cpu_seconds(proc.pid)
        start = time.perf_counter()
        for i in range(0, total, group):
            for _ in range(min(group, total - i)):
                if sealed:
                    fields = {**template, "event_id": new_event_id(), "time": datetime.now(UTC)}
                    sink.emit(producer.seal_fields("ToolUse", fields))
                else:
                    await desk.call("get_order", ARGS, run=RUN)
            ahead = start + (i + group) / rate - time.perf_counter()
            if ahead > 0:
                await asyncio.sleep(ahead)
        await sink.flush(timeout=120)
        await _until_stored(port, total + 1, 120)
        cpu_after = time.process_time(), cpu_seconds(broker_pid), cpu_seconds(proc.pid)
        cpu = {
            name: (after - before) / total * 1e6
            for name, before, after in zip(("producer", "broker", "materializer"), cpu_before, cpu_after, strict=True)
        }
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
        await sink.close()
    with AuditStore(db, read_only=True) as store:
        con = store.cursor()
        lags = [
            row[0]
            for row in con.execute(
                "select epoch(ingested_at) - epoch(time) from events where type = 'ToolUse'"
            ).fetchall()
        ]
        con.close()
    return statistics.median(lags), statistics.quantiles(lags, n=100)[98], len(lags), cpu


_FIELDS: dict[str, Any] = {
    "gate": "bench",
    "workflow": "support",
    "agent": "desk",
    "tool": "get_order",
    "tenant": "acme",
    "principal": "u-1",
    "decisions": [{"interceptor": n, "scope": "application", "kind": "allow", "duration_ms": 0.01} for n in "abc"],
    "args": {"order_id": "ACME-1", "include_items": False},
    "outcome": "ok",
    "duration_ms": 0.05,
    "output_digest": "d" * 64,
}


def _sealed_fields() -> dict[str, Any]:
    """The fields of a valid ToolUse event as `Producer.seal_fields` takes them (the gate's own way
    of sealing: serialized once and hashed, no model built; `Producer.seal` validates a model first,
    some 100 µs an event here, more than the rate leaves)."""
    event = Producer().seal(ToolUseEvent, {**_FIELDS, "event_id": new_event_id(), "time": datetime.now(UTC)})
    fields = event.model_dump(mode="json", exclude={"hash", "producer_id", "seq", "prev_hash", "schema_version"})
    del fields["type"]
    return fields


async def _until_stored(port: int, n: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            url = f"http://127.0.0.1:{port}/v1/queries/event_counts?since=2000-01-01T00:00:00Z"
            with urllib.request.urlopen(url, timeout=5) as response:
                rows = json.loads(response.read())["rows"]
            if sum(int(r["events"]) for r in rows if r["type"] == "ToolUse") >= n:
                return
        except OSError:
            pass
        await asyncio.sleep(0.05)
    raise SystemExit(f"fewer than {n} events visible after {timeout} s")


def per_event_cost(n: int = 5_000, rounds: int = 7) -> dict[int, float]:
    """µs per event of `read_event` + `_event_row` for version 1 and version 2 wire bytes, and (key 0)
    of `events.fast_read.read_wire` + `_event_row` for the version 2 bytes (the store's road)."""
    wires = {version: [encode_event(e) for e in make_events(n, schema_version=version)] for version in (1, 2)}
    wires[0] = wires[2]
    samples: dict[int, list[float]] = {1: [], 2: [], 0: []}
    for _ in range(rounds):
        for version, values in wires.items():
            started = time.perf_counter()
            for i, value in enumerate(values):
                read: Any = read_wire(value) if version == 0 else read_event(value)
                if read is None or read.content_hash != read.event.hash:
                    raise SystemExit(f"bench setup is wrong: version {version} event {i} does not verify")
                _event_row(read, i, "t", 0, i)
            samples[version].append((time.perf_counter() - started) / n * 1e6)
    return {version: statistics.median(values) for version, values in samples.items()}


# The staged columns `_event_row` takes from an event, taken by DuckDB's JSON functions from the wire
# instead: one `json_transform` (one parse) per event, then the same per-type choices.
_TEXT_FIELDS = [
    "event_id",
    "type",
    "time",
    "producer_id",
    "hash",
    "prev_hash",
    "gate",
    "workflow",
    "agent",
    "tool",
    "call_id",
    "parent_call_id",
    "run_id",
    "thread_id",
    "tenant",
    "principal",
    "trace_id",
    "span_id",
    "decided_by",
    "outcome",
    "cause",
    "message",
    "error",
    "reason",
    "shadow_outcome",
    "shadow_decided_by",
    "shadow_rule",
]
_EXTRACTED = {
    **dict.fromkeys(_TEXT_FIELDS, "VARCHAR"),
    "schema_version": "INTEGER",
    "seq": "BIGINT",
    "approved": "BOOLEAN",
    "divergent": "BOOLEAN",
    "duration_ms": "DOUBLE",
    "decisions": [{"interceptor": "VARCHAR", "enforced": "BOOLEAN"}],
}
_SHADOWED = "j.type IN ('ToolUse', 'ToolDenied', 'Blocked', 'Substitute')"
_EXTRACT_SQL = f"""
SELECT ord, j.event_id, j.type, j.schema_version, j.time::TIMESTAMPTZ AS time, j.producer_id, j.seq, j.hash,
    j.prev_hash, content_hash, j.gate, j.workflow, j.agent, j.tool, j.call_id, j.parent_call_id, j.run_id,
    j.thread_id, j.tenant, j.principal, j.trace_id, j.span_id,
    CASE WHEN j.type IN ('ToolDenied', 'Blocked', 'Substitute') THEN j.decided_by END AS decided_by,
    CASE j.type WHEN 'ToolUse' THEN j.outcome WHEN 'ToolDenied' THEN j.cause WHEN 'Blocked' THEN j.cause
        WHEN 'ApprovalResolved' THEN CASE WHEN j.approved THEN 'approved' ELSE 'refused' END END AS outcome,
    CASE j.type WHEN 'ToolUse' THEN j.error WHEN 'ToolDenied' THEN j.message WHEN 'Blocked' THEN j.reason
        WHEN 'Substitute' THEN j.error WHEN 'ApprovalRequested' THEN j.reason
        WHEN 'ApprovalResolved' THEN j.error END AS message,
    CASE WHEN j.type = 'ToolUse' THEN j.duration_ms END AS duration_ms,
    kafka_topic, kafka_partition, kafka_offset, NULL::VARCHAR AS event,
    [d.interceptor FOR d IN coalesce(j.decisions, []) IF d.enforced IS DISTINCT FROM false] AS trail,
    CASE WHEN {_SHADOWED} THEN j.shadow_outcome END AS shadow_outcome,
    CASE WHEN {_SHADOWED} THEN j.divergent END AS divergent,
    CASE WHEN {_SHADOWED} THEN j.shadow_decided_by END AS shadow_decided_by,
    CASE WHEN {_SHADOWED} THEN j.shadow_rule END AS shadow_rule,
    event_json
FROM (SELECT *, json_transform(event_json, '{json.dumps(_EXTRACTED, separators=(",", ":"))}') AS j FROM raw)
"""  # noqa: S608 (constants only)


def extraction_cost(n: int = 10_240, rounds: int = 7) -> tuple[float, float]:
    """µs per event, wall, of building a batch's staged columns from events `read_wire` read: in Python
    (`_event_row`, `_events_table`), and by DuckDB (`_EXTRACT_SQL` over the wire bytes staged through
    Arrow, on its own threads; Python stages only what it checked: position, wire, content hash). Both
    give the same table, which is checked. Medians of alternating rounds."""
    values = [encode_event(e) for e in make_events(n)]
    reads = [read_wire(value) for value in values]
    if any(read is None for read in reads):
        raise SystemExit("bench setup is wrong: read_wire declined a bench event")
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")

    def python() -> pa.Table:
        return _events_table([_event_row(read, i, "t", 0, i) for i, read in enumerate(reads)])

    def in_duckdb() -> pa.Table:
        raw = pa.table(
            {
                "ord": pa.array(range(n), pa.int64()),
                "content_hash": pa.array([read.content_hash for read in reads], pa.string()),
                "kafka_topic": pa.array(["t"] * n, pa.string()),
                "kafka_partition": pa.array([0] * n, pa.int32()),
                "kafka_offset": pa.array(range(n), pa.int64()),
                "event_json": _json_array([read.wire for read in reads]),
            }
        )
        con.register("raw", raw)
        return con.sql(_EXTRACT_SQL).to_arrow_table()

    expected, got = python(), in_duckdb().cast(python().schema)
    if not got.equals(expected):
        raise SystemExit("bench setup is wrong: DuckDB's extraction differs from _event_row's columns")
    samples: dict[str, list[float]] = {"python": [], "duckdb": []}
    for _ in range(rounds):
        for name, build in (("python", python), ("duckdb", in_duckdb)):
            started = time.perf_counter()
            build()
            samples[name].append((time.perf_counter() - started) / n * 1e6)
    return statistics.median(samples["python"]), statistics.median(samples["duckdb"])


def floors(n: int, tmp: Path) -> tuple[float, float, float]:
    """Both floors' seconds over `n` rows, and the first one's CPU seconds, measured in a child process
    (`--floors`): the rows take this process to some 3 GB, and a drain started after them counted that
    as its own peak RSS (a child's peak includes what it shared with its parent before `exec`)."""
    out = subprocess.run(
        [sys.executable, __file__, "--floors", str(n), str(tmp)], capture_output=True, text=True, check=True
    )
    floor_s, floor_cpu_s, floor_zstd_s = (float(x) for x in out.stdout.split())
    return floor_s, floor_zstd_s, floor_cpu_s


@dataclass(frozen=True)
class Round:
    """One round's drains (their seconds and peak RSS) and floors (their seconds), with the CPU the full
    drain and the first floor spent."""

    small_s: float
    small_rss: int
    full_s: float
    full_rss: int
    floor_s: float
    floor_zstd_s: float
    full_cpu_s: float
    """The full drain's CPU seconds over its ingest."""
    floor_cpu_s: float
    """The floor's CPU seconds."""


def alternating_rounds(bootstrap: str, tmp: Path, sizes: tuple[int, int, int], rounds: int) -> list[Round]:
    """Per round: a drain of the topics "small" and "full" (their sizes), then both floors over the
    floor's rows. The machine's load moves every figure by a quarter between runs minutes apart; a
    ratio compares within a round."""
    small, n, floor_n = sizes
    done: list[Round] = []
    for round_ in range(rounds):
        small_s, small_rss, _ = drain(bootstrap, "small", tmp / f"small-{round_}.duckdb", small)
        full_s, full_rss, full_cpu_s = drain(bootstrap, "full", tmp / f"full-{round_}.duckdb", n)
        floor_s, floor_zstd_s, floor_cpu_s = floors(floor_n, tmp)
        done.append(Round(small_s, small_rss, full_s, full_rss, floor_s, floor_zstd_s, full_cpu_s, floor_cpu_s))
        for path in tmp.glob(f"*-{round_}.duckdb*"):
            path.unlink()  # a 1,000,000-event store is some 300 MB; the next round writes its own
    return done


async def main_async(n: int, rate: int, fast_rate: int, seconds: float, with_lag: bool, rounds: int) -> None:
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        small = min(50_000, n)
        await publish(broker.bootstrap, "small", small, tmp)
        await publish(broker.bootstrap, "full", n, tmp)
        floor_n = min(n, 200_000)
        drains = alternating_rounds(broker.bootstrap, tmp, (small, n, floor_n), rounds)
        lags = {}
        if with_lag:
            assert broker.pid is not None
            lags[rate] = await lag(broker.bootstrap, broker.pid, rate, seconds, tmp, sealed=False)
            lags[fast_rate] = await lag(broker.bootstrap, broker.pid, fast_rate, seconds, tmp, sealed=True)
    # Per round: the drains' and floors' rates.
    rates = [(small / r.small_s, n / r.full_s, floor_n / r.floor_s, floor_n / r.floor_zstd_s) for r in drains]
    ratio = statistics.median(full / floor for _, full, floor, _ in rates)
    ratio_zstd = statistics.median(full / floor_zstd for _, full, _, floor_zstd in rates)
    rate_small, rate_full, rate_floor, rate_floor_zstd = (statistics.median(r[i] for r in rates) for i in range(4))
    small_rss, full_rss = statistics.median(r.small_rss for r in drains), statistics.median(r.full_rss for r in drains)
    rss_ratio = statistics.median(r.full_rss / r.small_rss for r in drains)
    # CPU per event (row) and the cores it kept busy on average (CPU seconds over wall seconds).
    drain_cpu = statistics.median(r.full_cpu_s / n * 1e6 for r in drains)
    drain_cores = statistics.median(r.full_cpu_s / r.full_s for r in drains)
    floor_cpu = statistics.median(r.floor_cpu_s / floor_n * 1e6 for r in drains)
    floor_cores = statistics.median(r.floor_cpu_s / r.floor_s for r in drains)
    cost = per_event_cost()
    by_python, by_duckdb = extraction_cost()
    print(f"medians of {rounds} alternating rounds (drains of both topics, then both floors)")
    print(f"{'path':<58} {'value':>14}")
    print(f"{f'materialize --drain of {small:,} events (events/s)':<58} {rate_small:>14,.0f}")
    print(f"{f'materialize --drain of {n:,} events (events/s)':<58} {rate_full:>14,.0f}")
    print(f"{'floor: the same rows into DuckDB through Arrow (rows/s)':<58} {rate_floor:>14,.0f}")
    print(f"{'  the same, the event JSON compressed with zstd (rows/s)':<58} {rate_floor_zstd:>14,.0f}")
    print(f"{f'  CPU per event of the {n:,}-event drain (µs), cores busy':<58} {drain_cpu:>8.1f}, {drain_cores:.2f}")
    print(f"{'  CPU per row of the floor (µs), cores busy':<58} {floor_cpu:>8.1f}, {floor_cores:.2f}")
    print(f"{f'peak RSS of the materializer, {small:,} events (MiB)':<58} {small_rss:>14,.0f}")
    print(f"{f'peak RSS of the materializer, {n:,} events (MiB)':<58} {full_rss:>14,.0f}")
    for round_, ((_, full, floor, floor_zstd), r) in enumerate(zip(rates, drains, strict=True), 1):
        print(
            f"  round {round_}: drain {full:,.0f}/s, floor {floor:,.0f}/s ({full / floor:.3f}), zstd floor "
            f"{floor_zstd:,.0f}/s ({full / floor_zstd:.3f}), peak RSS {r.small_rss} / {r.full_rss} MiB "
            f"({r.full_rss / r.small_rss:.3f})"
        )
    for at, (p50, p99, counted, cpu) in lags.items():
        print(f"{f'lag at {at:,} events/s over {counted:,} events, p50 (s)':<58} {p50:>14.3f}")
        print(f"{f'lag at {at:,} events/s over {counted:,} events, p99 (s)':<58} {p99:>14.3f}")
        for name, micros in cpu.items():
            print(f"{f'  CPU per event at {at:,} events/s, {name} (µs)':<58} {micros:>14.1f}")
        # Two cores give 2,000,000 µs of CPU a second: at `at` events/s, this much per event in all.
        budget = f"{sum(cpu.values()):.1f} / {2e6 / at:,.0f}"
        print(f"{'  the sum, against what 2 cores give per event (µs)':<58} {budget:>14}")
    print(f"{'per-event Python cost, schema version 1 (µs), before':<58} {cost[1]:>14.2f}")
    print(f"{'per-event Python cost, schema version 2 (µs), after':<58} {cost[2]:>14.2f}")
    print(f"{'the same through events.fast_read (µs), the store road':<58} {cost[0]:>14.2f}")
    print(f"{'staged columns of read events, built in Python (µs/event)':<58} {by_python:>14.2f}")
    print(f"{'  the same columns extracted by DuckDB from the wire (µs/event)':<58} {by_duckdb:>14.2f}")
    print(f"throughput: materialize / Arrow floor = {ratio:.3f} (target >= 0.5, goal 0.8; median of the rounds')")
    print(f"  against the floor with the store's zstd event JSON: {ratio_zstd:.3f}")
    print(
        f"memory: peak RSS {small_rss:.0f} MiB at {small:,} events, {full_rss:.0f} MiB at {n:,}: {rss_ratio:.3f} "
        "(target: within 10%; median of the rounds')"
    )
    for at, (_, p99, _, _) in lags.items():
        print(f"lag: p99 {p99:.3f} s at {at:,} events/s (target <= 2 s)")
    report(f"materialize --drain of {n:,} events", rate_full, "events/s", floor=rate_floor, target=">= 0.5",
           higher_is_better=True, ratio=ratio)  # fmt: skip
    report(f"materialize --drain of {n:,} events, against a floor with the store's zstd event JSON", rate_full,
           "events/s", floor=rate_floor_zstd, target="report", higher_is_better=True, ratio=ratio_zstd)  # fmt: skip
    report(f"CPU per event of the drain of {n:,} events, all its threads", drain_cpu, "µs/event", floor=floor_cpu,
           target="report (floor: the Arrow floor's CPU per row)")  # fmt: skip
    report(f"peak RSS at {n:,} events", full_rss, "MiB", floor=small_rss, target=f"<= 1.1 (floor: at {small:,})",
           ratio=rss_ratio)  # fmt: skip
    for at, (_, p99, _, cpu) in lags.items():
        report(f"lag at {at:,} events/s, p99", p99, "s", target="<= 2 s")
        report(
            f"CPU per event at {at:,} events/s: producer, broker and materializer together",
            sum(cpu.values()),
            "µs/event",
            floor=2e6 / at,
            target="report (floor: what 2 cores give per event)",
        )
    report("materializer's per-event Python cost, v2", cost[2], "µs/event", floor=cost[1], target="v1 is the floor")
    report(
        "staged columns extracted by DuckDB's JSON functions from the wire bytes, wall",
        by_duckdb,
        "µs/event",
        floor=by_python,
        target="report (floor: built in Python from read_wire's events)",
    )
    report(
        "the same through events.fast_read",
        cost[0],
        "µs/event",
        floor=cost[2],
        target="pydantic's v2 road is the floor",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--rate", type=int, default=2_000)
    parser.add_argument("--fast-rate", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--no-lag", action="store_true", help="only the drains and the floor (RSS at large N)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of the drains and the floors")
    parser.add_argument("--floors", nargs=2, metavar=("ROWS", "DIR"), help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.floors:
        # The child of `floors`: both floors' seconds, on one line.
        rows, where = int(opts.floors[0]), Path(opts.floors[1])
        staged = floor_rows(rows)
        print(
            *arrow_floor(staged, where / "floor.duckdb"),
            arrow_floor(staged, where / "floor-zstd.duckdb", zstd_json=True)[0],
        )
        return
    if opts.rounds < 1:
        parser.error("--rounds must be at least 1")
    asyncio.run(main_async(opts.events, opts.rate, opts.fast_rate, opts.seconds, not opts.no_lag, opts.rounds))


if __name__ == "__main__":
    main()
