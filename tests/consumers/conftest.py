"""What the store tests share: a store file as an older release left it, and new lakes."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import duckdb
import psycopg
import pytest

from consumers.lake import Lake, lake_from_options
from consumers.store import MIGRATIONS

OlderStore = Callable[[Path, int], None]


def make_older_store(path: Path, version: int) -> None:
    """Create `path` with the schema of migrations 1..`version` only, as the code of that version
    left a new store (no rows)."""
    con = duckdb.connect(str(path))
    try:
        con.execute(
            "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name VARCHAR NOT NULL, "
            "applied_at TIMESTAMPTZ NOT NULL)"
        )
        for migration in MIGRATIONS[:version]:
            for statement in migration.statements:
                con.execute(statement)
            con.execute("INSERT INTO schema_migrations VALUES (?, ?, now())", [migration.version, migration.name])
    finally:
        con.close()


@pytest.fixture
def older_store() -> OlderStore:
    """`make_older_store(path, version)`."""
    return make_older_store


NewLake = Callable[[], Lake]


@pytest.fixture
def new_lake(tmp_path: Path, postgres_dsn: str) -> NewLake:
    """`new_lake()`: a lake of its own, its catalog a new database of the session's PostgreSQL, its
    data a new directory under the test's temporary directory."""
    made = 0

    def make() -> Lake:
        nonlocal made
        made += 1
        database = f"lake_{uuid.uuid4().hex}"
        with psycopg.connect(postgres_dsn, autocommit=True) as con:
            con.execute(f'CREATE DATABASE "{database}"')
        dsn = postgres_dsn.replace("dbname=postgres", f"dbname={database}")
        return lake_from_options(f"postgres:{dsn}", str(tmp_path / f"lake-data-{made}"))

    return make
