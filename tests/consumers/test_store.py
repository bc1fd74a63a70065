"""The audit store: events stored once, dead letters, chain checks, gaps, offsets, migrations, locking."""

from __future__ import annotations

import asyncio
import functools
import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from consumers import (
    MIGRATIONS,
    QUERIES,
    SCHEMA_VERSION,
    AuditStore,
    RawRecord,
    StoreError,
    StoreLockedError,
)
from consumers import metrics as materializer_metrics
from consumers.store import DEAD_LETTER_REASONS, ROW_GROUP_ROWS, _reason_kind
from events import EventBase, MemorySink, ToolUseEvent, encode_event, event_hash, parse_event
from events.chain import Producer, new_event_id
from events.fast_read import read_wire
from events.kafka import _headers, _spool_key
from events.loss import LossReport, encode_loss_report
from events.models import ZERO_HASH
from interceptor_core import Deny, Gate, RunContext, Substitute, ToolCall, before_tool_call, tool

TOPIC = "callgate.audit"
ACME = RunContext(tenant="acme", principal="u-1", thread_id="t-1")


@tool
def refund(order_id: str, amount_cents: int) -> str:
    """Refunds an order."""
    return f"refunded {amount_cents} on {order_id}"


def policy(call: ToolCall) -> Any:
    n = call.args["amount_cents"]
    return [None, Deny(f"amount {n} is over the limit"), Substitute("cached")][n % 3]


def gate_events(calls: int, name: str = "shop") -> list[EventBase]:
    """Events of a real gate: ToolsRegistered (seq 1), then one outcome per call (ToolUse, ToolDenied,
    Substitute in turn)."""
    sink = MemorySink()
    gate = Gate(name, interceptors=[before_tool_call(name="policy")(policy)], sinks=[sink])
    desk = gate.workflow("support").agent("desk", tools=[refund])

    async def run() -> None:
        for n in range(calls):
            await desk.call("refund", {"order_id": f"A-{n}", "amount_cents": n}, run=ACME)

    asyncio.run(run())
    return list(sink.events)


@functools.cache
def two_producers() -> list[EventBase]:
    """Sixteen events of two gates (eight each), built once for the property below."""
    return gate_events(7, "shop") + gate_events(7, "desk")


def records(events: list[EventBase], partition: int = 0, start: int = 0) -> list[RawRecord]:
    return [
        RawRecord(TOPIC, partition, start + i, e.producer_id.encode(), encode_event(e), 1_700_000_000_000)
        for i, e in enumerate(events)
    ]


def next_offsets(batch: list[RawRecord]) -> dict[tuple[str, int], int]:
    out: dict[tuple[str, int], int] = {}
    for r in batch:
        out[(r.topic, r.partition)] = max(out.get((r.topic, r.partition), 0), r.offset + 1)
    return out


def ingest(store: AuditStore, batch: list[RawRecord]) -> Any:
    return store.ingest(batch, next_offsets(batch))


def forged(event: EventBase, *, rehash: bool, **changes: Any) -> bytes:
    """The event's wire bytes with `changes` applied; `rehash` recomputes the hash over the forgery."""
    copy = event.model_copy(update=changes)
    if rehash:
        copy = copy.model_copy(update={"hash": event_hash(copy)})
    return encode_event(copy)


def record(value: bytes | None, offset: int, partition: int = 0) -> RawRecord:
    """A record as a sink sends it: keyed by the producer of the event it carries (when it is one)."""
    try:
        key = str(json.loads(value or b"")["producer_id"]).encode()
    except (ValueError, TypeError, KeyError, RecursionError):
        key = b"key"
    return RawRecord(TOPIC, partition, offset, key, value)


def sent(event: EventBase, offset: int, **changes: bytes | None) -> RawRecord:
    """The record a KafkaSink sends for the event (the key and headers its own functions make), with the
    `key` and the headers named in `changes` replaced (`key=None`: no key)."""
    key, headers = _headers(_spool_key(event), 0)
    key = changes.pop("key", key)
    envelope = tuple((name, changes.get(name) or value) for name, value in headers)
    return RawRecord(TOPIC, 0, offset, key, encode_event(event), 1_700_000_000_000, envelope)


def breaks(store: AuditStore) -> list[tuple[str, int, str]]:
    rows = store.cursor().execute("SELECT producer_id, seq, kind FROM chain_breaks ORDER BY ALL").fetchall()
    return [(str(p), int(s), str(k)) for p, s, k in rows]


def snapshot(store: AuditStore) -> dict[str, list[tuple[Any, ...]]]:
    con = store.cursor()
    return {
        table: con.execute(f"SELECT * FROM {table} ORDER BY ALL").fetchall()  # noqa: S608 (fixed table names)
        for table in ("events", "dead_letters", "kafka_offsets", "chain_breaks", "schema_migrations")
    }


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "audit.duckdb"


@pytest.fixture
def store(db: Path) -> Any:
    with AuditStore(db) as opened:
        yield opened


class TestIngest:
    def test_stores_each_event_once_with_typed_columns(self, store: AuditStore) -> None:
        """Every event lands once, its typed columns equal the event's fields and `event` holds its JSON."""
        events = gate_events(4)
        result = ingest(store, records(events))
        assert (result.stored, result.duplicates, result.dead_letters, result.chain_breaks) == (5, 0, 0, 0)
        assert result.stored_by_type == {"ToolsRegistered": 1, "ToolUse": 2, "ToolDenied": 1, "Substitute": 1}
        con = store.cursor()
        rows = con.execute(
            "SELECT event_id, type, time, producer_id, seq, hash, prev_hash, gate, workflow, agent, tool, call_id, "
            "run_id, thread_id, tenant, principal, decided_by, outcome, message, duration_ms, kafka_partition, "
            "kafka_offset, event FROM events ORDER BY seq"
        ).fetchall()
        assert [r[0] for r in rows] == [e.event_id for e in events]
        denied = next(e for e in events if e.type == "ToolDenied")  # type: ignore[attr-defined]
        row = next(r for r in rows if r[0] == denied.event_id)
        assert row[1:16] == (
            "ToolDenied",
            denied.time,
            denied.producer_id,
            denied.seq,
            denied.hash,
            denied.prev_hash,
            "shop",
            "support",
            "desk",
            "refund",
            denied.call_id,
            ACME.run_id,
            "t-1",
            "acme",
            "u-1",
        )
        assert row[16:20] == ("policy", "deny", "amount 1 is over the limit", None)
        assert row[20:22] == (0, denied.seq - 1)
        assert json.loads(row[22])["args"] == {"order_id": "A-1", "amount_cents": 1}
        used = next(r for r in rows if r[1] == "ToolUse")
        assert used[17] == "ok"
        assert used[19] is not None

    def test_redelivery_changes_nothing(self, store: AuditStore) -> None:
        """Ingesting the same records again (and a batch repeating itself) leaves every table as it was."""
        batch = records(gate_events(6))
        ingest(store, batch)
        before = snapshot(store)
        again = ingest(store, batch + batch[:3])
        assert (again.stored, again.duplicates, again.dead_letters, again.chain_breaks) == (0, 10, 0, 0)
        assert snapshot(store) == before

    def test_copies_within_one_batch_are_duplicates(self, store: AuditStore) -> None:
        """The same record twice in one new batch is stored once and counted once as a duplicate."""
        batch = records(gate_events(2))
        result = ingest(store, [*batch, batch[1]])
        assert (result.stored, result.duplicates, result.chain_breaks) == (3, 1, 0)
        assert breaks(store) == []

    @settings(max_examples=8, deadline=None)
    @given(order=st.permutations(range(16)), size=st.integers(min_value=2, max_value=8))
    def test_any_delivery_order_ends_in_the_same_store(self, order: list[int], size: int) -> None:
        """Whatever the order and batching of two producers' records over two partitions, every event is
        stored once and no chain break is recorded (no false alarm from out-of-order delivery)."""
        events = two_producers()
        batch = records(events[0::2], partition=0) + records(events[1::2], partition=1)
        shuffled = [batch[i] for i in order]
        with tempfile.TemporaryDirectory() as scratch, AuditStore(Path(scratch) / "audit.duckdb") as store:
            for start in range(0, len(shuffled), size):
                ingest(store, shuffled[start : start + size])
            assert breaks(store) == []
            assert store.close_open_gaps() == 0
            stored = store.cursor().execute("SELECT event_id FROM events ORDER BY ALL").fetchall()
            assert [i for (i,) in stored] == sorted(e.event_id for e in events)

    def test_later_partition_fills_the_holes_of_an_earlier_one(self, store: AuditStore) -> None:
        """A partition holding every other seq, then the one holding the rest: no break either way."""
        events = gate_events(8)
        ingest(store, records(events[1::2], partition=1))
        assert breaks(store) == []
        ingest(store, records(events[0::2], partition=0))
        assert breaks(store) == []
        assert store.close_open_gaps() == 0


class TestDeadLetters:
    def test_bad_records_are_dead_letters_and_the_good_ones_around_them_are_stored(self, db: Path) -> None:
        """No value (None or empty), oversize, not UTF-8, not JSON, JSON that is not an object, unknown type,
        newer schema and missing fields each become a dead letter with its reason; the events between them
        are stored."""
        events = gate_events(2)
        good = json.loads(encode_event(events[1]))
        missing = {k: v for k, v in good.items() if k != "producer_id"}
        bad: list[tuple[bytes | None, str]] = [
            (None, "no_value"),
            (b"", "no_value"),
            (b"x" * 9000, "oversize"),
            (b'{"type": "ToolUse", "note": "caf\xe9"}', "not_utf8"),  # Latin-1, not UTF-8
            (b"{not json", "not_json"),
            (b"[1, 2]", "not_an_event"),
            (b'"ToolUse"', "not_an_event"),
            (b"42", "not_an_event"),
            (json.dumps({**good, "type": "Teleported"}).encode(), "unknown_type"),
            (json.dumps({**good, "schema_version": 99}).encode(), "newer_schema"),
            (json.dumps(missing).encode(), "invalid"),
        ]
        batch = [record(encode_event(events[0]), 0)]
        batch += [record(value, 1 + i) for i, (value, _) in enumerate(bad)]
        batch += [record(encode_event(events[1]), 20), record(encode_event(events[2]), 21)]
        with AuditStore(db, max_value_bytes=8192) as store:
            result = ingest(store, batch)
            assert (result.stored, result.dead_letters) == (3, len(bad))
            assert result.dead_letters_by_reason == {
                "no_value": 2,
                "oversize": 1,
                "not_utf8": 1,
                "not_json": 1,
                "not_an_event": 3,
                "unknown_type": 1,
                "newer_schema": 1,
                "invalid": 1,
            }
            rows = store.cursor().execute('SELECT "offset", reason, error, key, value FROM dead_letters ORDER BY 1')
            dead = rows.fetchall()
        assert [(o, r) for o, r, *_ in dead] == [(1 + i, reason) for i, (_, reason) in enumerate(bad)]
        errors = [error for _, _, error, *_ in dead]
        assert "tombstone" in errors[0]
        assert "empty" in errors[1]
        assert "8192" in errors[2]
        assert "utf-8" in errors[3].lower()
        assert "Teleported" in errors[8]
        assert "producer_id" in errors[10]
        assert dead[4][3:] == (b"key", b"{not json")
        assert dead[2][4] == b"x" * 9000  # kept whole: a dead letter is set aside, never lost

    @pytest.mark.parametrize(
        ("reason", "kind"),
        [
            ("not UTF-8: 'utf-8' codec can't decode byte 0xe9 in position 31: invalid continuation byte", "not_utf8"),
            # The wording of events.codec before it told UTF-8 from JSON apart.
            ("not JSON: 'utf-8' codec can't decode byte 0xe9 in position 31: invalid continuation byte", "not_utf8"),
            ("not JSON: Expecting value: line 1 column 1 (char 0)", "not_json"),
            ("expected a JSON object, got list", "not_an_event"),
        ],
    )
    def test_both_wordings_of_a_parse_failure_have_one_kind(self, reason: str, kind: str) -> None:
        """A UTF-8 failure is `not_utf8` in the parser's old wording and its new one; JSON that is not an
        object is `not_an_event`, never `not_json`."""
        assert _reason_kind(reason) == kind

    def test_readers_and_metrics_know_every_reason(self) -> None:
        """The `dead_letter_records` query accepts exactly the store's reasons, and the metrics start with them."""
        assert QUERIES["dead_letter_records"].params["reason"].choices == DEAD_LETTER_REASONS
        assert materializer_metrics.DEAD_LETTER_REASONS == DEAD_LETTER_REASONS

    def test_any_other_error_while_reading_is_a_dead_letter(self, store: AuditStore) -> None:
        """A value that breaks the parser in an unplanned way (JSON nested too deep) is dead-lettered, not raised."""
        events = gate_events(1)
        batch = [record(encode_event(events[0]), 0), record(b"[" * 100_000, 1), record(encode_event(events[1]), 2)]
        result = ingest(store, batch)
        assert (result.stored, result.dead_letters_by_reason) == (2, {"error": 1})
        (error,) = store.cursor().execute("SELECT error FROM dead_letters").fetchone() or ("",)
        assert error.startswith("RecursionError")

    def test_a_redelivered_dead_letter_is_stored_once(self, store: AuditStore) -> None:
        """The same bad record delivered twice is one dead letter; the second time it counts as a duplicate."""
        first = ingest(store, [record(b"[1, 2]", 3)])
        second = ingest(store, [record(b"[1, 2]", 3)])
        assert (first.dead_letters, second.dead_letters, second.duplicates) == (1, 0, 1)
        assert store.counts().dead_letters == {"not_an_event": 1}

    def test_a_dead_lettered_event_is_held(self, store: AuditStore) -> None:
        """`holds` knows a record whose value names an event id but was dead-lettered (invalid, or its
        envelope disagreed), so the materializer does not take the broker's log for a new one."""
        events = gate_events(1)
        invalid = json.dumps({**json.loads(encode_event(events[0])), "seq": "not a number"}).encode()
        foreign = sent(events[1], 1, key=b"intruder")
        ingest(store, [record(invalid, 0), foreign])
        assert store.holds(TOPIC, 0, 0, invalid)
        assert store.holds(TOPIC, 0, 1, foreign.value)
        assert store.counts().dead_letters == {"invalid": 1, "envelope_mismatch": 1}
        assert not store.holds(TOPIC, 0, 2, encode_event(events[0]))


class TestEnvelope:
    def test_what_a_sink_sends_is_stored(self, store: AuditStore) -> None:
        """Records with the key and headers a KafkaSink sends are stored as events, nothing dead-lettered."""
        events = gate_events(3)
        result = ingest(store, [sent(e, i) for i, e in enumerate(events)])
        assert (result.stored, result.dead_letters) == (len(events), 0)

    def test_each_field_that_disagrees_is_named_with_both_values(self, store: AuditStore) -> None:
        """A foreign key, `ce_id` or `ce_type` makes the event an `envelope_mismatch` dead letter whose error
        names the field, what the record said and what the event says; two at once are both named."""
        events = gate_events(3)
        use = events[1]
        pid, eid = use.producer_id, use.event_id
        assert use.type == "ToolUse"  # type: ignore[attr-defined]
        batch = [
            sent(events[0], 0),
            sent(use, 1, key=b"intruder"),
            sent(use, 2, ce_id=b"forged-id"),
            sent(use, 3, ce_type=b"dev.callgate.ToolDenied"),
            sent(use, 4, key=b"intruder", ce_id=b"forged-id"),
        ]
        result = ingest(store, batch)
        assert (result.stored, result.dead_letters_by_reason) == (1, {"envelope_mismatch": 4})
        rows = store.cursor().execute('SELECT "offset", reason, error, key FROM dead_letters ORDER BY 1').fetchall()
        key_error = f"key 'intruder' is not the event's producer_id {pid!r}"
        id_error = f"header ce_id 'forged-id' is not the event's event_id {eid!r}"
        type_error = (
            "header ce_type 'dev.callgate.ToolDenied' is not 'dev.callgate.ToolUse' (the event's type 'ToolUse')"
        )
        assert rows == [
            (1, "envelope_mismatch", key_error, b"intruder"),
            (2, "envelope_mismatch", id_error, pid.encode()),
            (3, "envelope_mismatch", type_error, pid.encode()),
            (4, "envelope_mismatch", f"{key_error}; {id_error}", b"intruder"),
        ]

    def test_a_record_with_cloudevents_headers_and_no_key_is_a_mismatch(self, store: AuditStore) -> None:
        """A sink keys every event by its producer: a record in the sink's form without a key is dead-lettered."""
        event = gate_events(0)[0]
        result = ingest(store, [sent(event, 0, key=None)])
        assert result.dead_letters_by_reason == {"envelope_mismatch": 1}
        (error,) = store.cursor().execute("SELECT error FROM dead_letters").fetchone() or ("",)
        assert error == f"the record has no key; the event's producer_id is {event.producer_id!r}"

    def test_every_copy_of_a_repeated_header_must_match(self, store: AuditStore) -> None:
        """A second `ce_id` header that disagrees is a mismatch, though the first one agrees."""
        event = gate_events(0)[0]
        good = sent(event, 0)
        doubled = RawRecord(TOPIC, 0, 0, good.key, good.value, None, (*good.headers, ("ce_id", b"other")))
        assert ingest(store, [doubled]).dead_letters_by_reason == {"envelope_mismatch": 1}

    def test_absent_headers_are_not_checked(self, store: AuditStore) -> None:
        """Headers a record does not carry are not required: `ce_type` alone, or `ce_specversion` alone, with
        the right key, is stored."""
        events = gate_events(1)
        first, second = events
        batch = [
            RawRecord(
                TOPIC,
                0,
                0,
                first.producer_id.encode(),
                encode_event(first),
                None,
                (("ce_type", b"dev.callgate.ToolsRegistered"),),
            ),
            RawRecord(
                TOPIC, 0, 1, second.producer_id.encode(), encode_event(second), None, (("ce_specversion", b"1.0"),)
            ),
        ]
        result = ingest(store, batch)
        assert (result.stored, result.dead_letters) == (2, 0)

    def test_without_cloudevents_headers_the_key_is_still_checked(self, store: AuditStore) -> None:
        """A record with no `ce_` header (a hand-made producer, a replay) is stored when keyed by its
        producer; with no key, or another producer's, it is an envelope mismatch all the same."""
        events = gate_events(2)
        own = events[2].producer_id.encode()
        batch = [
            RawRecord(TOPIC, 0, 0, None, encode_event(events[0])),
            RawRecord(TOPIC, 0, 1, b"someone-else", encode_event(events[1])),
            RawRecord(TOPIC, 0, 2, own, encode_event(events[2]), None, (("content-type", b"application/json"),)),
        ]
        result = ingest(store, batch)
        assert (result.stored, result.dead_letters, result.dead_letters_by_reason) == (1, 2, {"envelope_mismatch": 2})

    def test_a_loss_report_is_not_checked(self, store: AuditStore) -> None:
        """A loss report is not an event: a foreign key and headers leave it a gap, as before."""
        events = gate_events(1)
        producer = events[0].producer_id
        value = encode_loss_report(
            LossReport(report_id="r-5", producer_id=producer, first_seq=5, last_seq=6, spool="/s")
        )
        report = RawRecord(
            TOPIC, 0, 9, b"intruder", value, None, (("ce_id", b"x"), ("ce_type", b"dev.callgate.ToolUse"))
        )
        result = ingest(store, [*records(events), report])
        assert (result.dead_letters, result.chain_breaks_by_kind) == (0, {"gap": 1})
        assert breaks(store) == [(producer, 5, "gap")]

    def test_aiokafkas_records_are_read_as_they_come(self, store: AuditStore) -> None:
        """aiokafka's `ConsumerRecord`s, which the materializer hands over without a copy, are read as
        `RawRecord`s are: their events stored, their envelope checked, a dead letter's Kafka time kept."""
        from aiokafka.structs import ConsumerRecord

        events = gate_events(2)

        def consumed(raw: RawRecord) -> ConsumerRecord[bytes, bytes]:
            return ConsumerRecord(
                raw.topic, raw.partition, raw.offset, 1_700_000_000_123, 0, raw.key, raw.value, None, 0, 0, raw.headers
            )

        good = [consumed(sent(e, i)) for i, e in enumerate(events)]
        foreign = consumed(sent(events[-1], len(events), ce_id=b"not-the-event-id"))
        result = store.ingest([*good, foreign], {(TOPIC, 0): len(events) + 1})
        assert (result.stored, result.dead_letters_by_reason) == (len(events), {"envelope_mismatch": 1})
        (row,) = store.cursor().execute("SELECT kafka_time, error FROM dead_letters").fetchall()
        assert row[0] == datetime.fromtimestamp(1_700_000_000.123, UTC)
        assert "not-the-event-id" in row[1]


class TestChainChecks:
    def test_tampered_content_with_the_old_hash_is_tamper(self, store: AuditStore) -> None:
        """A field changed after sealing, hash kept, is recorded as tamper at its seq, and nowhere else."""
        events = gate_events(4)
        batch = records(events)
        victim = events[2]
        batch[2] = record(forged(victim, rehash=False, tenant="globex"), 2)
        result = ingest(store, batch)
        assert (result.stored, result.chain_breaks, result.chain_breaks_by_kind) == (5, 1, {"tamper": 1})
        ((detail, event_id),) = store.cursor().execute("SELECT detail, event_id FROM chain_breaks").fetchall()
        assert breaks(store) == [(victim.producer_id, victim.seq, "tamper")]
        assert "hash does not match the content" in detail
        assert event_id == victim.event_id

    def test_tampered_content_in_the_gates_own_wire_form_is_tamper(self, store: AuditStore) -> None:
        """A forgery written exactly as a gate writes (the parser's fast road) is caught the same way."""
        events = gate_events(4)
        batch = records(events)
        victim = events[2]
        data = json.loads(encode_event(victim))
        data["args"] = {"order_id": "A-1", "amount_cents": 999}
        wire = encode_event(parse_event(data))
        assert wire != encode_event(victim)
        batch[2] = record(wire, 2)
        result = ingest(store, batch)
        assert (result.stored, result.chain_breaks_by_kind) == (5, {"tamper": 1})
        assert breaks(store) == [(victim.producer_id, victim.seq, "tamper")]
        (stored,) = store.cursor().execute("SELECT event FROM events WHERE seq = $s", {"s": victim.seq}).fetchone() or (
            "",
        )
        assert stored.encode() == wire

    def test_rehashed_forgery_breaks_the_link_of_the_next_event(self, store: AuditStore) -> None:
        """A forgery with a recomputed hash passes its own check but the next event no longer links to it."""
        events = gate_events(4)
        batch = records(events)
        victim = events[2]
        batch[2] = record(forged(victim, rehash=True, tenant="globex"), 2)
        ingest(store, batch)
        assert breaks(store) == [(victim.producer_id, victim.seq + 1, "tamper")]
        (detail,) = store.cursor().execute("SELECT detail FROM chain_breaks").fetchone() or ("",)
        assert f"prev_hash does not link to the hash of seq {victim.seq}" in detail

    def test_a_broken_link_is_found_whichever_side_arrives_first(self, db: Path) -> None:
        """The forgery's successor is flagged whether it was stored before or after the forgery."""
        events = gate_events(4)
        forgery = record(forged(events[2], rehash=True, tenant="globex"), 2)
        rest = [r for r in records(events) if r.offset != 2]
        for order in ([forgery, *rest], [*rest, forgery]):
            db.unlink(missing_ok=True)
            with AuditStore(db) as store:
                for r in order:
                    ingest(store, [r])
                assert breaks(store) == [(events[0].producer_id, events[2].seq + 1, "tamper")]

    def test_seq_one_must_start_from_zeros(self, store: AuditStore) -> None:
        """A rehashed first event whose prev_hash is not 64 zeros is tamper at seq 1."""
        first = gate_events(0)[0]
        assert first.prev_hash == ZERO_HASH
        ingest(store, [record(forged(first, rehash=True, prev_hash="f" * 64), 0)])
        assert breaks(store) == [(first.producer_id, 1, "tamper")]

    def test_another_event_at_a_stored_seq_is_a_conflict(self, store: AuditStore) -> None:
        """A second, different event at a stored (producer, seq) is a conflict: the first stays, the second is
        kept as evidence, and delivering it again records nothing new."""
        events = gate_events(3)
        ingest(store, records(events))
        original = events[2]
        rival = forged(original, rehash=True, event_id="rival", tenant="globex")
        result = ingest(store, [record(rival, 10)])
        assert (result.stored, result.chain_breaks, result.chain_breaks_by_kind) == (0, 1, {"conflict": 1})
        con = store.cursor()
        ((event_id, detail, evidence),) = con.execute("SELECT event_id, detail, evidence FROM chain_breaks").fetchall()
        assert (event_id, json.loads(evidence)["tenant"]) == ("rival", "globex")
        assert original.event_id in detail
        stored = con.execute("SELECT event_id FROM events WHERE seq = $s", {"s": original.seq}).fetchall()
        assert stored == [(original.event_id,)]
        again = ingest(store, [record(rival, 10)])
        assert again.chain_breaks == 0
        assert breaks(store) == [(original.producer_id, original.seq, "conflict")]

    def test_two_events_at_one_seq_in_one_batch_keep_the_first(self, store: AuditStore) -> None:
        """Within one batch the record delivered first wins the seq; the other is a conflict."""
        events = gate_events(2)
        rival = forged(events[1], rehash=True, event_id="rival")
        result = ingest(store, [*records(events[:2]), record(rival, 5), *records(events[2:], start=2)])
        assert (result.stored, result.chain_breaks) == (3, 1)
        ids = store.cursor().execute("SELECT event_id FROM events ORDER BY seq").fetchall()
        assert [i for (i,) in ids] == [e.event_id for e in events]

    def test_same_event_id_with_other_content_is_a_conflict(self, store: AuditStore) -> None:
        """A redelivery that keeps the event id and hash but changes the content is a conflict, not a duplicate."""
        events = gate_events(1)
        ingest(store, records(events))
        result = ingest(store, [record(forged(events[1], rehash=False, principal="root"), 9)])
        assert (result.duplicates, result.chain_breaks) == (0, 1)
        assert breaks(store) == [(events[1].producer_id, events[1].seq, "conflict")]

    def test_an_event_id_stored_at_a_neighbouring_seq_is_a_conflict(self, store: AuditStore) -> None:
        """A new seq that reuses the event id of the event just before it is a conflict naming that place."""
        events = gate_events(2)
        ingest(store, records(events))
        last = events[-1]
        copy = forged(last, rehash=True, seq=last.seq + 1, prev_hash=last.hash)
        result = ingest(store, [record(copy, 10)])
        assert (result.stored, result.chain_breaks_by_kind) == (0, {"conflict": 1})
        ((detail,),) = store.cursor().execute("SELECT detail FROM chain_breaks").fetchall()
        assert f"is already stored for producer {last.producer_id} seq {last.seq}" in detail


class TestVersionOneEvents:
    """Events of schema version 1 (hashed over their canonical JSON) stay readable and verifiable
    beside version 2 ones (hashed over their bytes)."""

    @staticmethod
    def as_version_1(events: list[EventBase]) -> list[EventBase]:
        producer = Producer(schema_version=1)
        return [
            producer.seal(type(e), e.model_dump(exclude={"producer_id", "seq", "prev_hash", "hash", "schema_version"}))
            for e in events
        ]

    def test_both_versions_are_stored_and_verified(self, store: AuditStore) -> None:
        old = self.as_version_1(gate_events(3, "old"))
        new = gate_events(3, "new")
        assert {e.schema_version for e in old} == {1}
        assert {e.schema_version for e in new} == {2}
        result = ingest(store, records(old) + records(new, start=len(old)))
        assert (result.stored, result.chain_breaks, result.dead_letters) == (len(old) + len(new), 0, 0)
        rows = store.cursor().execute("SELECT schema_version, hash = content_hash FROM events").fetchall()
        assert sorted(rows) == sorted([(1, True)] * len(old) + [(2, True)] * len(new))

    def test_a_changed_version_1_event_is_tamper(self, store: AuditStore) -> None:
        old = self.as_version_1(gate_events(3, "old"))
        batch = records(old)
        batch[2] = record(forged(old[2], rehash=False, tenant="globex"), 2)
        result = ingest(store, batch)
        assert result.chain_breaks_by_kind == {"tamper": 1}
        assert breaks(store) == [(old[2].producer_id, old[2].seq, "tamper")]


class TestGaps:
    def test_close_open_gaps_records_missing_seqs_and_a_fill_removes_them(self, store: AuditStore) -> None:
        """Missing seqs become 'gap' rows once gaps are closed; when the missing events arrive the rows go."""
        events = gate_events(6)
        missing = [events[2], events[3]]
        ingest(store, records([e for e in events if e not in missing]))
        assert breaks(store) == []
        assert store.close_open_gaps() == 2
        producer = events[0].producer_id
        assert breaks(store) == [(producer, 3, "gap"), (producer, 4, "gap")]
        (detail,) = store.cursor().execute("SELECT any_value(detail) FROM chain_breaks").fetchone() or ("",)
        assert detail == "seqs 3..4 are missing (2 events)"
        assert store.close_open_gaps() == 0  # recorded once
        ingest(store, records([missing[0]], start=20))
        assert breaks(store) == [(producer, 4, "gap")]
        ingest(store, records([missing[1]], start=21))
        assert breaks(store) == []

    def test_grace_time_skips_holes_whose_neighbours_are_recent(self, store: AuditStore) -> None:
        """With older_than, only holes whose neighbouring events were stored before that time are recorded."""
        events = gate_events(3)
        ingest(store, records([events[0], events[2], events[3]]))
        assert store.close_open_gaps(older_than=datetime.now(UTC) - timedelta(minutes=5)) == 0
        assert breaks(store) == []
        assert store.close_open_gaps(older_than=datetime.now(UTC) + timedelta(seconds=1)) == 1
        assert breaks(store) == [(events[0].producer_id, 2, "gap")]

    def test_a_hole_at_the_start_is_a_gap(self, store: AuditStore) -> None:
        """Seqs missing before the first stored event count too (the chain starts at 1)."""
        events = gate_events(2)
        ingest(store, records(events[2:]))
        assert store.close_open_gaps() == 2
        assert [seq for _, seq, _ in breaks(store)] == [1, 2]


class TestLossReports:
    @staticmethod
    def report(producer: str, first: int, last: int) -> RawRecord:
        value = encode_loss_report(
            LossReport(report_id=f"r-{first}", producer_id=producer, first_seq=first, last_seq=last, spool="/s")
        )
        return RawRecord(TOPIC, 0, 100 + first, producer.encode(), value, 1_700_000_000_000)

    def test_a_reported_loss_at_the_tail_is_a_gap_at_once(self, store: AuditStore) -> None:
        """A loss report past a chain's last stored event records a gap at its first seq, keeps the report."""
        events = gate_events(3)
        producer = events[0].producer_id
        result = store.ingest(batch := [*records(events), self.report(producer, 5, 7)], next_offsets(batch))
        assert result.chain_breaks_by_kind == {"gap": 1}
        assert result.stored + result.duplicates + result.chain_breaks == len(batch)
        assert breaks(store) == [(producer, 5, "gap")]
        (detail, evidence) = store.cursor().execute("SELECT detail, evidence FROM chain_breaks").fetchone() or ("", "")
        assert "seqs 5..7 lost before reaching the spool" in detail
        assert json.loads(evidence)["last_seq"] == 7

    def test_a_report_whose_first_seqs_arrived_is_a_gap_at_the_first_missing_one(self, store: AuditStore) -> None:
        """Reported seqs 2..n+2 of a chain whose 1..n are stored: the loss is seq n+1, recorded at once."""
        events = gate_events(3)
        producer, n = events[0].producer_id, len(events)
        result = store.ingest(batch := [*records(events), self.report(producer, 2, n + 2)], next_offsets(batch))
        assert result.chain_breaks_by_kind == {"gap": 1}
        assert breaks(store) == [(producer, n + 1, "gap")]

    def test_a_repeated_report_or_one_for_a_stored_event_adds_nothing(self, store: AuditStore) -> None:
        """The same report again is a duplicate; a report whose seqs are all stored records nothing."""
        events = gate_events(3)
        producer = events[0].producer_id
        ingest(store, [*records(events), self.report(producer, 5, 5)])
        result = store.ingest([again := self.report(producer, 5, 5)], next_offsets([again]))
        assert (result.duplicates, result.chain_breaks) == (1, 0)
        ingest(store, [self.report(producer, 2, 3)])
        assert breaks(store) == [(producer, 5, "gap")]

    def test_a_malformed_report_is_a_dead_letter(self, store: AuditStore) -> None:
        """A value that starts like a loss report but is not one is kept as a dead letter."""
        bad = RawRecord(TOPIC, 0, 1, b"k", b'{"type":"LossReport","first_seq":0}', 1_700_000_000_000)
        result = store.ingest([bad], next_offsets([bad]))
        assert result.dead_letters == 1
        assert breaks(store) == []


class TestOffsets:
    def test_offsets_are_stored_with_the_batch(self, store: AuditStore) -> None:
        """The next offsets of each partition are what the last committed ingest said; other topics are apart."""
        events = gate_events(3)
        store.ingest(records(events[:2]), {(TOPIC, 0): 2, (TOPIC, 1): 40, ("other", 0): 5})
        store.ingest(records(events[2:], start=2), {(TOPIC, 0): 4})
        assert store.offsets(TOPIC) == {0: 4, 1: 40}
        assert store.offsets("other") == {0: 5}
        assert store.offsets("never") == {}

    def test_a_failing_ingest_leaves_events_and_offsets_unchanged(self, store: AuditStore) -> None:
        """An error inside the transaction (a negative offset) rolls back the events written before it."""
        events = gate_events(4)
        store.ingest(records(events[:2]), {(TOPIC, 0): 2})
        before = snapshot(store)
        with pytest.raises(ValueError, match="must not be negative"):
            store.ingest(records(events[2:], start=2), {(TOPIC, 0): 5, (TOPIC, 1): -1})
        assert snapshot(store) == before
        assert store.offsets(TOPIC) == {0: 2}
        result = store.ingest(records(events[2:], start=2), {(TOPIC, 0): 5})
        assert result.stored == 3

    def test_reset_partition_forgets_its_offset_only(self, store: AuditStore) -> None:
        """reset_partition drops one stored offset and keeps the events and the other partitions."""
        store.ingest(records(gate_events(1)), {(TOPIC, 0): 2, (TOPIC, 1): 9})
        store.reset_partition(TOPIC, 0)
        assert store.offsets(TOPIC) == {1: 9}
        assert store.counts().total_events == 2


class TestMigrations:
    def test_applied_once_and_reopening_keeps_the_data(self, db: Path) -> None:
        """A new file gets every migration once; reopening applies none again and keeps the events."""
        with AuditStore(db) as store:
            ingest(store, records(gate_events(2)))
        with AuditStore(db) as store:
            versions = store.cursor().execute("SELECT version, name FROM schema_migrations ORDER BY 1").fetchall()
            assert versions == [(m.version, m.name) for m in MIGRATIONS]
            assert store.schema_version() == SCHEMA_VERSION
            assert store.counts().total_events == 3

    def test_a_schema_9_store_keeps_its_events_and_every_id_once(
        self, db: Path, tmp_path: Path, older_store: Callable[[Path, int], None]
    ) -> None:
        """Migration 10 rebuilds `events` without the in-memory key: the rows stay, in their order,
        each with its id as a UUID (none for an id that is not one), and a reused id is still refused."""
        events = gate_events(3)
        plain = Producer().seal(ToolUseEvent, {**TestEventIds.fields(), "event_id": "order-refund-1"})
        with AuditStore(tmp_path / "today.duckdb") as today:
            ingest(today, [*records(events), *records([plain], partition=1)])
        older_store(db, 9)
        con = duckdb.connect(str(db))
        con.execute(f"ATTACH '{tmp_path / 'today.duckdb'}' AS today (READ_ONLY)")
        con.execute("INSERT INTO events SELECT * EXCLUDE (event_uuid) FROM today.events")
        con.execute("INSERT INTO kafka_offsets SELECT * FROM today.kafka_offsets")
        con.close()
        with AuditStore(db) as store:
            con = store.cursor()
            rows = con.execute("SELECT event_id, CAST(event_uuid AS VARCHAR) FROM events").fetchall()
            assert rows == [(e.event_id, e.event_id) for e in events] + [("order-refund-1", None)]
            assert con.execute("SELECT count(*) FROM duckdb_indexes() WHERE table_name = 'events'").fetchall() == [(0,)]
            keys = (
                "SELECT count(*) FROM duckdb_constraints() WHERE table_name = 'events'"
                " AND constraint_type = 'PRIMARY KEY'"
            )
            assert con.execute(keys).fetchall() == [(0,)]
            reused = [
                Producer().seal(ToolUseEvent, {**TestEventIds.fields(), "event_id": event_id})
                for event_id in (events[2].event_id, "order-refund-1")
            ]
            result = ingest(store, records(reused, partition=2))
            assert (result.stored, result.chain_breaks_by_kind) == (0, {"conflict": 2})

    def test_a_schema_10_store_keeps_its_events_with_their_json_compressed_by_zstd(
        self, db: Path, tmp_path: Path, older_store: Callable[[Path, int], None]
    ) -> None:
        """Migration 11 rebuilds `events` with its event JSON compressed with zstd: every row stays as
        it was, in its order, the chains still verify, and the next events are stored beside them."""
        events = gate_events(4)
        with AuditStore(tmp_path / "today.duckdb") as today:
            ingest(today, records(events[:3]))
            before = today.cursor().execute("SELECT * EXCLUDE (ingested_at) FROM events").fetchall()
        older_store(db, 10)
        con = duckdb.connect(str(db))
        con.execute(f"ATTACH '{tmp_path / 'today.duckdb'}' AS today (READ_ONLY)")
        con.execute("INSERT INTO events SELECT * FROM today.events")
        con.execute("INSERT INTO kafka_offsets SELECT * FROM today.kafka_offsets")
        con.close()
        with AuditStore(db) as store:
            con = store.cursor()
            assert con.execute("SELECT * EXCLUDE (ingested_at) FROM events").fetchall() == before
            result = ingest(store, records(events[3:], start=3))
            assert (result.stored, result.chain_breaks) == (len(events) - 3, 0)
            con.execute("CHECKPOINT").fetchall()
            compression = con.execute(
                "SELECT DISTINCT compression FROM pragma_storage_info('events')"
                " WHERE column_name = 'event' AND segment_type = 'JSON'"
            ).fetchall()
            # What the file holds decides (duckdb 1.5 does not render the compression in `duckdb_tables().sql`).
            assert compression == [("ZSTD",)]

    def test_a_file_from_a_newer_version_is_refused(self, db: Path) -> None:
        """A file whose schema is newer than this code knows raises StoreError instead of being written."""
        AuditStore(db).close()
        con = duckdb.connect(str(db))
        con.execute("INSERT INTO schema_migrations VALUES (99, 'future', now())")
        con.close()
        with pytest.raises(StoreError, match="newer"):
            AuditStore(db)

    def test_read_only_needs_a_migrated_file(self, db: Path) -> None:
        """A read-only open of a file without the schema raises StoreError saying to open it for writing."""
        duckdb.connect(str(db)).close()
        with pytest.raises(StoreError, match="open it for writing"):
            AuditStore(db, read_only=True)


class TestReadOnly:
    def test_reads_and_refuses_writes(self, db: Path) -> None:
        """A read-only store reads what was written and raises StoreError on every write."""
        with AuditStore(db) as store:
            ingest(store, records(gate_events(1)))
        with AuditStore(db, read_only=True) as reader:
            assert reader.counts().events == {"ToolsRegistered": 1, "ToolUse": 1}
            with pytest.raises(StoreError, match="read-only"):
                reader.ingest([], {})
            with pytest.raises(StoreError, match="read-only"):
                reader.close_open_gaps()

    def test_counts_summarize_the_store(self, store: AuditStore) -> None:
        """counts() gives events by type, dead letters by reason, chain breaks by kind and the newest event time."""
        events = gate_events(3)
        ingest(store, [*records(events[:2]), record(None, 10), *records(events[3:], start=3)])
        store.close_open_gaps()
        counts = store.counts()
        assert counts.events == {"ToolsRegistered": 1, "ToolUse": 1, "Substitute": 1}
        assert (counts.dead_letters, counts.chain_breaks) == ({"no_value": 1}, {"gap": 1})
        assert counts.last_event_time == events[-1].time


# The child holds the file for writing until its stdin closes; "holding" on stdout says it has it.
HOLDER = """
import sys
import duckdb
con = duckdb.connect(sys.argv[1])
con.execute("SELECT count(*) FROM events").fetchall()
print("holding", flush=True)
sys.stdin.read()
"""


class TestLocking:
    def test_a_file_held_by_another_process_raises_store_locked_error(self, db: Path) -> None:
        """Opening, even read-only, a file another process writes raises StoreLockedError naming file and PID."""
        AuditStore(db).close()
        with subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        ) as holder:
            try:
                assert holder.stdout is not None
                assert holder.stdout.readline().strip() == "holding"
                with pytest.raises(StoreLockedError) as caught:
                    AuditStore(db, read_only=True)
                message = str(caught.value)
                assert str(db) in message
                assert f"PID {holder.pid}" in message
                assert "--api" in message
                assert caught.value.pid == holder.pid
            finally:
                holder.kill()
                holder.wait()

    def test_a_read_only_open_beside_this_process_writer_is_refused(self, store: AuditStore, db: Path) -> None:
        """Within one process, a read-only open of a file the store holds raises StoreLockedError too."""
        with pytest.raises(StoreLockedError, match="this process"):
            AuditStore(db, read_only=True)
        assert store.cursor().execute("SELECT count(*) FROM events").fetchone() == (0,)


class TestRowGroups:
    """A full batch (one row group, `ROW_GROUP_ROWS` records) is written to the file itself, not to
    the WAL first and to the file again at a checkpoint; every writable open does it."""

    @staticmethod
    def wal_bytes(db: Path) -> int:
        wal = db.with_name(db.name + ".wal")
        return wal.stat().st_size if wal.exists() else 0

    def test_a_full_batch_goes_to_the_file_past_the_wal_after_a_reopen_too(self, tmp_path: Path) -> None:
        db = tmp_path / "rows.duckdb"
        events = gate_events(2 * ROW_GROUP_ROWS - 1)
        assert len(events) == 2 * ROW_GROUP_ROWS
        halves = records(events[:ROW_GROUP_ROWS]), records(events[ROW_GROUP_ROWS:], start=ROW_GROUP_ROWS)
        payload = sum(len(r.value or b"") for r in halves[0])
        for half in halves:
            with AuditStore(db) as store:
                assert ingest(store, half).stored == ROW_GROUP_ROWS
                # The WAL holds where the rows went, not the rows (a tenth of their JSON at most).
                assert self.wal_bytes(db) < payload / 10
                row_groups = (
                    store.cursor()
                    .execute("SELECT count(DISTINCT row_group_id) FROM pragma_storage_info('events')")
                    .fetchone()
                )
        assert row_groups == (2,)
        with AuditStore(db, read_only=True) as store:
            assert store.counts().total_events == 2 * ROW_GROUP_ROWS

    @pytest.mark.parametrize("stem", ["memory", "temp", "system", "main"])
    def test_a_file_named_like_a_duckdb_database_opens(self, tmp_path: Path, stem: str) -> None:
        db = tmp_path / f"{stem}.duckdb"
        with AuditStore(db) as store:
            assert ingest(store, records(gate_events(2))).stored == 3
        with AuditStore(db, read_only=True) as store:
            assert store.counts().total_events == 3

    def test_batches_smaller_than_a_row_group_are_checkpointed_out_of_the_wal(
        self, store: AuditStore, db: Path
    ) -> None:
        """Small batches go through the WAL; DuckDB's automatic checkpoints move them to the file, so
        neither the WAL nor the store's memory grows with them. A result left unread on any of the
        store's connections kept a transaction open, and no checkpoint ever ran."""
        store.cursor().execute("SET checkpoint_threshold = '1MB'").fetchall()
        events = gate_events(5_999)
        for start in range(0, len(events), 1_000):
            batch = records(events[start : start + 1_000], start=start)
            ingest(store, batch)
            # Below the threshold plus the batch just committed (the checkpoint follows its commit).
            assert self.wal_bytes(db) < 1024 * 1024 + sum(len(r.value or b"") for r in batch) * 2
        assert store.counts().total_events == 6_000

    def test_the_buffer_pool_keeps_at_most_twice_the_table_cache_after_an_ingest(self, tmp_path: Path) -> None:
        """DuckDB keeps the blocks its checkpoints write cached up to its memory limit: the same
        ingests leave them all in the pool without a bound, and at most twice `table_cache_bytes`
        with one (evicted down to it); the memory limit is put back each time."""
        budget = 256 * 1024
        events = gate_events(2_999)
        peaks: dict[int | None, int] = {}
        for cache in (None, budget):
            with AuditStore(tmp_path / f"cache-{cache}.duckdb", table_cache_bytes=cache) as store:
                reader = store.cursor()
                reader.execute("SET checkpoint_threshold = '256KB'").fetchall()
                limit = reader.execute("SELECT current_setting('memory_limit')").fetchall()
                peaks[cache] = 0
                for start in range(0, len(events), 1_000):
                    ingest(store, records(events[start : start + 1_000], start=start))
                    (cached,) = reader.execute(
                        "SELECT coalesce(sum(memory_usage_bytes), 0) FROM duckdb_memory() WHERE tag = 'BASE_TABLE'"
                    ).fetchall()[0]
                    peaks[cache] = max(peaks[cache], int(cached))
                    assert reader.execute("SELECT current_setting('memory_limit')").fetchall() == limit
                assert store.counts().total_events == 3_000
        assert peaks[None] > 4 * budget, peaks
        assert peaks[budget] <= 2 * budget, peaks

    def test_a_writable_open_spills_beside_its_file(self, store: AuditStore, db: Path) -> None:
        """Pages DuckDB spills go to `<file>.tmp`, not to `.tmp` in the directory the process runs in."""
        rows = store.cursor().execute("SELECT current_setting('temp_directory')").fetchall()
        assert rows == [(f"{db}.tmp",)]

    def test_a_second_writable_open_in_this_process_is_refused(self, store: AuditStore, db: Path) -> None:
        with pytest.raises(StoreLockedError, match="this process"):
            AuditStore(db)
        assert store.cursor().execute("SELECT count(*) FROM events").fetchone() == (0,)


class TestEventIds:
    """Every event id is stored once, looked up without an index of every id in memory: by its UUID
    in the row groups of its time, or by its text among the rows whose id is none."""

    @staticmethod
    def fields(**changes: Any) -> dict[str, Any]:
        """The fields of a new ToolUse event (a new UUIDv7 id, now) with `changes`."""
        return {
            "event_id": new_event_id(),
            "time": datetime.now(UTC),
            "gate": "shop",
            "tool": "refund",
            "tenant": "acme",
            "decisions": [],
            "args": {"n": 1},
            "outcome": "ok",
            "duration_ms": 0.1,
            **changes,
        }

    @classmethod
    def sealed(cls, n: int, producer: Producer | None = None, **changes: Any) -> list[EventBase]:
        producer = producer or Producer()
        return [producer.seal(ToolUseEvent, cls.fields(**changes)) for _ in range(n)]

    def test_an_id_stored_many_row_groups_ago_is_a_conflict_in_a_batch_of_new_ones(self, store: AuditStore) -> None:
        """Another producer's event reusing the first stored id, among fresh events: found, not stored."""
        first = self.sealed(1)
        ingest(store, records(first))
        offset = 1
        for _ in range(2):
            batch = records(self.sealed(ROW_GROUP_ROWS), start=offset)
            offset += len(batch)
            assert ingest(store, batch).stored == ROW_GROUP_ROWS
        (reuse,) = self.sealed(1, Producer(), event_id=first[0].event_id)
        batch = [*records(self.sealed(99), start=offset), *records([reuse], start=offset + 99)]
        result = ingest(store, batch)
        assert (result.stored, result.chain_breaks_by_kind) == (99, {"conflict": 1})
        ((detail,),) = store.cursor().execute("SELECT detail FROM chain_breaks").fetchall()
        assert f"event id {first[0].event_id} " in detail
        assert f"already stored for producer {first[0].producer_id} seq 1" in detail

    def test_an_id_that_is_no_uuid_is_looked_up_by_its_text(self, store: AuditStore) -> None:
        (plain,) = self.sealed(1, event_id="order-refund-1")
        ingest(store, records([plain]))
        (reuse,) = self.sealed(1, Producer(), event_id="order-refund-1")
        result = ingest(store, records([reuse], start=1))
        assert (result.stored, result.chain_breaks_by_kind) == (0, {"conflict": 1})
        assert store.holds(TOPIC, 0, 0, encode_event(plain))

    def test_a_row_stored_without_its_uuid_is_still_found(self, store: AuditStore) -> None:
        """A row whose `event_uuid` is missing (written by hand) is looked up by its text."""
        (event,) = self.sealed(1)
        ingest(store, records([event]))
        store.cursor().execute("UPDATE events SET event_uuid = NULL").fetchall()
        assert store.holds(TOPIC, 0, 0, encode_event(event))
        (reuse,) = self.sealed(1, Producer(), event_id=event.event_id)
        assert ingest(store, records([reuse], start=1)).chain_breaks_by_kind == {"conflict": 1}

    def test_another_spelling_of_a_stored_uuid_is_another_id(self, store: AuditStore) -> None:
        """Ids are compared as text: the same UUID in capitals is a distinct event id, stored."""
        (event,) = self.sealed(1)
        ingest(store, records([event]))
        (other,) = self.sealed(1, Producer(), event_id=event.event_id.upper())
        assert ingest(store, records([other], start=1)).stored == 1
        rows = store.cursor().execute("SELECT count(DISTINCT event_id), count(DISTINCT event_uuid) FROM events")
        assert rows.fetchone() == (2, 1)

    @staticmethod
    def index_bytes(store: AuditStore) -> int:
        rows = store.cursor().execute("SELECT memory_usage_bytes FROM duckdb_memory() WHERE tag = 'ART_INDEX'")
        return int(rows.fetchall()[0][0])

    def test_the_memory_of_the_stores_indexes_does_not_grow_with_its_events(self, store: AuditStore) -> None:
        """Ids are looked up in the table itself: an index of every id (some 70 bytes each, kept
        whole in memory by DuckDB) would take a store's memory limit with enough events."""
        # Between checkpoints (a checkpoint writes an index out; a full batch, written past the WAL,
        # brings none), where an index of every id is whole in memory.
        store.cursor().execute("SET checkpoint_threshold = '1GB'").fetchall()
        producer = Producer()
        ingest(store, records(self.sealed(2_000, producer)))
        before = self.index_bytes(store)
        for start in range(2_000, 40_000, 2_000):
            assert ingest(store, records(self.sealed(2_000, producer), start=start)).stored == 2_000
        assert self.index_bytes(store) <= before


class TestFastRead:
    @staticmethod
    def contents(store: AuditStore) -> dict[str, list[tuple[Any, ...]]]:
        con = store.cursor()
        return {
            table: con.execute(f"SELECT * EXCLUDE ({stamp}) FROM {table} ORDER BY ALL").fetchall()  # noqa: S608
            for table, stamp in (
                ("events", "ingested_at"),
                ("dead_letters", "received_at"),
                ("kafka_offsets", "updated_at"),
                ("chain_breaks", "recorded_at"),
            )
        }

    def test_the_store_is_the_same_with_or_without_the_fast_read(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Good events, every kind of bad record, tampering, conflicts and envelope mismatches end in the
        same rows whether events.fast_read or only pydantic reads them."""
        events = gate_events(6)
        good = json.loads(encode_event(events[1]))
        bad = [
            b"{not json",
            b"[1, 2]",
            json.dumps({**good, "type": "Teleported"}).encode(),
            json.dumps({**good, "schema_version": 99}).encode(),
            json.dumps({**good, "seq": 1.0}).encode(),
            json.dumps({**good, "time": "2026-12-01T12:00:00.1234567Z"}).encode(),
            json.dumps({k: v for k, v in good.items() if k != "gate"}).encode(),
            encode_event(events[1]).replace(b'"gate":"shop"', b'"gate":"shop","extra":1'),
        ]
        batch = records(events)
        batch[2] = record(forged(events[2], rehash=False, tenant="globex"), 2)
        batch += [record(value, 100 + i) for i, value in enumerate(bad)]
        batch += [sent(events[3], 200, key=b"intruder"), record(forged(events[4], rehash=True, tenant="x"), 201)]
        batch += records(gate_events(3, "desk"), start=300)

        def stored(path: Path) -> dict[str, list[tuple[Any, ...]]]:
            with AuditStore(path) as store:
                ingest(store, batch[:10])
                ingest(store, batch[10:])
                ingest(store, batch)  # redelivered
                return self.contents(store)

        fast = stored(tmp_path / "fast.duckdb")
        monkeypatch.setattr("consumers.store.read_wire", lambda value: None)
        slow = stored(tmp_path / "slow.duckdb")
        assert fast == slow
        # seq 1.0 and a time with 7 fraction digits are valid for pydantic (read by its road): conflicts.
        assert len(fast["events"]) == 11
        assert len(fast["dead_letters"]) == len(bad) - 2 + 1
        assert {row[2] for row in fast["chain_breaks"]} == {"tamper", "conflict"}

    def test_each_event_keeps_its_value_byte_for_byte(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """The JSON a store keeps of an event is the value it received, multi-byte text included, whichever
        road read it: a batch of events msgspec reads, one that pydantic's road reads and a tombstone
        between them."""
        values = [forged(e, rehash=True, tenant=f"Zoë 🙂 {i}") for i, e in enumerate(gate_events(5))]
        assert "🙂".encode() in values[0]
        by_pydantic = values[2]
        monkeypatch.setattr("consumers.store.read_wire", lambda v: None if v == by_pydantic else read_wire(v))
        batch = [record(value, i) for i, value in enumerate([*values[:3], None, *values[3:]])]
        with AuditStore(tmp_path / "audit.duckdb") as store:
            result = ingest(store, batch)
            kept = dict(store.cursor().execute("SELECT event_id, CAST(event AS VARCHAR) FROM events").fetchall())
        assert (result.stored, result.dead_letters) == (len(values), 1)
        assert kept == {json.loads(value)["event_id"]: value.decode() for value in values}
