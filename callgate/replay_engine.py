"""Replay: a candidate policy (or Python interceptor) decides the stored history, and nothing runs.

`replay(source, candidate)` takes every stored call of a window (its outcome event: tool, scope
path, arguments as stored, run, the recorded decision trail), lets the candidate decide it in its
place, and returns a `ReplayReport`: what the candidate would break (newly denied or blocked),
what it would let through that was stopped (newly allowed), what would newly ask a human, each
broken down by rule, tool, tenant and principal with sample calls. `callgate replay` is the CI
command built on it (`callgate/replay.py`). It lives in `callgate/` because it wires two parts
that never import each other: the store (`consumers`) and the policies (`interceptor_core`).

Sources (`open_source`): `FileCalls` reads a store file directly, one slice of time at a time,
each sorted by (time, event_id) in DuckDB and handed over as Arrow columns; `ApiCalls` pages the
read API's `replay_calls` query by a (time, event_id) cursor. Both raise
`SourceUnavailableError` when they cannot read at all: the caller must never take "could not
look" for "nothing changed".

**In its place.** The recorded trail's enforced before-steps (shadow steps, `enforced: false`,
are not part of the chain) say how the call was decided:

- A step with the candidate's `name` (a new version of the policy that decided): the candidate
  replaces it. A call that ended before that step never reached it: unchanged, and the candidate
  is not even asked. A call that ended at that step takes the candidate's outcome; if the
  candidate lets it past, the interceptors after it never ran in the recording, so the call is
  counted as the candidate lets it (allowed, or approval if some step asks) and listed as
  `partial`. A call that ended after that step, or was not stopped at all, takes the candidate's
  decision if it ends the call (deny, block, substitute); else the recorded end if a later step
  ended it; else approval if the candidate or another step asks, else allowed.
- No such step: the candidate is the outermost application interceptor; it runs first, so its
  ending decision (if any) is the outcome, else approval if it asks and the chain let the call
  through, else the recorded outcome. When the scope's registered chain (`registered_tools`, the
  latest registration) names the candidate after the interceptor that stopped the call, the call
  never reached it: unchanged.

No tool runs; rewrites and substitutes are decided, never applied (a rewrite is counted, and the
interceptors after the candidate are not re-run on the new arguments). An interceptor that raises
counts as a denial (the gate fails closed by default), under rule "(error)".

**Outcomes and changes.** A recorded outcome is `allowed` (ToolUse; `approval` when a human was
asked), `denied` (ToolDenied deny or interceptor_error), `approval` (approval refused, or required
without a handler), `substituted` or `blocked` (Blocked block or interceptor_error). ToolDenied
for validation, unknown_tool or interrupted, and Blocked for audit_unavailable, never reached the
chain: `skipped`, counted by cause. Each checked call is one of `CHANGES`; `NEW_BLOCKS` are what
`max_new_blocks` limits, `NEW_ALLOWS` (newly allowed, and no longer asking a human) what
`fail_on_new_allows` fails on.

**Uncertain.** Stored arguments are redacted, and run metadata is not stored. A policy candidate
whose rules for the tool read a redacted argument (`Policy.reads`: `args.<field>` where a JSON
pointer of the event's `redacted_paths` starts with that field, or `args` whole), or read
`run.metadata`, or any argument when the stored ones are missing or cut, gives an `uncertain`
result, whether or not its outcome differs from the recorded one: a placeholder that does not
match may hide a real value that would have (the report says what each uncertain call would be).
A Python candidate sees the arguments through a mapping that notes every
read of a redacted key (or of anything, when the arguments were not stored whole).

**count_calls.** Calls are replayed in time order, every evaluated call recorded in one
`InProcessCounter` whose clock is the replayed time, and each decided at its own time (`at=`): the
counts approximate what the live policy saw. They miss calls before the window or outside the
filters, count the calls of every gate process in one counter (as a shared `RedisCounter`
would), and a policy placed outermost counts calls the live chain stopped before it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import inspect
import json
import math
import time as _time
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Literal, NamedTuple, Protocol, TypeAlias, assert_never

import duckdb
from pydantic_core import from_json

from consumers.lake import Lake, LakeError
from consumers.queries import MAX_LIMIT, QueryError, UnknownQueryError, run_query
from consumers.reader import ApiReader, SourceUnavailableError
from consumers.store import AuditStore, StoreError, StoreLockedError
from interceptor_core.builtins.counters import InProcessCounter
from interceptor_core.context import RunContext, ScopePath
from interceptor_core.decisions import (
    Allow,
    Block,
    Deny,
    PolicyDecision,
    RequireApproval,
    Rewrite,
    Substitute,
)
from interceptor_core.exceptions import ConfigurationError
from interceptor_core.interceptors import bind_interceptor
from interceptor_core.policy import Policy, load_policy

__all__ = [
    "CHANGES",
    "NEW_ALLOWS",
    "NEW_BLOCKS",
    "OUTCOMES",
    "ApiCalls",
    "CallSource",
    "Candidate",
    "CandidateInfo",
    "ChangeSummary",
    "FileCalls",
    "InterceptorCandidate",
    "PolicyCandidate",
    "ReplayReport",
    "ReplayedCall",
    "RuleSummary",
    "StoredCall",
    "Verdict",
    "Window",
    "candidate_from_object",
    "classify",
    "open_source",
    "recorded_outcome",
    "replay",
]

Outcome: TypeAlias = Literal["allowed", "approval", "denied", "blocked", "substituted"]
OUTCOMES: Final[tuple[Outcome, ...]] = ("allowed", "approval", "denied", "blocked", "substituted")
"""What a call ended with, recorded or replayed (the same words as an event's `shadow_outcome`)."""

Change: TypeAlias = Literal[
    "unchanged",
    "newly_denied",
    "newly_blocked",
    "newly_allowed",
    "newly_asking",
    "no_longer_asking",
    "block_to_deny",
    "changed_substitute",
    "uncertain",
]
CHANGES: Final[dict[Change, str]] = {
    "unchanged": "same outcome as recorded",
    "newly_denied": "denied now; was allowed, asked a human or substituted (traffic the candidate breaks)",
    "newly_blocked": "blocks the run now; was not blocked (traffic the candidate breaks)",
    "newly_allowed": "lets through (allowed, approval or substitute) what was denied or blocked",
    "newly_asking": "asks a human now; was allowed without one",
    "no_longer_asking": "allowed without a human now; a human was asked (and may have refused)",
    "block_to_deny": "denies the call now; the recording stopped the run",
    "changed_substitute": "substituted now where the tool ran, or the tool runs now where it was substituted",
    "uncertain": "the candidate read a redacted argument or unstored run metadata: neither a match nor a miss",
}
"""Every class a checked call falls in, in report order, with what it means."""

NEW_BLOCKS: Final[tuple[Change, ...]] = ("newly_denied", "newly_blocked")
"""The changes `--max-new-blocks` limits: calls the candidate would break."""
NEW_ALLOWS: Final[tuple[Change, ...]] = ("newly_allowed", "no_longer_asking")
"""The changes `--fail-on-new-allows` fails on: what was stopped, or needed a human, goes through."""

DEFAULT_RULE: Final = "(default)"
"""The rule name of a policy's default decision (no rule decided)."""
ERROR_RULE: Final = "(error)"
"""The rule name of a candidate that raised: the live gate fails such a call closed (a denial)."""
SAMPLES: Final = 10
"""Sample calls kept per change and per rule."""

_CALL_TYPES: Final = ("ToolUse", "ToolDenied", "Substitute", "Blocked")
_SKIPPED_CAUSES: Final = frozenset({"validation", "unknown_tool", "interrupted", "audit_unavailable"})
_ENDING_KINDS: Final = frozenset({"deny", "block", "substitute", "error"})
_ENDS: Final[dict[str, Outcome]] = {
    "deny": "denied",
    "block": "blocked",
    "substitute": "substituted",
    "error": "denied",
}
Effect: TypeAlias = Literal["allow", "rewrite", "deny", "block", "substitute", "require_approval", "error"]


# -- what is read -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Window:
    """Which stored calls to replay: outcome events in [since, until), optionally of one gate,
    workflow, agent scope, tool and tenant. None means no bound or no filter."""

    since: datetime | None = None
    until: datetime | None = None
    gate: str | None = None
    workflow: str | None = None
    agent: str | None = None
    tool: str | None = None
    tenant: str | None = None

    def params(self) -> dict[str, Any]:
        """The filters as named-query parameters (the unset ones left out)."""
        return {key: value for key, value in self.to_dict(iso=False).items() if value is not None}

    def to_dict(self, *, iso: bool = True) -> dict[str, Any]:
        """JSON-safe form (times as ISO 8601 text unless `iso` is False)."""
        since: Any = self.since.isoformat() if iso and self.since else self.since
        until: Any = self.until.isoformat() if iso and self.until else self.until
        return {
            "since": since,
            "until": until,
            "gate": self.gate,
            "workflow": self.workflow,
            "agent": self.agent,
            "tool": self.tool,
            "tenant": self.tenant,
        }


class StoredCall(NamedTuple):
    """One stored call as replay reads it: its outcome event, reduced to what deciding it needs.

    `steps` is the recorded chain: the enforced before-steps of the trail, each (interceptor,
    kind), in order. `asked` says the trail has the gate's approval step (a human was asked).
    `args` are the arguments as stored (redacted; None when redaction failed), `redacted_paths`
    the JSON pointers into them of what the redactor replaced. A named tuple: a replay builds
    one per stored call, and a tuple is built in a fifth of a frozen dataclass's time.
    """

    event_id: str
    time_s: float
    type: str
    cause: str | None
    decided_by: str | None
    gate: str
    workflow: str | None
    agent: str | None
    tool: str
    call_id: str
    run_id: str | None
    thread_id: str | None
    tenant: str | None
    principal: str | None
    args: dict[str, Any] | None
    redacted_paths: tuple[str, ...]
    steps: tuple[tuple[str, str], ...]
    asked: bool
    args_truncated: bool = False

    @property
    def time(self) -> datetime:
        """When the call was decided (UTC)."""
        return datetime.fromtimestamp(self.time_s, UTC)

    @property
    def args_unknown(self) -> bool:
        """The stored arguments are not the call's: redaction failed (None) or they were cut."""
        return self.args is None or self.args_truncated

    @property
    def redacted_fields(self) -> frozenset[str]:
        """The top-level argument names under which something was redacted ("" for the whole)."""
        return frozenset(_pointer_field(p) for p in self.redacted_paths)


def _pointer_field(pointer: str) -> str:
    """The first segment of a JSON pointer, unescaped (RFC 6901: ~1 is "/", ~0 is "~")."""
    if not pointer:
        return ""
    return pointer[1:].split("/", 1)[0].replace("~1", "/").replace("~0", "~")


def recorded_outcome(call: StoredCall) -> Outcome | None:
    """What the recording says the call ended with; None for a call that never reached the chain
    (invalid arguments, an unknown tool, interrupted, the audit unavailable): not replayable."""
    cause = call.cause
    if cause in _SKIPPED_CAUSES:
        return None
    match call.type:
        case "ToolUse":
            return "approval" if call.asked else "allowed"
        case "ToolDenied":
            return "approval" if cause == "approval_refused" else "denied"
        case "Substitute":
            return "substituted"
        case "Blocked":
            return "approval" if cause == "approval_required" else "blocked"
    return None


def _steps(decisions: Any) -> tuple[tuple[tuple[str, str], ...], bool]:
    """The enforced before-steps (interceptor, kind) of a trail, and whether a human was asked."""
    if isinstance(decisions, str | bytes):
        decisions = from_json(decisions) if decisions else None
    if not decisions:
        return (), False
    steps = []
    asked = False
    for step in decisions:
        phase = step.get("phase", "before")
        if phase == "before":
            if step.get("enforced") is not False:
                steps.append((step["interceptor"], step["kind"]))
        elif phase == "approval":
            asked = True
    return tuple(steps), asked


def _args(value: Any) -> dict[str, Any] | None:
    if isinstance(value, str | bytes):
        value = from_json(value) if value else None
    return value if isinstance(value, dict) else None


ChainKey: TypeAlias = tuple[str | None, str | None, str | None, str | None]
"""(gate, workflow, agent, tool): one scope's chain for one tool."""


class CallSource(Protocol):
    """Where the stored calls come from. Blocking; used from one thread."""

    window: Window
    """Which calls it reads."""

    @property
    def source(self) -> str:
        """The store's path or the read API's URL, for messages."""
        ...

    def total(self) -> int | None:
        """How many outcome events the window holds (for a progress bar); None when unknown."""
        ...

    def chains(self) -> dict[ChainKey, tuple[str, ...]]:
        """The latest registered interceptor chain of each scope and tool."""
        ...

    def calls(self) -> Iterator[list[StoredCall]]:
        """The window's outcome events in (time, event_id) order, in batches. Raises
        `SourceUnavailableError` when the store cannot be read."""
        ...

    def close(self) -> None:
        """Release the file (or nothing); idempotent."""
        ...


_FILE_WHERE = """
WHERE type IN ('ToolUse', 'ToolDenied', 'Substitute', 'Blocked')
  AND ($since::TIMESTAMPTZ IS NULL OR time >= $since::TIMESTAMPTZ)
  AND ($until::TIMESTAMPTZ IS NULL OR time < $until::TIMESTAMPTZ)
  AND ($gate::VARCHAR IS NULL OR gate = $gate::VARCHAR)
  AND ($workflow::VARCHAR IS NULL OR workflow = $workflow::VARCHAR)
  AND ($agent::VARCHAR IS NULL OR agent = $agent::VARCHAR)
  AND ($tool::VARCHAR IS NULL OR tool = $tool::VARCHAR)
  AND ($tenant::VARCHAR IS NULL OR tenant = $tenant::VARCHAR)
"""

# The JSON pieces are cut out by DuckDB, the event parsed once for all four (`parts`: args,
# redacted_paths, decisions, args_truncated as JSON texts); Python parses only those. A denial's or
# block's cause is its stored `outcome` column (the ingest copies it there). The columns of the
# read API's `replay_calls` query, with the time in microseconds.
# One slice of time at a time: sorting a whole week of these rows at once would not fit the store's
# memory limit, and a LIMIT-paged cursor re-extracts the JSON of every later row for each page.
_FILE_CALLS = f"""
SELECT event_id, epoch_us(time) AS time_us, type,
       CASE WHEN type IN ('ToolDenied', 'Blocked') THEN outcome END AS cause,
       decided_by, gate, workflow, agent, tool, call_id, run_id, thread_id, tenant, principal,
       json_extract(event, ['$.args', '$.redacted_paths', '$.decisions', '$.args_truncated']) AS parts
FROM events
{_FILE_WHERE}
  AND time >= $slice_start AND ($slice_end::TIMESTAMPTZ IS NULL OR time < $slice_end::TIMESTAMPTZ)
ORDER BY time, event_id
"""  # noqa: S608 (composed of module constants only; values are bound parameters)
# Where each slice starts: the time of every `$rows`-th call of the window, in time order (only the
# time column is sorted). Calls at one time never straddle two slices.
_FILE_SLICES = f"""
SELECT min(time) AS start
FROM (SELECT time, row_number() OVER (ORDER BY time) - 1 AS n FROM events {_FILE_WHERE})
GROUP BY n // $rows
ORDER BY start
"""  # noqa: S608 (composed of module constants only; values are bound parameters)
_FILE_COUNT = "SELECT count(*) FROM events" + _FILE_WHERE  # noqa: S608 (module constants; values are bound)


class FileCalls:
    """The stored calls of a store file, opened read-only at once (DuckDB's lock: while it is open
    no process can write the file; `close()` when done).

    Raises `SourceUnavailableError` when the file is missing, held by a writer (a running
    materializer: the message says to use the read API), or not an audit store this code reads.
    """

    def __init__(self, path: str | Path | Lake, window: Window = Window(), *, batch_rows: int = 20_000) -> None:
        self.path: Path | Lake = path if isinstance(path, Lake) else Path(path)
        self.window = window
        self.batch_rows = batch_rows
        if isinstance(self.path, Path) and not self.path.is_file():
            raise SourceUnavailableError(str(self.path), f"no audit store at {self.path}: the file does not exist")
        try:
            self._store: AuditStore | None = AuditStore(self.path, read_only=True)
        except StoreLockedError as exc:
            raise SourceUnavailableError(str(self.path), str(exc)) from exc
        except (StoreError, LakeError, duckdb.Error) as exc:
            raise SourceUnavailableError(str(self.path), f"cannot read {self.path} as an audit store: {exc}") from exc

    @property
    def source(self) -> str:
        return str(self.path)

    def _cursor(self) -> duckdb.DuckDBPyConnection:
        if self._store is None:
            raise SourceUnavailableError(str(self.path), f"{self.path} was closed")
        return self._store.cursor()

    def _params(self) -> dict[str, Any]:
        return self.window.to_dict(iso=False)

    def total(self) -> int | None:
        con = self._cursor()
        try:
            row = con.execute(_FILE_COUNT, self._params()).fetchone()
        finally:
            con.close()
        return int(row[0]) if row else 0

    def chains(self) -> dict[ChainKey, tuple[str, ...]]:
        con = self._cursor()
        try:
            return _chains(lambda params: run_query(con, "registered_tools", params).rows)
        finally:
            con.close()

    def calls(self) -> Iterator[list[StoredCall]]:
        con = self._cursor()
        # The next slice is queried on a thread of its own (with its own cursor: DuckDB connections
        # are not shared between threads) while this one is decided: DuckDB runs without the GIL.
        ahead = self._cursor()
        try:
            params = self._params()
            starts = [row[0] for row in con.execute(_FILE_SLICES, {**params, "rows": self.batch_rows}).fetchall()]
            ends = [*starts[1:], None] if starts else []
            slices = [
                {**params, "slice_start": start, "slice_end": end} for start, end in zip(starts, ends, strict=True)
            ]
            with ThreadPoolExecutor(1, thread_name_prefix="callgate-replay-read") as pool:
                pending = [pool.submit(_slice, ahead, slices[0])] if slices else []
                for index in range(len(slices)):
                    table = pending.pop().result()
                    if index + 1 < len(slices):
                        pending.append(pool.submit(_slice, ahead, slices[index + 1]))
                    # Columns turned into lists at once: a fetchone loop is many times slower.
                    columns = [column.to_pylist() for column in table.columns]
                    yield [_file_call(row) for row in zip(*columns, strict=True)]
                    del table, columns
        finally:
            con.close()
            ahead.close()

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None


def _slice(con: duckdb.DuckDBPyConnection, params: dict[str, Any]) -> Any:
    """One slice of the window's calls as an Arrow table."""
    relation = con.sql(_FILE_CALLS, params=params)
    if relation is None:  # only a statement that writes has no relation
        raise SourceUnavailableError("", "the replay query returned no rows")
    return relation.to_arrow_table()


def _file_call(row: tuple[Any, ...]) -> StoredCall:
    (event_id, time_us, type_, cause, decided_by, gate, workflow, agent, tool, call_id, run_id, thread_id, tenant,
     principal, (args, redacted, decisions, truncated)) = row  # fmt: skip
    steps, asked = _steps(decisions)
    return StoredCall(
        event_id, time_us / 1e6, type_, cause, decided_by, gate, workflow, agent, tool or "", call_id or "",
        run_id, thread_id, tenant, principal, _args(args), tuple(from_json(redacted)) if redacted else (), steps,
        asked, truncated == "true",
    )  # fmt: skip


class ApiCalls:
    """The stored calls through a read API's `replay_calls` query, paged by a (time, event_id)
    cursor, `page_rows` a page. Works while the materializer holds the file.

    A read API without `replay_calls` (a materializer older than this code) raises
    `SourceUnavailableError` saying so; so does one that cannot be reached.
    """

    def __init__(
        self, url: str, window: Window = Window(), *, page_rows: int = 10_000, token: str | None = None
    ) -> None:
        self.reader = ApiReader(url, token=token)
        self.window = window
        self.page_rows = page_rows

    @property
    def source(self) -> str:
        return self.reader.source

    def total(self) -> int | None:
        return None

    def chains(self) -> dict[ChainKey, tuple[str, ...]]:
        return _chains(lambda params: self.reader.query("registered_tools", params).rows)

    def calls(self) -> Iterator[list[StoredCall]]:
        params = self.window.params()
        limit = self.page_rows
        after: dict[str, Any] = {}
        while True:
            try:
                rows = self.reader.query("replay_calls", {**params, **after, "limit": limit}).rows
            except UnknownQueryError:
                raise SourceUnavailableError(
                    self.source,
                    f"the read API at {self.source} has no replay_calls query (its materializer runs an older "
                    "callgate): upgrade it, or replay a copy of the store file with --db",
                ) from None
            except QueryError as exc:
                if exc.param == "limit" and limit > MAX_LIMIT:
                    limit = MAX_LIMIT  # an API that pages in smaller steps
                    continue
                raise SourceUnavailableError(
                    self.source, f"the read API at {self.source} refused the replay_calls query: {exc}"
                ) from exc
            if rows:
                yield [_api_call(row) for row in rows]
                after = {"after_time": rows[-1]["time"], "after_event_id": rows[-1]["event_id"]}
            if len(rows) < limit:
                return

    def close(self) -> None:
        self.reader.close()


def _api_call(row: Mapping[str, Any]) -> StoredCall:
    steps, asked = _steps(row.get("decisions"))
    when = row["time"]
    moment = datetime.fromisoformat(when) if isinstance(when, str) else when
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return StoredCall(
        event_id=row["event_id"],
        time_s=moment.timestamp(),
        type=row["type"],
        cause=row.get("cause"),
        decided_by=row.get("decided_by"),
        gate=row["gate"],
        workflow=row.get("workflow"),
        agent=row.get("agent"),
        tool=row.get("tool") or "",
        call_id=row.get("call_id") or "",
        run_id=row.get("run_id"),
        thread_id=row.get("thread_id"),
        tenant=row.get("tenant"),
        principal=row.get("principal"),
        args=_args(row.get("args")),
        redacted_paths=tuple(row.get("redacted_paths") or ()),
        steps=steps,
        asked=asked,
        args_truncated=bool(row.get("args_truncated", False)),
    )


def _chains(query: Callable[[dict[str, Any]], list[dict[str, Any]]]) -> dict[ChainKey, tuple[str, ...]]:
    chains: dict[ChainKey, tuple[str, ...]] = {}
    offset = 0
    while True:
        rows = query({"limit": MAX_LIMIT, "offset": offset})
        for row in rows:
            interceptors = row.get("interceptors") or ()
            if isinstance(interceptors, str):
                interceptors = json.loads(interceptors)
            chains[(row["gate"], row["workflow"], row["agent"], row["tool"])] = tuple(interceptors)
        if len(rows) < MAX_LIMIT:
            return chains
        offset += len(rows)


def open_source(
    *, api: str | None = None, db: str | Path | Lake | None = None, window: Window = Window(), token: str | None = None
) -> CallSource:
    """The source for exactly one of `api` (a read API URL, read with the bearer `token` if given) or
    `db` (a store file). `ValueError` for both or neither (or a URL that is not http(s));
    `SourceUnavailableError` for a file that cannot be opened."""
    if api is not None and db is None:
        return ApiCalls(api, window, token=token)
    if db is not None and api is None:
        return FileCalls(db, window)
    raise ValueError("give exactly one of api (the read API's URL) or db (an audit store file)")


# -- the candidates -----------------------------------------------------------------------------


class Verdict(NamedTuple):
    """What a candidate decided for one call.

    `effect` is the decision's kind ("error" when the candidate raised or returned no decision),
    `rule` what decided (a policy's rule id, "(default)", the interceptor's name, or "(error)"),
    `unsure` that the decision read a value that is not stored (a redacted argument, run
    metadata), and `detail` the message, reason or error text.
    """

    effect: Effect
    rule: str
    unsure: bool = False
    detail: str | None = None


@dataclass(frozen=True, slots=True)
class CandidateInfo:
    """What is being tried: a policy file (`version` its SHA-256) or a Python interceptor."""

    kind: Literal["policy", "interceptor"]
    name: str
    version: str | None
    source: str
    rules: tuple[str, ...]
    """The names decisions are attributed to, in report order (a policy's rule ids and "(default)")."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form."""
        return {
            "kind": self.kind,
            "name": self.name,
            "version": self.version,
            "source": self.source,
            "rules": list(self.rules),
        }


class Candidate(Protocol):
    """A policy or interceptor to replay. `decide` is called once per call, in time order, from
    one thread; it never runs a tool."""

    @property
    def info(self) -> CandidateInfo:
        """Its name (what it replaces in a trail), version and rules."""
        ...

    def decide(self, call: StoredCall, run: RunContext, scope: ScopePath) -> Verdict:
        """Decide one stored call; never raises (a failure is an "error" verdict)."""
        ...

    def close(self) -> None:
        """Release what deciding held (an event loop); idempotent."""
        ...


class _ReplayClock:
    """The replayed time: the counter's clock, moved to each call's time before it is decided."""

    __slots__ = ("now",)

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass(frozen=True, slots=True)
class _Reads:
    fields: frozenset[str]
    whole_args: bool
    unstored: bool


class PolicyCandidate:
    """A policy file as a candidate: `Policy.evaluate` at each call's own time, with one counter
    for `count_calls` whose clock is the replayed time (see the module docstring). It is replayed
    as it would be enforced: rules with `mode: shadow` (and a file in shadow mode) decide as if
    they enforced, since a rule is replayed to learn what it will do once it does."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._clock = _ReplayClock()
        self.counter = InProcessCounter(clock=self._clock)
        self._reads: dict[str, _Reads] = {}
        rules = tuple(rule.id for rule in policy.rules)
        self.info = CandidateInfo("policy", policy.name, policy.version, policy.source, (*rules, DEFAULT_RULE))

    @classmethod
    def load(cls, path: str | Path) -> PolicyCandidate:
        """The policy file at `path`; raises `PolicyError` for one that fails its checks."""
        return cls(load_policy(path))

    def decide(self, call: StoredCall, run: RunContext, scope: ScopePath) -> Verdict:
        tool = call.tool
        self._clock.now = call.time_s
        try:
            result = self.policy.evaluate(
                tool, call.args or {}, run, scope, call_id=call.call_id, counter=self.counter, at=call.time_s
            )
        except Exception as exc:
            return Verdict("error", ERROR_RULE, self._unsure(call), f"{type(exc).__name__}: {exc}")
        # The candidate is replayed as it would be enforced: its `mode: shadow` rules too (the
        # rule being rolled out), so its decision is the one with the shadow rules enforced.
        decision, decided_by = result.decision, result.decided_by
        if result.shadow_decision is not None:
            decision, decided_by = result.shadow_decision, result.shadow_decided_by
        rule = decided_by or DEFAULT_RULE
        match decision:
            case Allow():
                return Verdict("rewrite" if result.rewritten is not None else "allow", rule, self._unsure(call))
            case Deny(message=text) | Block(reason=text) | RequireApproval(reason=text):
                return Verdict(decision.kind, rule, self._unsure(call), text)
            case Substitute():
                return Verdict("substitute", rule, self._unsure(call))
            case Rewrite():  # a policy never returns one (its rewrites come as arguments)
                return Verdict("rewrite", rule, self._unsure(call))
            case _:
                assert_never(decision)

    def _unsure(self, call: StoredCall) -> bool:
        reads = self._reads.get(call.tool)
        if reads is None:
            found = self.policy.reads(call.tool)
            reads = self._reads[call.tool] = _Reads(
                frozenset(r[5:] for r in found if r.startswith("args.")),
                "args" in found,
                "run.metadata" in found or "run" in found,
            )
        if reads.unstored:
            return True
        if not (reads.fields or reads.whole_args):
            return False
        if call.args_unknown:
            return True
        if not call.redacted_paths:
            return False
        redacted = call.redacted_fields
        return reads.whole_args or "" in redacted or not reads.fields.isdisjoint(redacted)

    def close(self) -> None:
        pass


class _Watch:
    __slots__ = ("unsure",)

    def __init__(self) -> None:
        self.unsure = False


class _RecordingArgs(Mapping[str, Any]):
    """The stored arguments as an interceptor reads them: reading a redacted key (or anything, when
    the arguments were not stored whole) marks the call uncertain. Keys and length are not values:
    reading them marks nothing, unless the arguments themselves are unknown."""

    __slots__ = ("_data", "_redacted", "_unknown", "_watch")

    def __init__(self, data: Mapping[str, Any], redacted: frozenset[str], unknown: bool, watch: _Watch) -> None:
        self._data = data
        self._redacted = redacted
        self._unknown = unknown
        self._watch = watch

    def __getitem__(self, key: str) -> Any:
        if self._unknown or key in self._redacted or "" in self._redacted:
            self._watch.unsure = True
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        if self._unknown:
            self._watch.unsure = True
        return iter(self._data)

    def __len__(self) -> int:
        if self._unknown:
            self._watch.unsure = True
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        if self._unknown:
            self._watch.unsure = True
        return key in self._data

    def __repr__(self) -> str:
        return f"ReplayedArgs({self._data!r})"


class ReplayedCall:
    """What a Python candidate's `before_tool_call` receives in a replay: the attributes of a
    `ToolCall` (`tool_name`, `args`, `args_model`, `tool`, `run`, `call_id`, `scope`, `scope_path`,
    `workflow`, `agent`), built from the stored call, not a `ToolCall` itself.

    `args` is a read-only mapping of the stored (redacted) arguments that notes reads of redacted
    keys; `args_model` validates them into the model of `tool` (a permissive `schema_tool` named
    after the stored tool, whose body never runs) on first use, and counts as reading every value.
    """

    __slots__ = ("_model", "_tools", "args", "call_id", "run", "scope")

    def __init__(
        self,
        call: StoredCall,
        run: RunContext,
        scope: ScopePath,
        tools: Callable[[str], Any],
        watch: _Watch,
    ) -> None:
        self.args: Mapping[str, Any] = _RecordingArgs(call.args or {}, call.redacted_fields, call.args_unknown, watch)
        self.run = run
        self.scope = scope
        self.call_id = call.call_id
        self._tools = tools
        self._model: Any = None

    @property
    def tool_name(self) -> str:
        """The called tool's name."""
        return self.scope.tool

    @property
    def tool(self) -> Any:
        """A stand-in `Tool` of that name accepting any JSON object (its body never runs)."""
        return self._tools(self.scope.tool)

    @property
    def args_model(self) -> Any:
        """The stored arguments as the stand-in tool's input model (reading it reads every value)."""
        if self._model is None:
            data = self.args
            values = {key: data[key] for key in data}  # marks the redacted ones as read
            self._model = self.tool.input_model.model_validate(values)
        return self._model

    @property
    def scope_path(self) -> ScopePath:
        """The same as `scope`: gate, workflow, agent, tool."""
        return self.scope

    @property
    def workflow(self) -> str | None:
        """The workflow scope's name, if the call came through one."""
        return self.scope.workflow

    @property
    def agent(self) -> str | None:
        """The agent scope's name, if the call came through one."""
        return self.scope.agent

    def __repr__(self) -> str:
        return f"ReplayedCall(tool={self.scope.tool!r}, call_id={self.call_id!r}, scope='{self.scope}')"


async def _never_runs(args: dict[str, Any], ctx: Any) -> Any:
    raise RuntimeError("no tool runs in a replay")


class InterceptorCandidate:
    """A Python interceptor as a candidate: its `before_tool_call` on a `ReplayedCall` per stored
    call (awaited on one event loop of its own when it is async). It runs as written: its clock and
    its state (a `RateLimit`'s counter) see the replay happen now, not at the recorded times."""

    def __init__(self, interceptor: object, *, source: str = "") -> None:
        bound = bind_interceptor(interceptor, "application")
        if bound.before is None:
            raise ConfigurationError(
                f"interceptor {bound.name!r} has no before_tool_call: it decides nothing a replay could compare",
                interceptor=bound.name,
            )
        self.interceptor = interceptor
        self._before = bound.before
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tools: dict[str, Any] = {}
        self.info = CandidateInfo("interceptor", bound.name, None, source or type(interceptor).__qualname__,
                                  (bound.name,))  # fmt: skip

    def _tool(self, name: str) -> Any:
        made = self._tools.get(name)
        if made is None:
            from interceptor_core.integrations._schema import schema_tool

            made = self._tools[name] = schema_tool(name or "tool", "", {"type": "object"}, _never_runs)
        return made

    def decide(self, call: StoredCall, run: RunContext, scope: ScopePath) -> Verdict:
        watch = _Watch()
        name = self.info.name
        try:
            result = self._before(ReplayedCall(call, run, scope, self._tool, watch))
            if inspect.isawaitable(result):
                if self._loop is None:
                    self._loop = asyncio.new_event_loop()
                result = self._loop.run_until_complete(_awaited(result))
        except Exception as exc:
            return Verdict("error", ERROR_RULE, watch.unsure, f"{type(exc).__name__}: {exc}")
        rule = name
        rewritten = False
        if type(result) is PolicyDecision:
            rule = result.decided_by or name
            rewritten = result.args is not None
            result = result.decision
        match result:
            case None | Allow():
                return Verdict("rewrite" if rewritten else "allow", rule, watch.unsure)
            case Rewrite():
                return Verdict("rewrite", rule, watch.unsure)
            case Deny(message=text) | Block(reason=text) | RequireApproval(reason=text):
                return Verdict(result.kind, rule, watch.unsure, text)
            case Substitute():
                return Verdict("substitute", rule, watch.unsure)
        return Verdict("error", ERROR_RULE, watch.unsure, f"returned {type(result).__name__}, not a decision")

    def close(self) -> None:
        loop, self._loop = self._loop, None
        if loop is not None:
            loop.close()


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def candidate_from_object(obj: object, *, source: str = "") -> PolicyCandidate | InterceptorCandidate:
    """The candidate for an imported object: a `Policy`, an interceptor, or a class or function
    that returns one when called with no arguments. Raises `ConfigurationError` for anything else."""
    if isinstance(obj, Policy):
        return PolicyCandidate(obj)
    is_interceptor = hasattr(obj, "before_tool_call") or hasattr(obj, "after_tool_call")
    if isinstance(obj, type) or (callable(obj) and not is_interceptor):
        try:
            obj = obj()
        except Exception as exc:
            raise ConfigurationError(
                f"building the interceptor (calling it with no arguments) failed: {type(exc).__name__}: {exc}"
            ) from exc
        if isinstance(obj, Policy):
            return PolicyCandidate(obj)
    return InterceptorCandidate(obj, source=source)


# -- judging one call ---------------------------------------------------------------------------


def classify(recorded: Outcome, new: Outcome) -> Change:
    """The change from the recorded outcome to the candidate's (never "uncertain": that is decided
    on top, from what the candidate read)."""
    if new == recorded:
        return "unchanged"
    if new == "blocked":
        return "newly_blocked"
    if new == "denied":
        return "block_to_deny" if recorded == "blocked" else "newly_denied"
    if recorded in ("denied", "blocked"):
        return "newly_allowed"
    if new == "approval" and recorded == "allowed":
        return "newly_asking"
    if new == "allowed" and recorded == "approval":
        return "no_longer_asking"
    return "changed_substitute"


Placement: TypeAlias = Literal["replaced", "outermost", "not_reached"]


class _Judgement(NamedTuple):
    recorded: Outcome
    new: Outcome
    change: Change
    placement: Placement
    verdict: Verdict | None
    partial: bool = False
    would_be: Change | None = None


def _ended_at(call: StoredCall, recorded: Outcome) -> int | None:
    """The index of the recorded step that ended the call; None when the chain let it through."""
    if recorded in ("allowed", "approval"):
        return None
    steps = call.steps
    fallback = None
    for index in range(len(steps) - 1, -1, -1):
        name, kind = steps[index]
        if kind in _ENDING_KINDS:
            if name == call.decided_by:
                return index
            if fallback is None:
                fallback = index
    return fallback


def _judge(
    call: StoredCall,
    recorded: Outcome,
    candidate: Candidate,
    name: str,
    chains: Mapping[ChainKey, tuple[str, ...]],
    run: RunContext,
    scope: ScopePath,
) -> _Judgement:
    steps = call.steps
    position = next((i for i, (step, _) in enumerate(steps) if step == name), None)
    ended = _ended_at(call, recorded)
    chain = chains.get((call.gate, call.workflow, call.agent, call.tool)) if ended is not None else None
    if position is None:
        if ended is not None:
            ender = steps[ended][0]
            if chain and name in chain and ender in chain and chain.index(ender) < chain.index(name):
                return _Judgement(recorded, recorded, "unchanged", "not_reached", None)
        placement: Placement = "outermost"
    elif ended is not None and ended < position:
        return _Judgement(recorded, recorded, "unchanged", "not_reached", None)
    else:
        placement = "replaced"
    verdict = candidate.decide(call, run, scope)
    end = _ENDS.get(verdict.effect)
    asks = verdict.effect == "require_approval"
    partial = False
    new: Outcome
    if end is not None:
        new = end
    elif position is None:
        new = "approval" if asks and recorded in ("allowed", "approval") else recorded
    elif ended == position:
        # The recording stopped here; the candidate lets the call past, into steps that never ran
        # (unless the registered chain ends with the candidate).
        partial = not (chain and chain[-1] == name)
        others_ask = any(kind == "require_approval" for _, kind in steps[:position])
        new = "approval" if asks or others_ask else "allowed"
    elif ended is not None:
        new = recorded  # a later step still ends the call
    else:
        askers = [i for i, (_, kind) in enumerate(steps) if kind == "require_approval"]
        if asks or any(i != position for i in askers) or (recorded == "approval" and not askers):
            new = "approval"
        else:
            new = "allowed"
    change = classify(recorded, new)
    # A decision that read a value the store does not hold is neither a match nor a miss: the same
    # outcome may only mean the placeholder did not match where the real value would have.
    if verdict.unsure:
        return _Judgement(recorded, new, "uncertain", placement, verdict, partial, change)
    return _Judgement(recorded, new, change, placement, verdict, partial)


# -- the report ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChangeSummary:
    """One class of change: how many calls, by rule, tool, tenant and principal (each count, most
    first), and up to `SAMPLES` sample calls."""

    name: Change
    title: str
    count: int
    by_rule: dict[str, int]
    by_tool: dict[str, int]
    by_tenant: dict[str, int]
    by_principal: dict[str, int]
    samples: tuple[dict[str, Any], ...]

    @property
    def sample_call_ids(self) -> list[str]:
        """The samples' call ids."""
        return [sample["call_id"] for sample in self.samples]

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form."""
        return {
            "name": self.name,
            "title": self.title,
            "count": self.count,
            "by_rule": self.by_rule,
            "by_tool": self.by_tool,
            "by_tenant": self.by_tenant,
            "by_principal": self.by_principal,
            "sample_call_ids": self.sample_call_ids,
            "samples": list(self.samples),
        }


@dataclass(frozen=True, slots=True)
class RuleSummary:
    """One rule of the candidate (or "(default)", "(error)", an interceptor's name): how many calls
    it decided, how many of each change it caused, and up to `SAMPLES` changed calls."""

    rule: str
    decided: int
    changes: dict[str, int]
    samples: tuple[dict[str, Any], ...]

    def count(self, change: Change) -> int:
        """How many calls of this change the rule decided."""
        return self.changes.get(change, 0)

    @property
    def new_blocks(self) -> int:
        """Newly denied plus newly blocked."""
        return sum(self.count(c) for c in NEW_BLOCKS)

    @property
    def new_allows(self) -> int:
        """Newly allowed plus no longer asking."""
        return sum(self.count(c) for c in NEW_ALLOWS)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form."""
        return {
            "rule": self.rule,
            "decided": self.decided,
            "changes": self.changes,
            "new_blocks": self.new_blocks,
            "new_allows": self.new_allows,
            "sample_call_ids": [s["call_id"] for s in self.samples],
        }


@dataclass(frozen=True, slots=True)
class ReplayReport:
    """What the candidate would have done to the stored calls of the window.

    `read` outcome events were read; `skipped` of them (by cause) never reached the chain; the
    other `checked` ones each fall in one of `CHANGES` (`changes`, every class listed, zero or
    not). `placement` says how often the candidate replaced its recorded namesake, ran outermost,
    or was never reached; `partial` calls ended at the replaced step and the candidate lets them
    past it (the rest of the chain was not replayed); `rewritten` calls the candidate rewrote.
    """

    source: str
    checked_at: datetime
    window: Window
    candidate: CandidateInfo
    read: int
    checked: int
    skipped: dict[str, int]
    changes: dict[Change, ChangeSummary]
    rules: tuple[RuleSummary, ...]
    placement: dict[str, int]
    partial: int
    rewritten: int
    uncertain_would_be: dict[str, int]
    max_new_blocks: float
    fail_on_new_allows: bool
    seconds: float
    counts_calls: bool = False
    notes: tuple[str, ...] = ()

    def count(self, change: Change) -> int:
        """How many checked calls fell in `change`."""
        return self.changes[change].count

    @property
    def unchanged(self) -> int:
        """Checked calls with the recorded outcome."""
        return self.count("unchanged")

    @property
    def new_blocks(self) -> int:
        """Newly denied plus newly blocked: the traffic the candidate would break."""
        return sum(self.count(c) for c in NEW_BLOCKS)

    @property
    def new_allows(self) -> int:
        """Newly allowed plus no longer asking a human: what the candidate would loosen."""
        return sum(self.count(c) for c in NEW_ALLOWS)

    @property
    def new_block_share(self) -> float:
        """`new_blocks` as a share of the checked calls (0 when none was checked)."""
        return self.new_blocks / self.checked if self.checked else 0.0

    @property
    def allowed_new_blocks(self) -> int:
        """The most new blocks `max_new_blocks` lets pass over this many checked calls."""
        return allowed_count(self.max_new_blocks, self.checked)

    @property
    def ok(self) -> bool:
        """Something was checked, new blocks are within the limit and, with `fail_on_new_allows`,
        nothing is newly let through."""
        return self.exit_code == 0

    @property
    def exit_code(self) -> int:
        """0 within the limits, 1 past them, 2 when nothing could be checked (an empty window)."""
        if self.checked == 0:
            return 2
        if self.new_blocks > self.allowed_new_blocks:
            return 1
        if self.fail_on_new_allows and self.new_allows:
            return 1
        return 0

    def rule_fails(self, rule: RuleSummary) -> str | None:
        """Why `rule` fails the replay (its JUnit case), or None when it passes."""
        reasons = []
        if rule.new_blocks > self.allowed_new_blocks:
            reasons.append(
                f"{rule.new_blocks} new denial(s)/block(s), more than --max-new-blocks allows "
                f"({self.allowed_new_blocks} of {self.checked} calls)"
            )
        if self.fail_on_new_allows and rule.new_allows:
            reasons.append(f"{rule.new_allows} call(s) newly let through")
        return "; ".join(reasons) or None

    def summary(self) -> str:
        """The verdict in one line."""
        if self.checked == 0:
            return f"nothing to replay: no stored call in the window ({self.read:,} read, all skipped or none)"
        parts = [
            f"{self.checked:,} calls checked",
            f"{self.unchanged:,} unchanged",
            f"{self.new_blocks:,} newly denied or blocked ({self.new_block_share:.2%}, at most "
            f"{self.allowed_new_blocks:,} allowed)",
            f"{self.count('newly_allowed'):,} newly allowed",
            f"{self.count('newly_asking'):,} newly asking",
        ]
        if self.count("no_longer_asking"):
            parts.append(f"{self.count('no_longer_asking'):,} no longer asking")
        uncertain = self.count("uncertain")
        if uncertain:
            breaking = sum(self.uncertain_would_be.get(c, 0) for c in NEW_BLOCKS)
            parts.append(
                f"{uncertain:,} uncertain ({breaking:,} of them would be newly denied or blocked; not counted "
                "against the limit)"
            )
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """The whole report as JSON-safe data (`--json`)."""
        return {
            "ok": self.ok,
            "exit_code": self.exit_code,
            "summary": self.summary(),
            "source": self.source,
            "checked_at": self.checked_at.isoformat(),
            "window": self.window.to_dict(),
            "candidate": self.candidate.to_dict(),
            "read": self.read,
            "checked": self.checked,
            "unchanged": self.unchanged,
            "skipped": {"total": sum(self.skipped.values()), "by_cause": self.skipped},
            "new_blocks": self.new_blocks,
            "new_block_share": self.new_block_share,
            "new_allows": self.new_allows,
            "limits": {
                "max_new_blocks": self.max_new_blocks,
                "allowed_new_blocks": self.allowed_new_blocks,
                "fail_on_new_allows": self.fail_on_new_allows,
            },
            "changes": {name: summary.to_dict() for name, summary in self.changes.items()},
            "uncertain_would_be": self.uncertain_would_be,
            "rules": [rule.to_dict() for rule in self.rules],
            "placement": self.placement,
            "partial": self.partial,
            "rewritten": self.rewritten,
            "counts_calls": self.counts_calls,
            "seconds": self.seconds,
            "calls_per_second": self.checked / self.seconds if self.seconds > 0 else None,
            "notes": list(self.notes),
        }

    def to_json(self) -> str:
        """`to_dict` as indented JSON text."""
        return json.dumps(self.to_dict(), indent=2)

    def to_junit(self) -> str:
        """JUnit XML: one test case per rule (failing when the rule alone breaks more than
        `--max-new-blocks` allows, or newly lets calls through under `--fail-on-new-allows`), and one
        case for the whole replay, which fails exactly when the exit code is not 0."""
        name = f"callgate replay {self.candidate.name}"
        classname = f"callgate.replay.{self.candidate.name}"
        verdicts = [(rule, self.rule_fails(rule)) for rule in self.rules]
        failures = sum(1 for _, why in verdicts if why) + (self.exit_code == 1)
        suite = ET.Element(
            "testsuite",
            {
                "name": name,
                "tests": str(len(verdicts) + 1),
                "failures": str(failures),
                "errors": str(int(self.exit_code == 2)),
                "skipped": "0",
                "timestamp": self.checked_at.isoformat(),
                "time": f"{self.seconds:.3f}",
            },
        )
        properties = ET.SubElement(suite, "properties")
        facts = {
            "source": self.source,
            "candidate": self.candidate.source,
            "version": self.candidate.version or "",
            "checked": self.checked,
            "unchanged": self.unchanged,
            "skipped": sum(self.skipped.values()),
            **{key: value for key, value in self.window.to_dict().items() if value is not None},
        }
        for key, value in facts.items():
            ET.SubElement(properties, "property", {"name": key, "value": str(value)})
        for rule, why in verdicts:
            case = ET.SubElement(suite, "testcase", {"classname": classname, "name": rule.rule})
            if why:
                failure = ET.SubElement(case, "failure", {"message": why})
                failure.text = _rule_text(rule)
            out = ET.SubElement(case, "system-out")
            out.text = _rule_text(rule)
        whole = ET.SubElement(suite, "testcase", {"classname": classname, "name": "(all rules)"})
        if self.exit_code == 2:
            ET.SubElement(whole, "error", {"message": self.summary()})
        elif self.exit_code == 1:
            ET.SubElement(whole, "failure", {"message": self.summary()})
        ET.SubElement(whole, "system-out").text = "\n".join((self.summary(), *self.notes))
        root = ET.Element("testsuites")
        root.append(suite)
        ET.indent(root)
        return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def allowed_count(share: float, checked: int) -> int:
    """How many of `checked` calls a share in [0, 1] allows (rounded down; 0.01 of 250 is 2)."""
    return math.floor(share * checked + 1e-9)


def _rule_text(rule: RuleSummary) -> str:
    counts = ", ".join(f"{name} {count}" for name, count in rule.changes.items()) or "no change"
    lines = [f"decided {rule.decided} call(s): {counts}"]
    lines.extend(
        f"  {s['change']}: call {s['call_id']} ({s['tool']}, tenant {s['tenant']}): {s['recorded']} -> {s['new']}"
        for s in rule.samples
    )
    return "\n".join(lines)


class _Tally:
    """The report being built, one judged call at a time."""

    def __init__(self, samples: int) -> None:
        self.samples = samples
        self.read = 0
        self.checked = 0
        self.skipped: Counter[str] = Counter()
        self.placement: Counter[str] = Counter()
        self.partial = 0
        self.rewritten = 0
        self.count: Counter[Change] = Counter()
        self.by: dict[Change, tuple[Counter[str], Counter[str], Counter[str], Counter[str]]] = {}
        self.change_samples: dict[Change, list[dict[str, Any]]] = {}
        self.decided: Counter[str] = Counter()
        self.rule_changes: dict[str, Counter[str]] = {}
        self.rule_samples: dict[str, list[dict[str, Any]]] = {}
        self.would_be: Counter[str] = Counter()

    def add(self, call: StoredCall, judged: _Judgement) -> None:
        self.checked += 1
        change = judged.change
        self.count[change] += 1
        self.placement[judged.placement] += 1
        verdict = judged.verdict
        if verdict is None:
            return
        rule = verdict.rule
        self.decided[rule] += 1
        if verdict.effect == "rewrite":
            self.rewritten += 1
        if change == "unchanged":
            return
        if judged.partial:
            self.partial += 1
        if judged.would_be is not None:
            self.would_be[judged.would_be] += 1
        by = self.by.get(change)
        if by is None:
            by = self.by[change] = (Counter(), Counter(), Counter(), Counter())
        by[0][rule] += 1
        by[1][call.tool] += 1
        by[2][call.tenant or "(none)"] += 1
        by[3][call.principal or "(none)"] += 1
        changes = self.rule_changes.get(rule)
        if changes is None:
            changes = self.rule_changes[rule] = Counter()
        changes[change] += 1
        kept = self.change_samples.setdefault(change, [])
        kept_for_rule = self.rule_samples.setdefault(rule, [])
        if len(kept) < self.samples or len(kept_for_rule) < self.samples:
            sample = _sample(call, judged)
            if len(kept) < self.samples:
                kept.append(sample)
            if len(kept_for_rule) < self.samples:
                kept_for_rule.append(sample)

    def report(
        self,
        source: CallSource,
        window: Window,
        candidate: CandidateInfo,
        *,
        max_new_blocks: float,
        fail_on_new_allows: bool,
        seconds: float,
        counts_calls: bool,
    ) -> ReplayReport:
        changes: dict[Change, ChangeSummary] = {}
        for name, title in CHANGES.items():
            by = self.by.get(name, (Counter(), Counter(), Counter(), Counter()))
            by_rule, by_tool, by_tenant, by_principal = (dict(c.most_common()) for c in by)
            changes[name] = ChangeSummary(
                name, title, self.count[name], by_rule, by_tool, by_tenant, by_principal,
                tuple(self.change_samples.get(name, ())),
            )  # fmt: skip
        names = list(candidate.rules)
        names += sorted(set(self.decided) - set(names))
        rules = tuple(
            RuleSummary(
                rule,
                self.decided[rule],
                {c: n for c, n in sorted(self.rule_changes.get(rule, Counter()).items(), key=_change_order)},
                tuple(self.rule_samples.get(rule, ())),
            )
            for rule in names
        )
        report = ReplayReport(
            source=source.source,
            checked_at=datetime.now(UTC),
            window=window,
            candidate=candidate,
            read=self.read,
            checked=self.checked,
            skipped=dict(sorted(self.skipped.items())),
            changes=changes,
            rules=rules,
            placement={key: self.placement[key] for key in ("replaced", "outermost", "not_reached")},
            partial=self.partial,
            rewritten=self.rewritten,
            uncertain_would_be=dict(sorted(self.would_be.items(), key=_change_order)),
            max_new_blocks=max_new_blocks,
            fail_on_new_allows=fail_on_new_allows,
            seconds=seconds,
            counts_calls=counts_calls,
        )
        return _with_notes(report)


_ORDER: dict[str, int] = {name: index for index, name in enumerate(CHANGES)}


def _change_order(item: tuple[str, int]) -> int:
    return _ORDER.get(item[0], len(_ORDER))


def _sample(call: StoredCall, judged: _Judgement) -> dict[str, Any]:
    verdict = judged.verdict
    return {
        "call_id": call.call_id,
        "event_id": call.event_id,
        "time": call.time.isoformat(),
        "gate": call.gate,
        "workflow": call.workflow,
        "agent": call.agent,
        "tool": call.tool,
        "tenant": call.tenant,
        "principal": call.principal,
        "change": judged.change,
        "would_be": judged.would_be,
        "recorded": judged.recorded,
        "recorded_by": call.decided_by,
        "new": judged.new,
        "rule": verdict.rule if verdict else None,
        "detail": verdict.detail if verdict else None,
        "placement": judged.placement,
        "partial": judged.partial,
    }


def _with_notes(report: ReplayReport) -> ReplayReport:
    name = report.candidate.name
    notes = []
    skipped = sum(report.skipped.values())
    if skipped:
        causes = ", ".join(f"{cause} {count:,}" for cause, count in report.skipped.items())
        notes.append(f"{skipped:,} call(s) never reached the chain and were not replayed ({causes}).")
    placed = report.placement
    notes.append(
        f"{name} replaced the step of the same name in {placed['replaced']:,} call(s), ran outermost in "
        f"{placed['outermost']:,}, and was never reached in {placed['not_reached']:,} (the call ended before it)."
    )
    if report.partial:
        notes.append(
            f"{report.partial:,} changed call(s) ended at {name} in the recording and the candidate lets them past "
            "it: the interceptors after it never ran then, so the rest of the chain was not replayed."
        )
    if report.rewritten:
        notes.append(
            f"{report.rewritten:,} call(s) rewritten by the candidate: evaluated, not applied; the interceptors "
            "after it were not re-run on the new arguments."
        )
    if report.count("uncertain"):
        notes.append(
            f"{report.count('uncertain'):,} call(s) were decided on a redacted argument or run metadata (not "
            "stored): counted as uncertain, neither a match nor a miss."
        )
    if report.counts_calls:
        notes.append(
            "count_calls was answered from the replayed calls alone, in time order: calls before the window or "
            "outside the filters are not counted, and every gate shares one counter."
        )
    if report.candidate.kind == "interceptor":
        notes.append(
            "A Python interceptor runs as written: its own clock and state see the replay now, not the recorded times."
        )
    return dataclasses.replace(report, notes=tuple(notes))


# -- the replay ---------------------------------------------------------------------------------


def replay(
    source: CallSource,
    candidate: Candidate,
    *,
    max_new_blocks: float = 0.0,
    fail_on_new_allows: bool = False,
    on_progress: Callable[[int], None] | None = None,
    samples: int = SAMPLES,
) -> ReplayReport:
    """Replay every stored call of `source` with `candidate` in its place (see the module
    docstring) and report what changes. Blocks for the whole read; no tool runs.

    `max_new_blocks` is the share of checked calls (0..1) that may be newly denied or blocked for
    exit code 0; `on_progress(n)` is told after each batch of `n` calls. Raises `ValueError` for a
    share outside [0, 1] and `SourceUnavailableError` when the store cannot be read. Freezes the
    garbage collector's view of the objects that exist when it starts (`gc.freeze`) until it returns.
    """
    if not 0.0 <= max_new_blocks <= 1.0:
        raise ValueError(f"max_new_blocks is a share of the checked calls in [0, 1], got {max_new_blocks!r}")
    started = _time.perf_counter()
    chains = source.chains()
    info = candidate.info
    name = info.name
    tally = _Tally(samples)
    scopes: dict[tuple[str, str | None, str | None, str], ScopePath] = {}
    last_run: tuple[Any, ...] = ()
    run = RunContext()
    # A replay allocates millions of small objects, and each full collection would traverse every
    # object the process already holds (modules, compiled policies) again: those are frozen for the
    # replay's duration (unless the process froze objects itself); about a sixth of the time.
    freeze = gc.get_freeze_count() == 0
    if freeze:
        gc.freeze()
    try:
        for batch in source.calls():
            tally.read += len(batch)
            for call in batch:
                recorded = recorded_outcome(call)
                if recorded is None:
                    tally.skipped[call.cause or call.type] += 1
                    continue
                key = (call.tenant, call.principal, call.run_id, call.thread_id)
                if key != last_run:
                    # Calls of one run come together; the policy caches a run's values by identity.
                    run = RunContext(tenant=call.tenant, principal=call.principal, run_id=call.run_id or "",
                                     thread_id=call.thread_id)  # fmt: skip
                    last_run = key
                where = (call.gate, call.workflow, call.agent, call.tool)
                scope = scopes.get(where)
                if scope is None:
                    scope = scopes[where] = ScopePath(*where)
                tally.add(call, _judge(call, recorded, candidate, name, chains, run, scope))
            if on_progress is not None:
                on_progress(len(batch))
    finally:
        if freeze:
            gc.unfreeze()
    counts = isinstance(candidate, PolicyCandidate) and any(
        "count_calls" in text
        for rule in candidate.policy.rules
        for text in (rule.when or "", rule.result or "", *rule.set.values())
    )
    return tally.report(
        source,
        source.window,
        info,
        max_new_blocks=max_new_blocks,
        fail_on_new_allows=fail_on_new_allows,
        seconds=_time.perf_counter() - started,
        counts_calls=counts,
    )
