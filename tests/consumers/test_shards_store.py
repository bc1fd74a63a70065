"""The sharded store's bookkeeping on a real DuckDB file, without a broker: tenures, gaps across a
handoff, chain segments and the overlap a later tenure resolves."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb

from consumers import shards
from consumers.store import AuditStore, RawRecord
from events import Producer, ToolUseEvent, encode_event

TOPIC = "events"


def chain(n: int) -> list[Any]:
    """n sealed ToolUse events of one producer, seqs 1..n."""
    producer = Producer()
    return [
        producer.seal(
            ToolUseEvent,
            {"event_id": uuid.uuid4().hex, "time": datetime.now(UTC), "gate": "g", "outcome": "ok", "duration_ms": 1},
        )
        for _ in range(n)
    ]


def ingest(store: AuditStore, events: list[Any], first_offset: int, partition: int = 0) -> None:
    """`events` as the records at consecutive offsets from `first_offset` of one partition."""
    raw = [
        RawRecord(TOPIC, partition, first_offset + i, e.producer_id.encode(), encode_event(e), 1_700_000_000_000)
        for i, e in enumerate(events)
    ]
    store.ingest(raw, {(TOPIC, partition): first_offset + len(events)})


def take(store: AuditStore, start: int, stored_before: int | None, owner: str = "me", partition: int = 0) -> str:
    tenure = uuid.uuid4().hex

    def work(con: duckdb.DuckDBPyConnection) -> None:
        shards.record_own_tenure(
            con,
            tenure_id=tenure,
            topic=TOPIC,
            partition=partition,
            owner=owner,
            start_offset=start,
            stored_before=stored_before,
        )

    store.transaction(work)
    return tenure


def segments(store: AuditStore) -> list[tuple[Any, ...]]:
    con = store.cursor()
    try:
        sql = "SELECT first_seq, first_prev_hash, last_seq, last_hash, holes FROM (" + shards.CHAIN_SEGMENTS_SQL + ")"  # noqa: S608
        return con.execute(
            sql,
            {"producer_id": None, "limit": 100, "offset": 0},
        ).fetchall()
    finally:
        con.close()


def gaps(store: AuditStore) -> list[int]:
    con = store.cursor()
    try:
        found = con.execute("SELECT seq FROM chain_breaks WHERE kind = 'gap' ORDER BY seq").fetchall()
        return [int(s) for (s,) in found]
    finally:
        con.close()


class TestGapsAcrossAHandoff:
    def test_a_shard_that_took_a_partition_records_no_gap_for_what_came_before(self, tmp_path: Path) -> None:
        """Seqs 6..10 read from a handoff at offset 5: no gap, one segment starting at seq 6 with its prev_hash."""
        events = chain(10)
        with AuditStore(tmp_path / "shard.duckdb") as store:
            take(store, 5, None)
            ingest(store, events[5:], 5)
            assert store.close_open_gaps() == 0
            assert gaps(store) == []
            assert segments(store) == [(6, events[5].prev_hash, 10, events[9].hash, [])]

    def test_a_hole_after_the_handoff_is_still_a_gap(self, tmp_path: Path) -> None:
        """A seq missing among the offsets the shard read itself is a gap, and a hole of its segment."""
        events = chain(10)
        with AuditStore(tmp_path / "shard.duckdb") as store:
            take(store, 5, None)
            ingest(store, events[5:7], 5)
            ingest(store, events[8:], 8)
            assert store.close_open_gaps() == 1
            assert gaps(store) == [8]
            assert segments(store) == [(6, events[5].prev_hash, 10, events[9].hash, [[8, 8]])]

    def test_holes_of_a_segment_are_listed_in_seq_order_with_its_ends(self, tmp_path: Path) -> None:
        """Runs 6..7, 9, 12..14 after a handoff at offset 5: one segment, holes [8, 8] and [10, 11]."""
        events = chain(14)
        with AuditStore(tmp_path / "shard.duckdb") as store:
            take(store, 5, None)
            ingest(store, events[11:], 11)
            ingest(store, events[5:7], 5)
            ingest(store, events[8:9], 8)
            assert segments(store) == [(6, events[5].prev_hash, 14, events[13].hash, [[8, 8], [10, 11]])]

    def test_without_a_handoff_the_missing_start_is_a_gap(self, tmp_path: Path) -> None:
        """A store that read the partition from offset 0 (no tenure elsewhere) records seqs 1..5 as gaps."""
        events = chain(10)
        with AuditStore(tmp_path / "single.duckdb") as store:
            ingest(store, events[5:], 5)
            assert store.close_open_gaps() == 5
            assert gaps(store) == [1, 2, 3, 4, 5]

    def test_a_gap_recorded_before_the_handoff_was_known_is_removed(self, tmp_path: Path) -> None:
        """A partition taken back after another shard read part of it: the hole between the two tenures goes."""
        events = chain(10)
        with AuditStore(tmp_path / "shard.duckdb") as store:
            take(store, 0, None)
            ingest(store, events[:3], 0)
            take(store, 7, 3)  # seqs 4..7 (offsets 3..6) were read by another shard meanwhile
            ingest(store, events[7:], 7)
            assert store.close_open_gaps() == 0
            assert [(s[0], s[2]) for s in segments(store)] == [(1, 3), (8, 10)]


class TestOverlapResolution:
    def test_an_older_tenure_gives_up_what_a_later_one_read_again(self, tmp_path: Path) -> None:
        """The old owner stored offsets 0..9, a peer took the partition at 6: once the group committed past 9,
        the old store deletes offsets 6..9, cedes them, and reports the take resolved with 4 removed."""
        events = chain(10)
        with AuditStore(tmp_path / "old.duckdb") as store:
            mine = take(store, 0, None)
            store.transaction(lambda con: shards.set_notice_offset(con, mine, 0))
            ingest(store, events, 0)
            peer_take = shards.Notice("take", TOPIC, 0, "peer", tenure_id="t-peer", start_offset=6)
            store.transaction(lambda con: shards.learn_notices(con, [(1, peer_take)]))
            # The peer has not committed past the overlap yet: nothing is given up.
            early = store.transaction(lambda con: shards.resolve_overlaps(con, TOPIC, "me", {0: 6}))
            assert early == []
            assert store.counts().total_events == 10
            done = store.transaction(lambda con: shards.resolve_overlaps(con, TOPIC, "me", {0: 12}))
            assert done == [shards.Resolution("t-peer", 0, 4)]
            assert store.counts().total_events == 6
            assert store.close_open_gaps() == 0
            assert [(s[0], s[2]) for s in segments(store)] == [(1, 6)]

    def test_a_take_is_confirmed_by_the_previous_owners_resolution(self, tmp_path: Path) -> None:
        """The new owner's take stays unconfirmed until the previous owner announces it resolved."""
        with AuditStore(tmp_path / "new.duckdb") as store:
            old_take = shards.Notice("take", TOPIC, 0, "old", tenure_id="t-old", start_offset=0)
            store.transaction(lambda con: shards.learn_notices(con, [(0, old_take)]))
            mine = take(store, 6, None, owner="new")
            store.transaction(lambda con: shards.set_notice_offset(con, mine, 1))
            assert store.transaction(lambda con: shards.confirm_takes(con, "new")) == 0
            assert [row[:3] for row in store.transaction(shards.unconfirmed_takes)] == [(0, 6, "old")]
            resolved = shards.Notice("resolved", TOPIC, 0, "old", resolves=mine, removed=4)
            store.transaction(lambda con: shards.learn_notices(con, [(2, resolved)]))
            assert store.transaction(lambda con: shards.confirm_takes(con, "new")) == 1
            assert store.transaction(shards.unconfirmed_takes) == []

    def test_records_a_later_tenure_never_read_stay(self, tmp_path: Path) -> None:
        """The old owner stored offsets 0..9 and died before committing past 2; a peer took the partition at 2
        and stored up to 5 only; the old owner took it back at 10 (the group at 5). It gives up 2..4, which the
        peer holds, keeps 5..9, which nobody else read, and reports the take resolved."""
        events = chain(10)
        with AuditStore(tmp_path / "old.duckdb") as store:
            first = take(store, 0, None)
            store.transaction(lambda con: shards.set_notice_offset(con, first, 0))
            ingest(store, events, 0)
            peer_take = shards.Notice("take", TOPIC, 0, "peer", tenure_id="t-peer", start_offset=2, group_offset=2)
            store.transaction(lambda con: shards.learn_notices(con, [(1, peer_take)]))

            def take_back(con: duckdb.DuckDBPyConnection) -> None:
                shards.record_own_tenure(
                    con, tenure_id="t-back", topic=TOPIC, partition=0, owner="me", start_offset=10,
                    stored_before=10, group_offset=5,
                )  # fmt: skip
                shards.set_notice_offset(con, "t-back", 2)

            store.transaction(take_back)
            # The group's committed offset is this store's own progress by now.
            done = store.transaction(lambda con: shards.resolve_overlaps(con, TOPIC, "me", {0: 14}))
            assert done == [shards.Resolution("t-peer", 0, 3)]
            con = store.cursor()
            try:
                kept = con.execute("SELECT kafka_offset FROM events ORDER BY 1").fetchall()
            finally:
                con.close()
            assert [o for (o,) in kept] == [0, 1, 5, 6, 7, 8, 9]
