"""`sql_functions`: the lists of functions free of effects hold what the databases themselves say.

The PostgreSQL list is checked against a real server's catalog in `test_sql_postgres.py`.
"""

from __future__ import annotations

import sqlite3
from collections import defaultdict

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

    def test_a_query_calling_listed_functions_really_only_reads(self) -> None:
        """In a read-only DuckDB connection, a query sql_writes lets through runs."""
        query = "SELECT lower('A'), date_trunc('day', now()), sum(x), row_number() OVER () FROM range(3) AS t(x)"
        assert not sql_writes(query, dialect="duckdb")
        duckdb.connect(":memory:", read_only=False).sql(query).fetchall()


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
