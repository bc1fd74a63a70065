"""The sink contract, run against every sink by subclassing; then what is particular to each."""

from __future__ import annotations

import asyncio
import threading
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from events import JsonlSink, MemorySink, Producer, ToolUseEvent, event_hash, parse_event, read_jsonl, verify_chain
from events.models import EventBase
from events.sinks import BackgroundSink


def events(n: int, producer: Producer | None = None) -> list[EventBase]:
    producer = producer or Producer()
    return [
        producer.seal(
            ToolUseEvent,
            {"event_id": uuid.uuid4().hex, "time": datetime.now(UTC), "gate": "g", "outcome": "ok", "duration_ms": 0.0},
        )
        for i in range(n)
    ]


class SinkContract:
    """What every sink promises. Subclasses provide `make_sink` and `stored`."""

    def make_sink(self, tmp_path: Path) -> Any:
        raise NotImplementedError

    def stored(self, sink: Any, tmp_path: Path) -> list[EventBase]:
        raise NotImplementedError

    async def test_emitted_events_are_stored_in_order_after_flush(self, tmp_path: Path) -> None:
        """After flush, every emitted event is stored once, in emission order."""
        sink = self.make_sink(tmp_path)
        batch = events(25)
        for event in batch:
            sink.emit(event)
        await sink.flush()
        assert [e.event_id for e in self.stored(sink, tmp_path)] == [e.event_id for e in batch]
        await sink.close()

    async def test_emit_from_threads_without_a_loop(self, tmp_path: Path) -> None:
        """emit works from plain threads with no event loop, and nothing is lost."""
        sink = self.make_sink(tmp_path)
        producer = Producer()

        def work() -> None:
            for event in events(40, producer):
                sink.emit(event)

        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        await sink.flush()
        stored = self.stored(sink, tmp_path)
        assert len(stored) == 160
        assert verify_chain(stored).ok
        await sink.close()

    async def test_close_is_idempotent_and_flushes(self, tmp_path: Path) -> None:
        """close() stores what was emitted and may be called twice."""
        sink = self.make_sink(tmp_path)
        for event in events(3):
            sink.emit(event)
        await sink.close()
        await sink.close()
        assert len(self.stored(sink, tmp_path)) == 3

    async def test_flush_with_nothing_emitted(self, tmp_path: Path) -> None:
        """flush() on a fresh sink returns at once."""
        sink = self.make_sink(tmp_path)
        await asyncio.wait_for(sink.flush(), 5)
        await sink.close()


class TestMemorySink(SinkContract):
    def make_sink(self, tmp_path: Path) -> MemorySink:
        return MemorySink()

    def stored(self, sink: MemorySink, tmp_path: Path) -> list[EventBase]:
        return list(sink.events)

    def test_event_is_there_when_emit_returns(self) -> None:
        """MemorySink holds the event as soon as emit returns, no flush needed."""
        sink = MemorySink()
        (event,) = events(1)
        sink.emit(event)
        assert sink.events == [event]
        assert sink.of_type("ToolUse") == [event]


class TestJsonlSink(SinkContract):
    def make_sink(self, tmp_path: Path) -> JsonlSink:
        return JsonlSink(tmp_path / "audit" / "events.jsonl")

    def stored(self, sink: JsonlSink, tmp_path: Path) -> list[EventBase]:
        return read_jsonl(sink.path)

    async def test_reopening_appends(self, tmp_path: Path) -> None:
        """A second sink on the same path appends after the first one's lines."""
        path = tmp_path / "events.jsonl"
        producer = Producer()
        first, second = JsonlSink(path), JsonlSink(path)
        batch = events(4, producer)
        for event in batch[:2]:
            first.emit(event)
        await first.close()
        for event in batch[2:]:
            second.emit(event)
        await second.close()
        stored = read_jsonl(path)
        assert [e.seq for e in stored] == [1, 2, 3, 4]
        assert verify_chain(stored).ok

    async def test_one_event_per_line(self, tmp_path: Path) -> None:
        """Each line is one event's JSON, hash included, and the hash verifies after parsing."""
        sink = JsonlSink(tmp_path / "e.jsonl")
        for event in events(2):
            sink.emit(event)
        await sink.close()
        lines = (tmp_path / "e.jsonl").read_bytes().splitlines()
        assert len(lines) == 2
        assert all(line.startswith(b"{") and b'"hash":"' in line for line in lines)
        assert all(event_hash(parse_event(line)) == parse_event(line).hash for line in lines)

    async def test_emit_after_close_is_counted_not_raised(self, tmp_path: Path) -> None:
        """An event emitted after close is dropped and counted; emit never raises."""
        sink = JsonlSink(tmp_path / "e.jsonl")
        await sink.close()
        sink.emit(events(1)[0])
        assert sink.dropped == 1


class _Stuck(BackgroundSink):
    """A sink whose storage hangs until released: shows that emit never waits for it."""

    def __init__(self) -> None:
        super().__init__(max_queue=3, max_batch=1)
        self.release = threading.Event()
        self.entered = threading.Event()
        self.got: list[EventBase] = []

    def export(self, batch: Any) -> None:
        self.entered.set()
        self.release.wait(10)
        self.got.extend(batch)


class TestBackgroundSink:
    async def test_full_queue_drops_and_counts_instead_of_blocking(self) -> None:
        """With storage stuck and the queue full, emit returns at once and counts the drops."""
        sink = _Stuck()
        batch = events(10)
        sink.emit(batch[0])
        assert sink.entered.wait(5)
        for event in batch[1:]:
            sink.emit(event)  # would hang here if emit blocked
        assert sink.dropped == 6
        sink.release.set()
        await sink.close()
        assert len(sink.got) == 4
        assert sink.exported == 4

    async def test_failing_export_is_counted(self) -> None:
        """An export that raises is logged and counted; the sink keeps working."""

        class Flaky(BackgroundSink):
            def __init__(self) -> None:
                super().__init__()
                self.calls = 0

            def export(self, batch: Any) -> None:
                self.calls += 1
                if self.calls == 1:
                    raise OSError("disk full")

        sink = Flaky()
        sink.emit(events(1)[0])
        await sink.flush()
        sink.emit(events(1)[0])
        await sink.close()
        assert (sink.failed_exports, sink.exported) == (1, 1)


@pytest.fixture(autouse=True)
def _quiet_sink_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("CRITICAL", logger="callgate.events")
