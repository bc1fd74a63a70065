"""The store's contract, run against each of its homes: a DuckDB file, and a DuckLake whose catalog is
PostgreSQL (or SQLite) and whose data is a local directory.

`StoreContract` holds the tests; each home subclasses it and says how to open a store. What a key
held in the file (every event id once, a dead letter per position, a chain break per seq and kind,
an offset per partition) the lake, which has no keys, must hold too.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import ClassVar

import pytest

from consumers import QUERIES, SCHEMA_VERSION, AuditStore, QueryError, RawRecord, StoreError
from consumers.lake import Lake, lake_from_options
from consumers.queries import run_query
from events.loss import LossReport, encode_loss_report

from .conftest import NewLake
from .test_store import TOPIC, breaks, forged, gate_events, ingest, record, records, snapshot


class StoreContract(abc.ABC):
    """What every home of the audit store does; a subclass opens the store (`open`)."""

    keeps_snapshots: ClassVar[bool] = True
    """Whether the home answers `as_of` (a lake) or refuses it (a file keeps no snapshots)."""

    @abc.abstractmethod
    def open(self, *, read_only: bool = False) -> AuditStore:
        """A store of this home, the same one every call of one test (new for each test)."""

    @pytest.fixture
    def store(self) -> Iterator[AuditStore]:
        with self.open() as opened:
            yield opened

    def test_a_new_store_has_the_whole_schema(self, store: AuditStore) -> None:
        """Every migration is recorded as applied; the readers' views answer."""
        assert store.schema_version() == SCHEMA_VERSION
        con = store.cursor()
        for view in ("blocked_attempts", "decision_trends", "calls"):
            assert con.execute(f"SELECT count(*) FROM {view}").fetchall() == [(0,)]  # noqa: S608 (fixed names)

    def test_each_event_is_stored_once(self, store: AuditStore) -> None:
        """A batch, then the same batch again with copies inside it: every event id once, the rest counted
        as duplicates, nothing changed by the redelivery."""
        batch = records(gate_events(6))
        first = ingest(store, batch)
        assert (first.stored, first.duplicates, first.chain_breaks) == (7, 0, 0)
        before = snapshot(store)
        again = ingest(store, batch + batch[:3])
        assert (again.stored, again.duplicates, again.dead_letters, again.chain_breaks) == (0, 10, 0, 0)
        assert snapshot(store) == before

    def test_an_event_id_stored_elsewhere_is_a_conflict_not_a_second_row(self, store: AuditStore) -> None:
        """The event-id key: a new seq carrying a stored event's id is recorded as a conflict and not stored."""
        events = gate_events(2)
        ingest(store, records(events))
        last = events[-1]
        copy = forged(last, rehash=True, seq=last.seq + 1, prev_hash=last.hash)
        result = ingest(store, [record(copy, 10)])
        assert (result.stored, result.chain_breaks_by_kind) == (0, {"conflict": 1})
        ids = store.cursor().execute("SELECT event_id, count(*) FROM events GROUP BY ALL HAVING count(*) > 1")
        assert ids.fetchall() == []

    def test_another_event_at_a_stored_seq_is_recorded_once(self, store: AuditStore) -> None:
        """The (producer, seq, kind) key of chain breaks: the same rival twice records one conflict."""
        events = gate_events(3)
        ingest(store, records(events))
        rival = forged(events[2], rehash=True, event_id="rival", tenant="globex")
        assert ingest(store, [record(rival, 10)]).chain_breaks == 1
        assert ingest(store, [record(rival, 10)]).chain_breaks == 0
        assert breaks(store) == [(events[2].producer_id, events[2].seq, "conflict")]

    def test_a_new_finding_about_a_recorded_break_is_appended_once(self, store: AuditStore) -> None:
        """A second rival at a seq adds its detail to the recorded conflict, once, however often it comes."""
        events = gate_events(3)
        ingest(store, records(events))
        for offset, name in ((10, "rival-a"), (11, "rival-b"), (11, "rival-b")):
            ingest(store, [record(forged(events[2], rehash=True, event_id=name), offset)])
        ((detail,),) = store.cursor().execute("SELECT detail FROM chain_breaks").fetchall()
        assert (detail.count("rival-a"), detail.count("rival-b")) == (1, 1)

    def test_a_dead_letter_is_stored_once_per_position(self, store: AuditStore) -> None:
        """The (topic, partition, offset) key of dead letters: a redelivered bad record, and a copy of it in
        the same batch, leave one row."""
        bad = record(b"not json", 3)
        assert store.ingest([bad, bad], {(TOPIC, 0): 4}).dead_letters == 1
        assert store.ingest([bad], {(TOPIC, 0): 4}).dead_letters == 0
        assert store.counts().dead_letters == {"not_json": 1}

    def test_offsets_are_stored_with_the_batch_one_row_a_partition(self, store: AuditStore) -> None:
        """The (topic, partition) key of offsets: the last committed ingest's next offsets, one row each."""
        events = gate_events(3)
        store.ingest(records(events[:2]), {(TOPIC, 0): 2, (TOPIC, 1): 40, ("other", 0): 5})
        store.ingest(records(events[2:], start=2), {(TOPIC, 0): 4})
        assert store.offsets(TOPIC) == {0: 4, 1: 40}
        assert store.offsets("other") == {0: 5}
        rows = store.cursor().execute("SELECT count(*) FROM kafka_offsets").fetchall()
        assert rows == [(3,)]

    def test_a_failing_ingest_stores_nothing_of_its_batch(self, store: AuditStore) -> None:
        """A negative offset fails the batch: its events and offsets are rolled back; the next batch stores."""
        events = gate_events(4)
        store.ingest(records(events[:2]), {(TOPIC, 0): 2})
        before = snapshot(store)
        with pytest.raises(ValueError, match="must not be negative"):
            store.ingest(records(events[2:], start=2), {(TOPIC, 0): 5, (TOPIC, 1): -1})
        assert snapshot(store) == before
        assert store.ingest(records(events[2:], start=2), {(TOPIC, 0): 5}).stored == 3

    def test_reset_partition_forgets_its_offset_only(self, store: AuditStore) -> None:
        """reset_partition drops one stored offset; the events and other partitions stay."""
        store.ingest(records(gate_events(1)), {(TOPIC, 0): 2, (TOPIC, 1): 9})
        store.reset_partition(TOPIC, 0)
        assert store.offsets(TOPIC) == {1: 9}
        assert store.counts().total_events == 2

    def test_gaps_are_recorded_once_and_removed_when_filled(self, store: AuditStore) -> None:
        """close_open_gaps records each missing seq once; the missing event's arrival removes its gap."""
        events = gate_events(6)
        missing = events[3]
        ingest(store, records([e for e in events if e is not missing]))
        assert store.close_open_gaps() == 1
        assert store.close_open_gaps() == 0
        assert breaks(store) == [(missing.producer_id, missing.seq, "gap")]
        ingest(store, records([missing], start=20))
        assert breaks(store) == []

    def test_a_repeated_loss_report_records_one_gap(self, store: AuditStore) -> None:
        """A loss report records a gap at once; the same report again adds nothing."""
        events = gate_events(2)
        producer = events[0].producer_id
        loss = LossReport(report_id="r-1", producer_id=producer, first_seq=9, last_seq=9, spool="/s")
        value = encode_loss_report(loss)
        report = RawRecord(TOPIC, 0, 50, producer.encode(), value)
        assert store.ingest([*records(events), report], {(TOPIC, 0): 51}).chain_breaks_by_kind == {"gap": 1}
        assert store.ingest([report], {(TOPIC, 0): 51}).chain_breaks == 0
        assert breaks(store) == [(producer, 9, "gap")]

    def test_tamper_is_found_across_batches(self, store: AuditStore) -> None:
        """A rehashed forgery stored first, its honest successor later: the broken link is recorded."""
        events = gate_events(3)
        ingest(store, records(events[:2]))
        ingest(store, [record(forged(events[2], rehash=True, tenant="globex"), 2)])
        ingest(store, records(events[3:], start=3))
        assert breaks(store) == [(events[3].producer_id, events[3].seq, "tamper")]

    def test_a_read_only_store_reads_and_refuses_writes(self, store: AuditStore) -> None:
        """A read-only open sees what the writer committed and raises StoreError on a write."""
        ingest(store, records(gate_events(1)))
        with self.open(read_only=True) as reader:
            assert reader.counts().events == {"ToolsRegistered": 1, "ToolUse": 1}
            with pytest.raises(StoreError, match="read-only"):
                reader.ingest([], {})

    def test_every_named_query_runs(self, store: AuditStore) -> None:
        """Each named query that needs no parameter answers on this home (rows or none, never an error)."""
        ingest(store, records(gate_events(5)))
        store.close_open_gaps()
        con = store.cursor()
        ran = 0
        for name, query in QUERIES.items():
            if any(p.required for p in query.params.values()):
                continue
            result = run_query(con, name)
            assert result.columns, name
            ran += 1
        assert ran > 10

    def test_the_named_queries_see_the_stored_calls(self, store: AuditStore) -> None:
        """blocked_attempts answers the denied calls of the stored events."""
        events = gate_events(6)
        ingest(store, records(events))
        denied = sorted(e.event_id for e in events if e.type == "ToolDenied")  # type: ignore[attr-defined]
        result = run_query(store.cursor(), "blocked_attempts", {"limit": 100})
        ids = sorted(row["event_id"] for row in result.rows)
        assert ids == denied

    def test_a_named_query_as_of_a_time_leaves_out_what_was_written_after(self, store: AuditStore) -> None:
        """A denied call stored after T is absent from blocked_attempts as of T and as of the snapshot
        then, present without as_of; the answer's params say which as_of it was. A file refuses
        as_of, naming the parameter."""
        events = gate_events(6)  # registered, then use, denied, substitute, use, denied, substitute
        ingest(store, records(events[:4]))
        con = store.cursor()
        between = datetime.now(UTC)
        if not self.keeps_snapshots:
            with pytest.raises(QueryError, match="keeps no snapshots") as refused:
                run_query(con, "blocked_attempts", {"as_of": between.isoformat()})
            assert refused.value.param == "as_of"
            return
        ((snapshot,),) = con.execute("SELECT max(snapshot_id) FROM ducklake_snapshots('lake')").fetchall()
        ingest(store, records(events[4:], start=4))
        denied = [e.event_id for e in events if e.type == "ToolDenied"]  # type: ignore[attr-defined]
        assert len(denied) == 2

        def ids(params: dict[str, object]) -> list[str]:
            return sorted(row["event_id"] for row in run_query(con, "blocked_attempts", params).rows)

        assert ids({"as_of": between.isoformat()}) == [denied[0]]
        assert ids({"as_of": str(snapshot)}) == [denied[0]]
        assert ids({}) == sorted(denied)
        shown = run_query(con, "event_counts", {"as_of": between}).params["as_of"]
        assert shown == between.isoformat()
        assert con.execute("SELECT current_database()").fetchall() == [("lake",)]

    def test_as_of_in_the_future_or_before_the_lake_is_refused(self, store: AuditStore) -> None:
        """A time after now, one before the oldest snapshot, an unknown snapshot id and a malformed
        value are each refused with a QueryError naming as_of (on a file, each as the file does)."""
        con = store.cursor()
        for value, words in (
            ("2999-01-01T00:00:00Z", "not after now"),
            ("2000-01-01T00:00:00Z", "before the oldest snapshot"),
            ("999999", "no snapshot 999999"),
            ("yesterday", "a snapshot id or an ISO 8601 date-time"),
        ):
            with pytest.raises(QueryError, match=words if self.keeps_snapshots else None) as refused:
                run_query(con, "event_counts", {"as_of": value})
            assert refused.value.param == "as_of"


class TestFileHome(StoreContract):
    """The embedded default: one DuckDB file."""

    keeps_snapshots = False

    @pytest.fixture(autouse=True)
    def _home(self, tmp_path: Path) -> None:
        self.path = tmp_path / "audit.duckdb"

    def open(self, *, read_only: bool = False) -> AuditStore:
        if read_only:
            # DuckDB lets no reader in beside a writer of the file: the contract's reader waits for it.
            self.writer.close()
        store = AuditStore(self.path, read_only=read_only)
        if not read_only:
            self.writer = store
        return store


class TestPostgresLake(StoreContract):
    """A DuckLake over the session's PostgreSQL, its data in a local directory."""

    @pytest.fixture(autouse=True)
    def _home(self, new_lake: NewLake) -> None:
        self.lake = new_lake()

    def open(self, *, read_only: bool = False) -> AuditStore:
        return AuditStore(self.lake, read_only=read_only)


class TestSqliteLake(StoreContract):
    """A DuckLake whose catalog is a SQLite file (one host), its data in a local directory."""

    @pytest.fixture(autouse=True)
    def _home(self, tmp_path: Path) -> None:
        self.lake: Lake = lake_from_options(f"sqlite:{tmp_path / 'catalog.sqlite'}", str(tmp_path / "data"))

    def open(self, *, read_only: bool = False) -> AuditStore:
        return AuditStore(self.lake, read_only=read_only)
