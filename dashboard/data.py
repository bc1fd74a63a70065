"""What each dashboard page reads: the named queries it runs and the shapes it gets back.

Nothing here imports Streamlit: a page hands its loader a `Query` (a named query name and its
parameters in, rows out) and renders what comes back. The benchmark times the same loaders over a
million events, so its figures are the pages' own.

Every value a user types (filters, a call id) travels as a parameter of a named query, never as
SQL; a bad value comes back as the query's `QueryError` naming the parameter.
"""

from __future__ import annotations

import csv
import io
import json
import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Literal

from consumers.coverage import CHECKS, CheckResult, SignaturesUnavailableError, run_checks
from consumers.proofs import MATERIAL_QUERY, build_proof
from consumers.queries import MAX_LIMIT
from consumers.reader import AuditReader
from events.proofs import UnreadableProofError, Verdict, check_inclusion, check_note, fail, parse_proof
from events.signing import VerifyingKey

__all__ = [
    "BLOCKED_COLUMNS",
    "BLOCKED_TABLE_COLUMNS",
    "DECISION_LABELS",
    "DEFAULT_WINDOW",
    "IMPACT_COLUMNS",
    "METRICS",
    "PROOF_STEPS",
    "RUN_COLUMNS",
    "RUN_OUTCOMES",
    "RUN_OUTCOME_WORDS",
    "SHADOW_CALL_COLUMNS",
    "SIGNED_COLUMNS",
    "STORY_COLUMNS",
    "TOP_DENIED",
    "TREND_DIMENSIONS",
    "WINDOWS",
    "BlockedFilters",
    "BlockedPage",
    "Bucketed",
    "CallDetail",
    "Decider",
    "Impact",
    "Overview",
    "Pipeline",
    "ProofView",
    "Query",
    "RunFilters",
    "RunStory",
    "RunsPage",
    "ShadowCalls",
    "Signatures",
    "Trends",
    "Window",
    "blocked_csv",
    "bucket_label",
    "bucket_width",
    "bucketed",
    "call_evidence",
    "call_proofs",
    "check_proof_steps",
    "fetch_all",
    "load_blocked",
    "load_call",
    "load_coverage",
    "load_impact",
    "load_overview",
    "load_pipeline",
    "load_proof",
    "load_run",
    "load_runs",
    "load_shadow_calls",
    "load_trends",
    "replay_command",
    "store_is_empty",
    "trail_text",
]

Query = Callable[[str, Mapping[str, Any]], list[dict[str, Any]]]
"""Runs one named query with its parameters and returns its rows; raises what the reader raises."""

WINDOWS: Final[dict[str, int | None]] = {
    "Last 15 minutes": 15,
    "Last hour": 60,
    "Last 6 hours": 360,
    "Last 24 hours": 1440,
    "Last 7 days": 10080,
    "Last 30 days": 43200,
    "All time": None,
}
"""The time windows a user picks from, in minutes (None: everything stored)."""

DEFAULT_WINDOW: Final = "Last 24 hours"

METRICS: Final[tuple[tuple[str, str], ...]] = (
    ("calls", "Calls"),
    ("allowed", "Allowed"),
    ("denied", "Denied"),
    ("substituted", "Substituted"),
    ("blocked", "Blocked"),
    ("approvals_asked", "Approvals asked"),
    ("approvals_refused", "Approvals refused"),
    ("unmediated", "Unmediated accesses"),
    ("chain_breaks", "Chain breaks"),
)
"""The Overview's metrics (the `overview_counts` rows) and their labels, in display order."""

TOP_DENIED: Final[tuple[tuple[str, str], ...]] = (
    ("tool", "Tools"),
    ("tenant", "Tenants"),
    ("principal", "Principals"),
    ("decided_by", "Interceptors"),
)
"""The Overview's top-denied lists: `top_denied`'s `by` and the heading."""

BLOCKED_COLUMNS: Final = (
    "time",
    "type",
    "cause",
    "decided_by",
    "message",
    "tenant",
    "principal",
    "agent",
    "tool",
    "call_id",
    "run_id",
    "trace_id",
    "gate",
    "workflow",
    "event_id",
)
"""The Blocked attempts CSV's columns, in order."""

BLOCKED_TABLE_COLUMNS: Final = (
    "time",
    "type",
    "tenant",
    "principal",
    "tool",
    "decided_by",
    "cause",
    "message",
    "call_id",
    "agent",
)
"""The Blocked attempts table's columns: who and what first, so they fit a laptop's width (the run
id, trace id, gate, workflow and event id are in the CSV and on the call's page)."""

_BUCKETS: Final = (1, 5, 15, 30, 60, 180, 360, 720, 1440, 10080)
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
# Enough rows for any chart the pages draw; past that a chart is not readable anyway.
_MAX_CHART_ROWS: Final = 10 * MAX_LIMIT


@dataclass(frozen=True, slots=True)
class Window:
    """A time window: [since, now) for a named window, everything for "All time".

    `since` is rounded down to `step_s` seconds, so the parameters (and the cache keys made of
    them) stay the same for a refresh period; `until` is None: the store's now.
    """

    label: str
    minutes: int | None
    since: datetime | None

    @classmethod
    def named(cls, label: str, *, now: datetime | None = None, step_s: float = 1.0) -> Window:
        """The window called `label` (a key of `WINDOWS`); `ValueError` naming the known ones."""
        if label not in WINDOWS:
            raise ValueError(f"unknown window {label!r}; known: {', '.join(WINDOWS)}")
        minutes = WINDOWS[label]
        if minutes is None:
            return cls(label, None, None)
        now = now or datetime.now(UTC)
        start = now - timedelta(minutes=minutes)
        step = max(step_s, 1.0)
        rounded = _EPOCH + timedelta(seconds=(start - _EPOCH).total_seconds() // step * step)
        return cls(label, minutes, rounded)

    @property
    def compares(self) -> bool:
        """Whether there is a previous window of the same length to compare with."""
        return self.minutes is not None

    def params(self) -> dict[str, Any]:
        """`since` for the queries that take a window (absent for all time)."""
        return {"since": self.since.isoformat()} if self.since is not None else {}

    def duration(self) -> str | None:
        """The window as a `--since` duration of the command line (`15m`, `24h`, `7d`); None for all time."""
        if self.minutes is None:
            return None
        if self.minutes % 1440 == 0 and self.minutes > 1440:
            return f"{self.minutes // 1440}d"
        if self.minutes % 60 == 0:
            return f"{self.minutes // 60}h"
        return f"{self.minutes}m"

    def bucket_minutes(self, buckets: int = 60) -> int:
        """A round bucket width that cuts the window into about `buckets` buckets (a day for all time)."""
        if self.minutes is None:
            return 1440
        wanted = self.minutes / buckets
        return next((b for b in _BUCKETS if b >= wanted), _BUCKETS[-1])


def fetch_all(
    query: Query, name: str, params: Mapping[str, Any], *, max_rows: int = _MAX_CHART_ROWS
) -> list[dict[str, Any]]:
    """Every row of a paged query, a page of `MAX_LIMIT` at a time, up to `max_rows`."""
    rows: list[dict[str, Any]] = []
    while len(rows) < max_rows:
        page = query(name, {**params, "limit": min(MAX_LIMIT, max_rows - len(rows)), "offset": len(rows)})
        rows.extend(page)
        if len(page) < MAX_LIMIT:
            break
    return rows


_BUCKET_SECONDS: Final = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
_REFINEMENTS: Final = 6


def bucket_width(span_s: float, buckets: int) -> int:
    """The round bucket width in seconds (1 s to a day) that cuts `span_s` seconds into at most
    about `buckets` buckets."""
    wanted = span_s / max(buckets, 1)
    return next((b for b in _BUCKET_SECONDS if b >= wanted), _BUCKET_SECONDS[-1])


def bucket_label(seconds: int) -> str:
    """A bucket width in words: `10-second`, `5-minute`, `6-hour`, `1-day`."""
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size}-{unit}"
    return f"{seconds}-second"


@dataclass(frozen=True, slots=True)
class Bucketed:
    """Rows of a chart query and the bucket width they were counted in (seconds)."""

    rows: list[dict[str, Any]]
    seconds: int

    @property
    def label(self) -> str:
        """The width in words (`bucket_label`)."""
        return bucket_label(self.seconds)


def bucketed(
    query: Query,
    name: str,
    params: Mapping[str, Any],
    window: Window,
    *,
    buckets: int,
    now: datetime | None = None,
    until: datetime | None = None,
) -> Bucketed:
    """Rows of chart query `name` (one that takes `bucket_seconds`), in buckets fitted to the window
    and to the data's span: first about `buckets` buckets over the window (a day each for all
    time); when the data fills only a few of them, again over just the buckets it fills, finer,
    until the width settles (at most six passes). So a minute of events shows in seconds whatever
    the window, and thirty days of them in days. Each pass is one paged query over a narrower range.
    `until`: the range's end (else now)."""
    now = until or now or datetime.now(UTC)
    since: datetime | None = window.since
    width = bucket_width((now - since).total_seconds(), buckets) if since is not None else 86400
    rows: list[dict[str, Any]] = []
    for attempt in range(_REFINEMENTS):
        ranged = {**params, "bucket_seconds": width}
        if since is not None:
            ranged["since"] = since.isoformat()
        if until is not None:
            ranged["until"] = until.isoformat()
        rows = fetch_all(query, name, ranged)
        if not rows or attempt == _REFINEMENTS - 1:
            break
        starts = [datetime.fromisoformat(str(row["bucket"])) for row in rows]
        first, last = min(starts), max(starts) + timedelta(seconds=width)
        finer = bucket_width((last - first).total_seconds(), buckets)
        if finer >= width:
            break
        since, until, width = first, last, finer
    return Bucketed(rows, width)


def store_is_empty(query: Query, *, scoped: bool = False) -> bool:
    """Whether the store holds no event at all; `scoped`: none that the reader's tenant may read
    (through a tenant query: a session limited to tenants may not run the store-wide one)."""
    if scoped:
        counts = query("event_counts", {"since": _EPOCH.isoformat()})
        return not any(int(row.get("events") or 0) for row in counts)
    rows = query("pipeline_health", {})
    return not rows or not rows[0].get("total_events")


def _tenant(tenant: str | None) -> dict[str, Any]:
    return {"tenant": tenant} if tenant else {}


# -- Overview -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Overview:
    """The Overview page: metrics (`overview_counts` rows with a `label`), decisions over time
    (`decision_trends` rows) and the top denied per `TOP_DENIED` key."""

    metrics: list[dict[str, Any]]
    trends: list[dict[str, Any]]
    bucket_seconds: int
    top: dict[str, list[dict[str, Any]]]

    @property
    def decisions(self) -> list[dict[str, Any]]:
        """The tool decisions over time: `trends` rows of the outcome types, each with its
        `decision` label (allowed, denied, substituted, blocked)."""
        return [
            {**row, "decision": DECISION_LABELS[row["type"]]} for row in self.trends if row["type"] in DECISION_LABELS
        ]

    @property
    def turns(self) -> list[dict[str, Any]]:
        """The model turns the before-turn chain decided on, over time (`TurnDecision` rows)."""
        return [row for row in self.trends if row["type"] == "TurnDecision"]


DECISION_LABELS: Final = {
    "ToolUse": "allowed",
    "ToolDenied": "denied",
    "Substitute": "substituted",
    "Blocked": "blocked",
}
"""The tool decisions the Overview charts: outcome event type -> label."""


def load_overview(query: Query, window: Window, tenant: str | None = None, *, now: datetime | None = None) -> Overview:
    """Run the Overview's queries: 1 + 1 to 3 (paged, `bucketed`) + 4."""
    since = window.since if window.since is not None else _EPOCH
    counts = {row["metric"]: row for row in query("overview_counts", {"since": since.isoformat(), **_tenant(tenant)})}
    metrics = [{**counts[key], "label": label} for key, label in METRICS if key in counts]
    trends = bucketed(query, "decision_trends", _tenant(tenant), window, buckets=48, now=now)
    top = {
        by: query("top_denied", {**window.params(), "by": by, "limit": 10, **_tenant(tenant)}) for by, _ in TOP_DENIED
    }
    return Overview(metrics, trends.rows, trends.seconds, top)


# -- Blocked attempts ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BlockedFilters:
    """The Blocked attempts filters; empty text means no filter. `since` / `until` are ISO 8601
    text as typed (the query checks them and names a bad one)."""

    since: str | None = None
    until: str | None = None
    tenant: str | None = None
    principal: str | None = None
    agent: str | None = None
    tool: str | None = None
    type: str | None = None
    decided_by: str | None = None
    text: str | None = None

    def params(self) -> dict[str, Any]:
        """The filters as `blocked_attempts` parameters (blank ones left out)."""
        values = {
            "since": self.since,
            "until": self.until,
            "tenant": self.tenant,
            "principal": self.principal,
            "agent": self.agent,
            "tool": self.tool,
            "type": self.type,
            "decided_by": self.decided_by,
            "text": self.text,
        }
        return {key: value.strip() for key, value in values.items() if value is not None and value.strip()}


@dataclass(frozen=True, slots=True)
class BlockedPage:
    """One page of blocked attempts and the count of everything the filters match."""

    count: dict[str, Any]
    rows: list[dict[str, Any]]
    page: int
    page_size: int

    @property
    def pages(self) -> int:
        """How many pages the filters fill (at least 1)."""
        return max(1, -(-int(self.count.get("attempts") or 0) // self.page_size))


def load_blocked(query: Query, filters: BlockedFilters, *, page: int = 1, page_size: int = 100) -> BlockedPage:
    """The count and page `page` (from 1) of the blocked attempts the filters match, newest first."""
    if not 1 <= page_size <= MAX_LIMIT:
        raise ValueError(f"page_size must be from 1 to {MAX_LIMIT}, got {page_size}")
    if page < 1:
        raise ValueError(f"page must be 1 or more, got {page}")
    params = filters.params()
    (count,) = query("blocked_attempts_count", params) or [{"attempts": 0, "denied": 0, "blocked": 0}]
    rows = query("blocked_attempts", {**params, "limit": page_size, "offset": (page - 1) * page_size})
    return BlockedPage(count, rows, page, page_size)


# Spreadsheet programs run a cell that starts like a formula; event text may be written by an
# attacker, so such cells are written with a leading apostrophe.
_FORMULA_START: Final = ("=", "+", "-", "@", "\t", "\r")


def _csv_cell(value: Any) -> str:
    if value is None:
        return ""
    text = value if isinstance(value, str) else json.dumps(value) if isinstance(value, dict | list) else str(value)
    return "'" + text if text.startswith(_FORMULA_START) else text


def blocked_csv(query: Query, filters: BlockedFilters, *, max_rows: int = 100_000) -> str:
    """Every blocked attempt the filters match (up to `max_rows`, newest first) as CSV text, with
    cells that a spreadsheet would run as a formula defused."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(BLOCKED_COLUMNS)
    for row in fetch_all(query, "blocked_attempts", filters.params(), max_rows=max_rows):
        writer.writerow([_csv_cell(row.get(column)) for column in BLOCKED_COLUMNS])
    return out.getvalue()


# -- Call detail --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CallDetail:
    """One call: its events (`call_detail` rows: the call's own, then its child calls') and the
    decision trail flattened into timeline steps."""

    call_id: str
    events: list[dict[str, Any]]
    trail: list[dict[str, Any]] = field(default_factory=list)

    @property
    def deciding_step(self) -> dict[str, Any] | None:
        """The enforced trail step of the interceptor that decided the call, if it is in the trail."""
        decided_by = (self.outcome or {}).get("decided_by")
        steps = [s for s in self.trail if s["interceptor"] == decided_by and s["mode"] == "enforced"]
        return steps[-1] if steps else None

    @property
    def outcome(self) -> dict[str, Any] | None:
        """The call's own outcome event (ToolUse, ToolDenied, Substitute or Blocked), if stored."""
        return next(
            (
                e
                for e in self.events
                if e["relation"] == "call" and e["type"] in ("ToolUse", "ToolDenied", "Substitute", "Blocked")
            ),
            None,
        )


def load_call(query: Query, call_id: str) -> CallDetail:
    """The events of call `call_id` and its decision trail. The trail comes from the outcome event
    (it carries every step), each step placed after the ones before it."""
    events = fetch_all(query, "call_detail", {"call_id": call_id}, max_rows=MAX_LIMIT)
    own = [e for e in events if e["relation"] == "call"]
    source = next((e for e in reversed(own) if e.get("decisions")), None)
    trail: list[dict[str, Any]] = []
    start = 0.0
    for step, decision in enumerate((source or {}).get("decisions") or [], start=1):
        duration = float(decision.get("duration_ms") or 0.0)
        trail.append(
            {
                "step": step,
                "interceptor": decision.get("interceptor"),
                "scope": decision.get("scope"),
                "phase": decision.get("phase"),
                "decision": decision.get("kind"),
                # Absent on calls without shadow decisions: every step was enforced.
                "mode": "shadow" if decision.get("enforced") is False else "enforced",
                "rules": ", ".join(str(rule.get("id")) for rule in decision.get("rules") or []),
                "policy_version": decision.get("policy_version"),
                "start_ms": round(start, 3),
                "duration_ms": duration,
                "error": decision.get("error"),
            }
        )
        start += duration
    return CallDetail(call_id, events, trail)


def call_evidence(detail: CallDetail) -> bytes:
    """The call's stored events as JSON lines, each exactly as the store holds it (redacted at the
    gate), the call's own events first, then its child calls'."""
    lines = [str(e["stored_event"]) for e in detail.events if e.get("stored_event")]
    return "".join(f"{line}\n" for line in lines).encode("utf-8")


# -- Runs ---------------------------------------------------------------------------------------

RUN_COLUMNS: Final = (
    "last_time",
    "run_id",
    "outcome",
    "tenant",
    "principal",
    "thread_id",
    "turns",
    "calls",
    "denied",
    "blocked",
    "approvals_asked",
)
"""The run search table's columns (of the `runs` rows), in order: those that fit a laptop's width
(the run's page has the rest)."""

STORY_COLUMNS: Final = (
    "time",
    "step",
    "decision",
    "decided_by",
    "detail",
    "trail",
    "agent",
    "call_id",
    "run_id",
)
"""The Run page's story table: one row per turn, call, approval or unmediated use, in order."""

RUN_OUTCOMES: Final[dict[str, str]] = {
    "blocked": "Blocked: a call was blocked, which stopped the run",
    "turn_denied": "Stopped: a before-turn interceptor denied (or failed on) a model turn",
    "turn_substituted": "Ended: a before-turn interceptor gave the final output in place of the model",
    "had_denials": "Ran on after denied calls: no block and no denied turn recorded",
    "clean": "Every call allowed: no block and no denied turn recorded",
    "empty": "No event of this run is stored",
}
"""What each run outcome (the `runs` query's `outcome`) means, in the dashboard's own words."""

RUN_OUTCOME_WORDS: Final[dict[str, str]] = {
    "blocked": "blocked",
    "turn_denied": "turn denied",
    "turn_substituted": "output substituted",
    "had_denials": "had denials",
    "clean": "clean",
    "empty": "nothing stored",
}
"""Each run outcome in a word or two, as the runs table shows it (`RUN_OUTCOMES` says it in full)."""

_CALL_OUTCOMES: Final = ("ToolUse", "ToolDenied", "Substitute", "Blocked")
_MAX_DEPTH: Final = 32


@dataclass(frozen=True, slots=True)
class RunFilters:
    """The run search: a run id prefix, a principal, a thread, a tenant; empty text means no filter."""

    run_id: str | None = None
    principal: str | None = None
    thread_id: str | None = None
    tenant: str | None = None

    def params(self) -> dict[str, Any]:
        """The filters as `runs` parameters (blank ones left out)."""
        values = {
            "run_id": self.run_id,
            "principal": self.principal,
            "thread_id": self.thread_id,
            "tenant": self.tenant,
        }
        return {key: value.strip() for key, value in values.items() if value is not None and value.strip()}


@dataclass(frozen=True, slots=True)
class RunsPage:
    """One page of runs, newest last event first; `more` says whether a next page has any."""

    rows: list[dict[str, Any]]
    page: int
    page_size: int
    more: bool


def load_runs(query: Query, window: Window, filters: RunFilters, *, page: int = 1, page_size: int = 100) -> RunsPage:
    """Page `page` (from 1) of the runs with an event in the window that the filters match. One
    query (a row more than the page, to know whether another page follows)."""
    if not 1 <= page_size < MAX_LIMIT:
        raise ValueError(f"page_size must be from 1 to {MAX_LIMIT - 1}, got {page_size}")
    if page < 1:
        raise ValueError(f"page must be 1 or more, got {page}")
    params = {**window.params(), **filters.params(), "limit": page_size + 1, "offset": (page - 1) * page_size}
    rows = [
        {**row, "outcome": RUN_OUTCOME_WORDS.get(row.get("outcome"), row.get("outcome"))}
        for row in query("runs", params)
    ]
    return RunsPage(rows[:page_size], page, page_size, more=len(rows) > page_size)


@dataclass(frozen=True, slots=True)
class RunStory:
    """One run told in order: its events (`run_events` rows), the story rows (`STORY_COLUMNS` and
    `depth`: 0 for the run's own turns and calls, one more under each enclosing call), and the final
    outcome (a `RUN_OUTCOMES` key) with the event that decided it, if any."""

    run_id: str
    events: list[dict[str, Any]]
    steps: list[dict[str, Any]]
    outcome: str
    deciding: dict[str, Any] | None

    @property
    def who(self) -> dict[str, Any]:
        """Tenant, principal, thread and gate of the run (from its first event that names them)."""
        own = [e for e in self.events if e.get("run_id") == self.run_id] or self.events
        return {
            key: next((e[key] for e in own if e.get(key) is not None), None)
            for key in ("tenant", "principal", "thread_id", "gate")
        }

    @property
    def nested_runs(self) -> list[str]:
        """Run ids of agents nested under this run's calls that ran under a run id of their own."""
        return sorted({str(e["run_id"]) for e in self.events if e.get("run_id") and e["run_id"] != self.run_id})

    def count(self, kind: str) -> int:
        """How many story rows are of `kind` (turn, call, approval asked, approval, unmediated)."""
        return sum(1 for step in self.steps if step["kind"] == kind)


def trail_text(decisions: Any) -> str:
    """A decision trail as one line: `interceptor: kind` per step, in order, shadow steps marked."""
    if not isinstance(decisions, list):
        return ""
    parts = []
    for step in decisions:
        if not isinstance(step, dict):
            continue
        shadow = " (shadow)" if step.get("enforced") is False else ""
        parts.append(f"{step.get('interceptor')}: {step.get('kind')}{shadow}")
    return " -> ".join(parts)


def _call_decision(event: Mapping[str, Any] | None) -> str:
    if event is None:
        return "no outcome stored"
    kind = {"ToolUse": "allowed", "ToolDenied": "denied", "Substitute": "substituted", "Blocked": "blocked"}
    text = kind.get(str(event["type"]), str(event["type"]))
    return f"{text} ({event['outcome']})" if event.get("outcome") else text


def load_run(query: Query, run_id: str, tenant: str | None = None) -> RunStory:
    """Run `run_id`'s story from its `run_events` rows (paged; nested runs included), `tenant` bound
    when given.

    The story is a tree: each call sits under the call its events name as `parent_call_id` (when
    that call is part of the story), and so do the turn decisions of a nested agent; approvals and
    unmediated uses sit under their call. Siblings are in time order, a call placed at its earliest
    event or its nested ones' (an enclosing call's outcome is stored after everything it made).
    The outcome: a block (the first), else a denied or failed turn, else a substituted turn, else
    had_denials or clean."""
    params: dict[str, Any] = {"run_id": run_id, **_tenant(tenant)}
    events = fetch_all(query, "run_events", params)
    if not events:
        return RunStory(run_id, [], [], "empty", None)
    calls: dict[str, dict[str, Any]] = {}
    for order, event in enumerate(events):
        call_id = event.get("call_id")
        if call_id is None:
            continue
        entry = calls.setdefault(str(call_id), {"events": [], "order": order, "parent": None})
        entry["events"].append(event)
        entry["parent"] = entry["parent"] or event.get("parent_call_id")

    # Items: ("call", call_id) or ("event", index); children by the item they sit under.
    children: dict[str | None, list[tuple[str, Any]]] = {}
    for call_id, entry in calls.items():
        parent = entry["parent"] if entry["parent"] in calls and entry["parent"] != call_id else None
        children.setdefault(parent, []).append(("call", call_id))
    for index, event in enumerate(events):
        if event["type"] in ("ToolsRegistered", "Checkpoint"):
            continue
        call_id = event.get("call_id")
        if call_id is not None and event["type"] not in _CALL_OUTCOMES:
            children.setdefault(str(call_id), []).append(("event", index))
        elif call_id is None:
            parent = event.get("parent_call_id")
            children.setdefault(str(parent) if parent in calls else None, []).append(("event", index))

    starts: dict[str, tuple[str, int]] = {}

    def start(item: tuple[str, Any], depth: int = 0) -> tuple[str, int]:
        kind, key = item
        if kind == "event":
            return (str(events[key]["time"]), key)
        if key in starts:
            return starts[key]
        own = min((str(e["time"]), calls[key]["order"]) for e in calls[key]["events"])
        nested = [start(child, depth + 1) for child in children.get(key, [])] if depth < _MAX_DEPTH else []
        starts[key] = min([own, *nested])
        return starts[key]

    steps: list[dict[str, Any]] = []
    seen: set[str] = set()

    def emit_call(key: str, depth: int) -> None:
        if key in seen or depth > _MAX_DEPTH:
            return
        seen.add(key)
        own = calls[key]["events"]
        outcome = next((e for e in own if e["type"] in _CALL_OUTCOMES), None)
        head = outcome or own[0]
        steps.append(
            {
                "kind": "call",
                "depth": depth,
                "time": start(("call", key))[0],
                "step": f"{head.get('tool')}",
                "decision": _call_decision(outcome),
                "decided_by": head.get("decided_by"),
                "detail": head.get("message"),
                "trail": trail_text(head.get("decisions")),
                "agent": head.get("agent"),
                "call_id": key,
                "run_id": head.get("run_id"),
                "event_id": head.get("event_id"),
            }
        )
        emit(key, depth + 1)

    def emit(parent: str | None, depth: int) -> None:
        for kind, key in sorted(children.get(parent, []), key=start):
            if kind == "event":
                steps.append(_event_step(events[key], depth))
            else:
                emit_call(key, depth)

    emit(None, 0)
    # Calls whose parents name each other (forged events can) are reachable from no root: they are
    # told at the top level rather than left out.
    for key in calls:
        emit_call(key, 0)
    for number, step in enumerate(steps, start=1):
        step["number"] = number
    outcome, deciding = _run_outcome(events)
    return RunStory(run_id, events, steps, outcome, deciding)


def _event_step(event: Mapping[str, Any], depth: int) -> dict[str, Any]:
    kind = str(event["type"])
    step: dict[str, Any] = {
        "depth": depth,
        "time": event["time"],
        "decided_by": event.get("decided_by"),
        "detail": event.get("message"),
        "trail": trail_text(event.get("decisions")),
        "agent": event.get("agent"),
        "call_id": event.get("call_id"),
        "run_id": event.get("run_id"),
        "event_id": event.get("event_id"),
    }
    if kind == "TurnDecision":
        count = event.get("message_count")
        messages = f"{count} message" if count == 1 else f"{count} messages"
        step.update(kind="turn", step=f"turn {event.get('turn')} ({messages})", decision=event.get("turn_decision"))
    elif kind == "ApprovalRequested":
        # The trail so far is the call's own (on its row); the approval rows say who and why.
        step.update(kind="approval asked", step="approval asked", decision="asked", trail="")
    elif kind == "ApprovalResolved":
        by = event.get("approved_by")
        step.update(
            kind="approval",
            step="approval",
            decision=str(event.get("outcome") or "answered"),
            decided_by=f"by {by}" if by else "no answer",
            detail=event.get("note") or event.get("message"),
            trail="",
        )
    elif kind == "Unmediated":
        step.update(kind="unmediated", step="unmediated use", decision="unmediated")
    else:
        step.update(kind=kind, step=kind, decision=None)
    return step


def _run_outcome(events: list[dict[str, Any]]) -> tuple[str, dict[str, Any] | None]:
    blocked = next((e for e in events if e["type"] == "Blocked"), None)
    if blocked is not None:
        return "blocked", blocked
    turns = [e for e in events if e["type"] == "TurnDecision"]
    stopped = next((e for e in turns if e.get("turn_decision") in ("deny", "error")), None)
    if stopped is not None:
        return "turn_denied", stopped
    substituted = next((e for e in turns if e.get("turn_decision") == "substitute"), None)
    if substituted is not None:
        return "turn_substituted", substituted
    denied = next((e for e in events if e["type"] == "ToolDenied"), None)
    return ("had_denials", denied) if denied is not None else ("clean", None)


# -- Trends -------------------------------------------------------------------------------------


TREND_DIMENSIONS = {"Tool": "tool", "Tenant": "tenant", "Policy rule": "rule", "Interceptor": "interceptor"}
"""The Trends page's series dimensions: label -> `denial_rate`'s `by`."""


@dataclass(frozen=True, slots=True)
class Trends:
    """Denial rate per bucket by tool and by interceptor, and by the chosen dimension (`denial_rate`
    rows); the calls of the range (`total_calls`, the interceptors' common denominator); and the
    denial reasons first seen in the range (`new_denial_reasons` rows)."""

    by_tool: list[dict[str, Any]]
    by_interceptor: list[dict[str, Any]]
    new_reasons: list[dict[str, Any]]
    bucket_seconds: int
    series: list[dict[str, Any]] = field(default_factory=list)
    total_calls: int = 0


def load_trends(
    query: Query,
    window: Window,
    tenant: str | None = None,
    *,
    now: datetime | None = None,
    until: datetime | None = None,
    by: str = "tool",
) -> Trends:
    """Run the Trends page's queries: the denial rate per tool in buckets fitted to the data
    (`bucketed`), per interceptor and per `by` (tool, tenant, rule or interceptor) in the same
    buckets over the same range, new reasons once. `until`: the range's end (else now)."""
    by_tool = bucketed(
        query, "denial_rate", {"by": "tool", **_tenant(tenant)}, window, buckets=24, now=now, until=until
    )
    params: dict[str, Any] = {**window.params(), "bucket_seconds": by_tool.seconds}
    if until is not None:
        params["until"] = until.isoformat()
    if by_tool.rows:
        starts = sorted(str(row["bucket"]) for row in by_tool.rows)
        end = datetime.fromisoformat(starts[-1]) + timedelta(seconds=by_tool.seconds)
        params.update(since=starts[0], until=end.isoformat())
    by_interceptor = fetch_all(query, "denial_rate", {**params, "by": "interceptor", **_tenant(tenant)})
    if by == "tool":
        series = by_tool.rows
    elif by == "interceptor":
        series = by_interceptor
    else:
        series = fetch_all(query, "denial_rate", {**params, "by": by, **_tenant(tenant)})
    since = window.since if window.since is not None else _EPOCH
    reasons: dict[str, Any] = {"since": since.isoformat(), "limit": 200, **_tenant(tenant)}
    if until is not None:
        reasons["until"] = until.isoformat()
    new_reasons = query("new_denial_reasons", reasons)
    total = sum(int(row.get("calls") or 0) for row in by_tool.rows)
    return Trends(by_tool.rows, by_interceptor, new_reasons, by_tool.seconds, series, total)


# -- Pipeline health ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Pipeline:
    """The pipeline's state: store-wide figures (the first `pipeline_health` row), per-partition
    offsets and ingest delay (`ingest_lag`), dead letters per reason and the latest ones, and
    events per minute over the last hour."""

    health: dict[str, Any]
    partitions: list[dict[str, Any]]
    dead_letters: list[dict[str, Any]]
    dead_letter_sample: list[dict[str, Any]]
    per_minute: list[dict[str, Any]]


def load_pipeline(query: Query, *, minutes: int = 15, now: datetime | None = None) -> Pipeline:
    """Run the Pipeline health page's queries (5)."""
    health_rows = query("pipeline_health", {"minutes": minutes})
    partitions = query("ingest_lag", {"minutes": minutes})
    dead = query("dead_letters", {"limit": 50})
    sample = query("dead_letter_records", {"limit": 20})
    hour_ago = (now or datetime.now(UTC)) - timedelta(hours=1)
    trend = fetch_all(query, "decision_trends", {"since": hour_ago.replace(second=0, microsecond=0).isoformat()})
    per_minute: dict[str, int] = {}
    for row in trend:
        per_minute[row["bucket"]] = per_minute.get(row["bucket"], 0) + int(row["events"])
    return Pipeline(
        health_rows[0] if health_rows else {},
        partitions,
        dead,
        sample,
        [{"minute": minute, "events": n} for minute, n in sorted(per_minute.items())],
    )


# -- Policy impact ------------------------------------------------------------------------------

IMPACT_COLUMNS: Final = (
    "decider",
    "shadow_rule",
    "tool",
    "tenant",
    "calls",
    "divergent",
    "would_deny",
    "would_block",
    "would_substitute",
    "would_ask",
    "first_time",
    "last_time",
)
"""The Policy impact table's columns (`shadow_impact` rows with a `decider` label), in order."""

SHADOW_CALL_COLUMNS: Final = (
    "time",
    "type",
    "shadow_outcome",
    "divergent",
    "shadow_decided_by",
    "shadow_rule",
    "tool",
    "tenant",
    "principal",
    "agent",
    "decided_by",
    "message",
    "call_id",
    "run_id",
    "gate",
    "workflow",
    "event_id",
)
"""The columns of the calls behind the Policy impact counts (`shadow_calls` rows), in order."""

ENFORCED_PATH: Final = "(the enforced chain)"
"""The `decider` label of calls whose shadow outcome is what the enforced chain decided."""


@dataclass(frozen=True, slots=True)
class Decider:
    """One shadow decider over the window: a shadow interceptor (`rule` None), or one rule of a policy
    file (`name` the file's name), with its calls and divergent calls summed over tools and tenants."""

    name: str
    rule: str | None
    calls: int
    divergent: int

    @property
    def label(self) -> str:
        """`name / rule` for a policy rule, `name` for an interceptor (for option lists and charts)."""
        return _decider_label(self.name, self.rule)

    @property
    def is_policy(self) -> bool:
        """Whether it is a policy file's rule (a policy file's default decision has no rule: it shows as an
        interceptor)."""
        return self.rule is not None

    @property
    def key(self) -> str:
        """An unambiguous text key for a widget's options (names are arbitrary text)."""
        return json.dumps([self.name, self.rule])

    @staticmethod
    def parse_key(key: str) -> tuple[str, str | None]:
        """The (name, rule) of a `key`; `ValueError` for text that is not one."""
        try:
            name, rule = json.loads(key)
        except (ValueError, TypeError):
            name, rule = None, None
        if not isinstance(name, str) or not (rule is None or isinstance(rule, str)):
            raise ValueError(f"not a decider key: {key!r}")
        return name, rule


@dataclass(frozen=True, slots=True)
class Impact:
    """The Policy impact page's figures over a window: `shadow_impact` rows (each with a `decider`:
    `shadow_decided_by`, or `ENFORCED_PATH` when it is null), the deciders summed from them (most
    divergent first; the enforced chain is none), and `shadow_divergence` rows per bucket (each with
    a `key` label)."""

    rows: list[dict[str, Any]]
    deciders: list[Decider]
    divergence: list[dict[str, Any]]
    bucket_seconds: int

    def total(self, column: str) -> int:
        """A column of `shadow_impact` summed over every row."""
        return sum(int(row.get(column) or 0) for row in self.rows)

    def calls_of(self, name: str | None, rule: str | None, *, divergent_only: bool = False) -> int:
        """How many calls `shadow_calls` lists for this decider filter (every call for name None)."""
        column = "divergent" if divergent_only else "calls"
        return sum(
            int(row.get(column) or 0)
            for row in self.rows
            if name is None or (row["shadow_decided_by"] == name and (rule is None or row["shadow_rule"] == rule))
        )


def _decider_label(name: str | None, rule: str | None) -> str:
    if name is None:
        return ENFORCED_PATH
    return f"{name} / {rule}" if rule is not None else name


def load_impact(query: Query, window: Window, tenant: str | None = None, *, now: datetime | None = None) -> Impact:
    """Run the Policy impact page's figures: `shadow_impact` and `shadow_divergence`, both paged."""
    common = {**window.params(), **_tenant(tenant)}
    rows = [
        {**row, "decider": ENFORCED_PATH if row["shadow_decided_by"] is None else row["shadow_decided_by"]}
        for row in fetch_all(query, "shadow_impact", common)
    ]
    summed: dict[tuple[str, str | None], list[int]] = {}
    for row in rows:
        if row["shadow_decided_by"] is None:
            continue
        total = summed.setdefault((row["shadow_decided_by"], row["shadow_rule"]), [0, 0])
        total[0] += int(row["calls"])
        total[1] += int(row["divergent"])
    deciders = sorted(
        (Decider(name, rule, calls, divergent) for (name, rule), (calls, divergent) in summed.items()),
        key=lambda d: (-d.divergent, -d.calls, d.name, d.rule or ""),
    )
    divergent = bucketed(query, "shadow_divergence", _tenant(tenant), window, buckets=48, now=now)
    divergence = [
        {**row, "key": _decider_label(row["shadow_decided_by"], row["shadow_rule"])}
        for row in divergent.rows
        if row["shadow_decided_by"] is not None
    ]
    return Impact(rows, deciders, divergence, divergent.seconds)


@dataclass(frozen=True, slots=True)
class ShadowCalls:
    """One page of the calls behind the Policy impact counts (`shadow_calls` rows), newest first."""

    rows: list[dict[str, Any]]
    page: int
    page_size: int
    total: int

    @property
    def pages(self) -> int:
        """How many pages the filter fills (at least 1)."""
        return max(1, -(-self.total // self.page_size))


def load_shadow_calls(
    query: Query,
    window: Window,
    impact: Impact,
    tenant: str | None = None,
    *,
    decider: str | None = None,
    rule: str | None = None,
    divergent_only: bool = False,
    page: int = 1,
    page_size: int = 100,
) -> ShadowCalls:
    """Page `page` (from 1) of the calls of `decider` (and `rule`; every call with a shadow outcome
    when None), newest first; the total comes from `impact`'s counts of the same window."""
    if not 1 <= page_size <= MAX_LIMIT:
        raise ValueError(f"page_size must be from 1 to {MAX_LIMIT}, got {page_size}")
    if page < 1:
        raise ValueError(f"page must be 1 or more, got {page}")
    params: dict[str, Any] = {**window.params(), **_tenant(tenant), "divergent_only": divergent_only}
    if decider is not None:
        params["decider"] = decider
        if rule is not None:
            params["rule"] = rule
    rows = query("shadow_calls", {**params, "limit": page_size, "offset": (page - 1) * page_size})
    total = impact.calls_of(decider, rule, divergent_only=divergent_only)
    return ShadowCalls(rows, page, page_size, total)


def replay_command(decider: Decider, window: Window, *, api: str | None = None, db: str | None = None) -> str:
    """The `callgate replay` command that replays `decider` over `window` against the dashboard's
    source (`--api URL`, else `--db PATH`). The store does not hold where a policy file or an
    interceptor lives, so the command names them `POLICY_FILE` and `MODULE:ATTR` for the reader to
    fill in; nothing from an event goes into it (names are arbitrary text, a shell would run them)."""
    parts = ["callgate", "replay"]
    parts += ["--policy", "POLICY_FILE"] if decider.is_policy else ["--interceptor", "MODULE:ATTR"]
    if api is not None:
        parts += ["--api", shlex.quote(api)]
    elif db is not None:
        parts += ["--db", shlex.quote(db)]
    since = window.duration()
    # Without --since a replay takes the last 7 days: all time has to be asked for.
    parts += ["--since", since if since is not None else "all"]
    return " ".join(parts)


# -- Coverage -----------------------------------------------------------------------------------

SIGNED_COLUMNS: Final = (
    "gate",
    "producer_id",
    "reasons",
    "detail",
    "events",
    "signed",
    "signed_tree_size",
    "checkpoint_seq",
    "checkpoint_time",
    "last_time",
)
"""The columns of the `signed` check's violations (`producer_signatures` rows with their break
kinds in `reasons` and the details in `detail`), in order."""

Signatures = Literal["shown", "required", "not_used", "unavailable"]
"""What the Coverage page says of the `signed` check: shown because the window holds a sign of
signing, shown because the dashboard requires it, not shown (nothing in the window signs), or
the store cannot tell (older than signed checkpoints)."""


def load_coverage(reader: AuditReader, since: datetime | None, *, require_signed: bool = False) -> dict[str, Any]:
    """`consumers.coverage.run_checks(require_exercised=True)` over [since, now) as its `to_dict()`,
    with `signatures` (a `Signatures`) and the `signed` check when it applies: always with
    `require_signed`, else when a producer of the window is signed, has a checkpoint break, or a
    `Checkpoint` event is in the window. A store (or read API) older than signed checkpoints is not
    an error: without `require_signed` the check is left out; with it, it is listed with status
    `unavailable` and the report is not ok ("cannot say" is never clean). Blocks for the queries;
    raises what the reader raises."""
    try:
        report = run_checks(reader, require_exercised=True, require_signed=True, since=since)
    except SignaturesUnavailableError as exc:
        result = run_checks(reader, require_exercised=True, since=since).to_dict()
        result["signatures"] = "unavailable"
        if require_signed:
            result["checks"].append(
                {
                    "name": "signed",
                    "title": CHECKS["signed"],
                    "status": "unavailable",
                    "ok": False,
                    "summary": f"cannot check: {exc}",
                    "total": 0,
                    "listed": 0,
                    "violations": [],
                }
            )
            result["ok"], result["exit_code"] = False, 2
        return result
    signed = report.check("signed")
    result = report.to_dict()
    if require_signed:
        result["signatures"] = "required"
    elif _signs(reader, signed, since):
        result["signatures"] = "shown"
    else:
        result["signatures"] = "not_used"
        result["checks"] = [check for check in result["checks"] if check["name"] != "signed"]
        result["require_signed"] = False
        result["ok"] = all(check["ok"] for check in result["checks"] if check["status"] != "skip")
        result["exit_code"] = 0 if result["ok"] else 1
    for check in result["checks"]:
        if check["name"] == "signed":
            check["violations"] = [
                {**row, "reasons": ", ".join(row.get("reasons") or [])} for row in check["violations"]
            ]
    return result


def _signs(reader: AuditReader, signed: CheckResult, since: datetime | None) -> bool:
    """Whether the window shows signing: a producer that passes (or fails with a valid checkpoint or
    a break), else a `Checkpoint` event (one a materializer without trusted keys could not verify)."""
    if any(case.ok for case in signed.cases):
        return True
    if any(row.get("signed") or row.get("breaks") for row in signed.violations):
        return True
    counts = reader.query("event_counts", {"since": (since or _EPOCH).isoformat()}).rows
    return any(row["type"] == "Checkpoint" and int(row["events"] or 0) > 0 for row in counts)


# -- Proofs -------------------------------------------------------------------------------------

PROOF_STEPS: Final[tuple[tuple[str, str], ...]] = (
    ("event hash", "SHA-256 of the event's stored bytes is the hash the event carries"),
    ("leaf", "the leaf hash of that event hash, at leaf index seq - 1"),
    ("inclusion", "the audit path leads from the leaf to the checkpoint's root at its tree size"),
    ("checkpoint note", "the checkpoint event and its signed note state the same producer, size and root"),
    ("signature", "the note is signed by a key the dashboard trusts"),
)
"""The steps a proof's verification shows, and what each checks, in order."""

# Which shown step each step name of `events.proofs` belongs to.
_STEP_OF: Final = {
    "event_hash": "event hash",
    "event": "event hash",
    "leaf_index": "leaf",
    "leaf_hash": "leaf",
    "audit_path": "inclusion",
    "inclusion": "inclusion",
    "checkpoint": "checkpoint note",
    "note": "checkpoint note",
    "root": "checkpoint note",
    "key": "signature",
    "signature": "signature",
}

_UNSAFE_FILE_CHARS: Final = re.compile(r"[^A-Za-z0-9._-]")


@dataclass(frozen=True, slots=True)
class ProofView:
    """An event's inclusion proof as the Call detail page shows it.

    `proof` is the document (`events.proofs`), None when none could be built (`verdict` says why:
    not found, not covered by a checkpoint, index material missing). `steps` has one row per
    `PROOF_STEPS` entry (step, checks, result: pass, FAIL, not checked or not reached; detail).
    `signature_checked` is whether a trusted key was tried on the note; `verdict` is the overall one.
    """

    event_id: str
    proof: dict[str, Any] | None
    verdict: Verdict
    steps: list[dict[str, Any]]
    signature_checked: bool

    @property
    def file_name(self) -> str:
        """`proof-<event_id>.json`, with anything but letters, digits, `.`, `_` and `-` replaced."""
        return f"proof-{_UNSAFE_FILE_CHARS.sub('_', self.event_id)}.json"

    @property
    def text(self) -> str:
        """The proof document as `callgate verify --out` writes it ("" without a proof)."""
        return "" if self.proof is None else json.dumps(self.proof, indent=2, ensure_ascii=False) + "\n"

    @property
    def offline_command(self) -> str:
        """The command that checks the downloaded proof with no store and no network."""
        return f"callgate verify --proof {self.file_name} --key <key.pub>"


def load_proof(query: Query, event_id: str, keys: Mapping[str, VerifyingKey] | None = None) -> ProofView:
    """The inclusion proof of `event_id` from the rows of `inclusion_material`, checked step by step;
    the signature with the key of the proof's key id when `keys` (by key id) holds it, a failed
    signature step when it does not, not checked without `keys`. Raises what the query raises."""
    rows = query(MATERIAL_QUERY, {"event_id": event_id})
    built = build_proof(rows, event_id)
    if isinstance(built, Verdict):
        return ProofView(event_id, None, built, [], signature_checked=False)
    try:
        doc = parse_proof(json.dumps(built), source=f"the proof of {event_id}")
    except UnreadableProofError as exc:
        return ProofView(event_id, None, fail("proof", str(exc)), [], signature_checked=False)
    return check_proof_steps(event_id, doc, keys)


def call_proofs(query: Query, detail: CallDetail) -> bytes:
    """The inclusion proofs of the call's own events as JSON lines: per event its proof document (as
    `callgate verify --out` writes it, on one line), or `{"event_id": ..., "no_proof": <why>}` for an
    event no stored checkpoint covers. Reads every tenant's chain of the producer (admin or auditor)."""
    lines = []
    for event in detail.events:
        if event["relation"] != "call" or not event.get("event_id"):
            continue
        view = load_proof(query, str(event["event_id"]))
        record = view.proof if view.proof is not None else {"event_id": view.event_id, "no_proof": view.verdict.line()}
        lines.append(json.dumps(record, ensure_ascii=False) + "\n")
    return "".join(lines).encode("utf-8")


def check_proof_steps(event_id: str, doc: Mapping[str, Any], keys: Mapping[str, VerifyingKey] | None) -> ProofView:
    """What `events.proofs.check_proof` says of the well-shaped proof document of `event_id` (with the
    key of its key id from `keys`, or none), with each `PROOF_STEPS` step's result."""
    inclusion = check_inclusion(doc)
    note = check_note(doc, None) if inclusion.ok else None
    signature: Verdict | None = None
    if note is not None and note.ok and keys is not None:
        key = keys.get(str(doc["key_id"]))
        signature = (
            check_note(doc, key)
            if key is not None
            else fail("key", f"key id {doc['key_id']} is not among the dashboard's trusted keys")
        )
    passed = {
        "event hash": f"{doc['event_hash']}",
        "leaf": f"leaf {doc['leaf_index']} (seq {doc['seq']}): {doc['leaf_hash']}",
        "inclusion": (
            f"{len(doc['audit_path'])} path hash(es) lead to root {doc['root']} at tree size {doc['tree_size']}"
        ),
        "checkpoint note": f"{note.detail if note else ''}, key id {doc['key_id']}",
        "signature": signature.detail if signature is not None else "",
    }
    failed = next((v for v in (inclusion, note, signature) if v is not None and not v.ok), None)
    failed_at = _STEP_OF.get(failed.step, "checkpoint note") if failed is not None else None
    steps: list[dict[str, Any]] = []
    reached = True
    for name, checks in PROOF_STEPS:
        if name == failed_at:
            result, detail, reached = "FAIL", failed.detail if failed else "", False
        elif not reached:
            result, detail = "not reached", ""
        elif name == "signature" and signature is None:
            result, detail = "not checked", "the dashboard has no trusted keys (callgate dashboard --trusted-keys)"
        else:
            result, detail = "pass", passed[name]
        steps.append({"step": name, "checks": checks, "result": result, "detail": detail})
    if failed is not None:
        verdict = failed
    elif signature is not None:
        verdict = Verdict(True, detail=f"{inclusion.detail}; {signature.detail}")
    else:
        verdict = Verdict(True, detail=f"{inclusion.detail}; {note.detail if note else ''}; signature not checked")
    return ProofView(event_id, dict(doc), verdict, steps, signature is not None)
