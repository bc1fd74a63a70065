"""The audit store: decision events materialized into one DuckDB file.

`AuditStore` is what the materializer writes through and what readers open read-only. One call of
`AuditStore.ingest` is one transaction: the events of a batch of Kafka records, the records that
are not events (dead letters), the Kafka offsets that batch reached and the chain checks of the
producers in it are committed together or not at all, so a crash replays from the stored offsets
and the verdicts drop what was already stored: every `event_id` is stored once.

Rows travel from Python to DuckDB as Arrow tables (DuckDB ingests those some 1,000 times faster
than `executemany`), and the duplicate and chain checks join the batch against its neighbours in
the store (the stored events of its producers, from one seq below the batch's to one above, and
the stored events with its ids, found by `event_uuid` in the row groups of their time), so a batch
costs the same whether the table holds a thousand events or a million, and no index of every event
has to fit in memory.

Tables: `events` (one row per event, typed columns plus the whole event as JSON), `dead_letters`,
`kafka_offsets`, `chain_breaks`, `checkpoint_pending` and `checkpoint_state` (signed checkpoints,
`consumers.checkpoints`), `merkle_nodes` (the tree index proofs are answered from,
`consumers.proofs`), `access_log` (reads through the read API, `consumers.access_log`),
`schema_migrations`; views for readers: `blocked_attempts`,
`decision_trends`, `calls`. Readers should go through `consumers.queries`, not these names.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import os
import random
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Protocol, TypeVar

import duckdb
import pyarrow as pa  # type: ignore[import-untyped]  # ships no type information

from consumers.archive import CREATE_ARCHIVE_TABLES, ArchivedDay, archive_days, with_archive
from consumers.checkpoints import CheckpointVerifier
from consumers.lake import LAKE_ALIAS, Lake, WriterTurns, attach_lake
from consumers.proofs import fold, fold_all
from events import EventBase, EventParseError
from events.codec import ReadEvent, read_event
from events.fast_read import WireRead, read_wire
from events.kafka import CE_TYPE_PREFIX
from events.loss import LossReport, encode_loss_report, parse_loss_report
from events.models import ZERO_HASH, ApprovalResolvedEvent
from events.signing import VerifyingKey

__all__ = [
    "DEAD_LETTER_REASONS",
    "DEFAULT_MAX_VALUE_BYTES",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "AuditStore",
    "IngestResult",
    "KafkaRecord",
    "Migration",
    "RawRecord",
    "StagedBatch",
    "StoreCounts",
    "StoreError",
    "StoreFencedError",
    "StoreLockedError",
    "connect",
]

_T = TypeVar("_T")

MAX_COMMIT_ATTEMPTS: Final = 50
"""How often a lake write refused for a conflict with another writer's commit is tried again."""

DEFAULT_MAX_VALUE_BYTES: Final = 4 * 1024 * 1024
"""Records with a larger value are dead-lettered unparsed (the parser is not fed unbounded input)."""

DEFAULT_TABLE_CACHE_BYTES: Final = 16 * 1024 * 1024
"""What a writable store keeps of its tables' blocks in DuckDB's buffer pool after an ingest (see
`AuditStore`'s `table_cache_bytes`)."""

MAX_GAP_ROWS_PER_HOLE: Final = 1000
"""`close_open_gaps` records at most this many missing seqs per hole (each row's detail names the
whole hole): a forged seq of 10**12 must not make it write 10**12 rows."""

UNVERIFIED_DECISION: Final = "unverified decision"
"""The start of `events.decided_by` on an `ApprovalResolved` that no desk key signed, in a store
given the desk's public keys (`decision_keys`); the rest says why ("it is not signed", a forged or
altered signature). Stored as evidence, such an event decides its request only when the gate that
asked wrote it (its own handler's or framework's answer, in its own chain: the same producer as an
`ApprovalRequested` of that approval id); otherwise the request stays pending (`pending_approvals`),
and the event is listed by the `unverified_decisions` query. NULL on every other event."""

PREVIEW_CHARS: Final = 200
"""How much of a dead letter's value is kept as text in `dead_letters.preview`."""

DEAD_LETTER_REASONS: Final = (
    "no_value",
    "oversize",
    "not_utf8",
    "not_json",
    "not_an_event",
    "unknown_type",
    "newer_schema",
    "invalid",
    "envelope_mismatch",
    "error",
)
"""Every `dead_letters.reason`, in the order a record is checked: no value (None or empty), a value
over `max_value_bytes`, bytes that are not UTF-8, text that is not JSON, JSON that is not an object
(an array, a string, a number...), an unknown or missing `type`, a `schema_version` newer than this
code reads, any other invalid field, a valid event whose Kafka envelope (key, `ce_id`, `ce_type`)
disagrees with it, and any other error while reading it. The `error` column keeps the details."""

# DuckDB 2.0 bundles core_functions, icu, json and parquet; anything else it would fetch from the
# network on first use. A store never does that: no surprise downloads, no surprise code.
_DUCKDB_CONFIG: Final[dict[str, str | bool | int | float | list[str]]] = {
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    # DuckDB's default buffer pool is 80% of RAM and keeps every page it ever wrote: the
    # materializer's memory would grow with the store. A cap keeps it flat (pages spill to the file).
    "memory_limit": os.environ.get("CALLGATE_DUCKDB_MEMORY_LIMIT", "256MB"),
    # A checkpoint's vacuum merges the small row groups each checkpoint leaves into full ones (122,880
    # rows), rewriting the open one every time: checkpoints then cost more the fuller it is (1.6 s at
    # 120,000 events) and their peak memory grew with it. Without it each checkpoint writes only what
    # came since the last one; row groups stay at the rows between checkpoints (about 15,000 events).
    "max_vacuum_tasks": 0,
}

# A writable store's row groups hold this many rows, the materializer's batch (`batch_max`): a
# transaction that appends a whole row group writes it straight to the file, compressed, and its
# commit logs only where (DuckDB's optimistic write), instead of every row to the WAL and then again
# at the next checkpoint. A 200,000-event ingest in batches of this size measured 1.3 to 1.5 times the
# rate of DuckDB's default row groups (122,880 rows), whose batches all went through the WAL. Smaller
# batches (a quiet topic) take the WAL as before. DuckDB keeps the size for the session only: every
# writable open attaches the file with it.
ROW_GROUP_ROWS: Final = 10_240

# Bytes of the buffer pool that hold blocks of tables (the file's, cached), and all it holds.
_POOL_USAGE: Final = """
SELECT sum(memory_usage_bytes) FILTER (WHERE tag = 'BASE_TABLE'), sum(memory_usage_bytes) FROM duckdb_memory()
"""

# The oldest storage format that compresses text with zstd (migration 11): duckdb 1.5 writes new files
# in the 0.10 format by default, where `USING COMPRESSION zstd` on a text column silently stays
# uncompressed. An older file is upgraded on its first writable open (DuckDB 1.2 and later read it).
STORAGE_VERSION: Final = "v1.2.0"

# Every timestamp is UTC; without this, TIMESTAMPTZ buckets and results follow the host's zone.
_SESSION_SETUP: Final = "SET TimeZone = 'UTC'"


# -- errors -------------------------------------------------------------------------------------


class StoreError(Exception):
    """Root of the store's errors: a file this code cannot use (written by a newer version, not
    migrated yet for a read-only open) or a write on a store opened read-only."""


class StoreLockedError(StoreError):
    """The database file is held for writing by another process (or by this process with another
    configuration); DuckDB then lets nobody else open it, not even read-only.

    `path` is the file, `pid` and `process` the holder as DuckDB reported it (None if it did not).
    """

    def __init__(self, path: str, pid: int | None, process: str | None) -> None:
        holder = f"{process or 'a process'} (PID {pid})" if pid is not None else (process or "another process")
        super().__init__(
            f"{path} is held for writing by {holder}; DuckDB lets no other process open it, not even "
            "read-only. Read through the materializer's read API instead (`callgate materialize ... "
            "--api HOST:PORT`, then `--api URL` on the reader), or wait until the writer has stopped."
        )
        self.path = path
        self.pid = pid
        self.process = process


class StoreFencedError(StoreError):
    """A batch whose partitions another writer of the same lake stored since this store last read or
    wrote their offsets (the partition was reassigned to another materializer, and this one commits
    late). Nothing of the batch was stored; the writer must seek to the store's offsets again
    (`AuditStore.offsets`) or let the partition go.

    `moved` maps each (topic, partition) that moved to (the offset this store expected, the one the
    store holds); None is no row."""

    def __init__(self, store: str, moved: Mapping[tuple[str, int], tuple[int | None, int | None]]) -> None:
        shown = ", ".join(
            f"{topic}/{partition} (expected {_offset_shown(seen)}, found {_offset_shown(now)})"
            for (topic, partition), (seen, now) in sorted(moved.items())
        )
        super().__init__(
            f"another writer stored {shown} in {store} since this one read them; the batch was not "
            "stored: seek to the store's offsets again"
        )
        self.moved = dict(moved)


def _offset_shown(offset: int | None) -> str:
    return "no offset" if offset is None else f"next offset {offset}"


_LOCK_HOLDER = re.compile(r"Conflicting lock is held in (?P<process>.+?) \(PID (?P<pid>\d+)\)")


def connect(path: str | os.PathLike[str] | Lake, *, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """Open a DuckDB file (or a `Lake`) the way every store connection is opened: no extension
    downloads, UTC. A lake is attached as `consumers.lake.LAKE_ALIAS` and made current.

    A writable open attaches the file with row groups of `ROW_GROUP_ROWS` (see there) as the
    connection's database; its cursors must run `session_setup(con)`'s statement, as `AuditStore`'s do.

    Raises `StoreLockedError` when another process holds the file (the message names it and the
    holder), or when this process already holds it; `StoreError` when `CALLGATE_DUCKDB_MEMORY_LIMIT`
    is not a size; DuckDB's own errors for anything else. Blocks only for the open itself.
    """
    if isinstance(path, Lake):
        return _connect_lake(path, read_only=read_only)
    name = str(Path(path))
    try:
        if read_only:
            con = duckdb.connect(name, read_only=True, config=_DUCKDB_CONFIG)
        else:
            # Spilled pages beside the file, where DuckDB puts those of a file it opens itself (those
            # of an in-memory database went to `.tmp` in whatever directory the process ran in).
            con = duckdb.connect(":memory:", config={**_DUCKDB_CONFIG, "temp_directory": f"{name}.tmp"})
            try:
                attach = (
                    f"ATTACH {_quoted_text(name)} AS {_alias(name)} "
                    f"(ROW_GROUP_SIZE {ROW_GROUP_ROWS}, STORAGE_VERSION '{STORAGE_VERSION}')"
                )
                con.execute(attach).fetchall()
                con.execute(f"USE {_alias(name)}").fetchall()
            except BaseException:
                con.close()
                raise
    except duckdb.IOException as exc:
        found = _LOCK_HOLDER.search(str(exc))
        if found is None:
            raise
        raise StoreLockedError(name, int(found["pid"]), found["process"]) from exc
    except duckdb.ParserException as exc:
        # The configuration is parsed when the database starts: a bad memory limit fails every open.
        if "CALLGATE_DUCKDB_MEMORY_LIMIT" not in os.environ or "Memory" not in str(exc):
            raise
        value = os.environ["CALLGATE_DUCKDB_MEMORY_LIMIT"]
        raise StoreError(
            f"CALLGATE_DUCKDB_MEMORY_LIMIT={value!r} is not a memory size DuckDB reads (such as 256MB or 1GB)"
        ) from exc
    except (duckdb.ConnectionException, duckdb.BinderException) as exc:
        # Within one process a file is open once: DuckDB refuses a second open with other options
        # (read-only beside a writer), or any open beside a writer's attached file, as another
        # process would be refused.
        if "different configuration" not in str(exc) and "already attached" not in str(exc):
            raise
        raise StoreLockedError(name, os.getpid(), "this process, opened with other options") from exc
    # Every statement's result is read to its end: DuckDB keeps the transaction of a result left
    # unread open, and one left open on this connection (which only hands out cursors) stopped
    # every automatic checkpoint of the file, its WAL and the store's memory then growing with
    # every batch until DuckDB ran out of memory.
    con.execute(_SESSION_SETUP).fetchall()
    return con


def _connect_lake(lake: Lake, *, read_only: bool) -> duckdb.DuckDBPyConnection:
    for attempt in itertools.count(1):
        con = duckdb.connect(":memory:", config=_DUCKDB_CONFIG)
        try:
            attach_lake(con, lake, read_only=read_only)
            con.execute(f"USE {LAKE_ALIAS}").fetchall()
            con.execute(_SESSION_SETUP).fetchall()
        except duckdb.Error as exc:
            con.close()
            # Several processes attaching a new lake at once race to create its catalog tables (measured:
            # three materializers started together on an empty PostgreSQL catalog); one wins, the others
            # find its tables on the next attach.
            if "Failed to initialize DuckLake" not in str(exc) or attempt >= MAX_COMMIT_ATTEMPTS:
                raise
            time.sleep(random.uniform(0, min(0.5, 0.01 * 2**attempt)))
            continue
        except BaseException:
            con.close()
            raise
        return con
    raise AssertionError("unreachable")  # itertools.count never ends


def session_setup(con: duckdb.DuckDBPyConnection) -> str:
    """The statement a cursor of a store's connection runs first: UTC, and the connection's database
    (a cursor of a writable open starts in DuckDB's `memory`, not in the attached file)."""
    (database,) = con.execute("SELECT current_database()").fetchall()[0]
    return f'{_SESSION_SETUP}; USE "{str(database).replace(chr(34), chr(34) * 2)}"'


def _alias(path: str) -> str:
    """The database name DuckDB gives a file it opens itself, its stem, quoted as an identifier; a
    stem DuckDB keeps for its own databases (`memory.duckdb`) gets a prefix."""
    stem = Path(path).stem
    if stem.lower() in _RESERVED_DATABASE_NAMES:
        stem = f"store_{stem}"
    return '"' + stem.replace('"', '""') + '"'


_RESERVED_DATABASE_NAMES: Final = frozenset({"memory", "temp", "system", "main"})


def _quoted_text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


# -- values -------------------------------------------------------------------------------------


@dataclass(slots=True)
class RawRecord:
    """One Kafka record as consumed: where it was (topic, partition, offset), its bytes and headers.

    The key and the CloudEvents headers are the record's envelope, which `AuditStore.ingest` checks
    against the event it carries (see there). Not frozen: a frozen dataclass's constructor cost four
    times as much (0.74 µs against 0.17); nothing changes one after it is made."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int | None = None
    headers: tuple[tuple[str, bytes], ...] = ()
    """(name, value) pairs in the record's order, as aiokafka gives them (a name may repeat)."""

    @property
    def timestamp(self) -> int | None:
        """`timestamp_ms`, under the name aiokafka's records give it (`KafkaRecord`)."""
        return self.timestamp_ms


class KafkaRecord(Protocol):
    """What the store reads of a consumed record: a `RawRecord`, or aiokafka's `ConsumerRecord` as
    it comes (the materializer hands those over as they are: a `RawRecord` made of each cost 0.35 µs
    a record, on the interpreter's lock that reading and checking the events keep busy)."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def timestamp(self) -> int | None:
        """Milliseconds since the epoch (Kafka's record time)."""

    @property
    def headers(self) -> Sequence[tuple[str, bytes]]:
        """(name, value) pairs in the record's order (a name may repeat)."""


@dataclass(frozen=True, slots=True)
class IngestResult:
    """What one `ingest` did; every record counts in exactly one of stored, duplicates, dead_letters
    or (as a 'conflict') chain_breaks.

    - `stored`: events newly stored.
    - `duplicates`: records already in the store (an event or a dead letter) or repeated in the batch.
    - `dead_letters`: records newly stored as dead letters.
    - `chain_breaks`: chain-break rows newly recorded ('tamper' and 'conflict'; a conflicting event
      is not stored as an event, its JSON is kept in the break's `evidence`; a 'gap' for each new
      loss report, `events.loss`, the report kept as `evidence`).

    The breakdowns (for metrics) split the same counts: stored events by type, new dead letters by
    reason kind, new chain breaks by kind; `last_event_time` is the newest stored event's `time`.
    """

    stored: int
    duplicates: int
    dead_letters: int
    chain_breaks: int
    stored_by_type: Mapping[str, int] = field(default_factory=dict)
    dead_letters_by_reason: Mapping[str, int] = field(default_factory=dict)
    chain_breaks_by_kind: Mapping[str, int] = field(default_factory=dict)
    last_event_time: datetime | None = None


@dataclass(frozen=True, slots=True)
class StagedBatch:
    """A batch of records read into the Arrow tables `AuditStore.ingest_staged` writes
    (`AuditStore.stage` makes it): the events, the dead letters, the loss reports, and how many
    records it came from. A value: holds no connection, safe to hand to another thread."""

    events: pa.Table
    dead: pa.Table
    losses: tuple[LossReport, ...]
    records: int
    distinct: bool
    """No event id, and no (producer_id, seq), twice among the events."""


@dataclass(frozen=True, slots=True)
class StoreCounts:
    """A summary of the store: events by type, dead letters by reason kind, chain breaks by kind,
    and the time of the newest event (None when empty)."""

    events: dict[str, int]
    dead_letters: dict[str, int]
    chain_breaks: dict[str, int]
    last_event_time: datetime | None

    @property
    def total_events(self) -> int:
        """All stored events."""
        return sum(self.events.values())


@dataclass(frozen=True, slots=True)
class Migration:
    """One versioned schema step: its statements run in one transaction, once per file."""

    version: int
    name: str
    statements: tuple[str, ...]
    after: Callable[[duckdb.DuckDBPyConnection], None] | None = None
    """Python run after the statements, in the same transaction (filling what SQL cannot compute)."""


# -- schema -------------------------------------------------------------------------------------

_CREATE_MIGRATIONS = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version INTEGER PRIMARY KEY,
    name VARCHAR NOT NULL,
    applied_at TIMESTAMPTZ NOT NULL
)
"""

_CREATE_EVENTS = """
CREATE TABLE events (
    event_id VARCHAR PRIMARY KEY,
    type VARCHAR NOT NULL,
    schema_version INTEGER NOT NULL,
    time TIMESTAMPTZ NOT NULL,
    producer_id VARCHAR NOT NULL,
    seq BIGINT NOT NULL,
    hash VARCHAR NOT NULL,
    prev_hash VARCHAR NOT NULL,
    content_hash VARCHAR NOT NULL,  -- recomputed from the content; differs from hash when tampered
    gate VARCHAR,
    workflow VARCHAR,
    agent VARCHAR,
    tool VARCHAR,
    call_id VARCHAR,
    parent_call_id VARCHAR,
    run_id VARCHAR,
    thread_id VARCHAR,
    tenant VARCHAR,
    principal VARCHAR,
    trace_id VARCHAR,
    span_id VARCHAR,
    decided_by VARCHAR,
    outcome VARCHAR,
    message VARCHAR,
    duration_ms DOUBLE,
    kafka_topic VARCHAR,
    kafka_partition INTEGER,
    kafka_offset BIGINT,
    ingested_at TIMESTAMPTZ NOT NULL,
    event JSON NOT NULL
)
"""

_CREATE_DEAD_LETTERS = """
CREATE TABLE dead_letters (
    topic VARCHAR NOT NULL,
    partition INTEGER NOT NULL,
    "offset" BIGINT NOT NULL,
    key BLOB,
    value BLOB,
    reason VARCHAR NOT NULL,  -- the kind (DEAD_LETTER_REASONS): no_value, oversize, not_utf8, not_json,
                              -- not_an_event, unknown_type, newer_schema, invalid, envelope_mismatch, error
    error VARCHAR NOT NULL,  -- the whole reason, as the parser gave it
    preview VARCHAR,  -- the value's first characters as text, for people
    kafka_time TIMESTAMPTZ,
    received_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (topic, partition, "offset")
)
"""

_CREATE_OFFSETS = """
CREATE TABLE kafka_offsets (
    topic VARCHAR NOT NULL,
    partition INTEGER NOT NULL,
    next_offset BIGINT NOT NULL CHECK (next_offset >= 0),
    updated_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (topic, partition)
)
"""

_CREATE_CHAIN_BREAKS = """
CREATE TABLE chain_breaks (
    producer_id VARCHAR NOT NULL,
    seq BIGINT NOT NULL,
    kind VARCHAR NOT NULL CHECK (kind IN ('gap', 'tamper', 'conflict')),
    detail VARCHAR NOT NULL,
    event_id VARCHAR,
    evidence JSON,  -- for a conflict: the event that was not stored
    recorded_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (producer_id, seq, kind)
)
"""

_CREATE_BLOCKED_ATTEMPTS_VIEW = """
CREATE VIEW blocked_attempts AS
SELECT time, type, outcome AS cause, decided_by, message, gate, workflow, agent, tool, tenant, principal,
       call_id, run_id, thread_id, trace_id, producer_id, seq, event_id
FROM events
WHERE type IN ('ToolDenied', 'Blocked')
"""

_CREATE_DECISION_TRENDS_VIEW = """
CREATE VIEW decision_trends AS
SELECT date_trunc('minute', time) AS minute, type, count(*) AS events
FROM events
GROUP BY ALL
"""

# One row per call. Only call events describe the call: an Unmediated event may carry the call
# that was active when a guarded client was misused, and that call's tool is not the misuse's.
_CREATE_CALLS_VIEW = """
CREATE VIEW calls AS
SELECT
    call_id,
    any_value(gate) AS gate,
    any_value(workflow) AS workflow,
    any_value(agent) AS agent,
    any_value(tool) AS tool,
    any_value(tenant) AS tenant,
    any_value(principal) AS principal,
    any_value(run_id) AS run_id,
    any_value(parent_call_id) AS parent_call_id,
    any_value(trace_id) AS trace_id,
    min(time) AS started_at,
    max(time) FILTER (WHERE type IN ('ToolUse', 'ToolDenied', 'Substitute', 'Blocked')) AS time,
    max(type) FILTER (WHERE type IN ('ToolUse', 'ToolDenied', 'Substitute', 'Blocked')) AS outcome_type,
    max(outcome) FILTER (WHERE type IN ('ToolUse', 'ToolDenied', 'Substitute', 'Blocked')) AS outcome,
    max(decided_by) FILTER (WHERE type IN ('ToolUse', 'ToolDenied', 'Substitute', 'Blocked')) AS decided_by,
    max(message) FILTER (WHERE type IN ('ToolUse', 'ToolDenied', 'Substitute', 'Blocked')) AS message,
    bool_or(type = 'ApprovalRequested') AS approval_asked,
    CASE WHEN bool_or(type = 'ApprovalResolved')
         THEN bool_or(type = 'ApprovalResolved' AND outcome = 'approved') END AS approved,
    count(*) AS events
FROM events
WHERE call_id IS NOT NULL
  AND type IN ('ToolUse', 'ToolDenied', 'Substitute', 'Blocked', 'ApprovalRequested', 'ApprovalResolved')
GROUP BY call_id
"""

# The interceptors of each event's decision trail, in order, as a list column: the coverage check
# compares every tool run's trail with its registered chain, and reading it out of the JSON cost
# most of that check's time.
_ADD_TRAIL = (
    "ALTER TABLE events ADD COLUMN trail VARCHAR[]",
    "UPDATE events SET trail = coalesce(json_extract_string(event, '$.decisions[*].interceptor'), [])",
)

# Shadow mode: what an outcome event says its call would have had with every shadow decision
# enforced, as columns (the Policy impact page and `shadow_impact` group by them over every call).
# Backfilled from the JSON of the outcome events that carry them (events without shadow decisions
# have none of these fields). A shadow step mediates nothing, so `trail` keeps only the enforced
# steps: the coverage check must not count a shadow step as its registered interceptor having run.
# Only calls with a shadow decision mark their steps (`enforced`), so only their trails change.
# Plain text, no shared constants: a released step must never change.
_ADD_SHADOW = (
    "ALTER TABLE events ADD COLUMN shadow_outcome VARCHAR",
    "ALTER TABLE events ADD COLUMN divergent BOOLEAN",
    "ALTER TABLE events ADD COLUMN shadow_decided_by VARCHAR",
    "ALTER TABLE events ADD COLUMN shadow_rule VARCHAR",
    """
    UPDATE events SET
        shadow_outcome = json_extract_string(event, '$.shadow_outcome'),
        divergent = CAST(json_extract(event, '$.divergent') AS BOOLEAN),
        shadow_decided_by = json_extract_string(event, '$.shadow_decided_by'),
        shadow_rule = json_extract_string(event, '$.shadow_rule')
    WHERE type IN ('ToolUse', 'ToolDenied', 'Substitute', 'Blocked')
      AND json_extract_string(event, '$.shadow_outcome') IS NOT NULL
    """,
    """
    UPDATE events SET trail = coalesce(list_transform(
        list_filter(
            from_json(json_extract(event, '$.decisions'), '[{"interceptor": "VARCHAR", "enforced": "BOOLEAN"}]'),
            lambda step: step.enforced IS DISTINCT FROM false),
        lambda step: step.interceptor), [])
    WHERE list_contains(json_extract_string(event, '$.decisions[*].enforced'), 'false')
    """,
)

# Signed checkpoints (consumers.checkpoints): the chain break kinds of their verification (DuckDB
# cannot alter a CHECK constraint, so the table is copied into a new one), the queue of stored
# checkpoints not judged yet (every one stored so far, to begin with) and, per producer, the Merkle
# frontier of its stored hashes and its last valid checkpoint.
_ADD_CHECKPOINTS = (
    """
    CREATE TABLE chain_breaks_v5 (
        producer_id VARCHAR NOT NULL,
        seq BIGINT NOT NULL,
        kind VARCHAR NOT NULL CHECK (kind IN ('gap', 'tamper', 'conflict', 'bad_signature', 'unknown_key',
            'root_mismatch', 'inconsistent', 'unsigned', 'uncovered', 'silent', 'truncated')),
        detail VARCHAR NOT NULL,
        event_id VARCHAR,
        evidence JSON,
        recorded_at TIMESTAMPTZ NOT NULL,
        PRIMARY KEY (producer_id, seq, kind)
    )
    """,
    "INSERT INTO chain_breaks_v5 BY NAME SELECT * FROM chain_breaks",
    "DROP TABLE chain_breaks",
    "ALTER TABLE chain_breaks_v5 RENAME TO chain_breaks",
    """
    CREATE TABLE checkpoint_pending (
        event_id VARCHAR PRIMARY KEY,
        producer_id VARCHAR NOT NULL,
        seq BIGINT NOT NULL
    )
    """,
    "INSERT INTO checkpoint_pending SELECT event_id, producer_id, seq FROM events WHERE type = 'Checkpoint'",
    """
    CREATE TABLE checkpoint_state (
        producer_id VARCHAR PRIMARY KEY,
        leaves BIGINT NOT NULL,  -- stored events 1..leaves are folded into frontier
        frontier VARCHAR[] NOT NULL,  -- hex roots of the complete subtrees, largest first
        tree_size BIGINT,  -- the last valid checkpoint (NULL: none yet)
        root VARCHAR,
        checkpoint_seq BIGINT,
        event_id VARCHAR,
        closing BOOLEAN,
        heartbeat_s DOUBLE,
        checkpoint_time TIMESTAMPTZ,
        updated_at TIMESTAMPTZ NOT NULL
    )
    """,
)

# The Merkle tree index (consumers.proofs): complete subtree roots of 256 leaves and up, per signed
# producer; the fold restarts from seq 1 so every producer with a checkpoint gets its nodes.
_ADD_TREE_INDEX = (
    """
    CREATE TABLE merkle_nodes (
        producer_id VARCHAR NOT NULL,
        level INTEGER NOT NULL,  -- the subtree holds leaves idx * 2^level .. (idx + 1) * 2^level - 1
        idx BIGINT NOT NULL,
        hash VARCHAR NOT NULL,
        PRIMARY KEY (producer_id, level, idx)
    )
    """,
    "UPDATE checkpoint_state SET leaves = 0, frontier = CAST([] AS VARCHAR[])",
)

# Who read what through the read API (consumers.access_log): one row per named query asked by an
# authenticated caller, written by the materializer's process (it holds the writer).
_ADD_ACCESS_LOG = (
    """
    CREATE TABLE access_log (
        time TIMESTAMPTZ NOT NULL,
        subject VARCHAR NOT NULL,
        roles VARCHAR[] NOT NULL,
        query VARCHAR NOT NULL,
        params JSON NOT NULL,  -- as run: a tenant token's tenant bound
        status INTEGER NOT NULL,  -- the HTTP status answered: 200, 400, 403, 404
        row_count BIGINT,  -- rows returned (NULL unless 200)
        duration_ms DOUBLE NOT NULL
    )
    """,
)

# Event ids looked up without an in-memory index. The key on `event_id` was an ART index, which DuckDB
# keeps whole in memory (about 70 bytes an event, inside the store's memory limit): a store of
# 256 MB ran out of memory near 3.5 million events, and its memory grew with every event before
# that. `event_uuid` holds the id as a UUID where it is one (new ids are UUIDv7, time-ordered): a
# batch's ids fall in a narrow range of it, so the row groups' min/max skip nearly all of the store
# when the ingest looks them up (`_FIND_STORED_IDS`). The ingest's verdicts keep every id once.
# The table is rebuilt in its own order (DuckDB cannot drop a key); views bind by name. Plain text,
# no shared constants: a released step must never change.
_EVENT_IDS_WITHOUT_INDEX = (
    """
    CREATE TABLE events_v10 (
        event_id VARCHAR NOT NULL,
        type VARCHAR NOT NULL,
        schema_version INTEGER NOT NULL,
        time TIMESTAMPTZ NOT NULL,
        producer_id VARCHAR NOT NULL,
        seq BIGINT NOT NULL,
        hash VARCHAR NOT NULL,
        prev_hash VARCHAR NOT NULL,
        content_hash VARCHAR NOT NULL,
        gate VARCHAR,
        workflow VARCHAR,
        agent VARCHAR,
        tool VARCHAR,
        call_id VARCHAR,
        parent_call_id VARCHAR,
        run_id VARCHAR,
        thread_id VARCHAR,
        tenant VARCHAR,
        principal VARCHAR,
        trace_id VARCHAR,
        span_id VARCHAR,
        decided_by VARCHAR,
        outcome VARCHAR,
        message VARCHAR,
        duration_ms DOUBLE,
        kafka_topic VARCHAR,
        kafka_partition INTEGER,
        kafka_offset BIGINT,
        ingested_at TIMESTAMPTZ NOT NULL,
        event JSON NOT NULL,
        trail VARCHAR[],
        shadow_outcome VARCHAR,
        divergent BOOLEAN,
        shadow_decided_by VARCHAR,
        shadow_rule VARCHAR,
        event_uuid UUID  -- event_id as a UUID (NULL when it is none): what the ingest looks ids up by
    )
    """,
    "INSERT INTO events_v10 BY NAME SELECT *, TRY_CAST(event_id AS UUID) AS event_uuid FROM events",
    "DROP TABLE events",
    "ALTER TABLE events_v10 RENAME TO events",
)

# Each event's JSON (about 1.2 kB, nearly all of a row) compressed with zstd instead of DuckDB's own
# choice for text (FSST or a dictionary, whose analysis of every row group cost more than the rest of
# the row's columns together): a drain's inserts took 6.2 µs an event against 9.6, and the file 31 MB
# against 68 for 100,000 events. The table is rebuilt, as in step 10 (DuckDB cannot change a
# column's compression in place). Plain text, no shared constants: a released step must never change.
_EVENT_JSON_ZSTD = (
    """
    CREATE TABLE events_v11 (
        event_id VARCHAR NOT NULL,
        type VARCHAR NOT NULL,
        schema_version INTEGER NOT NULL,
        time TIMESTAMPTZ NOT NULL,
        producer_id VARCHAR NOT NULL,
        seq BIGINT NOT NULL,
        hash VARCHAR NOT NULL,
        prev_hash VARCHAR NOT NULL,
        content_hash VARCHAR NOT NULL,
        gate VARCHAR,
        workflow VARCHAR,
        agent VARCHAR,
        tool VARCHAR,
        call_id VARCHAR,
        parent_call_id VARCHAR,
        run_id VARCHAR,
        thread_id VARCHAR,
        tenant VARCHAR,
        principal VARCHAR,
        trace_id VARCHAR,
        span_id VARCHAR,
        decided_by VARCHAR,
        outcome VARCHAR,
        message VARCHAR,
        duration_ms DOUBLE,
        kafka_topic VARCHAR,
        kafka_partition INTEGER,
        kafka_offset BIGINT,
        ingested_at TIMESTAMPTZ NOT NULL,
        event JSON NOT NULL USING COMPRESSION zstd,
        trail VARCHAR[],
        shadow_outcome VARCHAR,
        divergent BOOLEAN,
        shadow_decided_by VARCHAR,
        shadow_rule VARCHAR,
        event_uuid UUID  -- event_id as a UUID (NULL when it is none): what the ingest looks ids up by
    )
    """,
    "INSERT INTO events_v11 BY NAME SELECT * FROM events",
    "DROP TABLE events",
    "ALTER TABLE events_v11 RENAME TO events",
)

# Shard tenures and handoffs between the stores of a sharded group, as released (retired by step 12:
# several materializers now write one lake). Plain text: a released step must never change.
_SHARD_TABLES = (
    # Who this store is in the handoff log: an id of its own, whatever instance id or host runs it.
    "CREATE TABLE shard_identity (store_id VARCHAR NOT NULL)",
    "INSERT INTO shard_identity SELECT 'store-' || replace(gen_random_uuid()::VARCHAR, '-', '')",
    """
    CREATE TABLE partition_tenures (
        tenure_id VARCHAR PRIMARY KEY,
        topic VARCHAR NOT NULL,
        partition INTEGER NOT NULL,
        owner VARCHAR NOT NULL,  -- the materializer's group instance id
        own BOOLEAN NOT NULL,  -- this store's tenure, or a peer's learnt from the handoff log
        start_offset BIGINT NOT NULL,  -- the first offset read in the tenure
        stored_before BIGINT,  -- own tenures: this store's next offset when it took the partition (NULL: none)
        group_offset BIGINT,  -- the group's committed offset when it began: the previous tenure stored up to there
        notice_offset BIGINT,  -- the take's position in the handoff log (orders tenures); NULL: not announced yet
        started_at TIMESTAMPTZ NOT NULL,
        confirmed_at TIMESTAMPTZ,  -- own tenures: when the previous owner was known to keep no copy of what it reads
        confirmed_by VARCHAR  -- 'first owner', 'own store', 'release' or 'resolved' and the previous owner
    )
    """,
    """
    CREATE TABLE offsets_elsewhere (
        topic VARCHAR NOT NULL,
        partition INTEGER NOT NULL,
        from_offset BIGINT NOT NULL,
        to_offset BIGINT NOT NULL,  -- exclusive
        reason VARCHAR NOT NULL CHECK (reason IN ('handoff', 'ceded')),
        tenure_id VARCHAR NOT NULL,  -- handoff: this store's tenure; ceded: the later tenure that holds them
        removed BIGINT NOT NULL,  -- ceded: events and dead letters deleted from this store
        recorded_at TIMESTAMPTZ NOT NULL,
        PRIMARY KEY (tenure_id, reason)
    )
    """,
    """
    CREATE TABLE handoff_notices (
        notice_id VARCHAR PRIMARY KEY,
        notice_offset BIGINT,  -- position in the handoff log; NULL once the log was lost (retired)
        kind VARCHAR NOT NULL,
        notice JSON NOT NULL,
        seen_at TIMESTAMPTZ NOT NULL
    )
    """,
)

# Several materializers write one lake (consumers.lake): no store keeps tenures or handoffs any more.
_RETIRE_SHARD_TABLES = (
    "DROP TABLE shard_identity",
    "DROP TABLE partition_tenures",
    "DROP TABLE offsets_elsewhere",
    "DROP TABLE handoff_notices",
)

# Claims of approvals (consumers.approvals.StoreClaims): created on first use before this step, so
# only when missing. One row per claim granted (the first row of an approval id is its claim).
CREATE_APPROVAL_CLAIMS: Final = """
CREATE TABLE IF NOT EXISTS approval_claims (
    approval_id VARCHAR NOT NULL,
    call_id VARCHAR,
    claimant VARCHAR,
    subject VARCHAR,
    decision_event_id VARCHAR,
    claimed_at TIMESTAMPTZ NOT NULL
)
"""

# The `calls` view counts only decisions that decide: an ApprovalResolved flagged unverified
# (UNVERIFIED_DECISION) written by another producer than the gate that asked approves and refuses
# nothing; the call shows it in `unverified_decision` (its answer and why it is not taken), so a
# call that ran on a forged approval reads as ran without a verified one. Plain text, no shared
# constants: a released step must never change.
_CALLS_WITHOUT_UNVERIFIED_DECISIONS = (
    """
    CREATE OR REPLACE VIEW calls AS
    WITH call_events AS (
        SELECT call_id, gate, workflow, agent, tool, tenant, principal, run_id, parent_call_id, trace_id, time,
               type, outcome, decided_by, message,
               type = 'ApprovalResolved' AND decided_by IS NOT NULL AND NOT bool_or(type = 'ApprovalRequested') OVER (
                   PARTITION BY call_id, producer_id,
                       CASE WHEN type IN ('ApprovalRequested', 'ApprovalResolved')
                            THEN json_extract_string(event, '$.approval_id') END
               ) AS unverified
        FROM events
        WHERE call_id IS NOT NULL
          AND type IN ('ToolUse', 'ToolDenied', 'Substitute', 'Blocked', 'ApprovalRequested', 'ApprovalResolved')
    )
    SELECT
        call_id,
        any_value(gate) AS gate,
        any_value(workflow) AS workflow,
        any_value(agent) AS agent,
        any_value(tool) AS tool,
        any_value(tenant) AS tenant,
        any_value(principal) AS principal,
        any_value(run_id) AS run_id,
        any_value(parent_call_id) AS parent_call_id,
        any_value(trace_id) AS trace_id,
        min(time) AS started_at,
        max(time) FILTER (WHERE type IN ('ToolUse', 'ToolDenied', 'Substitute', 'Blocked')) AS time,
        max(type) FILTER (WHERE type IN ('ToolUse', 'ToolDenied', 'Substitute', 'Blocked')) AS outcome_type,
        max(outcome) FILTER (WHERE type IN ('ToolUse', 'ToolDenied', 'Substitute', 'Blocked')) AS outcome,
        max(decided_by) FILTER (WHERE type IN ('ToolUse', 'ToolDenied', 'Substitute', 'Blocked')) AS decided_by,
        max(message) FILTER (WHERE type IN ('ToolUse', 'ToolDenied', 'Substitute', 'Blocked')) AS message,
        bool_or(type = 'ApprovalRequested') AS approval_asked,
        CASE WHEN bool_or(type = 'ApprovalResolved' AND NOT unverified)
             THEN bool_or(type = 'ApprovalResolved' AND NOT unverified AND outcome = 'approved') END AS approved,
        string_agg(outcome || ' (' || decided_by || ')', '; ' ORDER BY time) FILTER (WHERE unverified)
            AS unverified_decision,
        count(*) AS events
    FROM call_events
    GROUP BY call_id
    """,
)

MIGRATIONS: Final[tuple[Migration, ...]] = (
    Migration(1, "tables", (_CREATE_EVENTS, _CREATE_DEAD_LETTERS, _CREATE_OFFSETS, _CREATE_CHAIN_BREAKS)),
    Migration(2, "reader views", (_CREATE_BLOCKED_ATTEMPTS_VIEW, _CREATE_DECISION_TRENDS_VIEW, _CREATE_CALLS_VIEW)),
    Migration(3, "decision trail column", _ADD_TRAIL),
    Migration(4, "shadow mode columns", _ADD_SHADOW),
    Migration(5, "signed checkpoints", _ADD_CHECKPOINTS),
    Migration(6, "Merkle tree index", _ADD_TREE_INDEX, after=fold_all),
    Migration(7, "read access log", _ADD_ACCESS_LOG),
    Migration(8, "shard tenures and handoffs", _SHARD_TABLES),
    Migration(9, "archive", CREATE_ARCHIVE_TABLES),
    Migration(10, "event ids without an in-memory index", _EVENT_IDS_WITHOUT_INDEX),
    Migration(11, "event JSON compressed with zstd", _EVENT_JSON_ZSTD),
    Migration(12, "shard tables retired", _RETIRE_SHARD_TABLES),
    Migration(13, "approval claims", (CREATE_APPROVAL_CLAIMS,)),
    Migration(14, "calls count no unverified decision", _CALLS_WITHOUT_UNVERIFIED_DECISIONS),
)
"""The schema, in versioned steps applied in order, each once (recorded in `schema_migrations`).
Append a step to change it; never edit a released one."""

SCHEMA_VERSION: Final = MIGRATIONS[-1].version
"""The schema version this code writes and reads."""


@functools.cache
def lake_schema() -> tuple[str, ...]:
    """The statements that make a new lake's schema: the tables `MIGRATIONS` make in a file, column for
    column and in the same order, without what DuckLake lacks (keys, CHECK constraints, a column's
    compression; the store's statements hold what the keys held), and its views. A lake starts at
    `SCHEMA_VERSION`; steps appended later run on it as they are, so they must be SQL both homes run."""
    con = duckdb.connect(":memory:", config=_DUCKDB_CONFIG)
    try:
        con.execute(_CREATE_MIGRATIONS)
        for migration in MIGRATIONS:
            for statement in migration.statements:
                con.execute(statement)
            if migration.after is not None:
                migration.after(con)
        statements: list[str] = []
        tables = con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE NOT temporary AND NOT internal ORDER BY table_name"
        ).fetchall()
        for (table,) in tables:
            columns = con.execute(
                "SELECT column_name, data_type, is_nullable FROM duckdb_columns() WHERE table_name = $t "
                "AND database_name = current_database() ORDER BY column_index",
                {"t": table},
            ).fetchall()
            body = ", ".join(
                f"{_identifier(name)} {kind}{'' if nullable else ' NOT NULL'}" for name, kind, nullable in columns
            )
            statements.append(f"CREATE TABLE {_identifier(table)} ({body})")
        statements.extend(
            str(sql)
            for (sql,) in con.execute(
                "SELECT sql FROM duckdb_views() WHERE NOT temporary AND NOT internal ORDER BY view_name"
            ).fetchall()
        )
        return tuple(statements)
    finally:
        con.close()


def _create_lake_schema(con: duckdb.DuckDBPyConnection) -> None:
    """Make a new lake's schema (`lake_schema`) and record every migration as applied, unless another
    writer has done it first (their commits then conflict, and the loser runs this again)."""
    exists = con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE table_name = 'schema_migrations' AND database_name = $db",
        {"db": LAKE_ALIAS},
    ).fetchone()
    if exists and exists[0]:
        return
    for statement in lake_schema():
        con.execute(statement)
    # Row groups as small as the file's (`ROW_GROUP_ROWS`): DuckLake's default (122,880 rows) put a
    # whole bulk insert's events, their JSON 98 MB a row group, in one; two threads reading two of
    # them ran out of the store's 256 MB (bench/lake.py --queries-at 1000000: 9 of 35 named queries).
    con.execute(f"CALL {LAKE_ALIAS}.set_option('parquet_row_group_size', {ROW_GROUP_ROWS})")
    con.execute(_CREATE_LAKE_COMMITS)
    con.execute("INSERT INTO lake_commits VALUES (0)")
    for migration in MIGRATIONS:
        con.execute(
            "INSERT INTO schema_migrations VALUES ($version, $name, now())",
            {"version": migration.version, "name": migration.name},
        )


# A lake's one-row table that every write transaction updates (`AuditStore._in_transaction`). DuckLake
# finds a conflict only between transactions that change one table and at least one of which deletes
# or updates (inserts alone never conflict: two writers inserting the first offsets row of a partition,
# or the same gap, both committed, measured). Updating this row makes every two concurrent writes of
# the lake conflict, so the later one runs again on a fresh snapshot and sees what the first stored.
_CREATE_LAKE_COMMITS = "CREATE TABLE lake_commits (commits BIGINT NOT NULL)"
_COUNT_LAKE_COMMIT = "UPDATE lake_commits SET commits = commits + 1"


def _identifier(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


# -- ingest SQL ---------------------------------------------------------------------------------

# Arrow's canonical JSON extension type (pyarrow 19 and later); a plain string before, which DuckDB
# then casts to JSON like the other column.
_ARROW_JSON: Final = pa.json_(pa.string()) if hasattr(pa, "json_") else pa.string()
_INT32_MAX: Final = 2**31 - 1

# The Arrow schema of the staged events: the typed columns, plus where each came from (`ord`, its
# position in the batch, decides which of two events claiming one seq was first).
_STAGED_EVENT_SCHEMA: Final = pa.schema(
    [
        ("ord", pa.int64()),
        ("event_id", pa.string()),
        ("type", pa.string()),
        ("schema_version", pa.int32()),
        ("time", pa.timestamp("us", tz="UTC")),
        ("producer_id", pa.string()),
        ("seq", pa.int64()),
        ("hash", pa.string()),
        ("prev_hash", pa.string()),
        ("content_hash", pa.string()),
        ("gate", pa.string()),
        ("workflow", pa.string()),
        ("agent", pa.string()),
        ("tool", pa.string()),
        ("call_id", pa.string()),
        ("parent_call_id", pa.string()),
        ("run_id", pa.string()),
        ("thread_id", pa.string()),
        ("tenant", pa.string()),
        ("principal", pa.string()),
        ("trace_id", pa.string()),
        ("span_id", pa.string()),
        ("decided_by", pa.string()),
        ("outcome", pa.string()),
        ("message", pa.string()),
        ("duration_ms", pa.float64()),
        ("kafka_topic", pa.string()),
        ("kafka_partition", pa.int32()),
        ("kafka_offset", pa.int64()),
        ("event", pa.string()),
        ("trail", pa.list_(pa.string())),
        ("shadow_outcome", pa.string()),
        ("divergent", pa.bool_()),
        ("shadow_decided_by", pa.string()),
        ("shadow_rule", pa.string()),
        # The kept JSON of the events `events.fast_read` vouched for (strict JSON: no NaN, no surrogate
        # escapes), as Arrow's JSON type, which DuckDB takes as JSON without parsing it again; `event`
        # holds the others', cast (and so checked) by DuckDB as before. One of the two is null.
        ("event_json", _ARROW_JSON),
    ]
)

_STAGED_DEAD_SCHEMA: Final = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("reason", pa.string()),
        ("error", pa.string()),
        ("preview", pa.string()),
        ("kafka_time", pa.timestamp("ms", tz="UTC")),
    ]
)

_STAGED_OFFSETS_SCHEMA: Final = pa.schema(
    [("topic", pa.string()), ("partition", pa.int32()), ("next_offset", pa.int64())]
)

# Names under which the Arrow tables are registered on the write connection during one ingest.
_STAGED_EVENTS = "ingest_staged_events"
_STAGED_DEAD = "ingest_staged_dead"
_STAGED_OFFSETS = "ingest_staged_offsets"

# The stored events a batch can touch: for each producer in it, the seqs from one below its lowest
# to one above its highest. Every check below joins against these rows instead of `events`, so a
# batch costs the same whatever the table's size (DuckDB pushes the producer and seq bounds into the
# scan as filters).
_FIND_NEIGHBOURS = f"""
CREATE OR REPLACE TEMP TABLE ingest_near AS
WITH ranges AS (
    SELECT producer_id, min(seq) - 1 AS lo, max(seq) + 1 AS hi FROM {_STAGED_EVENTS} GROUP BY producer_id
)
SELECT e.producer_id, e.seq, e.event_id, e.hash, e.prev_hash, e.content_hash
FROM events e JOIN ranges r ON e.producer_id = r.producer_id AND e.seq BETWEEN r.lo AND r.hi
"""  # noqa: S608 (composed of module constants only; values are bound parameters)

# The stored events that carry one of the batch's event ids, wherever they are. A UUID id is found by
# `event_uuid` first: the join's min/max over the batch's ids (UUIDv7: milliseconds apart) skips every
# row group outside them, where a lookup by the text scanned every stored id. Other ids (and rows
# stored without `event_uuid`) are looked up by the text among the rows without one, which the row
# groups' null counts skip otherwise. An old id in a batch widens the range to a scan of the column.
# Two statements: as one UNION ALL, DuckDB built its hash table on the stored side, whose memory then
# grew with the store.
_FIND_STORED_IDS = (
    f"""
    CREATE OR REPLACE TEMP TABLE ingest_ids AS
    SELECT e.event_id, e.producer_id, e.seq FROM events e
    WHERE e.event_uuid IN (SELECT TRY_CAST(event_id AS UUID) FROM {_STAGED_EVENTS})
      AND e.event_id IN (SELECT event_id FROM {_STAGED_EVENTS})
    """,  # noqa: S608 (composed of module constants only)
    f"""
    INSERT INTO ingest_ids
    SELECT e.event_id, e.producer_id, e.seq FROM events e
    WHERE e.event_uuid IS NULL AND e.event_id IN (SELECT event_id FROM {_STAGED_EVENTS})
    """,  # noqa: S608 (composed of module constants only)
)

# Each staged event gets a verdict against its neighbours in the store and the rest of its batch:
# - 'duplicate': the same event (id, producer, seq, hash and content) is already stored;
# - 'conflict': another event holds its (producer_id, seq) or its event_id, stored or earlier in
#   the batch (the first one wins; the later one is recorded, never stored);
# - 'new': to be stored.
# A redelivery lands on the same (producer_id, seq) slot with the same content, so it is a duplicate
# there; another event at a stored slot, or with a stored event id anywhere in the store, is a
# conflict. Identical copies inside the batch collapse first, so a redelivery in one batch is a
# duplicate, not a conflict. The verdicts are worked out on the narrow key columns with aggregates
# (windows over them cost three times as much); the wide rows stay staged.
_CLASSIFY = f"""
CREATE OR REPLACE TEMP TABLE ingest_batch AS
WITH copies AS (
    SELECT min(ord) AS ord, event_id, producer_id, seq, hash, content_hash
    FROM {_STAGED_EVENTS}
    GROUP BY event_id, producer_id, seq, hash, content_hash
),
slot_firsts AS (
    SELECT producer_id, seq, min(ord) AS first_ord, arg_min(event_id, ord) AS first_id
    FROM copies GROUP BY producer_id, seq
),
id_firsts AS (SELECT event_id, min(ord) AS first_ord FROM copies GROUP BY event_id),
candidates AS (
    SELECT c.*,
           by_slot.event_id AS slot_event_id,
           by_slot.hash = c.hash AND by_slot.content_hash = c.content_hash AS slot_same_content,
           by_id.producer_id AS id_producer_id,
           by_id.seq AS id_seq,
           c.ord > sf.first_ord AS later_at_slot,
           sf.first_id AS slot_first_id,
           c.ord > idf.first_ord AS later_with_id
    FROM copies c
    JOIN slot_firsts sf ON sf.producer_id = c.producer_id AND sf.seq = c.seq
    JOIN id_firsts idf ON idf.event_id = c.event_id
    LEFT JOIN ingest_near by_slot ON by_slot.producer_id = c.producer_id AND by_slot.seq = c.seq
    LEFT JOIN ingest_ids by_id ON by_id.event_id = c.event_id
),
judged AS (
    SELECT c.*, s.type, s.time, s.prev_hash,
           s.kafka_topic || '/' || s.kafka_partition || '/' || s.kafka_offset AS position
    FROM candidates c JOIN {_STAGED_EVENTS} s USING (ord)
)
SELECT ord, event_id, producer_id, seq, hash, prev_hash, content_hash, type, time,
    CASE
        WHEN slot_event_id = event_id AND slot_same_content THEN 'duplicate'
        WHEN slot_event_id IS NOT NULL OR id_producer_id IS NOT NULL OR later_at_slot OR later_with_id THEN 'conflict'
        ELSE 'new'
    END AS verdict,
    CASE
        WHEN slot_event_id = event_id AND slot_same_content THEN NULL
        WHEN slot_event_id IS NOT NULL THEN
            'event ' || event_id || ' (offset ' || position || ') differs from the stored event '
            || slot_event_id || ' at this seq; the stored one is kept'
        WHEN id_producer_id IS NOT NULL THEN
            'event id ' || event_id || ' (offset ' || position || ') is already stored for producer '
            || id_producer_id || ' seq ' || id_seq || '; this copy claims another place'
        WHEN later_at_slot THEN
            'event ' || event_id || ' (offset ' || position || ') differs from event ' || slot_first_id
            || ' delivered first at this seq; the first is kept'
        WHEN later_with_id THEN
            'event id ' || event_id || ' (offset ' || position || ') was delivered earlier in the batch '
            || 'with other content or place'
    END AS conflict_detail
FROM judged
"""  # noqa: S608 (composed of module constants only; values are bound parameters)

# The common batch: no event id or (producer_id, seq) twice in it (`StagedBatch.distinct`), none of
# its slots stored (`_CLASHES` counts them among its neighbours) and none of its ids stored (nor
# among `_FIND_STORED_IDS`'s). Every verdict of `_CLASSIFY` is then 'new' without a detail, which
# `_ALL_NEW` writes at a fifth of its cost.
_CLASHES = f"""
SELECT (SELECT count(*) FROM {_STAGED_EVENTS} s JOIN ingest_near n ON n.producer_id = s.producer_id AND n.seq = s.seq)
     + (SELECT count(*) FROM ingest_ids)
"""  # noqa: S608 (composed of module constants only; values are bound parameters)

_ALL_NEW = f"""
CREATE OR REPLACE TEMP TABLE ingest_batch AS
SELECT ord, event_id, producer_id, seq, hash, prev_hash, content_hash, type, time,
       'new' AS verdict, CAST(NULL AS VARCHAR) AS conflict_detail
FROM {_STAGED_EVENTS}
"""  # noqa: S608 (composed of module constants only; values are bound parameters)

# One pass for both the verdict counts and the new events' breakdown.
_BATCH_SUMMARY = "SELECT verdict, type, count(*), max(time) FROM ingest_batch GROUP BY verdict, type"

# The verdicts decide alone: each 'new' event has an id and a slot no stored or earlier event holds.
# No ORDER BY: the staged rows are in batch order and DuckDB keeps the scan's order on insert
# (`preserve_insertion_order`); sorting the wide rows cost a fifth of the insert.
_INSERT_EVENTS = f"""
INSERT INTO events BY NAME
SELECT s.* EXCLUDE (ord, event, event_json), coalesce(s.event_json, s.event::JSON) AS event, now() AS ingested_at,
       TRY_CAST(s.event_id AS UUID) AS event_uuid
FROM {_STAGED_EVENTS} s
WHERE s.ord IN (SELECT ord FROM ingest_batch WHERE verdict = 'new')
"""  # noqa: S608 (composed of module constants only; values are bound parameters)

# Keys hold in SQL both homes run (a DuckLake has no keys): what a key would refuse is left out by
# the statement itself. The new dead letters, each position once (the first of the batch's copies).
_NEW_DEAD_LETTERS = f"""
CREATE OR REPLACE TEMP TABLE ingest_dead AS
SELECT * FROM {_STAGED_DEAD} s
WHERE NOT EXISTS (
    SELECT 1 FROM dead_letters d WHERE d.topic = s.topic AND d.partition = s.partition AND d."offset" = s."offset"
)
QUALIFY row_number() OVER (PARTITION BY s.topic, s.partition, s."offset") = 1
"""  # noqa: S608 (composed of module constants only; values are bound parameters)

_INSERT_DEAD_LETTERS = """
INSERT INTO dead_letters (topic, partition, "offset", key, value, reason, error, preview, kafka_time, received_at)
SELECT topic, partition, "offset", key, value, reason, error, preview, kafka_time, now() FROM ingest_dead
"""

# What the store holds for the batch's partitions, read in the batch's transaction: the fence
# (`StoreFencedError`) compares it with what this store last read or wrote.
_HELD_OFFSETS = f"""
SELECT o.topic, o.partition, o.next_offset FROM kafka_offsets o
JOIN {_STAGED_OFFSETS} s ON s.topic = o.topic AND s.partition = o.partition
"""  # noqa: S608 (composed of module constants only; values are bound parameters)

# `updated_at` is when the offset last moved, so a redelivered batch leaves the row as it was. An
# update, then the partitions without a row: in a lake the update is what the lake's conflict check
# sees, so of two writers that read the same offsets only the first to commit succeeds.
_UPDATE_OFFSETS = f"""
UPDATE kafka_offsets SET next_offset = s.next_offset, updated_at = now()
FROM {_STAGED_OFFSETS} s
WHERE kafka_offsets.topic = s.topic AND kafka_offsets.partition = s.partition
  AND kafka_offsets.next_offset <> s.next_offset
"""  # noqa: S608 (composed of module constants only; values are bound parameters)

_INSERT_OFFSETS = f"""
INSERT INTO kafka_offsets (topic, partition, next_offset, updated_at)
SELECT s.topic, s.partition, s.next_offset, now() FROM {_STAGED_OFFSETS} s
WHERE NOT EXISTS (SELECT 1 FROM kafka_offsets o WHERE o.topic = s.topic AND o.partition = s.partition)
"""  # noqa: S608 (composed of module constants only; values are bound parameters)

# A gap closes when its event arrives.
# A loss report (events.loss) is a gap its sink saw: recorded at once, no grace, at the first seq
# of its range that is not stored (nothing when all are: they reached Kafka after all). The range
# is read at most MAX_GAP_ROWS_PER_HOLE seqs deep, as a hole is.
_INSERT_REPORTED_GAP = f"""
INSERT INTO chain_breaks (producer_id, seq, kind, detail, event_id, evidence, recorded_at)
SELECT $producer_id, g.seq, 'gap', $detail, NULL, $evidence::JSON, now()
FROM (
    SELECT min(r.seq) AS seq
    FROM range($first_seq, least($last_seq, $first_seq + {MAX_GAP_ROWS_PER_HOLE - 1}) + 1) AS r(seq)
    WHERE NOT EXISTS (SELECT 1 FROM events WHERE producer_id = $producer_id AND seq = r.seq)
    HAVING min(r.seq) IS NOT NULL
) g
WHERE NOT EXISTS (SELECT 1 FROM chain_breaks b WHERE b.producer_id = $producer_id AND b.seq = g.seq AND b.kind = 'gap')
"""  # noqa: S608 (composed of module constants only; values are bound parameters)

_QUEUE_CHECKPOINTS = """
INSERT INTO checkpoint_pending
SELECT event_id, producer_id, seq FROM ingest_batch b
WHERE verdict = 'new' AND type = 'Checkpoint'
  AND NOT EXISTS (SELECT 1 FROM checkpoint_pending p WHERE p.event_id = b.event_id)
"""

# Producers whose tree index (consumers.proofs) the batch extends: those with a checkpoint.
_INDEXED_PRODUCERS = """
SELECT DISTINCT b.producer_id FROM ingest_batch b
WHERE b.verdict = 'new' AND (b.type = 'Checkpoint' OR b.producer_id IN (SELECT producer_id FROM checkpoint_state))
ORDER BY 1
"""

_DELETE_FILLED_GAPS = """
DELETE FROM chain_breaks AS b
WHERE b.kind = 'gap'
  AND EXISTS (SELECT 1 FROM ingest_batch n WHERE n.verdict = 'new' AND n.producer_id = b.producer_id AND n.seq = b.seq)
"""

# What the new events reveal about their chains: their own hash, the seq-1 link, the link to them
# from a stored seq+1, and conflicts. The links are looked for among the batch's neighbours (the
# stored ones and the new events themselves), never in the whole table. A pair inside one batch is
# found from both sides; DISTINCT keeps one detail.
_FIND_BREAKS = f"""
CREATE OR REPLACE TEMP TABLE ingest_findings AS
WITH chain AS (
    SELECT producer_id, seq, hash, prev_hash FROM ingest_near
    UNION ALL
    SELECT producer_id, seq, hash, prev_hash FROM ingest_batch WHERE verdict = 'new'
)
SELECT producer_id, seq, kind, string_agg(DISTINCT detail, '; ' ORDER BY detail) AS detail,
       min(event_id) AS event_id, any_value(evidence) AS evidence
FROM (
    SELECT b.producer_id, b.seq, 'conflict' AS kind, b.conflict_detail AS detail, b.event_id,
           coalesce(CAST(s.event_json AS VARCHAR), s.event) AS evidence
    FROM ingest_batch b JOIN {_STAGED_EVENTS} s USING (ord) WHERE b.verdict = 'conflict'
    UNION ALL
    SELECT producer_id, seq, 'tamper', 'hash does not match the content (recomputed ' || content_hash || ')',
           event_id, NULL
    FROM ingest_batch WHERE verdict = 'new' AND hash <> content_hash
    UNION ALL
    SELECT producer_id, seq, 'tamper', 'seq 1 must have prev_hash of 64 zeros', event_id, NULL
    FROM ingest_batch WHERE verdict = 'new' AND seq = 1 AND prev_hash <> '{ZERO_HASH}'
    UNION ALL
    SELECT n.producer_id, n.seq, 'tamper', 'prev_hash does not link to the hash of seq ' || p.seq, n.event_id, NULL
    FROM ingest_batch n JOIN chain p ON p.producer_id = n.producer_id AND p.seq = n.seq - 1
    WHERE n.verdict = 'new' AND n.prev_hash <> p.hash
    UNION ALL
    SELECT x.producer_id, x.seq, 'tamper', 'prev_hash does not link to the hash of seq ' || n.seq, x.event_id, NULL
    FROM ingest_batch n JOIN ingest_near x ON x.producer_id = n.producer_id AND x.seq = n.seq + 1
    WHERE n.verdict = 'new' AND x.prev_hash <> n.hash
)
GROUP BY producer_id, seq, kind
"""  # noqa: S608 (composed of module constants only; values are bound parameters)

_COUNT_NEW_BREAKS = """
SELECT kind, count(*) FROM ingest_findings f
WHERE NOT EXISTS (
    SELECT 1 FROM chain_breaks b WHERE b.producer_id = f.producer_id AND b.seq = f.seq AND b.kind = f.kind
)
GROUP BY kind
"""

# A break already recorded keeps its first detail; a new finding about it is appended once.
_UPSERT_BREAKS = (
    """
    UPDATE chain_breaks SET detail = chain_breaks.detail || '; ' || f.detail
    FROM ingest_findings f
    WHERE chain_breaks.producer_id = f.producer_id AND chain_breaks.seq = f.seq AND chain_breaks.kind = f.kind
      AND NOT contains(chain_breaks.detail, f.detail)
    """,
    """
    INSERT INTO chain_breaks (producer_id, seq, kind, detail, event_id, evidence, recorded_at)
    SELECT producer_id, seq, kind, detail, event_id, evidence::JSON, now() FROM ingest_findings f
    WHERE NOT EXISTS (
        SELECT 1 FROM chain_breaks b WHERE b.producer_id = f.producer_id AND b.seq = f.seq AND b.kind = f.kind
    )
    """,
)

_DROP_BATCH = (
    "DROP TABLE IF EXISTS ingest_near; DROP TABLE IF EXISTS ingest_ids; DROP TABLE IF EXISTS ingest_batch; "
    "DROP TABLE IF EXISTS ingest_findings; DROP TABLE IF EXISTS ingest_dead"
)

# Holes per producer between 1 and its highest stored seq. With a grace time, a hole counts only
# once both neighbours (the one neighbour, for a hole at the start) were stored before it: the
# missing event may still be on its way through another partition.
_RECORD_GAPS = f"""
INSERT INTO chain_breaks (producer_id, seq, kind, detail, event_id, evidence, recorded_at)
WITH archived AS (
    -- Seqs moved to the archive (consumers.archive) are not missing: each file's range per producer
    -- stands in by its two ends, and the span between the ends of one range is no hole.
    SELECT s.producer_id, s.first_seq, s.last_seq, f.archived_at, s.path
    FROM archive_segments s JOIN archive_files f USING (path)
),
present AS (
    SELECT producer_id, seq, ingested_at, NULL::VARCHAR AS segment FROM events
    UNION ALL SELECT producer_id, first_seq, archived_at, path FROM archived
    UNION ALL SELECT producer_id, last_seq, archived_at, path FROM archived WHERE last_seq > first_seq
),
ordered AS (
    SELECT producer_id, seq, ingested_at, segment,
           lag(seq, 1, 0) OVER w AS prev_seq,
           lag(ingested_at) OVER w AS prev_ingested_at,
           lag(segment) OVER w AS prev_segment
    FROM present
    WINDOW w AS (PARTITION BY producer_id ORDER BY seq)
),
holes AS (
    SELECT producer_id, prev_seq + 1 AS first_missing, seq - 1 AS last_missing
    FROM ordered
    WHERE seq > prev_seq + 1
      AND (segment IS NULL OR prev_segment IS NULL OR segment <> prev_segment)
      AND ($older_than IS NULL
           OR (ingested_at < $older_than AND (prev_ingested_at IS NULL OR prev_ingested_at < $older_than)))
)
SELECT producer_id, missing AS seq, 'gap',
       CASE WHEN first_missing = last_missing THEN 'seq ' || first_missing || ' is missing'
            ELSE 'seqs ' || first_missing || '..' || last_missing || ' are missing ('
                 || (last_missing - first_missing + 1) || ' events)' END,
       NULL, NULL, now()
FROM (
    SELECT *, unnest(range(first_missing, least(last_missing, first_missing + {MAX_GAP_ROWS_PER_HOLE - 1}) + 1))
              AS missing
    FROM holes
) h
WHERE NOT EXISTS (
    SELECT 1 FROM chain_breaks b WHERE b.producer_id = h.producer_id AND b.seq = h.missing AND b.kind = 'gap'
)
"""  # noqa: S608 (composed of module constants only; values are bound parameters)

_COUNT_EVENTS = "SELECT type, count(*) FROM events GROUP BY type ORDER BY type"
_COUNT_DEAD = "SELECT reason, count(*) FROM dead_letters GROUP BY reason ORDER BY reason"
_COUNT_BREAKS = "SELECT kind, count(*) FROM chain_breaks GROUP BY kind ORDER BY kind"
_LAST_EVENT_TIME = "SELECT max(time) FROM events"
_OFFSETS = "SELECT partition, next_offset FROM kafka_offsets WHERE topic = $topic ORDER BY partition"
_RESET_PARTITION = "DELETE FROM kafka_offsets WHERE topic = $topic AND partition = $partition"


# -- the store ----------------------------------------------------------------------------------


class AuditStore:
    """The DuckDB file the materializer writes and readers read.

    Opening for writing applies pending migrations; `read_only=True` applies none and refuses a file
    whose schema is older or newer than `SCHEMA_VERSION`. Opening raises `StoreLockedError` when
    another process holds the file for writing (DuckDB then lets nobody else in, not even a reader),
    and `StoreError` for a schema this code cannot use.

    Thread-safety: the methods of one store may be called from any threads. Writes are serialized
    by a lock (one ingest at a time), and `counts`, `offsets` and `schema_version` share the
    writer's connection, so they wait for a running ingest; `cursor()` hands a reader a connection
    of its own that never waits (it sees the last committed batch). Every method blocks for its
    DuckDB work (milliseconds; under a second for a batch of 10,000 records, half of it parsing);
    call it off the event loop.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | Lake,
        *,
        read_only: bool = False,
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
        trusted_keys: Mapping[str, VerifyingKey] | None = None,
        require_signed: bool = False,
        table_cache_bytes: int | None = DEFAULT_TABLE_CACHE_BYTES,
        decision_keys: Mapping[str, VerifyingKey] | None = None,
    ) -> None:
        if max_value_bytes < 1:
            raise ValueError(f"max_value_bytes must be positive, got {max_value_bytes}")
        if require_signed and not trusted_keys:
            raise ValueError("require_signed needs trusted_keys")
        self.checkpoint_verifier = (
            CheckpointVerifier(trusted_keys, require_signed=require_signed) if trusted_keys else None
        )
        self.decision_keys = dict(decision_keys) if decision_keys else None
        """The desk's public keys (key id -> key): an `ApprovalResolved` not signed by one of them is
        stored flagged (see `UNVERIFIED_DECISION`); None: decisions are not checked."""
        """Verifies the stored checkpoints after each ingest (None without `trusted_keys`)."""
        if isinstance(path, Lake) and path.as_of is not None and not read_only:
            raise StoreError(f"{path} is a past snapshot: open it read-only")
        self.lake = path if isinstance(path, Lake) else None
        """The lake this store lives in (`consumers.lake`), or None for a DuckDB file."""
        self.path = str(path) if isinstance(path, Lake) else str(Path(path))
        """The file's path, or the lake's description (for messages)."""
        self.read_only = read_only
        self.commit_conflicts = 0
        """Lake commits refused for a conflict with another writer's and run again (`_in_transaction`)."""
        self.turns = WriterTurns(self.lake) if self.lake is not None and not read_only else None
        """How this store's lake writes take turns with other writers' (`consumers.lake.WriterTurns`),
        or None (a DuckDB file, or read-only)."""
        # Per topic, the offsets this store last read (`offsets`) or wrote: what the fence expects.
        self._known_offsets: dict[str, dict[int, int]] = {}
        self._lake_ready = False
        self.max_value_bytes = max_value_bytes
        if table_cache_bytes is not None and table_cache_bytes < 0:
            raise ValueError(f"table_cache_bytes must not be negative, got {table_cache_bytes}")
        self.table_cache_bytes = table_cache_bytes
        """After an ingest whose store holds more than twice this many bytes of table blocks in
        DuckDB's buffer pool, the excess over it is evicted (`_trim_cache`); None: never."""
        self._write_lock = threading.Lock()
        self._cursor_lock = threading.Lock()
        # The root connection only hands out cursors; the store writes through a cursor of its own,
        # so opening a reader never waits for an ingest holding the writer.
        self._root = connect(self.lake or self.path, read_only=read_only)
        try:
            self._setup = session_setup(self._root)
            self._con = self._root.cursor()
            self._con.execute(self._setup).fetchall()
            self._migrate()
        except BaseException:
            self._root.close()
            if self.turns is not None:
                self.turns.close()
            raise

    # -- lifecycle ------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the store and every cursor it handed out, and release the file's lock; idempotent."""
        with self._write_lock, self._cursor_lock:
            self._root.close()
            if self.turns is not None:
                self.turns.close()

    def __enter__(self) -> AuditStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A new connection to the same database, for one reader thread (DuckDB connections are not
        safe to share between threads; cursors are cheap). It sees every committed ingest, uses UTC,
        and is closed by `close()`. Raises DuckDB's `ConnectionException` after `close()`."""
        with self._cursor_lock:
            con = self._root.cursor()
        con.execute(self._setup).fetchall()
        return con

    def schema_version(self) -> int:
        """The newest migration applied to the file (0 for a file without the version table)."""
        with self._write_lock:
            return self._schema_version()

    def _schema_version(self) -> int:
        exists = self._con.execute(
            "SELECT count(*) FROM duckdb_tables() WHERE table_name = 'schema_migrations' AND NOT temporary"
        ).fetchone()
        if not exists or not exists[0]:
            return 0
        row = self._con.execute("SELECT coalesce(max(version), 0) FROM schema_migrations").fetchone()
        return int(row[0]) if row else 0

    def _migrate(self) -> None:
        current = self._schema_version()
        if current > SCHEMA_VERSION:
            raise StoreError(
                f"{self.path} has schema version {current}, newer than {SCHEMA_VERSION} (the newest this code "
                "knows); use a newer callgate to read it"
            )
        if self.read_only:
            if current < SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path} has schema version {current}, older than {SCHEMA_VERSION}; open it for writing "
                    "once (the materializer does) to migrate it"
                )
            return
        if self.lake is not None:
            with self._write_lock:
                self._in_transaction(_create_lake_schema)
            self._lake_ready = True
        else:
            self._con.execute(_CREATE_MIGRATIONS)
        # By version applied, not by the newest: a file migrated by a build that had step 9 but not yet
        # step 8 (they were written side by side) still gets step 8.
        applied = {int(v) for (v,) in self._con.execute("SELECT version FROM schema_migrations").fetchall()}
        for migration in MIGRATIONS:
            if migration.version in applied:
                continue
            self._con.begin()
            try:
                for statement in migration.statements:
                    self._con.execute(statement)
                if migration.after is not None:
                    migration.after(self._con)
                self._con.execute(
                    "INSERT INTO schema_migrations VALUES ($version, $name, now())",
                    {"version": migration.version, "name": migration.name},
                )
                self._con.commit()
            except BaseException:
                with contextlib.suppress(duckdb.Error):
                    self._con.rollback()
                raise

    def _require_writable(self, what: str) -> None:
        if self.read_only:
            raise StoreError(f"{what} needs a writable store; {self.path} was opened read-only")

    # -- writing --------------------------------------------------------------------------------

    def ingest(self, records: Sequence[KafkaRecord], offsets: Mapping[tuple[str, int], int]) -> IngestResult:
        """Store a batch of Kafka records and the offsets it reached, in one transaction.

        Each record's value is parsed (`events.parse_event`); an event is stored once (its
        `event_id` is the key, and its (producer_id, seq) slot holds one event); anything else
        becomes a dead letter keyed by (topic, partition, offset) with one of `DEAD_LETTER_REASONS`:
        no value (None or empty), a value over `max_value_bytes`, `EventParseError` (by its kind),
        an envelope that disagrees with the event, or any other error while reading it. `offsets`
        maps (topic, partition) to the next offset to read; they are upserted in the same
        transaction. Then the chains of the new events are checked against their stored
        neighbours: a hash that does not match the content, a `prev_hash` that does not link
        (either side), seq 1 not starting from 64 zeros, and conflicts (another event at a stored
        (producer, seq), or with a stored event id or that of an event earlier in the batch: the
        first stays, the later one is recorded in `chain_breaks` with its JSON as `evidence`, and
        not stored). Gaps are not recorded here (another partition may still fill them; see
        `close_open_gaps`), but a recorded gap that this batch fills is removed. A loss report
        (`events.loss`: a sink found events a dead process never spooled) records a gap at its
        first seq at once, unless that event is stored. New `Checkpoint` events are queued; with
        `trusted_keys`, every queued checkpoint whose events are all stored is verified in the same
        transaction (`consumers.checkpoints`) and its findings count in `chain_breaks`.

        The envelope is what a `KafkaSink` writes around an event: the key is its `producer_id`, the
        CloudEvents header `ce_id` its `event_id`, `ce_type` the prefix `dev.callgate.` and its
        `type`. Every record must have a key, and the key must be the producer_id (it decides the
        partition that keeps the producer's chain in order); each of `ce_id` and `ce_type` it
        carries (every copy, when a name repeats) must match; an absent header is not checked (a
        hand-made producer may send none). A mismatch is the dead letter
        `envelope_mismatch`, its error naming each field that disagreed with both values (the
        record's key stays in the row). Loss reports (`events.loss`) are not events and are not
        checked.

        Idempotent: the same records again change nothing. Raises `StoreError` on a read-only store,
        and re-raises whatever went wrong inside the transaction (a negative offset, a closed store)
        after rolling it back: then nothing of the batch is stored, offsets included. Blocks;
        serialized with the store's other writes. The same as `ingest_staged(stage(records), offsets)`.
        """
        self._require_writable("ingest")
        return self.ingest_staged(self.stage(records), offsets)

    def stage(self, records: Sequence[KafkaRecord]) -> StagedBatch:
        """Read a batch of records into what `ingest_staged` stores: every value parsed and checked
        (events, dead letters with their reasons, envelopes, loss reports), nothing written.

        Pure Python (it holds the GIL throughout), no lock, no DuckDB: the materializer stages the
        next batch while DuckDB writes the previous one. Never raises for a bad record (that is a dead
        letter); safe from any thread."""
        staged, dead, losses = self._stage(records)
        ids, slots = (
            staged.column("event_id"),
            pa.Table.from_arrays([staged.column("producer_id"), staged.column("seq")], names=["p", "s"]),
        )
        distinct = len(ids.unique()) == len(ids) and slots.group_by(["p", "s"]).aggregate([]).num_rows == len(ids)
        return StagedBatch(staged, dead, tuple(losses), len(records), distinct)

    def ingest_staged(self, batch: StagedBatch, offsets: Mapping[tuple[str, int], int]) -> IngestResult:
        """The DuckDB half of `ingest`: store a batch `stage` made and the offsets it reached, in one
        transaction, with everything `ingest` says (verdicts, chain checks, gaps, checkpoints).

        DuckDB releases the GIL while it works, so other threads run meanwhile. Raises as `ingest`
        does, after rolling back; blocks; serialized with the store's other writes."""
        self._require_writable("ingest")
        return self._write(batch, offsets)

    def _write(self, batch: StagedBatch, offsets: Mapping[tuple[str, int], int]) -> IngestResult:
        """One transaction. A batch of distinct events none of whose slots or ids is stored is judged
        all new (`_ALL_NEW`); any other, event by event (`_CLASSIFY`)."""
        with self._write_lock:
            con = self._con
            try:
                con.register(_STAGED_EVENTS, batch.events)
                con.register(_STAGED_DEAD, batch.dead)
                summary, stored, dead_reasons, reported, new_breaks = self._in_transaction(
                    lambda con: self._write_once(con, batch, offsets)
                )
            finally:
                for name in (_STAGED_EVENTS, _STAGED_DEAD, _STAGED_OFFSETS):
                    _unregister(con, name)
            for (topic, partition), next_offset in offsets.items():
                self._known_offsets.setdefault(topic, {})[partition] = next_offset
            self._trim_cache(con)
        conflicts = sum(int(n) for verdict, _, n, _ in summary if verdict == "conflict")
        new_by_type = [(str(kind), int(n), last) for verdict, kind, n, last in summary if verdict == "new"]
        dead_letters = sum(dead_reasons.values())
        if reported:
            new_breaks["gap"] = new_breaks.get("gap", 0) + reported
        return IngestResult(
            stored=stored,
            duplicates=batch.records - stored - dead_letters - conflicts - reported,
            dead_letters=dead_letters,
            chain_breaks=sum(new_breaks.values()),
            stored_by_type={kind: n for kind, n, _ in new_by_type},
            dead_letters_by_reason=dict(dead_reasons),
            chain_breaks_by_kind=new_breaks,
            last_event_time=max((last for _, _, last in new_by_type), default=None),
        )

    def _write_once(
        self, con: duckdb.DuckDBPyConnection, batch: StagedBatch, offsets: Mapping[tuple[str, int], int]
    ) -> tuple[list[Any], int, Counter[str], int, dict[str, int]]:
        """One attempt of `_write`, inside its transaction (the staged tables registered): the batch
        summary, events stored, new dead letters by reason, reported gaps and new chain breaks."""
        dead, losses = batch.dead, batch.losses
        con.execute(_FIND_NEIGHBOURS)
        for statement in _FIND_STORED_IDS:
            con.execute(statement)
        common = batch.distinct and not _count(con.execute(_CLASHES))
        con.execute(_ALL_NEW if common else _CLASSIFY)
        summary = con.execute(_BATCH_SUMMARY).fetchall()
        new_types = {kind for verdict, kind, _, _ in summary if verdict == "new"}
        stored = _count(con.execute(_INSERT_EVENTS))
        queued = _count(con.execute(_QUEUE_CHECKPOINTS)) if "Checkpoint" in new_types else 0
        dead_reasons: Counter[str] = Counter()
        if dead.num_rows:
            con.execute(_NEW_DEAD_LETTERS)
            dead_reasons.update(str(row[0]) for row in con.execute("SELECT reason FROM ingest_dead").fetchall())
            con.execute(_INSERT_DEAD_LETTERS)
        # Built inside the transaction on purpose: a bad mapping fails here and rolls back the events
        # above with it.
        con.register(_STAGED_OFFSETS, _offsets_table(offsets))
        self._fence(con, offsets)
        con.execute(_UPDATE_OFFSETS)
        con.execute(_INSERT_OFFSETS)
        con.execute(_DELETE_FILLED_GAPS)
        reported = 0
        for report in losses:
            # A gap at the first reported seq that is not stored, if any.
            reported += _count(
                con.execute(
                    _INSERT_REPORTED_GAP,
                    {
                        "producer_id": report.producer_id,
                        "first_seq": report.first_seq,
                        "last_seq": report.last_seq,
                        "detail": report.detail(),
                        "evidence": encode_loss_report(report).decode(),
                    },
                )
            )
        new_breaks: dict[str, int] = {}
        if _count(con.execute(_FIND_BREAKS)):
            new_breaks = {str(kind): int(n) for kind, n in con.execute(_COUNT_NEW_BREAKS).fetchall()}
            for statement in _UPSERT_BREAKS:
                con.execute(statement)
        if stored:
            fold(con, [str(p) for (p,) in con.execute(_INDEXED_PRODUCERS).fetchall()])
        con.execute(_DROP_BATCH)
        verifier = self.checkpoint_verifier
        if verifier is not None and (queued or stored):
            # Queued ones wait for their events: any newly stored event may complete one.
            for kind, n in verifier.verify_pending(con).items():
                new_breaks[kind] = new_breaks.get(kind, 0) + n
        return summary, stored, dead_reasons, reported, new_breaks

    def _fence(self, con: duckdb.DuckDBPyConnection, offsets: Mapping[tuple[str, int], int]) -> None:
        """Raise `StoreFencedError` when the store holds other offsets for the batch's partitions than
        this store last read (`offsets`) or wrote: another writer stored them meanwhile. Partitions of
        a topic this store never read nor wrote are not checked."""
        held = {(str(t), int(p)): int(o) for t, p, o in con.execute(_HELD_OFFSETS).fetchall()}
        moved: dict[tuple[str, int], tuple[int | None, int | None]] = {}
        for key in offsets:
            known = self._known_offsets.get(key[0])
            if known is not None and held.get(key) != known.get(key[1]):
                moved[key] = (known.get(key[1]), held.get(key))
        if moved:
            raise StoreFencedError(self.path, moved)

    def _in_transaction(self, work: Callable[[duckdb.DuckDBPyConnection], _T]) -> _T:
        """Run `work` on the write connection in one transaction (the caller holds the write lock);
        rolled back and re-raised when it raises. In a lake, a commit refused for a conflict with
        another writer's (DuckLake's own check: any two transactions that change one table) is run
        again from the start on a fresh snapshot, up to `MAX_COMMIT_ATTEMPTS` times: `work` must be
        repeatable, and sees what the other writer committed (the offsets fence included). Each attempt
        first waits for its turn among the lake's writers (`turns`), so that overlapping writes are rare."""
        attempt = 0
        while True:
            con = self._con
            with self.turns.turn() if self.turns is not None else contextlib.nullcontext():
                con.begin()
                try:
                    if self.lake is not None and self._lake_ready:
                        con.execute(_COUNT_LAKE_COMMIT)
                    result = work(con)
                    con.commit()
                    return result
                except duckdb.TransactionException as exc:
                    with contextlib.suppress(duckdb.Error):
                        con.rollback()
                    attempt += 1
                    if self.lake is None or "conflict" not in str(exc).lower() or attempt >= MAX_COMMIT_ATTEMPTS:
                        raise
                    self.commit_conflicts += 1
                except BaseException:
                    # The original error says what went wrong; a failing rollback (a dead connection)
                    # must not replace it, and DuckDB discards the open transaction anyway.
                    with contextlib.suppress(duckdb.Error):
                        con.rollback()
                    raise
            # Jitter outside the turn, so that writers refused together do not collide again in step.
            time.sleep(random.uniform(0, min(0.05, 0.001 * 2**attempt)))

    def _trim_cache(self, con: duckdb.DuckDBPyConnection) -> None:
        """Evict what the buffer pool holds of the tables' blocks beyond `table_cache_bytes`, once it
        holds more than twice that (the writer's connection, under the write lock, after a commit).

        DuckDB keeps every block a checkpoint writes in its buffer pool until it needs the room, and
        has no setting to bound that cache: a materializer's memory grew with its store until the pool
        reached `memory_limit` (peak RSS 1.40 times as much at 1,000,000 events as at 50,000, at the
        default 256 MB). Lowering the limit for a moment makes DuckDB evict blocks down to it (blocks
        of the file first: they are on disk already, so nothing is written), and the limit is put back
        at once. The blocks are read again from the file (the system's page cache) when a query needs
        them. While the limit is lowered, for a few milliseconds, a reader of the same store can take
        only what the cache still holds (`table_cache_bytes`) beyond what it had; blocks that readers
        hold pinned are not evicted, and a trim that cannot reach its target leaves things as they are."""
        budget = self.table_cache_bytes
        if budget is None:
            return
        row = con.execute(_POOL_USAGE).fetchone()
        cached, used = (int(row[0] or 0), int(row[1] or 0)) if row is not None else (0, 0)
        if cached <= 2 * budget:
            return
        try:
            con.execute(f"SET memory_limit = '{used - (cached - budget)}B'").fetchall()
        except duckdb.OutOfMemoryException:
            pass  # readers hold too much pinned: nothing evicted, the next ingest tries again
        finally:
            con.execute(f"SET memory_limit = '{_DUCKDB_CONFIG['memory_limit']}'").fetchall()

    def _stage(self, records: Sequence[KafkaRecord]) -> tuple[pa.Table, pa.Table, list[LossReport]]:
        """Parse the records into the Arrow tables of events and dead letters, and the loss reports
        (pure Python, no lock)."""
        rows: list[tuple[Any, ...]] = []
        dead: dict[str, list[Any]] = {name: [] for name in _STAGED_DEAD_SCHEMA.names}
        losses: list[LossReport] = []
        for ord_, record in enumerate(records):
            value = record.value
            if value is None:
                _add_dead(dead, record, "no_value", "the record has no value (a tombstone)")
                continue
            if not value:
                _add_dead(dead, record, "no_value", "the record's value is empty (0 bytes)")
                continue
            if len(value) > self.max_value_bytes:
                _add_dead(
                    dead,
                    record,
                    "oversize",
                    f"the value has {len(value)} bytes, over max_value_bytes={self.max_value_bytes}; not parsed",
                )
                continue
            try:
                if (report := parse_loss_report(value)) is not None:
                    losses.append(report)
                    continue
                # msgspec for the events it can vouch for; pydantic (and its reasons) for the rest.
                read: ReadEvent | WireRead | None = read_wire(value)
                if read is None:
                    read = read_event(value)
                if (mismatch := _envelope_mismatch(record, read.event)) is not None:
                    _add_dead(dead, record, "envelope_mismatch", mismatch)
                    continue
                flag = self._decision_flag(read, value) if self.decision_keys is not None else None
                rows.append(_event_row(read, ord_, record.topic, record.partition, record.offset, flag))
            except EventParseError as exc:
                _add_dead(dead, record, _reason_kind(exc.reason), exc.reason)
            except Exception as exc:  # a record must never block its partition: dead-letter it
                _add_dead(dead, record, "error", f"{type(exc).__name__}: {exc}")
        return _events_table(rows), pa.Table.from_pydict(dead, schema=_STAGED_DEAD_SCHEMA), losses

    def _decision_flag(self, read: ReadEvent | WireRead, value: bytes) -> str | None:
        """`UNVERIFIED_DECISION` and why, for an `ApprovalResolved` of a request that no desk key
        signed; None for any other event, and for a decision a desk key signed."""
        event: Any = read.event
        if event.type != "ApprovalResolved" or event.approval_id is None or self.decision_keys is None:
            return None
        from events.decisions import decision_problem  # only where decisions are checked

        resolved = event if isinstance(event, ApprovalResolvedEvent) else read_event(value).event
        assert isinstance(resolved, ApprovalResolvedEvent)  # the same bytes, read by pydantic
        problem = decision_problem(resolved, self.decision_keys)
        return None if problem is None else f"{UNVERIFIED_DECISION}: {problem}"

    def offsets(self, topic: str, *, expect: Iterable[int] | None = None) -> dict[int, int]:
        """Partition -> the next offset to read, as last committed by `ingest` (empty for a topic
        never ingested). Safe from any thread; blocks briefly while an ingest commits.

        What is read becomes what the offsets fence expects (`StoreFencedError`): for every partition
        of the topic (`expect=None`: this store writes whatever it reads next from there), or for the
        partitions in `expect` alone (those just sought; `expect=()`: a look that changes nothing)."""
        with self._write_lock:
            # Autocommit: a fresh snapshot, in a lake what every writer has committed so far.
            held = {int(p): int(o) for p, o in self._con.execute(_OFFSETS, {"topic": topic}).fetchall()}
            if expect is None:
                self._known_offsets[topic] = dict(held)
            else:
                known = self._known_offsets.setdefault(topic, {})
                for partition in expect:
                    if partition in held:
                        known[partition] = held[partition]
                    else:
                        known.pop(partition, None)
            return held

    def forget_partitions(self, topic: str, partitions: Iterable[int]) -> None:
        """Partitions this store no longer owns: until `offsets` reads them again, a write for them is
        refused when another writer has stored them (the fence expects no row). Blocks while an ingest
        commits."""
        with self._write_lock:
            known = self._known_offsets.setdefault(topic, {})
            for partition in partitions:
                known.pop(partition, None)

    def holds(self, topic: str, partition: int, offset: int, value: bytes | None) -> bool:
        """True when the store already holds the record the broker now has at this position: the
        event it carries (by `event_id`, wherever it was first read) or the same dead letter. The
        materializer uses it to tell a broker that kept its log from one that lost it and numbered
        new records from 0 again. Safe from any thread."""
        if value is None:
            return False
        con = self.cursor()
        try:
            try:
                event_id = json.loads(value).get("event_id")
            except (ValueError, AttributeError):
                event_id = None
            if isinstance(event_id, str):
                # The archive too: a quiet partition's last record may be in a day moved there.
                with with_archive(con):
                    # By `event_uuid` too: its exact min/max skip all but one row group.
                    row = con.execute(
                        "SELECT 1 FROM events WHERE event_id = $id"
                        " AND (event_uuid = TRY_CAST($id AS UUID) OR event_uuid IS NULL)",
                        {"id": event_id},
                    ).fetchone()
                if row is not None:
                    return True
                # Not stored as an event: it may be a dead letter (invalid, or its envelope disagreed).
            with contextlib.suppress(ValueError):
                if (report := parse_loss_report(value)) is not None:
                    row = con.execute(
                        "SELECT 1 FROM chain_breaks WHERE (evidence->>'report_id') = $id", {"id": report.report_id}
                    ).fetchone()
                    return row is not None
            row = con.execute(
                'SELECT 1 FROM dead_letters WHERE topic = $t AND partition = $p AND "offset" = $o AND value = $v',
                {"t": topic, "p": partition, "o": offset, "v": value},
            ).fetchone()
            return row is not None
        finally:
            con.close()

    def reset_partition(self, topic: str, partition: int) -> None:
        """Forget the stored offset of one partition (the broker lost its log and numbers from 0
        again); stored events stay. Raises `StoreError` when read-only."""
        self._require_writable("reset_partition")
        with self._write_lock:
            self._in_transaction(lambda con: con.execute(_RESET_PARTITION, {"topic": topic, "partition": partition}))
            self._known_offsets.get(topic, {}).pop(partition, None)

    def close_open_gaps(self, *, older_than: datetime | None = None) -> int:
        """Record as 'gap' chain breaks the seqs still missing per producer between 1 and its highest
        stored seq; returns how many rows were newly recorded.

        Call it at the end of a drain (`older_than=None`: every hole), or periodically with a grace
        time: then only holes whose neighbouring events were stored (`ingested_at`, the store's own
        clock; producers' clocks are not ours) before `older_than`. At most `MAX_GAP_ROWS_PER_HOLE`
        rows per hole; each row's detail names the whole hole. A gap is removed when an ingest
        fills it. Raises `StoreError` when read-only. Blocks for one scan of the events.
        """
        self._require_writable("close_open_gaps")

        with self._write_lock:
            return self._in_transaction(lambda con: _count(con.execute(_RECORD_GAPS, {"older_than": older_than})))

    def archive(
        self,
        *,
        before: datetime,
        to: str | os.PathLike[str],
        on_day: Callable[[ArchivedDay], None] | None = None,
        dry_run: bool = False,
    ) -> list[ArchivedDay]:
        """Move the whole UTC days of events before `before` to Parquet under `to`, one transaction
        per day (`consumers.archive.archive_days`); the days moved. Raises `StoreError` when
        read-only and `ArchiveError` when the archive cannot be written. Blocks for the export."""
        self._require_writable("archive")
        if self.lake is not None:
            raise StoreError(
                f"{self.path} keeps its events as Parquet already: expire old snapshots instead of archiving "
                "(docs/operating.md, 'The lake')"
            )
        with self._write_lock:
            return archive_days(self._con, before=before, to=to, on_day=on_day, dry_run=dry_run)

    def transaction(self, work: Callable[[duckdb.DuckDBPyConnection], _T]) -> _T:
        """Run `work` on the write connection in one transaction (committed when it returns, rolled
        back when it raises, which is re-raised); serialized with the store's other writes. Raises
        `StoreError` when read-only. Blocks."""
        self._require_writable("a write")
        with self._write_lock:
            return self._in_transaction(work)

    def close_checkpoints(self, *, older_than: datetime | None = None) -> dict[str, int]:
        """Record the checkpoint findings waiting cannot change any more (`CheckpointVerifier.close`);
        the new chain breaks by kind (empty without `trusted_keys`).

        `older_than=None` is the end of a drain: a checkpoint still waiting for its events is
        `truncated` (removed again if they arrive), and with `require_signed` every producer is
        judged now. With a time (continuous runs), only checkpoints and producers whose first event
        were stored before it are `truncated` or `unsigned`. Raises `StoreError` when read-only. One
        transaction; blocks."""
        self._require_writable("close_checkpoints")
        verifier = self.checkpoint_verifier
        if verifier is None:
            return {}

        def close(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
            found = verifier.verify_pending(con)
            found.update(verifier.close(con, now=datetime.now(UTC), older_than=older_than))
            return dict(found)

        with self._write_lock:
            return self._in_transaction(close)

    # -- reading --------------------------------------------------------------------------------

    def counts(self) -> StoreCounts:
        """Events by type, dead letters by reason kind, chain breaks by kind, newest event time.
        Safe from any thread; blocks briefly while an ingest commits."""
        with self._write_lock:
            con = self._con
            events = {str(k): int(n) for k, n in con.execute(_COUNT_EVENTS).fetchall()}
            dead = {str(k): int(n) for k, n in con.execute(_COUNT_DEAD).fetchall()}
            breaks = {str(k): int(n) for k, n in con.execute(_COUNT_BREAKS).fetchall()}
            last = con.execute(_LAST_EVENT_TIME).fetchone()
        return StoreCounts(events, dead, breaks, last[0] if last else None)


# -- helpers ------------------------------------------------------------------------------------


def _count(result: duckdb.DuckDBPyConnection) -> int:
    row = result.fetchone()
    return int(row[0]) if row else 0


def _unregister(con: duckdb.DuckDBPyConnection, name: str) -> None:
    # Never registered (the batch failed before) or the connection is gone: nothing to undo.
    with contextlib.suppress(duckdb.Error):
        con.unregister(name)


def _offsets_table(offsets: Mapping[tuple[str, int], int]) -> pa.Table:
    topics, partitions, nexts = [], [], []
    for (topic, partition), next_offset in offsets.items():
        if next_offset < 0:
            raise ValueError(f"the next offset of {topic}/{partition} must not be negative, got {next_offset}")
        topics.append(topic)
        partitions.append(partition)
        nexts.append(next_offset)
    return pa.Table.from_pydict(
        {"topic": topics, "partition": partitions, "next_offset": nexts}, schema=_STAGED_OFFSETS_SCHEMA
    )


def _reason_kind(reason: str) -> str:
    """A short kind for `EventParseError.reason` (the dead-letter table keeps the whole reason too)."""
    # "not UTF-8: ..." from events.codec; older codecs said "not JSON: 'utf-8' codec can't decode ...".
    if reason.startswith("not UTF-8") or (reason.startswith("not JSON") and "'utf-8' codec can't decode" in reason):
        return "not_utf8"
    if reason.startswith("not JSON"):
        return "not_json"
    if reason.startswith("expected a JSON object"):
        return "not_an_event"
    if reason.startswith("unknown event type"):
        return "unknown_type"
    if reason.startswith("schema_version"):
        return "newer_schema"
    return "invalid"


def _envelope_mismatch(record: KafkaRecord, event: EventBase | Any) -> str | None:
    """What of the record's envelope disagrees with the event it carries (a model, or the struct of
    `events.fast_read`; None: nothing), in the words of the `envelope_mismatch` dead letter; the
    rules are in `AuditStore.ingest`."""
    headers = record.headers
    problems: list[str] = []
    if record.key is None:
        problems.append(f"the record has no key; the event's producer_id is {event.producer_id!r}")
    elif record.key != event.producer_id.encode():
        problems.append(f"key {_shown(record.key)} is not the event's producer_id {event.producer_id!r}")
    kind = str(getattr(event, "type", ""))
    for name, value in headers:
        if name == "ce_id" and value != event.event_id.encode():
            problems.append(f"header ce_id {_shown(value)} is not the event's event_id {event.event_id!r}")
        elif name == "ce_type" and value != (wanted := CE_TYPE_PREFIX + kind).encode():
            problems.append(f"header ce_type {_shown(value)} is not {wanted!r} (the event's type {kind!r})")
    return "; ".join(problems) or None


def _shown(value: bytes | None) -> str:
    """A key or header value as a person reads it in an error: quoted text, or null."""
    return "null" if value is None else repr(value.decode("utf-8", "backslashreplace"))


def _add_dead(dead: dict[str, list[Any]], record: KafkaRecord, reason: str, error: str) -> None:
    value = record.value
    dead["topic"].append(record.topic)
    dead["partition"].append(record.partition)
    dead["offset"].append(record.offset)
    dead["key"].append(record.key)
    # Kept whole, oversize too: a dead letter is never lost, only set aside.
    dead["value"].append(value)
    dead["reason"].append(reason)
    dead["error"].append(error)
    dead["preview"].append(None if value is None else value[:PREVIEW_CHARS].decode("utf-8", "replace"))
    dead["kafka_time"].append(record.timestamp)


_NO_SHADOW: Final = (None, None, None, None)


def _event_row(
    read: ReadEvent | WireRead, ord_: int, topic: str, partition: int, offset: int, flag: str | None = None
) -> tuple[Any, ...]:
    """One event's row of `_STAGED_EVENT_SCHEMA`, in its column order, from a pydantic event or the
    struct of `events.fast_read` (same attribute names: dispatched on `type`, not on the class).
    `flag`: an `ApprovalResolved`'s `decided_by` (`AuditStore._decision_flag`)."""
    event: Any = read.event
    kind: str = event.type
    fast = isinstance(read, WireRead)
    decided_by: str | None = None
    outcome: str | None = None
    message: str | None = None
    duration_ms: float | None = None
    # Only outcome events say what shadow decisions would have done; the fields are None elsewhere.
    shadow: tuple[str | None, bool | None, str | None, str | None] = _NO_SHADOW
    match kind:
        case "ToolUse":
            outcome, message, duration_ms = event.outcome, event.error, event.duration_ms
            shadow = (event.shadow_outcome, event.divergent, event.shadow_decided_by, event.shadow_rule)
        case "ToolDenied":
            decided_by, outcome, message = event.decided_by, event.cause, event.message
            shadow = (event.shadow_outcome, event.divergent, event.shadow_decided_by, event.shadow_rule)
        case "Blocked":
            decided_by, outcome, message = event.decided_by, event.cause, event.reason
            shadow = (event.shadow_outcome, event.divergent, event.shadow_decided_by, event.shadow_rule)
        case "Substitute":
            decided_by, message = event.decided_by, event.error
            shadow = (event.shadow_outcome, event.divergent, event.shadow_decided_by, event.shadow_rule)
        case "ApprovalRequested":
            message = event.reason
        case "ApprovalResolved":
            # Not in the brief's list, but the `calls` view needs the answer as a column.
            outcome, message = ("approved" if event.approved else "refused"), event.error
            decided_by = flag
        case _:
            pass  # Unmediated, ToolsRegistered, TurnDecision, Checkpoint: their fields stay in `event`
    return (
        ord_,
        event.event_id,
        kind,
        event.schema_version,
        event.time,
        event.producer_id,
        event.seq,
        event.hash,
        event.prev_hash,
        read.content_hash,
        event.gate,
        event.workflow,
        event.agent,
        event.tool,
        event.call_id,
        event.parent_call_id,
        event.run_id,
        event.thread_id,
        event.tenant,
        event.principal,
        event.trace_id,
        event.span_id,
        decided_by,
        outcome,
        message,
        duration_ms,
        topic,
        partition,
        offset,
        # The normalized wire form (what `encode_event` writes), so readers see one shape.
        None if fast else read.normalized,
        # The enforced steps only (`enforced` is False on shadow steps, None on calls without any).
        [step.interceptor for step in event.decisions if step.enforced is not False],
        *shadow,
        read.wire if fast else None,
    )


def _events_table(rows: Sequence[tuple[Any, ...]]) -> pa.Table:
    """The staged events' Arrow table from rows made by `_event_row` (one transposition, column by
    column: no per-row dict)."""
    columns = list(zip(*rows, strict=True)) if rows else [() for _ in _STAGED_EVENT_SCHEMA]
    *plain, wires = columns
    return pa.Table.from_arrays(
        [pa.array(column, type=f.type) for column, f in zip(plain, _STAGED_EVENT_SCHEMA, strict=False)]
        + [_json_array(wires)],
        schema=_STAGED_EVENT_SCHEMA,
    )


def _json_array(wires: Sequence[bytes | None]) -> pa.Array:
    """`event_json`'s storage (text; the staged schema makes it Arrow's JSON type) from the kept wire
    bytes (UTF-8 already checked by msgspec), without decoding them to text and encoding them again:
    the bytes joined once are its data, their lengths its offsets, None a null.

    Appended one by one, Arrow's builder grew its buffer to a batch's 12 MB in steps, each a new
    allocation and a copy: in the jemalloc pool the materializer stages with, 2.1 to 2.2 µs an event
    under the interpreter's lock, against 0.7 joined."""
    present = [wire for wire in wires if wire is not None]
    lengths: Iterable[int] = map(len, present)
    validity = None
    if len(present) < len(wires):
        lengths = [0 if wire is None else len(wire) for wire in wires]
        validity = pa.array([wire is not None for wire in wires], pa.bool_()).buffers()[1]
    data = b"".join(present)
    if len(data) > _INT32_MAX:
        # Past what 32-bit offsets reach: Arrow's builder splits or refuses it, as before.
        return pa.array(wires, type=pa.binary()).view(pa.string())
    offsets = pa.array(itertools.accumulate(lengths, initial=0), pa.int32())
    return pa.Array.from_buffers(
        pa.string(), len(wires), [validity, offsets.buffers()[1], pa.py_buffer(data)], len(wires) - len(present)
    )
