"""A durable, bounded, append-only spool of opaque records: where the Kafka sink keeps every event it
has not yet delivered, so that neither a broker that is away nor a crash of this process loses one.

The life of a record: `append` writes it at the end of the current segment file and fsyncs once per
call; from then on it survives a crash. `peek` returns the oldest records not yet acknowledged, in
append order, as often as asked (a failed send simply peeks again). `ack` marks records delivered;
the *committed cursor* advances over the longest acknowledged prefix and is persisted, and a segment
file is deleted once every record in it is acknowledged (or discarded by `drop_oldest`). A process
that exits without `close` leaves its records behind; the next `Spool` over the directory finds
them. Delivery is at least once: after a restart, records acknowledged beyond the committed prefix
(acks that arrived out of order) are returned again; records behind the cursor never are.

On-disk layout
--------------

    <directory>/
        00000000000000000001.seg   segments, numbered from 1 and never reused; 20 digits, so they sort
        cursor                     the committed cursor and the drop counter, replaced atomically
        lock                       flock(LOCK_EX) while a Spool has the directory open

A segment is a sequence of records, each a 16-byte header, then the key, then the value (all integers
unsigned little-endian)::

    offset  size  field
    0       2     magic b"\\xf5\\xa7" (0xF5 never occurs in UTF-8, so never in an event's JSON)
    2       1     format version, 1
    3       1     flags, 0 (reserved)
    4       4     key length (at most 65535)
    8       4     value length
    12      4     CRC-32 (zlib.crc32) of bytes 0..11 of the header, then the key, then the value
    16      k     key
    16+k    v     value

A record's position is (segment number, offset of its header); positions order records. The cursor
file is JSON: `{"format": 1, "segment": s, "offset": o, "dropped": d}`: every record before (s, o)
is acknowledged, and d records were discarded by `drop_oldest` and not yet taken by `take_dropped`.

Recovery
--------

Opening a directory deletes the segments wholly behind the cursor and reads every other one,
checking each record's checksum:

- Bytes after the last valid record of the spool that do not form a valid record (a partial header,
  a partial payload, a checksum mismatch) are a write torn by a crash: the append that wrote them
  never returned. They are truncated away with a warning and never returned.
- An invalid record followed by valid ones (disk corruption) is skipped: the scan moves to the next
  offset holding the magic and a header whose lengths fit and whose checksum matches, and the
  records from there on are returned as usual. Each skipped region is logged as an error and counted
  in `corrupt_records` (one per region, since the lost bytes cannot tell how many records they held)
  and `corrupt_bytes`. A record that goes bad after it was scanned is caught by `peek`, which checks
  every checksum it reads, and is skipped and counted the same way.
- Records before the persisted cursor are never returned again; new records go to a new segment
  numbered after every existing one and after the cursor's, so they always sort after it.

Space
-----

`max_bytes` bounds the bytes on disk (`size_bytes`): the whole segment files still held. Space comes
back a segment at a time, when every record in it is acknowledged or dropped; the segment being
written is deleted too when all of it is acknowledged (the next append starts a new one). So
`drop_oldest` makes room only once it has discarded the rest of the oldest segment.

Threads
-------

Every public method takes one internal lock, so a Spool may be used from several threads; calls are
serialised, and `append` and `ack` block for their fsyncs while holding it. One Spool per directory:
a second one (in this process or another) raises `SpoolLocked`. A Spool dropped without `close`
releases its files and its lock when it is garbage-collected, as a killed process would.

POSIX only (flock, pread, pwrite). Standard library only.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import struct
import threading
import weakref
import zlib
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

log = logging.getLogger("callgate.events.spool")

MAGIC = b"\xf5\xa7"
FORMAT_VERSION = 1
_PREFIX = struct.Struct("<2sBBII")
_CRC = struct.Struct("<I")
HEADER_SIZE = _PREFIX.size + _CRC.size
MAX_KEY_BYTES = 0xFFFF
MAX_VALUE_BYTES = 0xFFFFFFFF

_SEGMENT_NAME = re.compile(r"^(\d{20})\.seg$")
_CURSOR = "cursor"
_CURSOR_TMP = "cursor.tmp"
_LOCK = "lock"

Position = tuple[int, int]


class SpoolFull(Exception):
    """`append` refused a batch: it would take the spool past `max_bytes`. Nothing was written."""

    def __init__(self, size_bytes: int, max_bytes: int, batch_bytes: int) -> None:
        super().__init__(
            f"spool full: {size_bytes} bytes held, a batch of {batch_bytes} bytes would pass max_bytes={max_bytes}"
        )
        self.size_bytes = size_bytes
        self.max_bytes = max_bytes
        self.batch_bytes = batch_bytes


class SpoolLocked(Exception):
    """Another Spool (in this process or another) has the directory open."""


@dataclass(frozen=True, slots=True)
class SpoolRecord:
    """One spooled record. `position` (segment number, byte offset) orders records and is what
    `Spool.ack` takes."""

    position: tuple[int, int]
    key: bytes
    value: bytes


class _Segment:
    __slots__ = ("lengths", "number", "path", "size", "starts")

    def __init__(self, number: int, path: Path, starts: array[int], lengths: array[int], size: int) -> None:
        self.number = number
        self.path = path
        # Offsets and whole lengths (header included) of the valid records, in order: peek reads
        # exactly the bytes it returns and ack checks a position without touching the disk.
        self.starts = starts
        self.lengths = lengths
        self.size = size


class _Chunk(NamedTuple):
    """The bytes one append writes to one segment, and where its records start and end."""

    number: int
    offset: int
    data: bytearray
    starts: list[int]
    lengths: list[int]


def _segment_name(number: int) -> str:
    return f"{number:020d}.seg"


def _parse(buf: memoryview, p: int, end: int) -> tuple[int, int] | None:
    """(key length, value length) of a valid record at `p` that ends by `end`, else None."""
    if end - p < HEADER_SIZE:
        return None
    magic, version, flags, key_len, value_len = _PREFIX.unpack_from(buf, p)
    if magic != MAGIC or version != FORMAT_VERSION or flags != 0 or key_len > MAX_KEY_BYTES:
        return None
    body = p + HEADER_SIZE
    if key_len + value_len > end - body:
        return None
    (crc,) = _CRC.unpack_from(buf, p + _PREFIX.size)
    if zlib.crc32(buf[body : body + key_len + value_len], zlib.crc32(buf[p : p + _PREFIX.size])) != crc:
        return None
    return key_len, value_len


def _resync(buf: bytes, mv: memoryview, p: int, end: int) -> int:
    """The first offset from `p` holding a valid record, or -1."""
    while True:
        q = buf.find(MAGIC, p, end)
        if q < 0:
            return -1
        if _parse(mv, q, end) is not None:
            return q
        p = q + 1


def _scan(buf: bytes, start: int) -> tuple[array[int], array[int], list[tuple[int, int]], int]:
    """Index a segment's bytes from `start`: (starts, lengths, corrupt regions followed by a valid
    record, offset where trailing bytes that hold no valid record begin)."""
    starts: array[int] = array("q")
    lengths: array[int] = array("q")
    corrupt: list[tuple[int, int]] = []
    mv = memoryview(buf)
    end = len(buf)
    p = start
    try:
        while p < end:
            parsed = _parse(mv, p, end)
            if parsed is not None:
                length = HEADER_SIZE + parsed[0] + parsed[1]
                starts.append(p)
                lengths.append(length)
                p += length
                continue
            q = _resync(buf, mv, p + 1, end)
            if q < 0:
                return starts, lengths, corrupt, p
            corrupt.append((p, q))
            p = q
        return starts, lengths, corrupt, end
    finally:
        mv.release()


def _pwrite_all(fd: int, data: bytes | bytearray, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written


def _close_fds(segment_fds: dict[int, int], other_fds: list[int]) -> None:
    # Closing the lock file's descriptor releases the flock, as process exit would.
    for fd in [*segment_fds.values(), *other_fds]:
        with contextlib.suppress(OSError):
            os.close(fd)
    segment_fds.clear()
    other_fds.clear()


class Spool:
    """A durable, bounded, append-only spool of (key, value) records in `directory`.

    - `max_bytes`: the most bytes of segment files held on disk; `append` raises `SpoolFull` past it.
    - `segment_bytes`: a segment rolls to a new file when a record would take it past this size (a
      larger record gets a segment of its own).
    - `fsync`: when False nothing is fsynced (tests, benchmarks): a crash of the process still loses
      nothing, a crash of the machine may.

    Opening creates the directory, takes its lock (`SpoolLocked` if another Spool has it) and
    recovers what is there (see the module docstring); it reads every held segment, so it takes
    time proportional to the bytes spooled (about 40 ms for 20 MB). It raises `OSError` when the
    directory cannot be used. Memory: an index of 16 bytes per spooled record; values stay on disk.
    Every method is safe from several threads (one lock); all may block on disk I/O.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        max_bytes: int = 256 * 2**20,
        segment_bytes: int = 16 * 2**20,
        fsync: bool = True,
    ) -> None:
        if max_bytes <= 0 or segment_bytes <= 0:
            raise ValueError(f"max_bytes and segment_bytes must be positive, got {max_bytes}, {segment_bytes}")
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes
        self.fsync = fsync

        self._lock = threading.Lock()
        self._closed = False
        self._segs: list[_Segment] = []
        self._by_number: dict[int, _Segment] = {}
        # The committed cursor as an index into _segs[0], so that ack and peek never search for it.
        self._head = 0
        # Acks arrive out of order, so records can be done (acked, dropped, found corrupt) while a
        # gap still holds the cursor before them.
        self._done: set[Position] = set()
        self._next_number = 1
        # Only a segment this Spool created is appended to: after a restart the old ones may end
        # in a cut tail or lie partly behind the cursor, where new positions would sort wrongly.
        self._writable: int | None = None
        self._pending = 0
        self._size = 0
        self._dropped = 0
        self._corrupt_records = 0
        self._corrupt_bytes = 0
        self._persisted: tuple[int, int, int] | None = None
        self._dir_fd = -1

        self._seg_fds: dict[int, int] = {}
        self._other_fds: list[int] = []
        self._finalizer = weakref.finalize(self, _close_fds, self._seg_fds, self._other_fds)
        # At interpreter exit the owner (e.g. the sink's atexit hook) may still close the spool
        # after finalizers ran; the descriptors must outlive it, and process exit closes them.
        self._finalizer.atexit = False
        try:
            self._open()
        except BaseException:
            self._finalizer()
            raise

    # -- the interface ----------------------------------------------------------------------------

    def append(self, records: Sequence[tuple[bytes, bytes]], *, past_limit: bool = False) -> list[SpoolRecord]:
        """Write the (key, value) pairs after every record already spooled and make them durable:
        one write per segment touched and one fsync per file (plus the directory's when a segment
        was created) for the whole call. Returns the spooled records, positions included, in order.

        All or nothing: raises `SpoolFull` before writing anything when the batch would take the
        spool past `max_bytes` (an empty spool takes a single record of any size; `past_limit`
        takes the batch anyway, for an owner that would otherwise lose it, e.g. at shutdown);
        `TypeError`/`ValueError` for a key or value that is not bytes or too long; `OSError` when
        the disk refuses (what this call wrote is then truncated away); `ValueError` once closed.
        Blocks for the fsyncs."""
        with self._lock:
            self._check_open()
            write = self._segs[-1] if self._segs and self._segs[-1].number == self._writable else None
            number = write.number if write is not None else -1
            size = write.size if write is not None else 0
            next_number = self._next_number
            segment_bytes = self.segment_bytes
            pack, pack_crc, crc32 = _PREFIX.pack, _CRC.pack, zlib.crc32
            chunks: list[_Chunk] = []
            chunk = _Chunk(-1, 0, bytearray(), [], [])
            pairs: list[tuple[bytes, bytes]] = []
            positions: list[Position] = []
            batch_bytes = 0
            for key, value in records:
                key_b = key if type(key) is bytes else _as_bytes(key, "key")
                value_b = value if type(value) is bytes else _as_bytes(value, "value")
                if len(key_b) > MAX_KEY_BYTES:
                    raise ValueError(f"a spool key holds at most {MAX_KEY_BYTES} bytes, got {len(key_b)}")
                if len(value_b) > MAX_VALUE_BYTES:
                    raise ValueError(f"a spool value holds at most {MAX_VALUE_BYTES} bytes, got {len(value_b)}")
                length = HEADER_SIZE + len(key_b) + len(value_b)
                if number < 0 or (size > 0 and size + length > segment_bytes):
                    number, size = next_number, 0
                    next_number += 1
                if chunk.number != number:
                    chunk = _Chunk(number, size, bytearray(), [], [])
                    chunks.append(chunk)
                data = chunk.data
                prefix = pack(MAGIC, FORMAT_VERSION, 0, len(key_b), len(value_b))
                data += prefix
                data += pack_crc(crc32(value_b, crc32(key_b, crc32(prefix))))
                data += key_b
                data += value_b
                chunk.starts.append(size)
                chunk.lengths.append(length)
                pairs.append((key_b, value_b))
                positions.append((number, size))
                size += length
                batch_bytes += length
            if not pairs:
                return []
            # An empty spool takes one record of any size: a record larger than max_bytes waits
            # for the spool to drain instead of being refused forever.
            if (
                self._size + batch_bytes > self.max_bytes
                and not past_limit
                and not (self._size == 0 and len(pairs) == 1)
            ):
                raise SpoolFull(self._size, self.max_bytes, batch_bytes)

            self._write_chunks(write, chunks)

            for chunk in chunks:
                if write is not None and chunk.number == write.number:
                    seg = write
                else:
                    seg = _Segment(
                        chunk.number, self.directory / _segment_name(chunk.number), array("q"), array("q"), 0
                    )
                    self._segs.append(seg)
                    self._by_number[chunk.number] = seg
                seg.starts.extend(chunk.starts)
                seg.lengths.extend(chunk.lengths)
                seg.size = chunk.starts[-1] + chunk.lengths[-1]
            self._next_number = next_number
            self._writable = chunks[-1].number
            self._pending += len(pairs)
            self._size += batch_bytes
            return [
                SpoolRecord(position, key_b, value_b)
                for position, (key_b, value_b) in zip(positions, pairs, strict=True)
            ]

    def peek(
        self, max_records: int = 500, max_bytes: int = 1 << 20, *, after: tuple[int, int] | None = None
    ) -> list[SpoolRecord]:
        """The oldest records not yet acknowledged (nor dropped), in append order, left in place:
        at most `max_records`, and no more than `max_bytes` of keys and values, except that the
        first record is returned even if it alone is larger. Peeking again without acking returns
        the same records. With `after` (a position this spool returned), only records after it
        are considered: a sender that has records in flight or awaiting confirmation reads on from
        the last one it sent without acking them. Reads only the bytes it returns (positioned reads
        on open files), and checks their checksums: a record gone bad on disk is skipped, logged and
        counted in `corrupt_records`. Raises `OSError` on a read error, `ValueError` once closed."""
        with self._lock:
            self._check_open()
            out: list[SpoolRecord] = []
            used = 0
            full = False
            found_corrupt = False
            unacked = self._iter_unacked(after)
            while not full and len(out) < max_records:
                wanted: list[tuple[_Segment, int]] = []
                for seg, i in unacked:
                    payload = seg.lengths[i] - HEADER_SIZE
                    if (out or wanted) and used + payload > max_bytes:
                        full = True
                        break
                    wanted.append((seg, i))
                    used += payload
                    if len(out) + len(wanted) >= max_records:
                        break
                if not wanted:
                    break
                records, corrupt = self._read(wanted)
                out.extend(records)
                if not corrupt:
                    break
                found_corrupt = True
                used -= sum(seg.lengths[i] - HEADER_SIZE for seg, i in corrupt)
            if found_corrupt:
                self._settle(force=False)
            return out

    def ack(self, positions: Iterable[tuple[int, int]]) -> None:
        """Mark the records at `positions` delivered, in any order. The committed cursor advances
        over the longest acknowledged prefix and, when it moved, is persisted (atomically; fsynced
        when `fsync`) before the segments wholly behind it are deleted. Positions behind the cursor,
        or acked before, are ignored; a position that is not a spooled record raises `ValueError`
        and nothing of the call is applied. Raises `OSError` when the cursor cannot be written (the
        acks still count in memory), `ValueError` once closed. Blocks for the fsyncs."""
        with self._lock:
            self._check_open()
            cursor = self._cursor()
            done, by_number = self._done, self._by_number
            fresh: set[Position] = set()
            seg: _Segment | None = None
            for seg_number, offset in positions:
                pos = (seg_number, offset)
                if pos < cursor or pos in done:
                    continue
                if seg is None or seg.number != seg_number:
                    seg = by_number.get(seg_number)
                if seg is None:
                    raise ValueError(f"no spooled record at position {pos}")
                i = bisect_left(seg.starts, offset)
                if i == len(seg.starts) or seg.starts[i] != offset:
                    raise ValueError(f"no spooled record at position {pos}")
                fresh.add(pos)
            if not fresh:
                return
            self._done |= fresh
            self._pending -= len(fresh)
            self._settle(force=False)

    def drop_oldest(self, n: int) -> int:
        """Discard the `n` oldest records not yet acknowledged (peeked or not): they are never
        returned again. Returns how many were discarded (fewer when fewer are pending) and adds them
        to `dropped`, which is persisted with the cursor. Raises `OSError` when the cursor cannot be
        written, `ValueError` once closed. Blocks for the fsyncs."""
        with self._lock:
            self._check_open()
            if n <= 0:
                return 0
            victims: list[Position] = []
            for seg, i in self._iter_unacked():
                victims.append((seg.number, seg.starts[i]))
                if len(victims) >= n:
                    break
            if not victims:
                return 0
            self._done.update(victims)
            self._pending -= len(victims)
            self._dropped += len(victims)
            log.warning("spool %s: dropped the %d oldest records", self.directory, len(victims))
            self._settle(force=True)
            return len(victims)

    def take_dropped(self) -> int:
        """Return `dropped` and reset it to 0 (the caller reports the count). The reset is persisted
        with the next cursor write, so a crash before it reports the count again rather than never.
        Never raises, never blocks on I/O."""
        with self._lock:
            dropped, self._dropped = self._dropped, 0
            return dropped

    @property
    def dropped(self) -> int:
        """Records discarded by `drop_oldest` and not yet taken by `take_dropped`; survives restarts."""
        with self._lock:
            return self._dropped

    @property
    def pending(self) -> int:
        """Records not yet acknowledged nor dropped (peeked ones included)."""
        with self._lock:
            return self._pending

    @property
    def pending_hint(self) -> int:
        """`pending` read without the lock, for a hot path that needs an estimate; never blocks."""
        return self._pending

    @property
    def size_hint(self) -> int:
        """`size_bytes` read without the lock, for a hot path that needs an estimate; never blocks."""
        return self._size

    @property
    def size_bytes(self) -> int:
        """Bytes on disk of the segment files still held (what `max_bytes` bounds)."""
        with self._lock:
            return self._size

    @property
    def corrupt_records(self) -> int:
        """Corrupt regions skipped since this Spool was opened (each lost at least one record)."""
        with self._lock:
            return self._corrupt_records

    @property
    def corrupt_bytes(self) -> int:
        """Bytes in the corrupt regions skipped since this Spool was opened."""
        with self._lock:
            return self._corrupt_bytes

    @property
    def closed(self) -> bool:
        """True once `close` was called."""
        with self._lock:
            return self._closed

    def close(self) -> None:
        """Fsync the segment being written (when `fsync`), persist the cursor and the drop counter,
        close the files and release the directory's lock. Idempotent. Raises `OSError` if the final
        writes fail (the files are closed anyway). Blocks for the fsyncs."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                if self.fsync and self._segs and self._segs[-1].number == self._writable:
                    os.fsync(self._fd(self._segs[-1]))
                self._persist()
            finally:
                self._finalizer()

    def __enter__(self) -> Spool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Spool({str(self.directory)!r}, pending={self._pending}, size_bytes={self._size})"

    # -- opening and recovery ---------------------------------------------------------------------

    def _open(self) -> None:
        created = not self.directory.exists()
        self.directory.mkdir(parents=True, exist_ok=True)
        if created and self.fsync:
            _fsync_dir(self.directory.parent)
        lock_fd = os.open(self.directory / _LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        self._other_fds.append(lock_fd)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SpoolLocked(f"another Spool has {self.directory} open") from None
        self._dir_fd = os.open(self.directory, os.O_RDONLY)
        self._other_fds.append(self._dir_fd)
        with contextlib.suppress(FileNotFoundError):
            (self.directory / _CURSOR_TMP).unlink()

        cursor_seg, cursor_off, self._dropped = self._load_cursor()
        numbers = sorted(int(m.group(1)) for m in map(_SEGMENT_NAME.match, os.listdir(self.directory)) if m is not None)
        # Past the cursor's segment even if that file is gone, so new positions sort after it.
        self._next_number = max(cursor_seg, numbers[-1] if numbers else 0) + 1
        scanned: list[tuple[_Segment, list[tuple[int, int]], int]] = []
        for number in numbers:
            path = self.directory / _segment_name(number)
            if number < cursor_seg:
                # Wholly acknowledged; a crash came between persisting the cursor and the delete.
                path.unlink(missing_ok=True)
                continue
            buf = path.read_bytes()
            start = min(cursor_off, len(buf)) if number == cursor_seg else 0
            starts, lengths, corrupt, tail = _scan(buf, start)
            scanned.append((_Segment(number, path, starts, lengths, len(buf)), corrupt, tail))

        last_valid = max((k for k, (seg, _, _) in enumerate(scanned) if seg.starts), default=-1)
        for k, (seg, corrupt, tail) in enumerate(scanned):
            for begin, end in corrupt:
                self._count_corrupt(seg, begin, end - begin, "found on opening")
            if tail < seg.size:
                if k >= last_valid:
                    log.warning(
                        "spool %s: truncating a torn write at the end of %s: %d bytes from offset %d",
                        self.directory,
                        seg.path.name,
                        seg.size - tail,
                        tail,
                    )
                    fd = self._fd(seg)
                    os.ftruncate(fd, tail)
                    if self.fsync:
                        os.fsync(fd)
                    seg.size = tail
                else:
                    self._count_corrupt(seg, tail, seg.size - tail, "at the end of a segment followed by others")
            self._segs.append(seg)
            self._by_number[seg.number] = seg
            self._pending += len(seg.starts)
            self._size += seg.size
        self._persisted = (cursor_seg, cursor_off, self._dropped)
        self._settle(force=False)

    def _load_cursor(self) -> tuple[int, int, int]:
        path = self.directory / _CURSOR
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return 0, 0, 0
        try:
            data = json.loads(raw)
            values = (data["segment"], data["offset"], data["dropped"])
            if data.get("format") != 1 or not all(type(v) is int and v >= 0 for v in values):
                raise ValueError(f"unexpected cursor content {data!r}")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            # Starting from the beginning resends acknowledged records; guessing could lose some.
            log.error("spool %s: unreadable cursor file (%s); replaying every segment", self.directory, exc)
            return 0, 0, 0
        return values[0], values[1], values[2]

    # -- internals (the lock is held) -------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"spool {self.directory} is closed")

    def _fd(self, seg: _Segment) -> int:
        fd = self._seg_fds.get(seg.number)
        if fd is None:
            fd = os.open(seg.path, os.O_RDWR)
            self._seg_fds[seg.number] = fd
        return fd

    def _cursor(self) -> Position:
        if not self._segs:
            return (self._next_number, 0)
        seg = self._segs[0]
        if self._head < len(seg.starts):
            return (seg.number, seg.starts[self._head])
        return (seg.number, seg.size)

    def _iter_unacked(self, after: Position | None = None) -> Iterator[tuple[_Segment, int]]:
        done, segs = self._done, self._segs
        first_seg, first_index = 0, self._head
        if after is not None and after >= self._cursor():
            # Segments are in number order; one wholly gone was wholly acknowledged.
            first_seg = bisect_left([seg.number for seg in segs], after[0])
            if first_seg < len(segs) and segs[first_seg].number == after[0]:
                first_index = bisect_right(segs[first_seg].starts, after[1])
            else:
                first_index = 0
            if first_seg == 0:
                first_index = max(first_index, self._head)
        for k in range(first_seg, len(segs)):
            seg = segs[k]
            number, starts = seg.number, seg.starts
            for i in range(first_index if k == first_seg else 0, len(starts)):
                if not done or (number, starts[i]) not in done:
                    yield seg, i

    def _read(self, wanted: list[tuple[_Segment, int]]) -> tuple[list[SpoolRecord], list[tuple[_Segment, int]]]:
        """The records at `wanted` (adjacent ones in one read), and those that failed their check."""
        out: list[SpoolRecord] = []
        corrupt: list[tuple[_Segment, int]] = []
        unpack, unpack_crc, crc32 = _PREFIX.unpack_from, _CRC.unpack_from, zlib.crc32
        k = 0
        while k < len(wanted):
            seg, first = wanted[k]
            last = first
            while k + 1 < len(wanted) and wanted[k + 1][0] is seg and wanted[k + 1][1] == last + 1:
                k += 1
                last += 1
            k += 1
            starts, lengths, number = seg.starts, seg.lengths, seg.number
            base = starts[first]
            data = os.pread(self._fd(seg), starts[last] + lengths[last] - base, base)
            mv = memoryview(data)
            for i in range(first, last + 1):
                p = starts[i] - base
                end = p + lengths[i]
                if end <= len(data):
                    magic, version, flags, key_len, value_len = unpack(data, p)
                    body = p + HEADER_SIZE
                    if (
                        magic == MAGIC
                        and version == FORMAT_VERSION
                        and flags == 0
                        and body + key_len + value_len == end
                        and crc32(mv[body:end], crc32(mv[p : p + _PREFIX.size]))
                        == unpack_crc(data, p + _PREFIX.size)[0]
                    ):
                        out.append(
                            SpoolRecord((number, starts[i]), data[body : body + key_len], data[body + key_len : end])
                        )
                        continue
                corrupt.append((seg, i))
                self._count_corrupt(seg, starts[i], lengths[i], "found when reading it")
                self._done.add((number, starts[i]))
                self._pending -= 1
            mv.release()
        return out, corrupt

    def _write_chunks(self, write: _Segment | None, chunks: list[_Chunk]) -> None:
        """Write and fsync the planned chunks; on any failure undo what was written and re-raise."""
        old_size = write.size if write is not None else 0
        created: list[tuple[int, Path, int]] = []
        touched: list[int] = []
        try:
            for chunk in chunks:
                if write is not None and chunk.number == write.number:
                    fd = self._fd(write)
                else:
                    path = self.directory / _segment_name(chunk.number)
                    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
                    created.append((chunk.number, path, fd))
                _pwrite_all(fd, chunk.data, chunk.offset)
                touched.append(fd)
            if self.fsync:
                for fd in touched:
                    os.fsync(fd)
                if created:
                    os.fsync(self._dir_fd)
        except BaseException:
            if write is not None and write.number in self._seg_fds:
                try:
                    os.ftruncate(self._seg_fds[write.number], old_size)
                except OSError:
                    log.exception("spool %s: cannot undo a failed append to %s", self.directory, write.path.name)
            for _, path, fd in created:
                with contextlib.suppress(OSError):
                    os.close(fd)
                with contextlib.suppress(OSError):
                    path.unlink()
            raise
        for number, _, fd in created:
            self._seg_fds[number] = fd

    def _settle(self, *, force: bool) -> None:
        """Advance the cursor over done records; persist it if it moved (or `force`); then delete
        the segments wholly behind it."""
        gone: list[_Segment] = []
        done = self._done
        while self._segs:
            seg = self._segs[0]
            starts, number, head = seg.starts, seg.number, self._head
            end = len(starts)
            while head < end:
                pos = (number, starts[head])
                if pos not in done:
                    break
                done.remove(pos)
                head += 1
            self._head = head
            if head < len(starts):
                break
            # The segment being written goes too (the next append rolls): a drained spool holds
            # no bytes, and positions stay unique because segment numbers are never reused.
            self._segs.pop(0)
            del self._by_number[number]
            self._head = 0
            self._size -= seg.size
            gone.append(seg)
        try:
            self._persist(force=force)
        finally:
            for seg in gone:
                fd = self._seg_fds.pop(seg.number, None)
                if fd is not None:
                    with contextlib.suppress(OSError):
                        os.close(fd)
                try:
                    seg.path.unlink(missing_ok=True)
                except OSError:
                    # The next open deletes it: it is behind the cursor.
                    log.exception("spool %s: cannot delete %s", self.directory, seg.path.name)

    def _persist(self, *, force: bool = False) -> None:
        seg, off = self._cursor()
        state = (seg, off, self._dropped)
        if state == self._persisted and not force:
            return
        data = json.dumps({"format": 1, "segment": seg, "offset": off, "dropped": self._dropped}).encode()
        tmp = self.directory / _CURSOR_TMP
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _pwrite_all(fd, data, 0)
            if self.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.directory / _CURSOR)
        if self.fsync:
            os.fsync(self._dir_fd)
        self._persisted = state

    def _count_corrupt(self, seg: _Segment, offset: int, length: int, when: str) -> None:
        self._corrupt_records += 1
        self._corrupt_bytes += length
        log.error(
            "spool %s: CORRUPT data %s in %s: %d bytes from offset %d skipped; at least one record is lost",
            self.directory,
            when,
            seg.path.name,
            length,
            offset,
        )


def _as_bytes(data: object, what: str) -> bytes:
    if isinstance(data, bytes):
        return data
    if isinstance(data, bytearray | memoryview):
        return bytes(data)
    raise TypeError(f"a spool {what} must be bytes, got {type(data).__name__}")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


__all__ = ["HEADER_SIZE", "MAGIC", "Spool", "SpoolFull", "SpoolLocked", "SpoolRecord"]
