"""`callgate archive` as an operator runs it: a real process over a real store file."""

from __future__ import annotations

import subprocess
import sys
import uuid
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

from consumers import AuditStore, RawRecord, run_query
from events import EventBase, ToolUseEvent, encode_event
from events.chain import Producer

CLI = [sys.executable, "-c", "from callgate.cli import main; main()"]
TOPIC = "callgate.audit"


def chain(days: list[date]) -> list[EventBase]:
    producer = Producer()
    out: list[EventBase] = []
    for day in days:
        fields: dict[str, Any] = {
            "event_id": str(uuid.uuid4()),
            "time": datetime(day.year, day.month, day.day, 12, tzinfo=UTC),
            "gate": "g",
            "agent": "desk",
            "tool": "get_order",
            "call_id": uuid.uuid4().hex,
            "tenant": "acme",
            "decisions": [],
            "args": {"order_id": "ACME-1"},
            "outcome": "ok",
            "duration_ms": 0.1,
        }
        out.append(producer.seal(ToolUseEvent, fields))
    return out


def make_store(path: Path, days: list[date]) -> None:
    events = chain(days)
    with AuditStore(path) as store:
        records = [RawRecord(TOPIC, 0, i, e.producer_id.encode(), encode_event(e)) for i, e in enumerate(events)]
        store.ingest(records, {(TOPIC, 0): len(records)})


def archive(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "archive", *args], capture_output=True, text=True, timeout=120, check=False)


def test_moves_old_days_and_the_queries_read_them_back(tmp_path: Path) -> None:
    """Days older than 30 days move to date= folders; the store keeps the rest; include_archive reads all."""
    today = datetime.now(UTC).date()
    db = tmp_path / "audit.duckdb"
    make_store(db, [today - timedelta(days=45), today - timedelta(days=31), today])

    done = archive("--db", str(db), "--before", "30d", "--to", str(tmp_path / "cold"))

    assert done.returncode == 0, done.stderr
    assert "archived 2 day(s), 2 events" in done.stdout
    assert sorted(p.name for p in (tmp_path / "cold").iterdir()) == [
        f"date={(today - timedelta(days=45)).isoformat()}",
        f"date={(today - timedelta(days=31)).isoformat()}",
    ]
    with AuditStore(db, read_only=True) as store:
        con = store.cursor()
        window = {"since": (datetime.now(UTC) - timedelta(days=60)).isoformat()}
        (stored,) = run_query(con, "chain_status", window).rows
        (everything,) = run_query(con, "chain_status", {**window, "include_archive": "true"}).rows
    assert (stored["events"], everything["events"]) == (1, 3)


def test_dry_run_moves_nothing(tmp_path: Path) -> None:
    """--dry-run says what would move and leaves the store and the directory alone."""
    db = tmp_path / "audit.duckdb"
    make_store(db, [datetime.now(UTC).date() - timedelta(days=40)])

    done = archive("--db", str(db), "--before", "30d", "--to", str(tmp_path / "cold"), "--dry-run")

    assert done.returncode == 0, done.stderr
    assert "1 day(s), 1 events" in done.stdout
    assert not (tmp_path / "cold").exists()
    with AuditStore(db, read_only=True) as store:
        assert store.cursor().execute("SELECT count(*) FROM events").fetchone() == (1,)


def test_a_store_held_by_another_process_is_refused_in_one_line(tmp_path: Path) -> None:
    """While a process holds the file (a running materializer), archiving exits 2 and names it."""
    db = tmp_path / "audit.duckdb"
    make_store(db, [datetime.now(UTC).date() - timedelta(days=40)])
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"from consumers import AuditStore; s = AuditStore({str(db)!r}); print('held', flush=True); input()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        done = archive("--db", str(db), "--before", "30d", "--to", str(tmp_path / "cold"))
    finally:
        holder.communicate("\n", timeout=30)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert str(db) in line
    assert "stop the materializer" in line


def test_bad_arguments_exit_2_with_one_line(tmp_path: Path) -> None:
    """A missing store, a bad --before and an archive path that cannot be a directory each exit 2."""
    db = tmp_path / "audit.duckdb"
    make_store(db, [datetime.now(UTC).date() - timedelta(days=40)])
    blocker = tmp_path / "plain-file"
    blocker.write_text("x")
    cases = [
        (["--db", str(tmp_path / "none.duckdb"), "--before", "30d", "--to", str(tmp_path)], "none.duckdb"),
        (["--db", str(db), "--before", "soon", "--to", str(tmp_path)], "--before 'soon'"),
        (["--db", str(db), "--before", "30d", "--to", str(blocker / "cold")], str(blocker)),
    ]
    for args, named in cases:
        done = archive(*args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        (line,) = done.stderr.strip().splitlines()
        assert named in line
