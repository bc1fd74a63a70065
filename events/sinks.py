"""Where events go. Every sink has the same small shape:

- `emit(event)`: synchronous, never blocks the call path, never raises into it; callable from any
  thread, with or without a running event loop.
- `async flush()`: returns once everything emitted before it is stored (for files: fsynced).
- `async close()`: flushes and releases resources; idempotent.

Sinks that do I/O follow the OpenTelemetry SDK's processor/exporter split: `emit` puts the event on
a bounded queue, a worker thread hands batches to `export`. A full queue drops the event, logs it
and counts it in `dropped` (the producer's chain then shows the gap); it never blocks the call.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol, runtime_checkable

from events.chain import SealedEvent, typed
from events.codec import encode_event
from events.models import EventBase

log = logging.getLogger("callgate.events")


@runtime_checkable
class Sink(Protocol):
    """The interface every sink implements."""

    def emit(self, event: EventBase) -> None: ...

    async def flush(self) -> None: ...

    async def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class SinkStats:
    """Counters of one sink: handed to it, failed inside `emit`, dropped by its queue, exported."""

    emitted: int
    failed: int
    dropped: int
    exported: int | None = None


class MemorySink:
    """Keeps every event, in emission order, as soon as `emit` returns: `.sealed` as emitted (the
    bytes every other sink gets), `.events` typed (each decoded from its bytes on first look). For
    tests and in-process inspection; unbounded."""

    def __init__(self) -> None:
        self.sealed: list[SealedEvent | EventBase] = []

    def emit(self, event: SealedEvent | EventBase) -> None:
        # list.append is atomic under the GIL: safe from any thread without a lock.
        self.sealed.append(event)

    @property
    def events(self) -> list[EventBase]:
        """Every event held, typed, in emission order (a new list on each read)."""
        return [typed(event) for event in list(self.sealed)]

    def of_type(self, type_: str) -> list[EventBase]:
        """The events of one wire type, in order."""
        return [typed(e) for e in list(self.sealed) if getattr(e, "type", None) == type_]

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


class BackgroundSink:
    """Base of sinks whose storage may block: a bounded queue and one worker thread.

    Subclasses implement `export(batch)` (called on the worker thread, in emission order) and may
    override `sync()` (make exported events durable; called by `flush`) and `shutdown()`.
    An `export` that raises is logged and its events counted in `failed_exports`; the worker goes on.
    """

    def __init__(self, *, max_queue: int = 100_000, max_batch: int = 512, name: str | None = None) -> None:
        self._queue: queue.Queue[object] = queue.Queue(maxsize=max_queue)
        self._max_batch = max_batch
        self._name = name or type(self).__name__
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._closed = False
        self.dropped = 0
        self.exported = 0
        self.failed_exports = 0

    # -- to implement ---------------------------------------------------------------------------

    def export(self, batch: Sequence[EventBase]) -> None:
        """Store a batch; runs on the worker thread."""
        raise NotImplementedError

    def sync(self) -> None:
        """Make what was exported durable; runs on the worker thread."""

    def shutdown(self) -> None:
        """Release resources; runs on the worker thread, once."""

    # -- the interface --------------------------------------------------------------------------

    def emit(self, event: EventBase) -> None:
        """Queue the event; never blocks. A full or closed queue drops it and counts it."""
        if self._closed:
            self._drop("sink is closed")
            return
        if self._thread is None:
            self._start()
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            self._drop("queue is full")

    async def flush(self) -> None:
        """Wait until every event emitted before this call is exported and synced."""
        if self._thread is None or self._closed:
            return
        marker = _Flush()
        self._queue.put(marker)
        await asyncio.get_running_loop().run_in_executor(None, marker.done.wait)

    async def close(self) -> None:
        """Flush, stop the worker and release resources. Idempotent."""
        if self._closed:
            return
        await self.flush()
        self._closed = True
        thread = self._thread
        if thread is not None:
            self._queue.put(_STOP)
            await asyncio.get_running_loop().run_in_executor(None, thread.join)

    # -- the worker -----------------------------------------------------------------------------

    def _drop(self, why: str) -> None:
        self.dropped += 1
        # Log the first drop and then every thousandth, so a flood cannot flood the log too.
        if self.dropped == 1 or self.dropped % 1000 == 0:
            log.warning("%s dropped an event (%s); %d dropped so far", self._name, why, self.dropped)

    def _start(self) -> None:
        with self._start_lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"callgate-{self._name}", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        stopping = False
        while not stopping:
            item = self._queue.get()
            batch: list[EventBase] = []
            markers: list[_Flush] = []
            while True:
                if item is _STOP:
                    stopping = True
                elif isinstance(item, _Flush):
                    markers.append(item)
                elif isinstance(item, SealedEvent | EventBase):
                    batch.append(item)  # type: ignore[arg-type]
                if stopping or len(batch) >= self._max_batch:
                    break
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            if batch:
                try:
                    self.export(batch)
                    self.exported += len(batch)
                except Exception:
                    self.failed_exports += len(batch)
                    log.exception("%s failed to export %d events", self._name, len(batch))
            if markers or stopping:
                try:
                    self.sync()
                except Exception:
                    log.exception("%s failed to sync", self._name)
                for marker in markers:
                    marker.done.set()
        try:
            self.shutdown()
        except Exception:
            log.exception("%s failed to shut down", self._name)


class JsonlSink(BackgroundSink):
    """Appends one event per line (its JSON, `hash` included: `encode_event`) to `path`.

    Reopening the same path appends. `flush()` fsyncs. Written by one worker thread, so lines never
    interleave.
    """

    def __init__(self, path: str | os.PathLike[str], *, max_queue: int = 100_000, max_batch: int = 512) -> None:
        super().__init__(max_queue=max_queue, max_batch=max_batch, name=f"JsonlSink({Path(path).name})")
        self.path = Path(path)
        self._file: IO[bytes] | None = None

    def export(self, batch: Sequence[EventBase]) -> None:
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "ab")  # noqa: SIM115 - held open for the sink's lifetime
        self._file.write(b"".join(encode_event(event) + b"\n" for event in batch))

    def sync(self) -> None:
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())

    def shutdown(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


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
