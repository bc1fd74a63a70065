"""`sql_writes` against a real PostgreSQL: the function list matches the catalog, and every statement
of the corpus that changes anything, sleeps or reads a server file is judged writing.

Each corpus statement runs in a database of its own (tables `orders` and `customers`, the sequence
`orders_id_seq`, dblink), as a role that is not a superuser but may read and write server files and
signal its own sessions, inside a transaction that is rolled back. What it did is read from
snapshots taken before, inside the transaction after it, and after the rollback.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from interceptor_core.builtins import sql_functions, sql_writes

CORPUS = Path(__file__).parent / "corpus" / "sql_writes.yaml"
DATABASE = "sqlcorpus"
ACTOR = "sqlcorpus_actor"
MARKER = "marker-9c2e"
"""The content of a server file the corpus reads, and its name: seen in a result, a file was read."""
SLEPT_S = 0.6
"""A statement that took longer slept (the sleeping ones are cut at 1 s by statement_timeout)."""

CATALOG_QUERY = """
SELECT proname FROM pg_proc WHERE pronamespace = 'pg_catalog'::regnamespace
GROUP BY proname HAVING bool_and(provolatile IN ('i', 's') AND prokind IN ('f', 'a', 'w'))
ORDER BY proname
"""


def test_the_postgres_list_is_what_the_catalog_says(postgres_dsn: str) -> None:
    """Regenerated from a real server's pg_proc, the list equals the committed one."""
    with psycopg.connect(postgres_dsn) as db:
        names = {row[0] for row in db.execute(CATALOG_QUERY)}
    regenerated = names - sql_functions.POSTGRES_STABLE_WITH_EFFECTS
    assert regenerated == sql_functions.POSTGRES_CATALOG, (
        f"added {sorted(regenerated - sql_functions.POSTGRES_CATALOG)}, "
        f"gone {sorted(sql_functions.POSTGRES_CATALOG - regenerated)}"
    )


def test_no_listed_function_is_volatile_and_none_runs_sql_text(postgres_dsn: str) -> None:
    """Beyond the reviewed few, no listed name has a volatile overload or an argument named query."""
    with psycopg.connect(postgres_dsn) as db:
        rows = db.execute(
            "SELECT proname FROM pg_proc "
            "WHERE provolatile = 'v' OR proargnames[1:pronargs] && ARRAY['query', 'sqlquery']"
        ).fetchall()
    risky = {row[0] for row in rows} & sql_functions.POSTGRES
    assert risky == set(sql_functions.POSTGRES_VOLATILE_WITHOUT_EFFECTS), sorted(risky)


@dataclass(frozen=True)
class Case:
    id: str
    sql: str
    verdict: str


def _cases() -> list[Case]:
    data = yaml.safe_load(CORPUS.read_text(encoding="utf-8"))
    assert data["config"] == {"dialect": "postgres"}
    return [Case(entry["id"], entry["value"], entry["verdict"]) for entry in data["cases"]]


CASES = _cases()


@pytest.fixture(scope="module")
def server_dir() -> Iterator[Path]:
    """A directory the server's user may write, holding the file the corpus reads."""
    path = Path(tempfile.mkdtemp(prefix="callgate-sqlcorpus-"))
    path.chmod(0o777)
    (path / f"{MARKER}.txt").write_text(MARKER)
    (path / f"{MARKER}.txt").chmod(0o644)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def actor_dsn(postgres_dsn: str) -> str:
    """A database with the corpus' tables, and the DSN of a role that can do all the corpus tries."""
    with psycopg.connect(postgres_dsn, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {DATABASE}")
        admin.execute(f"DROP ROLE IF EXISTS {ACTOR}")
        admin.execute(f"CREATE ROLE {ACTOR} LOGIN")
        for role in ("pg_read_server_files", "pg_write_server_files", "pg_signal_backend", "pg_read_all_settings"):
            admin.execute(f"GRANT {role} TO {ACTOR}")
        admin.execute(f"CREATE DATABASE {DATABASE} OWNER {ACTOR}")
    with psycopg.connect(_in_database(postgres_dsn), autocommit=True) as admin:
        admin.execute("CREATE EXTENSION dblink")
        admin.execute(f"GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA pg_catalog TO {ACTOR}")
        admin.execute(f"SET ROLE {ACTOR}")
        admin.execute("CREATE TABLE customers (id int PRIMARY KEY, name text)")
        admin.execute(
            "CREATE TABLE orders (id serial PRIMARY KEY, customer_id int, total numeric, note text, "
            "created_at timestamptz DEFAULT now())"
        )
        admin.execute("INSERT INTO customers VALUES (1, 'ada'), (2, 'bob')")
        admin.execute(
            "INSERT INTO orders (customer_id, total, note) VALUES (1, 12, 'a note'), (1, 3, 'bee'), (2, 40, 'abc')"
        )
    return _in_database(postgres_dsn).replace("user=postgres", f"user={ACTOR}")


def _in_database(dsn: str) -> str:
    return dsn.replace("dbname=postgres", f"dbname={DATABASE}")


def _state(cursor: psycopg.Cursor[Any]) -> dict[str, Any]:
    """What a statement may change, read inside its transaction."""
    one = lambda sql: cursor.execute(sql).fetchall()  # noqa: E731
    return {
        "rows": one("SELECT md5(string_agg(o::text, ',' ORDER BY o.id)) FROM orders AS o")
        + one("SELECT md5(string_agg(c::text, ',' ORDER BY c.id)) FROM customers AS c"),
        "sequence": one("SELECT last_value, is_called FROM orders_id_seq"),
        "settings": one("SELECT name, setting FROM pg_settings ORDER BY name"),
        "large objects": one("SELECT count(*) FROM pg_largeobject_metadata"),
        "catalog": one("SELECT count(*) FROM pg_class"),
        "transaction id": one("SELECT txid_current_if_assigned() IS NOT NULL"),
        "locks": one("SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory'"),
        "prepared": one("SELECT count(*) FROM pg_prepared_statements"),
        "cursors": one("SELECT count(*) FROM pg_cursors"),
    }


@dataclass
class Outcome:
    effects: list[str]
    error: str | None


def _run(actor_dsn: str, root: Path, sql: str) -> Outcome:
    """Runs `sql` once in a fresh session with a victim session beside it; what it changed."""
    effects: list[str] = []
    files_before = set(os.listdir(root))
    with psycopg.connect(actor_dsn) as victim, psycopg.connect(actor_dsn) as db:
        victim.execute("SELECT 1")
        victim.commit()
        db.execute("SET statement_timeout = '1s'")
        db.commit()
        cursor = db.cursor()
        before = _state(cursor)
        error = None
        rows: list[Any] = []
        started = time.monotonic()
        try:
            cursor.execute(sql)
            while True:
                if cursor.description is not None:
                    rows += cursor.fetchall()
                if not cursor.nextset():
                    break
        except psycopg.Error as exc:
            error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        took = time.monotonic() - started
        if took > SLEPT_S:
            effects.append(f"slept {took:.1f} s")
        if MARKER in repr(rows) or "root:x:0:0" in repr(rows):
            effects.append("read a server file")
        if error is None and not db.closed:
            try:
                after = _state(cursor)
                effects += [f"changed {what}" for what in before if after[what] != before[what]]
            except psycopg.Error as exc:
                effects.append(f"left the session unusable ({type(exc).__name__})")
        if not db.closed:
            try:
                db.rollback()
                session = _state(db.cursor())
                for what in ("sequence", "large objects", "locks", "prepared", "settings"):
                    if session[what] != before[what]:
                        effects.append(f"changed {what} beyond the transaction")
            except psycopg.OperationalError:
                effects.append("terminated its own session")
        try:
            victim.execute("SELECT 1")
        except psycopg.OperationalError:
            effects.append("terminated another session")
    if set(os.listdir(root)) != files_before:
        effects.append("wrote a server file")
    return Outcome(effects, error)


@pytest.fixture(scope="module")
def outcomes(actor_dsn: str, server_dir: Path) -> dict[str, Outcome]:
    """Every corpus statement, run once."""
    results: dict[str, Outcome] = {}
    for case in CASES:
        sql = case.sql.replace("{root}", str(server_dir))
        results[case.id] = _run(actor_dsn, server_dir, sql) if _sendable(sql) else Outcome([], "not sendable")
        for extra in set(os.listdir(server_dir)) - {f"{MARKER}.txt"}:
            os.remove(server_dir / extra)
    return results


def _sendable(sql: str) -> bool:
    """libpq cannot send a NUL or a lone surrogate (it is the check's business to refuse them)."""
    try:
        sql.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return "\0" not in sql


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_a_statement_that_changed_anything_was_judged_writing(case: Case, outcomes: dict[str, Outcome]) -> None:
    """Whatever changed rows, sequences, settings, large objects, locks, files or sessions, slept or
    read a server file, sql_writes refused (and the corpus says refuse)."""
    outcome = outcomes[case.id]
    if outcome.effects:
        assert sql_writes(case.sql, dialect="postgres"), f"{case.id}: {outcome.effects} but judged read-only"
        assert case.verdict == "refuse", f"{case.id}: {outcome.effects} but the corpus says pass"


@pytest.mark.parametrize("case", [case for case in CASES if case.verdict == "pass"], ids=lambda case: case.id)
def test_every_passing_statement_runs_in_a_read_only_transaction(case: Case, actor_dsn: str) -> None:
    """The server itself agrees: each query the check lets through runs under SET TRANSACTION READ ONLY."""
    with psycopg.connect(actor_dsn) as db:
        db.execute("SET statement_timeout = '1s'")
        db.execute("SET TRANSACTION READ ONLY")
        db.execute(case.sql)
        db.rollback()


def test_the_corpus_holds_statements_that_really_change_things(outcomes: dict[str, Outcome]) -> None:
    """The real server saw effects from each class the corpus names (so the test above is not empty)."""
    seen = " ".join(effect for outcome in outcomes.values() for effect in outcome.effects)
    for effect in ("slept", "read a server file", "wrote a server file", "changed sequence", "changed rows"):
        assert effect in seen, effect
    for effect in ("changed settings", "changed large objects", "terminated another session", "changed locks"):
        assert effect in seen, effect


def test_no_builtin_operator_cast_or_type_input_is_volatile(postgres_dsn: str) -> None:
    """Operators, casts and literals of built-in types (syntax the check lets through without a
    function name) call only immutable or stable functions in the catalog."""
    with psycopg.connect(postgres_dsn) as db:
        volatile = db.execute(
            "SELECT p.proname FROM pg_proc AS p WHERE p.provolatile = 'v' AND ("
            " p.oid IN (SELECT oprcode FROM pg_operator) OR p.oid IN (SELECT castfunc FROM pg_cast)"
            " OR p.oid IN (SELECT typinput FROM pg_type))"
        ).fetchall()
    assert volatile == []
