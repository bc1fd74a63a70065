"""The integrity chain: sealing without gaps, and verify_chain whatever the order."""

from __future__ import annotations

import hashlib
import json
import random
import threading
import uuid
from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from events import Producer, ToolUseEvent, event_hash, verify_chain
from events.models import ZERO_HASH, EventBase


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

    def test_hash_is_sha256_of_the_canonical_json_without_hash(self) -> None:
        """hash = SHA-256 of model_dump(mode="json") minus hash, keys sorted, (",", ":"), UTF-8."""
        (event,) = make(Producer(), 1)
        data = event.model_dump(mode="json")
        del data["hash"]
        text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        assert event.hash == hashlib.sha256(text.encode("utf-8")).hexdigest() == event_hash(event)

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
        """An event whose content changed no longer matches its hash."""
        events = make(Producer(), 3)
        data = events[1].model_dump(mode="json")
        data["args"] = {"n": 999}
        report = verify_chain([events[0], data, events[2]])
        assert [(t.seq, t.reason) for t in report.tampered] == [(2, "hash does not match the content")]

    def test_rehashed_forgery_breaks_the_next_link(self) -> None:
        """A changed event given a fresh hash still breaks the link from the event after it."""
        events = make(Producer(), 3)
        data = events[1].model_dump(mode="json")
        data["args"] = {"n": 999}
        data["hash"] = event_hash(data)
        report = verify_chain([events[0], data, events[2]])
        assert [(t.seq, t.reason) for t in report.tampered] == [(3, "prev_hash does not link to the previous event")]

    def test_duplicates_and_conflicts(self) -> None:
        """An identical replay is a duplicate (harmless); a different event at the same seq is tampering."""
        producer = Producer()
        events = make(producer, 2)
        report = verify_chain([*events, events[1]])
        assert report.ok
        assert report.duplicates == [events[1].event_id]
        impostor = events[1].model_dump(mode="json")
        impostor["event_id"] = "other"
        impostor["hash"] = event_hash(impostor)
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
