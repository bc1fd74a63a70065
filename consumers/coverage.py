"""The coverage check a CI job runs on the audit store: did any tool effect happen outside the gate?

`run_checks(reader)` runs four checks through the named queries (so it works on a file or through
a materializer's read API alike) and returns a `CoverageReport`:

1. `unmediated`: no `Unmediated` event (a guarded client used outside a mediated call of its tools).
2. `chains`: every producer's chain is whole: no missing seq, no tampering, no conflicting
   duplicate. An empty window fails too: a stream with nothing in it proves nothing.
3. `tool_uses`: every `ToolUse` comes from a whole chain, from a scope that registered the tool, and
   carries a decision trail naming every interceptor of a chain registered for it.
4. `exercised` (only with `require_exercised`): every tool a `ToolsRegistered` event names was
   called through the gate at least once (any outcome: a denial proves the route as well).
5. `signed` (only with `require_signed`; not in the report otherwise): every producer with events
   in the window has a valid checkpoint signed by a trusted key and no checkpoint chain break
   (`bad_signature`, `unknown_key`, `root_mismatch`, `inconsistent`, `unsigned`, `uncovered`,
   `silent`, `truncated`), as the materializer recorded them (consumers/checkpoints.py). A store
   without the checkpoint tables raises `SignaturesUnavailableError`: "cannot say" is not unsigned.

`CoverageReport.exit_code` is 0 when every check holds and 1 otherwise; a reader that cannot read
the store raises `SourceUnavailableError` instead, which `callgate coverage` turns into exit 2, so
"could not look" is never read as "clean". What a green report proves, and what it cannot, is in
docs/coverage.md.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from consumers.queries import MAX_LIMIT, UnknownQueryError
from consumers.reader import AuditReader

__all__ = ["CHECKS", "CheckCase", "CheckResult", "CoverageReport", "SignaturesUnavailableError", "run_checks"]

CHECKS: dict[str, str] = {
    "unmediated": "No tool effect outside the gate",
    "chains": "Every producer's audit chain is whole",
    "tool_uses": "Every tool run is verified and carries its decision trail",
    "exercised": "Every registered tool was called through the gate",
    "signed": "Every producer is signed by a trusted key and fully covered",
}
"""Check name -> title, in the order they run and are reported."""

Status = Literal["pass", "fail", "skip"]


class SignaturesUnavailableError(Exception):
    """`require_signed` was asked of a store (or read API) without the signed checkpoint tables or
    the `producer_signatures` query: an older store. `source` names it; the message says so in one line."""

    def __init__(self, source: str, reason: str) -> None:
        super().__init__(
            f"{source} has no signed checkpoint tables (an audit store older than signed checkpoints): "
            f"cannot check --require-signed ({reason})"
        )
        self.source = source


@dataclass(frozen=True, slots=True)
class CheckCase:
    """One JUnit test case: a whole check, or one tool of the `exercised` check."""

    name: str
    ok: bool
    message: str = ""


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One check's verdict.

    `violations` lists what broke it (at most `max_listed` rows as the queries return them; `total`
    is how many there are), `summary` says it in one line, and `cases` are its JUnit test cases.
    A skipped check (`exercised` without `require_exercised`) is neither a pass nor a failure.
    """

    name: str
    title: str
    ok: bool
    summary: str
    violations: tuple[dict[str, Any], ...] = ()
    total: int = 0
    skipped: bool = False
    cases: tuple[CheckCase, ...] = ()

    @property
    def status(self) -> Status:
        """ "skip", "pass" or "fail"."""
        if self.skipped:
            return "skip"
        return "pass" if self.ok else "fail"

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form (what `--json` writes per check)."""
        return {
            "name": self.name,
            "title": self.title,
            "status": self.status,
            "ok": self.ok,
            "summary": self.summary,
            "total": self.total,
            "listed": len(self.violations),
            "violations": list(self.violations),
        }


@dataclass(frozen=True, slots=True)
class CoverageReport:
    """Every check's verdict over one store, and the facts they were decided on."""

    source: str
    checked_at: datetime
    since: datetime | None
    until: datetime | None
    require_exercised: bool
    checks: tuple[CheckResult, ...]
    facts: Mapping[str, Any] = field(default_factory=dict)
    require_signed: bool = False

    @property
    def ok(self) -> bool:
        """True when no check that ran failed."""
        return all(check.ok for check in self.checks if not check.skipped)

    @property
    def exit_code(self) -> int:
        """0 when clean, 1 on any violation (2, "cannot check", is never a report: it is an error)."""
        return 0 if self.ok else 1

    def check(self, name: str) -> CheckResult:
        """The result of the check called `name`; `KeyError` for another name."""
        for check in self.checks:
            if check.name == name:
                return check
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        """The machine-readable report (`--json`)."""
        return {
            "ok": self.ok,
            "exit_code": self.exit_code,
            "source": self.source,
            "checked_at": self.checked_at.isoformat(),
            "since": self.since.isoformat() if self.since else None,
            "until": self.until.isoformat() if self.until else None,
            "require_exercised": self.require_exercised,
            "require_signed": self.require_signed,
            "facts": dict(self.facts),
            "checks": [check.to_dict() for check in self.checks],
        }

    def to_json(self) -> str:
        """`to_dict` as indented JSON text."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=False)

    def to_junit(self) -> str:
        """JUnit XML: one test suite, one test case per check and, for `exercised`, one per tool."""
        cases = [(check, case) for check in self.checks for case in check.cases]
        suite = ET.Element(
            "testsuite",
            {
                "name": "callgate coverage",
                "tests": str(len(cases)),
                "failures": str(sum(1 for check, case in cases if not check.skipped and not case.ok)),
                "skipped": str(sum(1 for check, _ in cases if check.skipped)),
                "errors": "0",
                "timestamp": self.checked_at.isoformat(),
            },
        )
        properties = ET.SubElement(suite, "properties")
        ET.SubElement(properties, "property", {"name": "source", "value": self.source})
        for name, value in self.facts.items():
            ET.SubElement(properties, "property", {"name": name, "value": str(value)})
        for check, case in cases:
            element = ET.SubElement(
                suite, "testcase", {"classname": f"callgate.coverage.{check.name}", "name": case.name}
            )
            if check.skipped:
                ET.SubElement(element, "skipped", {"message": check.summary})
            elif not case.ok:
                failure = ET.SubElement(element, "failure", {"message": case.message or check.summary})
                failure.text = _violations_text(check) if case.name == check.title else case.message
        root = ET.Element("testsuites")
        root.append(suite)
        ET.indent(root)
        return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def run_checks(
    reader: AuditReader,
    *,
    require_exercised: bool = False,
    require_signed: bool = False,
    since: datetime | None = None,
    until: datetime | None = None,
    max_listed: int = 100,
) -> CoverageReport:
    """Run the five checks over what `reader` reads, in the window [since, until) (all time by default).

    Blocks for the queries (a few seconds over a million events). Raises `SourceUnavailableError`
    when the store cannot be read, and `QueryError` when the reader does not know a query (a read
    API older than this code): both mean the check could not be made. With `require_signed`, a
    store or read API without the signed checkpoint tables raises `SignaturesUnavailableError`.
    """
    if not 1 <= max_listed <= MAX_LIMIT:
        raise ValueError(f"max_listed must be between 1 and {MAX_LIMIT}, got {max_listed}")
    window = {"since": since, "until": until}
    listing = {**window, "limit": max_listed}
    (facts,) = reader.query("coverage_summary", window).rows
    checks = [
        _unmediated(reader, facts, listing),
        _chains(reader, facts, listing),
        _tool_uses(reader, window, listing),
        _exercised(reader, listing) if require_exercised else _skipped_exercised(),
    ]
    if require_signed:
        # Not listed at all without it (unlike `exercised`): reports of stores without signing stay as they were.
        checks.append(_signed(reader, window, listing))
    return CoverageReport(
        source=reader.source,
        checked_at=datetime.now(UTC),
        since=since,
        until=until,
        require_exercised=require_exercised,
        checks=tuple(checks),
        facts=facts,
        require_signed=require_signed,
    )


# -- the checks ---------------------------------------------------------------------------------


def _unmediated(reader: AuditReader, facts: Mapping[str, Any], listing: Mapping[str, Any]) -> CheckResult:
    total = int(facts["unmediated"])
    if total == 0:
        return _passed("unmediated", "no guarded client was used outside a mediated call")
    rows = reader.query("unmediated", listing).rows
    resources = sorted({str(row["resource"]) for row in rows})
    return _failed(
        "unmediated",
        f"{total} use(s) of guarded clients outside the gate ({', '.join(resources)})",
        rows,
        total,
    )


def _chains(reader: AuditReader, facts: Mapping[str, Any], listing: Mapping[str, Any]) -> CheckResult:
    if int(facts["events"]) == 0:
        return _failed("chains", "no events in the window: an empty audit stream proves nothing", (), 0)
    broken = int(facts["broken_producers"])
    if broken == 0:
        return _passed("chains", f"{facts['producers']} producer chain(s) whole, {facts['events']} events")
    rows = reader.query("chain_status", {**listing, "only_broken": True}).rows
    return _failed(
        "chains",
        f"{broken} of {facts['producers']} producer chain(s) broken: {facts['missing_seqs']} missing seq(s), "
        f"{facts.get('gaps_recorded', 0)} gap(s) recorded, {facts['tampered']} tampered, "
        f"{facts['conflicts']} conflicting",
        rows,
        broken,
    )


def _tool_uses(reader: AuditReader, window: Mapping[str, Any], listing: Mapping[str, Any]) -> CheckResult:
    (counts,) = reader.query("tool_use_verification", window).rows
    unverified = int(counts["unverified"])
    if unverified == 0:
        return _passed("tool_uses", f"{counts['tool_uses']} tool run(s), each verified with its decision trail")
    rows = reader.query("unverified_tool_uses", listing).rows
    parts = [
        f"{counts[key]} {label}"
        for key, label in (
            ("chain_not_verified", "from a broken chain"),
            ("not_registered", "from a scope that never registered the tool"),
            ("incomplete_trail", "missing an interceptor of their registered chain"),
        )
        if counts[key]
    ]
    return _failed(
        "tool_uses",
        f"{unverified} of {counts['tool_uses']} tool run(s) not verified: {', '.join(parts)}",
        rows,
        unverified,
    )


def _exercised(reader: AuditReader, listing: Mapping[str, Any]) -> CheckResult:
    # Every registered tool is listed (one JUnit case each), unexercised ones first, page by page.
    rows: list[dict[str, Any]] = []
    while True:
        page = reader.query("tool_exercise", {**listing, "limit": MAX_LIMIT, "offset": len(rows)}).rows
        rows.extend(page)
        if len(page) < MAX_LIMIT:
            break
    title = CHECKS["exercised"]
    if not rows:
        return CheckResult(
            "exercised", title, False, "no ToolsRegistered event: no tool is known to have been registered", (), 0,
            cases=(CheckCase(title, False, "no ToolsRegistered event in the store"),),
        )  # fmt: skip
    missing = [row for row in rows if not row["exercised"]]
    cases = tuple(
        CheckCase(
            f"{row['gate']}/{row['tool']}",
            bool(row["exercised"]),
            "" if row["exercised"] else f"registered by {_scopes(row['scopes'])} and never called through the gate",
        )
        for row in rows
    )
    if not missing:
        return CheckResult("exercised", title, True, f"all {len(rows)} registered tool(s) called", cases=cases)
    names = ", ".join(f"{row['gate']}/{row['tool']}" for row in missing[:10])
    more = f" and {len(missing) - 10} more" if len(missing) > 10 else ""
    return CheckResult(
        "exercised",
        title,
        False,
        f"{len(missing)} of {len(rows)} registered tool(s) never called through the gate: {names}{more}",
        tuple(missing[: int(listing["limit"])]),
        len(missing),
        cases=cases,
    )


def _skipped_exercised() -> CheckResult:
    title = CHECKS["exercised"]
    summary = "not checked (pass --require-exercised)"
    return CheckResult("exercised", title, True, summary, skipped=True, cases=(CheckCase(title, True, summary),))


def _signed(reader: AuditReader, window: Mapping[str, Any], listing: Mapping[str, Any]) -> CheckResult:
    # Every producer is listed (one JUnit case each), failing ones first, page by page.
    rows: list[dict[str, Any]] = []
    while True:
        params = {**window, "limit": MAX_LIMIT, "offset": len(rows)}
        try:
            page = reader.query("producer_signatures", params).rows
        except UnknownQueryError as exc:
            raise SignaturesUnavailableError(reader.source, str(exc)) from exc
        except Exception as exc:
            # DuckDB's catalog error for a file without the tables (schema before 5).
            if "checkpoint_state" not in str(exc):
                raise
            raise SignaturesUnavailableError(reader.source, str(exc).splitlines()[0]) from exc
        rows.extend(page)
        if len(page) < MAX_LIMIT:
            break
    title = CHECKS["signed"]
    if not rows:
        summary = "no events in the window: no producer is known to have signed anything"
        return CheckResult("signed", title, False, summary, (), 0, cases=(CheckCase(title, False, summary),))
    failing = [_signature_violation(row) for row in rows if not row["ok"]]
    cases = tuple(
        CheckCase(
            f"{row['gate']}/{row['producer_id']}",
            bool(row["ok"]),
            "" if row["ok"] else _reasons(row),
        )
        for row in rows
    )
    if not failing:
        return CheckResult(
            "signed", title, True, f"all {len(rows)} producer(s) signed by a trusted key and covered", cases=cases
        )
    names = ", ".join(f"{row['gate']} ({row['producer_id']})" for row in failing[:10])
    more = f" and {len(failing) - 10} more" if len(failing) > 10 else ""
    return CheckResult(
        "signed",
        title,
        False,
        f"{len(failing)} of {len(rows)} producer(s) not signed and covered: {names}{more}",
        tuple(failing[: int(listing["limit"])]),
        len(failing),
        cases=cases,
    )


def _signature_violation(row: Mapping[str, Any]) -> dict[str, Any]:
    kinds = sorted({str(b["kind"]) for b in row["breaks"]})
    if not row["signed"] and "unsigned" not in kinds:
        # Materialized without --require-signed, the store records no `unsigned` row: say it here.
        kinds.insert(0, "unsigned")
    return {**row, "reasons": kinds, "detail": _reasons(row)}


def _reasons(row: Mapping[str, Any]) -> str:
    parts = [f"{b['kind']} at seq {b['seq']}: {b['detail']}" for b in row["breaks"]]
    if not row["signed"] and not any(b["kind"] == "unsigned" for b in row["breaks"]):
        parts.insert(0, f"unsigned: producer {row['producer_id']} has no valid signed checkpoint")
    return "; ".join(parts)


# -- helpers ------------------------------------------------------------------------------------


def _passed(name: str, summary: str) -> CheckResult:
    title = CHECKS[name]
    return CheckResult(name, title, True, summary, cases=(CheckCase(title, True),))


def _failed(name: str, summary: str, rows: Sequence[Mapping[str, Any]], total: int) -> CheckResult:
    title = CHECKS[name]
    return CheckResult(
        name, title, False, summary, tuple(dict(row) for row in rows), total, cases=(CheckCase(title, False, summary),)
    )


def _scopes(scopes: Any) -> str:
    names = [scope or "gate.invoke" for scope in (scopes or [])]
    return ", ".join(names) if names else "no scope"


def _violations_text(check: CheckResult) -> str:
    lines = [check.summary]
    lines.extend(json.dumps(row, sort_keys=True, default=str) for row in check.violations)
    if check.total > len(check.violations):
        lines.append(f"... and {check.total - len(check.violations)} more")
    return "\n".join(lines)
