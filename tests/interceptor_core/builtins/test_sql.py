"""`sql_writes` and `ReadOnlySQL`: the ways a write hides in SQL a tool was told is read-only."""

from __future__ import annotations

from typing import Any

import pytest

from interceptor_core import ConfigurationError, Deny, Gate, tool
from interceptor_core.builtins import ReadOnlySQL, sql_writes
from interceptor_core.decisions import Allow
from interceptor_core.testing import check_before


class TestReads:
    @pytest.mark.parametrize(
        "query",
        [
            "SELECT 1",
            "select a, b from t where x > 1 order by a limit 10 offset 5",
            "SELECT t.a, u.b FROM t JOIN u ON t.id = u.id LEFT JOIN v USING (id)",
            "SELECT count(*) FROM t GROUP BY a HAVING count(*) > 1",
            "SELECT row_number() OVER (PARTITION BY a ORDER BY b) FROM t",
            "WITH x AS (SELECT 1 AS a), y AS (SELECT a FROM x) SELECT * FROM y",
            "SELECT 1 UNION SELECT 2",
            "SELECT 1 UNION ALL SELECT 2 INTERSECT SELECT 3 EXCEPT SELECT 4",
            "(SELECT 1)",
            "SELECT * FROM t WHERE a IN (SELECT b FROM u)",
            "SELECT (SELECT max(a) FROM t)",
            "SELECT 'DROP TABLE t; DELETE FROM u'",
            "SELECT 1 -- ; DROP TABLE t",
            "SELECT 1 /* ; DROP TABLE t */",
            "/* a report */ SELECT 1;",
            "SELECT 1; SELECT 2;",
            "SELECT 1; -- done",
        ],
    )
    def test_queries_that_only_read_do_not_write(self, query: str) -> None:
        """Selects with joins, CTEs of selects, set operations, subqueries, and write words in strings or comments."""
        assert not sql_writes(query)

    @pytest.mark.parametrize("query", ["", "   ", "-- nothing", "/* nothing */", ";", ";;"])
    def test_a_text_that_runs_nothing_does_not_write(self, query: str) -> None:
        """Empty text, comments alone and bare semicolons run no statement."""
        assert not sql_writes(query)

    @pytest.mark.parametrize(
        ("query", "dialect"),
        [
            ("DESCRIBE t", "duckdb"),
            ("SHOW TABLES", "duckdb"),
            ("SUMMARIZE t", "duckdb"),
            ("FROM t", "duckdb"),
            ("SHOW TABLES", "mysql"),
            ("EXPLAIN SELECT 1", "mysql"),
            ("SELECT `a` FROM `t`", "mysql"),
            ("SELECT TOP 5 * FROM t", "tsql"),
            ("SELECT $$it's$$", "postgres"),
            ("SELECT a::int FROM t", "postgres"),
            ("SELECT * FROM main.t", "duckdb"),
            ("SELECT $tag$; DELETE FROM t; $tag$", "postgres"),
            ("SELECT 1 /* /* */ ; DELETE FROM t; /* */ */", "postgres"),
        ],
    )
    def test_dialect_reads_are_reads_in_their_dialect(self, query: str, dialect: str) -> None:
        """DESCRIBE, SHOW, SUMMARIZE and dialect syntax read, once the dialect is named."""
        assert not sql_writes(query, dialect=dialect)


class TestWrites:
    @pytest.mark.parametrize(
        "query",
        [
            "INSERT INTO t VALUES (1)",
            "UPDATE t SET a = 1",
            "DELETE FROM t WHERE 1 = 0",
            "MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN DELETE",
            "TRUNCATE TABLE t",
            "CREATE TABLE t (a INT)",
            "CREATE TEMP TABLE x AS SELECT 1",
            "CREATE OR REPLACE VIEW v AS SELECT 1",
            "ALTER TABLE t ADD COLUMN b INT",
            "DROP TABLE t",
            "GRANT SELECT ON t TO u",
            "REVOKE SELECT ON t FROM u",
            "SET search_path = x",
            "COPY t TO '/tmp/x'",
            "COPY t FROM '/tmp/x'",
            "PRAGMA table_info(t)",
            "PRAGMA journal_mode = WAL",
            "CALL p()",
            "EXECUTE p",
            "VACUUM",
            "ANALYZE t",
            "BEGIN",
            "COMMIT",
            "USE db",
            "COMMENT ON TABLE t IS 'x'",
            "PREPARE p AS DELETE FROM t",
        ],
    )
    def test_statements_that_write_or_change_schema_write(self, query: str) -> None:
        """DML, DDL, privileges, session settings, COPY, PRAGMA, procedures and maintenance all count."""
        assert sql_writes(query)

    @pytest.mark.parametrize(
        "query",
        [
            "SELECT 1; DROP TABLE t",
            "SELECT 1;DELETE FROM t",
            "select 1; select 2; update t set a = 1",
            "/* harmless */ DROP TABLE t",
            "-- x\nDELETE FROM t",
            "SELECT 1 -- x\n; DROP TABLE t",
        ],
    )
    def test_a_write_after_a_read_or_a_comment_writes(self, query: str) -> None:
        """Every statement of a text is judged, and comments hide nothing that follows them."""
        assert sql_writes(query)

    @pytest.mark.parametrize(
        "query",
        [
            "WITH d AS (DELETE FROM t RETURNING *) SELECT * FROM d",
            "WITH u AS (UPDATE t SET a = 1 RETURNING *) SELECT * FROM u",
            "WITH i AS (INSERT INTO t VALUES (1) RETURNING *) SELECT * FROM i",
            "SELECT * FROM t WHERE a IN (WITH d AS (DELETE FROM u RETURNING a) SELECT a FROM d)",
            "SELECT 1 UNION SELECT * FROM (WITH d AS (DELETE FROM t RETURNING a) SELECT a FROM d) AS s",
        ],
    )
    def test_a_write_inside_a_query_writes(self, query: str) -> None:
        """A data-modifying CTE, at the top or nested in a subquery, makes the SELECT a write."""
        assert sql_writes(query, dialect="postgres")

    @pytest.mark.parametrize(
        ("query", "dialect"),
        [
            ("SELECT * INTO new_t FROM t", None),
            ("SELECT * INTO new_t FROM t", "tsql"),
            ("SELECT 1 INTO TEMP x", "postgres"),
            ("SELECT * FROM t FOR UPDATE", None),
            ("SELECT * FROM t FOR SHARE", "postgres"),
            ("SELECT * FROM t FOR NO KEY UPDATE SKIP LOCKED", "postgres"),
            ("SELECT * FROM (SELECT * FROM t FOR UPDATE) AS s", "postgres"),
            ("SELECT * FROM t LOCK IN SHARE MODE", "mysql"),
            ("SELECT 1 INTO OUTFILE '/tmp/x'", "mysql"),
        ],
    )
    def test_a_select_that_creates_a_table_or_takes_locks_writes(self, query: str, dialect: str | None) -> None:
        """SELECT ... INTO and locking reads change the database or block it."""
        assert sql_writes(query, dialect=dialect)

    @pytest.mark.parametrize(
        ("query", "dialect"),
        [
            ("ATTACH DATABASE 'x.db' AS x", "sqlite"),
            ("DETACH DATABASE x", "sqlite"),
            ("ATTACH 'x.db'", "duckdb"),
            ("REPLACE INTO t VALUES (1)", "sqlite"),
            ("INSERT OR REPLACE INTO t VALUES (1)", "sqlite"),
            ("PRAGMA version", "duckdb"),
            ("INSTALL httpfs", "duckdb"),
            ("LOAD httpfs", "duckdb"),
            ("COPY (SELECT 1) TO 'out.csv'", "duckdb"),
            ("CREATE SECRET s (TYPE s3)", "duckdb"),
            ("SET memory_limit = '1GB'", "duckdb"),
            ("CHECKPOINT", "duckdb"),
            ("LOCK TABLE t IN ACCESS EXCLUSIVE MODE", "postgres"),
            ("LOCK TABLES t WRITE", "mysql"),
            ("SET ROLE admin", "postgres"),
            ("DO $$ BEGIN DELETE FROM t; END $$", "postgres"),
            ("VACUUM", "postgres"),
            ("LOAD DATA INFILE 'x' INTO TABLE t", "mysql"),
            ("EXEC p", "tsql"),
            ("EXECUTE sp_configure", "tsql"),
        ],
    )
    def test_dialect_commands_write(self, query: str, dialect: str) -> None:
        """ATTACH, DETACH, REPLACE, PRAGMA, INSTALL, LOAD, LOCK, DO blocks and EXEC count in their dialects."""
        assert sql_writes(query, dialect=dialect)

    @pytest.mark.parametrize(
        ("query", "dialect"),
        [
            ("EXPLAIN ANALYZE DELETE FROM t", "postgres"),
            ("EXPLAIN ANALYZE DELETE FROM t", "mysql"),
            ("EXPLAIN ANALYZE DELETE FROM t", "duckdb"),
            ("EXPLAIN SELECT 1", "postgres"),
            ("DESCRIBE DELETE FROM t", "mysql"),
        ],
    )
    def test_explain_of_a_write_writes(self, query: str, dialect: str) -> None:
        """EXPLAIN ANALYZE runs the statement; EXPLAIN that sqlglot reads as a command counts too."""
        assert sql_writes(query, dialect=dialect)

    @pytest.mark.parametrize(
        "query", ["DETACH x", "INSTALL httpfs", "REINDEX t", "DISCARD ALL", "NOTIFY c", "FLUSH PRIVILEGES"]
    )
    def test_a_statement_sqlglot_does_not_know_writes(self, query: str) -> None:
        """A command sqlglot only half-parses (as a bare expression or an unknown command) counts."""
        assert sql_writes(query)

    @pytest.mark.parametrize(
        "query", ["SELEC 1", "SELECT (", "DROP", "SELECT 1 /* unterminated", "SELECT '", "(" * 5000 + "1" + ")" * 5000]
    )
    def test_text_that_does_not_parse_writes(self, query: str) -> None:
        """Typos, unterminated strings and comments, and nesting too deep to parse all count as writing."""
        assert sql_writes(query)

    def test_values_that_are_not_text_write(self) -> None:
        """None, bytes, numbers and lists are not SQL text: counted as writing, never raising."""
        for value in (None, b"SELECT 1", 1, ["SELECT 1"]):
            assert sql_writes(value)


class TestHiddenStatements:
    def test_a_mysql_executable_comment_writes(self) -> None:
        """MySQL runs the text of /*! ... */ that every parser reads as a comment."""
        assert sql_writes("SELECT 1 /*! ; DROP TABLE t */", dialect="mysql")
        assert sql_writes("SELECT 1 /*!50000 , sleep(10) */", dialect="mysql")
        assert sql_writes("SELECT 1 /*M! ; DROP TABLE t */")

    @pytest.mark.parametrize(
        "query",
        [
            # MySQL: 'a\'' is one string, so DROP runs; to sqlglot's default rules it is all string.
            "SELECT 'a\\''; DROP TABLE t; -- '",
            # Postgres: E'\'' is one string, so DROP runs.
            "SELECT E'\\''; DROP TABLE t; -- '",
            # MySQL does not nest comments: the first */ ends it, so DROP runs.
            "SELECT 1 /* /* */ ; DROP TABLE t; /* */ */",
            # T-SQL: [x'] is an identifier, so DROP runs.
            "SELECT [x'];DROP TABLE t;--']",
            # Postgres ends a -- comment at a carriage return, MySQL only at a line feed.
            "SELECT 1 -- \r; DROP TABLE t",
        ],
    )
    def test_without_a_dialect_no_dialect_may_see_a_hidden_statement(self, query: str) -> None:
        """Text one dialect reads as a string or comment but another runs is caught when no dialect is named."""
        assert sql_writes(query)

    def test_with_the_right_dialect_the_statement_is_seen(self) -> None:
        """Named, the dialect whose rules hide nothing there reads the write."""
        assert sql_writes("SELECT 'a\\''; DROP TABLE t; -- '", dialect="mysql")
        assert sql_writes("SELECT E'\\''; DROP TABLE t; -- '", dialect="postgres")

    def test_syntax_of_one_dialect_needs_that_dialect(self) -> None:
        """Without a dialect, backticks read as an error elsewhere: counted as writing until the dialect is named."""
        assert sql_writes("SELECT `a` FROM t")
        assert not sql_writes("SELECT `a` FROM t", dialect="mysql")

    def test_an_unknown_dialect_is_the_authors_mistake(self) -> None:
        """A dialect sqlglot does not know raises ValueError."""
        with pytest.raises(ValueError, match="nosuch"):
            sql_writes("SELECT 1", dialect="nosuch")


def database(seen: list[str]) -> Any:
    @tool
    def query_db(sql: str, limit: int = 100) -> str:
        """Runs a query."""
        seen.append(sql)
        return "rows"

    return query_db


class TestReadOnlySQL:
    async def test_through_a_gate_a_write_is_denied_before_the_tool_runs(self) -> None:
        """The denial names the tool, the argument and what was found; a read goes through."""
        seen: list[str] = []
        desk = Gate("g", interceptors=[ReadOnlySQL("sql", dialect="postgres")]).agent("a", tools=[database(seen)])
        denied = await desk.call("query_db", {"sql": "WITH d AS (DELETE FROM orders RETURNING *) SELECT * FROM d"})
        assert denied.kind == "denied"
        assert seen == []
        message = denied.message or ""
        assert "query_db" in message
        assert "'sql'" in message
        assert "DELETE" in message
        allowed = await desk.call("query_db", {"sql": "SELECT * FROM orders"})
        assert allowed.kind == "ok"
        assert seen == ["SELECT * FROM orders"]

    async def test_the_denial_says_what_was_found(self) -> None:
        """A command, a lock and unparseable text are each named."""
        check = ReadOnlySQL("sql")
        for sql, found in [
            ("VACUUM", "VACUUM command"),
            ("SELECT * FROM t FOR UPDATE", "FOR UPDATE"),
            ("SELEC 1", "could not be parsed"),
            ("DROP TABLE t", "DROP statement"),
        ]:
            decision = await check_before(check, database([]), {"sql": sql})
            assert isinstance(decision, Deny)
            assert found in decision.message

    async def test_only_matching_tools_and_present_fields_are_checked(self) -> None:
        """Other tools and absent or None fields pass; each query of a list is checked."""

        @tool
        def batch(queries: list[str], setup: str | None = None) -> str:
            """Runs queries."""
            return ""

        check = ReadOnlySQL(["queries", "setup", "missing"], tools=["batch"])
        assert await check_before(check, batch, {"queries": ["SELECT 1", "SELECT 2"]}) == Allow()
        assert isinstance(await check_before(check, batch, {"queries": ["SELECT 1", "DROP TABLE t"]}), Deny)
        assert isinstance(await check_before(check, batch, {"queries": [], "setup": "SET x = 1"}), Deny)
        assert await check_before(check, database([]), {"sql": "DROP TABLE t"}) == Allow()

    @pytest.mark.parametrize(
        ("kwargs", "culprit"),
        [
            ({"fields": []}, "fields"),
            ({"fields": "sql", "dialect": "nosuch"}, "nosuch"),
            ({"fields": "sql", "tools": [3]}, "glob"),
            ({"fields": "sql", "name": ""}, "name"),
            ({"fields": "sql", "mandatory": 1}, "mandatory"),
        ],
    )
    def test_bad_configuration_is_refused_when_built(self, kwargs: dict[str, Any], culprit: str) -> None:
        """Each bad argument raises ConfigurationError naming it."""
        with pytest.raises(ConfigurationError, match=culprit):
            ReadOnlySQL(**kwargs)

    def test_name_and_mandatory_are_what_the_gate_reads(self) -> None:
        """The defaults, and both overridable."""
        assert (ReadOnlySQL("q").name, ReadOnlySQL("q").mandatory) == ("read-only-sql", False)
        custom = ReadOnlySQL("q", name="reports", mandatory=True)
        assert (custom.name, custom.mandatory) == ("reports", True)


class TestFunctions:
    @pytest.mark.parametrize(
        "query",
        [
            "SELECT nextval('s')",
            "SELECT pg_sleep(1)",
            "SELECT * FROM pg_sleep(1)",
            "SELECT set_config('search_path', 'x', false)",
            "SELECT query_to_xml('DELETE FROM t', true, true, '')",
            "SELECT pg_catalog.pg_read_file('/etc/passwd')",
            "SELECT my_fn(1)",
            "SELECT public.lower('A')",
            "SELECT \"LOWER\"('A')",
            "SELECT txid_current()",
        ],
    )
    def test_a_call_of_a_function_not_known_free_of_effects_writes(self, query: str) -> None:
        """Volatile, unknown, quoted-in-another-case and qualified-elsewhere calls all count."""
        assert sql_writes(query, dialect="postgres") is True

    @pytest.mark.parametrize(
        "query",
        [
            "SELECT lower(a), coalesce(a, b), now(), date_trunc('day', c), pg_catalog.upper(a) FROM t",
            "SELECT random(), a::int, a || b, a ->> 'k', CASE WHEN a THEN 1 END FROM t",
            "SELECT * FROM generate_series(1, 3) AS g(n), unnest(ARRAY[1]) AS u(x)",
        ],
    )
    def test_calls_of_functions_free_of_effects_read(self, query: str) -> None:
        """Built-ins the catalog calls immutable or stable, casts, operators and CASE read."""
        assert sql_writes(query, dialect="postgres") is False

    @pytest.mark.parametrize(
        ("query", "dialect"),
        [
            ("SELECT sleep(1)", "mysql"),
            ("SELECT benchmark(1000000, md5('x'))", "mysql"),
            ("SELECT @a := 1", "mysql"),
            ("SELECT load_file('/etc/passwd')", "mysql"),
            ("SELECT load_extension('x')", "sqlite"),
            ("SELECT * FROM read_csv('/etc/passwd')", "duckdb"),
            ("SELECT * FROM 'data.csv'", "duckdb"),
            ('SELECT * FROM "data.parquet"', "duckdb"),
            ("SELECT * FROM query('DELETE FROM t')", "duckdb"),
            ("SELECT nextval('s')", "duckdb"),
            ("SELECT NEXT VALUE FOR s", "tsql"),
            ("SELECT `lower`('A')", "mysql"),
            ("SELECT s.nextval FROM dual", "oracle"),
            ("SELECT s.NEXTVAL", "snowflake"),
            ("SELECT * FROM data.csv", "duckdb"),
            ("SELECT * FROM data.csv.gz", "duckdb"),
            ('SELECT * FROM data."JSON"', "duckdb"),
            ("SELECT * FROM data.parquet", None),
            ("SUMMARIZE 'data.csv'", "duckdb"),
        ],
    )
    def test_functions_with_effects_write_in_their_dialects(self, query: str, dialect: str) -> None:
        """Sleeps, file reads, variable assignments and sequences, by each dialect's list; in MySQL a
        backquoted name calls a stored function, not the built-in. `seq.nextval` advances a sequence
        (Oracle, Snowflake, MariaDB); DuckDB reads the file `data.csv` for an unquoted dotted name."""
        assert sql_writes(query, dialect=dialect) is True

    def test_without_a_dialect_a_function_must_be_free_of_effects_everywhere(self) -> None:
        """now() is known in PostgreSQL but not in SQLite: without a dialect it counts as writing."""
        assert sql_writes("SELECT now()", dialect="postgres") is False
        assert sql_writes("SELECT now()") is True
        assert sql_writes("SELECT lower(a), count(*) FROM t") is False

    def test_a_policy_may_name_its_own_safe_functions(self) -> None:
        """Named functions read, unqualified or qualified, without regard to case; others still write."""
        assert sql_writes("SELECT my_fn(1)", dialect="postgres", safe_functions=["MY_FN"]) is False
        assert sql_writes("SELECT reports.total(1)", dialect="postgres", safe_functions=["reports.total"]) is False
        assert sql_writes("SELECT other.total(1)", dialect="postgres", safe_functions=["reports.total"]) is True
        assert sql_writes("SELECT my_fn(1), pg_sleep(1)", dialect="postgres", safe_functions=["my_fn"]) is True

    @pytest.mark.parametrize(("names", "error"), [("my_fn", TypeError), (["a b"], ValueError), ([""], ValueError)])
    def test_bad_safe_functions_are_the_authors_mistake(self, names: Any, error: type[Exception]) -> None:
        """A bare string (not a list) raises TypeError; a name that is not one raises ValueError."""
        with pytest.raises(error):
            sql_writes("SELECT 1", safe_functions=names)

    @pytest.mark.parametrize("query", ["SELECT 1\0", "SELECT 1\0; DELETE FROM t", "SELECT '\ud800'"])
    def test_text_holding_a_nul_or_a_lone_surrogate_writes(self, query: str) -> None:
        """Text a driver or a policy engine may cut or fail to encode is refused, whatever follows."""
        assert sql_writes(query, dialect="postgres") is True


class TestReadOnlySQLFunctions:
    async def test_the_denial_names_the_function(self) -> None:
        """A call of a function with effects is denied, its name in the message."""
        decision = await check_before(
            ReadOnlySQL("sql", dialect="postgres"), database([]), {"sql": "SELECT pg_sleep(9)"}
        )
        assert isinstance(decision, Deny)
        assert "pg_sleep()" in decision.message

    async def test_safe_functions_are_allowed(self) -> None:
        """A function the interceptor names as safe is allowed."""
        check = ReadOnlySQL("sql", dialect="postgres", safe_functions=["my_fn"])
        assert await check_before(check, database([]), {"sql": "SELECT my_fn(1)"}) == Allow()
        assert check.safe_functions == ("my_fn",)

    @pytest.mark.parametrize("names", ["my_fn", ["not a name"], [3]])
    def test_bad_safe_functions_are_refused_when_built(self, names: Any) -> None:
        """ConfigurationError names safe_functions."""
        with pytest.raises(ConfigurationError, match="safe_functions"):
            ReadOnlySQL("sql", safe_functions=names)
