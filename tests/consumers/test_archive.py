"""The cold tier: whole days moved to Parquet and read back with include_archive=true."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import pytest

from consumers import QUERIES, AuditStore, RawRecord, run_query
from consumers.archive import ArchiveError, archive_files
from events import EventBase, MemorySink, ToolUseEvent, encode_event
from events.chain import Producer
from interceptor_core import Deny, Gate, RunContext, ToolCall, tool

TOPIC = "callgate.audit"
NOW = datetime.now(UTC)


@tool
def get_order(order_id: str) -> str:
    """Loads an order."""
    return f"order {order_id}"


class TenantOrders:
    name = "tenant-orders"

    def before_tool_call(self, call: ToolCall) -> Deny | None:
        tenant = (call.run.tenant or "").upper()
        if not str(call.args["order_id"]).startswith(tenant):
            return Deny(f"order {call.args['order_id']} belongs to another tenant")
        return None


def gate_events() -> list[EventBase]:
    """A real gate's events: allowed and denied calls of two tenants, and a nested call."""
    sink = MemorySink()
    gate = Gate("shop", interceptors=[TenantOrders()], sinks=[sink])
    desk = gate.agent("desk", tools=[get_order])

    @tool
    async def delegate() -> str:
        """Asks the desk."""
        run = RunContext(tenant="acme", principal="u-1", run_id="r-outer")
        return (await desk.call("get_order", {"order_id": "ACME-9"}, run=run)).to_model_text()

    outer = gate.agent("outer", tools=[delegate])

    async def day() -> None:
        for n in range(4):
            acme = RunContext(tenant="acme", principal="u-1", run_id=f"r-acme-{n}")
            globex = RunContext(tenant="globex", principal="u-2", run_id=f"r-globex-{n}")
            await desk.call("get_order", {"order_id": f"ACME-{n}"}, run=acme)
            await desk.call("get_order", {"order_id": f"GLOBEX-{n}"}, run=acme)
            await desk.call("get_order", {"order_id": f"GLOBEX-{n}"}, run=globex)
        await outer.call("delegate", {}, run=RunContext(tenant="acme", principal="u-1", run_id="r-outer"))

    asyncio.run(day())
    return list(sink.events)


def dated_chain(days: list[date], per_day: int = 3) -> list[EventBase]:
    """One producer's chain, `per_day` tool uses at noon of each day, in seq order."""
    producer = Producer()
    out: list[EventBase] = []
    for day in days:
        for n in range(per_day):
            noon = datetime(day.year, day.month, day.day, 12, n, tzinfo=UTC)
            fields: dict[str, Any] = {
                "event_id": str(uuid.uuid4()),
                "time": noon,
                "gate": "dated",
                "agent": "desk",
                "tool": "get_order",
                "call_id": uuid.uuid4().hex,
                "tenant": "acme",
                "decisions": [],
                "args": {"order_id": f"ACME-{n}"},
                "outcome": "ok",
                "duration_ms": 0.1,
            }
            out.append(producer.seal(ToolUseEvent, fields))
    return out


def ingest(store: AuditStore, events: list[EventBase], partition: int = 0) -> None:
    records = [RawRecord(TOPIC, partition, i, e.producer_id.encode(), encode_event(e)) for i, e in enumerate(events)]
    store.ingest(records, {(TOPIC, partition): len(records)})


def _clock(column: str) -> bool:
    """A column read off the store's own clock (when ingested, how long ago), not off the events."""
    return "ingest" in column or column in ("lag_s", "seconds_since_commit", "recent_minutes")


def answers(con: duckdb.DuckDBPyConnection, extra: dict[str, str]) -> dict[str, list[dict[str, Any]]]:
    """Every named query's rows (with `extra` parameters where a query takes them), the store's
    clock columns left out."""
    out = {}
    for name, query in QUERIES.items():
        params = {key: value for key, value in extra.items() if key in query.params or key == "include_archive"}
        if name == "access_log":
            continue  # reads no events
        rows = run_query(con, name, params).rows
        out[name] = [{k: v for k, v in row.items() if not _clock(k)} for row in rows]
    return out


@pytest.fixture
def store(tmp_path: Path) -> Any:
    with AuditStore(tmp_path / "audit.duckdb") as opened:
        yield opened


class TestArchive:
    def test_every_named_query_reads_the_archive_as_it_read_the_store(self, store: AuditStore, tmp_path: Path) -> None:
        """After today's events move to Parquet, every named query with include_archive=true answers
        what it answered before; without it, the store no longer holds them."""
        events = gate_events()
        ingest(store, events)
        con = store.cursor()
        since = (NOW - timedelta(days=2)).isoformat()
        denied = next(e for e in events if e.type == "ToolDenied")  # type: ignore[attr-defined]
        until = (NOW + timedelta(hours=1)).isoformat()
        extra = {"since": since, "until": until, "event_id": denied.event_id, "run_id": "r-outer"}
        extra["call_id"] = denied.call_id or ""
        before = answers(con, extra)

        moved = store.archive(before=NOW + timedelta(days=2), to=tmp_path / "archive")

        assert [day.events for day in moved] == [len(events)]
        assert moved[0].path.parent.name == f"date={NOW.date().isoformat()}"
        assert moved[0].path.is_file()
        assert con.execute("SELECT count(*) FROM events").fetchone() == (0,)
        after = answers(con, {**extra, "include_archive": "true"})
        assert after == before
        assert run_query(con, "blocked_attempts", {"since": since}).rows == []

    def test_only_whole_days_before_the_cutoff_move(self, store: AuditStore, tmp_path: Path) -> None:
        """Days entirely before `before` move, one file each; the cutoff's own day and later stay."""
        today = NOW.date()
        days = [today - timedelta(days=40), today - timedelta(days=35), today - timedelta(days=30), today]
        chain = dated_chain(days)
        ingest(store, chain)

        moved = store.archive(before=datetime.combine(days[2], datetime.min.time(), UTC), to=tmp_path)

        assert [day.day for day in moved] == days[:2]
        con = store.cursor()
        left = con.execute("SELECT DISTINCT CAST(time AS DATE) FROM events ORDER BY 1").fetchall()
        assert [row[0] for row in left] == days[2:]
        assert sorted(Path(p).parent.name for p in archive_files(con)) == [f"date={d.isoformat()}" for d in days[:2]]

    def test_archiving_records_no_gap_and_chains_still_check(self, store: AuditStore, tmp_path: Path) -> None:
        """Seqs that moved to the archive are not missing: no gap is recorded, and the chain checks
        over the store and its archive find nothing wrong."""
        today = NOW.date()
        chain = dated_chain([today - timedelta(days=40), today - timedelta(days=35), today])
        ingest(store, chain)
        store.archive(before=NOW - timedelta(days=30), to=tmp_path)

        assert store.close_open_gaps() == 0
        con = store.cursor()
        status = run_query(con, "chain_status", {"include_archive": "true"}).rows
        (row,) = [r for r in status if r["producer_id"] == chain[0].producer_id]
        assert row["events"] == len(chain)
        assert run_query(con, "chain_breaks", {"include_archive": "true"}).rows == []

    def test_an_unlisted_file_is_ignored_and_removed(self, store: AuditStore, tmp_path: Path) -> None:
        """A file a run wrote but never listed (it died before its transaction) is not read, and the
        next run removes it."""
        today = NOW.date()
        ingest(store, dated_chain([today - timedelta(days=40), today]))
        stray = tmp_path / f"date={today - timedelta(days=41)}" / f"events-{uuid.uuid4().hex}.parquet"
        stray.parent.mkdir()
        stray.write_bytes(b"PAR1 not really")
        con = store.cursor()
        window = {"since": (NOW - timedelta(days=50)).isoformat(), "until": (NOW + timedelta(hours=1)).isoformat()}
        everything = run_query(con, "event_counts", window).rows
        assert run_query(con, "event_counts", {**window, "include_archive": "true"}).rows == everything

        store.archive(before=NOW - timedelta(days=30), to=tmp_path)

        assert not stray.exists()
        assert len(archive_files(con)) == 1

    def test_a_listed_file_that_is_gone_is_an_error_naming_it(self, store: AuditStore, tmp_path: Path) -> None:
        """A query over the archive refuses to answer without a file the store lists."""
        today = NOW.date()
        ingest(store, dated_chain([today - timedelta(days=40), today]))
        (moved,) = store.archive(before=NOW - timedelta(days=30), to=tmp_path)
        moved.path.unlink()
        with pytest.raises(ArchiveError, match=str(moved.path)):
            run_query(store.cursor(), "event_counts", {"include_archive": "true"})

    def test_a_directory_that_cannot_be_written_is_an_error_naming_it(self, store: AuditStore, tmp_path: Path) -> None:
        """Nothing is deleted when the archive cannot be written."""
        ingest(store, dated_chain([NOW.date() - timedelta(days=40)]))
        blocker = tmp_path / "file"
        blocker.write_text("not a directory")
        with pytest.raises(ArchiveError, match=str(blocker)):
            store.archive(before=NOW, to=blocker / "archive")
        assert store.cursor().execute("SELECT count(*) FROM events").fetchone() == (3,)

    def test_a_record_moved_to_the_archive_is_still_held(self, store: AuditStore, tmp_path: Path) -> None:
        """The materializer's check that the store still holds the record before its offset looks in
        the archive too, so a quiet partition is not taken for a broker that lost its log."""
        old = dated_chain([NOW.date() - timedelta(days=40)])
        ingest(store, old)
        store.archive(before=NOW - timedelta(days=30), to=tmp_path)
        assert store.cursor().execute("SELECT count(*) FROM events").fetchone() == (0,)
        assert store.holds(TOPIC, 0, len(old) - 1, encode_event(old[-1]))
