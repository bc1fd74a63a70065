"""`KafkaSink`: decision events to a Kafka topic, with a durable local spool so that a broker that is
down, slow, restarted or forgetful never stops the agent's calls and never costs an event.

How an event travels:

1. `emit(event)` appends it to an in-memory queue (a bounded deque; nothing else on the call path).
2. The sink's own thread (with its own event loop) moves queued events into the spool, one batch
   at a time between sends: append-only, checksummed segment files, fsynced once per batch. From
   here on the event survives a crash of this process.
3. The same thread sends the spool's oldest records with an aiokafka producer (`acks="all"`, no
   idempotence: deduplication is by `event_id` downstream), each producer's records to one pinned
   partition. A record counts as delivered only when the broker acknowledged it to a partition
   that the broker's own metadata, read after the batch, lists for the topic.
4. Delivered records leave the spool: at once, or with `confirm_group=GROUP` only once that
   consumer group (the materializer) has committed an offset past them, so a broker that loses
   acknowledged records, restarts empty or recreates the topic costs nothing: whatever the group
   never confirmed is sent again, and the store's `event_id` key absorbs the repeats.
5. A broker that cannot be reached, or a send that fails, leaves the records in the spool; the
   thread reconnects with backoff and replays them in order. Duplicates in the topic are possible;
   losses are not.

A new broker is told from a reconnect by its cluster id (the embedded broker takes a new one at
every start), and a recreated log by offsets that go backwards or a group whose committed offsets
vanish; any of them sends again everything not yet confirmed. The topic is created by whoever
reaches the broker first with `DEFAULT_PARTITIONS` (`ensure_topic`), and this module's clients
never let a metadata request create it with the broker's own default.

Record key = `producer_id` (each producer's chain stays in order in one partition); value = the
event's JSON (`encode_event`); CloudEvents binary-mode headers (`ce_specversion`, `ce_id`, `ce_source`,
`ce_type`, `ce_time`, `content-type`).

`KafkaSink` is an audit sink: while it cannot take events, `available` is False and
`unavailable_reason` says why, so a gate in `audit="required"` mode ends new calls `Blocked`
("audit unavailable: KafkaSink(...): ...") until it can again. That is the case while the spool
cannot be written (a full or read-only disk: the events wait in memory and the write is tried
again), while the memory queue is full, after `close`, and when the spool is full: the default
`when_full="block"` fails closed once the spool is full and nothing leaves it (the broker, or with
`confirm_group` the consumer group, has been away for `STALLED_AFTER_S`); a batch larger than the
room left is split, so any spool size works. `when_full="drop_oldest"` discards the oldest spooled
events instead; every discarded event is counted (`dropped`) and the count rides on the next
delivered batch as the `callgate_dropped` header. Each change of `available` is logged once.

This module imports aiokafka; import it only when used.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import contextlib
import functools
import hashlib
import logging
import os
import random
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MethodType
from typing import IO, Any, ClassVar, Literal, NamedTuple
from urllib.parse import quote

from events.codec import encode_event
from events.loss import LOSS_REPORT_TYPE, LossReport, Watermarks, encode_loss_report
from events.models import EventBase
from events.sinks import SinkRole
from events.spool import HEADER_SIZE, Spool, SpoolFull, SpoolLocked, SpoolRecord

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
STALLED_AFTER_S = 5.0
"""A sink from whose spool nothing left for this long is stalled (broker or group away): it no
longer paces calls, and a full spool then blocks them."""


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
    try:
        await asyncio.wait_for(admin.start(), timeout_s)
        if topic not in await admin.list_topics():
            with contextlib.suppress(TopicAlreadyExistsError):
                await admin.create_topics(
                    [NewTopic(topic, num_partitions=partitions, replication_factor=replication_factor)]
                )
        described = await admin.describe_topics([topic])
    finally:
        with contextlib.suppress(Exception):
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


@functools.lru_cache(maxsize=256)
def _source(gate: bytes, producer_id: bytes) -> bytes:
    # A URI whatever the gate is called: its name percent-encoded (spaces, colons, non-ASCII),
    # the producer id after it, so two gates of one name stay apart.
    name = quote(gate.decode("utf-8", "replace"), safe="").encode()
    return b"%s%s:%s" % (CE_SOURCE_PREFIX.encode(), name, producer_id)


def _headers(key: bytes, dropped: int) -> tuple[bytes, list[tuple[str, bytes]]]:
    producer_id, event_id, kind, when, gate = key.split(_SEP)
    headers = [
        ("ce_specversion", b"1.0"),
        ("ce_id", event_id),
        ("ce_source", _source(gate, producer_id)),
        ("ce_type", CE_TYPE_PREFIX.encode() + kind),
        ("ce_time", when),
        ("content-type", b"application/json"),
    ]
    if dropped:
        headers.append((DROPPED_HEADER, str(dropped).encode()))
    return producer_id, headers


@dataclass
class MetadataWatch:
    """What the last metadata answer of one client said about the cluster."""

    cluster_id: str | None = None
    """The cluster id the broker answered with (None before the first answer, or from a broker whose
    metadata version carries none). The embedded broker starts a new cluster, with a new id, every
    time it starts, so a changed id means every log this client read is gone."""


def forbid_topic_creation(client: Any) -> MetadataWatch:
    """Make this aiokafka client (`producer.client`, `consumer._client`) ask for metadata without
    creating the topics it names, and return the `MetadataWatch` its answers update from now on.

    aiokafka 0.14 builds its metadata requests as `MetadataRequest(topics)`, whose version 4 and
    later default `allow_auto_topic_creation` to True, and offers no option to change it. A client
    would then create the topic with the broker's default partition count whenever it is missing
    (the embedded broker after an empty restart, before anyone recreated it with the known count),
    and keys would land on partitions nobody reads. This replaces the one method that builds the
    request, on this client only (other clients in the process keep aiokafka's behaviour); the body
    is aiokafka's own `_metadata_update` with the flag turned off. Revisit when aiokafka is upgraded
    (pinned <0.15)."""
    watch = MetadataWatch()
    client._metadata_update = MethodType(_metadata_update_factory(watch), client)
    return watch


def _metadata_update_factory(watch: MetadataWatch) -> Any:
    from aiokafka.client import ConnectionGroup
    from aiokafka.errors import KafkaError
    from aiokafka.protocol.metadata import MetadataRequest

    async def _metadata_update(self: Any, cluster_metadata: Any, topics: Any) -> bool:
        metadata_request = MetadataRequest(list(topics) if topics else None, allow_auto_topic_creation=False)
        nodeids: list[Any] = [b.nodeId for b in self.cluster.brokers()]
        bootstrap_id = ("bootstrap", ConnectionGroup.DEFAULT)
        if bootstrap_id in self._conns:
            nodeids.append("bootstrap")
        random.shuffle(nodeids)
        for node_id in nodeids:
            conn = await self._get_conn(node_id)
            if conn is None:
                continue
            try:
                metadata = await conn.send(metadata_request)
            except (KafkaError, TimeoutError) as err:
                log.debug("metadata request to node %s failed: %r", node_id, err)
                continue
            if not metadata.brokers:
                return False
            cluster_metadata.update_metadata(metadata)
            watch.cluster_id = getattr(metadata, "cluster_id", None) or watch.cluster_id
            if bootstrap_id in self._conns and len(self.cluster.brokers()):
                self._conns.pop(bootstrap_id).close()
            break
        else:
            log.debug("no broker answered a metadata request (%s)", nodeids)
            cluster_metadata.failed_update(None)
            return False
        return True

    return _metadata_update


class KafkaSink:
    """Sends events to `topic` on `bootstrap_servers`, spooling them on disk until delivered.

    - `spool_dir`: where undelivered events wait (default: `default_spool_dir(...)`); one sink at a
      time per directory (a lock file; a second one raises `SpoolLocked`). Events a previous sink
      left there are sent first, at once (the sender starts with the sink when the spool holds
      any). After a `close` that timed out, the sender may hold the directory until it ends the
      step it was in (bounded by `connect_timeout_s`).
    - `confirm_group`: the consumer group that stores the events (the materializer's, by default
      "callgate-materializer"). When set, an event leaves the spool only once that group has
      committed an offset past it, not when the broker acknowledged it; `flush` then waits for the
      group too. Use it with brokers that may lose acknowledged records (the embedded broker's
      memory storage, a single unreplicated Kafka broker); with replicated Apache Kafka
      (`acks=all`, `min.insync.replicas` >= 2) the broker's acknowledgement is enough. The spool
      is then the bound on what may wait for the group: a group that stops committing fills it,
      and `when_full` decides (by default new calls are blocked: "audit unavailable").
    - `confirm_interval_s`: how often the group's committed offsets are read.
    - `partitions` / `replication_factor`: used when the topic has to be created.
    - `spool_max_bytes` and `when_full` ("block" or "drop_oldest"): see the module docstring.
    - `max_queue`: events held in memory before the spool takes them; past it `emit` drops and
      counts (the producer's chain shows the gap), never blocks.
    - `max_backlog`: undelivered events (with `confirm_group`: unconfirmed) past which, or past
      half the spool, the sink is `congested` while deliveries still progress: the gate then holds
      each new call back (up to a second) until the backlog is under the mark, so a store slower
      than the agents slows the agents instead of letting the lag grow. A stalled delivery (nothing
      left the spool for `STALLED_AFTER_S`: broker or group away) holds nothing back: the spool
      absorbs it up to its bound. None: never congested.
    - `max_event_bytes`: the largest record sent; the gate cuts event arguments so events fit, and
      a record that is still too large is written to `oversize.jsonl` in the spool directory,
      counted in `oversize`, and never blocks the records behind it.
    - `producer_options` go to `aiokafka.AIOKafkaProducer` (e.g. `security_protocol`).

    `emit` is safe from any thread, never blocks and never raises. `flush` and `close` are async
    and return within their timeout whatever the broker does.
    """

    role: ClassVar[SinkRole] = "audit"

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str = DEFAULT_TOPIC,
        spool_dir: str | os.PathLike[str] | None = None,
        *,
        confirm_group: str | None = None,
        confirm_interval_s: float = 0.2,
        partitions: int = DEFAULT_PARTITIONS,
        replication_factor: int = 1,
        when_full: WhenFull = "block",
        spool_max_bytes: int = 256 * 2**20,
        max_queue: int = 100_000,
        max_backlog: int | None = 6_000,
        max_event_bytes: int = 900_000,
        linger_ms: int = 5,
        batch_records: int = 2000,
        connect_timeout_s: float = 5.0,
        **producer_options: Any,
    ) -> None:
        if when_full not in ("block", "drop_oldest"):
            raise ValueError(f"when_full must be 'block' or 'drop_oldest', got {when_full!r}")
        if confirm_group is not None and not confirm_group:
            raise ValueError("confirm_group must name a consumer group (or be None)")
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.confirm_group = confirm_group
        self.confirm_interval_s = confirm_interval_s
        self.partitions = partitions
        self.replication_factor = replication_factor
        self.when_full: WhenFull = when_full
        self.max_queue = max_queue
        self.max_backlog = max_backlog
        self.max_event_bytes = max_event_bytes
        self.linger_s = linger_ms / 1000.0
        self.batch_records = batch_records
        self.connect_timeout_s = connect_timeout_s
        self.producer_options = producer_options
        self.spool_dir = Path(spool_dir) if spool_dir is not None else default_spool_dir(bootstrap_servers, topic)
        self.spool_dir.mkdir(parents=True, exist_ok=True)
        # Space comes back a whole segment at a time: small segments keep drop_oldest's losses small.
        segment_bytes = max(4096, min(16 * 2**20, spool_max_bytes // 64))
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
        # Why the last spool write failed (None once one succeeds); set by the sender thread.
        self._spool_error: str | None = None
        self._was_available = True
        self._down_since = 0.0
        self._connected = False
        self._oversize_file: IO[bytes] | None = None
        self._unreported_drops = 0
        # Held while events move from the queue to the spool, so `pending` never counts one twice.
        self._moving = threading.Lock()
        # The sender thread's own state (only that thread touches it).
        self._pins: dict[bytes, int] = {}
        self._sent_upto: tuple[int, int] | None = None
        self._awaiting: dict[int, collections.deque[tuple[int, tuple[int, int]]]] = {}
        self._last_offset: dict[int, int] = {}
        self._committed: dict[int, int] = {}
        self._next_confirm = 0.0
        self._known_cluster: str | None = None
        # A sink starts (and reconnects) as if it had just delivered: pacing holds from the first
        # call, before the first confirmation, and only a real stall switches it off.
        self._progress_at = time.monotonic()

        self.dropped = 0
        """Events lost on purpose: the memory queue was full, or `drop_oldest` made room."""
        self.sent = 0
        """Records the broker acknowledged (to a partition its metadata lists)."""
        self.confirmed = 0
        """With `confirm_group`: records the group committed past (and so released from the spool)."""
        self.resent = 0
        """Times everything unconfirmed was sent again (a new broker, a recreated topic or log)."""
        self.send_failures = 0
        """Sends that failed (their records stayed spooled and were retried)."""
        self.oversize = 0
        """Records too large to send, kept in `oversize.jsonl` instead."""
        self.lost_in_crash = 0
        """Events a previous process over this spool was handed and died with (reported at start)."""
        self.last_error: str | None = None
        """The last connection or send error since the last successful connect, for operators."""

        # What a previous process over this spool took with it when it died is reported first.
        self._marks = Watermarks(self.spool_dir / "watermarks")
        self._report_losses()

        # A normal interpreter exit without close() still moves queued events into the spool.
        atexit.register(_spool_on_exit, weakref.ref(self))
        # What a previous sink left here (and any loss report) goes out without waiting for a call.
        if self._spool.pending:
            self._start()

    # -- the sink interface ---------------------------------------------------------------------

    @property
    def name(self) -> str:
        """How logs and reasons name the sink: `KafkaSink(<topic> on <bootstrap servers>)`."""
        return f"KafkaSink({self.topic} on {self.bootstrap_servers})"

    @property
    def available(self) -> bool:
        """False while the sink cannot take events: the spool cannot be written, the memory queue
        is full, the sink is closed, or the spool is full, `when_full="block"` and nothing leaves
        it (the broker or, with `confirm_group`, the group is away): the gate then refuses new
        calls. A full spool that is draining stays available and `congested`: the gate paces
        calls instead. Read before every call: no lock, no I/O."""
        if self._spool_error is not None or self._closed or len(self._queue) >= self.max_queue:
            return False
        if not (self._spool_full and self.when_full == "block"):
            return True
        return self.max_backlog is not None and time.monotonic() - self._progress_at < STALLED_AFTER_S

    @property
    def unavailable_reason(self) -> str | None:
        """Why the sink is not `available` (None while it is), naming it and the spool."""
        if self.available:
            return None
        spool_error = self._spool_error
        if spool_error is not None:
            return f"{self.name}: {spool_error}"
        if self._closed:
            return f"{self.name}: closed"
        if len(self._queue) >= self.max_queue:
            return f"{self.name}: memory queue full ({self.max_queue} events); dropping new events"
        stalled = time.monotonic() - self._progress_at
        why = f" ({self.last_error})" if self.last_error else ""
        return (
            f"{self.name}: spool full ({self._spool.size_hint} of {self._spool.max_bytes} bytes in "
            f"{self.spool_dir}); nothing delivered for {stalled:.0f} s{why}"
        )

    @property
    def connected(self) -> bool:
        """True while a producer is connected to the broker."""
        return self._connected

    @property
    def pending(self) -> int:
        """Events not yet delivered (queued in memory or spooled; with `confirm_group`, not yet
        confirmed by the group)."""
        with self._moving:
            return len(self._queue) + self._spool.pending

    @property
    def congested(self) -> bool:
        """True while more than `max_backlog` events wait for delivery, or the spool is more than
        half full, and events left the spool (acknowledged, or with `confirm_group` confirmed)
        within `STALLED_AFTER_S`. Read before every call: no lock, no I/O."""
        limit, spool = self.max_backlog, self._spool
        if limit is None:
            return False
        if (
            len(self._queue) + spool.pending_hint <= limit
            and spool.size_hint * 2 <= spool.max_bytes
            and not self._spool_full
        ):
            return False
        return time.monotonic() - self._progress_at < STALLED_AFTER_S

    @property
    def awaiting_confirmation(self) -> int:
        """With `confirm_group`: records the broker acknowledged that the group has not committed."""
        return sum(len(records) for records in list(self._awaiting.values()))

    def emit(self, event: EventBase) -> None:
        """Queue the event for the sender thread. Never blocks, never raises; drops and counts only
        when the memory queue is full or the sink is closed."""
        self._marks.emitted(event)
        if self._closed or len(self._queue) >= self.max_queue:
            self._count_drop("sink is closed" if self._closed else "memory queue is full")
            return
        self._queue.append(event)
        if self._thread is None:
            self._start()

    async def flush(self, timeout: float | None = 30.0) -> bool:
        """Wait until the queue and the spool are empty (every event delivered; with
        `confirm_group`, confirmed by the group) or `timeout` passes. Returns True when everything
        was delivered, False on timeout (the events stay spooled)."""
        if self._thread is None and not self._spool.pending and not self._queue:
            return True
        if self._thread is None:
            self._start()
        return await asyncio.get_running_loop().run_in_executor(None, self._wait_drained, timeout)

    async def close(self, timeout: float | None = 30.0) -> bool:
        """Flush (up to `timeout`), then stop the sender and close the spool, all within `timeout`.
        What was not delivered stays in the spool for the next sink over the same directory, events
        still in memory included (written past the spool's bound if it is full). Idempotent.
        Returns whether everything was delivered."""
        if self._closed:
            return self.pending == 0
        deadline = None if timeout is None else time.monotonic() + timeout
        # Part of the time is kept for the sender to stop and spool what memory still holds.
        delivered = await self.flush(None if timeout is None else max(0.0, timeout - min(1.0, timeout / 4)))
        self._closed = True
        # The sender stops sending at once; what it holds in memory it still tries to spool.
        self._stop.set()
        with self._progress:
            self._progress.notify_all()
        thread = self._thread
        if thread is not None:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            await asyncio.get_running_loop().run_in_executor(None, thread.join, left)
            if thread.is_alive():
                log.error(
                    "KafkaSink: the sender did not stop within the close timeout; %d events were still in memory",
                    len(self._queue),
                )
        else:
            self._spool.close()
        self._release()
        if not delivered:
            log.warning(
                "KafkaSink closed with %d events undelivered; they stay in %s for the next sink there",
                self._spool.pending_hint + len(self._queue),
                self.spool_dir,
            )
        return delivered

    # -- internals ------------------------------------------------------------------------------

    def _report_losses(self) -> None:
        """Spool a `LossReport` for every producer whose events the previous sink here was handed
        but never spooled; then start the watermarks afresh."""
        reports = [
            LossReport(
                report_id=os.urandom(16).hex(),
                producer_id=producer_id,
                gate=gate,
                first_seq=spooled + 1,
                last_seq=emitted,
                spool=str(self.spool_dir),
            )
            for producer_id, gate, emitted, spooled in self._marks.left_behind
        ]
        if reports:
            records = []
            for report in reports:
                log.error("KafkaSink: producer %s (gate %s): %s", report.producer_id, report.gate, report.detail())
                when = report.time.isoformat().replace("+00:00", "Z")
                parts = (report.producer_id, report.report_id, LOSS_REPORT_TYPE, when, report.gate)
                records.append((_SEP.join(part.encode() for part in parts), encode_loss_report(report)))
            self._spool.append(records, past_limit=True)
            self.lost_in_crash = sum(r.last_seq - r.first_seq + 1 for r in reports)
        self._marks.reset()

    def _release(self) -> None:
        if self._oversize_file is not None:
            self._oversize_file.close()
            self._oversize_file = None

    def _count_drop(self, why: str, n: int = 1) -> None:
        before = self.dropped
        self.dropped += n
        if before == 0 or before // 1000 != self.dropped // 1000:
            log.warning("KafkaSink dropped %d event(s) (%s); %d dropped so far", n, why, self.dropped)

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
            try:
                # The process may be ending: what memory holds goes to disk even past the
                # spool's bound (at most max_queue events), rather than being lost.
                self._spool_queue(past_limit=True)
            except Exception:
                log.exception("KafkaSink: cannot spool the events left in memory")
            if self._queue:
                self._count_drop("the spool could not be written at close", len(self._queue))
                self._queue.clear()
            self._spool.close()
            self._notify()

    def _spool_queue(self, *, past_limit: bool = False) -> int:
        """Move every queued event into the spool, as far as it has room (or all of them, with
        `past_limit`). Returns how many moved."""
        moved = 0
        while self._queue:
            step = self._spool_batch(past_limit=past_limit)
            if step == 0:
                break
            moved += step
        return moved

    def _spool_batch(self, *, past_limit: bool = False) -> int:
        """Move one batch of queued events into the spool (one fsync), split to the room the spool
        has. Returns how many moved; 0 when the queue is empty or the spool has no room."""
        if not self._queue:
            return 0
        with self._moving:
            # Taken under the lock: the exit hook may spool beside the sender thread. Copied by
            # index, not iterated: emit appends from other threads, and an iterator over a deque
            # that grew raises (the GIL can pass while the copy runs, e.g. to a finalizer the
            # garbage collector calls). Only this lock's holder removes from the left, so the
            # first `count` items stay where they are while others append.
            count = min(len(self._queue), self.batch_records)
            batch = [self._queue[index] for index in range(count)]
            records = [(_spool_key(event), encode_event(event)) for event in batch]
            if past_limit:
                self._spool.append(records, past_limit=True)
                self._marks.spooled(batch)
                for _ in records:
                    self._queue.popleft()
                return len(records)
            fits = self._fitting(records)
            while fits == 0 and self.when_full == "drop_oldest" and self._spool.pending:
                dropped = self._spool.drop_oldest(1)
                self.dropped += dropped
                log.warning("KafkaSink spool full: dropped the %d oldest events", dropped)
                fits = self._fitting(records)
            if fits == 0:
                # Fail closed: the events wait in memory, the gate refuses new calls; the flag
                # clears at the first append that finds room.
                self._spool_full = True
                return 0
            try:
                self._spool.append(records[:fits])
            except SpoolFull:
                self._spool_full = True
                return 0
            self._marks.spooled(batch[:fits])
            self._spool_full = False
            for _ in range(fits):
                self._queue.popleft()
        return fits

    def _fitting(self, records: list[tuple[bytes, bytes]]) -> int:
        """How many of `records`, from the first, the spool takes now (an empty spool takes one
        record of any size)."""
        size = self._spool.size_bytes
        room = self._spool.max_bytes - size
        n = 0
        for key, value in records:
            room -= HEADER_SIZE + len(key) + len(value)
            if room < 0:
                break
            n += 1
        return 1 if n == 0 and size == 0 and records else n

    async def _run(self) -> None:
        # Two loops in this thread: the spooler moves one batch at a time from memory to disk
        # while the sender's requests are on the wire, so a sustained load starves neither.
        sender = asyncio.create_task(self._send_loop())
        try:
            pause = self.linger_s
            while True:
                try:
                    moved = self._spool_batch()
                    pause = self.linger_s
                    if moved and self._spool_error is not None:
                        self._spool_error = None
                except Exception as exc:
                    # A disk that refuses (full, read-only): the events wait in memory, the sink is
                    # unavailable (logged once, below) and the write is tried again.
                    what = str(exc) if isinstance(exc, OSError) and exc.errno else f"{type(exc).__name__}: {exc}"
                    self._spool_error = f"spool write failed in {self.spool_dir}: {what}"
                    log.debug("KafkaSink: cannot write the spool", exc_info=True)
                    moved, pause = 0, min(pause * 2, 1.0)
                self._watch_availability()
                if moved:
                    self._notify()
                if self._stop.is_set() and (not self._queue or not moved):
                    return
                if sender.done():
                    sender.result()  # re-raises what stopped it
                # A full batch: more are waiting, go on at once; else let events gather for one
                # linger (one fsync per batch, not per event).
                await asyncio.sleep(0 if moved >= self.batch_records else pause)
        finally:
            # The sender ends its current step (each is bounded by connect_timeout_s) and stops.
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(sender), 2 * self.connect_timeout_s)
            if not sender.done():
                sender.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sender

    def _watch_availability(self) -> None:
        """Log each change of `available` once (the spooler's loop calls it every pass)."""
        now = self.available
        if now == self._was_available or self._closed:
            return
        self._was_available = now
        if not now:
            self._down_since = time.monotonic()
            log.warning("%s", self.unavailable_reason or f"{self.name} cannot take events")
        else:
            log.warning("%s takes events again after %.1f s", self.name, time.monotonic() - self._down_since)

    async def _send_loop(self) -> None:
        link: _Link | None = None
        backoff = 0.1
        next_attempt = 0.0
        try:
            while not self._stop.is_set():
                progressed = False
                if self._spool.pending:
                    if link is None and time.monotonic() >= next_attempt:
                        link = await self._connect()
                        if link is None:
                            next_attempt = time.monotonic() + backoff
                            backoff = min(backoff * 2, 2.0)
                        else:
                            backoff = 0.1
                    if link is not None:
                        try:
                            ok, moved = await self._send_batch(link)
                            if ok and self.confirm_group is not None and time.monotonic() >= self._next_confirm:
                                ok, confirmed = await self._confirm(link)
                                moved += confirmed
                        except Exception as exc:
                            # A bug, or a client error nobody foresaw: the sender must outlive it.
                            # Everything unconfirmed is sent again over a new connection.
                            log.exception("KafkaSink: unexpected error while sending; reconnecting")
                            self._record_failure(exc)
                            self._resend_all("an unexpected error while sending")
                            ok, moved = False, 0
                        progressed = moved > 0
                        if not ok:
                            await self._disconnect(link)
                            link = None
                            next_attempt = time.monotonic() + backoff
                if progressed:
                    self._notify()
                else:
                    await asyncio.sleep(self.linger_s)
        finally:
            if link is not None:
                await self._disconnect(link)

    async def _connect(self) -> _Link | None:
        from aiokafka import AIOKafkaProducer
        from aiokafka.admin import AIOKafkaAdminClient

        options: dict[str, Any] = {
            "acks": "all",
            "enable_idempotence": False,
            "linger_ms": int(self.linger_s * 1000),
            # zstd: about a third of gzip's CPU per event here, and a better ratio.
            "compression_type": "zstd",
            # Record batches up to 256 KiB (aiokafka's default is 16 KiB): a few requests per
            # spool batch instead of hundreds.
            "max_batch_size": 256 * 1024,
            "max_request_size": max(self.max_event_bytes, 256 * 1024) + 4096,
            "request_timeout_ms": int(self.connect_timeout_s * 1000),
            "retry_backoff_ms": 100,
            **self.producer_options,
        }
        producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap_servers, **options)
        forbid_topic_creation(producer.client)
        admin: Any = None
        try:
            await asyncio.wait_for(producer.start(), self.connect_timeout_s)
            await self._ensure_topic()
            if self.confirm_group is not None:
                admin = AIOKafkaAdminClient(
                    bootstrap_servers=self.bootstrap_servers,
                    request_timeout_ms=int(self.connect_timeout_s * 1000),
                    **_client_options(self.producer_options),
                )
                await asyncio.wait_for(admin.start(), self.connect_timeout_s)
            link = _Link(producer, admin)
            described = await self._describe(link)
            if described is None:
                raise ConnectionError(f"no metadata for topic {self.topic}")
            link.cluster_id = described[0]
        except BaseException as exc:
            # Cancelled too (a close that could not wait): the half-open clients are closed.
            self.last_error = f"connect: {type(exc).__name__}: {exc}"
            log.debug("KafkaSink cannot reach %s: %s", self.bootstrap_servers, self.last_error)
            with contextlib.suppress(Exception):
                await producer.stop()
            if admin is not None:
                with contextlib.suppress(Exception):
                    await admin.close()
            self._connected = False
            if not isinstance(exc, Exception):
                raise
            return None
        if self._known_cluster is not None and link.cluster_id != self._known_cluster:
            self._resend_all(f"the broker is a new cluster ({link.cluster_id}, was {self._known_cluster})")
        self._known_cluster = link.cluster_id
        self._connected = True
        self.last_error = None
        self._progress_at = time.monotonic()
        return link

    async def _ensure_topic(self) -> int:
        return await ensure_topic(
            self.bootstrap_servers,
            self.topic,
            self.partitions,
            replication_factor=self.replication_factor,
            timeout_s=self.connect_timeout_s,
            **_client_options(self.producer_options),
        )

    async def _describe(self, link: _Link) -> tuple[str, frozenset[int]] | None:
        """(cluster id, partitions the broker lists for the topic), read from the broker now;
        empty partitions when the topic is missing; None when the broker did not answer."""
        from aiokafka.protocol.metadata import MetadataRequest

        client = link.producer.client
        try:
            node = client.get_random_node()
            response = await asyncio.wait_for(
                client.send(node, MetadataRequest([self.topic], allow_auto_topic_creation=False)),
                self.connect_timeout_s,
            )
        except Exception as exc:
            self._record_failure(exc)
            return None
        answer = response.to_object()
        listed: frozenset[int] = frozenset()
        for entry in answer.get("topics", ()):
            if entry["topic"] == self.topic and not entry["error_code"]:
                listed = frozenset(part["partition"] for part in entry["partitions"])
        return str(answer.get("cluster_id") or ""), listed

    async def _disconnect(self, link: _Link) -> None:
        self._connected = False
        with contextlib.suppress(Exception):
            await asyncio.wait_for(link.producer.stop(), self.connect_timeout_s)
        if link.admin is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(link.admin.close(), self.connect_timeout_s)

    def _resend_all(self, why: str) -> None:
        """Forget what was sent and not confirmed: it is all sent again (the store drops repeats)."""
        unconfirmed = self.awaiting_confirmation
        self._awaiting.clear()
        self._last_offset.clear()
        self._committed.clear()
        self._sent_upto = None
        if self.confirm_group is not None:
            self.resent += 1
            log.warning("KafkaSink: %s; sending again the %d events the group has not confirmed", why, unconfirmed)

    def _partition(self, key: bytes, listed: frozenset[int]) -> int:
        """The producer's pinned partition: where its chain went first, while the broker lists it."""
        pinned = self._pins.get(key)
        if pinned is not None and pinned in listed:
            return pinned
        chosen: int
        from aiokafka.partitioner import murmur2

        ordered = sorted(listed)
        chosen = ordered[(murmur2(key) & 0x7FFFFFFF) % len(ordered)]
        if pinned is not None:
            log.warning(
                "KafkaSink: partition %d of %s is gone; producer %s continues on partition %d",
                pinned,
                self.topic,
                key.decode(errors="replace"),
                chosen,
            )
        self._pins[key] = chosen
        return chosen

    async def _send_batch(self, link: _Link) -> tuple[bool, int]:
        """Send the next spooled records; those the broker took to a listed partition are delivered
        (acked now, or awaiting the group's confirmation). (healthy, records delivered)."""
        confirm = self.confirm_group is not None
        records = self._spool.peek(self.batch_records, max_bytes=16 * 2**20, after=self._sent_upto if confirm else None)
        if not records:
            return True, 0
        if not link.listed:
            described = await self._describe(link)
            if described is None:
                return False, 0
            if not await self._check_broker(link, described):
                return True, 0
        # Drops are reported on the first record of the next batch the broker acknowledges.
        self._unreported_drops += self._spool.take_dropped()
        report = self._unreported_drops
        carrier: SpoolRecord | None = None
        # One record batch per partition at a time: far cheaper per record than one send each.
        # A batch's records get consecutive offsets from the one the broker answers for it.
        producer = link.producer
        open_batches: dict[int, tuple[Any, list[SpoolRecord]]] = {}
        sent_batches: list[tuple[int, list[SpoolRecord], Any]] = []
        sendable: list[SpoolRecord] = []

        async def submit(partition: int) -> None:
            batch, members = open_batches.pop(partition)
            sent_batches.append((partition, members, await producer.send_batch(batch, self.topic, partition=partition)))

        try:
            for record in records:
                if len(record.value) > self.max_event_bytes:
                    self._keep_oversize(record)
                    continue
                key, headers = _headers(record.key, report if carrier is None else 0)
                if carrier is None:
                    carrier = record
                partition = self._partition(key, link.listed)
                if partition not in open_batches:
                    open_batches[partition] = (producer.create_batch(), [])
                batch, members = open_batches[partition]
                if batch.append(timestamp=None, key=key, value=record.value, headers=headers) is None:
                    await submit(partition)
                    open_batches[partition] = (producer.create_batch(), [])
                    batch, members = open_batches[partition]
                    if batch.append(timestamp=None, key=key, value=record.value, headers=headers) is None:
                        raise ValueError(f"a record of {len(record.value)} bytes does not fit a batch")
                members.append(record)
                sendable.append(record)
            for partition in list(open_batches):
                await submit(partition)
        except Exception as exc:
            self._record_failure(exc)
            sent = {id(record) for _, members, _ in sent_batches for record in members}
            sendable = [record for record in sendable if id(record) in sent]
        answers = await asyncio.gather(*(future for _, _, future in sent_batches), return_exceptions=True)
        results: list[_Ack | BaseException] = []
        for (_, members, _), answer in zip(sent_batches, answers, strict=True):
            for index in range(len(members)):
                results.append(
                    answer if isinstance(answer, BaseException) else _Ack(answer.partition, answer.offset + index)
                )
        sendable = [record for _, members, _ in sent_batches for record in members]
        oversize = [record.position for record in records if len(record.value) > self.max_event_bytes]
        described = await self._describe(link)
        if described is None:
            return False, 0
        if not await self._check_broker(link, described):
            # A new broker or a vanished topic: nothing of this batch counts; everything
            # unconfirmed is sent again to the topic as it is now.
            return True, 0
        delivered: list[tuple[SpoolRecord, _Ack]] = []
        ghosts = 0
        failures: list[BaseException] = []
        for record, result in zip(sendable, results, strict=False):
            if isinstance(result, BaseException):
                failures.append(result)
            elif result.partition not in link.listed:
                ghosts += 1
            else:
                delivered.append((record, result))
        if ghosts:
            log.warning(
                "KafkaSink: the broker acknowledged %d records to partitions of %s it does not list; resending",
                ghosts,
                self.topic,
            )
            with contextlib.suppress(Exception):
                await link.producer.client.force_metadata_update()
        if carrier is not None and any(record is carrier for record, _ in delivered):
            self._unreported_drops -= report
        self.sent += len(delivered)
        if confirm:
            contiguous = not failures and not ghosts and len(sendable) + len(oversize) == len(records)
            if not self._await_confirmation(delivered):
                return True, 0
            if oversize:
                self._spool.ack(oversize)
            if contiguous:
                self._sent_upto = records[-1].position
            else:
                # Something of this batch did not arrive: send again from the oldest unconfirmed.
                self._resend_all("a send failed")
        elif delivered or oversize:
            self._spool.ack([*(record.position for record, _ in delivered), *oversize])
            self._progress_at = time.monotonic()
        if failures or len(sendable) + len(oversize) < len(records):
            for failure in failures[:1]:
                self._record_failure(failure)
            return False, len(delivered)
        return True, len(delivered) if not confirm else len(delivered) + len(oversize)

    async def _check_broker(self, link: _Link, described: tuple[str, frozenset[int]]) -> bool:
        """Compare what the broker says now with what this link knew; False (after arranging a
        resend) when the broker is a new cluster or the topic is gone."""
        cluster_id, listed = described
        if link.cluster_id and cluster_id != link.cluster_id:
            self._resend_all(f"the broker is a new cluster ({cluster_id}, was {link.cluster_id})")
            link.cluster_id = self._known_cluster = cluster_id
            link.listed = frozenset()
            return False
        if not listed:
            # The broker answered, but the topic is gone (a broker that restarted empty, or a topic
            # deleted by hand): some brokers acknowledge writes to a missing topic without storing
            # them. Recreate it with the known partition count and send again.
            log.warning(
                "KafkaSink: topic %s vanished from %s; recreating it and resending", self.topic, self.bootstrap_servers
            )
            self._resend_all(f"topic {self.topic} vanished")
            link.listed = frozenset()
            with contextlib.suppress(Exception):
                await self._ensure_topic()
                await link.producer.client.force_metadata_update()
            return False
        if listed != link.listed:
            if link.listed:
                log.warning("KafkaSink: topic %s now lists partitions %s", self.topic, sorted(listed))
            link.listed = listed
            with contextlib.suppress(Exception):
                await link.producer.client.force_metadata_update()
        return True

    def _await_confirmation(self, delivered: list[tuple[SpoolRecord, _Ack]]) -> bool:
        """Queue delivered records for the group's confirmation; False (after arranging a resend)
        when an offset went backwards: the partition's log was recreated under us."""
        for record, metadata in delivered:
            partition, offset = metadata.partition, metadata.offset
            if offset <= self._last_offset.get(partition, -1):
                self._resend_all(f"partition {partition} of {self.topic} started again at offset {offset}")
                return False
            self._last_offset[partition] = offset
            self._awaiting.setdefault(partition, collections.deque()).append((offset, record.position))
        return True

    async def _confirm(self, link: _Link) -> tuple[bool, int]:
        """Release the records the group committed past. (healthy, records released)."""
        from aiokafka.structs import TopicPartition

        self._next_confirm = time.monotonic() + self.confirm_interval_s
        if not self._awaiting or link.admin is None:
            return True, 0
        try:
            committed = await asyncio.wait_for(
                link.admin.list_consumer_group_offsets(
                    self.confirm_group, partitions=[TopicPartition(self.topic, p) for p in sorted(self._awaiting)]
                ),
                self.connect_timeout_s,
            )
        except Exception as exc:
            self._record_failure(exc)
            return False, 0
        # Read after the offsets: if the cluster id is unchanged, the offsets came from this broker.
        described = await self._describe(link)
        if described is None:
            return False, 0
        if not await self._check_broker(link, described):
            return True, 0
        offsets = {tp.partition: meta.offset for tp, meta in committed.items() if tp.topic == self.topic}
        released: list[tuple[int, int]] = []
        for partition, queue in self._awaiting.items():
            offset = offsets.get(partition, -1)
            if offset < self._committed.get(partition, -1):
                self._resend_all(f"the group {self.confirm_group}'s offset on partition {partition} went back")
                return True, 0
            self._committed[partition] = offset
            while queue and queue[0][0] < offset:
                released.append(queue.popleft()[1])
        if released:
            self._spool.ack(released)
            self.confirmed += len(released)
            self._progress_at = time.monotonic()
        return True, len(released)

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


class _Ack(NamedTuple):
    """Where the broker stored one record."""

    partition: int
    offset: int


class _Link:
    """One connection to the broker: the producer, the admin client that reads the group's
    offsets, and what the broker said about itself and the topic."""

    __slots__ = ("admin", "cluster_id", "listed", "producer")

    def __init__(self, producer: Any, admin: Any) -> None:
        self.producer = producer
        self.admin = admin
        self.cluster_id = ""
        self.listed: frozenset[int] = frozenset()


def _client_options(options: dict[str, Any]) -> dict[str, Any]:
    # The admin clients share the producer's connection settings (TLS, SASL), nothing else.
    return {k: v for k, v in options.items() if k.startswith(("security_", "ssl_", "sasl_"))}


def _spool_on_exit(ref: weakref.ReferenceType[KafkaSink]) -> None:
    # Appends are fsynced and the spool locks itself, so this may run beside the sender thread;
    # the spool is left open for it (the process is ending either way).
    sink = ref()
    if sink is None or sink._spool.closed:
        return
    with contextlib.suppress(Exception):
        sink._spool_queue(past_limit=True)


def decode_headers(headers: Sequence[tuple[str, bytes]]) -> dict[str, str]:
    """A record's headers as a dict of text (for consumers and tests)."""
    return {name: value.decode() for name, value in headers}


__all__ = [
    "DEFAULT_PARTITIONS",
    "DEFAULT_TOPIC",
    "DROPPED_HEADER",
    "KafkaSink",
    "MetadataWatch",
    "SpoolLocked",
    "decode_headers",
    "default_spool_dir",
    "ensure_topic",
    "forbid_topic_creation",
]
