"""`KafkaSink`: decision events to a Kafka topic, with a durable local spool so that a broker that is
down, slow or restarted never stops the agent's calls and never costs an event.

How an event travels:

1. `emit(event)` appends it to an in-memory queue (a bounded deque; nothing else on the call path).
2. The sink's own thread (with its own event loop) moves queued events into the spool: append-only,
   checksummed segment files, fsynced once per batch. From here on the event survives a crash of
   this process.
3. The same thread reads the spool's oldest records, sends them with an aiokafka producer
   (`acks="all"`, no idempotence: deduplication is by `event_id` downstream) and acknowledges each
   record once the broker has it; a segment is deleted when all its records are acknowledged.
4. A broker that cannot be reached, or a send that fails, leaves the records in the spool; the
   thread reconnects with backoff and replays them in order. Duplicates in the topic are possible
   (a send the broker stored but never acknowledged); losses are not.

Record key = `producer_id` (each producer's chain stays in order in one partition); value = the
event's JSON (`encode_event`); CloudEvents binary-mode headers (`ce_specversion`, `ce_id`, `ce_source`,
`ce_type`, `ce_time`, `content-type`).

When the spool is full (the broker has been away long enough), the default `when_full="block"`
fails closed: `available` turns False and the gate ends new calls `Blocked` with reason "audit
unavailable" until there is room again. `when_full="drop_oldest"` discards the oldest spooled
events instead; every discarded event is counted (`dropped`) and the count rides on the next
delivered batch as the `callgate_dropped` header.

This module imports aiokafka; import it only when used.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import contextlib
import hashlib
import itertools
import logging
import os
import threading
import time
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any, Literal

from events.codec import encode_event
from events.models import EventBase
from events.spool import Spool, SpoolFull, SpoolLocked, SpoolRecord

log = logging.getLogger("callgate.events.kafka")

WhenFull = Literal["block", "drop_oldest"]

CE_SOURCE_PREFIX = "urn:callgate:producer:"
CE_TYPE_PREFIX = "dev.callgate."
DROPPED_HEADER = "callgate_dropped"
DEFAULT_TOPIC = "callgate.events"
DEFAULT_PARTITIONS = 3
"""The partition count of the events topic. Whoever reaches the broker first (a sink, the
materializer, `callgate broker`) creates the topic with it, so a key's partition never moves."""
_SEP = b"\x1f"


def default_spool_dir(bootstrap_servers: str, topic: str) -> Path:
    """`$XDG_DATA_HOME/callgate/spool/<topic>-<hash of the bootstrap servers>` (or ~/.local/share)."""
    base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    tag = hashlib.sha256(bootstrap_servers.encode()).hexdigest()[:12]
    return base / "callgate" / "spool" / f"{topic}-{tag}"


async def ensure_topic(
    bootstrap_servers: str,
    topic: str = DEFAULT_TOPIC,
    partitions: int = DEFAULT_PARTITIONS,
    *,
    replication_factor: int = 1,
    timeout_s: float = 5.0,
    **client_options: Any,
) -> int:
    """Create `topic` with `partitions` partitions unless it exists; return the partition count the
    broker lists for it. Safe when several processes race to create it (one wins, the others find
    it). A topic that already exists with another count is left as it is, with a warning: its keys'
    partitions would move if it changed. Raises what the admin client raises when the broker cannot
    be reached within `timeout_s`."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import TopicAlreadyExistsError

    admin = AIOKafkaAdminClient(
        bootstrap_servers=bootstrap_servers, request_timeout_ms=int(timeout_s * 1000), **client_options
    )
    await asyncio.wait_for(admin.start(), timeout_s)
    try:
        if topic not in await admin.list_topics():
            with contextlib.suppress(TopicAlreadyExistsError):
                await admin.create_topics(
                    [NewTopic(topic, num_partitions=partitions, replication_factor=replication_factor)]
                )
        described = await admin.describe_topics([topic])
    finally:
        await admin.close()
    listed = len(described[0]["partitions"]) if described and not described[0].get("error_code") else 0
    if listed and listed != partitions:
        log.warning(
            "topic %s on %s has %d partitions, not %d: it was created by something else",
            topic,
            bootstrap_servers,
            listed,
            partitions,
        )
    return listed


def _spool_key(event: EventBase) -> bytes:
    # The spool stores (key, value); the key carries what the headers need, so sending does not
    # parse the JSON again: producer id, event id, type, time, gate.
    return _SEP.join(
        part.encode()
        for part in (
            event.producer_id,
            event.event_id,
            str(getattr(event, "type", "")),
            event.time.isoformat().replace("+00:00", "Z"),
            event.gate,
        )
    )


def _headers(key: bytes, dropped: int) -> tuple[bytes, list[tuple[str, bytes]]]:
    producer_id, event_id, kind, when, gate = key.split(_SEP)
    headers = [
        ("ce_specversion", b"1.0"),
        ("ce_id", event_id),
        ("ce_source", CE_SOURCE_PREFIX.encode() + gate + b":" + producer_id),
        ("ce_type", CE_TYPE_PREFIX.encode() + kind),
        ("ce_time", when),
        ("content-type", b"application/json"),
    ]
    if dropped:
        headers.append((DROPPED_HEADER, str(dropped).encode()))
    return producer_id, headers


class KafkaSink:
    """Sends events to `topic` on `bootstrap_servers`, spooling them on disk until acknowledged.

    - `spool_dir`: where undelivered events wait (default: `default_spool_dir(...)`); one sink at a
      time per directory (a lock file; a second one raises `SpoolLocked`). Events a previous sink
      left there are sent first.
    - `partitions` / `replication_factor`: used when the topic has to be created.
    - `spool_max_bytes` and `when_full` ("block" or "drop_oldest"): see the module docstring.
    - `max_queue`: events held in memory before the spool takes them; past it `emit` drops and
      counts (the producer's chain shows the gap), never blocks.
    - `max_event_bytes`: the largest record sent; the gate cuts event arguments so events fit, and
      a record that is still too large is written to `oversize.jsonl` in the spool directory,
      counted in `oversize`, and never blocks the records behind it.
    - `producer_options` go to `aiokafka.AIOKafkaProducer` (e.g. `security_protocol`).

    `emit` is safe from any thread, never blocks and never raises. `flush` and `close` are async.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str = "callgate.events",
        spool_dir: str | os.PathLike[str] | None = None,
        *,
        partitions: int = 3,
        replication_factor: int = 1,
        when_full: WhenFull = "block",
        spool_max_bytes: int = 256 * 2**20,
        max_queue: int = 100_000,
        max_event_bytes: int = 900_000,
        linger_ms: int = 5,
        batch_records: int = 2000,
        connect_timeout_s: float = 5.0,
        **producer_options: Any,
    ) -> None:
        if when_full not in ("block", "drop_oldest"):
            raise ValueError(f"when_full must be 'block' or 'drop_oldest', got {when_full!r}")
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.partitions = partitions
        self.replication_factor = replication_factor
        self.when_full: WhenFull = when_full
        self.max_queue = max_queue
        self.max_event_bytes = max_event_bytes
        self.linger_s = linger_ms / 1000.0
        self.batch_records = batch_records
        self.connect_timeout_s = connect_timeout_s
        self.producer_options = producer_options
        self.spool_dir = Path(spool_dir) if spool_dir is not None else default_spool_dir(bootstrap_servers, topic)
        self.spool_dir.mkdir(parents=True, exist_ok=True)
        # Space comes back a whole segment at a time: small segments keep drop_oldest's losses small.
        segment_bytes = max(64 * 1024, min(16 * 2**20, spool_max_bytes // 64))
        try:
            self._spool = Spool(self.spool_dir / "segments", max_bytes=spool_max_bytes, segment_bytes=segment_bytes)
        except SpoolLocked:
            raise SpoolLocked(f"another KafkaSink is using the spool directory {self.spool_dir}") from None

        self._queue: collections.deque[EventBase] = collections.deque()
        self._progress = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._closed = False
        self._spool_full = False
        self._connected = False
        self._oversize_file: IO[bytes] | None = None
        self._unreported_drops = 0
        # Held while events move from the queue to the spool, so `pending` never counts one twice.
        self._moving = threading.Lock()

        self.dropped = 0
        """Events lost on purpose: the memory queue was full, or `drop_oldest` made room."""
        self.sent = 0
        """Records the broker acknowledged."""
        self.send_failures = 0
        """Sends that failed (their records stayed spooled and were retried)."""
        self.oversize = 0
        """Records too large to send, kept in `oversize.jsonl` instead."""
        self.last_error: str | None = None
        """The last connection or send error, for operators."""

        # A normal interpreter exit without close() still moves queued events into the spool.
        atexit.register(_spool_on_exit, weakref.ref(self))

    # -- the sink interface ---------------------------------------------------------------------

    @property
    def available(self) -> bool:
        """False while the spool is full and `when_full="block"`: the gate then refuses new calls."""
        return not (self._spool_full and self.when_full == "block")

    @property
    def connected(self) -> bool:
        """True while a producer is connected to the broker."""
        return self._connected

    @property
    def pending(self) -> int:
        """Events not yet acknowledged by the broker (queued in memory or spooled)."""
        with self._moving:
            return len(self._queue) + self._spool.pending

    def emit(self, event: EventBase) -> None:
        """Queue the event for the sender thread. Never blocks, never raises; drops and counts only
        when the memory queue is full or the sink is closed."""
        if self._closed or len(self._queue) >= self.max_queue:
            self._count_drop("sink is closed" if self._closed else "memory queue is full")
            return
        self._queue.append(event)
        if self._thread is None:
            self._start()

    async def flush(self, timeout: float | None = 30.0) -> bool:
        """Wait until the queue and the spool are empty (every event acknowledged) or `timeout`
        passes. Returns True when everything was delivered, False on timeout (the events stay
        spooled)."""
        if self._thread is None and not self._spool.pending and not self._queue:
            return True
        if self._thread is None:
            self._start()
        return await asyncio.get_running_loop().run_in_executor(None, self._wait_drained, timeout)

    async def close(self, timeout: float | None = 30.0) -> bool:
        """Flush (up to `timeout`), then stop the sender and close the spool. What was not
        delivered stays in the spool for the next sink over the same directory. Idempotent.
        Returns whether everything was delivered."""
        if self._closed:
            return self.pending == 0
        delivered = await self.flush(timeout)
        self._closed = True
        self._stop.set()
        with self._progress:
            self._progress.notify_all()
        thread = self._thread
        if thread is not None:
            await asyncio.get_running_loop().run_in_executor(None, thread.join)
        else:
            self._spool.close()
        self._release()
        return delivered

    # -- internals ------------------------------------------------------------------------------

    def _release(self) -> None:
        if self._oversize_file is not None:
            self._oversize_file.close()
            self._oversize_file = None

    def _count_drop(self, why: str) -> None:
        self.dropped += 1
        if self.dropped == 1 or self.dropped % 1000 == 0:
            log.warning("KafkaSink dropped an event (%s); %d dropped so far", why, self.dropped)

    def _start(self) -> None:
        with self._start_lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._thread_main, name="callgate-kafka-sink", daemon=True)
                self._thread.start()

    def _drained(self) -> bool:
        return not self._queue and self._spool.pending == 0

    def _wait_drained(self, timeout: float | None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._progress:
            while not self._drained():
                if self._thread is None or not self._thread.is_alive():
                    return self._drained()
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._progress.wait(0.05 if left is None else min(left, 0.05))
            return True

    def _notify(self) -> None:
        with self._progress:
            self._progress.notify_all()

    # -- the sender thread ----------------------------------------------------------------------

    def _thread_main(self) -> None:
        try:
            asyncio.run(self._run())
        except Exception:
            log.exception("KafkaSink sender stopped unexpectedly; undelivered events stay in %s", self.spool_dir)
        finally:
            self._spool_queue()
            self._spool.close()
            self._notify()

    def _spool_queue(self) -> int:
        """Move queued events into the spool (one fsync per batch). Returns how many moved."""
        moved = 0
        while self._queue:
            # islice over the deque runs in C under the GIL: safe beside emit's appends.
            batch = list(itertools.islice(self._queue, self.batch_records))
            records = [(_spool_key(event), encode_event(event)) for event in batch]
            with self._moving:
                try:
                    self._spool.append(records)
                    self._spool_full = False
                except SpoolFull:
                    if self.when_full == "block":
                        # Fail closed: the events wait in memory, the gate refuses new calls.
                        self._spool_full = True
                        return moved
                    self._make_room(records)
                for _ in batch:
                    self._queue.popleft()
            moved += len(batch)
        return moved

    def _make_room(self, records: list[tuple[bytes, bytes]]) -> None:
        while True:
            try:
                self._spool.append(records)
                return
            except SpoolFull:
                dropped = self._spool.drop_oldest(max(len(records), 1))
                self.dropped += dropped
                log.warning("KafkaSink spool full: dropped the %d oldest events", dropped)
                if dropped == 0:
                    # The batch alone is larger than the whole spool: keep what fits, one by one.
                    for record in records:
                        try:
                            self._spool.append([record])
                        except SpoolFull:
                            self.dropped += 1
                    return

    async def _run(self) -> None:
        producer: Any = None
        backoff = 0.1
        next_attempt = 0.0
        try:
            while True:
                moved = self._spool_queue()
                progressed = moved > 0
                if self._spool.pending:
                    if producer is None and time.monotonic() >= next_attempt:
                        producer = await self._connect()
                        if producer is None:
                            next_attempt = time.monotonic() + backoff
                            backoff = min(backoff * 2, 5.0)
                        else:
                            backoff = 0.1
                    if producer is not None:
                        ok, sent = await self._send_batch(producer)
                        progressed = progressed or sent > 0
                        if not ok:
                            await self._disconnect(producer)
                            producer = None
                            next_attempt = time.monotonic() + backoff
                if progressed:
                    self._notify()
                if self._stop.is_set() and (self._drained() or producer is None):
                    return
                if not progressed:
                    await asyncio.sleep(self.linger_s)
        finally:
            if producer is not None:
                await self._disconnect(producer)

    async def _connect(self) -> Any:
        from aiokafka import AIOKafkaProducer

        options: dict[str, Any] = {
            "acks": "all",
            "enable_idempotence": False,
            "linger_ms": int(self.linger_s * 1000),
            "compression_type": "gzip",
            "max_request_size": self.max_event_bytes + 4096,
            "request_timeout_ms": int(self.connect_timeout_s * 1000),
            "retry_backoff_ms": 100,
            **self.producer_options,
        }
        producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap_servers, **options)
        try:
            await asyncio.wait_for(producer.start(), self.connect_timeout_s)
            await self._ensure_topic()
        except Exception as exc:
            self.last_error = f"connect: {type(exc).__name__}: {exc}"
            log.debug("KafkaSink cannot reach %s: %s", self.bootstrap_servers, self.last_error)
            with contextlib.suppress(Exception):
                await producer.stop()
            self._connected = False
            return None
        self._connected = True
        return producer

    async def _ensure_topic(self) -> None:
        from aiokafka.admin import AIOKafkaAdminClient, NewTopic
        from aiokafka.errors import TopicAlreadyExistsError

        admin = AIOKafkaAdminClient(
            bootstrap_servers=self.bootstrap_servers, request_timeout_ms=int(self.connect_timeout_s * 1000)
        )
        await admin.start()
        try:
            existing = await admin.list_topics()
            if self.topic not in existing:
                with contextlib.suppress(TopicAlreadyExistsError):
                    await admin.create_topics(
                        [
                            NewTopic(
                                self.topic, num_partitions=self.partitions, replication_factor=self.replication_factor
                            )
                        ]
                    )
        finally:
            await admin.close()

    async def _topic_present(self, producer: Any) -> bool:
        try:
            metadata = await asyncio.wait_for(producer.client.fetch_all_metadata(), self.connect_timeout_s)
        except Exception as exc:
            self._record_failure(exc)
            return False
        return self.topic in metadata.topics()

    async def _disconnect(self, producer: Any) -> None:
        self._connected = False
        with contextlib.suppress(Exception):
            await asyncio.wait_for(producer.stop(), self.connect_timeout_s)

    async def _send_batch(self, producer: Any) -> tuple[bool, int]:
        """Send the spool's oldest records; ack those the broker took. (healthy, records acked)."""
        records = self._spool.peek(self.batch_records, max_bytes=16 * 2**20)
        if not records:
            return True, 0
        # Drops are reported on the first record of the next batch the broker acknowledges.
        self._unreported_drops += self._spool.take_dropped()
        report = self._unreported_drops
        carrier: SpoolRecord | None = None
        sendable: list[SpoolRecord] = []
        futures = []
        for record in records:
            if len(record.value) > self.max_event_bytes:
                self._keep_oversize(record)
                continue
            key, headers = _headers(record.key, report if carrier is None else 0)
            if carrier is None:
                carrier = record
            try:
                futures.append(await producer.send(self.topic, value=record.value, key=key, headers=headers))
            except Exception as exc:
                self._record_failure(exc)
                break
            sendable.append(record)
        results = await asyncio.gather(*futures, return_exceptions=True)
        acked = [
            record.position
            for record, result in zip(sendable, results, strict=False)
            if not isinstance(result, BaseException)
        ]
        if acked and not await self._topic_present(producer):
            # The broker answered, but the topic is gone (a broker that restarted empty, or a topic
            # deleted by hand): some brokers acknowledge writes to a missing topic without storing
            # them. Nothing of this batch counts as delivered; recreate the topic and send again.
            log.warning(
                "KafkaSink: topic %s vanished from %s; recreating it and resending", self.topic, self.bootstrap_servers
            )
            with contextlib.suppress(Exception):
                await self._ensure_topic()
            return True, 0
        if carrier is not None and carrier.position in acked:
            self._unreported_drops -= report
        failures = [result for result in results if isinstance(result, BaseException)]
        oversize = [record.position for record in records if len(record.value) > self.max_event_bytes]
        if acked or oversize:
            self._spool.ack([*acked, *oversize])
        self.sent += len(acked)
        if failures or len(sendable) + len(oversize) < len(records):
            for failure in failures[:1]:
                self._record_failure(failure)
            return False, len(acked)
        return True, len(acked)

    def _record_failure(self, exc: BaseException) -> None:
        self.send_failures += 1
        self.last_error = f"send: {type(exc).__name__}: {exc}"
        log.warning("KafkaSink send failed (%s); events stay spooled", self.last_error)

    def _keep_oversize(self, record: SpoolRecord) -> None:
        self.oversize += 1
        if self._oversize_file is None:
            self._oversize_file = open(self.spool_dir / "oversize.jsonl", "ab")  # noqa: SIM115
        self._oversize_file.write(record.value + b"\n")
        self._oversize_file.flush()
        os.fsync(self._oversize_file.fileno())
        log.error(
            "KafkaSink: an event of %d bytes exceeds max_event_bytes=%d; kept in %s",
            len(record.value),
            self.max_event_bytes,
            self.spool_dir / "oversize.jsonl",
        )


def _spool_on_exit(ref: weakref.ReferenceType[KafkaSink]) -> None:
    # Appends are fsynced and the spool locks itself, so this may run beside the sender thread;
    # the spool is left open for it (the process is ending either way).
    sink = ref()
    if sink is None or sink._closed:
        return
    with contextlib.suppress(Exception):
        sink._spool_queue()


def decode_headers(headers: Sequence[tuple[str, bytes]]) -> dict[str, str]:
    """A record's headers as a dict of text (for consumers and tests)."""
    return {name: value.decode() for name, value in headers}


__all__ = ["DROPPED_HEADER", "KafkaSink", "SpoolLocked", "decode_headers", "default_spool_dir"]
