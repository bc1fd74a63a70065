"""The lake home of the audit store: a DuckLake, its catalog in PostgreSQL or SQLite, its data as
Parquet files in a directory or on S3-compatible object storage.

`Lake(catalog, data)` names one (`lake_from_options` checks what a person typed); `attach_lake(con,
lake)` loads the extensions DuckLake needs and attaches it to a DuckDB connection as `lake`. The store
(`consumers.store.AuditStore`) opens a `Lake` where it would open a file; everything above it (the
named queries, the checks, the readers) runs the same SQL on either home.

Extensions come from the `duckdb-extension-*` wheels installed with callgate (their files load
offline, by path, under the extension's own name); where a wheel is missing, `LOAD name` takes what a
connected deployment installed with `INSTALL ducklake` (and `postgres`, `sqlite`, `httpfs`). Nothing
is ever downloaded by the store itself.

S3 (`s3://bucket/prefix/`): credentials and endpoint from the usual environment variables,
`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION` (or
`AWS_DEFAULT_REGION`) and `AWS_ENDPOINT_URL` (an S3-compatible server: `http://127.0.0.1:9000`
addresses it by path, without TLS when the URL says http).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import re
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import duckdb

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "LAKE_ALIAS",
    "TURN_WAIT_S",
    "Lake",
    "LakeError",
    "NoSnapshotsError",
    "WriterTurns",
    "at_snapshot",
    "attach_lake",
    "extension_file",
    "lake_from_options",
]

LAKE_ALIAS: Final = "lake"
"""The name a store's connection gives the attached lake (its `current_database()`)."""

# The wheel that ships each extension, by the extension's own name (what LOAD registers it under).
_WHEELS: Final = {
    "ducklake": "duckdb_extension_ducklake",
    "postgres_scanner": "duckdb_extension_postgres_scanner",
    "sqlite_scanner": "duckdb_extension_sqlite_scanner",
    "httpfs": "duckdb_extension_httpfs",
}

_CATALOG_EXTENSIONS: Final = {"postgres": "postgres_scanner", "sqlite": "sqlite_scanner"}


class LakeError(ValueError):
    """A lake that cannot be used as given: a catalog or data path of an unknown kind, text that
    cannot be passed on whole, or an extension that cannot be loaded. The message names the culprit."""


class NoSnapshotsError(LakeError):
    """Time travel asked of a store that keeps no snapshots: a DuckDB file holds only what it holds now."""


@dataclass(frozen=True, slots=True)
class Lake:
    """Where a lake lives: `catalog` is `postgres:<libpq connection string>` or `sqlite:<file>`;
    `data` an absolute directory path ending in `/` or `s3://bucket/prefix/`. Make one with
    `lake_from_options`, which checks both."""

    catalog: str
    data: str
    as_of: datetime | None = None
    """Time travel: the lake as its last snapshot committed at or before this time (read-only); None:
    the lake as it is."""

    @property
    def kind(self) -> str:
        """`postgres` or `sqlite`."""
        return self.catalog.split(":", 1)[0]

    def __str__(self) -> str:
        # Never a password from the connection string.
        when = f" as of {self.as_of.isoformat()}" if self.as_of is not None else ""
        return f"the lake {_without_password(self.catalog)} (data {self.data}){when}"


def lake_from_options(catalog: str, data: str, *, as_of: datetime | None = None) -> Lake:
    """The `Lake` of `--lake CATALOG --data PATH [--as-of TIME]`; a local data directory is made
    absolute and created when missing. Raises `LakeError` naming what is wrong (a time without its
    zone among it: a snapshot time is an instant; and a time after now)."""
    if as_of is not None and as_of.tzinfo is None:
        raise LakeError(f"--as-of {as_of.isoformat()} has no time zone; give one (2026-12-01T00:00:00Z)")
    if as_of is not None and as_of > datetime.now(UTC):
        raise LakeError(f"--as-of {as_of.isoformat()} is in the future: the lake answers for past times only")
    for name, text in (("--lake", catalog), ("--data", data)):
        if any(c in text for c in "\x00\r\n"):
            raise LakeError(f"{name} must be one line of text without NUL bytes, got {text!r}")
    kind, sep, rest = catalog.partition(":")
    if not sep or kind not in _CATALOG_EXTENSIONS or not rest.strip():
        raise LakeError(
            f"--lake must be postgres:<connection string> or sqlite:<file>, got {_without_password(catalog)!r}"
        )
    if kind == "sqlite":
        rest = str(Path(rest).expanduser().absolute())
    scheme = urllib.parse.urlsplit(data).scheme
    if scheme == "s3":
        parsed = urllib.parse.urlsplit(data)
        if not parsed.netloc:
            raise LakeError(f"--data {data!r} names no bucket; use s3://BUCKET/PREFIX/")
        location = data if data.endswith("/") else data + "/"
    elif scheme and len(scheme) > 1:
        raise LakeError(f"--data must be a directory or s3://BUCKET/PREFIX/, got {data!r} (scheme {scheme}:)")
    else:
        directory = Path(data).expanduser().absolute()
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LakeError(f"--data {data!r}: cannot create the directory ({exc.strerror})") from exc
        location = str(directory) + "/"
    return Lake(f"{kind}:{rest}", location, as_of)


def extension_file(name: str) -> Path | None:
    """The extension file the `duckdb-extension-*` wheel of `name` ships for this duckdb, or None
    when that wheel is not installed (or ships none for this version)."""
    package = _WHEELS.get(name)
    spec = importlib.util.find_spec(package) if package else None
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        found = Path(root) / "extensions" / f"v{duckdb.__version__}" / f"{name}.duckdb_extension"
        if found.is_file():
            return found
    return None


def _load(con: duckdb.DuckDBPyConnection, name: str) -> None:
    found = extension_file(name)
    try:
        con.execute(f"LOAD {_text(str(found))}" if found else f"LOAD {name}").fetchall()
    except duckdb.Error as exc:
        raise LakeError(
            f"cannot load DuckDB's {name} extension ({exc}); install callgate's dependencies "
            f"(the {_WHEELS[name].replace('_', '-')} wheel), or INSTALL {name} where the network allows"
        ) from exc


def attach_lake(con: duckdb.DuckDBPyConnection, lake: Lake, *, read_only: bool = False) -> None:
    """Load what `lake` needs and attach it to `con` as `LAKE_ALIAS` (not made current: the caller
    `USE`s it). Creates the lake when its catalog is empty. Raises `LakeError` for an extension that
    cannot be loaded, DuckDB's errors for a catalog or data path it cannot reach. Blocks."""
    _load(con, "ducklake")
    _load(con, _CATALOG_EXTENSIONS[lake.kind])
    if lake.data.startswith("s3://"):
        _load(con, "httpfs")
        con.execute(_s3_secret()).fetchall()
    options = [f"DATA_PATH {_text(lake.data)}"]
    if lake.as_of is not None:
        options.append(f"SNAPSHOT_TIME {_text(lake.as_of.isoformat())}")
    if read_only or lake.as_of is not None:
        options.append("READ_ONLY")
    con.execute(f"ATTACH {_text('ducklake:' + lake.catalog)} AS {LAKE_ALIAS} ({', '.join(options)})").fetchall()


TURN_WAIT_S: Final = 10.0
"""How long a lake writer waits for its turn (`WriterTurns`) before it writes without one (a write
transaction takes 0.1 to 2 s over PostgreSQL, measured in bench/lake.py; this is several of them)."""

# The advisory lock of a lake's writers: two int4 halves (pg_locks shows them as classid and objid),
# in the catalog's database (PostgreSQL scopes advisory locks by database).
_TURN_KEY: Final = (0x63676C6B, 0x77726974)  # "cglk", "writ"


class WriterTurns:
    """Writers of one lake whose catalog is PostgreSQL take turns at writing: `turn()` holds a session
    advisory lock in the catalog's database, on a connection of its own, from before a write
    transaction begins until after it ends. The next writer then begins on a snapshot that holds the
    previous one's commit, instead of colliding with it at commit (DuckLake's conflict check refuses
    all but one of two overlapping writes, and the loser runs its whole transaction again).

    A speed measure only: correctness rests on the conflict check and the offsets fence
    (`consumers.store.StoreFencedError`), which hold with or without a turn. A turn not had within
    `TURN_WAIT_S`, or a lock connection that fails, and the writer goes on without one (counted in
    `missed`); while the holder that outwaited it (a paused process) still holds the lock, the next
    turns do not wait for it again. A SQLite catalog takes no turns (one host). Not safe from several
    threads: one per store, used under its write lock. Blocks for the wait."""

    def __init__(self, lake: Lake) -> None:
        self.lake = lake
        self.missed = 0
        """Turns not had (waited out, or the lock connection failed): those writes went on without one."""
        self._con: psycopg.Connection[Any] | None = None
        self._stuck_holder: int | None = None  # the backend that held the lock through a whole wait

    @contextlib.contextmanager
    def turn(self) -> Iterator[bool]:
        """Hold the lake's turn for the block; yields whether it is held (True also for a SQLite
        catalog, which needs none). Never raises for the lock itself."""
        if self.lake.kind != "postgres":
            yield True
            return
        held = self._take()
        try:
            yield held
        finally:
            if held:
                self._give_back()

    def close(self) -> None:
        """Close the lock connection (its session's locks go with it); idempotent."""
        if self._con is not None:
            with contextlib.suppress(Exception):
                self._con.close()
            self._con = None

    def _take(self) -> bool:
        import psycopg
        from psycopg.conninfo import conninfo_to_dict

        try:
            if self._con is None:
                dsn = self.lake.catalog.partition(":")[2]
                name = str(conninfo_to_dict(dsn).get("application_name") or "callgate")
                self._con = psycopg.connect(
                    dsn,
                    autocommit=True,
                    application_name=f"{name} lake turns",
                    connect_timeout=max(2, int(TURN_WAIT_S)),
                )
            con = self._con
            if self._stuck_holder is not None:
                row = con.execute("SELECT pg_try_advisory_lock(%s::integer, %s::integer)", _TURN_KEY).fetchone()
                if row and row[0]:
                    self._stuck_holder = None
                    return True
                if self._holder(con) == self._stuck_holder:
                    self.missed += 1
                    return False
                self._stuck_holder = None
            con.execute("SELECT set_config('lock_timeout', %s, false)", (f"{max(1, int(TURN_WAIT_S * 1000))}ms",))
            try:
                con.execute("SELECT pg_advisory_lock(%s::integer, %s::integer)", _TURN_KEY)
            except psycopg.errors.LockNotAvailable:
                self._stuck_holder = self._holder(con)
                self.missed += 1
                return False
            return True
        except psycopg.Error:
            # A catalog the lock cannot reach: the write goes on, and fails or not on its own.
            self.close()
            self.missed += 1
            return False

    def _give_back(self) -> None:
        import psycopg

        if self._con is None:
            return
        try:
            self._con.execute("SELECT pg_advisory_unlock(%s::integer, %s::integer)", _TURN_KEY)
        except psycopg.Error:
            self.close()  # the session's end releases the lock

    @staticmethod
    def _holder(con: psycopg.Connection[Any]) -> int | None:
        row = con.execute(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 2 "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
            "AND classid = %s::oid AND objid = %s::oid",
            _TURN_KEY,
        ).fetchone()
        return int(row[0]) if row else None


KEPT_SNAPSHOTS: Final = 4
"""How many past snapshots a DuckDB instance keeps attached for `at_snapshot` when none is in use
(attaching one reads the catalog again: about 0.1 to 0.3 s over PostgreSQL, measured in bench/lake.py)."""

# Attached snapshots in use, by alias (across this process's DuckDB instances: an alias busy in one
# is kept in every one, which only delays its detach), and when each was last asked for.
_snapshot_lock = threading.Lock()
_snapshots_in_use: dict[str, int] = {}
_snapshot_last_used: dict[str, float] = {}


@contextlib.contextmanager
def at_snapshot(con: duckdb.DuckDBPyConnection, as_of: datetime | int) -> Iterator[int]:
    """On `con`, for the duration of the block, the current database is the lake `con` reads as it was
    at `as_of`: its last snapshot committed at or before that time, or the snapshot of that id. Yields
    the snapshot id. Every table and view the store's SQL names unqualified answers from it, read-only.

    Raises `NoSnapshotsError` when `con`'s current database is not a lake (a DuckDB file), and
    `LakeError` for a time after now or before the oldest snapshot the lake keeps (older ones
    expired), or a snapshot id the lake does not hold; the message names the range it holds.
    Blocks for the attach of the snapshot the first time it is asked for (the catalog is read
    again); a snapshot stays attached for the next reader, up to `KEPT_SNAPSHOTS` unused ones.
    Safe from several threads, each with its own cursor.
    """
    found = con.execute(
        "SELECT database_name, type, path FROM duckdb_databases() WHERE database_name = current_database()"
    ).fetchall()
    if not found or found[0][1] != "ducklake":
        raise NoSnapshotsError(
            "this store is a DuckDB file, which keeps no snapshots (time travel reads a lake's past snapshots; "
            "callgate migrate moves a file into a lake)"
        )
    database, _, catalog = found[0]
    snapshot = _snapshot_at(con, str(database), as_of)
    # One alias per catalog and snapshot: a snapshot never changes, so every reader may share it.
    digest = hashlib.sha256(str(catalog).encode()).hexdigest()[:12]
    alias = f"{LAKE_ALIAS}_at_{snapshot}_{digest}"
    with _snapshot_lock:
        # Only a snapshot new to this process can have grown an instance's set past its bound.
        new = alias not in _snapshot_last_used
        _snapshots_in_use[alias] = _snapshots_in_use.get(alias, 0) + 1
        _snapshot_last_used[alias] = time.monotonic()
        try:
            con.execute(
                f"ATTACH IF NOT EXISTS {_text('ducklake:' + str(catalog))} AS {alias} "
                f"(SNAPSHOT_VERSION {snapshot}, READ_ONLY)"
            ).fetchall()
        except BaseException:
            _release(alias)
            raise
    try:
        con.execute(f"USE {alias}").fetchall()
        try:
            yield snapshot
        finally:
            con.execute(f"USE {_identifier(str(database))}").fetchall()
    finally:
        with _snapshot_lock:
            _release(alias)
            if new:
                _detach_unused(con)


def _release(alias: str) -> None:
    left = _snapshots_in_use.pop(alias, 1) - 1
    if left > 0:
        _snapshots_in_use[alias] = left


def _detach_unused(con: duckdb.DuckDBPyConnection) -> None:
    """Detach the least recently used snapshots of `con`'s instance that nobody uses, past `KEPT_SNAPSHOTS`."""
    attached = [
        str(name)
        for (name,) in con.execute(
            "SELECT database_name FROM duckdb_databases() WHERE database_name LIKE $prefix",
            {"prefix": f"{LAKE_ALIAS}_at_%"},
        ).fetchall()
    ]
    unused = sorted(
        (name for name in attached if name not in _snapshots_in_use),
        key=lambda name: _snapshot_last_used.get(name, 0.0),
    )
    for name in unused[: max(0, len(unused) - KEPT_SNAPSHOTS)]:
        con.execute(f"DETACH DATABASE IF EXISTS {name}").fetchall()
        _snapshot_last_used.pop(name, None)


def _snapshot_at(con: duckdb.DuckDBPyConnection, database: str, as_of: datetime | int) -> int:
    rows = con.execute(
        "SELECT min(snapshot_id), max(snapshot_id), min(snapshot_time), max(snapshot_time), "
        "max(snapshot_id) FILTER (WHERE snapshot_time <= $at), bool_or(snapshot_id = $id) "
        "FROM ducklake_snapshots($database)",
        {
            "database": database,
            "at": as_of if isinstance(as_of, datetime) else None,
            "id": None if isinstance(as_of, datetime) else as_of,
        },
    ).fetchall()
    first_id, last_id, first_time, last_time, at_time, known = rows[0]
    held = f"it holds snapshots {first_id} to {last_id}, from {first_time.isoformat()} to {last_time.isoformat()}"
    if isinstance(as_of, datetime):
        if as_of > datetime.now(UTC):
            raise LakeError(f"{as_of.isoformat()} is in the future: the lake answers for past times only")
        if at_time is None:
            raise LakeError(
                f"{as_of.isoformat()} is before the oldest snapshot the lake keeps (older ones expired, "
                f"or the lake is younger): {held}"
            )
        return int(at_time)
    if not known:
        raise LakeError(f"the lake holds no snapshot {as_of} (expired, or not yet taken): {held}")
    return as_of


def _identifier(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _s3_secret() -> str:
    """A temporary secret for the s3:// data path, from the environment (see the module docstring)."""
    env = os.environ
    fields = {"TYPE": "s3", "PROVIDER": "config"}
    for field, variable in (("KEY_ID", "AWS_ACCESS_KEY_ID"), ("SECRET", "AWS_SECRET_ACCESS_KEY")):
        if not env.get(variable):
            raise LakeError(f"an s3:// data path needs {variable} in the environment")
        fields[field] = env[variable]
    if env.get("AWS_SESSION_TOKEN"):
        fields["SESSION_TOKEN"] = env["AWS_SESSION_TOKEN"]
    fields["REGION"] = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1"
    endpoint = env.get("AWS_ENDPOINT_URL")
    if endpoint:
        parsed = urllib.parse.urlsplit(endpoint)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise LakeError(f"AWS_ENDPOINT_URL must look like http://HOST:PORT, got {endpoint!r}")
        fields["ENDPOINT"] = parsed.netloc
        fields["URL_STYLE"] = "path"
        fields["USE_SSL"] = "true" if parsed.scheme == "https" else "false"
    body = ", ".join(f"{k} {v if k in ('TYPE', 'PROVIDER', 'USE_SSL') else _text(v)}" for k, v in fields.items())
    return f"CREATE OR REPLACE TEMPORARY SECRET callgate_lake_s3 ({body})"


def _text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _without_password(catalog: str) -> str:
    """The catalog as a person may see it: a libpq `password=...`, or the password of a URI, as `***`."""
    shown = re.sub(r"(password\s*=\s*)('[^']*'|\S+)", r"\1***", catalog, flags=re.IGNORECASE)
    return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", shown)
