"""Does a SQL text write? `sql_writes` answers; `ReadOnlySQL` denies calls that would.

The text is parsed with sqlglot, never matched with a regex, and judged read-only only when every
statement is a query, nothing anywhere inside it writes, and every function it calls is known to be
free of effects (`interceptor_core.builtins.sql_functions`). Everything else counts as writing: a
statement sqlglot does not know, a text it cannot parse, a function it does not know, and session
or transaction commands.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlglot
import sqlglot.expressions as exp
from sqlglot.dialects.dialect import Dialect

from interceptor_core.builtins import sql_functions
from interceptor_core.builtins._config import check_identity, field_names, field_values, tool_matcher
from interceptor_core.context import ToolCall
from interceptor_core.decisions import Deny
from interceptor_core.exceptions import ConfigurationError

__all__ = ["ReadOnlySQL", "sql_writes"]


def _classes(*names: str) -> tuple[type[exp.Expression], ...]:
    """The sqlglot expression classes of these names that the installed version has."""
    found = (getattr(exp, name, None) for name in names)
    return tuple(cls for cls in found if isinstance(cls, type) and issubclass(cls, exp.Expression))


_READS = _classes("Select", "Union", "Intersect", "Except", "SetOperation", "Subquery", "Values")
_READS_TOO = _classes("Describe", "Show", "Summarize")
# DESCRIBE/EXPLAIN, SHOW and DuckDB's SUMMARIZE read; what they describe is walked like the rest.
_NOT_A_STATEMENT = _classes("Semicolon")
# What sqlglot makes of a comment after the last semicolon.

_WRITES = _classes(
    "DML",
    "DDL",
    "Insert",
    "Update",
    "Delete",
    "Merge",
    "Copy",
    "Create",
    "Drop",
    "Undrop",
    "Alter",
    "AlterColumn",
    "AlterIndex",
    "AlterRename",
    "AlterSession",
    "AlterSet",
    "RenameColumn",
    "SwapTable",
    "TruncateTable",
    "Command",
    "Into",
    "Set",
    "Pragma",
    "Attach",
    "Detach",
    "Grant",
    "Revoke",
    "Lock",
    "LockingStatement",
    "Install",
    "LoadData",
    "Use",
    "Transaction",
    "Commit",
    "Rollback",
    "Execute",
    "ExecuteSql",
    "Declare",
    "Cache",
    "Uncache",
    "Refresh",
    "Kill",
    "Comment",
    "Analyze",
    "Export",
    "Put",
    "Get",
)
# Checked on every node, not only at the top: a CTE may delete, a subquery may lock.

_EXECUTABLE_COMMENT = re.compile(r"/\*M?!")
# MySQL runs the text of /*! ... */ (MariaDB also /*M! ... */); sqlglot reads it as a comment.

_UNREADABLE = re.compile(r"[\x00\ud800-\udfff]")
# A NUL ends a C string (the driver, the server, a policy engine may each see less than was sent)
# and a lone surrogate has no encoding: the text is not one unambiguous thing.

_DIALECTS_WHEN_UNKNOWN: tuple[str | None, ...] = (None, "postgres", "mysql", "tsql")
# Dialects disagree on where a string or comment ends: in MySQL 'a\'' is one string, elsewhere a
# string and the start of another; Postgres has E'\'' and nested comments, T-SQL [brackets]. Text a
# reader takes for the inside of a string can be a statement to the database. Without a dialect, a
# query must read as read-only under each of these families of rules.

_SAFE_BY_DIALECT = sql_functions.SAFE_FUNCTIONS
# Any other reader (sqlglot's default rules, T-SQL, Snowflake, ...) may call only what all four allow.

_QUOTED_BUILTINS = ("postgres", "duckdb", "sqlite")
# There a quoted name calls the built-in of that exact name; MySQL reads `lower`(x) as a stored
# function of the current database, and other dialects are not known to do either.

_SYNTAX = _classes(
    *("Cast", "TryCast", "Case", "If", "Exists", "Extract", "Collate", "Array", "Struct", "ToMap"),
    *("CurrentCatalog", "CurrentDate", "CurrentRole", "CurrentSchema", "CurrentTime", "CurrentTimestamp"),
    *("CurrentUser", "Localtime", "Localtimestamp", "SessionUser"),
    *("Substring", "Trim", "StrPosition", "Overlay", "Normalize", "Initcap", "Chr", "Ceil", "Floor", "Convert"),
    *("DecodeCase", "GroupConcat", "ArgMax", "ArgMin", "Max", "Min", "ApproxQuantile", "PercentileCont"),
    *("JSONObject", "JSONArrayAgg", "JSONExtract", "JSONExtractScalar", "JSONBExtract", "JSONBExtractScalar"),
    *("JSONBExists", "JSONBContainsTopKey", "ArrayContainsAll", "ArrayContainedBy", "ArrayOverlaps"),
    *("RegexpLike", "RegexpILike", "MatchAgainst", "Soundex", "StartsWith", "Pow", "Sqrt", "Abs", "Xor", "Unnest"),
)
# What sqlglot makes of syntax rather than of a name written before "(": operators (||, ->>, @>, ~,
# ^, |/), casts, CASE, EXISTS, ARRAY[...], UNNEST in FROM, CURRENT_DATE and its kin, and the calls
# it parses by special rules (TRIM(x FROM y), SUBSTRING(... FOR ...), STRING_AGG, CEIL,
# JSON_OBJECT(...)). None has an effect (in PostgreSQL no built-in operator, cast or type input
# calls a volatile function; a test asks the catalog). Any other such node (NEXT VALUE FOR, which
# advances a sequence, among them) counts as writing.

_SQL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*")
_FILE_LIKE = re.compile(r"[./\\:]")
# DuckDB reads a file named in place of a table (FROM 'x.csv', FROM "y.parquet"): a path, not a table.
_FILE_EXTENSIONS = frozenset(
    {"csv", "tsv", "parquet", "json", "jsonl", "ndjson", "gz", "gzip", "zst", "xlsx", "avro", "arrow", "db"}
)
# So does an unquoted dotted name that is no table (FROM x.csv, FROM x.csv.gz: the file of that
# name): DuckDB joins the parts with dots and reads the file when the last part is a format it knows.
_FILE_TABLES_IN = frozenset({None, "duckdb"})
# The readers that refuse such a name: DuckDB's, and sqlglot's default rules (no dialect given).
_SEQUENCE_STEPS = frozenset({"nextval"})
# Oracle, Snowflake and MariaDB advance a sequence with a column-like `seq.nextval`.


def sql_writes(query: Any, *, dialect: str | None = None, safe_functions: Sequence[str] = ()) -> bool:
    """True when the SQL text `query` may write or change anything; False when it only reads.

    Read-only means every statement is a query (SELECT, a set operation such as UNION, VALUES, a
    parenthesized query, DESCRIBE/EXPLAIN of a query, SHOW, SUMMARIZE), no node inside any of them
    writes (no INSERT, UPDATE, DELETE or MERGE in a CTE, no SELECT ... INTO, no FOR UPDATE or FOR
    SHARE lock, no assignment to a variable, no file read in place of a table), and every function
    it calls is known to be free of effects in its dialect (`sql_functions`: derived from
    PostgreSQL's catalog, DuckDB's function list, and reviewed lists for SQLite and MySQL) or named
    in `safe_functions`. Everything else writes: DDL, DML, COPY, ATTACH/DETACH, every PRAGMA, SET,
    USE, GRANT/REVOKE, CALL/EXEC, VACUUM, LOAD/INSTALL, LOCK, transaction control, any statement
    sqlglot parses as an unknown command (EXPLAIN is one in most dialects, and EXPLAIN ANALYZE runs
    what it explains), a MySQL executable comment (`/*! ... */`), a call of a function with effects
    or of one not known (`nextval`, `pg_sleep`, `set_config`, `dblink`, `query_to_xml`, a
    user-defined function), a schema-qualified call (but `pg_catalog.` in PostgreSQL), text holding
    a NUL or a lone surrogate, and any text sqlglot cannot parse. Several statements in one text are
    all judged. An empty text, or one holding only comments, runs nothing: False. Anything but a
    str is True.

    `dialect` is the database's sqlglot dialect ("postgres", "mysql", "sqlite", "duckdb", ...);
    give it. Dialects disagree on where strings and comments end, so a text read in the wrong
    dialect can hide a statement; without one, the text must be read-only under sqlglot's default
    rules and those of Postgres, MySQL and T-SQL, so syntax only one dialect accepts (MySQL's
    backticks, T-SQL's TOP) counts as writing. A function must be free of effects in the dialect
    the text is read with; a dialect without a list here (sqlglot's default rules, T-SQL, ...) may
    call only the functions all four lists share. Server settings that change how text is read
    (Postgres' `standard_conforming_strings = off`, MySQL's `NO_BACKSLASH_ESCAPES`) are not modelled.

    `safe_functions` names functions the policy's author knows to be free of effects ("my_fn", or
    "reports.my_fn" for a qualified call); matched without regard to case against unquoted names.

    It judges the text, not the database: a view or a function whose body writes, a user-defined
    operator, or a function of the same name as a built-in on the search path are beyond it. Run the
    tool as a database role that may only read, and keep this check as the first line.

    Never raises for `query`, which is the model's; raises `ValueError` for an unknown `dialect` and
    `TypeError` or `ValueError` for a bad `safe_functions`. No I/O. About a tenth of a millisecond
    per short statement and dialect read (four without a dialect).
    """
    safe = _names(tuple(safe_functions) if _is_names(safe_functions) else None)
    return _write_in(query, _readers(dialect), safe) is not None


class ReadOnlySQL:
    """Denies a call whose SQL arguments may write (see `sql_writes`).

    `fields` names the arguments holding SQL text (one name or several); an argument the tool does
    not have is skipped, and so is one whose value is None. A list or tuple value is checked query by
    query. `tools` restricts the check to the tools matching one of its globs (`fnmatch.fnmatchcase`;
    None: every tool). `dialect` is the database's sqlglot dialect (None: see `sql_writes`).
    `safe_functions` names functions known to be free of effects beyond the built-in lists. The
    denial names the tool, the argument and what was found (a statement's kind or a function's name,
    never the text).

    Sync, no I/O; safe from several threads. `ConfigurationError` names a bad argument.
    """

    def __init__(
        self,
        fields: str | Sequence[str],
        *,
        tools: str | Sequence[str] | None = None,
        dialect: str | None = None,
        safe_functions: Sequence[str] = (),
        name: str = "read-only-sql",
        mandatory: bool = False,
    ) -> None:
        self.name = check_identity(name, mandatory)
        self.mandatory = mandatory
        self.fields = field_names(fields, interceptor=name)
        self.dialect = dialect
        try:
            self._readers = _readers(dialect)
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(f"dialect {dialect!r}: {exc}", interceptor=name) from None
        if not _is_names(safe_functions):
            raise ConfigurationError(
                f"safe_functions must be a list of function names, got {safe_functions!r}", interceptor=name
            )
        try:
            self._safe = _names(tuple(safe_functions))
        except ValueError as exc:
            raise ConfigurationError(f"safe_functions: {exc}", interceptor=name) from None
        self.safe_functions = tuple(sorted(self._safe))
        self._applies = tool_matcher(tools, interceptor=name)

    def before_tool_call(self, call: ToolCall) -> Deny | None:
        """Deny the call when a named argument holds SQL that may write; None (allow) otherwise."""
        tool = call.tool_name
        if not self._applies(tool):
            return None
        for field, value in field_values(call.args, self.fields):
            found = _write_in(value, self._readers, self._safe)
            if found is not None:
                return Deny(
                    f"{tool}: argument {field!r} holds SQL that may change the database (found: {found}), and this "
                    "tool may only read. Send queries that only read (SELECT, WITH ... SELECT, UNION) and call only "
                    "built-in functions free of effects."
                )
        return None

    def __repr__(self) -> str:
        return (
            f"ReadOnlySQL({self.fields!r}, dialect={self.dialect!r}, safe_functions={self.safe_functions!r}, "
            f"name={self.name!r})"
        )


@dataclass(frozen=True)
class _Reader:
    dialect: Dialect
    safe: frozenset[str]
    """The built-in functions free of effects in this dialect."""
    postgres: bool
    """Whether `pg_catalog.` names the built-ins."""
    quoted_builtins: bool
    """Whether a quoted name ("lower") still calls the built-in of that name."""
    dotted_files: bool
    """Whether an unquoted dotted table name may name a file (DuckDB)."""


@functools.lru_cache(maxsize=64)
def _readers(dialect: str | None) -> tuple[_Reader, ...]:
    """The dialects a text must read as read-only in; `ValueError` for one sqlglot does not know."""
    if dialect is None:
        names: tuple[str | None, ...] = _DIALECTS_WHEN_UNKNOWN
    elif isinstance(dialect, str):
        names = (dialect,)
    else:
        raise TypeError(f"dialect must be a sqlglot dialect name, got {dialect!r}")
    readers = []
    for name in names:
        reader = Dialect.get_or_raise(name)
        key = name.lower() if name is not None else None
        safe = _SAFE_BY_DIALECT.get(key, sql_functions.EVERY) if key is not None else sql_functions.EVERY
        readers.append(_Reader(reader, safe, key == "postgres", key in _QUOTED_BUILTINS, key in _FILE_TABLES_IN))
    return tuple(readers)


def _is_names(value: object) -> bool:
    return isinstance(value, (list, tuple)) and all(isinstance(item, str) for item in value)


@functools.lru_cache(maxsize=64)
def _names(safe_functions: tuple[str, ...] | None) -> frozenset[str]:
    """Policy-named functions, lower case; `ValueError` naming one that is not a (qualified) name."""
    if safe_functions is None:
        raise TypeError("safe_functions must be a list of function names (a single name goes in a list)")
    for name in safe_functions:
        if not name or not all(_SQL_NAME.fullmatch(part) for part in name.split(".")):
            raise ValueError(f"{name!r} is not a function name (letters, digits, _ and $, parts joined by '.')")
    return frozenset(name.lower() for name in safe_functions)


def _write_in(query: object, readers: tuple[_Reader, ...], safe: frozenset[str]) -> str | None:
    """What in `query` may write, in a few words for a denial; None when it only reads."""
    if not isinstance(query, str):
        return f"{type(query).__name__} value, not SQL text"
    if _UNREADABLE.search(query):
        return "a NUL byte or a lone surrogate, which the database may read differently"
    if _EXECUTABLE_COMMENT.search(query):
        return "MySQL executable comment"
    for reader in readers:
        found = _write_in_dialect(query, reader, safe)
        if found is not None:
            return found
    return None


def _write_in_dialect(query: str, reader: _Reader, safe: frozenset[str]) -> str | None:
    try:
        statements = sqlglot.parse(query, read=reader.dialect)
    except Exception:
        # sqlglot's ParseError and TokenError, and anything else (a RecursionError on deep nesting):
        # text that cannot be read could do anything.
        return "text that could not be parsed as SQL"
    for statement in statements:
        if statement is None or isinstance(statement, _NOT_A_STATEMENT):
            continue
        if not isinstance(statement, _READS + _READS_TOO):
            return _kind(statement) if isinstance(statement, _WRITES) else "statement that is not a query"
        if isinstance(statement, _READS_TOO) and isinstance(statement.this, exp.Literal):
            return "a file named in place of a table"  # DuckDB's SUMMARIZE 'x.csv' reads the file
        for node in statement.walk():
            if isinstance(node, exp.Func):
                call = _unsafe_call(node, query, reader, safe)
                if call is not None:
                    return call
            elif isinstance(node, exp.Select):
                if node.args.get("locks"):
                    return "locking read: FOR UPDATE or FOR SHARE"
                if node.args.get("into"):
                    return "SELECT ... INTO"
            elif isinstance(node, exp.Table) and _names_a_file(node, reader.dotted_files):
                return "a file named in place of a table"
            elif isinstance(node, exp.Column) and node.table and node.name.lower() in _SEQUENCE_STEPS:
                return f"{node.name} of a sequence, which advances it"
            elif isinstance(node, exp.PropertyEQ) and not isinstance(node.this, exp.Identifier):
                return "an assignment to a variable"
            elif isinstance(node, _WRITES):
                return f"{_kind(node)} inside a query"
    return None


def _unsafe_call(node: exp.Func, query: str, reader: _Reader, safe: frozenset[str]) -> str | None:
    """A denial's words for the call `node` when it is not known to be free of effects; None when it is."""
    written = call_name(node, query)
    if written is None:
        return None if isinstance(node, _SYNTAX) else f"{type(node).__name__} expression, not known to be harmless"
    name, quoted = written
    qualifier = _qualifier(node)
    key = name if quoted else name.lower()
    if qualifier is None:
        if (key in reader.safe and (reader.quoted_builtins or not quoted)) or key in safe:
            return None
    elif (reader.postgres and qualifier == "pg_catalog" and key in reader.safe) or f"{qualifier}.{key}" in safe:
        return None
    shown = f"{qualifier}.{name}" if qualifier else name
    return f"a call of {shown}(), a function not known to be free of effects"


def call_name(node: exp.Func, query: str) -> tuple[str, bool] | None:
    """The name `node` was called by in `query`, and whether it was quoted; None when sqlglot made
    the node of syntax (an operator, a cast, a keyword) rather than of a name before "(".

    Not part of the public API (the `sql_functions` tests use it to read DuckDB's macros).
    """
    if isinstance(node, exp.Anonymous):
        this = node.this
        if isinstance(this, exp.Identifier):
            return this.name, bool(this.quoted)
        return str(this), False
    start, end = node.meta.get("start"), node.meta.get("end")
    if not isinstance(start, int) or not isinstance(end, int):
        return None
    written = query[start : end + 1]
    quoted = written[:1] in ('"', "`", "[") and len(written) > 2
    name = written[1:-1] if quoted else written
    if not _SQL_NAME.fullmatch(name):
        # Not a name as written: positions sqlglot did not take from the name token. Fail closed.
        return f"{name!r}", True
    return name, quoted


def _qualifier(node: exp.Func) -> str | None:
    """The schema (or database) a call names before its function, lower case unless quoted."""
    parent = node.parent
    if isinstance(parent, exp.Dot) and parent.expression is node:
        parts = list(parent.this.find_all(exp.Identifier))
    elif (
        isinstance(parent, exp.Table) and parent.this is node and (parent.args.get("db") or parent.args.get("catalog"))
    ):
        named = (parent.args.get("catalog"), parent.args.get("db"))
        parts = [part for part in named if isinstance(part, exp.Identifier)]
    else:
        return None
    if not parts:
        return "?"
    return ".".join(part.name if part.quoted else part.name.lower() for part in parts)


def _names_a_file(table: exp.Table, dotted_files: bool) -> bool:
    this = table.this
    if isinstance(this, exp.Literal):
        return True
    if not isinstance(this, exp.Identifier):
        return False
    if this.quoted and _FILE_LIKE.search(this.name) is not None:
        return True
    return dotted_files and bool(table.args.get("db")) and this.name.lower() in _FILE_EXTENSIONS


def _kind(node: exp.Expression) -> str:
    if isinstance(node, exp.Command):
        return f"{str(node.this).upper()} command"
    return f"{type(node).__name__.upper()} statement"
