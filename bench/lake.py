"""The store's two homes measured: ingest into one lake by 1, 2 and 3 writer processes against one
DuckDB file, and the named queries on the lake against the file.

    python bench/lake.py [--events N] [--batch B] [--rounds K]
    python bench/lake.py --queries-at 1000000 [--runs R]

1. Ingest: the same N events (default 30,000: three producers of N/3, each on a partition of its
   own) are staged by each writer process before it starts (parsing is not measured: it is the same
   for both homes), then stored batch by batch (B events a batch, default 2,000: one transaction
   each, events and offsets together). The file: one process stores them all. The lake (catalog:
   Debian's PostgreSQL, started here on a loopback port; data: a local directory): 1, 2 and 3
   processes, the producers dealt among them, all started at once; events/s is the events over the
   time from the first writer's start to the last one's end, and the lake's commits refused for a
   conflict and run again are counted. The ratio is to the file's rate in the same round; medians
   of K rounds (default 3).
2. Queries: every named query that needs no parameter, on the lake the 3-writer run filled and on
   the file, each timed as the median of three runs; the figure is the median over the queries of
   each query's lake/file ratio, and the slowest query on the lake is named. Then the Parquet files
   the 3-writer lake wrote, and the events table's live files after `ducklake_merge_adjacent_files`.
3. Lag (`--lag`, with `--lag-seconds S`, default 10, and `--lag-members 1,3`, default 3): that many
   `callgate materialize --assignment group --lake` processes on the embedded broker, events sealed
   as they are emitted through a KafkaSink at 2,000 and then 10,000 events/s; the lag of an event is
   from its decision (`time`) to its commit in the lake (`ingested_at`): p50 and p99, and how many
   were stored once all were in; and the Parquet files the timed part wrote, as files an hour at that
   pace, and the events table's live files after `ducklake_merge_adjacent_files`.
4. Queries at scale (`--queries-at N`, alone): N synthetic events generated in SQL (bench/queries.py's
   week of traffic, with its dead letters, chain breaks and offsets) into a DuckDB file, then copied
   into a lake over PostgreSQL in bulk, 10 inserts of a tenth of the week each (10 snapshots, a few
   Parquet files each: the shape a compacted lake has). Every named query, with the first case bench/queries.py
   gives it, is timed on both (median of R runs after one warm-up, default 5), and on the lake
   `as_of` its snapshot halfway through the load (time travel: half the rows); the ratio lake/file
   per query and the median ratio.
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from figures import report

from callgate.postgres import LocalPostgres, PostgresError

TOPIC = "bench.lake"


# -- a writer process ---------------------------------------------------------------------------


def writer(home: str, data: str | None, producers: Sequence[int], per_producer: int, batch: int) -> None:
    """Stage `per_producer` events of each producer (partition = producer number), say "ready", wait for
    a line on stdin, store them batch by batch, print what it did as JSON."""
    from consumers.lake import lake_from_options
    from consumers.store import AuditStore, RawRecord
    from events import ToolUseEvent, encode_event
    from events.chain import Producer, new_event_id

    store = AuditStore(lake_from_options(home, data) if data else home)
    batches: list[tuple[Any, dict[tuple[str, int], int]]] = []
    for number in producers:
        producer = Producer()
        records = []
        for offset in range(per_producer):
            event = producer.seal(
                ToolUseEvent,
                {
                    "event_id": new_event_id(),
                    "time": datetime.now(UTC),
                    "gate": f"gate-{number}",
                    "workflow": "support",
                    "agent": "desk",
                    "tool": f"tool-{offset % 7}",
                    "tenant": f"tenant-{offset % 5}",
                    "principal": "u-1",
                    "decisions": [
                        {"interceptor": n, "scope": "application", "kind": "allow", "duration_ms": 0.01} for n in "abc"
                    ],
                    "args": {"order_id": f"ORDER-{offset}", "include_items": False},
                    "outcome": "ok",
                    "duration_ms": 0.05,
                    "output_digest": "d" * 64,
                },
            )
            records.append(RawRecord(TOPIC, number, offset, event.producer_id.encode(), encode_event(event)))
        for start in range(0, len(records), batch):
            chunk = records[start : start + batch]
            batches.append((store.stage(chunk), {(TOPIC, number): start + len(chunk)}))
    store.offsets(TOPIC)
    print("ready", flush=True)
    sys.stdin.readline()
    began = time.time()
    stored = sum(store.ingest_staged(staged, offsets).stored for staged, offsets in batches)
    ended = time.time()
    print(json.dumps({"began": began, "ended": ended, "stored": stored, "conflicts": store.commit_conflicts}))
    store.close()


def run_writers(home: str, data: str | None, writers: int, n: int, batch: int) -> dict[str, float]:
    """Start `writers` processes sharing three producers of n/3 events, let them go at once; the rate."""
    deal = [[p for p in range(3) if p % writers == w] for w in range(writers)]
    procs = []
    for producers in deal:
        args = [sys.executable, __file__, "--writer", home, "--data", data or "", "--producers"]
        args += [",".join(map(str, producers)), "--events", str(n // 3), "--batch", str(batch)]
        procs.append(subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
    for proc in procs:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if line != "ready":
            raise SystemExit(f"a writer did not start: {line!r}")
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    results = []
    for proc in procs:
        out, _ = proc.communicate(timeout=1800)
        if proc.returncode != 0:
            raise SystemExit(f"a writer failed ({proc.returncode})")
        results.append(json.loads(out.strip().splitlines()[-1]))
    stored = sum(r["stored"] for r in results)
    seconds = max(r["ended"] for r in results) - min(r["began"] for r in results)
    return {"rate": stored / seconds, "stored": stored, "conflicts": sum(r["conflicts"] for r in results)}


# -- PostgreSQL for the catalog -----------------------------------------------------------------


@contextmanager
def postgres() -> Iterator[LocalPostgres]:
    """Debian's PostgreSQL on a free loopback port (as the tests start it)."""
    try:
        with LocalPostgres(prefix="callgate-bench-postgres-") as server:
            yield server
    except PostgresError as exc:
        raise SystemExit(str(exc)) from exc


def new_database(server: LocalPostgres) -> str:
    return "postgres:" + server.new_database()


# -- queries ------------------------------------------------------------------------------------


def query_times(store: Any) -> dict[str, float]:
    from consumers.queries import QUERIES, run_query

    times: dict[str, float] = {}
    con = store.cursor()
    for name, query in QUERIES.items():
        if any(p.required for p in query.params.values()):
            continue
        runs = []
        for _ in range(3):
            began = time.perf_counter()
            run_query(con, name)
            runs.append(time.perf_counter() - began)
        times[name] = statistics.median(runs)
    return times


def queries_at_scale(n: int, runs: int, scratch_dir: str | None = None) -> None:
    """Section 4 of the module docstring: every named query on a file and a lake of `n` events."""
    import duckdb
    from queries import fill, query_params

    from consumers.lake import lake_from_options
    from consumers.queries import QUERIES, run_query
    from consumers.store import AuditStore, connect

    tables = ("events", "dead_letters", "chain_breaks", "kafka_offsets")
    with postgres() as server, tempfile.TemporaryDirectory(prefix="callgate-bench-scale-") as scratch:
        tmp = Path(scratch)
        # --scratch DIR keeps the generated file between runs (generating a million events takes minutes).
        file = Path(scratch_dir or scratch) / f"audit-{n}.duckdb"
        began = time.perf_counter()
        if not file.exists():
            fill(file, n)
        file_load = time.perf_counter() - began
        print(f"file: {n:,} events generated in {file_load:.1f} s ({file.stat().st_size / 1e6:.0f} MB)", flush=True)
        lake = lake_from_options(new_database(server), str(tmp / "lake"))
        AuditStore(lake).close()
        began = time.perf_counter()
        con = connect(lake)
        # Loading is not what is measured: it may use more memory than the store's readers get.
        con.execute("SET memory_limit = '2GB'").fetchall()
        con.execute("SET preserve_insertion_order = false").fetchall()
        con.execute(f"ATTACH '{file}' AS source (READ_ONLY)").fetchall()
        # Events in time order, as materializers store them: ten slices of the week (the generator spreads
        # them evenly over it), the first half of the week first; no sort of the whole table in memory.
        ((first, last),) = con.execute("SELECT min(time), max(time) FROM source.main.events").fetchall()
        step = (last - first) / 10
        halfway = 0
        for part in range(10):
            low, high = first + step * part, (first + step * (part + 1) if part < 9 else None)
            con.execute(
                "INSERT INTO events SELECT * FROM source.main.events "
                "WHERE time >= $low AND ($high IS NULL OR time < $high)",
                {"low": low, "high": high},
            ).fetchall()
            if part == 4:
                halfway = int(con.execute("SELECT max(snapshot_id) FROM ducklake_snapshots('lake')").fetchall()[0][0])
        for table in tables[1:]:
            con.execute(f"INSERT INTO {table} SELECT * FROM source.main.{table}").fetchall()  # noqa: S608 (fixed names)
        con.close()
        lake_load = time.perf_counter() - began
        parquet = len(list(Path(lake.data).rglob("*.parquet")))
        print(f"lake: copied in {lake_load:.1f} s ({parquet} Parquet files); as_of snapshot {halfway}", flush=True)
        cases = {name: query_params(datetime.now(UTC))[name][0] for name in QUERIES}

        def timed(store: Any, extra: dict[str, Any]) -> dict[str, float]:
            cursor = store.cursor()
            times: dict[str, float] = {}
            for name, params in cases.items():
                runs_s = []
                for _ in range(runs + 1):  # the first run warms the caches and is not counted
                    started = time.perf_counter()
                    try:
                        run_query(cursor, name, {**params, **extra})
                    except duckdb.OutOfMemoryException:
                        runs_s = [math.inf] * 2  # within the store's memory limit, as readers run
                        break
                    runs_s.append(time.perf_counter() - started)
                times[name] = statistics.median(runs_s[1:])
            return times

        with AuditStore(file, read_only=True) as on_file:
            file_times = timed(on_file, {})
        with AuditStore(lake, read_only=True) as on_lake:
            lake_times = timed(on_lake, {})
            past_times = timed(on_lake, {"as_of": halfway})
    ratios = {name: lake_times[name] / file_times[name] for name in cases if math.isfinite(file_times[name])}
    print(f"\n{n:,} events; median of {runs} runs per query (ms)")
    print(f"{'query':<26} {'file':>8} {'lake':>8} {'lake/file':>9} {'as_of':>8}")
    for name in cases:
        print(
            f"{name:<26} {file_times[name] * 1000:>8.1f} {lake_times[name] * 1000:>8.1f} "
            f"{ratios[name]:>9.2f} {past_times[name] * 1000:>8.1f}"
        )
    median = statistics.median(ratios.values())
    print(f"median ratio lake/file over {len(ratios)} queries: {median:.2f}")
    print(f"load: file {file_load:.1f} s, lake copy {lake_load:.1f} s")
    slowest = max(lake_times, key=lambda q: lake_times[q])
    report(f"named queries lake/file at {n} events", median, "ratio")
    report(f"slowest named query on the lake at {n} events ({slowest})", lake_times[slowest] * 1000, "ms")


async def lake_lag(
    server: LocalPostgres, tmp: Path, rate: int, seconds: float, members: int = 3
) -> tuple[float, float, int, float, int]:
    """p50 and p99 (s) of decision-to-commit at `rate` events/s into a lake `members` materializers
    write, the events, the Parquet files the timed part wrote per hour at that pace, and the events
    table's live files after `ducklake_merge_adjacent_files`."""
    import asyncio

    from callgate.broker import EmbeddedBroker
    from consumers.lake import lake_from_options
    from consumers.store import AuditStore
    from events import Producer
    from events.chain import new_event_id
    from events.kafka import KafkaSink, ensure_topic

    topic = f"lag-{uuid.uuid4().hex[:8]}"
    lake = lake_from_options(new_database(server), str(tmp / topic))
    AuditStore(lake).close()
    with EmbeddedBroker() as broker:
        await ensure_topic(broker.bootstrap, topic, 3)
        command = [sys.executable, "-c", "from callgate.cli import main; main()", "materialize"]
        command += ["--bootstrap", broker.bootstrap, "--topic", topic, "--group", f"g-{topic}"]
        command += ["--assignment", "group", "--lake", lake.catalog, "--data", lake.data]
        running = [
            subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(members)
        ]
        sink = KafkaSink(broker.bootstrap, topic, tmp / f"{topic}-spool", partitions=3)
        producers = [Producer() for _ in range(6)]
        template = _sealed_fields()
        total = int(rate * seconds)
        try:
            with AuditStore(lake, read_only=True) as reader:
                # Before the clock, the group settles (the embedded broker's joins and rebalances take
                # seconds to tens of seconds): rounds of one event per producer, every partition, until
                # a round is stored within 3 s.
                warm = 0
                deadline = time.monotonic() + 180
                while True:
                    for producer in producers:
                        fields = {**template, "event_id": new_event_id(), "time": datetime.now(UTC)}
                        sink.emit(producer.seal_fields("ToolUse", fields))
                    warm += len(producers)
                    await sink.flush(timeout=60)
                    sent = time.monotonic()
                    while reader.counts().total_events < warm:
                        if time.monotonic() > deadline:
                            raise SystemExit("the lake materializers did not settle within 180 s")
                        await asyncio.sleep(0.05)
                    if time.monotonic() - sent < 3.0:
                        break
                group = max(1, rate // 1000)
                files_at_start = _parquet_files(lake.data)
                start = time.perf_counter()
                for i in range(0, total, group):
                    for j in range(min(group, total - i)):
                        fields = {**template, "event_id": new_event_id(), "time": datetime.now(UTC)}
                        sink.emit(producers[(i + j) % len(producers)].seal_fields("ToolUse", fields))
                    ahead = start + (i + group) / rate - time.perf_counter()
                    if ahead > 0:
                        await asyncio.sleep(ahead)
                await sink.flush(timeout=300)
                deadline = time.monotonic() + 600
                while reader.counts().total_events < total + warm:
                    if time.monotonic() > deadline:
                        raise SystemExit("the lake did not get every event within 600 s")
                    await asyncio.sleep(0.5)
                written = _parquet_files(lake.data) - files_at_start
                files_per_hour = written / (time.perf_counter() - start) * 3600
                lags = [
                    float(row[0])
                    for row in reader.cursor()
                    .execute("SELECT epoch(ingested_at) - epoch(time) FROM events ORDER BY time OFFSET $n", {"n": warm})
                    .fetchall()
                ]
        finally:
            await sink.close()
            for member in running:
                member.send_signal(signal.SIGTERM)
            for member in running:
                member.wait(timeout=60)
    with AuditStore(lake) as compacting:
        compacting.cursor().execute("CALL ducklake_merge_adjacent_files('lake')").fetchall()
        ((live,),) = (
            compacting.cursor().execute("SELECT count(*) FROM ducklake_list_files('lake', 'events')").fetchall()
        )
    return statistics.median(lags), statistics.quantiles(lags, n=100)[98], len(lags), files_per_hour, int(live)


def _parquet_files(data: str) -> int:
    return len(list(Path(data).rglob("*.parquet")))


def _sealed_fields() -> dict[str, Any]:
    from events import Producer, ToolUseEvent
    from events.chain import new_event_id

    fields = {
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
    event = Producer().seal(ToolUseEvent, {**fields, "event_id": new_event_id(), "time": datetime.now(UTC)})
    dumped = event.model_dump(mode="json", exclude={"hash", "producer_id", "seq", "prev_hash", "schema_version"})
    del dumped["type"]
    return dumped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=30_000)
    parser.add_argument("--batch", type=int, default=2_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--lag", action="store_true", help="Also measure lag into a lake of three materializers.")
    parser.add_argument("--lag-seconds", type=float, default=10.0)
    parser.add_argument("--lag-members", default="3", help="Materializer counts to measure the lag with: 1,3")
    parser.add_argument("--only-lag", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--queries-at", type=int, metavar="N", help="Only time every named query on a file and a lake of N events."
    )
    parser.add_argument("--runs", type=int, default=5, help="With --queries-at: timed runs per query.")
    parser.add_argument("--scratch", help="With --queries-at: keep the generated DuckDB file in this directory.")
    parser.add_argument("--writer", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--producers", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.writer:
        writer(args.writer, args.data or None, [int(p) for p in args.producers.split(",")], args.events, args.batch)
        return
    if args.queries_at:
        queries_at_scale(args.queries_at, args.runs, args.scratch)
        return

    from consumers.lake import lake_from_options
    from consumers.store import AuditStore

    if args.only_lag or args.lag:
        import asyncio

        with postgres() as server, tempfile.TemporaryDirectory(prefix="callgate-bench-lag-") as scratch:
            for members in [int(m) for m in args.lag_members.split(",")]:
                for rate in (2_000, 10_000):
                    p50, p99, count, per_hour, live = asyncio.run(
                        lake_lag(server, Path(scratch), rate, args.lag_seconds, members)
                    )
                    where = f"lag at {rate:,} events/s into a lake of {members} materializers"
                    print(f"{where}: p50 {p50:.2f} s, p99 {p99:.2f} s ({count:,} events)")
                    print(f"  data files written at that pace: {per_hour:,.0f} an hour; after compaction: {live}")
                    report(f"lake lag p99 at {rate} events/s, {members} materializers", p99, "s")
                    report(f"lake data files an hour at {rate} events/s, {members} materializers", per_hour, "files")
        if args.only_lag:
            return

    n = args.events - args.events % 3
    rates: dict[str, list[float]] = {"file": [], "lake-1": [], "lake-2": [], "lake-3": []}
    ratios: dict[str, list[float]] = {"lake-1": [], "lake-2": [], "lake-3": []}
    conflicts: dict[str, list[float]] = {"lake-1": [], "lake-2": [], "lake-3": []}
    query_ratios: list[float] = []
    files = (0, 0)
    slowest: tuple[str, float] = ("", 0.0)
    with postgres() as server, tempfile.TemporaryDirectory(prefix="callgate-bench-lake-") as scratch:
        tmp = Path(scratch)
        for round_ in range(args.rounds):
            file = tmp / f"file-{round_}.duckdb"
            rates["file"].append(run_writers(str(file), None, 1, n, args.batch)["rate"])
            lake3 = None
            for writers in (1, 2, 3):
                catalog, data = new_database(server), str(tmp / f"lake-{round_}-{writers}")
                AuditStore(lake_from_options(catalog, data)).close()  # the schema made before the clock runs
                result = run_writers(catalog, data, writers, n, args.batch)
                rates[f"lake-{writers}"].append(result["rate"])
                ratios[f"lake-{writers}"].append(result["rate"] / rates["file"][-1])
                conflicts[f"lake-{writers}"].append(result["conflicts"])
                lake3 = (catalog, data)
            if round_ == 0 and lake3 is not None:
                with AuditStore(file, read_only=True) as on_file:
                    file_times = query_times(on_file)
                with AuditStore(lake_from_options(*lake3), read_only=True) as on_lake:
                    lake_times = query_times(on_lake)
                files_before = len(list(Path(lake3[1]).rglob("*.parquet")))
                with AuditStore(lake_from_options(*lake3)) as compacting:
                    compacting.cursor().execute("CALL ducklake_merge_adjacent_files('lake')").fetchall()
                    live = (
                        compacting.cursor()
                        .execute("SELECT count(*) FROM ducklake_list_files('lake', 'events')")
                        .fetchall()[0][0]
                    )
                files = (files_before, int(live))
                query_ratios = [lake_times[q] / file_times[q] for q in file_times if file_times[q] > 0]
                name = max(lake_times, key=lambda q: lake_times[q])
                slowest = (name, lake_times[name])
    print(f"{n} events, batches of {args.batch}, {args.rounds} rounds (medians)")
    print(f"{'home':<8} {'events/s':>10} {'vs file':>8} {'conflicts':>10}")
    for home, values in rates.items():
        vs = f"{statistics.median(ratios[home]):.2f}" if home in ratios else "1.00"
        retried = f"{statistics.median(conflicts[home]):.0f}" if home in conflicts else "-"
        print(f"{home:<8} {statistics.median(values):>10,.0f} {vs:>8} {retried:>10}")
    print(
        f"named queries, lake/file: median ratio {statistics.median(query_ratios):.2f} over {len(query_ratios)} "
        f"queries at {n} events; slowest on the lake {slowest[0]} {slowest[1] * 1000:.0f} ms"
    )
    print(
        f"data files of the 3-writer lake: {files[0]} Parquet files written; the events table's live files "
        f"after ducklake_merge_adjacent_files: {files[1]}"
    )
    report("lake data files before compaction (3 writers)", files[0], "files")
    report("lake events files after compaction", files[1], "files")
    file_rate = statistics.median(rates["file"])
    for writers in (1, 2, 3):
        home = f"lake-{writers}"
        name = f"lake ingest, {writers} writer{'s' if writers > 1 else ''}"
        rate, ratio = statistics.median(rates[home]), statistics.median(ratios[home])
        report(name, rate, "events/s", floor=file_rate, ratio=ratio, higher_is_better=True)
    report("named queries lake/file", statistics.median(query_ratios), "ratio")


if __name__ == "__main__":
    main()
