"""The materializer: a Kafka consumer that turns decision events into the DuckDB audit store.

Per batch, one DuckDB transaction stores the rows and the partition offsets; the Kafka commit
follows the DuckDB commit. With `assignment="all"`, while one batch's transaction runs in a worker
thread (DuckDB releases the GIL), the loop fetches the next and parses it (`AuditStore.stage`); that
one's transaction starts once the first has committed, so batches are stored in the order they were
read, and at most two are held at a time. With `assignment="group"` each batch is stored and
committed before the next fetch, since a rebalance hands its partitions over at the group's offsets.
The store's offsets are the truth: whenever a partition is (re)assigned it
seeks to them, and a partition the store has never read starts at the beginning, whatever the
consumer group's committed offsets say (records fetched from those before the seek are dropped,
so each record is read once). A crash between the two commits replays at most one batch,
and the `event_id` key drops the duplicates. A log the broker no longer has (it restarted empty, the
topic was recreated, or the record before the stored offset is another one) is read again from its
earliest offset; deduplication absorbs the replay. Undecodable messages become dead letters and
never stop a partition.

Partitions: by default (`assignment="all"`) the materializer reads every partition the broker lists
for the topic, assigning them itself (no group join, so a restart reads again at once), and still
commits its offsets under `group` so that `KafkaSink(confirm_group=...)` sees what is stored. With
`assignment="group"` it joins the group and reads what the group assigns it with a short session:
several materializers of one group write one lake (`consumers.lake`), each batch and its offsets in
one lake transaction, every partition sought to the lake's offsets when it is assigned, and a
materializer that commits late for a partition it lost is refused by the lake (`StoreFencedError`).
Several materializers over one DuckDB file each would split the store: use a lake. Either way its
consumers never create a
topic by asking for it; a continuous run creates the topic with the known partition count when it is
missing at the start, and waits for it when it vanishes later.

`--drain` (what CI runs) reads every partition to its end offset as of the start, records the chain
gaps still open, commits and returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import functools
import gc
import hashlib
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final, Literal

import pyarrow as pa

from consumers.lake import Lake
from consumers.store import ROW_GROUP_ROWS, AuditStore, IngestResult, StagedBatch, StoreFencedError

if TYPE_CHECKING:
    from consumers.api import HealthStatus
    from consumers.auth import Authenticator
    from events.signing import SigningKey, VerifyingKey

log = logging.getLogger("callgate.materializer")

Assignment = Literal["all", "group"]
"""How the materializer gets its partitions: "all" reads every partition the broker lists (assigned by
the materializer itself); "group" reads what the consumer group assigns it."""

# How long a fetch may wait at the broker for records to arrive. Kafka answers as soon as any do;
# the embedded broker looks again only now and then within the wait: a record sent to a quiet
# partition reached a consumer after 63 ms (median, 200 at most) at aiokafka's 500 ms default,
# after 10 ms (50 at most) at 100 ms. Every stored batch is a round trip of a sink's `confirm_group`,
# so a sink whose spool is small is paced by it. An idle partition costs ten fetches a second.
_CONSUMER_DEFAULTS: dict[str, int] = {"fetch_max_wait_ms": 100}

_GROUP_DEFAULTS: dict[str, int] = {
    # A dead member (a SIGKILLed materializer without static membership) holds its partitions this
    # long; the embedded broker's rejoin after a kill took 18 s with aiokafka's 10 s default.
    "session_timeout_ms": 6000,
    "heartbeat_interval_ms": 1000,
    # How soon a subscribed consumer sees a topic recreated, or grown, after it vanished.
    "metadata_max_age_ms": 5000,
}


# Seconds between two runs of the cyclic collector while the loop runs (see `Materializer.run`).
_GC_INTERVAL_S: Final = 5.0


def _staging_pool() -> pa.MemoryPool:
    """jemalloc's pool where this pyarrow has it (its wheels for Linux do), else the default one."""
    try:
        return pa.jemalloc_memory_pool()
    except NotImplementedError:
        return pa.default_memory_pool()


def _heap_trimmer() -> Any | None:
    """glibc's `malloc_trim`, where the C library has it (None elsewhere: musl, macOS)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        trim = libc.malloc_trim
    except (OSError, AttributeError, TypeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_MALLOC_TRIM: Final = _heap_trimmer()


def _ingest_and_release(store: AuditStore, staged: StagedBatch, offsets: Mapping[tuple[str, int], int]) -> IngestResult:
    """`store.ingest_staged`, then the C heap's free pages given back to the system (the write's worker
    thread; ctypes releases the GIL meanwhile).

    A batch's record values (about 1.2 kB each, some 12 MB a batch) come from the C allocator, not
    Python's, and so do DuckDB's buffers for its statements; glibc keeps what they freed in its arenas,
    one per thread that allocated, and gives back only what lies at the top of a heap. Those arenas
    grew with the length of a drain: peak RSS 1.09 to 1.17 times as much at 200,000 events as at
    50,000, against 1.02 to 1.09 with a trim after every batch (three drains each)."""
    result = store.ingest_staged(staged, offsets)
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)
    return result


def default_instance_id(db_path: str) -> str:
    """A static group member id for a materializer writing `db_path`: stable for one store on one
    host (so a restarted materializer takes its own place in the group), different for two stores.
    Never raises."""
    real = os.path.realpath(db_path)
    digest = hashlib.sha256(f"{socket.gethostname()}\0{real}".encode()).hexdigest()[:16]
    return f"callgate-materializer-{digest}"


@dataclass
class RunSummary:
    """What one run of the materializer did."""

    batches: int = 0
    records: int = 0
    stored: int = 0
    duplicates: int = 0
    dead_letters: int = 0
    chain_breaks: int = 0
    gaps_recorded: int = 0
    checkpoint_breaks: int = 0
    """Chain breaks found by the checkpoint checks at the end of a drain or periodically (`truncated`,
    and with `require_signed` also `unsigned`, `uncovered`, `silent`); those found after a batch count
    in `chain_breaks`."""
    partitions: list[int] = field(default_factory=list)
    ingest_seconds: float = 0.0
    """From the first batch received to the end of the run (group join excluded)."""
    ingest_cpu_seconds: float = 0.0
    """The CPU time the process spent over the same span, all its threads together (the loop's, the
    staging's, DuckDB's): above `ingest_seconds` when they ran on several cores at once."""


@dataclass
class _Partition:
    """What the materializer last knew of one partition the broker lists."""

    owned: bool = False
    position: int | None = None
    high_watermark: int | None = None
    read_up_to: int | None = None
    """Owned: the position; not owned: the group's committed offset (group mode) or the store's."""
    unread_since: float | None = None
    """Monotonic time since which nobody has read this partition (None: it is being read)."""
    stalled_since: float | None = None
    """Monotonic time since which `read_up_to` has not moved although records wait (None: moving)."""


@dataclass
class _Write:
    """A batch whose DuckDB transaction runs in a worker thread while the loop fetches and stages the
    next one; its Kafka commit waits for it (`Materializer._settle`)."""

    done: asyncio.Future[IngestResult]
    records: int
    offsets: dict[tuple[str, int], int]
    fetched_from: Any
    started: float


@dataclass
class _State:
    started_at: float = field(default_factory=time.monotonic)
    error: str | None = None
    topic_listed: bool | None = None
    topic_missing_since: float | None = None
    broker_error: str | None = None
    broker_error_since: float | None = None
    partitions: dict[int, _Partition] = field(default_factory=dict)
    cluster_id: str | None = None
    """The cluster id the current assignment was made against."""
    """Own takes not confirmed by the previous owner: (partition, start offset, previous owner, age s)."""
    log_lost: bool = False
    """The topic vanished (or the cluster changed) since the last assignment: every stored offset
    points into a log that is gone."""
    fenced: int = 0
    """Batches the lake refused because another materializer had stored their partitions first."""
    assigned_at: float | None = None
    """Group mode: when the group last assigned this member its partitions (none included)."""
    reassign_asked_at: float | None = None
    """Group mode: when this member, assigned nothing, last joined the group again to be assigned."""


class Materializer:
    """Consumes `topic` on `bootstrap` into the store at `db_path`.

    - `group`: the consumer group its offsets are committed to after every stored batch (the sink's
      `confirm_group` reads them); they are advisory for reading, the store's are the truth.
    - `assignment`: "all" (default) reads every listed partition, assigned by the materializer itself;
      "group" joins `group` and reads what it assigns, with a 6 s session unless `consumer_options`
      say otherwise; as static member `instance_id` when one is given (see `default_instance_id`).
    - `partitions`: the count a continuous run creates the topic with when it is missing at the start
      (default `events.kafka.DEFAULT_PARTITIONS`); a drain never creates it.
    - `api`: ("host", port) to serve `/healthz`, `/metrics` and `/v1/queries/...` while running;
      `api_auth` (a `consumers.auth.Authenticator`) makes it ask for bearer tokens (None: none),
      `metrics_open` serves `/metrics` without one, `api_tls` (certificate file, key file) serves
      HTTPS. Every named query it answers is recorded in the store's `access_log`.
    - `decisions_topic`: with `api`, reviewers decide approval requests through it (`POST
      /v1/approvals/{id}`, `consumers.approvals`); each decision is published to `topic` and to
      this topic, which the waiting gates read (None: no write route), signed with `decision_key`
      (an `events.signing.SigningKey`; None: unsigned); gates claim approvals through it (`POST
      /v1/approvals/{id}/claim`), recorded in the store's `approval_claims`.
    - `decision_keys` (key id -> `events.signing.VerifyingKey`; by default `decision_key`'s public
      half): the desk's keys. An `ApprovalResolved` none of them signed is stored flagged
      (`consumers.store.UNVERIFIED_DECISION`) and decides its request only when the gate that asked
      wrote it; another (a decision forged onto the events topic) leaves the request pending and is
      listed by the `unverified_decisions` query. None without `decision_key`, or an empty mapping:
      not checked.
    - `gap_grace_s`: in a continuous run, a chain gap is recorded once it has stayed open this long.
    - `trusted_keys` (key id -> `events.signing.VerifyingKey`, as `load_trusted_keys` gives them):
      verify every stored checkpoint (`consumers.checkpoints`); `require_signed` also records the
      producers without a valid checkpoint, events no checkpoint covered in time and silent producers
      (at the end of a drain, and every `min(gap_grace_s, 30)` s of a continuous run).
    - `unread_grace_s`: a listed partition nobody reads (or whose reading does not move), a missing
      topic or an unreachable broker makes `health()` not ok once it has lasted this long, so a
      normal rebalance or a broker restart does not flap it.
    - `metadata_interval_s`: how often the partitions the broker lists are checked.
    - `commit_timeout_s`: how long one commit of offsets to the group may take before the loop goes on
      (the store's offsets stand; the next batch commits again).
    - `consumer_options` go to `aiokafka.AIOKafkaConsumer` (`fetch_max_wait_ms` is 100 unless given).

    Raises `ValueError` for an unknown `assignment`. Opening the store raises `StoreLockedError` before
    anything touches Kafka when another process holds the file. `run` blocks (async) until `stop()`
    or, with `drain=True`, the end of the topic.
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        db_path: str | Lake,
        *,
        group: str = "callgate-materializer",
        assignment: Assignment = "all",
        instance_id: str | None = None,
        partitions: int | None = None,
        api: tuple[str, int] | None = None,
        api_auth: Authenticator | None = None,
        metrics_open: bool = False,
        api_tls: tuple[str, str] | None = None,
        decisions_topic: str | None = None,
        decision_key: SigningKey | None = None,
        decision_keys: Mapping[str, VerifyingKey] | None = None,
        batch_max: int = ROW_GROUP_ROWS,
        poll_ms: int = 500,
        gap_grace_s: float = 60.0,
        trusted_keys: Mapping[str, VerifyingKey] | None = None,
        require_signed: bool = False,
        join_timeout_s: float = 60.0,
        unread_grace_s: float = 10.0,
        metadata_interval_s: float = 1.0,
        commit_timeout_s: float = 5.0,
        **consumer_options: Any,
    ) -> None:
        if assignment not in ("all", "group"):
            raise ValueError(f"assignment must be 'all' or 'group', got {assignment!r}")
        if partitions is not None and partitions < 1:
            raise ValueError(f"partitions must be at least 1, got {partitions}")
        self.bootstrap = bootstrap
        self.topic = topic
        self.db_path = db_path
        self.group = group
        self.assignment: Assignment = assignment
        self.instance_id = instance_id
        self.partitions = partitions
        self.batch_max = batch_max
        self.poll_ms = poll_ms
        self.gap_grace_s = gap_grace_s
        self.join_timeout_s = join_timeout_s
        self.unread_grace_s = unread_grace_s
        self.metadata_interval_s = metadata_interval_s
        self.commit_timeout_s = commit_timeout_s
        self.consumer_options = consumer_options
        if decision_keys is None and decision_key is not None:
            decision_keys = {decision_key.public().key_id: decision_key.public()}
        self.store = AuditStore(
            db_path, trusted_keys=trusted_keys, require_signed=require_signed, decision_keys=decision_keys
        )
        self._kill_after_batch = _fault_kill_between_commits()
        self._stop = asyncio.Event()
        self._state = _State()
        self._watch: Any = None
        self._positioned: set[Any] = set()
        """The assigned partitions `seek_to_store` has positioned since they were (re)assigned. A fetch
        for any other partition started from the group's committed offsets, before that seek: its
        records are dropped, never counted, and read again from the seek position."""
        self._api_address = api
        self._api_auth = api_auth
        self._metrics_open = metrics_open
        self._api_tls = api_tls
        self.decisions_topic = decisions_topic
        self.decision_key = decision_key
        self._publisher: Any = None
        self.api: Any = None
        self.metrics: Any = None

    def stop(self) -> None:
        """Ask the run to finish the batch in hand, commit and return. Safe from a signal handler
        on the event loop's thread."""
        self._stop.set()

    # -- health and the read API -----------------------------------------------------------------

    def health(self) -> HealthStatus:
        """What `/healthz` answers: not ok when the run died, the broker has been unreachable, the topic
        missing, or a listed partition unread (owned by nobody, or not moving with records waiting)
        for longer than `unread_grace_s`; per partition the broker lists: owned by this materializer,
        position, high watermark, lag. Safe from any thread (reads a snapshot); never blocks."""
        from consumers.api import HealthStatus, PartitionHealth

        state, now, grace = self._state, time.monotonic(), self.unread_grace_s
        reports = []
        problems: list[str] = []
        lag_total = 0
        for number, part in sorted(dict(state.partitions).items()):
            lag = None
            if part.high_watermark is not None:
                lag = max(0, part.high_watermark - (part.read_up_to or 0))
                lag_total += lag
            unread_s = 0.0 if part.unread_since is None else now - part.unread_since
            stalled_s = 0.0 if part.stalled_since is None else now - part.stalled_since
            reports.append(
                PartitionHealth(
                    partition=number,
                    owned=part.owned,
                    position=part.position,
                    high_watermark=part.high_watermark,
                    lag=lag,
                    unread_s=round(max(unread_s, stalled_s), 3),
                )
            )
            if unread_s > grace:
                problems.append(
                    f"partition {number} of {self.topic} is read by nobody in group {self.group} "
                    f"for {unread_s:.0f} s ({lag if lag is not None else 'unknown'} records waiting)"
                )
            elif stalled_s > grace:
                problems.append(
                    f"partition {number} of {self.topic}: reading has not moved for {stalled_s:.0f} s "
                    f"with {lag} records waiting"
                )
        if state.error is not None:
            problems.insert(0, f"the consumer loop died: {state.error}")
        if state.broker_error_since is not None and now - state.broker_error_since > grace:
            problems.append(
                f"cannot reach the broker at {self.bootstrap} for {now - state.broker_error_since:.0f} s: "
                f"{state.broker_error}"
            )
        if state.topic_missing_since is not None and now - state.topic_missing_since > grace:
            problems.append(
                f"topic {self.topic} is not on the broker for {now - state.topic_missing_since:.0f} s "
                "(waiting for a producer or `callgate broker` to create it)"
            )
        if state.topic_listed is None and now - state.started_at > grace and state.error is None:
            problems.append(f"no partition list from the broker at {self.bootstrap} yet")
        owned = [r.partition for r in reports if r.owned]
        if problems:
            detail = "; ".join(problems)
        elif owned:
            detail = f"consuming {self.topic} partitions {owned}"
        elif reports:
            detail = f"reading none of {self.topic}'s partitions: the other members of group {self.group} do"
        else:
            detail = "starting"
        metrics = self.metrics
        return HealthStatus(
            ok=not problems,
            detail=detail,
            last_batch_at=None if metrics is None else metrics.last_batch_at,
            last_event_at=None if metrics is None else metrics.last_event_at,
            lag_total=lag_total,
            topic=self.topic,
            partitions=tuple(reports),
        )

    def start_api(self) -> None:
        """Serve the read API at the `api` address given (idempotent); `self.api.url` says where."""
        if self.api is not None:
            return
        from consumers.access_log import StoreAccessLog
        from consumers.api import ApiServer, build_app
        from consumers.metrics import MaterializerMetrics
        from consumers.runner import StoreQueryRunner

        self.metrics = MaterializerMetrics()
        app = build_app(
            StoreQueryRunner(self.store),
            self.metrics,
            self.health,
            auth=self._api_auth,
            access_log=StoreAccessLog(self.store),
            metrics_open=self._metrics_open,
            approvals=self._desk(),
        )
        host, port = self._api_address or ("127.0.0.1", 0)
        cert, key = self._api_tls or (None, None)
        self.api = ApiServer(app, host=host, port=port, ssl_certfile=cert, ssl_keyfile=key)
        self.api.start()

    # -- the loop --------------------------------------------------------------------------------

    async def run(self, *, drain: bool = False) -> RunSummary:
        """Consume until `stop()` (or, with `drain`, the end offsets as of the start)."""
        summary = RunSummary()
        if self._api_address is not None:
            self.start_api()
        if drain:
            if not await _topic_exists(self.bootstrap, self.topic, self.consumer_options):
                # Nothing was ever published: an empty drain, not a consumer left waiting for a join.
                log.warning("topic %s does not exist on %s; nothing to drain", self.topic, self.bootstrap)
                return summary
        else:
            await self._ensure_topic()

        consumer = await self._started_consumer(drain=drain)
        if consumer is None:
            return summary
        store = self.store
        loop = asyncio.get_running_loop()
        # One batch at a time is written (DuckDB releases the GIL), while the loop fetches and stages
        # the next: at most two batches are held, the one being written and the one being staged.
        writing: _Write | None = None
        # The worker thread takes the GIL back at each statement and Arrow scan of its batch; at the
        # default 5 ms switch interval it waits that long behind the thread staging the next batch
        # every time (a drain measured 9,000 events/s at 5 ms, 14,000 at 0.2 ms). Restored at the end.
        switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(min(switch_interval, 0.0002))
        # A batch in hand is some 100,000 young objects (records, parsed events, rows) that all live
        # until it is stored: the cyclic collector, run by allocation counts, scanned them over and
        # over. At a young threshold of 50,000 a 200,000-event drain still spent a fifth of its
        # samples in the collector and ran 12 % slower than without it. Its automatic runs are off
        # while the loop runs; the batches' garbage is freed by reference counting (it is rarely
        # cyclic), and the collector runs every `_GC_INTERVAL_S` for what is. What was there before
        # the loop is frozen out of its scans. Restored at the end.
        gc_enabled = gc.isenabled()
        gc.freeze()
        gc.disable()
        next_collect = time.monotonic() + _GC_INTERVAL_S
        # Arrow's buffers of the staged batches (some 20 MB each) from jemalloc rather than Arrow's
        # default mimalloc, which gave them back to the system and faulted them in again batch after
        # batch: a 200,000-event drain spent 0.85 s in the kernel against 0.5, and peaked 90 MiB higher.
        # Restored at the end.
        memory_pool = pa.default_memory_pool()
        pa.set_memory_pool(_staging_pool())
        try:
            ends: dict[Any, int] | None = None
            first_batch_at: float | None = None
            first_batch_cpu = 0.0
            deadline = time.monotonic() + self.join_timeout_s
            last_gap_check = time.monotonic()
            next_refresh = 0.0
            while not self._stop.is_set():
                if time.monotonic() >= next_collect:
                    gc.collect()
                    next_collect = time.monotonic() + _GC_INTERVAL_S
                if time.monotonic() >= next_refresh and (not drain or ends is None):
                    next_refresh = time.monotonic() + self.metadata_interval_s
                    # A refresh may seek to the store's offsets: they must include the batch in hand.
                    await self._settle(consumer, writing, summary)
                    writing = None
                    consumer = await self._refresh(consumer)
                fetched_from = self._watch.cluster_id
                if consumer.assignment():
                    # With a batch being written, only what is fetched already: when nothing is, the
                    # batch is settled (stored and committed) before the loop waits for more. A sink
                    # with `confirm_group` waits for that commit to free its spool; waiting `poll_ms`
                    # for records first paced a 64 KiB spool to one spoolful (45 events) a second.
                    wait_ms = 0 if writing is not None else self.poll_ms
                    batch = await consumer.getmany(timeout_ms=wait_ms, max_records=self.batch_max)
                else:
                    # getmany without an assignment waits for one, past its timeout: the topic may be
                    # gone for a while, and the loop must go on listing it (and honour stop()).
                    batch = {}
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stop.wait(), self.poll_ms / 1000)
                assigned = consumer.assignment()
                # Only what was fetched from the store's offsets: in group mode aiokafka fetches from
                # the group's committed ones as soon as the group assigns a partition, while the
                # listener is still checking the store's log (`_same_log`); those records would be
                # read a second time after its seek.
                batch = {tp: rows for tp, rows in batch.items() if tp in self._positioned}
                if drain and ends is None:
                    if not assigned:
                        if time.monotonic() > deadline:
                            raise TimeoutError(
                                f"no partition of {self.topic} was assigned within {self.join_timeout_s} s"
                            )
                        continue
                    ends = await consumer.end_offsets(list(assigned))
                    summary.partitions = sorted(tp.partition for tp in assigned)
                # aiokafka's records as they come (`KafkaRecord`): a copy of each cost 0.35 µs a record.
                raw = [r for rows in batch.values() for r in rows]
                if raw:
                    if first_batch_at is None:
                        first_batch_at, first_batch_cpu = time.perf_counter(), time.process_time()
                    offsets = {(tp.topic, tp.partition): rows[-1].offset + 1 for tp, rows in batch.items() if rows}
                    # Python work, overlapping the previous batch's DuckDB transaction.
                    staged = await loop.run_in_executor(None, store.stage, raw)
                    # The records (some 16 MB of values a batch) are not held while the next are fetched
                    # and staged: the batch lives on as `staged` alone.
                    del raw
                    batch = {}
                    await self._settle(consumer, writing, summary)
                    writing = None
                    writing = self._write(staged, offsets, fetched_from)
                    if self.assignment == "group":
                        # Every stored batch is committed before the next fetch, during which a
                        # rebalance may take its partitions away (the next owner seeks to the store's).
                        await self._settle(consumer, writing, summary)
                        writing = None
                else:
                    # Nothing more to overlap with: store the batch in hand now.
                    await self._settle(consumer, writing, summary)
                    writing = None
                await self._update_lag(consumer, assigned)
                # A partition not positioned yet may stand at its end only because of dropped records.
                positioned = all(tp in self._positioned for tp in assigned)
                if drain and ends is not None and positioned and await _reached(consumer, ends):
                    break
                if not drain and time.monotonic() - last_gap_check > min(self.gap_grace_s, 30.0):
                    last_gap_check = time.monotonic()
                    await self._settle(consumer, writing, summary)
                    writing = None
                    older = datetime.now(UTC) - timedelta(seconds=self.gap_grace_s)
                    summary.gaps_recorded += await loop.run_in_executor(
                        None, functools.partial(store.close_open_gaps, older_than=older)
                    )
                    found = await loop.run_in_executor(
                        None, functools.partial(store.close_checkpoints, older_than=older)
                    )
                    summary.checkpoint_breaks += sum(found.values())
            await self._settle(consumer, writing, summary)
            writing = None
            if drain:
                summary.gaps_recorded += store.close_open_gaps()
                summary.checkpoint_breaks += sum(store.close_checkpoints().values())
            if first_batch_at is not None:
                summary.ingest_seconds = time.perf_counter() - first_batch_at
                summary.ingest_cpu_seconds = time.process_time() - first_batch_cpu
        except Exception as exc:
            self._state.error = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            if writing is not None:
                # Never leave a transaction running behind a stopped consumer; its outcome (stored,
                # or rolled back) is the store's, and the next run reads from the store's offsets.
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await writing.done
            sys.setswitchinterval(switch_interval)
            pa.set_memory_pool(memory_pool)
            if gc_enabled:
                gc.enable()
            gc.unfreeze()
            await _stop_consumer(consumer, "the consumer")
        return summary

    async def _started_consumer(self, *, drain: bool) -> Any:
        """A started consumer (subscribed to the group in group mode). A continuous run that cannot reach
        the broker (down, or restarting: a member restarted beside a broker outage) tries again every
        second, reported by health as any broker outage is, until it can or `stop()` is asked (then
        None); a drain raises at once, as "cannot check" must."""
        from aiokafka.errors import KafkaConnectionError

        while True:
            consumer = self._consumer()
            if self.assignment == "group":
                consumer.subscribe([self.topic], listener=_listener(self, consumer))
            try:
                await consumer.start()
            except KafkaConnectionError as exc:
                await _stop_consumer(consumer, "the consumer that did not start")
                if drain:
                    raise
                state = self._state
                state.broker_error = f"{type(exc).__name__}: {exc}"
                state.broker_error_since = state.broker_error_since or time.monotonic()
                log.warning("cannot reach the broker at %s (%s); trying again", self.bootstrap, exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), 1.0)
                if self._stop.is_set():
                    return None
                continue
            self._state.broker_error = self._state.broker_error_since = None
            return consumer

    def _write(self, staged: StagedBatch, offsets: dict[tuple[str, int], int], fetched_from: Any) -> _Write:
        """Start the batch's DuckDB transaction in a worker thread."""
        started = time.perf_counter()
        done = asyncio.get_running_loop().run_in_executor(None, _ingest_and_release, self.store, staged, offsets)
        return _Write(done, staged.records, offsets, fetched_from, started)

    async def _settle(self, consumer: Any, writing: _Write | None, summary: RunSummary) -> None:
        """Wait for the batch being written (re-raising what failed in it), commit its offsets to the
        group and count it."""
        if writing is None:
            return
        try:
            result = await writing.done
        except StoreFencedError as exc:
            await self._fenced(consumer, exc)
            return
        if self._kill_after_batch == summary.batches + 1:
            _kill_between_commits()
        # The store committed first: a failed Kafka commit only costs a replay.
        await self._commit(consumer, writing.offsets, writing.fetched_from)
        summary.batches += 1
        summary.records += writing.records
        summary.stored += result.stored
        summary.duplicates += result.duplicates
        summary.dead_letters += result.dead_letters
        summary.chain_breaks += result.chain_breaks
        self._record_metrics(writing.records, result, time.perf_counter() - writing.started)

    async def _fenced(self, consumer: Any, exc: StoreFencedError) -> None:
        """Another materializer of the lake stored the batch's partitions first (this one lost them and
        commits late): nothing of the batch was stored. Each partition still assigned seeks to what the
        lake holds; one no longer assigned is left to its new owner."""
        from aiokafka import TopicPartition

        log.warning("%s", exc)
        self._state.fenced += 1
        moved = [TopicPartition(topic, partition) for topic, partition in exc.moved]
        self._positioned.difference_update(moved)
        assigned = [tp for tp in moved if tp in consumer.assignment()]
        if assigned:
            await seek_to_store(self, consumer, assigned, known=[tp.partition for tp in assigned], log_lost=False)

    async def _commit(self, consumer: Any, offsets: Mapping[tuple[str, int], int], fetched_from: Any) -> None:
        """Commit what the store holds to the group (what the sink's `confirm_group` reads), unless the
        broker is another cluster by now: those offsets would claim records of the new logs."""
        from aiokafka import TopicPartition
        from aiokafka.structs import OffsetAndMetadata

        if self._watch.cluster_id != fetched_from:
            log.warning("the broker restarted since this batch was read; its offsets are not committed")
            return
        try:
            # aiokafka retries a commit for a topic that is gone until it is back (into a new log);
            # the timeout ends that, and the next batch commits again.
            await asyncio.wait_for(
                consumer.commit({TopicPartition(t, p): OffsetAndMetadata(o, "") for (t, p), o in offsets.items()}),
                self.commit_timeout_s,
            )
        except Exception as exc:
            log.warning("Kafka offset commit failed (%r); the store's offsets stand", exc)

    def _consumer(self) -> Any:
        from aiokafka import AIOKafkaConsumer

        from events.kafka import forbid_topic_creation

        group = self.assignment == "group"
        options = {**_CONSUMER_DEFAULTS, **(_GROUP_DEFAULTS if group else {}), **self.consumer_options}
        if group and self.instance_id is not None:
            options.setdefault("group_instance_id", self.instance_id)
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            group_id=self.group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_poll_records=self.batch_max,
            **options,
        )
        self._watch = forbid_topic_creation(consumer._client)
        return consumer

    async def _ensure_topic(self) -> None:
        from events.kafka import DEFAULT_PARTITIONS, ensure_topic

        count = self.partitions or DEFAULT_PARTITIONS
        try:
            listed = await ensure_topic(self.bootstrap, self.topic, count)
        except Exception as exc:
            # Reading needs no topic creation rights; the consumer reports an unreachable broker itself.
            log.warning("could not make sure topic %s exists on %s: %s", self.topic, self.bootstrap, exc)
            return
        log.info("topic %s on %s: %d partitions", self.topic, self.bootstrap, listed)

    async def _refresh(self, consumer: Any) -> Any:
        """List the topic's partitions; in "all" mode (re)assign them; update what health reports.
        Returns the consumer to read with from now on: in "all" mode another set of partitions is
        read by a new one (`_replaced`)."""
        from aiokafka import TopicPartition

        state, now = self._state, time.monotonic()
        try:
            # The consumer's own client, whose metadata requests create no topic (forbid_topic_creation).
            cluster = await asyncio.wait_for(consumer._client.fetch_all_metadata(), 5.0)
        except Exception as exc:
            state.broker_error = f"{type(exc).__name__}: {exc}"
            if state.broker_error_since is None:
                state.broker_error_since = now
            return consumer
        state.broker_error = state.broker_error_since = None
        listed = cluster.partitions_for_topic(self.topic) or set()
        cluster_id = self._watch.cluster_id if self._watch is not None else None
        if state.cluster_id is not None and cluster_id is not None and cluster_id != state.cluster_id:
            log.warning("the broker at %s is a new cluster (%s): its logs start again", self.bootstrap, cluster_id)
            state.log_lost = True
            state.cluster_id = cluster_id
        if not listed:
            if state.topic_listed:
                log.warning("topic %s vanished from %s; waiting for it to be recreated", self.topic, self.bootstrap)
                state.log_lost = True
            state.topic_listed = False
            state.topic_missing_since = state.topic_missing_since or now
        else:
            state.topic_listed = True
            state.topic_missing_since = None
        if self.assignment == "all":
            current = {tp.partition for tp in consumer.assignment()}
            if listed != current or (state.log_lost and listed):
                tps = [TopicPartition(self.topic, p) for p in sorted(listed)]
                if listed != current:
                    if current:  # a consumer that never had partitions is assigned safely
                        replaced = await self._replaced(consumer)
                        if replaced is None:  # the next refresh tries again
                            return consumer
                        consumer = replaced
                    if tps:
                        consumer.assign(tps)
                self._positioned.clear()
                if tps:
                    with contextlib.suppress(Exception):  # the fetcher refreshes it on demand anyway
                        await asyncio.wait_for(consumer._client.force_metadata_update(), 5.0)
                    kept = set() if state.log_lost else current
                    await seek_to_store(self, consumer, tps, known=kept, log_lost=state.log_lost)
                    state.log_lost = False
                    state.cluster_id = cluster_id
                    log.info("reading %s partitions %s", self.topic, sorted(listed))
        elif state.cluster_id is None:
            state.cluster_id = cluster_id
        await self._partition_health(consumer, listed)
        return consumer

    async def _replaced(self, consumer: Any) -> Any:
        """A started consumer of the same options in place of `consumer` (stopped), without assignment;
        None, with `consumer` kept, when the new one cannot start.

        Never `assign` or `unsubscribe` on a consumer that had partitions: aiokafka's coordination routine,
        still looking up a coordinator after the broker went away, keeps the assignment it had, and
        fails its assertion that it is active once either call replaced it (the run ended with
        "Unexpected error during coordination AssertionError()"). A new consumer's routine starts
        from its own first assignment."""
        watch = self._watch
        fresh = self._consumer()
        try:
            await asyncio.wait_for(fresh.start(), 10.0)
        except Exception as exc:
            self._watch = watch
            await _stop_consumer(fresh, "the consumer that did not start")
            log.warning("could not start a consumer for the new partitions of %s: %r", self.topic, exc)
            return None
        await _stop_consumer(consumer, "the previous consumer")
        return fresh

    async def _partition_health(self, consumer: Any, listed: set[int]) -> None:
        from aiokafka import TopicPartition

        state, now = self._state, time.monotonic()
        owned = {tp.partition for tp in consumer.assignment() if tp.topic == self.topic}
        for gone in set(state.partitions) - listed:
            del state.partitions[gone]
            if self.metrics is not None:
                self.metrics.remove_partition(self.topic, gone)
        others = [TopicPartition(self.topic, p) for p in sorted(listed - owned)]
        ends: Mapping[Any, int] = {}
        if others:
            try:
                ends = await asyncio.wait_for(consumer.end_offsets(others), 5.0)
            except Exception as exc:
                log.debug("no end offsets for %s: %s", others, exc)
        stored = self.store.offsets(self.topic, expect=()) if others else {}
        for number in sorted(listed):
            part = state.partitions.setdefault(number, _Partition())
            before = part.read_up_to
            part.owned = number in owned
            if part.owned:
                part.unread_since = None
                tp = TopicPartition(self.topic, number)
                # The awaits above let a rebalance take it meanwhile (highwater() asserts it is assigned).
                part.high_watermark = consumer.highwater(tp) if tp in consumer.assignment() else None
                # position() waits for an offset reset; the loop's lag update fills it in otherwise.
                part.read_up_to = part.position
            else:
                part.position = None
                tp = TopicPartition(self.topic, number)
                part.high_watermark = ends.get(tp, part.high_watermark)
                part.read_up_to = await self._read_by_others(consumer, tp, stored.get(number))
                nothing_waits = (
                    self.assignment == "group"
                    and part.high_watermark is not None
                    and part.read_up_to is not None
                    and part.read_up_to >= part.high_watermark
                )
                moving = self.assignment == "group" and before is not None and part.read_up_to != before
                # "group": another member may own it; only a committed offset that lags and stands
                # still says nobody does. "all": every listed partition is this materializer's.
                if nothing_waits or moving:
                    part.unread_since = None
                elif part.unread_since is None:
                    part.unread_since = now
            self._track_stall(part, before, now)
            self._publish(number, part, now)
        if self.assignment == "group" and not consumer.assignment():
            self._ask_to_reassign(consumer, now)

    def _ask_to_reassign(self, consumer: Any, now: float) -> None:
        """Group mode, this member assigned nothing: when listed partitions have waited unread past the
        grace since the group's last assignment, join the group again as a new member (once an
        assignment: a join takes seconds, and one asked meanwhile would start it over).

        A leader's assignment can be lost on its way back, and asking again under the same member id
        does not help everywhere: after an empty restart the embedded broker answered every sync of
        a member with the first assignment it had stored for that member id (none, made before the
        topic was recreated), and no later metadata change would ever rejoin. A new member id gets
        a new assignment; the group forgets the old one when its session times out."""
        state, grace = self._state, self.unread_grace_s
        unread = sorted(
            n for n, p in state.partitions.items() if p.unread_since is not None and now - p.unread_since > grace
        )
        assigned_at, asked_at = state.assigned_at, state.reassign_asked_at
        if not unread or assigned_at is None or now - assigned_at <= grace:
            return
        if asked_at is not None and asked_at >= assigned_at:
            return
        state.reassign_asked_at = now
        log.warning(
            "partitions %s of %s wait unread and the group assigned this materializer none: joining it again",
            unread,
            self.topic,
        )
        consumer._coordinator.reset_generation()

    def _publish(self, number: int, part: _Partition, now: float) -> None:
        if self.metrics is not None:
            self.metrics.set_partition(
                self.topic,
                number,
                owned=part.owned,
                position=part.position,
                high_watermark=part.high_watermark,
                unread_s=0.0 if part.unread_since is None else now - part.unread_since,
            )

    def _track_stall(self, part: _Partition, before: int | None, now: float) -> None:
        waiting = part.high_watermark is not None and (part.read_up_to or 0) < part.high_watermark
        if not part.owned or not waiting or part.read_up_to != before:
            part.stalled_since = None
        elif part.stalled_since is None:
            part.stalled_since = now

    async def _read_by_others(self, consumer: Any, tp: Any, stored: int | None) -> int | None:
        if self.assignment == "all":
            return stored
        try:
            committed = await asyncio.wait_for(consumer.committed(tp), 5.0)
        except Exception as exc:
            log.debug("no committed offset for %s: %s", tp, exc)
            return None
        return int(committed) if committed is not None else 0

    def _record_metrics(self, records: int, result: IngestResult, seconds: float) -> None:
        if self.metrics is None:
            return
        self.metrics.record_batch(
            stored_by_type=result.stored_by_type,
            duplicates=result.duplicates,
            dead_letters_by_reason=result.dead_letters_by_reason,
            chain_breaks_by_kind=result.chain_breaks_by_kind,
            seconds=seconds,
            records=records,
            last_event_time=result.last_event_time,
        )

    async def _update_lag(self, consumer: Any, assigned: Any) -> None:
        for tp in assigned:
            # A rebalance during the awaits below may have taken it (highwater() asserts it is assigned).
            high = consumer.highwater(tp) if tp in consumer.assignment() else None
            if high is None:
                continue
            try:
                # position() waits for a pending offset reset; the next poll tries again.
                position = await asyncio.wait_for(consumer.position(tp), 1.0)
            except Exception as exc:  # a partition revoked mid-way: its lag is no longer ours to report
                log.debug("no position for %s: %s", tp, exc)
                continue
            part = self._state.partitions.get(tp.partition)
            if part is not None and part.owned:
                before = part.read_up_to
                part.position = part.read_up_to = position
                part.high_watermark = high
                self._track_stall(part, before, time.monotonic())
                self._publish(tp.partition, part, time.monotonic())
            if self.metrics is not None:
                self.metrics.set_lag(tp.topic, tp.partition, high - position)

    def _desk(self) -> Any:
        """The reviewers' desk over this store, publishing to the decisions topic (None without one)."""
        if self.decisions_topic is None:
            return None
        from consumers.approvals import ApprovalDesk, StoreClaims
        from consumers.queries import run_query
        from events.decisions import DecisionPublisher

        def lookup(approval_id: str) -> dict[str, Any] | None:
            con = self.store.cursor()
            try:
                rows = run_query(con, "approval_request", {"approval_id": approval_id}).rows
            finally:
                con.close()
            return rows[0] if rows else None

        self._publisher = DecisionPublisher(self.bootstrap, self.topic, self.decisions_topic)
        return ApprovalDesk(lookup, self._publisher, signing_key=self.decision_key, claims=StoreClaims(self.store))

    def close(self) -> None:
        """Stop the read API and close the store (idempotent)."""
        if self.api is not None:
            self.api.stop()
            self.api = None
        if self._publisher is not None:
            self._publisher.close()
            self._publisher = None
        self.store.close()


async def seek_to_store(
    materializer: Materializer,
    consumer: Any,
    assigned: Iterable[Any],
    *,
    known: Iterable[int] = (),
    log_lost: bool,
) -> None:
    """Seek each assigned partition to the offset the store holds for it (the truth), or to the
    beginning when the store has none, whatever the group committed.

    `log_lost`: the broker's logs are new (the topic vanished, the cluster changed): every partition
    reads from the beginning. Partitions in `known` were read by this consumer on the same log until
    now: they seek to the stored offset without checking the log. The others, when the store holds
    an offset, are checked first (`_same_log`), since the broker may have lost its log while no
    materializer was watching; a check that fails reads the partition from the start.

    In group mode the store is the truth for every member: a lake (`consumers.lake`) holds what every
    materializer of the group stored, so a partition the group moves is read on from where its
    previous owner stored it, and a late commit of that owner is refused by the lake.

    Each partition sought joins `materializer._positioned`: the loop uses only records fetched for
    those (a fetch made before the seek started from the group's committed offsets)."""
    assigned = list(assigned)
    # What the fence expects, for the partitions sought here alone: a batch staged for one this
    # materializer lost is still refused.
    stored: Mapping[int, int] = materializer.store.offsets(
        materializer.topic, expect=[tp.partition for tp in assigned if tp.topic == materializer.topic]
    )
    kept = set(known)
    for tp in list(assigned):
        offset = stored.get(tp.partition)
        start = await _start_offset(materializer, tp, offset, tp.partition in kept, log_lost)
        # No await between the seek and joining _positioned: the loop may fetch meanwhile, and a record
        # fetched from the seek position but dropped as unpositioned would be skipped.
        consumer.seek(tp, start)
        materializer._positioned.add(tp)


async def _start_offset(materializer: Materializer, tp: Any, offset: int | None, known: bool, log_lost: bool) -> int:
    if offset is None or offset == 0 or log_lost:
        # Offset 0 rather than seek_to_beginning, which waits (up to the request timeout, inside
        # a rebalance) for an offset lookup: a log whose start was deleted answers "out of
        # range", and auto_offset_reset="earliest" moves to its first record.
        return 0
    if known:
        return offset
    try:
        same = await _same_log(materializer, tp, offset)
    except Exception as exc:
        # Unchecked, the stored offset may point into another log; the start costs a replay only.
        log.warning("cannot check that %s still holds what the store read (%r); reading it from the start", tp, exc)
        return 0
    if not same:
        # The broker lost its log and numbers new records from 0 again (the embedded broker
        # does on a restart): the stored offset now points into other records. Read the
        # partition from the start; the event_id key absorbs anything already stored.
        log.warning("%s no longer holds the records the store read; reading it from the start", tp)
        return 0
    return offset


def _listener(materializer: Materializer, consumer: Any) -> Any:
    from aiokafka.abc import ConsumerRebalanceListener

    class SeekToStore(_SeekToStore, ConsumerRebalanceListener):  # type: ignore[misc]
        pass

    return SeekToStore(materializer, consumer)


class _SeekToStore:
    """Group mode: on assignment, each partition seeks to the offset the store committed (the truth;
    in a lake, what every materializer of the group stored); on revocation, what is fetched for the
    revoked partitions is dropped until they are sought again."""

    def __init__(self, materializer: Materializer, consumer: Any) -> None:
        self.materializer = materializer
        self.consumer = consumer

    async def on_partitions_revoked(self, revoked: Any) -> None:
        # Until the next assignment's seek, what is fetched for them is not the store's to use, and a
        # batch already staged for them is refused by the store if another materializer wrote them.
        self.materializer._positioned.difference_update(revoked)
        topic = self.materializer.topic
        self.materializer.store.forget_partitions(topic, [tp.partition for tp in revoked if tp.topic == topic])

    async def on_partitions_assigned(self, assigned: Any) -> None:
        state = self.materializer._state
        watch = self.materializer._watch
        cluster_id = watch.cluster_id if watch is not None else None
        lost = state.log_lost or (
            state.cluster_id is not None and cluster_id is not None and cluster_id != state.cluster_id
        )
        await seek_to_store(self.materializer, self.consumer, assigned, log_lost=lost)
        state.assigned_at = time.monotonic()
        state.log_lost = False
        state.cluster_id = cluster_id or state.cluster_id


async def _same_log(materializer: Materializer, tp: Any, offset: int) -> bool:
    """Whether the record just before the stored offset is still the one the store read."""
    from aiokafka import AIOKafkaConsumer

    from events.kafka import forbid_topic_creation

    probe = AIOKafkaConsumer(
        bootstrap_servers=materializer.bootstrap, enable_auto_commit=False, auto_offset_reset="none"
    )
    forbid_topic_creation(probe._client)
    await probe.start()
    try:
        probe.assign([tp])
        probe.seek(tp, offset - 1)
        # A fetch may start at the beginning of a compressed batch: look for the exact offset.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                batch = await probe.getmany(tp, timeout_ms=1000, max_records=500)
            except Exception as exc:  # out of range: the log is shorter than what the store read
                log.debug("probe of %s at %d failed: %s", tp, offset - 1, exc)
                return False
            for record in batch.get(tp, []):
                if record.offset == offset - 1:
                    return materializer.store.holds(tp.topic, tp.partition, record.offset, record.value)
                if record.offset >= offset:
                    return False
        return False
    finally:
        await probe.stop()


async def _stop_consumer(consumer: Any, what: str, timeout_s: float = 10.0) -> None:
    """`consumer.stop()`, bounded, and never mistaken for the caller's own cancellation.

    aiokafka's fetcher cancels its pending fetch requests on close and awaits them without catching
    their CancelledError; a request asleep in its retry backoff (the broker went away) then makes
    `stop()` raise CancelledError although nobody cancelled the caller. Taken for a cancellation, it
    ended the materializer's run when the broker came back empty ("topic vanished", a new consumer
    for the new partitions, the old one stopped). Only a cancellation of the calling task itself is
    passed on."""
    task = asyncio.current_task()
    try:
        await asyncio.wait_for(consumer.stop(), timeout_s)
    except asyncio.CancelledError:
        if task is not None and task.cancelling():
            raise
        log.warning("%s did not stop cleanly: its fetcher's close raised CancelledError", what)
        # What `stop()` did not reach: the fetcher's other requests and the client's connections.
        fetcher = getattr(consumer, "_fetcher", None)
        pending = list(getattr(fetcher, "_pending_tasks", ()))
        for request in pending:
            request.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(consumer._client.close(), timeout_s)
    except Exception as exc:
        log.warning("%s did not stop cleanly: %r", what, exc)


async def _topic_exists(bootstrap: str, topic: str, options: Mapping[str, Any]) -> bool:
    from aiokafka import AIOKafkaConsumer

    from events.kafka import forbid_topic_creation

    probe = AIOKafkaConsumer(bootstrap_servers=bootstrap, **{k: v for k, v in options.items() if "timeout" in k})
    forbid_topic_creation(probe._client)
    await probe.start()
    try:
        return topic in await probe.topics()
    finally:
        await probe.stop()


async def _reached(consumer: Any, ends: Mapping[Any, int]) -> bool:
    """True when every partition's position is at (or past) its end offset as of the start, and
    at the high watermark the last fetch reported (some brokers answer the offset request with the
    start of their last compressed batch rather than its end)."""
    for tp, end in ends.items():
        position = await consumer.position(tp)
        highwater = consumer.highwater(tp)
        if position < end or highwater is None or position < highwater:
            return False
    return True


FAULT_KILL_BETWEEN_COMMITS: Final = "CALLGATE_FAULT_KILL_BETWEEN_COMMITS"
"""Fault injection for tests and drills, inert unless set: N makes the materializer SIGKILL itself
right after the store committed its N-th batch, before that batch's Kafka commit."""


def _fault_kill_between_commits() -> int | None:
    value = os.environ.get(FAULT_KILL_BETWEEN_COMMITS, "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def _kill_between_commits() -> None:
    log.warning("%s: SIGKILL between the store commit and the Kafka commit", FAULT_KILL_BETWEEN_COMMITS)
    os.kill(os.getpid(), signal.SIGKILL)
