"""What the store tests share: a store file as an older release left it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import duckdb
import pytest

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
