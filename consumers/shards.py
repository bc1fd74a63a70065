"""A sharded store: several materializers in one consumer group, one store file each.

Partitions move between the members of the group (one dies, one is added). Each time a store's
materializer is assigned a partition it starts a *tenure*: it reads from the group's committed
offset (the previous owner's progress) or from its own stored offset, whichever is further, and
records the tenure in its store (`partition_tenures`) and announces it on the topic's *handoff log*
(`handoff_log_topic`, one partition): a notice that orders every tenure of every shard.

Two hazards follow from partitions moving, and this module is where each is handled:

- A producer's chain spans shards. The offsets a store did not read because another shard did (before
  its tenure started, or ceded to a later tenure, below) are recorded in `offsets_elsewhere`; a hole
  in a producer's chain whose neighbours straddle such a range is not a gap of this store (the store's
  `close_open_gaps` skips it) but a boundary between two of its *chain segments* (`CHAIN_SEGMENTS_SQL`),
  which the federated read stitches across shards.
- At least once across shards: an owner that stored a batch and died before its Kafka commit leaves
  records that the next owner reads again from the committed offset. The rule that settles it: the copy
  of the record at an offset is kept by the latest tenure (in handoff-log order) that started at or
  before that offset; every older tenure's store deletes its copy once the group's committed offset has
  passed it (so the later owner holds it), records the range as ceded, and announces that the take is
  resolved. Until then the new owner's tenure is unconfirmed: its store and its `/healthz` say so.

Notices are JSON objects with `kind`: "take" (a tenure started: `tenure_id`, `topic`, `partition`,
`owner`, `start_offset`), "release" (an owner left a partition cleanly: `next_offset`, the store's
offset, committed), "resolved" (an older owner holds no copy of what take `resolves` reads: `removed`
events and dead letters deleted).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Final, Literal

import duckdb

HANDOFF_LOG_SUFFIX: Final = ".handoffs"


def handoff_log_topic(topic: str) -> str:
    """The handoff log of `topic`'s consumer groups: one partition, one notice per record."""
    return topic + HANDOFF_LOG_SUFFIX


# -- schema (migration 8) -------------------------------------------------------------------------

CREATE_SHARD_TABLES: Final = (
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
"""Migration 8 of the store (`consumers.store.MIGRATIONS`)."""


# -- notices ----------------------------------------------------------------------------------------

NoticeKind = Literal["take", "release", "resolved"]


@dataclass(frozen=True, slots=True)
class Notice:
    """One record of the handoff log."""

    kind: NoticeKind
    topic: str
    partition: int
    owner: str
    tenure_id: str | None = None
    start_offset: int | None = None
    next_offset: int | None = None
    resolves: str | None = None
    removed: int | None = None
    group_offset: int | None = None
    notice_id: str = field(default_factory=lambda: uuid.uuid4().hex)

    def encode(self) -> bytes:
        body = {k: v for k, v in asdict(self).items() if v is not None}
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()

    @staticmethod
    def decode(value: bytes | None) -> Notice | None:
        """The notice in `value`, or None for anything else (never raises)."""
        try:
            body = json.loads(value or b"")
            if body.get("kind") not in ("take", "release", "resolved"):
                return None
            return Notice(
                kind=body["kind"],
                topic=str(body["topic"]),
                partition=int(body["partition"]),
                owner=str(body["owner"]),
                tenure_id=body.get("tenure_id"),
                start_offset=_int_or_none(body.get("start_offset")),
                next_offset=_int_or_none(body.get("next_offset")),
                resolves=body.get("resolves"),
                removed=_int_or_none(body.get("removed")),
                group_offset=_int_or_none(body.get("group_offset")),
                notice_id=str(body.get("notice_id") or uuid.uuid4().hex),
            )
        except (ValueError, TypeError, KeyError, AttributeError):
            return None


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


# -- what the store does with them (each function runs inside one store transaction) -------------------


def store_id(con: duckdb.DuckDBPyConnection) -> str:
    """This store's id in the handoff log (made by migration 8, never changed)."""
    row = con.execute("SELECT store_id FROM shard_identity").fetchone()
    if row is None:  # a file whose identity row someone deleted: give it a new one
        con.execute("INSERT INTO shard_identity SELECT 'store-' || replace(gen_random_uuid()::VARCHAR, '-', '')")
        return store_id(con)
    return str(row[0])


def set_notice_offset(con: duckdb.DuckDBPyConnection, tenure_id: str, position: int) -> None:
    """An own take's position in the handoff log, once announced."""
    con.execute(
        "UPDATE partition_tenures SET notice_offset = $pos WHERE tenure_id = $id", {"pos": position, "id": tenure_id}
    )


def partitions_to_resolve(con: duckdb.DuckDBPyConnection, topic: str, owner: str) -> list[int]:
    """The partitions with a peer's take this store has not resolved yet."""
    rows = con.execute(
        f"SELECT DISTINCT partition FROM ({_TAKES_TO_RESOLVE}) ORDER BY 1",  # noqa: S608
        {"topic": topic, "owner": owner},
    ).fetchall()
    return [int(p) for (p,) in rows]


def record_own_tenure(
    con: duckdb.DuckDBPyConnection,
    *,
    tenure_id: str,
    topic: str,
    partition: int,
    owner: str,
    start_offset: int,
    stored_before: int | None,
    group_offset: int | None = None,
) -> None:
    """Record a tenure this store starts; the offsets before it that it never read are elsewhere."""
    con.execute(
        "INSERT INTO partition_tenures (tenure_id, topic, partition, owner, own, start_offset, stored_before, "
        "group_offset, started_at) VALUES ($id, $topic, $partition, $owner, true, $start, $before, $group, now())",
        {
            "id": tenure_id,
            "topic": topic,
            "partition": partition,
            "owner": owner,
            "start": start_offset,
            "before": stored_before,
            "group": group_offset,
        },
    )
    unread_from = stored_before or 0
    if start_offset > unread_from:
        con.execute(
            "INSERT INTO offsets_elsewhere VALUES ($topic, $partition, $from, $to, 'handoff', $id, 0, now())",
            {"topic": topic, "partition": partition, "from": unread_from, "to": start_offset, "id": tenure_id},
        )


def retire_tenures(con: duckdb.DuckDBPyConnection, topic: str) -> None:
    """The broker lost the topic's logs (and its handoff log): the tenures and notices known so far are
    about records that are gone and must order nothing any more; own takes count as confirmed."""
    con.execute(
        "UPDATE partition_tenures SET notice_offset = NULL, confirmed_at = coalesce(confirmed_at, now()), "
        "confirmed_by = coalesce(confirmed_by, 'log lost') WHERE topic = $topic",
        {"topic": topic},
    )
    con.execute("UPDATE handoff_notices SET notice_offset = NULL WHERE (notice->>'topic') = $topic", {"topic": topic})


def learn_notices(con: duckdb.DuckDBPyConnection, notices: Iterable[tuple[int, Notice]]) -> int:
    """Store the handoff log's notices (position, notice): peers' takes become tenures, own takes get
    their position. Idempotent; returns how many notices were new."""
    new = 0
    for position, notice in notices:
        inserted = con.execute(
            "INSERT INTO handoff_notices VALUES ($id, $pos, $kind, $notice::JSON, now()) "
            "ON CONFLICT (notice_id) DO NOTHING RETURNING 1",
            {"id": notice.notice_id, "pos": position, "kind": notice.kind, "notice": notice.encode().decode()},
        ).fetchall()
        if not inserted:
            continue
        new += 1
        if notice.kind == "take" and notice.tenure_id is not None and notice.start_offset is not None:
            con.execute(
                "INSERT INTO partition_tenures (tenure_id, topic, partition, owner, own, start_offset, "
                "group_offset, notice_offset, started_at) "
                "VALUES ($id, $topic, $partition, $owner, false, $start, $group, $pos, now()) "
                "ON CONFLICT (tenure_id) DO UPDATE SET notice_offset = excluded.notice_offset",
                {
                    "id": notice.tenure_id,
                    "topic": notice.topic,
                    "partition": notice.partition,
                    "owner": notice.owner,
                    "start": notice.start_offset,
                    "group": notice.group_offset,
                    "pos": position,
                },
            )
    return new


# The own takes still unconfirmed, with the tenure just before each in the log (NULL: none).
_UNCONFIRMED = """
SELECT t.tenure_id, t.topic, t.partition, t.start_offset, t.notice_offset,
       (SELECT p.owner FROM partition_tenures p
        WHERE p.topic = t.topic AND p.partition = t.partition AND p.notice_offset < t.notice_offset
        ORDER BY p.notice_offset DESC LIMIT 1) AS previous_owner,
       (SELECT p.notice_offset FROM partition_tenures p
        WHERE p.topic = t.topic AND p.partition = t.partition AND p.notice_offset < t.notice_offset
        ORDER BY p.notice_offset DESC LIMIT 1) AS previous_at
FROM partition_tenures t
WHERE t.own AND t.confirmed_at IS NULL
"""


def confirm_takes(con: duckdb.DuckDBPyConnection, owner: str) -> int:
    """Confirm own takes the previous owner of the partition can no longer double: there was none, it
    was this store, it released the partition at or below the take's start, or it resolved the take.
    Returns how many were confirmed."""
    confirmed = 0
    for tenure_id, topic, partition, start, at, previous_owner, previous_at in con.execute(_UNCONFIRMED).fetchall():
        by: str | None = None
        if at is None:
            continue  # never announced: no peer knows of it, so nothing can confirm it
        if previous_owner is None:
            by = "first owner"
        elif previous_owner == owner:
            by = "own store"
        else:
            released = con.execute(
                "SELECT 1 FROM handoff_notices WHERE kind = 'release' AND (notice->>'owner') = $owner "
                "AND (notice->>'topic') = $topic AND ((notice->>'partition'))::INTEGER = $partition "
                "AND ((notice->>'next_offset'))::BIGINT <= $start AND notice_offset > $after AND notice_offset < $at",
                {
                    "owner": previous_owner,
                    "topic": topic,
                    "partition": partition,
                    "start": start,
                    "after": previous_at,
                    "at": at,
                },
            ).fetchone()
            resolved = con.execute(
                "SELECT 1 FROM handoff_notices WHERE kind = 'resolved' AND (notice->>'resolves') = $id "
                "AND (notice->>'owner') = $owner",
                {"id": tenure_id, "owner": previous_owner},
            ).fetchone()
            if released is not None:
                by = f"release by {previous_owner}"
            elif resolved is not None:
                by = f"resolved by {previous_owner}"
        if by is not None:
            con.execute(
                "UPDATE partition_tenures SET confirmed_at = now(), confirmed_by = $by WHERE tenure_id = $id",
                {"by": by, "id": tenure_id},
            )
            confirmed += 1
    return confirmed


# Peers' takes announced after one of this store's tenures of the same partition, not resolved yet,
# each with where the next own tenure after it starts (NULL: none) and how far the take is known to
# have stored: the group's committed offset when the next tenure of anyone began (NULL: it is the
# latest; its progress is the committed offset now). The start of that next tenure would not do: a
# store taking a partition back starts at its own offset, above what the take ever read.
_TAKES_TO_RESOLVE = """
SELECT x.tenure_id, x.topic, x.partition, x.start_offset,
       (SELECT min(o.start_offset) FROM partition_tenures o
        WHERE o.own AND o.topic = x.topic AND o.partition = x.partition
          AND (o.notice_offset IS NULL OR o.notice_offset > x.notice_offset)) AS next_own_start,
       (SELECT arg_min(coalesce(n.group_offset, x.start_offset), n.notice_offset) FROM partition_tenures n
        WHERE n.topic = x.topic AND n.partition = x.partition AND n.notice_offset > x.notice_offset) AS stored_to
FROM partition_tenures x
WHERE NOT x.own AND x.notice_offset IS NOT NULL AND x.topic = $topic
  AND EXISTS (SELECT 1 FROM partition_tenures o WHERE o.own AND o.topic = x.topic AND o.partition = x.partition
              AND o.notice_offset < x.notice_offset)
  AND NOT EXISTS (SELECT 1 FROM handoff_notices n WHERE n.kind = 'resolved' AND (n.notice->>'resolves') = x.tenure_id
                  AND (n.notice->>'owner') = $owner)
ORDER BY x.notice_offset
"""

_RANGE = "kafka_topic = $topic AND kafka_partition = $partition AND kafka_offset >= $from AND kafka_offset < $to"
_DEAD_RANGE = 'topic = $topic AND partition = $partition AND "offset" >= $from AND "offset" < $to'


@dataclass(frozen=True, slots=True)
class Resolution:
    """A peer's take this store resolved: it holds no copy of what the take reads any more."""

    tenure_id: str
    partition: int
    removed: int


def resolve_overlaps(
    con: duckdb.DuckDBPyConnection, topic: str, owner: str, committed: Mapping[int, int]
) -> list[Resolution]:
    """Delete this store's copies of records a later tenure of a peer read again, as far as the group's
    `committed` offsets (partition -> offset) show them stored by that peer; record the range as ceded.
    Returns the takes fully resolved (no copy left in their range), to announce."""
    done: list[Resolution] = []
    for tenure_id, _, partition, start, next_own, stored_to in con.execute(
        _TAKES_TO_RESOLVE, {"topic": topic, "owner": owner}
    ).fetchall():
        # What the take read again and stored: up to the committed offset while it is the latest
        # tenure, up to the group's offset when the next one began otherwise; a later own tenure's
        # records are this store's again.
        ends = [e for e in (next_own, stored_to) if e is not None]
        end = min(ends) if ends else None
        bound = committed.get(partition)
        if bound is None:
            continue
        upto = bound if end is None else min(bound, end)
        removed = 0
        if upto > start:
            params = {"topic": topic, "partition": partition, "from": start, "to": upto}
            removed += len(con.execute(f"DELETE FROM events WHERE {_RANGE} RETURNING 1", params).fetchall())  # noqa: S608
            removed += len(con.execute(f"DELETE FROM dead_letters WHERE {_DEAD_RANGE} RETURNING 1", params).fetchall())  # noqa: S608
            con.execute(
                "INSERT INTO offsets_elsewhere VALUES ($topic, $partition, $from, $to, 'ceded', $id, $removed, now()) "
                "ON CONFLICT (tenure_id, reason) DO UPDATE SET to_offset = greatest(offsets_elsewhere.to_offset, "
                "excluded.to_offset), removed = offsets_elsewhere.removed + excluded.removed",
                {**params, "id": tenure_id, "removed": removed},
            )
        left_to = 2**62 if end is None else end
        remaining = con.execute(
            f"SELECT (SELECT count(*) FROM events WHERE {_RANGE}) + (SELECT count(*) FROM dead_letters "  # noqa: S608
            f"WHERE {_DEAD_RANGE})",
            {"topic": topic, "partition": partition, "from": start, "to": left_to},
        ).fetchone()
        if remaining is not None and int(remaining[0]) == 0:
            total = con.execute(
                "SELECT coalesce(max(removed), 0) FROM offsets_elsewhere WHERE tenure_id = $id AND reason = 'ceded'",
                {"id": tenure_id},
            ).fetchone()
            done.append(Resolution(str(tenure_id), int(partition), int(total[0]) if total else removed))
    return done


def unconfirmed_takes(con: duckdb.DuckDBPyConnection) -> list[tuple[int, int, str | None, float]]:
    """Own takes not confirmed yet: (partition, start offset, previous owner, seconds since)."""
    rows = con.execute(
        f"SELECT u.partition, u.start_offset, u.previous_owner, "  # noqa: S608
        f"epoch(now() - t.started_at) FROM ({_UNCONFIRMED}) u JOIN partition_tenures t USING (tenure_id) "
        "ORDER BY u.partition"
    ).fetchall()
    return [(int(p), int(s), o, float(age)) for p, s, o, age in rows]


# -- reading ---------------------------------------------------------------------------------------

# Is the hole between two stored events of a producer (offsets prev_offset exclusive .. kafka_offset
# exclusive, on the later one's partition) one another shard holds?
ELSEWHERE_BETWEEN: Final = """
EXISTS (SELECT 1 FROM offsets_elsewhere x
        WHERE x.topic = {row}.kafka_topic AND x.partition = {row}.kafka_partition
          AND x.from_offset < {row}.kafka_offset AND x.to_offset > coalesce({row}.prev_offset, -1) + 1)
"""

DROP_GAPS_HELD_ELSEWHERE: Final = f"""
DELETE FROM chain_breaks AS b
WHERE b.kind = 'gap' AND b.evidence IS NULL AND EXISTS (
    SELECT 1 FROM (
        SELECT (SELECT arg_min(e.kafka_topic, e.seq) FROM events e
                WHERE e.producer_id = b.producer_id AND e.seq > b.seq) AS kafka_topic,
               (SELECT arg_min(e.kafka_partition, e.seq) FROM events e
                WHERE e.producer_id = b.producer_id AND e.seq > b.seq) AS kafka_partition,
               (SELECT arg_min(e.kafka_offset, e.seq) FROM events e
                WHERE e.producer_id = b.producer_id AND e.seq > b.seq) AS kafka_offset,
               (SELECT arg_max(e.kafka_offset, e.seq) FROM events e
                WHERE e.producer_id = b.producer_id AND e.seq < b.seq) AS prev_offset
    ) AS g
    WHERE {ELSEWHERE_BETWEEN.format(row="g")}
)
"""  # noqa: S608 (composed of module constants only)
"""Removes the recorded gaps (not those a sink reported) whose stored neighbours straddle offsets
another shard holds: the missing events are expected there (`AuditStore.close_open_gaps`)."""

CHAIN_SEGMENTS_SQL: Final = f"""
-- Runs of consecutive seqs first (one sorted pass over the events: a run is where seq minus its rank
-- stays the same), then the few runs, not the events, are linked into segments: a million events
-- measured 203 ms against 534 when every event went through two window sorts.
WITH runs AS (
    SELECT producer_id, seq, kafka_topic, kafka_partition, kafka_offset,
           seq - dense_rank() OVER (PARTITION BY producer_id ORDER BY seq) AS run
    FROM events
    WHERE $producer_id IS NULL OR producer_id = $producer_id
),
ordered AS (
    SELECT *, lag(last_seq) OVER w AS prev_seq, lag(end_offset) OVER w AS prev_offset
    FROM (
        -- A run's topic, partition and offset are its first event's; `end_offset` its last event's.
        SELECT producer_id, min(seq) AS first_seq, max(seq) AS last_seq, count(*) AS events,
               arg_min(kafka_topic, seq) AS kafka_topic, arg_min(kafka_partition, seq) AS kafka_partition,
               arg_min(kafka_offset, seq) AS kafka_offset, arg_max(kafka_offset, seq) AS end_offset,
               any_value(kafka_partition) AS partition, min(kafka_offset) AS first_offset,
               max(kafka_offset) AS last_offset
        FROM runs
        GROUP BY producer_id, run
    )
    WINDOW w AS (PARTITION BY producer_id ORDER BY first_seq)
),
marked AS (
    -- After the first run, a run starts a segment when the seqs missing before it are held elsewhere;
    -- otherwise they are a hole of the segment.
    SELECT o.*, prev_seq IS NULL OR {ELSEWHERE_BETWEEN.format(row="o")} AS starts_segment
    FROM ordered o
),
numbered AS (
    SELECT *, sum(starts_segment::INTEGER) OVER (PARTITION BY producer_id ORDER BY first_seq) AS segment FROM marked
),
page AS (
    SELECT producer_id, segment, min(first_seq) AS first_seq, max(last_seq) AS last_seq, sum(events) AS events,
           coalesce(list([prev_seq + 1, first_seq - 1] ORDER BY first_seq) FILTER (WHERE NOT starts_segment), [])
               AS holes,
           any_value(partition) AS partition, min(first_offset) AS first_offset, max(last_offset) AS last_offset
    FROM numbered
    GROUP BY producer_id, segment
    ORDER BY producer_id, first_seq
    LIMIT $limit OFFSET $offset
),
-- The hashes at the page's segment ends only: carried through the sort of every event, these two
-- 64-character texts made the query several times slower.
ends AS (
    SELECT e.producer_id, e.seq, any_value(e.prev_hash) AS prev_hash, any_value(e.hash) AS hash
    FROM events e
    SEMI JOIN (SELECT producer_id, first_seq AS seq FROM page UNION ALL SELECT producer_id, last_seq FROM page) b
        ON b.producer_id = e.producer_id AND b.seq = e.seq
    GROUP BY e.producer_id, e.seq
)
SELECT p.producer_id, p.segment, p.first_seq, f.prev_hash AS first_prev_hash, p.last_seq, l.hash AS last_hash,
       p.events::BIGINT AS events, p.holes, p.partition, p.first_offset, p.last_offset
FROM page p
JOIN ends f ON f.producer_id = p.producer_id AND f.seq = p.first_seq
JOIN ends l ON l.producer_id = p.producer_id AND l.seq = p.last_seq
ORDER BY p.producer_id, p.first_seq
"""  # noqa: S608 (composed of module constants only; values are bound parameters)
"""Per producer, the runs of its chain this store holds: a new segment starts where the events before
it are held by another shard (`offsets_elsewhere`). `holes` are the [first, last] seqs missing inside
a segment (real gaps of this store). Stitched across shards, segment after segment must link
(first_seq = previous last_seq + 1, first_prev_hash = previous last_hash) from seq 1."""

SHARD_TENURES_SQL: Final = """
SELECT t.topic, t.partition, t.owner, t.own, t.start_offset, t.stored_before, t.notice_offset, t.started_at,
       t.confirmed_at, t.confirmed_by,
       (SELECT list({'from': x.from_offset, 'to': x.to_offset, 'reason': x.reason, 'removed': x.removed})
        FROM offsets_elsewhere x WHERE x.tenure_id = t.tenure_id) AS elsewhere
FROM partition_tenures t
WHERE t.own OR EXISTS (SELECT 1 FROM offsets_elsewhere x WHERE x.tenure_id = t.tenure_id)
ORDER BY t.topic, t.partition, t.notice_offset NULLS LAST, t.started_at
LIMIT $limit OFFSET $offset
"""
"""This store's tenures (its handoffs: partition, first offset read, when, confirmed or not) and the
peers' tenures it ceded records to, with the offset ranges held elsewhere."""
