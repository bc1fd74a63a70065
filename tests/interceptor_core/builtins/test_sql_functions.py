"""`sql_functions`: the lists of functions free of effects hold what the databases themselves say.

The PostgreSQL list is checked against a real server's catalog in `test_sql_postgres.py`.
"""

from __future__ import annotations

import sqlite3
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import duckdb
import pytest
import sqlglot
import sqlglot.expressions as exp

from interceptor_core.builtins import sql_functions, sql_writes
from interceptor_core.builtins.sql import call_name

DUCKDB_EFFECTS = {"nextval", "setval", "currval", "setseed", "sleep_ms", "pg_sleep", "write_log", "error"}
DUCKDB_OUTSIDE = {"read_csv", "read_parquet", "read_text", "read_blob", "read_json", "glob", "query", "query_table"}
SQLITE_EFFECTS = {"load_extension", "fts3_tokenizer", "sqlite_log", "readfile", "writefile", "edit", "fsdir"}
MYSQL_EFFECTS = {"sleep", "benchmark", "get_lock", "release_lock", "release_all_locks", "load_file", "last_insert_id"}
MYSQL_EFFECTS |= {"master_pos_wait", "source_pos_wait", "wait_for_executed_gtid_set", "uuid_short"}


def duckdb_free_of_effects() -> set[str]:
    """The names the installed DuckDB lists only as functions free of effects: scalar, aggregate and
    window functions without side effects that are not volatile, the reviewed table functions, and
    the macros whose body calls only those (pragmas and table macros never)."""
    rows = duckdb.connect().sql(
        "SELECT function_name, function_type, has_side_effects, stability, macro_definition FROM duckdb_functions()"
    )
    kinds: dict[str, list[tuple[str, bool | None, str | None, str | None]]] = defaultdict(list)
    for name, kind, effects, stability, body in rows.fetchall():
        kinds[name].append((kind, effects, stability, body))

    def free(
        name: str, kind: str, effects: bool | None, stability: str | None, body: str | None, trusted: set[str]
    ) -> bool:
        if kind in ("scalar", "aggregate", "window"):
            return effects is False and stability != "VOLATILE"
        if kind == "table":
            return name in sql_functions.DUCKDB_TABLE_FUNCTIONS
        return kind == "macro" and _calls_only(body, trusted)

    # A macro is free of effects when its body calls only such functions (other macros among them).
    safe: set[str] = set()
    changed = True
    while changed:
        changed = False
        trusted = safe | sql_functions.DUCKDB_SYNTAX
        for name, entries in sorted(kinds.items()):
            if name not in safe and all(free(name, *entry, trusted) for entry in entries):
                safe.add(name)
                changed = True
    return {name for name in safe if name.isidentifier() and name == name.lower() and not name.startswith("__")}


def _calls_only(body: str | None, trusted: set[str]) -> bool:
    """Whether a macro's body calls only `trusted` functions, by unqualified name."""
    if not body:
        return False
    text = f"SELECT {body}"
    try:
        tree = sqlglot.parse_one(text, read="duckdb")
    except Exception:
        return False
    for node in tree.walk():
        if isinstance(node, exp.Func):
            written = call_name(node, text)
            if written is None:
                continue
            name, quoted = written
            parent = node.parent
            if quoted or (isinstance(parent, exp.Dot) and parent.expression is node) or name.lower() not in trusted:
                return False
    return True


class TestDuckDB:
    def test_every_listed_name_is_free_of_effects_in_the_installed_duckdb(self) -> None:
        """Each committed name is, in DuckDB's own list, free of side effects (or a reviewed table function)."""
        not_free = sql_functions.DUCKDB_LISTED - duckdb_free_of_effects()
        assert not not_free, sorted(not_free)

    def test_functions_with_effects_or_reading_outside_are_not_listed(self) -> None:
        """Sequences, sleeps, logs, file readers and SQL-text runners are absent."""
        assert not (DUCKDB_EFFECTS | DUCKDB_OUTSIDE) & sql_functions.DUCKDB

    def test_the_list_holds_the_everyday_functions(self) -> None:
        """Aggregates, window functions, string and date functions are listed."""
        assert {"count", "sum", "lower", "row_number", "date_trunc", "now", "strftime", "range"} <= sql_functions.DUCKDB


DUCKDB_WRITES = [
    "SELECT nextval('s')",
    "SELECT sleep_ms(700)",
    "SELECT * FROM read_csv('{root}/marker.csv')",
    "SELECT * FROM read_text('{root}/marker.csv')",
    "SELECT * FROM '{root}/marker.csv'",
    'SELECT * FROM "{root}/marker.csv"',
    "SELECT * FROM glob('{root}/*')",
    "SELECT * FROM query('SELECT * FROM read_csv(''{root}/marker.csv'')')",
    "COPY orders TO '{root}/out.csv'",
    "ATTACH ':memory:' AS other",
    "SET VARIABLE v = 1",
    "SET threads = 1",
    "CREATE TEMP TABLE scratch AS SELECT 1",
    "INSERT INTO orders VALUES (9, 9)",
    "WITH x AS (SELECT 1) SELECT nextval('s') FROM x",
]
DUCKDB_READS = [
    "SELECT count(*), sum(total), avg(total), max(id) FROM orders",
    "SELECT id, row_number() OVER (ORDER BY total), lag(total) OVER (ORDER BY id) FROM orders",
    "SELECT * FROM range(3) AS r(n)",
    "SELECT unnest([1, 2, 3])",
    "SELECT lower('A'), upper('b'), length('abc'), concat('a', 'b'), now(), date_trunc('day', now())",
    "SELECT strftime(now(), '%Y'), list_sum([1, 2]), coalesce(NULL, 1), greatest(1, 2)",
    "SELECT * FROM duckdb_tables()",
    "FROM orders SELECT id",
]


def _duckdb_state(db: Any, root: Path) -> dict[str, Any]:
    one = lambda sql: db.sql(sql).fetchall()  # noqa: E731
    return {
        "rows": one("SELECT * FROM orders ORDER BY id"),
        "sequence": one("SELECT last_value FROM duckdb_sequences()"),
        "settings": one("SELECT name, value FROM duckdb_settings() ORDER BY name"),
        "catalog": one("SELECT count(*) FROM duckdb_tables()") + one("SELECT count(*) FROM duckdb_databases()"),
        "variables": one("SELECT count(*) FROM duckdb_variables()"),
        "files": sorted(path.name for path in root.iterdir()),
    }


class TestDuckDBRuns:
    """Statements run in a real DuckDB file: whatever changed anything or read a file was judged writing."""

    @pytest.fixture
    def database(self, tmp_path: Path) -> tuple[Path, Path]:
        root = tmp_path / "files"
        root.mkdir()
        (root / "marker.csv").write_text("marker\nmarker-7d1a\n")
        path = tmp_path / "corpus.duckdb"
        with duckdb.connect(str(path)) as db:
            db.execute("CREATE TABLE orders (id INTEGER, total INTEGER)")
            db.execute("INSERT INTO orders VALUES (1, 10), (2, 20)")
            db.execute("CREATE SEQUENCE s")
        return path, root

    @pytest.mark.parametrize("query", DUCKDB_WRITES)
    def test_a_statement_with_an_effect_was_judged_writing(self, query: str, database: tuple[Path, Path]) -> None:
        """Each statement here has an effect in DuckDB (checked), and sql_writes refuses it."""
        path, root = database
        sql = query.replace("{root}", str(root))
        with duckdb.connect(str(path)) as db:
            before = _duckdb_state(db, root)
            started = time.monotonic()
            rows = db.sql(sql).fetchall() if sql.startswith(("SELECT", "WITH")) else db.execute(sql).fetchall()
            took = time.monotonic() - started
            after = _duckdb_state(db, root)
        effects = [what for what in before if before[what] != after[what]]
        effects += ["slept"] if took > 0.5 else []
        effects += ["read a file"] if "marker" in repr(rows) else []
        assert effects, f"{query}: no effect seen, so the case proves nothing"
        assert sql_writes(sql, dialect="duckdb"), f"{query}: {effects} but judged read-only"

    @pytest.mark.parametrize("query", DUCKDB_READS)
    def test_a_query_judged_read_only_runs_on_a_read_only_connection(
        self, query: str, database: tuple[Path, Path]
    ) -> None:
        """sql_writes lets it through, and DuckDB runs it with the file opened read-only."""
        path, _ = database
        assert not sql_writes(query, dialect="duckdb")
        with duckdb.connect(str(path), read_only=True) as db:
            db.sql(query).fetchall()


class TestSQLite:
    def test_every_listed_name_exists_in_the_installed_sqlite(self) -> None:
        """Names older than SQLite 3.41 are all functions of the installed SQLite (no typos)."""
        with sqlite3.connect(":memory:") as db:
            installed = {row[0] for row in db.execute("PRAGMA function_list")}
        missing = sql_functions.SQLITE - sql_functions.SQLITE_SINCE_3_41 - installed
        assert not missing, sorted(missing)

    def test_functions_with_effects_are_not_listed(self) -> None:
        """load_extension, fts3_tokenizer, the shell's file functions are absent."""
        assert not SQLITE_EFFECTS & sql_functions.SQLITE


class TestMySQL:
    def test_functions_with_effects_are_not_listed(self) -> None:
        """Sleeps, locks, server file reads, replication waits and last_insert_id(x) are absent."""
        assert not MYSQL_EFFECTS & sql_functions.MYSQL


class TestEvery:
    @pytest.mark.parametrize("name", ["count", "sum", "min", "max", "avg", "lower", "upper", "coalesce", "row_number"])
    def test_the_functions_every_database_shares_are_listed(self, name: str) -> None:
        """What a text read without a dialect may call: the everyday functions of all four."""
        assert name in sql_functions.EVERY

    def test_names_are_lower_case_identifiers(self) -> None:
        """Every name is what an unquoted call is read as."""
        for names in sql_functions.SAFE_FUNCTIONS.values():
            assert all(name.isidentifier() and name == name.lower() for name in names)
