"""`callgate coverage`: run the coverage checks, print them, write the reports, choose the exit code.

Exit codes: 0 every check holds, 1 a violation, 2 the check could not be made (store missing,
locked, API down, schema too new, a read API that lacks the queries). A CI job must never read 2
as clean, so nothing that fails to read ever ends in 0.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

EXIT_CLEAN = 0
EXIT_VIOLATION = 1
EXIT_CANNOT_CHECK = 2

_DURATION = re.compile(r"^(?P<n>\d+(?:\.\d+)?)\s*(?P<unit>s|m|h|d|w)$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
_STYLE = {"pass": "bold green", "fail": "bold red", "skip": "yellow"}


def parse_since(text: str, *, now: datetime | None = None) -> datetime:
    """An ISO 8601 time (UTC when it has no zone) or a duration back from now ("30m", "24h", "7d").
    Raises `ValueError` naming the text otherwise."""
    found = _DURATION.match(text.strip())
    if found:
        delta = timedelta(**{_UNITS[found["unit"]]: float(found["n"])})
        return (now or datetime.now(UTC)) - delta
    try:
        parsed = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"--since {text!r} is neither an ISO 8601 time (2026-11-30T09:00:00Z) nor a duration (30m, 24h, 7d)"
        ) from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def run_coverage(
    *,
    api: str | None,
    db: Path | None,
    require_exercised: bool,
    since: datetime | None,
    junit: Path | None,
    json_path: Path | None,
    console: Console,
    err: Console,
    require_signed: bool = False,
    token: str | None = None,
) -> int:
    """Run the checks against the read API (sending `token` as its bearer token) or the file, print
    the table, write the reports; the exit code. With `require_signed`, a store without the signed
    checkpoint tables is exit 2; a token the API refuses is exit 2 too (it could not check)."""
    # Imported here: `callgate --help` must not load DuckDB.
    from consumers.coverage import SignaturesUnavailableError, run_checks
    from consumers.queries import QueryError
    from consumers.reader import SourceUnavailableError, open_reader

    if (api is None) == (db is None):
        err.print("error: give exactly one of --api URL (a running materializer) or --db FILE (an audit store)")
        return EXIT_CANNOT_CHECK
    try:
        reader = open_reader(api=api, db=db, token=token)
    except ValueError as exc:
        err.print(f"error: {exc}")
        return EXIT_CANNOT_CHECK
    try:
        report = run_checks(reader, require_exercised=require_exercised, require_signed=require_signed, since=since)
    except SignaturesUnavailableError as exc:
        err.print(f"cannot check: {exc}", markup=False, soft_wrap=True)
        return EXIT_CANNOT_CHECK
    except SourceUnavailableError as exc:
        if require_signed and _older_schema(exc):
            # A file from before signed checkpoints: it has no checkpoint tables to read.
            unavailable = SignaturesUnavailableError(reader.source, str(exc.__cause__))
            err.print(f"cannot check: {unavailable}", markup=False, soft_wrap=True)
            return EXIT_CANNOT_CHECK
        err.print(f"cannot check: {exc}", markup=False)
        return EXIT_CANNOT_CHECK
    except QueryError as exc:
        err.print(f"cannot check: {reader.source} cannot answer the coverage queries ({exc})", markup=False)
        return EXIT_CANNOT_CHECK
    except Exception as exc:
        err.print(f"cannot check: {type(exc).__name__}: {exc}", markup=False)
        return EXIT_CANNOT_CHECK
    finally:
        reader.close()

    console.print(_table(report))
    for check in report.checks:
        if check.status == "fail":
            console.print(_violations(check))
    verdict = "clean: no tool ran unmediated" if report.ok else "FAILED: see the violations above"
    console.print(Text(f"coverage {verdict}", style=_STYLE["pass" if report.ok else "fail"]))
    try:
        if junit is not None:
            junit.write_text(report.to_junit(), encoding="utf-8")
            console.print(f"JUnit report: {junit}", markup=False)
        if json_path is not None:
            json_path.write_text(report.to_json() + "\n", encoding="utf-8")
            console.print(f"JSON report: {json_path}", markup=False)
    except OSError as exc:
        err.print(f"cannot write the report: {exc}", markup=False)
        return EXIT_CANNOT_CHECK
    return report.exit_code


def _older_schema(exc: BaseException) -> bool:
    """True when `exc` is a store file's refusal to open read-only because its schema is older than
    this code's (consumers.store: "has schema version N, older than M")."""
    from consumers.store import StoreError, StoreLockedError

    cause = exc.__cause__
    return isinstance(cause, StoreError) and not isinstance(cause, StoreLockedError) and "older than" in str(cause)


def _table(report: Any) -> Table:
    window = "all time" if report.since is None else f"since {report.since.isoformat()}"
    table = Table(title=f"callgate coverage of {report.source} ({window})", title_justify="left")
    table.add_column("check")
    table.add_column("result")
    table.add_column("detail", overflow="fold")
    for check in report.checks:
        # Event text may be attacker-controlled: Text() never interprets rich markup.
        table.add_row(Text(check.title), Text(check.status.upper(), style=_STYLE[check.status]), Text(check.summary))
    return table


def _violations(check: Any) -> Table:
    rows = list(check.violations)
    columns = _COLUMNS.get(check.name) or (list(rows[0]) if rows else [])
    shown = f"{len(rows)} of {check.total}" if check.total > len(rows) else str(len(rows))
    table = Table(title=f"{check.title}: {shown} violation(s)", title_justify="left", title_style="bold red")
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*(Text(_cell(row.get(column))) for column in columns))
    return table


# What a person needs to find each violation, per check (the JSON report has every column).
_COLUMNS: dict[str, list[str]] = {
    "unmediated": ["time", "resource", "attribute", "bound_tools", "site", "active_tool", "run_id", "tenant"],
    "chains": ["producer_id", "gate", "max_seq", "missing", "gaps_recorded", "tampered", "conflicts"],
    "tool_uses": ["time", "problem", "gate", "agent", "tool", "call_id", "missing_interceptors", "producer_id"],
    "exercised": ["gate", "tool", "scopes"],
    "signed": ["gate", "producer_id", "events", "signed_tree_size", "reasons", "detail"],
}


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, list):
        return ", ".join(str(v) if v is not None else "gate.invoke" for v in value)
    return str(value)
