"""The integrity chain: sealing without gaps, and verify_chain whatever the order."""

from __future__ import annotations

import hashlib
import json
import random
import threading
import uuid
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from events import Producer, ToolUseEvent, encode_event, event_hash, parse_event, verify_chain
from events.merkle import root_of
from events.models import ZERO_HASH, EventBase


def rehash(wire: bytes) -> bytes:
    """Wire bytes with a hash recomputed over their (changed) body: a forger's move."""
    body = wire[:-75] + b"}"
    return body[:-1] + b',"hash":"' + hashlib.sha256(body).hexdigest().encode() + b'"}'


def make(producer: Producer, n: int) -> list[EventBase]:
    return [
        producer.seal(
            ToolUseEvent,
            {
                "event_id": uuid.uuid4().hex,
                "time": datetime.now(UTC),
                "gate": "g",
                "tool": "t",
                "outcome": "ok",
                "duration_ms": 0.1,
                "args": {"n": i, "text": "héllo ✓"},
            },
        )
        for i in range(n)
    ]


class TestSealing:
    def test_seq_prev_hash_and_hash(self) -> None:
        """Seq counts from 1, the first prev_hash is 64 zeros, each prev_hash is the previous hash."""
        events = make(Producer(), 3)
        assert [e.seq for e in events] == [1, 2, 3]
        assert events[0].prev_hash == ZERO_HASH
        assert events[1].prev_hash == events[0].hash
        assert events[2].prev_hash == events[1].hash

    def test_hash_is_sha256_of_the_bytes_written(self) -> None:
        """Version 2: hash = SHA-256 of the wire bytes without their last member, the hash itself,
        which is always last: cut 75 bytes, put the brace back, hash."""
        (event,) = make(Producer(), 1)
        wire = encode_event(event)
        assert event.schema_version == 2
        assert wire.endswith(b',"hash":"' + event.hash.encode() + b'"}')
        body = wire[:-75] + b"}"
        assert hashlib.sha256(body).hexdigest() == event.hash == event_hash(event)
        assert "hash" not in json.loads(body)
        assert json.loads(wire)["hash"] == event.hash

    def test_a_sealed_event_is_the_typed_event_of_its_bytes(self) -> None:
        """`seal_fields` serializes once; the typed view is decoded from exactly those bytes."""
        producer = Producer()
        sealed = producer.seal_fields(
            "ToolUse",
            {"event_id": "e1", "time": datetime.now(UTC), "gate": "g", "outcome": "ok", "duration_ms": 1.5},
        )
        assert isinstance(sealed.event, ToolUseEvent)
        assert encode_event(sealed.event) == sealed.data
        assert (sealed.seq, sealed.prev_hash, sealed.event.hash) == (1, ZERO_HASH, sealed.hash)
        assert sealed.duration_ms == 1.5  # any other attribute is the typed event's

    def test_version_1_hash_is_sha256_of_the_canonical_json_without_hash(self) -> None:
        """Version 1 (older producers): hash = SHA-256 of model_dump(mode="json") minus hash, keys
        sorted, (",", ":"), UTF-8; such events are still sealed on request and verified."""
        (event,) = make(Producer(schema_version=1), 1)
        assert event.schema_version == 1
        data = event.model_dump(mode="json")
        del data["hash"]
        text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        assert event.hash == hashlib.sha256(text.encode("utf-8")).hexdigest() == event_hash(event)
        assert verify_chain(make(Producer(schema_version=1), 3)).ok

    def test_no_gaps_under_many_threads(self) -> None:
        """Eight threads sealing at once still give 1..N with every link intact."""
        producer = Producer()
        out: list[EventBase] = []
        lock = threading.Lock()

        def work() -> None:
            mine = make(producer, 50)
            with lock:
                out.extend(mine)

        threads = [threading.Thread(target=work) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(e.seq for e in out) == list(range(1, 401))
        assert verify_chain(out).ok


class TestProducerTree:
    def test_the_root_of_the_hashes_sealed_so_far(self) -> None:
        """`tree_root` is (seq, RFC 6962 root over the events' hashes 1..seq), taken at any moment."""
        producer = Producer(collect_leaves=True)
        assert producer.tree_root() == (0, root_of([]))
        events = make(producer, 5)
        assert producer.tree_root() == (5, root_of([bytes.fromhex(e.hash) for e in events]))
        events += make(producer, 1)
        assert producer.tree_root() == producer.tree_root() == (6, root_of([bytes.fromhex(e.hash) for e in events]))

    def test_roots_taken_while_many_threads_seal(self) -> None:
        """Each root taken while eight threads seal is the root of exactly the first `seq` events."""
        producer = Producer(collect_leaves=True)
        out: list[EventBase] = []
        roots: list[tuple[int, bytes]] = []
        lock = threading.Lock()
        done = threading.Event()

        def work() -> None:
            mine = make(producer, 50)
            with lock:
                out.extend(mine)

        def watch() -> None:
            while not done.is_set():
                roots.append(producer.tree_root())

        watcher = threading.Thread(target=watch)
        watcher.start()
        threads = [threading.Thread(target=work) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        done.set()
        watcher.join()
        leaves = [bytes.fromhex(e.hash) for e in sorted(out, key=lambda e: e.seq)]
        roots.append(producer.tree_root())
        assert roots[-1] == (400, root_of(leaves))
        for seq, root in roots:
            assert root == root_of(leaves[:seq])

    def test_a_producer_without_a_tree(self) -> None:
        """Without `collect_leaves` there is no root to give: ValueError."""
        with pytest.raises(ValueError, match="collect_leaves=False"):
            Producer().tree_root()


class TestVerifyChain:
    def test_whole_chains_of_two_producers(self) -> None:
        """Interleaved chains of two producers verify, and their lengths are reported."""
        a, b = Producer(), Producer()
        events = make(a, 5) + make(b, 3)
        report = verify_chain(events)
        assert report.ok
        assert report.producers == {a.producer_id: 5, b.producer_id: 3}

    def test_gap(self) -> None:
        """A missing event is a gap at its seq."""
        producer = Producer()
        events = make(producer, 5)
        report = verify_chain(events[:2] + events[3:])
        assert not report.ok
        assert report.gaps == {producer.producer_id: [3]}

    def test_changed_content(self) -> None:
        """An event whose bytes changed no longer matches its hash."""
        events = make(Producer(), 3)
        wire = [encode_event(e) for e in events]
        changed = wire[1].replace(b'"n":1', b'"n":999')
        assert changed != wire[1]
        report = verify_chain([wire[0], changed, wire[2]])
        assert [(t.seq, t.reason) for t in report.tampered] == [(2, "hash does not match the content")]

    def test_changed_version_1_content(self) -> None:
        """The same for a version 1 event given as a decoded mapping."""
        events = make(Producer(schema_version=1), 3)
        data = events[1].model_dump(mode="json")
        data["args"] = {"n": 999}
        report = verify_chain([events[0], data, events[2]])
        assert [(t.seq, t.reason) for t in report.tampered] == [(2, "hash does not match the content")]

    def test_re_encoded_bytes_are_not_the_bytes_written(self) -> None:
        """Version 2 trusts bytes, not values: the same event re-serialized (keys reordered) or
        with its hash moved from last place fails; a decoded mapping cannot be verified at all."""
        (event,) = make(Producer(), 1)
        reordered = json.dumps(json.loads(encode_event(event)), sort_keys=True).encode()
        assert not verify_chain([reordered]).ok
        report = verify_chain([event.model_dump(mode="json")])
        assert report.tampered
        assert "bytes" in report.tampered[0].reason

    def test_rehashed_forgery_breaks_the_next_link(self) -> None:
        """A changed event given a fresh hash still breaks the link from the event after it."""
        events = make(Producer(), 3)
        wire = [encode_event(e) for e in events]
        forged = rehash(wire[1].replace(b'"n":1', b'"n":999'))
        assert parse_event(forged).args == {"n": 999, "text": "héllo ✓"}
        report = verify_chain([wire[0], forged, wire[2]])
        assert [(t.seq, t.reason) for t in report.tampered] == [(3, "prev_hash does not link to the previous event")]

    def test_duplicates_and_conflicts(self) -> None:
        """An identical replay is a duplicate (harmless); a different event at the same seq is tampering."""
        producer = Producer()
        events = make(producer, 2)
        report = verify_chain([*events, events[1]])
        assert report.ok
        assert report.duplicates == [events[1].event_id]
        impostor = rehash(encode_event(events[1]).replace(events[1].event_id.encode(), b"other"))
        report = verify_chain([*events, impostor])
        assert not report.ok
        assert "conflicts" in report.tampered[0].reason

    @settings(max_examples=50, deadline=None)
    @given(st.integers(min_value=1, max_value=30), st.randoms(use_true_random=False), st.sets(st.integers(0, 29)))
    def test_order_does_not_matter(self, n: int, rnd: random.Random, drop: set[int]) -> None:
        """Any shuffle of the same events gives the same report."""
        events = make(Producer(), n)
        kept = [e for i, e in enumerate(events) if i not in drop]
        shuffled = list(kept)
        rnd.shuffle(shuffled)
        assert verify_chain(shuffled) == verify_chain(kept)
        expected_gaps = sorted(i + 1 for i in drop if i < n and i + 1 < max((e.seq for e in kept), default=0))
        assert [seq for gaps in verify_chain(kept).gaps.values() for seq in gaps] == expected_gaps
