"""Where events go. Every sink has the same small shape:

- `emit(event)`: synchronous, never blocks the call path, never raises into it; callable from any
  thread, with or without a running event loop.
- `async flush()`: returns once everything emitted before it is stored (for files: fsynced), or,
  while the sink cannot store, once it tried again (its counters then say what it still holds).
- `async close()`: flushes and releases resources; idempotent.

A sink has a `role` (a class attribute): "audit" (JSONL, Kafka, memory: the record of what the
gate decided) or "observability" (OpenTelemetry: a view of it). A sink that declares none is an
audit sink: the unknown fails closed. An audit sink that can be unable to store events says so
with two cheap attributes the gate reads before every call: `available` (bool) and
`unavailable_reason` ("JsonlSink(/var/log/events.jsonl): write failed: [Errno 28] No space left on
device"). A sink that may not be able to start has `start()`, which the gate calls when it is
built; it raises `SinkStartError` naming what is wrong.

Sinks that do I/O follow the OpenTelemetry SDK's processor/exporter split: `emit` puts the event on
a bounded queue, a worker thread hands batches to `export`. A full queue drops the event and
counts it in `dropped` (the producer's chain then shows the gap); it never blocks the call. An
export that fails loses nothing at once: its events are held and written again, oldest first.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import os
import queue
import stat
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal, Protocol, overload, runtime_checkable

from events.chain import SealedEvent, typed
from events.codec import encode_event
from events.errors import EventError
from events.models import EventBase

log = logging.getLogger("callgate.events")

SinkRole = Literal["audit", "observability"]
SINK_ROLES: tuple[SinkRole, ...] = ("audit", "observability")
"""The roles a sink may declare. An audit sink that cannot store events stops new calls (with
`Gate(audit="required")`); an observability sink never does."""

RETRY_FIRST_S = 0.05
"""How long a `BackgroundSink` waits before writing again after its first failed write."""
RETRY_MAX_S = 1.0
"""The longest it waits between attempts while writes keep failing (the wait doubles up to it)."""


def sink_role(sink: object) -> str:
    """The `role` a sink declares; "audit" when it declares none (fail closed for the unknown)."""
    role = getattr(sink, "role", "audit")
    return role if isinstance(role, str) else repr(role)


def sink_label(sink: object) -> str:
    """How logs and reasons name a sink: its `name` when it has a text one, else its class."""
    name = getattr(sink, "name", None)
    return name if isinstance(name, str) and name else type(sink).__name__


class SinkError(EventError):
    """A sink cannot store events; the message says where and why (the `unavailable_reason` a
    failed export gives is this message as it is)."""


class SinkStartError(SinkError):
    """`start()` found that the sink cannot store anything (a path whose directory is missing or
    is a file, a file that cannot be opened); the message names the sink and the path."""


@runtime_checkable
class Sink(Protocol):
    """The interface every sink implements."""

    def emit(self, event: EventBase) -> None: ...

    async def flush(self) -> None: ...

    async def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class SinkStats:
    """Counters and state of one sink, as `Gate.sink_stats()` reports them."""

    emitted: int
    """Events handed to the sink's `emit`."""
    failed: int
    """Events the sink never stored: its `emit` raised, or it gave up on them (a `BackgroundSink`
    closed while its writes failed). Failures of an observability sink count here too."""
    dropped: int
    """Events lost on purpose: a full queue, a bound on held events, `drop_oldest`, emitted after
    close."""
    exported: int | None = None
    """Events stored (None: the sink does not count them)."""
    pending: int | None = None
    """Events taken and not yet stored: queued, or held for another attempt after a failed write
    (Kafka: not yet delivered). None: the sink does not say."""
    available: bool = True
    """Whether the sink takes events now. False for an audit sink stops new calls in
    `audit="required"` mode."""
    error: str | None = None
    """Why it does not take events now (None while it does)."""
    role: str = "audit"
    """"audit" or "observability"."""


class SinkEvents(Sequence[EventBase]):
    """A `MemorySink`'s events, typed, in emission order: a live view of `sink.sealed`, the same
    object on every read. `len()` costs nothing; an event is decoded from its bytes the first time
    it is looked at, once; `clear()` forgets every event the sink holds. Indexing with a slice and
    comparing with a list give plain lists' answers. Safe to read while other threads emit."""

    __slots__ = ("_sealed",)

    def __init__(self, sealed: list[SealedEvent | EventBase]) -> None:
        self._sealed = sealed

    def __len__(self) -> int:
        return len(self._sealed)

    @overload
    def __getitem__(self, index: int) -> EventBase: ...

    @overload
    def __getitem__(self, index: slice) -> list[EventBase]: ...

    def __getitem__(self, index: int | slice) -> EventBase | list[EventBase]:
        if isinstance(index, slice):
            return [typed(event) for event in self._sealed[index]]
        return typed(self._sealed[index])

    def __iter__(self) -> Iterator[EventBase]:
        # Over a copy: events emitted meanwhile are not met half-way through.
        return (typed(event) for event in self._sealed[:])

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SinkEvents | list | tuple):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # it changes as events arrive

    def __repr__(self) -> str:
        return f"SinkEvents({list(self)!r})"

    def clear(self) -> None:
        """Forget every event the sink holds (`sink.clear()`)."""
        self._sealed.clear()


class MemorySink:
    """Keeps every event, in emission order, as soon as `emit` returns: `.sealed` as emitted (the
    bytes every other sink gets), `.events` typed (`SinkEvents`: a view of the same events, each
    decoded from its bytes on first look). For tests and in-process inspection; unbounded. It
    cannot fail to take an event, so it has no `available`."""

    role: ClassVar[SinkRole] = "audit"

    def __init__(self) -> None:
        self.sealed: list[SealedEvent | EventBase] = []
        self._events = SinkEvents(self.sealed)

    def emit(self, event: SealedEvent | EventBase) -> None:
        # list.append is atomic under the GIL: safe from any thread without a lock.
        self.sealed.append(event)

    @property
    def events(self) -> SinkEvents:
        """Every event held, typed, in emission order: the same live view on every read, so
        `len(sink.events)` costs nothing and `sink.events.clear()` empties the sink."""
        return self._events

    def of_type(self, type_: str) -> list[EventBase]:
        """The events of one wire type, in order."""
        return [typed(e) for e in self.sealed[:] if getattr(e, "type", None) == type_]

    def clear(self) -> None:
        """Forget every event held so far."""
        self.sealed.clear()

    async def flush(self) -> None:
        return None

    async def close(self) -> None:
        return None


class _Flush:
    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = threading.Event()


_STOP = object()


def _wait_for(marker: _Flush, worker: threading.Thread) -> None:
    # Returns if the worker ended without reaching the marker: a flush never hangs on a dead one.
    while not marker.done.wait(0.5) and worker.is_alive():
        pass


def _error_text(exc: BaseException) -> str:
    # An OSError with an errno says it best itself ("[Errno 28] No space left on device").
    return str(exc) if isinstance(exc, OSError) and exc.errno is not None else f"{type(exc).__name__}: {exc}"


class BackgroundSink:
    """Base of sinks whose storage may block or fail: a bounded queue and one worker thread.

    Subclasses implement `export(batch)` (called on the worker thread, in emission order) and may
    override `open()` (acquire the storage; called by `start`), `sync()` (make exported events
    durable; called by `flush` and `close`) and `shutdown()`.

    When `export` raises, nothing is lost yet: the batch is held and exported again, before any
    newer event, after `RETRY_FIRST_S` and then at doubling intervals up to `RETRY_MAX_S`. Held
    events are bounded by `max_queue`; past it new events are dropped and counted. While writes
    fail the sink is not `available` and `unavailable_reason` says why (an audit sink then stops
    new calls); the first failure and the recovery are logged once each, not every attempt. A full
    queue makes the sink unavailable as well, until the worker has taken events from it.

    Counters: `exported` (stored), `dropped`, `failed` (given up on: still held when `close` made
    its last attempt), `export_failures` (attempts that raised), `pending` (queued or held).
    """

    role: ClassVar[SinkRole] = "audit"
    action: ClassVar[str] = "export"
    """The word a failed export's reason starts with ("export failed: ...")."""

    def __init__(self, *, max_queue: int = 100_000, max_batch: int = 512, name: str | None = None) -> None:
        self._queue: queue.Queue[object] = queue.Queue(maxsize=max_queue)
        self._max_queue = max_queue
        self._max_batch = max_batch
        self.name = name or type(self).__name__
        """How logs and reasons name the sink."""
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._started = False
        self._closed = False
        self.available = True
        """False while the sink cannot store events (a failed write not yet retried successfully,
        a full queue, closed). A plain attribute: cheap to read before every call."""
        self.unavailable_reason: str | None = None
        """Why it is not available, naming the sink ("JsonlSink(/p): write failed: ...")."""
        self.dropped = 0
        self.exported = 0
        self.failed = 0
        self.export_failures = 0
        # Events the worker took and has not stored: a failed batch and what came after it.
        # Only the worker thread changes it; others read its length.
        self._held: collections.deque[SealedEvent | EventBase] = collections.deque()
        self._state = threading.Lock()
        self._write_error: str | None = None
        self._failing_since = 0.0
        self._full = False
        self._overflowed = False
        self._dropped_closed = False

    # -- to implement ---------------------------------------------------------------------------

    def export(self, batch: Sequence[SealedEvent | EventBase]) -> None:
        """Store a batch; runs on the worker thread. Raise when it could not be stored: the batch
        is held and given again (the same events, maybe with newer ones after them)."""
        raise NotImplementedError

    def open(self) -> None:
        """Acquire the storage now; raise `SinkStartError` when it cannot be. Called by `start`,
        on the caller's thread, once."""

    def sync(self) -> None:
        """Make what was exported durable; runs on the worker thread."""

    def shutdown(self) -> None:
        """Release resources; runs on the worker thread, once (on the closing task's thread when
        the sink was started but never given an event)."""

    # -- the interface --------------------------------------------------------------------------

    @property
    def pending(self) -> int:
        """Events queued or held after a failed write, not yet stored (approximate while the
        worker runs)."""
        return len(self._held) + self._queue.qsize()

    def start(self) -> None:
        """Open the storage (`open()`), so a sink that cannot store anything fails when it is
        configured rather than at its first event; the gate calls it when it is built. Raises
        what `open` raises (`SinkStartError`). Idempotent."""
        with self._start_lock:
            if self._started:
                return
            self.open()
            self._started = True

    def emit(self, event: EventBase) -> None:
        """Queue the event; never blocks. A full or closed queue drops it and counts it."""
        if self._closed:
            self._drop_after_close()
            return
        if self._thread is None:
            self._start()
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            self._queue_full()

    async def flush(self) -> None:
        """Wait until every event emitted before this call is exported and synced; while writes
        fail, until one more attempt was made (`pending` and `available` then say what is held).
        Never waits on a backoff."""
        thread = self._thread
        if thread is None or self._closed:
            return
        marker = _Flush()
        self._queue.put(marker)
        await asyncio.get_running_loop().run_in_executor(None, _wait_for, marker, thread)

    async def close(self) -> None:
        """Flush, make a last attempt at what is held, stop the worker and release resources.
        Events still not stored count as `failed` (logged once). Idempotent."""
        if self._closed:
            return
        await self.flush()
        self._closed = True
        self._refresh()
        with self._start_lock:
            thread = self._thread
        if thread is not None:
            self._queue.put(_STOP)
            await asyncio.get_running_loop().run_in_executor(None, thread.join)
        elif self._started:
            # Started (its storage open) but never given an event: no worker to release it.
            self.shutdown()

    # -- state ----------------------------------------------------------------------------------

    def _refresh(self) -> None:
        with self._state:
            why = self._write_error
            if why is None and self._full:
                why = f"queue full ({self._max_queue} events waiting); dropping new events"
            if why is None and self._closed:
                why = "closed"
            # The reason first: whoever reads `available` False finds why.
            self.unavailable_reason = None if why is None else f"{self.name}: {why}"
            self.available = why is None

    def _write_failed(self, why: str) -> None:
        first = self._write_error is None
        if first:
            self._failing_since = time.monotonic()
        self._write_error = why
        self._refresh()
        if first:
            log.warning("%s: %s; holding %d events and trying again", self.name, why, len(self._held))

    def _write_worked(self, wrote: int) -> None:
        if self._write_error is None:
            return
        self._write_error = None
        self._overflowed = False
        self._refresh()
        log.warning(
            "%s recovered after %.1f s; wrote %d held events",
            self.name,
            time.monotonic() - self._failing_since,
            wrote,
        )

    def _queue_full(self) -> None:
        self.dropped += 1
        with self._state:
            first, self._full = not self._full, True
        if first:
            self._refresh()
            log.warning("%s cannot keep up: its queue of %d events is full; dropping", self.name, self._max_queue)

    def _queue_has_room(self) -> None:
        # Room for half a queue at least, so a sink at the edge does not flip (and log) per batch.
        if self._queue.qsize() > self._max_queue // 2:
            return
        with self._state:
            self._full = False
        self._refresh()
        log.warning("%s has room in its queue again; %d events dropped so far", self.name, self.dropped)

    def _drop_after_close(self) -> None:
        self.dropped += 1
        if not self._dropped_closed:
            self._dropped_closed = True
            log.warning("%s dropped an event emitted after close", self.name)

    # -- the worker -----------------------------------------------------------------------------

    def _start(self) -> None:
        with self._start_lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"callgate-{self.name}", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        try:
            self._work()
        except BaseException as exc:
            # A bug of the loop itself: the sink says it cannot store rather than dying quietly.
            self._write_failed(f"worker stopped: {type(exc).__name__}: {exc}")
            log.exception("%s: its worker stopped", self.name)
        finally:
            self._give_up()
            try:
                self.shutdown()
            except Exception:
                log.exception("%s failed to shut down", self.name)

    def _work(self) -> None:
        held = self._held
        backoff = RETRY_FIRST_S
        retry_at = 0.0
        stopping = False
        while not stopping:
            markers: list[_Flush] = []
            # Wait for work: for ever while nothing is held, else until the next attempt is due.
            timeout = max(0.0, retry_at - time.monotonic()) if held else None
            item: object
            try:
                item = self._queue.get(timeout=timeout)
            except queue.Empty:
                item = None
            taken = 0
            while item is not None:
                if item is _STOP:
                    stopping = True
                elif isinstance(item, _Flush):
                    markers.append(item)
                elif isinstance(item, SealedEvent | EventBase):
                    self._hold(item)
                    taken += 1
                if stopping or taken >= self._max_batch:
                    break
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    item = None
            if self._full:
                self._queue_has_room()
            # A flush or the close tries at once; otherwise a failing sink waits for its backoff.
            due = self._write_error is None or markers or stopping or time.monotonic() >= retry_at
            if held and due:
                if self._write_held():
                    backoff = RETRY_FIRST_S
                else:
                    retry_at = time.monotonic() + backoff
                    backoff = min(backoff * 2, RETRY_MAX_S)
            if markers or stopping:
                self._sync()
                for marker in markers:
                    marker.done.set()

    def _hold(self, event: SealedEvent | EventBase) -> None:
        if len(self._held) < self._max_queue:
            self._held.append(event)
            return
        self.dropped += 1
        if not self._overflowed:
            self._overflowed = True
            log.warning(
                "%s holds %d events it could not write: dropping newer ones until it can", self.name, self._max_queue
            )

    def _write_held(self) -> bool:
        """Export what is held, oldest first, one batch at a time; False at the first failure."""
        held, wrote = self._held, 0
        while held:
            batch = list(itertools.islice(held, self._max_batch))
            try:
                self.export(batch)
            except Exception as exc:
                self.export_failures += 1
                why = str(exc) if isinstance(exc, SinkError) else f"{self.action} failed: {_error_text(exc)}"
                self._write_failed(why)
                return False
            for _ in batch:
                held.popleft()
            self.exported += len(batch)
            wrote += len(batch)
        self._write_worked(wrote)
        return True

    def _sync(self) -> None:
        try:
            self.sync()
        except Exception as exc:
            self._write_failed(f"sync failed: {_error_text(exc)}")
            return
        if not self._held:
            self._write_worked(0)

    def _give_up(self) -> None:
        """At the end: what is still held or queued was never stored."""
        left = len(self._held)
        self._held.clear()
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, _Flush):
                item.done.set()
            elif item is not _STOP:
                left += 1
        if left:
            self.failed += left
            log.error(
                "%s closed with %d events it could not store (%s)", self.name, left, self._write_error or "closed"
            )


class JsonlSink(BackgroundSink):
    """Appends one event per line (its JSON, `hash` included: `encode_event`) to `path`.

    - `start()` (the gate calls it) opens the file, creating it, and raises `SinkStartError` naming
      the path when it cannot: the directory is missing (it is not created) or is a file, the
      path is a directory, the file cannot be opened.
    - The file is unbuffered: a write error shows at the batch that met it. A batch whose write
      fails midway is cut off again (the file truncated back to where the batch began), so no torn
      line remains; where that is impossible (not a regular file), the next write starts on a new
      line. The file is then closed and opened again at the next attempt, so a path that becomes
      writable again (space freed, a mount back) is picked up.
    - Reopening the same path appends. `flush()` fsyncs (regular files). Written by one worker
      thread, so lines never interleave; one sink per file (the truncation assumes no other
      writer).
    """

    action: ClassVar[str] = "write"

    def __init__(self, path: str | os.PathLike[str], *, max_queue: int = 100_000, max_batch: int = 512) -> None:
        self.path = Path(path)
        super().__init__(max_queue=max_queue, max_batch=max_batch, name=f"JsonlSink({self.path})")
        self._fd: int | None = None
        self._regular = False
        self._torn = False
        self._open_lock = threading.Lock()

    def open(self) -> None:
        try:
            self._descriptor()
        except OSError as exc:
            raise SinkStartError(f"{self.name} cannot start: {_unopenable(self.path, exc)}") from exc

    def _descriptor(self) -> int:
        with self._open_lock:
            if self._fd is None:
                flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
                fd = os.open(self.path, flags, 0o666)
                self._regular = stat.S_ISREG(os.fstat(fd).st_mode)
                self._fd = fd
            return self._fd

    def export(self, batch: Sequence[SealedEvent | EventBase]) -> None:
        try:
            fd = self._descriptor()
        except OSError as exc:
            raise SinkError(_unopenable(self.path, exc)) from exc
        data = b"".join(encode_event(event) + b"\n" for event in batch)
        if self._torn:
            data = b"\n" + data
        begin = os.lseek(fd, 0, os.SEEK_END) if self._regular else 0
        view, written = memoryview(data), 0
        try:
            while written < len(data):
                written += os.write(fd, view[written:])
        except OSError:
            if written:
                self._cut(fd, begin)
            self._close_descriptor()
            raise
        self._torn = False

    def _cut(self, fd: int, begin: int) -> None:
        if self._regular:
            try:
                os.ftruncate(fd, begin)
                return
            except OSError:
                pass
        self._torn = True

    def sync(self) -> None:
        if self._fd is not None and self._regular:
            os.fsync(self._fd)

    def shutdown(self) -> None:
        self._close_descriptor()

    def _close_descriptor(self) -> None:
        with self._open_lock:
            fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError as exc:
                log.warning("%s: closing the file failed: %s", self.name, exc)


def _unopenable(path: Path, exc: OSError) -> str:
    """Why `path` cannot be opened, in the terms a person fixes it in."""
    ancestor = path.parent
    while not os.path.lexists(ancestor) and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"{ancestor} is not a directory"
    if ancestor != path.parent:
        return f"the directory {path.parent} does not exist"
    if path.is_dir():
        return f"{path} is a directory"
    return f"cannot open {path}: [Errno {exc.errno}] {exc.strerror}" if exc.strerror else f"cannot open {path}: {exc}"


def read_jsonl(path: str | os.PathLike[str]) -> list[EventBase]:
    """Every event in a JSONL file written by `JsonlSink`, parsed (raises `EventParseError`)."""
    from events.codec import parse_event

    with open(path, "rb") as handle:
        return [parse_event(line) for line in handle if line.strip()]


@dataclass(frozen=True, slots=True)
class CallStart:
    """What a tracing sink learns when a call starts (before any decision)."""

    gate: str
    workflow: str | None
    agent: str | None
    tool: str
    call_id: str
    run_id: str
    tenant: str | None
    principal: str | None


@runtime_checkable
class TracedCall(Protocol):
    """A call's span as a tracing sink keeps it: its ids go into every event of the call;
    `activate` is called inside the tool body's own context before it runs (so the tool's spans
    nest under the call's); `end` is called once, with the call's outcome event (or `None` if the
    gate could not build one)."""

    trace_id: str | None
    span_id: str | None

    def activate(self) -> None: ...

    def end(self, outcome: EventBase | None) -> None: ...


@runtime_checkable
class CallTracer(Protocol):
    """A sink that also traces calls (the OpenTelemetry sink): the gate calls `start_call` when a
    call starts, on the caller's thread and context, so the span nests under the current one."""

    def start_call(self, call: CallStart) -> TracedCall | None: ...
