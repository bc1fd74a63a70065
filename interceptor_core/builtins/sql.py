"""Does a SQL text write? `sql_writes` answers; `ReadOnlySQL` denies calls that would.

The text is parsed with sqlglot, never matched with a regex, and judged read-only only when every
statement is a query and nothing anywhere inside it writes. Everything else counts as writing: a
statement sqlglot does not know, a text it cannot parse, and session or transaction commands.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Any

import sqlglot
import sqlglot.expressions as exp
from sqlglot.dialects.dialect import Dialect

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

_DIALECTS_WHEN_UNKNOWN: tuple[str | None, ...] = (None, "postgres", "mysql", "tsql")
# Dialects disagree on where a string or comment ends: in MySQL 'a\'' is one string, elsewhere a
# string and the start of another; Postgres has E'\'' and nested comments, T-SQL [brackets]. Text a
# reader takes for the inside of a string can be a statement to the database. Without a dialect, a
# query must read as read-only under each of these families of rules.


def sql_writes(query: Any, *, dialect: str | None = None) -> bool:
    """True when the SQL text `query` may write or change anything; False when it only reads.

    Read-only means every statement is a query (SELECT, a set operation such as UNION, VALUES, a
    parenthesized query, DESCRIBE/EXPLAIN of a query, SHOW, SUMMARIZE) and no node inside any of
    them writes (no INSERT, UPDATE, DELETE or MERGE in a CTE, no SELECT ... INTO, no FOR UPDATE or
    FOR SHARE lock). Everything else writes: DDL, DML, COPY, ATTACH/DETACH, every PRAGMA, SET, USE,
    GRANT/REVOKE, CALL/EXEC, VACUUM, LOAD/INSTALL, LOCK, transaction control, any statement sqlglot
    parses as an unknown command (EXPLAIN is one in most dialects, and EXPLAIN ANALYZE runs what
    it explains), a MySQL executable comment (`/*! ... */`), and any text sqlglot cannot parse.
    Several statements in one text are all judged. An empty text, or one holding only comments,
    runs nothing: False. Anything but a str is True.

    `dialect` is the database's sqlglot dialect ("postgres", "mysql", "sqlite", "duckdb", ...);
    give it. Dialects disagree on where strings and comments end, so a text read in the wrong
    dialect can hide a statement; without one, the text must be read-only under sqlglot's default
    rules and those of Postgres, MySQL and T-SQL, so syntax only one dialect accepts (MySQL's
    backticks, T-SQL's TOP) counts as writing. Server settings that change how text is read
    (Postgres' `standard_conforming_strings = off`, MySQL's `NO_BACKSLASH_ESCAPES`) are not modelled.

    It judges statements, not functions: `SELECT nextval('s')`, `SELECT pg_terminate_backend(1)` or
    a user-defined function that writes is a SELECT. Where that matters, run the tool as a database
    role that may only read, and keep this check as the first line.

    Never raises for `query`, which is the model's; raises `ValueError` for an unknown `dialect`.
    No I/O. About a tenth of a millisecond per short statement and dialect read (four without a
    dialect).
    """
    return _write_in(query, _readers(dialect)) is not None


class ReadOnlySQL:
    """Denies a call whose SQL arguments may write (see `sql_writes`).

    `fields` names the arguments holding SQL text (one name or several); an argument the tool does
    not have is skipped, and so is one whose value is None. A list or tuple value is checked query by
    query. `tools` restricts the check to the tools matching one of its globs (`fnmatch.fnmatchcase`;
    None: every tool). `dialect` is the database's sqlglot dialect (None: see `sql_writes`). The
    denial names the tool, the argument and what was found (a statement's kind, never the text).

    Sync, no I/O; safe from several threads. `ConfigurationError` names a bad argument.
    """

    def __init__(
        self,
        fields: str | Sequence[str],
        *,
        tools: str | Sequence[str] | None = None,
        dialect: str | None = None,
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
        self._applies = tool_matcher(tools, interceptor=name)

    def before_tool_call(self, call: ToolCall) -> Deny | None:
        """Deny the call when a named argument holds SQL that may write; None (allow) otherwise."""
        tool = call.tool_name
        if not self._applies(tool):
            return None
        for field, value in field_values(call.args, self.fields):
            found = _write_in(value, self._readers)
            if found is not None:
                return Deny(
                    f"{tool}: argument {field!r} holds SQL that may change the database (found: {found}), and this "
                    "tool may only read. Send queries that only read: SELECT, WITH ... SELECT, UNION."
                )
        return None

    def __repr__(self) -> str:
        return f"ReadOnlySQL({self.fields!r}, dialect={self.dialect!r}, name={self.name!r})"


@functools.lru_cache(maxsize=64)
def _readers(dialect: str | None) -> tuple[Dialect, ...]:
    """The dialects a text must read as read-only in; `ValueError` for one sqlglot does not know."""
    if dialect is None:
        return tuple(Dialect.get_or_raise(name) for name in _DIALECTS_WHEN_UNKNOWN)
    if not isinstance(dialect, str):
        raise TypeError(f"dialect must be a sqlglot dialect name, got {dialect!r}")
    return (Dialect.get_or_raise(dialect),)


def _write_in(query: object, readers: tuple[Dialect, ...]) -> str | None:
    """What in `query` may write, in a few words for a denial; None when it only reads."""
    if not isinstance(query, str):
        return f"{type(query).__name__} value, not SQL text"
    if _EXECUTABLE_COMMENT.search(query):
        return "MySQL executable comment"
    for reader in readers:
        found = _write_in_dialect(query, reader)
        if found is not None:
            return found
    return None


def _write_in_dialect(query: str, reader: Dialect) -> str | None:
    try:
        statements = sqlglot.parse(query, read=reader)
    except Exception:
        # sqlglot's ParseError and TokenError, and anything else (a RecursionError on deep nesting):
        # text that cannot be read could do anything.
        return "text that could not be parsed as SQL"
    for statement in statements:
        if statement is None or isinstance(statement, _NOT_A_STATEMENT):
            continue
        if not isinstance(statement, _READS + _READS_TOO):
            return _kind(statement) if isinstance(statement, _WRITES) else "statement that is not a query"
        for node in statement.walk():
            if isinstance(node, exp.Select) and node.args.get("locks"):
                return "locking read: FOR UPDATE or FOR SHARE"
            if isinstance(node, exp.Select) and node.args.get("into"):
                return "SELECT ... INTO"
            if isinstance(node, _WRITES):
                return f"{_kind(node)} inside a query"
    return None


def _kind(node: exp.Expression) -> str:
    if isinstance(node, exp.Command):
        return f"{str(node.this).upper()} command"
    return f"{type(node).__name__.upper()} statement"
