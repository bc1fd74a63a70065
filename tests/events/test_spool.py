"""The spool: records come back in order until acknowledged, survive restarts and crashes, torn
writes and corruption lose nothing that was durably appended, and the size bound holds."""

from __future__ import annotations

import gc
import json
import logging
import os
import selectors
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from events.spool import HEADER_SIZE, Spool, SpoolFull, SpoolLocked, SpoolRecord

ROOT = Path(__file__).resolve().parents[2]
SPOOL_LOG = "callgate.events.spool"
EVERYTHING = {"max_records": 1 << 30, "max_bytes": 1 << 40}


def batch(n: int, start: int = 0, size: int = 40) -> list[tuple[bytes, bytes]]:
    """n (key, value) pairs numbered from `start`; values are `size` bytes or more."""
    return [(b"k%d" % i, (b"value-%d-" % i).ljust(size, b"x")) for i in range(start, start + n)]


def keys(records: list[SpoolRecord]) -> list[bytes]:
    return [r.key for r in records]


def names(n: int, start: int = 0) -> list[bytes]:
    return [b"k%d" % i for i in range(start, start + n)]


def segment_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob("*.seg"))


def encoded(key: bytes, value: bytes) -> bytes:
    """A record as the module docstring documents it, built independently of the module."""
    head = struct.pack("<2sBBII", b"\xf5\xa7", 1, 0, len(key), len(value))
    return head + struct.pack("<I", zlib.crc32(head + key + value)) + key + value


def flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([byte[0] ^ 0xFF]))


def segment_path(directory: Path, record: SpoolRecord) -> Path:
    return directory / f"{record.position[0]:020d}.seg"


def json_cursor(directory: Path) -> tuple[int, int, int]:
    data = json.loads((directory / "cursor").read_text())
    return data["segment"], data["offset"], data["dropped"]


class TestAppendPeekAck:
    def test_peek_returns_appended_records_in_order(self, tmp_path: Path) -> None:
        """peek returns what append wrote, in append order, with the positions append returned."""
        with Spool(tmp_path, fsync=False) as spool:
            first = spool.append(batch(3))
            second = spool.append(batch(4, start=3))
            peeked = spool.peek()
            assert peeked == first + second
            assert [(r.key, r.value) for r in peeked] == batch(7)
            assert [r.position for r in peeked] == sorted(r.position for r in peeked)
            assert spool.pending == 7

    def test_peek_leaves_records_in_place(self, tmp_path: Path) -> None:
        """Peeking twice without acking returns the same records."""
        with Spool(tmp_path, fsync=False) as spool:
            spool.append(batch(5))
            assert spool.peek(3) == spool.peek(3)
            assert spool.pending == 5

    def test_peek_limits_records_and_bytes_but_returns_at_least_one(self, tmp_path: Path) -> None:
        """peek stops at max_records or max_bytes of keys and values, yet returns one record larger than max_bytes."""
        with Spool(tmp_path, fsync=False) as spool:
            spool.append(batch(10, size=100))
            assert keys(spool.peek(max_records=4)) == names(4)
            payload = len(b"k0") + 100
            assert keys(spool.peek(max_bytes=3 * payload)) == names(3)
            assert keys(spool.peek(max_bytes=1)) == names(1)
            assert spool.peek(max_records=0) == []

    def test_peek_after_reads_on_from_a_position(self, tmp_path: Path) -> None:
        """peek(after=p) returns the unacknowledged records after p, across segments, skipping acked ones."""
        with Spool(tmp_path, segment_bytes=300, fsync=False) as spool:
            records = spool.append(batch(12, size=60))
            assert len({r.position[0] for r in records}) > 2
            assert keys(spool.peek(after=records[4].position)) == names(7, start=5)
            spool.ack([records[6].position, records[7].position])
            assert keys(spool.peek(3, after=records[4].position)) == [b"k5", b"k8", b"k9"]
            assert spool.peek(after=records[-1].position) == []

    def test_peek_after_an_acknowledged_position_starts_at_the_oldest(self, tmp_path: Path) -> None:
        """A position behind the committed cursor (or in a deleted segment) reads from the oldest record."""
        with Spool(tmp_path, segment_bytes=300, fsync=False) as spool:
            records = spool.append(batch(12, size=60))
            spool.ack([r.position for r in records[:8]])
            assert keys(spool.peek(after=records[2].position)) == names(4, start=8)

    def test_ack_removes_records_from_the_front(self, tmp_path: Path) -> None:
        """Acknowledged records are not returned again; the rest follow in order."""
        with Spool(tmp_path, fsync=False) as spool:
            spool.append(batch(6))
            spool.ack([r.position for r in spool.peek(4)])
            assert keys(spool.peek()) == names(2, start=4)
            assert spool.pending == 2

    def test_ack_out_of_order_advances_only_over_the_acked_prefix(self, tmp_path: Path) -> None:
        """Acks past a gap hide those records at once; the committed cursor moves only when the gap is acked."""
        with Spool(tmp_path, fsync=False) as spool:
            records = spool.append(batch(5))
            spool.ack([records[2].position, records[1].position])
            assert keys(spool.peek()) == [b"k0", b"k3", b"k4"]
            assert spool.pending == 3
            assert json_cursor(tmp_path)[:2] == records[0].position
            spool.ack([records[0].position])
            assert json_cursor(tmp_path)[:2] == records[3].position
            assert keys(spool.peek()) == [b"k3", b"k4"]

    def test_ack_of_an_unknown_position_raises_and_applies_nothing(self, tmp_path: Path) -> None:
        """A position that is no spooled record raises ValueError, and the valid acks of the same call are dropped."""
        with Spool(tmp_path, fsync=False) as spool:
            records = spool.append(batch(3))
            with pytest.raises(ValueError, match="no spooled record"):
                spool.ack([records[0].position, (records[0].position[0], records[0].position[1] + 1)])
            with pytest.raises(ValueError, match="no spooled record"):
                spool.ack([(records[0].position[0] + 5, 0)])
            assert spool.pending == 3

    def test_repeated_and_stale_acks_are_ignored(self, tmp_path: Path) -> None:
        """Acking the same record twice, or one behind the cursor, changes nothing."""
        with Spool(tmp_path, fsync=False) as spool:
            records = spool.append(batch(3))
            spool.ack([records[1].position, records[1].position])
            spool.ack([records[0].position])
            spool.ack([records[0].position, records[1].position])
            assert keys(spool.peek()) == [b"k2"]
            assert spool.pending == 1

    def test_empty_append_writes_nothing(self, tmp_path: Path) -> None:
        """Appending no records returns an empty list and creates no segment."""
        with Spool(tmp_path, fsync=False) as spool:
            assert spool.append([]) == []
            assert segment_files(tmp_path) == []

    def test_keys_and_values_must_be_bytes(self, tmp_path: Path) -> None:
        """A key or value that is not bytes raises TypeError and nothing of the batch is written."""
        with Spool(tmp_path, fsync=False) as spool:
            with pytest.raises(TypeError):
                spool.append([(b"k", b"v"), ("k", b"v")])  # type: ignore[list-item]
            with pytest.raises(ValueError, match="at most"):
                spool.append([(b"k" * 70_000, b"v")])
            assert spool.pending == 0
            assert spool.size_bytes == 0

    def test_segment_bytes_follow_the_documented_format(self, tmp_path: Path) -> None:
        """A segment is the records' headers, keys and values back to back, exactly as the module docstring says."""
        with Spool(tmp_path, fsync=False) as spool:
            records = spool.append([(b"p1", b'{"a":1}'), (b"", b""), (b"p2", "h\u00e9".encode())])
            expected = encoded(b"p1", b'{"a":1}') + encoded(b"", b"") + encoded(b"p2", "h\u00e9".encode())
            assert segment_path(tmp_path, records[0]).read_bytes() == expected
            assert [r.position[1] for r in records] == [0, HEADER_SIZE + 9, 2 * HEADER_SIZE + 9]
            assert spool.size_bytes == len(expected)

    def test_a_closed_spool_refuses_work(self, tmp_path: Path) -> None:
        """After close, append, peek and ack raise ValueError; close again is a no-op."""
        spool = Spool(tmp_path, fsync=False)
        spool.append(batch(1))
        spool.close()
        spool.close()
        assert spool.closed
        with pytest.raises(ValueError, match="closed"):
            spool.append(batch(1))
        with pytest.raises(ValueError, match="closed"):
            spool.peek()
        with pytest.raises(ValueError, match="closed"):
            spool.ack([])


class TestSegments:
    def test_segments_roll_at_segment_bytes(self, tmp_path: Path) -> None:
        """A record that would take a segment past segment_bytes starts a new, higher-numbered segment file."""
        with Spool(tmp_path, segment_bytes=300, fsync=False) as spool:
            records = spool.append(batch(10, size=60))
            files = segment_files(tmp_path)
            assert len(files) > 2
            assert files == [f"{n:020d}.seg" for n in sorted({r.position[0] for r in records})]
            for name in files:
                assert (tmp_path / name).stat().st_size <= 300
            assert spool.size_bytes == sum((tmp_path / name).stat().st_size for name in files)
            assert keys(spool.peek()) == names(10)

    def test_a_record_larger_than_a_segment_gets_its_own(self, tmp_path: Path) -> None:
        """A record larger than segment_bytes is written alone in a segment, not refused."""
        with Spool(tmp_path, segment_bytes=100, fsync=False) as spool:
            records = spool.append([(b"a", b"x"), (b"big", b"y" * 500), (b"c", b"z")])
            assert len({r.position[0] for r in records}) == 3
            assert [r.value for r in spool.peek()] == [b"x", b"y" * 500, b"z"]

    def test_a_segment_is_deleted_once_all_its_records_are_acked(self, tmp_path: Path) -> None:
        """A segment file stays while any record in it is unacknowledged and is deleted when the last one is."""
        with Spool(tmp_path, segment_bytes=300, fsync=False) as spool:
            records = spool.append(batch(10, size=60))
            first = [r for r in records if r.position[0] == records[0].position[0]]
            size = spool.size_bytes
            spool.ack([r.position for r in first[1:]])
            assert segment_path(tmp_path, first[0]).exists()
            spool.ack([first[0].position])
            assert not segment_path(tmp_path, first[0]).exists()
            assert spool.size_bytes == size - sum(HEADER_SIZE + len(r.key) + len(r.value) for r in first)
            assert keys(spool.peek()) == names(10 - len(first), start=len(first))

    def test_a_fully_acked_write_segment_is_deleted_and_appends_roll(self, tmp_path: Path) -> None:
        """With every record acked the segment being written is deleted too; the next append starts a later one."""
        with Spool(tmp_path, fsync=False) as spool:
            records = spool.append(batch(3))
            spool.ack([r.position for r in records])
            assert segment_files(tmp_path) == []
            assert spool.size_bytes == 0
            later = spool.append(batch(1, start=3))
            assert later[0].position > records[-1].position
            assert keys(spool.peek()) == [b"k3"]


class TestReopen:
    def test_reopen_after_close_resumes_after_the_cursor(self, tmp_path: Path) -> None:
        """A new Spool over a closed one returns exactly the records not acknowledged before, in order."""
        with Spool(tmp_path, segment_bytes=300, fsync=False) as spool:
            spool.append(batch(12, size=50))
            spool.ack([r.position for r in spool.peek(5)])
        with Spool(tmp_path, segment_bytes=300, fsync=False) as spool:
            assert spool.pending == 7
            assert keys(spool.peek()) == names(7, start=5)
            spool.append(batch(2, start=12))
            assert keys(spool.peek()) == names(9, start=5)

    def test_appends_after_a_restart_go_to_a_new_segment(self, tmp_path: Path) -> None:
        """A reopened spool never extends an old segment: new records get a later segment number."""
        with Spool(tmp_path, fsync=False) as spool:
            earlier = spool.append(batch(2))
        with Spool(tmp_path, fsync=False) as spool:
            later = spool.append(batch(2, start=2))
            assert later[0].position[0] > earlier[-1].position[0]
            assert keys(spool.peek()) == names(4)

    def test_new_records_sort_after_a_cursor_whose_segment_is_gone(self, tmp_path: Path) -> None:
        """Records appended after the cursor's segment file vanished still come back after the next reopen."""
        with Spool(tmp_path, fsync=False) as spool:
            records = spool.append(batch(5))
            spool.ack([r.position for r in records[:2]])
        segment_path(tmp_path, records[0]).unlink()
        with Spool(tmp_path, fsync=False) as spool:
            assert spool.pending == 0
            spool.append(batch(3, start=5))
        with Spool(tmp_path, fsync=False) as spool:
            assert keys(spool.peek()) == names(3, start=5)

    def test_acks_beyond_the_committed_prefix_are_redelivered_after_a_restart(self, tmp_path: Path) -> None:
        """Only the acked prefix is persisted: records acked past a gap come back after reopening (at least once)."""
        with Spool(tmp_path, fsync=False) as spool:
            records = spool.append(batch(4))
            spool.ack([records[0].position, records[2].position])
        with Spool(tmp_path, fsync=False) as spool:
            assert keys(spool.peek()) == [b"k1", b"k2", b"k3"]

    def test_a_copy_taken_while_open_holds_every_unacked_record(self, tmp_path: Path) -> None:
        """The directory as a crash leaves it (copied while the spool is open) holds every unacked record."""
        live = tmp_path / "live"
        spool = Spool(live, segment_bytes=500)
        spool.append(batch(20, size=60))
        spool.ack([r.position for r in spool.peek(6)])
        spool.append(batch(5, start=20))
        shutil.copytree(live, tmp_path / "crashed")
        spool.close()
        with Spool(tmp_path / "crashed", segment_bytes=500) as recovered:
            assert keys(recovered.peek()) == names(19, start=6)
            assert recovered.corrupt_records == 0

    def test_a_spool_dropped_without_close_leaves_its_records(self, tmp_path: Path) -> None:
        """A Spool collected without close releases the directory; the next one finds every unacked record."""
        spool = Spool(tmp_path, fsync=False)
        spool.append(batch(8))
        spool.ack([r.position for r in spool.peek(3)])
        del spool
        gc.collect()
        with Spool(tmp_path, fsync=False) as spool:
            assert keys(spool.peek()) == names(5, start=3)

    def test_one_spool_per_directory(self, tmp_path: Path) -> None:
        """A second Spool over a directory in use raises SpoolLocked; once the first closes it opens."""
        with Spool(tmp_path, fsync=False), pytest.raises(SpoolLocked):
            Spool(tmp_path, fsync=False)
        Spool(tmp_path, fsync=False).close()

    def test_segments_behind_the_cursor_are_never_replayed(self, tmp_path: Path) -> None:
        """A segment left behind the persisted cursor (a crash before its delete) is deleted on opening, unread."""
        with Spool(tmp_path, segment_bytes=200, fsync=False) as spool:
            records = spool.append(batch(10, size=50))
            first = segment_path(tmp_path, records[0])
            content = first.read_bytes()
            spool.ack([r.position for r in records if r.position[0] == records[0].position[0]])
            assert not first.exists()
        first.write_bytes(content)
        with Spool(tmp_path, segment_bytes=200, fsync=False) as spool:
            assert not first.exists()
            assert keys(spool.peek()) == names(8, start=2)

    def test_an_unreadable_cursor_replays_everything_held(
        self, tmp_path: Path, caplog: pytest.LogCaptureFixture
    ) -> None:
        """A cursor file that cannot be parsed makes the spool resend every record still on disk, never skip one."""
        with Spool(tmp_path, fsync=False) as spool:
            spool.append(batch(5))
            spool.ack([r.position for r in spool.peek(2)])
        (tmp_path / "cursor").write_bytes(b"\x00garbage")
        with caplog.at_level(logging.ERROR, logger=SPOOL_LOG), Spool(tmp_path, fsync=False) as spool:
            assert keys(spool.peek()) == names(5)
        assert any("cursor" in r.getMessage() for r in caplog.records)


class TestTornTail:
    def reopen(self, directory: Path) -> Spool:
        return Spool(directory, fsync=False)

    def test_a_truncated_last_record_is_cut_away(self, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
        """A last record cut short is truncated away with a warning naming segment and offset; the rest are intact."""
        with self.reopen(tmp_path) as spool:
            records = spool.append(batch(5))
        path = segment_path(tmp_path, records[-1])
        with open(path, "r+b") as handle:
            handle.truncate(path.stat().st_size - 3)
        with caplog.at_level(logging.WARNING, logger=SPOOL_LOG), self.reopen(tmp_path) as spool:
            assert keys(spool.peek()) == names(4)
            assert spool.corrupt_records == 0
        assert path.stat().st_size == records[-1].position[1]
        warning = next(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
        assert path.name in warning
        assert str(records[-1].position[1]) in warning

    def test_a_partial_header_is_cut_away(self, tmp_path: Path) -> None:
        """A last record with only part of its header on disk is never returned."""
        with self.reopen(tmp_path) as spool:
            records = spool.append(batch(5))
        path = segment_path(tmp_path, records[-1])
        with open(path, "r+b") as handle:
            handle.truncate(records[-1].position[1] + 5)
        with self.reopen(tmp_path) as spool:
            assert keys(spool.peek()) == names(4)

    def test_garbage_after_the_last_record_is_cut_away(self, tmp_path: Path) -> None:
        """Bytes appended after the last record that form no record are removed and every record is kept."""
        with self.reopen(tmp_path) as spool:
            records = spool.append(batch(5))
        path = segment_path(tmp_path, records[-1])
        size = path.stat().st_size
        with open(path, "ab") as handle:
            handle.write(b"\xf5\xa7\x01\x00garbage that is no record")
        with self.reopen(tmp_path) as spool:
            assert keys(spool.peek()) == names(5)
        assert path.stat().st_size == size

    def test_a_checksum_mismatch_in_the_last_record_is_cut_away(self, tmp_path: Path) -> None:
        """A last record whose checksum does not match is treated as torn: dropped, the earlier ones returned."""
        with self.reopen(tmp_path) as spool:
            records = spool.append(batch(5))
        flip(segment_path(tmp_path, records[-1]), records[-1].position[1] + HEADER_SIZE + 4)
        with self.reopen(tmp_path) as spool:
            assert keys(spool.peek()) == names(4)

    def test_a_torn_first_record_of_a_new_segment_is_cut_away(self, tmp_path: Path) -> None:
        """A segment holding only a torn record (a crash right after a roll) empties; earlier segments are intact."""
        with Spool(tmp_path, segment_bytes=200, fsync=False) as spool:
            records = spool.append(batch(7, size=50))
        last = segment_path(tmp_path, records[-1])
        assert records[-1].position[1] == 0
        with open(last, "r+b") as handle:
            handle.truncate(10)
        with Spool(tmp_path, segment_bytes=200, fsync=False) as spool:
            assert keys(spool.peek()) == names(6)
            spool.append(batch(1, start=7))
        with Spool(tmp_path, segment_bytes=200, fsync=False) as spool:
            assert keys(spool.peek()) == [*names(6), b"k7"]

    def test_appends_after_recovery_survive_the_next_reopen(self, tmp_path: Path) -> None:
        """After a torn tail was cut, new records follow the intact ones and come back after another reopen."""
        with self.reopen(tmp_path) as spool:
            records = spool.append(batch(3))
        path = segment_path(tmp_path, records[-1])
        with open(path, "ab") as handle:
            handle.write(b"\x00" * 7)
        with self.reopen(tmp_path) as spool:
            spool.append(batch(2, start=3))
        with self.reopen(tmp_path) as spool:
            assert keys(spool.peek()) == names(5)
            assert spool.corrupt_records == 0


class TestCorruption:
    def test_a_corrupt_middle_record_loses_only_itself(self, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
        """A flipped byte in a middle record loses that record only; later ones come back; it is counted and logged."""
        with Spool(tmp_path, fsync=False) as spool:
            records = spool.append(batch(10))
        middle = records[4]
        flip(segment_path(tmp_path, middle), middle.position[1] + HEADER_SIZE + 5)
        with caplog.at_level(logging.ERROR, logger=SPOOL_LOG), Spool(tmp_path, fsync=False) as spool:
            assert keys(spool.peek()) == [k for k in names(10) if k != b"k4"]
            assert spool.pending == 9
            assert spool.corrupt_records == 1
            assert spool.corrupt_bytes == HEADER_SIZE + len(middle.key) + len(middle.value)
        assert any("CORRUPT" in r.getMessage() and r.levelno == logging.ERROR for r in caplog.records)

    def test_a_corrupt_length_field_does_not_hide_later_records(self, tmp_path: Path) -> None:
        """A middle header claiming a huge length is skipped by scanning for the next valid header."""
        with Spool(tmp_path, fsync=False) as spool:
            records = spool.append(batch(10))
        path = segment_path(tmp_path, records[3])
        with open(path, "r+b") as handle:
            handle.seek(records[3].position[1] + 8)
            handle.write(struct.pack("<I", 0x7FFFFFFF))
        with Spool(tmp_path, fsync=False) as spool:
            assert keys(spool.peek()) == [k for k in names(10) if k != b"k3"]
            assert spool.corrupt_records == 1

    def test_corruption_at_the_end_of_an_older_segment_is_counted_not_truncated(self, tmp_path: Path) -> None:
        """A bad last record of a segment followed by others is corruption: counted, and later segments come back."""
        with Spool(tmp_path, segment_bytes=200, fsync=False) as spool:
            records = spool.append(batch(9, size=50))
        first_segment = [r for r in records if r.position[0] == records[0].position[0]]
        victim = first_segment[-1]
        path = segment_path(tmp_path, victim)
        size = path.stat().st_size
        flip(path, victim.position[1] + HEADER_SIZE + 3)
        with Spool(tmp_path, segment_bytes=200, fsync=False) as spool:
            assert keys(spool.peek()) == [r.key for r in records if r != victim]
            assert spool.corrupt_records == 1
        assert path.stat().st_size == size

    def test_corruption_after_opening_is_caught_by_peek(self, tmp_path: Path) -> None:
        """A record going bad on disk while the spool is open is skipped by peek and counted; the rest are returned."""
        with Spool(tmp_path, fsync=False) as spool:
            records = spool.append(batch(5))
            flip(segment_path(tmp_path, records[2]), records[2].position[1] + HEADER_SIZE + 1)
            assert keys(spool.peek()) == [b"k0", b"k1", b"k3", b"k4"]
            assert spool.corrupt_records == 1
            assert spool.pending == 4
            spool.ack([r.position for r in spool.peek()])
            assert spool.pending == 0
            assert segment_files(tmp_path) == []

    def test_record_bytes_that_look_like_headers_do_not_confuse_recovery(self, tmp_path: Path) -> None:
        """Values holding the magic bytes and whole encoded records are returned as they were, without corruption."""
        tricky = [(b"a", b"\xf5\xa7" * 20), (b"b", encoded(b"x", b"y") * 3), (b"c", b"\xf5")]
        with Spool(tmp_path, fsync=False) as spool:
            spool.append(tricky)
        with Spool(tmp_path, fsync=False) as spool:
            assert [(r.key, r.value) for r in spool.peek()] == tricky
            assert spool.corrupt_records == 0


class TestSpoolFull:
    def test_a_batch_past_max_bytes_is_refused_before_writing(self, tmp_path: Path) -> None:
        """SpoolFull carries the sizes, and nothing of the refused batch reaches the disk or the pending count."""
        record_size = HEADER_SIZE + len(b"k0") + 40
        with Spool(tmp_path, max_bytes=5 * record_size, fsync=False) as spool:
            spool.append(batch(4))
            before = {name: (tmp_path / name).read_bytes() for name in segment_files(tmp_path)}
            with pytest.raises(SpoolFull) as raised:
                spool.append(batch(2, start=4))
            assert raised.value.size_bytes == 4 * record_size
            assert raised.value.max_bytes == 5 * record_size
            assert {name: (tmp_path / name).read_bytes() for name in segment_files(tmp_path)} == before
            assert spool.pending == 4
            assert spool.size_bytes == 4 * record_size

    def test_the_spool_takes_records_again_once_acks_free_space(self, tmp_path: Path) -> None:
        """After every record is acknowledged the space is free and a batch that was refused fits."""
        record_size = HEADER_SIZE + len(b"k0") + 40
        with Spool(tmp_path, max_bytes=5 * record_size, fsync=False) as spool:
            spool.append(batch(4))
            with pytest.raises(SpoolFull):
                spool.append(batch(2, start=4))
            spool.ack([r.position for r in spool.peek()])
            spool.append(batch(2, start=4))
            assert keys(spool.peek()) == [b"k4", b"k5"]
        with Spool(tmp_path, max_bytes=5 * record_size, fsync=False) as spool:
            assert keys(spool.peek()) == [b"k4", b"k5"]

    def test_a_batch_larger_than_the_whole_spool_is_refused(self, tmp_path: Path) -> None:
        """A batch of several records that could never fit raises SpoolFull even into an empty spool."""
        with Spool(tmp_path, max_bytes=100, fsync=False) as spool, pytest.raises(SpoolFull):
            spool.append([(b"k", b"v" * 40), (b"k", b"v" * 40)])

    def test_an_empty_spool_takes_one_record_larger_than_itself(self, tmp_path: Path) -> None:
        """A single record larger than max_bytes goes into an empty spool, and only into an empty one."""
        with Spool(tmp_path, max_bytes=100, fsync=False) as spool:
            (big,) = spool.append([(b"k", b"v" * 100)])
            with pytest.raises(SpoolFull):
                spool.append([(b"k", b"v" * 100)])
            spool.ack([big.position])
            assert keys(spool.append([(b"k2", b"v" * 100)])) == [b"k2"]


class TestDropOldest:
    def test_drop_oldest_discards_and_counts(self, tmp_path: Path) -> None:
        """The n oldest unacknowledged records are discarded, counted in dropped, and never returned."""
        with Spool(tmp_path, fsync=False) as spool:
            records = spool.append(batch(10))
            spool.ack([records[1].position])
            assert spool.drop_oldest(3) == 3
            assert spool.dropped == 3
            assert keys(spool.peek()) == names(6, start=4)
            assert spool.pending == 6
            spool.ack([records[2].position])
            assert spool.drop_oldest(0) == 0
            assert spool.drop_oldest(100) == 6
            assert spool.drop_oldest(1) == 0
            assert spool.dropped == 9
            assert segment_files(tmp_path) == []

    def test_dropped_survives_a_restart_until_taken(self, tmp_path: Path) -> None:
        """dropped is persisted with the cursor, even without close; take_dropped returns it and the reset persists."""
        live = tmp_path / "live"
        spool = Spool(live, fsync=False)
        spool.append(batch(10))
        spool.drop_oldest(4)
        shutil.copytree(live, tmp_path / "crashed")
        spool.close()
        with Spool(tmp_path / "crashed", fsync=False) as crashed:
            assert crashed.dropped == 4
            assert keys(crashed.peek()) == names(6, start=4)
        with Spool(live, fsync=False) as spool:
            assert spool.dropped == 4
            assert spool.take_dropped() == 4
            assert spool.dropped == 0
        with Spool(live, fsync=False) as spool:
            assert spool.dropped == 0
            assert spool.pending == 6


class TestThreads:
    def test_appenders_and_a_consumer_on_several_threads_lose_nothing(self, tmp_path: Path) -> None:
        """Four threads appending while one peeks and acks: every record is delivered once, each thread's in order."""
        spool = Spool(tmp_path, segment_bytes=4096, fsync=False)
        per_thread, threads_n = 300, 4
        delivered: list[bytes] = []
        finished = threading.Event()

        def produce(t: int) -> None:
            for start in range(0, per_thread, 10):
                spool.append([(b"t%d" % t, b"%d" % i) for i in range(start, start + 10)])

        def consume() -> None:
            while len(delivered) < per_thread * threads_n:
                records = spool.peek(50)
                delivered.extend(r.key + b":" + r.value for r in records)
                spool.ack([r.position for r in records])
            finished.set()

        workers = [threading.Thread(target=produce, args=(t,)) for t in range(threads_n)]
        consumer = threading.Thread(target=consume, daemon=True)
        consumer.start()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        consumer.join(timeout=60)
        assert finished.is_set()
        for t in range(threads_n):
            mine = [d for d in delivered if d.startswith(b"t%d:" % t)]
            assert mine == [b"t%d:%d" % (t, i) for i in range(per_thread)]
        assert spool.pending == 0
        spool.close()
        assert segment_files(tmp_path) == []


operation = st.one_of(
    st.tuples(st.just("append"), st.lists(st.binary(max_size=60), max_size=6)),
    st.tuples(st.just("peek"), st.integers(min_value=1, max_value=10)),
    st.tuples(st.just("ack_prefix"), st.integers(min_value=0, max_value=10)),
    st.tuples(st.just("ack_some"), st.lists(st.booleans(), max_size=10)),
    st.tuples(st.just("drop"), st.integers(min_value=0, max_value=3)),
    st.tuples(st.just("reopen"), st.none()),
    st.tuples(st.just("crash"), st.none()),
)


@dataclass
class Entry:
    """A record of the model: appended and not yet behind the committed cursor."""

    key: bytes
    value: bytes
    acked: bool = False


class TestAgainstAModel:
    @settings(max_examples=300, deadline=None)
    @given(st.lists(operation, max_size=50), st.sampled_from([120, 400, 1 << 20]))
    def test_the_spool_returns_exactly_the_unacked_records(self, ops: list[tuple[str, object]], segment: int) -> None:
        """For any appends, peeks, acks, drops, reopenings and crashes, peek returns the unacked records, in order."""
        with tempfile.TemporaryDirectory() as tmp:
            base = Path(tmp)
            directory = base / "spool0"
            spool = Spool(directory, segment_bytes=segment, fsync=False)
            model: list[Entry] = []
            counter = dropped = generation = 0

            def unacked() -> list[tuple[bytes, bytes]]:
                return [(e.key, e.value) for e in model if not e.acked]

            def ack_in_model(acked_keys: set[bytes]) -> None:
                for entry in model:
                    entry.acked = entry.acked or entry.key in acked_keys
                while model and model[0].acked:
                    model.pop(0)

            try:
                for op, arg in ops:
                    if op == "append":
                        assert isinstance(arg, list)
                        pairs = [(b"%d" % (counter + i), value) for i, value in enumerate(arg)]
                        counter += len(pairs)
                        spool.append(pairs)
                        model.extend(Entry(k, v) for k, v in pairs)
                    elif op == "peek":
                        assert isinstance(arg, int)
                        assert [(r.key, r.value) for r in spool.peek(arg)] == unacked()[:arg]
                    elif op == "ack_prefix":
                        assert isinstance(arg, int)
                        peeked = spool.peek(10)[:arg]
                        spool.ack([r.position for r in peeked])
                        ack_in_model({r.key for r in peeked})
                    elif op == "ack_some":
                        assert isinstance(arg, list)
                        chosen = [r for r, pick in zip(spool.peek(10), arg, strict=False) if pick]
                        spool.ack([r.position for r in reversed(chosen)])
                        ack_in_model({r.key for r in chosen})
                    elif op == "drop":
                        assert isinstance(arg, int)
                        victims = {k for k, _ in unacked()[:arg]}
                        assert spool.drop_oldest(arg) == len(victims)
                        dropped += len(victims)
                        ack_in_model(victims)
                    else:
                        if op == "reopen":
                            spool.close()
                        else:
                            generation += 1
                            crashed = base / f"spool{generation}"
                            shutil.copytree(directory, crashed)
                            spool.close()
                            directory = crashed
                        spool = Spool(directory, segment_bytes=segment, fsync=False)
                        # Acks past the committed prefix were not persisted: those records come back.
                        for entry in model:
                            entry.acked = False
                    assert spool.pending == len(unacked())
                    assert spool.dropped == dropped
                assert [(r.key, r.value) for r in spool.peek(**EVERYTHING)] == unacked()
                assert spool.corrupt_records == 0
            finally:
                spool.close()


CHILD = """
import sys
from events.spool import Spool

spool = Spool(sys.argv[1], segment_bytes=64 * 1024)
i = 0
while True:
    n = 1 + i % 37
    pairs = [(b"k%d" % j, b"v%d-" % j + b"x" * (j % 300)) for j in range(i, i + n)]
    lines = [f"{r.position[0]} {r.position[1]} {r.key.decode()}" for r in spool.append(pairs)]
    sys.stdout.write("\\n".join(lines) + "\\n")
    sys.stdout.flush()
    i += n
"""


def expected_value(key: bytes) -> bytes:
    j = int(key[1:])
    return b"v%d-" % j + b"x" * (j % 300)


class TestKilledProcess:
    def test_records_a_killed_process_reported_appended_are_all_found(self, tmp_path: Path) -> None:
        """A child killed by SIGKILL mid-append leaves every record it saw appended, intact and in order."""
        directory = tmp_path / "spool"
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        reported: list[tuple[tuple[int, int], bytes]] = []
        with subprocess.Popen(
            [sys.executable, "-c", CHILD, str(directory)], stdout=subprocess.PIPE, cwd=ROOT, env=env
        ) as child:
            assert child.stdout is not None
            fd = child.stdout.fileno()
            pending = b""
            deadline = time.monotonic() + 60
            with selectors.DefaultSelector() as selector:
                selector.register(fd, selectors.EVENT_READ)
                killed = False
                while True:
                    left = deadline - time.monotonic()
                    assert left > 0, f"the child reported only {len(reported)} records in time"
                    if not selector.select(timeout=left):
                        continue
                    chunk = os.read(fd, 1 << 16)
                    if not chunk:
                        break
                    *lines, pending = (pending + chunk).split(b"\n")
                    for line in lines:
                        seg, off, key = line.split()
                        reported.append(((int(seg), int(off)), key))
                    if not killed and len(reported) >= 3000:
                        os.kill(child.pid, signal.SIGKILL)
                        killed = True
            assert child.wait(timeout=60) == -signal.SIGKILL
        with Spool(directory) as spool:
            found = spool.peek(**EVERYTHING)
            assert spool.corrupt_records == 0
        by_position = {r.position: r for r in found}
        for position, key in reported:
            assert by_position[position].key == key
            assert by_position[position].value == expected_value(key)
        assert keys(found) == names(len(found))
        assert len(found) >= len(reported)
