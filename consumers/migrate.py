"""Moving a store from its file home into a lake: `copy_into_lake(files, lake)`.

Every table a materializer writes is copied (events, dead letters, chain breaks, the checkpoint
queue and state, the Merkle tree index, the access log, the archive's manifest, the approvals'
claims and the Kafka offsets), each row once whatever number of files hold it (several files of
one deployment may hold copies of the same events; a claim is one per approval id), in one lake
transaction: a copy that fails leaves the lake as it was.
Then every chain is verified in the lake and compared with the files: the same events, the same
broken links, the same missing seqs, or the copy is reported as failed.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import duckdb

from consumers.lake import Lake
from consumers.store import AuditStore

__all__ = ["ChainCheck", "MigrationReport", "copy_into_lake", "verify_chains"]

# Each table with the columns that identify a row (a row whose identity the lake holds is not copied
# again); None: every row is copied (the access log has no identity: each read is its own row).
_TABLES: Final[tuple[tuple[str, tuple[str, ...] | None], ...]] = (
    ("events", ("event_id",)),
    ("dead_letters", ("topic", "partition", '"offset"')),
    ("chain_breaks", ("producer_id", "seq", "kind")),
    ("checkpoint_pending", ("event_id",)),
    ("checkpoint_state", ("producer_id",)),
    ("merkle_nodes", ("producer_id", "level", "idx")),
    ("archive_files", ("path",)),
    ("archive_segments", ("path", "producer_id")),
    ("access_log", None),
    ("approval_claims", ("approval_id",)),
)

# What a chain looks like, per producer: its events, the links that do not hold (a prev_hash that is
# not the hash of the seq before, seq 1 not starting from zeros), hashes that do not match the content,
# and the seqs missing between 1 and its highest.
_CHAIN_CHECK: Final = """
WITH chain AS (
    SELECT producer_id, seq, hash, prev_hash, content_hash,
           lag(seq) OVER w AS prev_seq, lag(hash) OVER w AS prev_chain_hash
    FROM {events}
    WINDOW w AS (PARTITION BY producer_id ORDER BY seq)
)
SELECT count(DISTINCT producer_id),
       count(*),
       count(*) FILTER (WHERE (seq = 1 AND prev_hash <> repeat('0', 64))
                           OR (prev_seq = seq - 1 AND prev_hash <> prev_chain_hash)),
       count(*) FILTER (WHERE hash <> content_hash),
       coalesce(sum(seq - coalesce(prev_seq, 0) - 1), 0)
FROM chain
"""


@dataclass(frozen=True, slots=True)
class ChainCheck:
    """What `verify_chains` found: producers, events, broken links, tampered hashes, missing seqs."""

    producers: int
    events: int
    broken_links: int
    tampered: int
    missing: int


@dataclass(frozen=True, slots=True)
class MigrationReport:
    """What `copy_into_lake` copied (rows per table) and the chains of the files and of the lake:
    `verified` is True when they are the same."""

    copied: dict[str, int]
    files: ChainCheck
    lake: ChainCheck

    @property
    def verified(self) -> bool:
        """The lake holds every event of the files, once, and its chains verify as theirs did."""
        return self.files == self.lake


def verify_chains(con: duckdb.DuckDBPyConnection, events: str = "events") -> ChainCheck:
    """Check every producer's chain in the table (or query in parentheses) `events`."""
    row = con.execute(_CHAIN_CHECK.format(events=events)).fetchone()
    assert row is not None  # an aggregate always answers one row
    return ChainCheck(*(int(value) for value in row))


def copy_into_lake(files: Sequence[str | os.PathLike[str]], lake: Lake) -> MigrationReport:
    """Copy the stores in `files` (DuckDB files nobody is writing; each is migrated to this code's
    schema first) into `lake` (created when new), in one lake transaction, and verify the chains.

    Raises `StoreError` / `StoreLockedError` for a file that cannot be opened, DuckDB's errors for a
    lake that cannot be written. Blocks for the copy."""
    paths = [Path(f).absolute() for f in files]
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(f"no audit store at {path}")
        AuditStore(path).close()  # migrated to this code's schema, then released
    # Composed of table names of our own (src0, src1, ...) only: nothing a person typed.
    union = " UNION ALL ".join(f"SELECT * FROM src{i}.events" for i in range(len(paths)))  # noqa: S608
    with AuditStore(lake) as store:
        attached = store.cursor()
        try:
            for i, path in enumerate(paths):
                attached.execute(f"ATTACH '{_quoted(str(path))}' AS src{i} (READ_ONLY)")
            distinct = f"(SELECT * FROM ({union}) QUALIFY row_number() OVER (PARTITION BY event_id) = 1)"  # noqa: S608
            before = verify_chains(attached, distinct)

            def copy(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
                copied: dict[str, int] = {}
                for table, key in _TABLES:
                    copied[table] = 0
                    for i in range(len(paths)):
                        copied[table] += _copy_table(con, f"src{i}.{table}", table, key)
                # The offsets: the furthest any file read, per partition.
                offsets = " UNION ALL ".join(
                    f"SELECT * FROM src{i}.kafka_offsets"  # noqa: S608 (names of our own)
                    for i in range(len(paths))
                )
                con.execute("DELETE FROM kafka_offsets")
                row = con.execute(
                    f"INSERT INTO kafka_offsets SELECT topic, partition, max(next_offset), max(updated_at) "  # noqa: S608
                    f"FROM ({offsets}) GROUP BY topic, partition"
                ).fetchone()
                copied["kafka_offsets"] = int(row[0]) if row else 0
                return copied

            # The files are attached to the store's database instance: its writer sees them too.
            copied = store.transaction(copy)
            after = verify_chains(attached)
        finally:
            for i in range(len(paths)):
                attached.execute(f"DETACH DATABASE IF EXISTS src{i}")
            attached.close()
    return MigrationReport(copied, before, after)


def _copy_table(con: duckdb.DuckDBPyConnection, source: str, table: str, key: tuple[str, ...] | None) -> int:
    where = ""
    if key is not None:
        match = " AND ".join(f"t.{column} = s.{column}" for column in key)
        # A row whose identity the lake (or an earlier file) holds, and copies within one file, once.
        partition = ", ".join(f"s.{column}" for column in key)
        where = (
            f"WHERE NOT EXISTS (SELECT 1 FROM {table} t WHERE {match}) "  # noqa: S608 (module constants)
            f"QUALIFY row_number() OVER (PARTITION BY {partition}) = 1"
        )
    row = con.execute(f"INSERT INTO {table} BY NAME SELECT s.* FROM {source} s {where}").fetchone()  # noqa: S608
    return int(row[0]) if row else 0


def _quoted(text: str) -> str:
    return text.replace("'", "''")
