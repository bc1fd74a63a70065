"""The sink contract, run against every sink by subclassing; then what is particular to each."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import subprocess
import sys
import threading
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from events import JsonlSink, MemorySink, Producer, ToolUseEvent, event_hash, parse_event, read_jsonl, verify_chain
from events.models import EventBase
from events.sinks import BackgroundSink, SinkStartError

ENOSPC = "write failed: [Errno 28] No space left on device"


def sink_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What the sinks logged, one message per record."""
    return [r.getMessage() for r in caplog.records if r.name == "callgate.events"]


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

    @staticmethod
    def sealed(sink: MemorySink, n: int) -> None:
        producer = Producer()
        for i in range(n):
            fields = {"event_id": f"e-{i}", "time": datetime.now(UTC), "gate": "g", "outcome": "ok", "duration_ms": 0.0}
            sink.emit(producer.seal_fields("ToolUse", fields))

    def test_events_clear_empties_the_sink(self) -> None:
        """`sink.events.clear()` forgets every event: the sink holds none afterwards, typed or sealed."""
        sink = MemorySink()
        self.sealed(sink, 3)
        sink.events.clear()
        assert len(sink.events) == 0
        assert sink.sealed == []
        assert list(sink.events) == []

    def test_len_of_events_decodes_nothing(self) -> None:
        """`len(sink.events)` in a loop counts the events without decoding any of them; an event is
        decoded when first looked at, once."""
        sink = MemorySink()
        self.sealed(sink, 50)
        for _ in range(100):
            assert len(sink.events) == 50
        assert all(sealed._event is None for sealed in sink.sealed)
        first = sink.events[0]
        assert sink.events[0] is first
        assert sum(sealed._event is not None for sealed in sink.sealed) == 1

    def test_events_is_one_live_view(self) -> None:
        """`sink.events` is the same object on every read, and shows events emitted after it was
        taken; slices and comparisons answer as lists do."""
        sink = MemorySink()
        view = sink.events
        self.sealed(sink, 2)
        assert sink.events is view
        assert [e.event_id for e in view] == ["e-0", "e-1"]
        assert view[-1].event_id == "e-1"
        assert view[1:] == [view[1]]
        assert view == list(view)
        assert view != [view[0]]


class TestJsonlSink(SinkContract):
    def make_sink(self, tmp_path: Path) -> JsonlSink:
        (tmp_path / "audit").mkdir(exist_ok=True)
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
        """An event emitted after close is dropped and counted; emit never raises; a closed sink
        is not available."""
        sink = JsonlSink(tmp_path / "e.jsonl")
        await sink.close()
        sink.emit(events(1)[0])
        assert sink.dropped == 1
        assert (sink.available, sink.unavailable_reason) == (False, f"JsonlSink({tmp_path / 'e.jsonl'}): closed")


class TestJsonlSinkStart:
    def test_start_creates_the_file(self, tmp_path: Path) -> None:
        """start() opens the file, creating it, before any event; twice is the same as once."""
        sink = JsonlSink(tmp_path / "events.jsonl")
        sink.start()
        sink.start()
        assert (tmp_path / "events.jsonl").read_bytes() == b""

    async def test_a_started_sink_closed_without_events_releases_its_file(self, tmp_path: Path) -> None:
        """close() releases the file start() opened, even when no event ever came."""
        path = tmp_path / "events.jsonl"

        def holding() -> int:
            return sum(os.path.realpath(f"/proc/self/fd/{fd}") == str(path) for fd in os.listdir("/proc/self/fd"))

        sink = JsonlSink(path)
        sink.start()
        assert holding() == 1
        await sink.close()
        assert holding() == 0

    @pytest.mark.parametrize(
        ("where", "why"),
        [
            ("file/events.jsonl", "{tmp}/file is not a directory"),
            ("file/deeper/events.jsonl", "{tmp}/file is not a directory"),
            ("missing/events.jsonl", "the directory {tmp}/missing does not exist"),
            ("dir", "{tmp}/dir is a directory"),
        ],
        ids=["parent-is-a-file", "ancestor-is-a-file", "missing-directory", "path-is-a-directory"],
    )
    def test_a_path_that_cannot_be_written_is_refused_naming_it(self, tmp_path: Path, where: str, why: str) -> None:
        """start() raises SinkStartError naming the sink's path and what is wrong; nothing is created."""
        (tmp_path / "file").write_text("not a directory")
        (tmp_path / "dir").mkdir()
        path = tmp_path / where
        with pytest.raises(SinkStartError) as raised:
            JsonlSink(path).start()
        assert str(raised.value) == f"JsonlSink({path}) cannot start: {why.format(tmp=tmp_path)}"
        assert not (tmp_path / "missing").exists()


class TestJsonlSinkFailing:
    """A JsonlSink whose writes fail: /dev/full (every write ENOSPC) and real partial writes."""

    async def test_a_full_disk_makes_it_unavailable_and_holds_the_events(self) -> None:
        """On /dev/full the first write fails: not available, the reason names the sink and the
        error, every event is held (pending), none counted as stored or failed yet."""
        sink = JsonlSink("/dev/full")
        sink.start()
        for event in events(3):
            sink.emit(event)
        await asyncio.wait_for(sink.flush(), 10)
        assert (sink.available, sink.unavailable_reason) == (False, f"JsonlSink(/dev/full): {ENOSPC}")
        assert (sink.pending, sink.exported, sink.failed, sink.dropped) == (3, 0, 0, 0)
        await sink.close()

    async def test_flush_returns_after_an_attempt_and_close_counts_what_was_never_stored(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        """flush() returns while the sink fails (each one an attempt); close() makes a last one
        and counts every event still held as failed; the log has one line when the writes start
        failing and one at close, however many batches failed."""
        caplog.set_level(logging.WARNING, logger="callgate.events")
        sink = JsonlSink("/dev/full", max_batch=2)
        sink.start()
        for _ in range(5):
            for event in events(10):
                sink.emit(event)
            await asyncio.wait_for(sink.flush(), 10)
        assert sink.export_failures >= 5
        await asyncio.wait_for(sink.close(), 10)
        assert (sink.failed, sink.exported, sink.pending) == (50, 0, 0)
        failing, closing = sink_lines(caplog)
        assert re.fullmatch(
            rf"JsonlSink\(/dev/full\): {re.escape(ENOSPC)}; holding \d+ events and trying again", failing
        )
        assert closing == f"JsonlSink(/dev/full) closed with 50 events it could not store ({ENOSPC})"

    async def test_held_events_are_bounded_by_the_queue_size(self) -> None:
        """While writes fail, at most max_queue events are held; newer ones are dropped and counted."""
        sink = JsonlSink("/dev/full", max_queue=5)
        for event in events(20):
            sink.emit(event)
            await asyncio.wait_for(sink.flush(), 10)
        assert (sink.pending, sink.dropped) == (5, 15)
        await sink.close()
        assert (sink.failed, sink.dropped) == (5, 15)

    async def test_a_path_that_becomes_writable_again_gets_every_held_event_in_order(
        self, tmp_path: Path, caplog: pytest.LogCaptureFixture
    ) -> None:
        """The path points at /dev/full, then at a real file: the next attempt reopens it, writes
        every held event before the newer ones, and the sink is available again, logged once."""
        caplog.set_level(logging.WARNING, logger="callgate.events")
        path = tmp_path / "events.jsonl"
        path.symlink_to("/dev/full")
        sink = JsonlSink(path)
        sink.start()
        producer = Producer()
        batch = events(30, producer)
        for event in batch[:20]:
            sink.emit(event)
        await sink.flush()
        assert not sink.available
        (tmp_path / "repointed").symlink_to(tmp_path / "real.jsonl")
        os.replace(tmp_path / "repointed", path)
        for event in batch[20:]:
            sink.emit(event)
        await sink.flush()
        assert (sink.available, sink.unavailable_reason, sink.pending) == (True, None, 0)
        stored = read_jsonl(tmp_path / "real.jsonl")
        assert [e.seq for e in stored] == list(range(1, 31))
        assert verify_chain(stored).ok
        await sink.close()
        assert (sink.exported, sink.failed) == (30, 0)
        lines = sink_lines(caplog)
        assert len(lines) == 2
        assert lines[0] == f"JsonlSink({path}): {ENOSPC}; holding 20 events and trying again"
        assert lines[1].startswith(f"JsonlSink({path}) recovered after ")
        assert lines[1].endswith(" s; wrote 30 held events")

    def test_a_write_cut_off_midway_leaves_no_torn_line(self, tmp_path: Path) -> None:
        """A file size limit (RLIMIT_FSIZE, in a process of its own) stops a batch midway: the
        file is cut back to the last whole batch; with the limit lifted, every event is written
        once, each line whole."""
        script = PARTIAL_WRITE.format(path=str(tmp_path / "events.jsonl"))
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert report["failed_at"] == "write failed: [Errno 27] File too large"
        # Only whole lines remain: the events written before the batch that was cut off.
        assert report["tail"] == "\n"
        assert report["lines_after_failure"] == report["exported_before_lift"] < 25
        stored = read_jsonl(tmp_path / "events.jsonl")
        assert [e.seq for e in stored] == list(range(1, 26))
        assert verify_chain(stored).ok


PARTIAL_WRITE = """
import asyncio, json, os, resource, uuid
from datetime import UTC, datetime
from events import Producer, ToolUseEvent
from events.sinks import JsonlSink

producer = Producer()
def event():
    fields = dict(event_id=uuid.uuid4().hex, time=datetime.now(UTC), gate="g", outcome="ok", duration_ms=0.0)
    return producer.seal(ToolUseEvent, fields)

async def main():
    sink = JsonlSink({path!r})
    sink.start()
    for _ in range(5):
        sink.emit(event())
    await sink.flush()
    size_before = os.path.getsize({path!r})
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    # Room for ten and a half more lines: a write stops midway in a line (Python ignores SIGXFSZ).
    line = size_before // 5
    resource.setrlimit(resource.RLIMIT_FSIZE, (size_before + 10 * line + line // 2, hard))
    for _ in range(20):
        sink.emit(event())
    await sink.flush()
    failed_at = sink.unavailable_reason.split(": ", 1)[1]
    exported = sink.exported
    with open({path!r}, "rb") as handle:
        data = handle.read()
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    await sink.flush()
    assert sink.available, sink.unavailable_reason
    await sink.close()
    print(json.dumps(dict(failed_at=failed_at, tail=data[-1:].decode(), lines_after_failure=data.count(10),
                          exported_before_lift=exported)))

asyncio.run(main())
"""


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

    async def test_full_queue_makes_the_sink_unavailable_until_it_has_room(self) -> None:
        """A full queue is a sink that cannot take events: not available while it is full,
        available again once the worker has emptied it."""
        sink = _Stuck()
        batch = events(10)
        sink.emit(batch[0])
        assert sink.entered.wait(5)
        for event in batch[1:]:
            sink.emit(event)
        assert (sink.available, sink.unavailable_reason) == (
            False,
            "_Stuck: queue full (3 events waiting); dropping new events",
        )
        sink.release.set()
        await sink.flush()
        assert sink.available
        await sink.close()

    async def test_failed_export_is_retried_not_lost(self) -> None:
        """An export that raises keeps its batch and gives it again, before newer events: nothing
        is lost, the failure is counted, the sink is available again."""

        class Flaky(BackgroundSink):
            def __init__(self) -> None:
                super().__init__()
                self.calls = 0
                self.got: list[EventBase] = []

            def export(self, batch: Any) -> None:
                self.calls += 1
                if self.calls == 1:
                    raise OSError("disk full")
                self.got.extend(batch)

        sink = Flaky()
        first, second = events(2)
        sink.emit(first)
        await sink.flush()
        sink.emit(second)
        await sink.close()
        assert [e.event_id for e in sink.got] == [first.event_id, second.event_id]
        assert (sink.export_failures, sink.exported, sink.failed) == (1, 2, 0)

    async def test_reason_of_a_failed_export(self) -> None:
        """A failed export's reason names the sink, the action and the error."""

        class Refusing(BackgroundSink):
            def export(self, batch: Any) -> None:
                raise ConnectionError("collector went away")

        sink = Refusing(name="Refusing(collector)")
        sink.emit(events(1)[0])
        await sink.flush()
        assert sink.unavailable_reason == "Refusing(collector): export failed: ConnectionError: collector went away"
        assert sink.pending == 1
        await sink.close()
        assert sink.failed == 1


@pytest.fixture(autouse=True)
def _quiet_sink_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("CRITICAL", logger="callgate.events")
