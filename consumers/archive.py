"""The cold tier: whole days of events moved out of the store into Parquet files, and read back.

`archive_days(store, before=..., to=DIR)` exports every whole UTC day of events older than `before`
to `DIR/date=YYYY-MM-DD/events-<id>.parquet` (hive-style directories, one file per day and run,
zstd) and deletes that day from the store, one transaction per day. The store keeps the manifest
(`archive_files`: each file, its day, its event count and SHA-256) and, per producer, the seq
ranges each file holds (`archive_segments`), written in the same transaction as the delete: a file
is part of the archive exactly when its row is, so a run that dies half way leaves either the day
in the store or the day in the archive, never both and never neither (a file written but not
listed is ignored, and removed by the next run).

Reading: a named query run with `include_archive=true` (`consumers.queries.run_query`) sees the
store's events and the archive's together: on its own connection, a temporary `events` view joins
the table and the listed files (DuckDB's Parquet reader), and every view over `events` (`calls`,
`blocked_attempts`, `decision_trends`) follows. Other tables (chain breaks, checkpoints, the tree
index, dead letters) are never archived.

Chain checks: the seqs an archived day held count as present (`archive_segments`), so archiving
never turns into gaps; the gaps that were recorded before stay recorded.

Only the process holding the store's file may archive (DuckDB has one writer): stop the
materializer, run `callgate archive`, start it again (docs/operating.md, *Archive*).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from typing import Any, Final

import duckdb

__all__ = ["ARCHIVE_PARAM", "ArchiveError", "ArchivedDay", "archive_days", "archive_files", "with_archive"]

ARCHIVE_PARAM: Final = "include_archive"
"""The parameter every named query takes to read the archive as well."""

_FILE_GLOB: Final = "events-*.parquet"

CREATE_ARCHIVE_TABLES: Final = (
    """
    CREATE TABLE archive_files (
        day DATE NOT NULL,  -- the UTC day the file holds, whole
        path VARCHAR PRIMARY KEY,  -- absolute
        events BIGINT NOT NULL,
        sha256 VARCHAR NOT NULL,  -- of the file as written
        archived_at TIMESTAMPTZ NOT NULL
    )
    """,
    """
    CREATE TABLE archive_segments (
        path VARCHAR NOT NULL,  -- the archive_files row
        producer_id VARCHAR NOT NULL,
        first_seq BIGINT NOT NULL,
        last_seq BIGINT NOT NULL,
        events BIGINT NOT NULL  -- last_seq - first_seq + 1 when the file holds the range whole
    )
    """,
)
"""The store's side of the archive (store migration "archive"): the manifest and its seq ranges."""


class ArchiveError(Exception):
    """The archive cannot be written or read (its directory, a listed file gone or changed)."""


@dataclass(frozen=True, slots=True)
class ArchivedDay:
    """One day moved to the archive."""

    day: date
    path: Path
    events: int
    sha256: str


def _day_bounds(day: date) -> tuple[datetime, datetime]:
    start = datetime.combine(day, time(0), tzinfo=UTC)
    return start, start + timedelta(days=1)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def days_before(con: duckdb.DuckDBPyConnection, before: datetime) -> list[date]:
    """The UTC days of stored events that end at or before `before` (whole days only), oldest first."""
    cutoff = datetime.combine(before.astimezone(UTC).date(), time(0), tzinfo=UTC)
    rows = con.execute(
        "SELECT DISTINCT CAST(time AS DATE) AS day FROM events WHERE time < $cutoff ORDER BY day",
        {"cutoff": cutoff},
    ).fetchall()
    return [row[0] for row in rows]


def _remove_unlisted(con: duckdb.DuckDBPyConnection, root: Path) -> None:
    """Delete files under `root` a run wrote but never listed (it died before its transaction)."""
    listed = {str(Path(p)) for (p,) in con.execute("SELECT path FROM archive_files").fetchall()}
    for found in root.glob(f"date=*/{_FILE_GLOB}"):
        if str(found.resolve()) not in listed:
            found.unlink(missing_ok=True)
    for partial in root.glob("date=*/.*.parquet.partial"):
        partial.unlink(missing_ok=True)


def archive_days(
    con: duckdb.DuckDBPyConnection,
    *,
    before: datetime,
    to: str | os.PathLike[str],
    on_day: Callable[[ArchivedDay], None] | None = None,
    dry_run: bool = False,
) -> list[ArchivedDay]:
    """Move every whole UTC day of events before `before` from the store on `con` (its writer) to
    Parquet under `to`; returns the days moved, oldest first (`on_day` is told of each as it
    commits). With `dry_run`, nothing is written and the days that would move are returned with
    their event counts (path and sha256 empty).

    Per day: the file is written beside its final name and renamed once complete and synced, then
    one transaction lists it, records its per-producer seq ranges and deletes the day's events;
    if the day's events changed meanwhile (an ingest), the transaction fails and the file is
    removed. Raises `ArchiveError` naming the directory when it cannot be written.
    """
    root = Path(to).resolve()
    days = days_before(con, before)
    if dry_run:
        out = []
        for day in days:
            start, end = _day_bounds(day)
            row = con.execute(
                "SELECT count(*) FROM events WHERE time >= $start AND time < $end", {"start": start, "end": end}
            ).fetchone()
            out.append(ArchivedDay(day, Path(), int(row[0]) if row else 0, ""))
        return out
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / f".write-probe-{uuid.uuid4().hex}"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise ArchiveError(f"archive directory {root} cannot be written: {exc.strerror or exc}") from exc
    _remove_unlisted(con, root)
    moved: list[ArchivedDay] = []
    for day in days:
        archived = _archive_day(con, root, day)
        if archived is None:
            continue
        moved.append(archived)
        if on_day is not None:
            on_day(archived)
    return moved


def _archive_day(con: duckdb.DuckDBPyConnection, root: Path, day: date) -> ArchivedDay | None:
    start, end = _day_bounds(day)
    window = {"start": start, "end": end}
    folder = root / f"date={day.isoformat()}"
    folder.mkdir(exist_ok=True)
    name = f"events-{uuid.uuid4().hex}.parquet"
    final, partial = folder / name, folder / f".{name}.partial"
    try:
        # A path we made, quoted: COPY takes no parameter for it.
        copy = f"COPY (SELECT * FROM events WHERE time >= $start AND time < $end ORDER BY time, event_id) TO '{_quoted(partial)}' (FORMAT parquet, COMPRESSION zstd)"  # noqa: S608, E501
        con.execute(copy, window)
        _fsync(partial)
        partial.rename(final)
        _fsync(folder)
        digest = _sha256(final)
        written = con.execute("SELECT count(*) FROM read_parquet($path)", {"path": str(final)}).fetchone()
        count = int(written[0]) if written else 0
        con.begin()
        try:
            stored = con.execute("SELECT count(*) FROM events WHERE time >= $start AND time < $end", window).fetchone()
            if not stored or int(stored[0]) != count:
                raise ArchiveError(f"the events of {day} changed while archiving them; run again")
            con.execute(
                "INSERT INTO archive_files (day, path, events, sha256, archived_at) "
                "VALUES ($day, $path, $events, $sha256, now())",
                {"day": day, "path": str(final), "events": count, "sha256": digest},
            )
            con.execute(
                "INSERT INTO archive_segments (path, producer_id, first_seq, last_seq, events) "
                "SELECT $path, producer_id, min(seq), max(seq), count(*) FROM events "
                "WHERE time >= $start AND time < $end GROUP BY producer_id",
                {**window, "path": str(final)},
            )
            con.execute("DELETE FROM events WHERE time >= $start AND time < $end", window)
            con.commit()
        except BaseException:
            with contextlib.suppress(duckdb.Error):
                con.rollback()
            raise
    except BaseException:
        partial.unlink(missing_ok=True)
        final.unlink(missing_ok=True)
        raise
    return ArchivedDay(day, final, count, digest)


def _quoted(path: Path) -> str:
    return str(path).replace("'", "''")


def archive_files(con: duckdb.DuckDBPyConnection) -> list[str]:
    """The archive's files as the store lists them, oldest day first."""
    return [str(p) for (p,) in con.execute("SELECT path FROM archive_files ORDER BY day, path").fetchall()]


@contextlib.contextmanager
def with_archive(con: duckdb.DuckDBPyConnection) -> Any:
    """On `con`, for the duration of the block, `events` (and every view over it) reads the store's
    table and the archive's listed files together. Raises `ArchiveError` naming a listed file that
    is gone."""
    files = archive_files(con)
    if not files:
        yield
        return
    missing = [path for path in files if not Path(path).is_file()]
    if missing:
        raise ArchiveError(f"archive file {missing[0]} is listed in the store but missing ({len(missing)} missing)")
    catalog = con.execute("SELECT current_database()").fetchone()
    table = f'"{catalog[0]}".main.events' if catalog else "main.events"
    listed = ", ".join(f"'{_quoted(Path(path))}'" for path in files)
    # The table's columns, in its order; a file archived before a column existed reads it as NULL.
    # Listed paths, quoted: a view takes no parameters.
    view = f"CREATE OR REPLACE TEMP VIEW events AS SELECT * FROM {table} UNION ALL BY NAME SELECT * REPLACE (event::JSON AS event) FROM read_parquet([{listed}], union_by_name = true)"  # noqa: S608, E501
    con.execute(view)
    try:
        yield
    finally:
        with contextlib.suppress(duckdb.Error):
            con.execute("DROP VIEW IF EXISTS temp.events")
