"""The named queries: the only SQL a reader of the audit store ever runs.

Each `NamedQuery` is fixed SQL with `$name` parameters and a spec of those parameters (type,
default, bounds, allowed values). `run_query` checks the parameters a caller gives against the spec
(unknown names and bad values raise `QueryError` naming them), binds them as DuckDB parameters
(never pasted into the SQL) and returns JSON-safe rows. Row-returning queries page with `limit`
(1..1000) and `offset`, except `replay_calls`, an export paged by a cursor (up to 10,000 rows).
The dashboard, the coverage job and the read API all go through `QUERIES`.

Every query also takes `as_of` (time travel: the store as it was at a time, or at a lake snapshot's
id; a lake only, a DuckDB file keeps no snapshots) and `include_archive` (the file's archive).

Every query answers in well under a second over a million stored events (`bench/queries.py`).
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any, Final, Literal
from uuid import UUID

import duckdb

from consumers.archive import ARCHIVE_PARAM, with_archive
from consumers.lake import LakeError, at_snapshot
from events.models import EVENT_TYPES, OUTCOME_TYPES

__all__ = [
    "AS_OF_PARAM",
    "MAX_LIMIT",
    "MAX_REPLAY_LIMIT",
    "QUERIES",
    "QUERY_SCOPES",
    "NamedQuery",
    "Param",
    "ParamValue",
    "QueryError",
    "QueryResult",
    "QueryScope",
    "UnknownQueryError",
    "describe_queries",
    "run_query",
]

MAX_LIMIT: Final = 1000
"""The most rows one call returns; page with `offset` for more."""

MAX_REPLAY_LIMIT: Final = 10_000
"""The most rows one page of `replay_calls` returns (it pages by a cursor, for large exports)."""

ParamType = Literal["str", "int", "datetime", "bool", "ids", "snapshot"]
"""`ids`: a JSON list of texts (["r-1", "r-2"]), passed to the SQL as that JSON text. `snapshot`: a
lake snapshot's id (an integer) or an ISO 8601 date-time (UTC if no zone), not after now."""
ParamValue = str | int | bool | datetime | None
"""What a caller may pass for a parameter: the typed value, or its text (as in a URL query)."""


class QueryError(ValueError):
    """A query name or parameter a caller got wrong: an unknown query, unknown parameters, a missing
    required one, or a value of the wrong type, out of bounds or not among the allowed values.
    `query` and `param` name the culprits (param is None when the query name itself is wrong)."""

    def __init__(self, message: str, *, query: str, param: str | None = None) -> None:
        super().__init__(message)
        self.query = query
        self.param = param


class UnknownQueryError(QueryError, KeyError):
    """The query name is not in `QUERIES` (a `KeyError` too, so a lookup-minded caller can answer
    404 and keep 400 for the other `QueryError`s)."""

    def __str__(self) -> str:
        # KeyError would quote the message like a key.
        return str(self.args[0])


@dataclass(frozen=True, slots=True)
class Param:
    """One parameter of a named query: its type, default (None: no filter), and bounds."""

    type: ParamType
    description: str
    default: str | int | bool | None = None
    required: bool = False
    choices: tuple[str, ...] = ()
    minimum: int | None = None
    maximum: int | None = None
    requires: str | None = None
    """Another parameter that must be given whenever this one is (a cursor's second half)."""

    def describe(self, name: str) -> dict[str, Any]:
        """The spec of parameter `name` as JSON-safe data (for the read API's listing)."""
        spec: dict[str, Any] = {
            "name": name,
            "type": self.type,
            "description": self.description,
            "default": self.default,
            "required": self.required,
        }
        if self.choices:
            spec["choices"] = list(self.choices)
        if self.minimum is not None:
            spec["minimum"] = self.minimum
        if self.maximum is not None:
            spec["maximum"] = self.maximum
        if self.requires is not None:
            spec["requires"] = self.requires
        return spec


QueryScope = Literal["tenant", "global", "admin"]
"""Who may run a query, and how the read API keeps a tenant to its own rows (`consumers.auth.scope_params`):

- "tenant": the query has a `tenant` parameter that filters every row it reads; a token limited to
  tenants gets it bound to its tenant (a caller-given other tenant is refused).
- "global": the query reads what belongs to no tenant or to all of them (chains, dead letters, the
  pipeline, registrations, coverage): `admin` and `auditor` only.
- "admin": `admin` only (the access log).
"""

QUERY_SCOPES: Final[tuple[QueryScope, ...]] = ("tenant", "global", "admin")


@dataclass(frozen=True, slots=True)
class NamedQuery:
    """A query readers may run: fixed SQL whose `$name` parameters are exactly `params`.

    `scope` has no default on purpose: a query cannot be added without saying who may read it
    (`QueryScope`); a "tenant" query without a `tenant` parameter raises `ValueError` here.
    """

    name: str
    description: str
    sql: str
    params: Mapping[str, Param] = field(default_factory=dict)
    scope: QueryScope = field(kw_only=True)

    def __post_init__(self) -> None:
        if self.scope not in QUERY_SCOPES:
            raise ValueError(f"query {self.name!r}: scope must be one of {', '.join(QUERY_SCOPES)}, got {self.scope!r}")
        if self.scope == "tenant" and ("tenant" not in self.params or "$tenant" not in self.sql):
            raise ValueError(f"query {self.name!r} is tenant-scoped but has no $tenant parameter filtering its rows")

    def bind(self, given: Mapping[str, ParamValue] | None) -> dict[str, Any]:
        """Every parameter's value: the given one checked and converted, or its default. Raises
        `QueryError` naming unknown parameters, a missing required one, or a bad value."""
        given = dict(given or {})
        unknown = sorted(set(given) - set(self.params))
        if unknown:
            raise QueryError(
                f"query {self.name!r} has no parameter {', '.join(map(repr, unknown))}; "
                f"it takes {', '.join(sorted(self.params)) or 'none'}",
                query=self.name,
                param=unknown[0],
            )
        values = {name: _coerce(self.name, name, spec, given.get(name)) for name, spec in self.params.items()}
        for name, spec in self.params.items():
            if spec.requires is not None and values[name] is not None and values[spec.requires] is None:
                raise QueryError(
                    f"query {self.name!r}: parameter {name!r} needs {spec.requires!r} too",
                    query=self.name,
                    param=name,
                )
        since, until = values.get("since"), values.get("until")
        if isinstance(since, datetime) and isinstance(until, datetime) and since >= until:
            raise QueryError(
                f"query {self.name!r}: parameter 'since' ({since.isoformat()}) must be before "
                f"'until' ({until.isoformat()})",
                query=self.name,
                param="since",
            )
        return values

    def describe(self) -> dict[str, Any]:
        """`{"name", "description", "parameters": [{"name", "type", "description", "default", "required",
        and "choices" / "minimum" / "maximum" / "requires" when set}]}`, JSON-safe."""
        return {
            "name": self.name,
            "description": self.description,
            "parameters": [
                *(spec.describe(name) for name, spec in self.params.items()),
                AS_OF.describe(AS_OF_PARAM),
                INCLUDE_ARCHIVE.describe(ARCHIVE_PARAM),
            ],
            "scope": self.scope,
        }


@dataclass(frozen=True, slots=True)
class QueryResult:
    """What a named query returned: its columns in order and one JSON-safe dict per row
    (datetimes as ISO 8601 strings, JSON columns decoded, bytes as text)."""

    name: str
    params: dict[str, Any]
    columns: tuple[str, ...]
    rows: list[dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        """The result as one JSON-safe object: query, params, columns, rows."""
        return {"query": self.name, "params": self.params, "columns": list(self.columns), "rows": self.rows}


def run_query(con: duckdb.DuckDBPyConnection, name: str, params: Mapping[str, ParamValue] | None = None) -> QueryResult:
    """Run the named query on `con` (a store cursor or a read-only connection) with `params`.

    Raises `UnknownQueryError` (a `QueryError` and a `KeyError`) for a name not in `QUERIES`,
    `QueryError` (a `ValueError`) for a bad parameter, both before touching the database, and
    DuckDB's errors for a database without the store's schema. Every query also takes:

    - `as_of` (default none: now): the answer from the lake as it was at that time (its last snapshot
      committed then) or at that snapshot id (`consumers.lake.at_snapshot`). `QueryError` (param
      "as_of") for a malformed value, a time after now or before the oldest snapshot kept, an
      unknown snapshot id, and on a DuckDB file, which keeps no snapshots.
    - `include_archive` (default false): true reads the archive's Parquet files beside the store's
      events (`consumers.archive`; `ArchiveError` for a listed file that is gone).

    Blocks for the query (well under a second over a million events; `as_of` adds the attach of the
    snapshot). Not safe to share `con` between threads: give each its own (`AuditStore.cursor()`).
    """
    query = QUERIES.get(name)
    if query is None:
        raise UnknownQueryError(f"unknown query {name!r}; known: {', '.join(sorted(QUERIES))}", query=name)
    given = dict(params or {})
    as_of = _coerce(name, AS_OF_PARAM, AS_OF, given.pop(AS_OF_PARAM, None))
    archived = _coerce(name, ARCHIVE_PARAM, INCLUDE_ARCHIVE, given.pop(ARCHIVE_PARAM, None))
    values = query.bind(given)
    with contextlib.ExitStack() as stack:
        if as_of is not None:
            try:
                stack.enter_context(at_snapshot(con, as_of))
            except LakeError as exc:
                message = f"query {name!r}: parameter {AS_OF_PARAM!r}: {exc}"
                raise QueryError(message, query=name, param=AS_OF_PARAM) from exc
        if archived:
            stack.enter_context(with_archive(con))
        result = con.execute(query.sql, values)
        description = result.description or []
        columns = tuple(str(d[0]) for d in description)
        json_columns = {i for i, d in enumerate(description) if str(d[1]) == "JSON"}
        rows = [
            {
                columns[i]: (json.loads(v) if i in json_columns and v is not None else _json_safe(v))
                for i, v in enumerate(row)
            }
            for row in result.fetchall()
        ]
    shown = {k: _json_safe(v) for k, v in values.items()}
    if as_of is not None:
        shown[AS_OF_PARAM] = _json_safe(as_of)
    if archived:
        shown[ARCHIVE_PARAM] = True
    return QueryResult(name, shown, columns, rows)


def describe_queries() -> list[dict[str, Any]]:
    """Every named query with its parameters, as JSON-safe data (sorted by name)."""
    return [QUERIES[name].describe() for name in sorted(QUERIES)]


# -- parameters ---------------------------------------------------------------------------------

_TRUE = frozenset({"true", "1", "yes", "on"})
_FALSE = frozenset({"false", "0", "no", "off"})


def _coerce(query: str, name: str, spec: Param, raw: ParamValue) -> Any:
    # An empty text is "no filter": forms and URLs send empty fields for filters left blank.
    if isinstance(raw, str) and not raw.strip():
        raw = None
    if raw is None:
        if spec.required:
            raise QueryError(f"query {query!r} needs parameter {name!r} ({spec.description})", query=query, param=name)
        return spec.default

    def bad(expected: str) -> QueryError:
        return QueryError(
            f"query {query!r}: parameter {name!r} must be {expected}, got {raw!r}", query=query, param=name
        )

    value: Any
    if spec.type == "str":
        if not isinstance(raw, str):
            raise bad("text")
        value = raw
    elif spec.type == "int":
        if isinstance(raw, bool):
            raise bad("an integer")
        if isinstance(raw, int):
            value = raw
        elif isinstance(raw, str) and raw.strip().lstrip("-").isdigit():
            value = int(raw.strip())
        else:
            raise bad("an integer")
        if (spec.minimum is not None and value < spec.minimum) or (spec.maximum is not None and value > spec.maximum):
            raise bad(f"an integer from {spec.minimum} to {spec.maximum}")
        if not -(2**63) <= value < 2**63:  # what DuckDB's BIGINT holds
            raise bad("an integer of at most 64 bits")
    elif spec.type == "ids":
        try:
            ids = json.loads(raw) if isinstance(raw, str) else None
        except ValueError:
            ids = None
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise bad('a JSON list of texts (["r-1", "r-2"])')
        value = json.dumps(ids)
    elif spec.type == "snapshot":
        if isinstance(raw, bool):
            raise bad("a snapshot id or an ISO 8601 date-time (2024-05-01T12:00:00Z)")
        if isinstance(raw, int) or (isinstance(raw, str) and raw.strip().isdigit()):
            value = int(raw)
            if not 0 <= value < 2**63:
                raise bad("a snapshot id (0 or more, at most 64 bits) or an ISO 8601 date-time")
            return value
        try:
            value = _coerce(query, name, Param("datetime", spec.description), raw)
        except QueryError:
            raise bad("a snapshot id or an ISO 8601 date-time (2024-05-01T12:00:00Z)") from None
        if value > datetime.now(UTC):
            raise bad("a time not after now (the store answers for the past)")
    elif spec.type == "bool":
        if isinstance(raw, bool):
            value = raw
        elif isinstance(raw, str) and raw.strip().lower() in _TRUE | _FALSE:
            value = raw.strip().lower() in _TRUE
        else:
            raise bad("true or false")
    else:
        if isinstance(raw, datetime):
            value = raw
        elif isinstance(raw, str):
            try:
                value = datetime.fromisoformat(raw.strip())
            except ValueError:
                raise bad("an ISO 8601 date-time (2024-05-01T12:00:00Z)") from None
        else:
            raise bad("an ISO 8601 date-time (2024-05-01T12:00:00Z)")
        # Events are UTC; a time without a zone means UTC, not the host's zone.
        value = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    if spec.choices and value not in spec.choices:
        raise bad(f"one of {', '.join(spec.choices)}")
    return value


def _json_safe(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", "backslashreplace")
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return str(value)


# -- shared parameter specs and SQL pieces ------------------------------------------------------

SINCE = Param("datetime", "Only what happened at or after this time (ISO 8601; UTC if no zone).")
UNTIL = Param("datetime", "Only what happened before this time (ISO 8601; UTC if no zone).")
LIMIT = Param("int", "How many rows at most.", default=100, minimum=1, maximum=MAX_LIMIT)
OFFSET = Param("int", "How many rows to skip (paging).", default=0, minimum=0)
TENANT = Param("str", "Only this tenant.")
AS_OF_PARAM: Final = "as_of"
AS_OF: Final = Param(
    "snapshot",
    "Time travel: answer from the lake as it was at this time (ISO 8601; UTC if no zone) or at this snapshot "
    "id. A lake only: a DuckDB file keeps no snapshots.",
)
INCLUDE_ARCHIVE: Final = Param(
    "bool", "Read the archive's Parquet files (callgate archive) beside the store's events.", default=False
)
"""Taken by every query (`run_query`), not listed in each one's `params`."""
PAGE = {"limit": LIMIT, "offset": OFFSET}
BUCKET_SECONDS = Param(
    "int", "Bucket width in seconds; when given, instead of bucket_minutes.", minimum=1, maximum=604800
)

_OUTCOMES = ", ".join(f"'{t}'" for t in sorted(OUTCOME_TYPES))
_ALL_TYPES = ", ".join(f"('{t}')" for t in sorted(EVENT_TYPES))

_WINDOW = "($since IS NULL OR time >= $since) AND ($until IS NULL OR time < $until)"
# A bucket of $bucket_seconds when given (the dashboard's short windows), else of $bucket_minutes.
_BUCKET = "time_bucket(coalesce(to_seconds($bucket_seconds), to_minutes($bucket_minutes)), time)"

_BLOCKED_FILTERS = f"""
    {_WINDOW}
    AND ($tenant IS NULL OR tenant = $tenant)
    AND ($principal IS NULL OR principal = $principal)
    AND ($agent IS NULL OR agent = $agent)
    AND ($tool IS NULL OR tool = $tool)
    AND ($type IS NULL OR type = $type)
    AND ($decided_by IS NULL OR decided_by = $decided_by)
    AND ($text IS NULL OR contains(lower(message), lower($text)))
"""

_BLOCKED_PARAMS: dict[str, Param] = {
    "since": SINCE,
    "until": UNTIL,
    "tenant": TENANT,
    "principal": Param("str", "Only this principal (the user or service the agent acted for)."),
    "agent": Param("str", "Only this agent scope."),
    "tool": Param("str", "Only this tool."),
    "type": Param("str", "Only denials or only blocks.", choices=("ToolDenied", "Blocked")),
    "decided_by": Param("str", "Only what this interceptor (or validation / approval / registry) decided."),
    "text": Param("str", "Only messages containing this text, case-insensitive (no wildcards)."),
}

# -- the queries --------------------------------------------------------------------------------

_BLOCKED_ATTEMPTS = f"""
SELECT time, type, cause, decided_by, message, tenant, principal, gate, workflow, agent, tool,
       call_id, run_id, thread_id, trace_id, producer_id, seq, event_id
FROM blocked_attempts
WHERE {_BLOCKED_FILTERS}
ORDER BY time DESC, event_id
LIMIT $limit OFFSET $offset
"""  # noqa: S608 (composed of module constants only; values are bound parameters)

_BLOCKED_ATTEMPTS_COUNT = f"""
SELECT count(*) AS attempts,
       count(*) FILTER (WHERE type = 'ToolDenied') AS denied,
       count(*) FILTER (WHERE type = 'Blocked') AS blocked,
       min(time) AS first_time,
       max(time) AS last_time
FROM blocked_attempts
WHERE {_BLOCKED_FILTERS}
"""  # noqa: S608 (composed of module constants only; values are bound parameters)

_DECISION_TRENDS = f"""
SELECT {_BUCKET} AS bucket, type, count(*) AS events
FROM events
WHERE {_WINDOW} AND ($tenant IS NULL OR tenant = $tenant)
GROUP BY ALL
ORDER BY bucket DESC, type
LIMIT $limit OFFSET $offset
"""  # noqa: S608 (composed of module constants only; values are bound parameters)

# The policy rule behind a denial: the first matched rule, in the deciding step, whose decision denied or blocked.
_DENYING_RULE = """json_extract_string(list_filter(flatten(list_transform(
        list_filter(json_extract(event, '$.decisions[*]'),
                    lambda d: json_extract_string(d, '$.interceptor') = decided_by),
        lambda d: json_extract(d, '$.rules[*]'))),
        lambda r: json_extract_string(r, '$.decision') IN ('deny', 'block'))[1], '$.id')"""

# By tool or tenant: the share of its calls that were denied or blocked. By interceptor or rule: the share
# of all calls in the bucket that this interceptor (or rule) denied or blocked (its own denominator would
# need every call's trail unnested, a hundred times the cost for the same ranking).
_DENIAL_RATE = f"""
WITH outcomes AS (
    SELECT {_BUCKET} AS bucket, type, tool, decided_by, tenant,
           CASE WHEN $by = 'rule' AND type IN ('ToolDenied', 'Blocked') THEN {_DENYING_RULE} END AS rule
    FROM events
    WHERE type IN ({_OUTCOMES}) AND {_WINDOW} AND ($tenant IS NULL OR tenant = $tenant)
),
grouped AS (
    SELECT bucket,
           CASE $by WHEN 'tool' THEN tool WHEN 'tenant' THEN tenant WHEN 'rule' THEN rule ELSE decided_by END AS key,
           count(*) AS n, count(*) FILTER (WHERE type IN ('ToolDenied', 'Blocked')) AS denied
    FROM outcomes
    GROUP BY ALL
),
rated AS (
    SELECT bucket, key, denied,
           CAST(CASE WHEN $by IN ('tool', 'tenant') THEN n ELSE sum(n) OVER (PARTITION BY bucket) END AS BIGINT)
               AS calls
    FROM grouped
)
SELECT bucket, key, calls, denied, round(denied / calls, 4) AS rate
FROM rated
WHERE key IS NOT NULL AND ($by IN ('tool', 'tenant') OR denied > 0)
ORDER BY bucket DESC, rate DESC, key
LIMIT $limit OFFSET $offset
"""  # noqa: S608 (composed of module constants only; values are bound parameters)

_TOP_DENIED = f"""
SELECT CASE $by WHEN 'tool' THEN tool WHEN 'tenant' THEN tenant WHEN 'principal' THEN principal
                WHEN 'agent' THEN agent ELSE decided_by END AS key,
       count(*) AS attempts,
       count(*) FILTER (WHERE type = 'ToolDenied') AS denied,
       count(*) FILTER (WHERE type = 'Blocked') AS blocked,
       min(time) AS first_seen,
       max(time) AS last_seen,
       arg_max(message, time) AS last_message
FROM blocked_attempts
WHERE {_WINDOW} AND ($tenant IS NULL OR tenant = $tenant) AND ($type IS NULL OR type = $type)
GROUP BY key
ORDER BY attempts DESC, key
LIMIT $limit OFFSET $offset
"""  # noqa: S608 (composed of module constants only; values are bound parameters)

# A call's own events, then those of calls it made as an agent used as a tool ('child').
_CALL_DETAIL = """
SELECT CASE WHEN call_id = $call_id THEN 'call' ELSE 'child' END AS relation,
       time, type, seq, producer_id, gate, workflow, agent, tool, call_id, parent_call_id, run_id, thread_id,
       tenant, principal, decided_by, outcome, message, duration_ms, trace_id, span_id,
       json_extract(event, '$.decisions') AS decisions,
       json_extract(event, '$.args') AS args,
       json_extract(event, '$.redacted_paths') AS redacted_paths,
       json_extract(event, '$.args_truncated') AS args_truncated,
       shadow_outcome, divergent, shadow_decided_by, shadow_rule,
       event_id,
       CAST(event AS VARCHAR) AS stored_event
FROM events
WHERE (call_id = $call_id OR parent_call_id = $call_id) AND ($tenant IS NULL OR tenant = $tenant)
ORDER BY relation, time, producer_id, seq
LIMIT $limit OFFSET $offset
"""

_UNMEDIATED_WHERE = f"""
type = 'Unmediated' AND {_WINDOW}
AND ($tenant IS NULL OR tenant = $tenant)
AND ($tool IS NULL OR list_contains(json_extract_string(event, '$.bound_tools[*]'), $tool))
"""

_UNMEDIATED = f"""
SELECT time, gate, workflow, agent, tenant, principal,
       json_extract_string(event, '$.resource') AS resource,
       json_extract_string(event, '$.attribute') AS attribute,
       json_extract(event, '$.bound_tools') AS bound_tools,
       json_extract_string(event, '$.site') AS site,
       json_extract_string(event, '$.active_tool') AS active_tool,
       json_extract_string(event, '$.thread') AS thread,
       call_id, run_id, producer_id, seq, event_id
FROM events
WHERE {_UNMEDIATED_WHERE}
ORDER BY time DESC, event_id
LIMIT $limit OFFSET $offset
"""  # noqa: S608 (composed of module constants only; values are bound parameters)

_UNMEDIATED_COUNT = f"""
SELECT count(*) AS accesses, count(DISTINCT json_extract_string(event, '$.resource')) AS resources,
       min(time) AS first_time, max(time) AS last_time
FROM events
WHERE {_UNMEDIATED_WHERE}
"""  # noqa: S608 (composed of module constants only; values are bound parameters)

_TOOLS_JSON_SHAPE = (
    '[{"name": "VARCHAR", "description": "VARCHAR", "input_schema_sha256": "VARCHAR", '
    '"interceptors": ["VARCHAR"], "excluded": ["VARCHAR"]}]'
)

_REGISTRATIONS = f"""
SELECT time, gate, workflow, agent,
       unnest(from_json(json_extract(event, '$.tools'), '{_TOOLS_JSON_SHAPE}'), recursive := true)
FROM events
WHERE type = 'ToolsRegistered'
"""  # noqa: S608 (composed of module constants only; values are bound parameters)

_REGISTERED_TOOLS = f"""
WITH registrations AS ({_REGISTRATIONS})
SELECT gate, workflow, agent, name AS tool,
       arg_max(description, time) AS description,
       arg_max(input_schema_sha256, time) AS input_schema_sha256,
       arg_max(interceptors, time) AS interceptors,
       arg_max(excluded, time) AS excluded,
       count(DISTINCT input_schema_sha256) AS schema_versions,
       count(*) AS registrations,
       min(time) AS first_registered,
       max(time) AS last_registered
FROM registrations
WHERE ($gate IS NULL OR gate = $gate) AND ($agent IS NULL OR agent = $agent)
GROUP BY gate, workflow, agent, name
ORDER BY gate, workflow NULLS FIRST, agent NULLS FIRST, tool
LIMIT $limit OFFSET $offset
"""  # noqa: S608 (composed of module constants only; values are bound parameters)

# `registered`: some ToolsRegistered event of the same scope lists the tool; a denial of an
# unknown tool shows up here unregistered.
_EXERCISED_TOOLS = f"""
WITH exercised AS (
    SELECT gate, workflow, agent, tool,
           count(*) AS calls,
           count(*) FILTER (WHERE type = 'ToolUse') AS ran,
           count(*) FILTER (WHERE type = 'ToolUse' AND outcome = 'ok') AS ok,
           count(*) FILTER (WHERE type = 'ToolDenied') AS denied,
           count(*) FILTER (WHERE type = 'Substitute') AS substituted,
           count(*) FILTER (WHERE type = 'Blocked') AS blocked,
           min(time) AS first_seen,
           max(time) AS last_seen
    FROM events
    WHERE type IN ({_OUTCOMES}) AND tool IS NOT NULL AND {_WINDOW} AND ($gate IS NULL OR gate = $gate)
      AND ($tenant IS NULL OR tenant = $tenant)
    GROUP BY ALL
),
registered AS (
    SELECT DISTINCT gate, workflow, agent, name AS tool FROM ({_REGISTRATIONS})
)
SELECT e.*, r.tool IS NOT NULL AS registered
FROM exercised e
LEFT JOIN registered r
  ON r.gate = e.gate AND r.workflow IS NOT DISTINCT FROM e.workflow AND r.agent IS NOT DISTINCT FROM e.agent
 AND r.tool = e.tool
ORDER BY e.gate, e.workflow NULLS FIRST, e.agent NULLS FIRST, e.tool
LIMIT $limit OFFSET $offset
"""  # noqa: S608 (composed of module constants only; values are bound parameters)

_CHAIN_BREAKS = """
SELECT b.recorded_at, b.producer_id, b.seq, b.kind, b.detail, b.event_id, b.evidence,
       (SELECT any_value(gate) FROM events e WHERE e.producer_id = b.producer_id) AS gate
FROM chain_breaks b
WHERE ($producer_id IS NULL OR b.producer_id = $producer_id)
  AND ($kind IS NULL OR b.kind = $kind)
  AND ($since IS NULL OR b.recorded_at >= $since)
ORDER BY b.recorded_at DESC, b.producer_id, b.seq, b.kind
LIMIT $limit OFFSET $offset
"""

# `missing` is live (max seq minus stored events), whether or not close_open_gaps recorded the
# holes yet; producers with anything wrong come first.
_CHAIN_STATUS = """
WITH produced AS (
    SELECT producer_id, any_value(gate) AS gate, count(*) AS events, max(seq) AS max_seq,
           min(time) AS first_time, max(time) AS last_time
    FROM events
    WHERE $producer_id IS NULL OR producer_id = $producer_id
    GROUP BY producer_id
    HAVING ($since IS NULL OR max(time) >= $since) AND ($until IS NULL OR min(time) < $until)
),
breaks AS (
    SELECT producer_id,
           count(*) FILTER (WHERE kind = 'gap') AS gaps_recorded,
           count(*) FILTER (WHERE kind = 'tamper') AS tampered,
           count(*) FILTER (WHERE kind = 'conflict') AS conflicts
    FROM chain_breaks
    GROUP BY producer_id
),
status AS (
    SELECT p.producer_id, p.gate, p.max_seq, p.events, p.max_seq - p.events AS missing,
           coalesce(b.gaps_recorded, 0) AS gaps_recorded, coalesce(b.tampered, 0) AS tampered,
           coalesce(b.conflicts, 0) AS conflicts, p.first_time, p.last_time
    FROM produced p LEFT JOIN breaks b USING (producer_id)
)
SELECT producer_id, gate, max_seq, events, missing, gaps_recorded, tampered, conflicts,
       missing = 0 AND gaps_recorded = 0 AND tampered = 0 AND conflicts = 0 AS ok, first_time, last_time
FROM status
WHERE NOT $only_broken OR missing > 0 OR gaps_recorded > 0 OR tampered > 0 OR conflicts > 0
ORDER BY ok, last_time DESC, producer_id
LIMIT $limit OFFSET $offset
"""

_DEAD_LETTER_WHERE = """
($since IS NULL OR received_at >= $since) AND ($until IS NULL OR received_at < $until)
AND ($topic IS NULL OR topic = $topic)
"""

_DEAD_LETTERS = f"""
SELECT reason, count(*) AS messages,
       min(received_at) AS first_received, max(received_at) AS last_received,
       arg_max(error, received_at) AS sample_error,
       arg_max(preview, received_at) AS sample_preview,
       arg_max(topic || '/' || partition || '/' || "offset", received_at) AS sample_position
FROM dead_letters
WHERE {_DEAD_LETTER_WHERE}
GROUP BY reason
ORDER BY messages DESC, reason
LIMIT $limit OFFSET $offset
"""  # noqa: S608 (composed of module constants only; values are bound parameters)

_DEAD_LETTER_RECORDS = f"""
SELECT received_at, topic, partition, "offset", reason, error, preview, key, octet_length(value) AS value_bytes,
       kafka_time
FROM dead_letters
WHERE {_DEAD_LETTER_WHERE} AND ($reason IS NULL OR reason = $reason)
ORDER BY received_at DESC, topic, partition, "offset"
LIMIT $limit OFFSET $offset
"""  # noqa: S608 (composed of module constants only; values are bound parameters)

# The window [since, until) and the one of the same length just before it, for every known type
# (zeros included, so a type that vanished shows up as a drop).
_EVENT_COUNTS = f"""
WITH bounds AS (
    SELECT coalesce($until::TIMESTAMPTZ, now()) AS until_,
           coalesce($since::TIMESTAMPTZ, coalesce($until::TIMESTAMPTZ, now()) - INTERVAL 1 HOUR) AS since_
),
windows AS (SELECT since_, until_, since_ - (until_ - since_) AS previous_since FROM bounds),
counted AS (
    SELECT type,
           count(*) FILTER (WHERE time >= w.since_) AS events,
           count(*) FILTER (WHERE time < w.since_) AS previous_events
    FROM events, windows w
    WHERE time >= w.previous_since AND time < w.until_ AND ($tenant IS NULL OR tenant = $tenant)
    GROUP BY type
)
SELECT t.type, coalesce(c.events, 0) AS events, coalesce(c.previous_events, 0) AS previous_events,
       coalesce(c.events, 0) - coalesce(c.previous_events, 0) AS change,
       w.since_ AS since, w.until_ AS until, w.previous_since
FROM (VALUES {_ALL_TYPES}) t(type)
CROSS JOIN windows w
LEFT JOIN counted c USING (type)
ORDER BY t.type
"""  # noqa: S608 (composed of module constants only; values are bound parameters)

# One row per stored Kafka partition (one row with a NULL topic before the first ingest), each
# carrying the same store-wide figures. Recent means ingested in the last $minutes, by the
# store's clock.
_PIPELINE_HEALTH = """
WITH summary AS (
    SELECT count(*) AS total_events,
           count(*) FILTER (WHERE ingested_at >= now() - to_minutes($minutes)) AS recent_events,
           max(time) AS last_event_time,
           min(ingested_at) AS first_ingested_at,
           max(ingested_at) AS last_ingested_at
    FROM events
),
dead AS (
    SELECT count(*) AS dead_letters,
           count(*) FILTER (WHERE received_at >= now() - to_minutes($minutes)) AS recent_dead_letters
    FROM dead_letters
),
breaks AS (SELECT count(*) AS chain_breaks FROM chain_breaks)
SELECT o.topic, o.partition, o.next_offset, o.updated_at AS offset_updated_at,
       s.last_event_time, s.last_ingested_at,
       epoch(now() - s.last_ingested_at) AS seconds_since_last_ingest,
       s.total_events, s.recent_events, round(s.recent_events / $minutes, 2) AS events_per_minute,
       round(least($minutes, epoch(now() - s.first_ingested_at) / 60), 2) AS recent_minutes,
       d.dead_letters, d.recent_dead_letters, b.chain_breaks
FROM summary s CROSS JOIN dead d CROSS JOIN breaks b
LEFT JOIN kafka_offsets o ON true
ORDER BY o.topic, o.partition
"""

# A reason is the message with ids and numbers masked, so "Order ACME-42 ..." and "Order ACME-7
# ..." are one reason; new = first seen inside the window (default: the last 24 hours).
_NEW_DENIAL_REASONS = """
WITH bounds AS (
    SELECT coalesce($until::TIMESTAMPTZ, now()) AS until_,
           coalesce($since::TIMESTAMPTZ, coalesce($until::TIMESTAMPTZ, now()) - INTERVAL 1 DAY) AS since_
),
reasons AS (
    SELECT regexp_replace(regexp_replace(message, '[0-9a-fA-F]{8,}(-[0-9a-fA-F]{4,})*', '<id>', 'g'),
                          '[0-9]+', 'N', 'g') AS reason,
           decided_by, type, time, message, tool, tenant
    FROM blocked_attempts, bounds
    WHERE time < bounds.until_ AND ($decided_by IS NULL OR decided_by = $decided_by)
      AND ($tenant IS NULL OR tenant = $tenant)
)
SELECT reason, decided_by, min(time) AS first_seen, max(time) AS last_seen, count(*) AS occurrences,
       count(DISTINCT tenant) AS tenants, arg_min(message, time) AS sample_message,
       arg_min(tool, time) AS sample_tool, arg_min(type, time) AS type
FROM reasons
GROUP BY reason, decided_by
HAVING min(time) >= (SELECT since_ FROM bounds)
ORDER BY first_seen DESC, reason
LIMIT $limit OFFSET $offset
"""


# -- coverage: what `callgate coverage` checks ---------------------------------------------------

# Every registration with its producer, so a call is matched to the chains its own gate announced.
_PRODUCER_REGISTRATIONS = f"""
SELECT producer_id, gate, coalesce(workflow, '') AS workflow, coalesce(agent, '') AS agent,
       unnest(from_json(json_extract(event, '$.tools'), '{_TOOLS_JSON_SHAPE}'), recursive := true)
FROM events
WHERE type = 'ToolsRegistered'
"""  # noqa: S608 (composed of module constants only; values are bound parameters)

# A ToolUse is verified when its producer's chain is whole and its decision trail names every
# interceptor of some chain its own gate registered for that scope and tool. "Some" rather than
# "the latest": a chain changed by add/remove_interceptor is announced again, and a call decided
# just before the announcement must not look unmediated.
_TRAIL = "coalesce(e.trail, [])"

_TOOL_USE_PROBLEMS = f"""
WITH chains AS (
    -- Per scope and tool, every distinct chain its producer registered (usually one).
    SELECT producer_id, gate, workflow, agent, name AS tool, list(DISTINCT interceptors) AS chains
    FROM ({_PRODUCER_REGISTRATIONS})
    GROUP BY ALL
),
broken AS (
    -- What says the chain's content cannot be trusted; a producer's signing state (no valid
    -- checkpoint, events not covered yet, silence, an untrusted key) is the `signed` check's.
    SELECT producer_id FROM chain_breaks WHERE kind NOT IN ('unsigned', 'uncovered', 'silent', 'unknown_key')
    UNION
    SELECT producer_id FROM events GROUP BY producer_id HAVING max(seq) <> count(*)
),
judged AS (
    SELECT e.event_id, e.time, e.producer_id, e.seq, e.gate, e.workflow, e.agent, e.tool, e.call_id, e.run_id,
           e.tenant, e.principal, e.trail, c.chains,
           CASE WHEN b.producer_id IS NOT NULL THEN 'chain_not_verified'
                WHEN c.chains IS NULL THEN 'not_registered'
                WHEN NOT list_bool_or(list_transform(c.chains, lambda ch: list_has_all({_TRAIL}, ch)))
                THEN 'incomplete_trail' END AS problem
    FROM events e
    LEFT JOIN chains c
      ON c.producer_id = e.producer_id AND c.gate = e.gate AND c.workflow = coalesce(e.workflow, '')
     AND c.agent = coalesce(e.agent, '') AND c.tool = e.tool
    LEFT JOIN broken b ON b.producer_id = e.producer_id
    WHERE e.type = 'ToolUse' AND {_WINDOW}
)
"""  # noqa: S608 (composed of module constants only; values are bound parameters)

_UNVERIFIED_TOOL_USES = f"""
{_TOOL_USE_PROBLEMS},
detailed AS (
    -- Top-N on the judged rows themselves: joining back to events would scan the table again.
    SELECT e.* EXCLUDE (trail), {_TRAIL} AS trail
    FROM (
        SELECT * FROM judged
        WHERE problem IS NOT NULL AND ($problem IS NULL OR problem = $problem)
        ORDER BY time DESC, event_id
        LIMIT $limit OFFSET $offset
    ) e
)
SELECT time, problem, gate, workflow, agent, tool, call_id, run_id, tenant, principal, trail,
       -- What the trail lacks of the registered chain it comes closest to.
       CASE WHEN problem = 'incomplete_trail' THEN list_reduce(
           list_transform(chains, lambda c: list_filter(c, lambda x: NOT list_contains(trail, x))),
           lambda a, b: CASE WHEN len(b) < len(a) THEN b ELSE a END) END AS missing_interceptors,
       producer_id, seq, event_id
FROM detailed
ORDER BY time DESC, event_id
"""  # noqa: S608 (composed of module constants only; values are bound parameters)

_TOOL_USE_VERIFICATION = f"""
{_TOOL_USE_PROBLEMS}
SELECT count(*) AS tool_uses,
       count(*) FILTER (WHERE problem IS NOT NULL) AS unverified,
       count(*) FILTER (WHERE problem = 'chain_not_verified') AS chain_not_verified,
       count(*) FILTER (WHERE problem = 'not_registered') AS not_registered,
       count(*) FILTER (WHERE problem = 'incomplete_trail') AS incomplete_trail
FROM judged
"""  # noqa: S608 (composed of module constants only; values are bound parameters)

# Per gate and tool name: registered by some scope, and called through the gate (any outcome: a
# denial proves the route passes the gate as well as a run does) in the window.
_TOOL_EXERCISE = f"""
WITH registered AS (
    SELECT gate, name AS tool, list(DISTINCT agent ORDER BY agent) AS scopes, max(time) AS last_registered
    FROM ({_REGISTRATIONS})
    WHERE $gate IS NULL OR gate = $gate
    GROUP BY ALL
),
called AS (
    SELECT gate, tool, count(*) AS calls, count(*) FILTER (WHERE type = 'ToolUse') AS ran,
           max(time) AS last_called
    FROM events
    WHERE type IN ({_OUTCOMES}) AND tool IS NOT NULL AND {_WINDOW} AND ($gate IS NULL OR gate = $gate)
    GROUP BY ALL
)
SELECT r.gate, r.tool, r.scopes, coalesce(c.calls, 0) AS calls, coalesce(c.ran, 0) AS ran,
       coalesce(c.calls, 0) > 0 AS exercised, r.last_registered, c.last_called
FROM registered r LEFT JOIN called c USING (gate, tool)
WHERE NOT $only_unexercised OR c.calls IS NULL
ORDER BY exercised, r.gate, r.tool
LIMIT $limit OFFSET $offset
"""  # noqa: S608 (composed of module constants only; values are bound parameters)

# One row: everything the coverage check decides on, each count cheap enough to run on every check.
_COVERAGE_SUMMARY = f"""
WITH window_events AS (
    SELECT type, producer_id FROM events WHERE {_WINDOW}
),
active AS (
    SELECT DISTINCT producer_id FROM window_events
),
status AS (
    SELECT e.producer_id, max(e.seq) - count(*) AS missing
    FROM events e JOIN active a USING (producer_id)
    GROUP BY e.producer_id
),
breaks AS (
    SELECT b.producer_id, count(*) FILTER (WHERE kind = 'gap') AS gaps,
           count(*) FILTER (WHERE kind = 'tamper') AS tampered,
           count(*) FILTER (WHERE kind = 'conflict') AS conflicts
    FROM chain_breaks b JOIN active a USING (producer_id)
    GROUP BY b.producer_id
)
SELECT (SELECT count(*) FROM window_events) AS events,
       (SELECT count(*) FROM active) AS producers,
       (SELECT count(*) FROM status s LEFT JOIN breaks b USING (producer_id)
         WHERE s.missing > 0 OR coalesce(b.gaps, 0) > 0 OR coalesce(b.tampered, 0) > 0
            OR coalesce(b.conflicts, 0) > 0) AS broken_producers,
       (SELECT coalesce(sum(missing), 0) FROM status) AS missing_seqs,
       (SELECT coalesce(sum(gaps), 0) FROM breaks) AS gaps_recorded,
       (SELECT coalesce(sum(tampered), 0) FROM breaks) AS tampered,
       (SELECT coalesce(sum(conflicts), 0) FROM breaks) AS conflicts,
       (SELECT count(*) FROM window_events WHERE type = 'Unmediated') AS unmediated,
       (SELECT count(*) FROM window_events WHERE type = 'ToolUse') AS tool_uses,
       (SELECT count(*) FROM dead_letters WHERE $since IS NULL OR received_at >= $since) AS dead_letters
"""  # noqa: S608 (composed of module constants only; values are bound parameters)


# -- dashboard: the audit console's own figures -------------------------------------------------

# The Overview's headline figures for [since, until) and the window of the same length before it:
# one row per metric, in display order, zeros included. Chain breaks count by the time they were
# recorded and ignore the tenant (a producer's chain is not a tenant's).
_OVERVIEW_COUNTS = f"""
WITH bounds AS (
    SELECT coalesce($until::TIMESTAMPTZ, now()) AS until_,
           coalesce($since::TIMESTAMPTZ, coalesce($until::TIMESTAMPTZ, now()) - INTERVAL 1 HOUR) AS since_
),
windows AS (SELECT since_, until_, since_ - (until_ - since_) AS previous_since FROM bounds),
tallied AS (
    SELECT time >= w.since_ AS current,
           count(*) FILTER (WHERE type IN ({_OUTCOMES})) AS calls,
           count(*) FILTER (WHERE type = 'ToolUse') AS allowed,
           count(*) FILTER (WHERE type = 'ToolDenied') AS denied,
           count(*) FILTER (WHERE type = 'Substitute') AS substituted,
           count(*) FILTER (WHERE type = 'Blocked') AS blocked,
           count(*) FILTER (WHERE type = 'ApprovalRequested') AS approvals_asked,
           count(*) FILTER (WHERE type = 'ApprovalResolved' AND outcome <> 'approved' AND decided_by IS NULL)
               AS approvals_refused,
           count(*) FILTER (WHERE type = 'Unmediated') AS unmediated
    FROM events, windows w
    WHERE time >= w.previous_since AND time < w.until_ AND ($tenant IS NULL OR tenant = $tenant)
    GROUP BY ALL
),
-- A refusal no desk key signed (decided_by flagged) counts only when the gate that asked wrote it
-- (its own handler's answer, an expiry): as in the `calls` view, a forged refusal refuses nothing.
refused_by_gates AS (
    SELECT r.time >= w.since_ AS current, count(*) AS approvals_refused
    FROM events r, windows w
    WHERE r.type = 'ApprovalResolved' AND r.outcome <> 'approved' AND r.decided_by IS NOT NULL
      AND r.time >= w.previous_since AND r.time < w.until_ AND ($tenant IS NULL OR r.tenant = $tenant)
      AND EXISTS (
          SELECT 1 FROM events q
          WHERE q.type = 'ApprovalRequested' AND q.call_id = r.call_id AND q.producer_id = r.producer_id
            AND json_extract_string(q.event, '$.approval_id') = json_extract_string(r.event, '$.approval_id')
      )
    GROUP BY ALL
),
broken AS (
    SELECT recorded_at >= w.since_ AS current, count(*) AS chain_breaks
    FROM chain_breaks, windows w
    WHERE recorded_at >= w.previous_since AND recorded_at < w.until_
    GROUP BY ALL
),
measured AS (
    SELECT unnest(['calls', 'allowed', 'denied', 'substituted', 'blocked', 'approvals_asked',
                   'approvals_refused', 'unmediated']) AS metric,
           unnest([calls, allowed, denied, substituted, blocked, approvals_asked, approvals_refused,
                   unmediated]) AS n,
           current
    FROM tallied
    UNION ALL
    SELECT 'approvals_refused', approvals_refused, current FROM refused_by_gates
    UNION ALL
    SELECT 'chain_breaks', chain_breaks, current FROM broken
),
metrics(ord, metric) AS (
    VALUES (1, 'calls'), (2, 'allowed'), (3, 'denied'), (4, 'substituted'), (5, 'blocked'),
           (6, 'approvals_asked'), (7, 'approvals_refused'), (8, 'unmediated'), (9, 'chain_breaks')
),
summed AS (
    SELECT m.ord, m.metric,
           CAST(coalesce(sum(v.n) FILTER (WHERE v.current), 0) AS BIGINT) AS value,
           CAST(coalesce(sum(v.n) FILTER (WHERE NOT v.current), 0) AS BIGINT) AS previous
    FROM metrics m LEFT JOIN measured v USING (metric)
    GROUP BY m.ord, m.metric
)
SELECT s.metric, s.value, s.previous, s.value - s.previous AS change,
       w.since_ AS since, w.until_ AS until, w.previous_since
FROM summed s CROSS JOIN windows w
ORDER BY s.ord
"""  # noqa: S608 (composed of module constants only; values are bound parameters)

# Per stored Kafka partition: the committed offset and how long its recent events took from the
# decision (event time) to the store (ingest time), over what was ingested in the last $minutes.
_INGEST_LAG = """
WITH recent AS (
    SELECT kafka_topic AS topic, kafka_partition AS partition, count(*) AS recent_events,
           median(epoch(ingested_at - time)) AS median_delay_s,
           quantile_cont(epoch(ingested_at - time), 0.95) AS p95_delay_s,
           max(epoch(ingested_at - time)) AS max_delay_s,
           max(time) AS last_event_time, max(ingested_at) AS last_ingested_at
    FROM events
    WHERE ingested_at >= now() - to_minutes($minutes) AND kafka_topic IS NOT NULL
    GROUP BY ALL
)
SELECT o.topic, o.partition, o.next_offset, o.updated_at AS offset_updated_at,
       epoch(now() - o.updated_at) AS seconds_since_commit,
       coalesce(r.recent_events, 0) AS recent_events, round(r.median_delay_s, 3) AS median_delay_s,
       round(r.p95_delay_s, 3) AS p95_delay_s, round(r.max_delay_s, 3) AS max_delay_s,
       r.last_event_time, r.last_ingested_at
FROM kafka_offsets o
LEFT JOIN recent r USING (topic, partition)
ORDER BY o.topic, o.partition
"""


# -- shadow mode and replay ---------------------------------------------------------------------

# The outcome events of calls with a shadow decision (the `shadow_*` columns are set on those only).
_SHADOW_WHERE = f"""
shadow_outcome IS NOT NULL AND type IN ({_OUTCOMES}) AND {_WINDOW}
AND ($gate IS NULL OR gate = $gate)
AND ($tool IS NULL OR tool = $tool)
AND ($tenant IS NULL OR tenant = $tenant)
AND ($decider IS NULL OR shadow_decided_by = $decider)
AND ($rule IS NULL OR shadow_rule = $rule)
"""

_SHADOW_PARAMS: dict[str, Param] = {
    "since": SINCE,
    "until": UNTIL,
    "gate": Param("str", "Only this gate."),
    "tool": Param("str", "Only this tool."),
    "tenant": TENANT,
    "decider": Param(
        "str", "Only what this shadow interceptor, or policy file (by its name), decided (shadow_decided_by)."
    ),
    "rule": Param("str", "Only what this policy rule decided (shadow_rule)."),
}

_SHADOW_ORDER = "shadow_decided_by NULLS LAST, shadow_rule NULLS LAST"

_SHADOW_IMPACT = f"""
SELECT shadow_decided_by, shadow_rule, tool, tenant,
       count(*) AS calls,
       count(*) FILTER (WHERE shadow_outcome = 'denied') AS would_deny,
       count(*) FILTER (WHERE shadow_outcome = 'blocked') AS would_block,
       count(*) FILTER (WHERE shadow_outcome = 'substituted') AS would_substitute,
       count(*) FILTER (WHERE shadow_outcome = 'approval') AS would_ask,
       count(*) FILTER (WHERE divergent) AS divergent,
       min(time) AS first_time,
       max(time) AS last_time
FROM events
WHERE {_SHADOW_WHERE}
GROUP BY shadow_decided_by, shadow_rule, tool, tenant
ORDER BY divergent DESC, calls DESC, {_SHADOW_ORDER}, tool NULLS LAST, tenant NULLS LAST
LIMIT $limit OFFSET $offset
"""  # noqa: S608 (composed of module constants only; values are bound parameters)

_SHADOW_DIVERGENCE = f"""
SELECT {_BUCKET} AS bucket, shadow_decided_by, shadow_rule,
       count(*) AS calls,
       count(*) FILTER (WHERE divergent) AS divergent
FROM events
WHERE {_SHADOW_WHERE}
GROUP BY ALL
ORDER BY bucket DESC, divergent DESC, {_SHADOW_ORDER}
LIMIT $limit OFFSET $offset
"""  # noqa: S608 (composed of module constants only; values are bound parameters)

_SHADOW_CALLS = f"""
SELECT time, event_id, call_id, type, shadow_outcome, divergent, shadow_decided_by, shadow_rule,
       gate, workflow, agent, tool, tenant, principal, run_id, decided_by, message
FROM events
WHERE {_SHADOW_WHERE}
  AND ($principal IS NULL OR principal = $principal)
  AND (NOT $divergent_only OR divergent)
  AND ($shadow_outcome IS NULL OR shadow_outcome = $shadow_outcome)
ORDER BY time DESC, event_id
LIMIT $limit OFFSET $offset
"""  # noqa: S608 (composed of module constants only; values are bound parameters)

_REPLAY_WHERE = f"""
type IN ({_OUTCOMES}) AND {_WINDOW}
AND ($gate IS NULL OR gate = $gate)
AND ($workflow IS NULL OR workflow = $workflow)
AND ($agent IS NULL OR agent = $agent)
AND ($tool IS NULL OR tool = $tool)
AND ($tenant IS NULL OR tenant = $tenant)
AND ($after_time IS NULL OR time > $after_time OR (time = $after_time AND event_id > $after_event_id))
"""

# The page's keys first, on the narrow columns; then only its rows are read whole. Selecting the
# JSON columns in one query had DuckDB extract them from every matching row before the top-N (a
# page of 10,000 ran out of the store's 256 MB). The outer filters repeat the inner ones and bound
# the time, so the second scan skips what the page cannot hold; each event is parsed once for its
# four JSON parts. `cause` is the stored `outcome` of denials and blocks: the event's `$.cause`
# (the ingest copies it there). The JSON texts are cast to VARCHAR so that readers get the stored
# text, not decoded values.
_REPLAY_CALLS = f"""
WITH page AS (
    SELECT time, event_id FROM events WHERE {_REPLAY_WHERE} ORDER BY time, event_id LIMIT $limit
),
paged AS (
    SELECT event_id, time, type, outcome, decided_by, gate, workflow, agent, tool, call_id, run_id, thread_id,
           tenant, principal, shadow_outcome,
           json_extract(event, ['$.args', '$.redacted_paths', '$.decisions', '$.args_truncated']) AS parts
    FROM events
    WHERE {_REPLAY_WHERE}
      AND time >= (SELECT min(time) FROM page) AND time <= (SELECT max(time) FROM page)
      AND event_id IN (SELECT event_id FROM page)
)
SELECT event_id, time, type,
       CASE WHEN type IN ('ToolDenied', 'Blocked') THEN outcome END AS cause,
       decided_by, gate, workflow, agent, tool, call_id, run_id, thread_id, tenant, principal,
       nullif(CAST(parts[1] AS VARCHAR), 'null') AS args,
       coalesce(CAST(parts[2] AS VARCHAR[]), []) AS redacted_paths,
       CAST(parts[3] AS VARCHAR) AS decisions,
       shadow_outcome,
       coalesce(CAST(parts[4] AS BOOLEAN), false) AS args_truncated
FROM paged
ORDER BY time, event_id
"""  # noqa: S608 (composed of module constants only; values are bound parameters)

_REPLAY_CALLS_DESCRIPTION = (
    "The stored calls a replay needs (callgate replay --api pages through it): one row per outcome event "
    "(ToolUse, ToolDenied, Substitute, Blocked) in [since, until), oldest first by (time, event_id), at most "
    f"`limit` rows a page (1 to {MAX_REPLAY_LIMIT:,}). Pages by a cursor, not an offset: the next page is the "
    "same parameters plus `after_time` and `after_event_id` set to the last row's `time` and `event_id` (as "
    "returned); a page with fewer rows than `limit` is the last. The cursor is stable while events are stored: "
    "rows never move between pages, but an event stored later with a time before the cursor (a partition "
    "catching up) is not returned; give `until` (a time before the export began, minus the pipeline's lag) "
    "for an export that cannot miss any. Columns: event_id, time (ISO 8601, UTC, microseconds), type, cause "
    "(ToolDenied / Blocked: deny, validation, block, ...; else null), decided_by, gate, workflow, agent, tool, "
    "call_id, run_id, thread_id, tenant, principal, args (the arguments as the event holds them, JSON text: "
    'redacted, the values at redacted_paths replaced; {"_truncated": ...} when cut, then args_truncated is '
    "true; null when the gate could not redact), redacted_paths (JSON pointers), decisions (the decision trail, "
    "JSON text), shadow_outcome (what the call's shadow decisions would have done; null without any), "
    "args_truncated."
)


# The event column is JSON: cast to text so the bytes come back as stored, never re-encoded.
# The rows of one inclusion proof (consumers.proofs): the event, its covering checkpoint, the
# stored tree nodes (level >= 8) the audit path is made of (each sibling of the leaf's ancestors
# that lies inside the tree, and each complete subtree of the tree's right edge), and the hashes of
# the two 256-leaf blocks the smaller subtrees are hashed from (the event's and the tree's last).
_INCLUSION_MATERIAL = """
WITH target AS (
    -- By `event_uuid` too: its exact min/max skip all but one row group (the text's keep 8 bytes).
    SELECT producer_id, seq, hash, event::VARCHAR AS text FROM events
    WHERE event_id = $event_id AND (event_uuid = TRY_CAST($event_id AS UUID) OR event_uuid IS NULL)
), last_seq AS (
    -- Found first without the JSON: a scan that reads `event` for every checkpoint reads the whole
    -- column (0.3 s over 1,000,000 events); this reads type, producer_id and seq, then one row.
    SELECT max(c.seq) AS seq FROM events c JOIN target t ON c.producer_id = t.producer_id WHERE c.type = 'Checkpoint'
), last_checkpoint AS (
    SELECT c.seq, c.hash, c.event::VARCHAR AS text, CAST(json_extract_string(c.event, '$.tree_size') AS BIGINT) AS n
    FROM events c JOIN target t ON c.producer_id = t.producer_id JOIN last_seq l ON c.seq = l.seq
    WHERE c.type = 'Checkpoint'
), covering AS (
    -- The latest checkpoint that covers the event: the last one, unless its tree is smaller than
    -- the event's seq (a forged or broken chain); only then are the others' JSON read.
    SELECT c.seq, c.hash, c.text, c.n FROM last_checkpoint c, target t WHERE c.n >= t.seq
    UNION ALL
    (SELECT * FROM (
        SELECT c.seq, c.hash, c.event::VARCHAR AS text, CAST(json_extract_string(c.event, '$.tree_size') AS BIGINT) AS n
        FROM events c JOIN target t ON c.producer_id = t.producer_id JOIN last_checkpoint l ON l.n < t.seq
        WHERE c.type = 'Checkpoint' AND CAST(json_extract_string(c.event, '$.tree_size') AS BIGINT) >= t.seq
        ORDER BY c.seq DESC
        LIMIT 1))
), bounds AS (
    SELECT t.producer_id, t.seq - 1 AS i, c.n,
           ((t.seq - 1) // 256) * 256 AS own_lo, least(((t.seq - 1) // 256 + 1) * 256, c.n) AS own_hi,
           (c.n // 256) * 256 AS last_lo
    FROM target t, covering c
), own_seqs AS (
    -- The two blocks' seqs as join keys: DuckDB then skips every row group outside each block.
    SELECT producer_id, unnest(range(own_lo + 1, own_hi + 1)) AS seq FROM bounds
), last_seqs AS (
    SELECT producer_id, unnest(range(greatest(last_lo, own_hi) + 1, n + 1)) AS seq FROM bounds
)
SELECT part, producer_id, seq, hash, text, level, idx FROM (
    SELECT 0 AS o, 'event' AS part, producer_id, seq, hash, text, NULL::INTEGER AS level, NULL::BIGINT AS idx
    FROM target
    UNION ALL
    SELECT 1, 'checkpoint', t.producer_id, c.seq, c.hash, c.text, NULL, NULL FROM covering c, target t
    UNION ALL
    SELECT 2, 'node', m.producer_id, NULL, m.hash, NULL, m.level, m.idx
    FROM merkle_nodes m JOIN bounds b ON m.producer_id = b.producer_id
    WHERE m.level >= 8 AND (m.idx + 1) * (1::BIGINT << m.level) <= b.n
      AND (m.idx = xor(b.i >> m.level, 1) OR ((b.n >> m.level) & 1 = 1 AND m.idx = (b.n >> m.level) - 1))
    UNION ALL
    SELECT 3, 'leaf', e.producer_id, e.seq, e.hash, NULL, NULL, NULL
    FROM events e JOIN own_seqs s ON e.producer_id = s.producer_id AND e.seq = s.seq
    UNION ALL
    SELECT 3, 'leaf', e.producer_id, e.seq, e.hash, NULL, NULL, NULL
    FROM events e JOIN last_seqs s ON e.producer_id = s.producer_id AND e.seq = s.seq
)
ORDER BY o, level, idx, seq
"""


# The compact range of leaves [lo, hi) of one producer's tree, as far as this store holds it: the
# indexed subtrees (level 8 and above, consumers.proofs) inside the range whose parent is not, and the
# leaves of the range's edge blocks, whose smaller subtrees are hashed from them.
_MERKLE_MATERIAL = """
SELECT kind, level, idx, seq, hash FROM (
    SELECT 'node' AS kind, m.level, m.idx, NULL::BIGINT AS seq, m.hash
    FROM merkle_nodes m
    WHERE m.producer_id = $producer_id AND m.level >= 8
      AND (m.idx << m.level) >= $lo AND ((m.idx + 1) << m.level) <= $hi
      AND NOT (((m.idx >> 1) << (m.level + 1)) >= $lo AND (((m.idx >> 1) + 1) << (m.level + 1)) <= $hi)
    UNION ALL
    SELECT 'leaf', NULL, NULL, e.seq, e.hash
    FROM events e
    WHERE e.producer_id = $producer_id AND e.seq > $lo AND e.seq <= $hi
      AND ((((e.seq - 1) >> 8) << 8) < $lo OR ((((e.seq - 1) >> 8) + 1) << 8) > $hi)
)
ORDER BY kind, level, idx, seq
LIMIT $limit OFFSET $offset
"""


# Signed checkpoints (consumers.checkpoints): per producer with events in the window, its last valid
# checkpoint (checkpoint_state.tree_size is only set by a verified one) and every checkpoint break
# recorded for it, failing producers first.
_SIGNATURE_KINDS = (
    "'bad_signature', 'unknown_key', 'root_mismatch', 'inconsistent', 'unsigned', 'uncovered', 'silent', 'truncated'"
)
_PRODUCER_SIGNATURES = f"""
WITH active AS (
    SELECT producer_id, any_value(gate) AS gate, count(*) AS events, max(time) AS last_time
    FROM events WHERE {_WINDOW}
    GROUP BY producer_id
),
found AS (
    SELECT b.producer_id,
           list({{'kind': b.kind, 'seq': b.seq, 'detail': b.detail}} ORDER BY b.seq, b.kind) AS breaks
    FROM chain_breaks b JOIN active a USING (producer_id)
    WHERE b.kind IN ({_SIGNATURE_KINDS})
    GROUP BY b.producer_id
),
status AS (
    SELECT a.producer_id, a.gate, a.events, s.tree_size IS NOT NULL AS signed, s.tree_size AS signed_tree_size,
           s.checkpoint_seq, s.event_id AS checkpoint_event_id, s.checkpoint_time,
           coalesce(f.breaks, []) AS breaks, a.last_time
    FROM active a LEFT JOIN checkpoint_state s USING (producer_id) LEFT JOIN found f USING (producer_id)
)
SELECT producer_id, gate, events, signed AND len(breaks) = 0 AS ok, signed, signed_tree_size, checkpoint_seq,
       checkpoint_event_id, checkpoint_time, breaks, last_time
FROM status
WHERE NOT $only_failing OR NOT (signed AND len(breaks) = 0)
ORDER BY ok, producer_id
LIMIT $limit OFFSET $offset
"""  # noqa: S608 (composed of module constants only; values are bound parameters)


# -- the read API's own access log (consumers.access_log) ----------------------------------------

_ACCESS_LOG = """
SELECT time, subject, roles, query, params, status, row_count, duration_ms
FROM access_log
WHERE ($since IS NULL OR time >= $since) AND ($until IS NULL OR time < $until)
  AND ($subject IS NULL OR subject = $subject)
  AND ($query_name IS NULL OR query = $query_name)
  AND ($status IS NULL OR status = $status)
ORDER BY time DESC, subject, query
LIMIT $limit OFFSET $offset
"""


# -- runs: one agent run's story (the dashboard's Run page) -------------------------------------

# The calls of a run, and those of agents nested under them that run under a run id of their own
# (an agent used as a tool shares its caller's run; one started anew inside a tool does not): each
# nested event names its enclosing call as parent_call_id. The depth bounds a cycle forged events
# could make.
# With `$call_ids` the calls are those given instead.
_RUN_CALLS = """
WITH RECURSIVE run_calls(call_id, depth) AS (
    SELECT * FROM (
        SELECT DISTINCT call_id, 0 FROM events
        WHERE $call_ids IS NULL AND run_id = $run_id AND call_id IS NOT NULL AND ($tenant IS NULL OR tenant = $tenant)
        UNION ALL
        SELECT unnest(from_json($call_ids, '["VARCHAR"]')), 0 WHERE $call_ids IS NOT NULL
    )
    UNION
    SELECT DISTINCT e.call_id, c.depth + 1
    FROM events e JOIN run_calls c ON e.parent_call_id = c.call_id
    WHERE $call_ids IS NULL AND e.call_id IS NOT NULL AND e.run_id IS DISTINCT FROM $run_id AND c.depth < 16
      AND ($tenant IS NULL OR e.tenant = $tenant)
)
"""


# The run's events, then those of the nested runs (by their parent call): two narrow scans whose
# union bounds the time range, so that the JSON is read from the picked rows' row groups only (one
# scan with `run_id = ... OR parent_call_id IN ...` read the JSON of every row: 1.3 s against
# 0.2 s over 1,000,000 events).
_RUN_EVENTS = f"""
{_RUN_CALLS.rstrip()},
picked AS (
    SELECT event_id, time FROM events WHERE run_id = $run_id AND ($tenant IS NULL OR tenant = $tenant)
    UNION ALL
    SELECT e.event_id, e.time
    FROM events e JOIN (SELECT DISTINCT call_id FROM run_calls) c ON e.parent_call_id = c.call_id
    WHERE e.run_id IS DISTINCT FROM $run_id AND ($tenant IS NULL OR e.tenant = $tenant)
)
SELECT e.time, e.type, e.seq, e.producer_id, e.gate, e.workflow, e.agent, e.tool, e.call_id, e.parent_call_id,
       e.run_id, e.thread_id, e.tenant, e.principal,
       coalesce(e.decided_by, json_extract_string(e.event, '$.decided_by')) AS decided_by,
       e.outcome,
       coalesce(e.message, json_extract_string(e.event, '$.reason')) AS message,
       e.duration_ms,
       CASE WHEN e.type = 'TurnDecision' THEN CAST(json_extract(e.event, '$.turn') AS INTEGER) END AS turn,
       CASE WHEN e.type = 'TurnDecision' THEN json_extract_string(e.event, '$.decision') END AS turn_decision,
       CASE WHEN e.type = 'TurnDecision' THEN CAST(json_extract(e.event, '$.message_count') AS INTEGER) END
           AS message_count,
       CASE WHEN e.type = 'ApprovalResolved' THEN json_extract_string(e.event, '$.by') END AS approved_by,
       CASE WHEN e.type = 'ApprovalResolved' THEN json_extract_string(e.event, '$.note') END AS note,
       json_extract(e.event, '$.decisions') AS decisions,
       json_extract(e.event, '$.args') AS args,
       e.shadow_outcome, e.divergent, e.trace_id, e.event_id
FROM events e
WHERE e.event_id IN (SELECT event_id FROM picked)
  AND e.time >= (SELECT min(time) FROM picked) AND e.time <= (SELECT max(time) FROM picked)
ORDER BY e.time, e.producer_id, e.seq
LIMIT $limit OFFSET $offset
"""  # noqa: S608 (composed of module constants only; values are bound parameters)

# The page of runs first (on the narrow columns, newest last event first), then only their events
# are read for the counts.
_RUNS = f"""
WITH page AS (
    SELECT run_id, max(time) AS last_time
    FROM events
    WHERE run_id IS NOT NULL AND {_WINDOW}
      AND ($run_id IS NULL OR starts_with(run_id, $run_id))
      AND ($run_ids IS NULL OR run_id IN (SELECT unnest(from_json($run_ids, '["VARCHAR"]'))))
      AND ($principal IS NULL OR principal = $principal)
      AND ($thread_id IS NULL OR thread_id = $thread_id)
      AND ($tenant IS NULL OR tenant = $tenant)
    GROUP BY run_id
    ORDER BY last_time DESC, run_id
    LIMIT $limit OFFSET $offset
),
run_rows AS (
    SELECT e.run_id, e.time, e.type, e.gate, e.agent, e.tenant, e.principal, e.thread_id
    FROM events e JOIN page p USING (run_id)
    WHERE ($tenant IS NULL OR e.tenant = $tenant)
),
-- The turn decisions' JSON apart, on a constant type filter: then only those rows' JSON is read
-- (in run_rows it was read for every event: 0.9 s against 0.1 s over 1,000,000 events).
turns AS (
    SELECT e.run_id, json_extract_string(e.event, '$.decision') AS turn_decision
    FROM events e
    WHERE e.type = 'TurnDecision' AND e.run_id IN (SELECT run_id FROM page) AND ($tenant IS NULL OR e.tenant = $tenant)
),
stopped AS (
    SELECT run_id,
           count(*) FILTER (WHERE turn_decision IN ('deny', 'error')) AS turns_denied,
           count(*) FILTER (WHERE turn_decision = 'substitute') AS turns_substituted
    FROM turns
    GROUP BY run_id
),
counted AS (
    SELECT run_id,
           arg_min(tenant, time) AS tenant,
           arg_min(principal, time) AS principal,
           arg_min(thread_id, time) AS thread_id,
           arg_min(gate, time) AS gate,
           list(DISTINCT agent ORDER BY agent) FILTER (WHERE agent IS NOT NULL) AS agents,
           min(time) AS started_at,
           max(time) AS last_time,
           count(*) AS events,
           count(*) FILTER (WHERE type = 'TurnDecision') AS turns,
           count(*) FILTER (WHERE type IN ({_OUTCOMES})) AS calls,
           count(*) FILTER (WHERE type = 'ToolUse') AS allowed,
           count(*) FILTER (WHERE type = 'ToolDenied') AS denied,
           count(*) FILTER (WHERE type = 'Substitute') AS substituted,
           count(*) FILTER (WHERE type = 'Blocked') AS blocked,
           count(*) FILTER (WHERE type = 'ApprovalRequested') AS approvals_asked
    FROM run_rows
    GROUP BY run_id
)
SELECT run_id, tenant, principal, thread_id, gate, agents, started_at, last_time, events, turns, calls,
       allowed, denied, substituted, blocked, approvals_asked,
       CASE WHEN blocked > 0 THEN 'blocked'
            WHEN coalesce(turns_denied, 0) > 0 THEN 'turn_denied'
            WHEN coalesce(turns_substituted, 0) > 0 THEN 'turn_substituted'
            WHEN denied > 0 THEN 'had_denials'
            ELSE 'clean' END AS outcome
FROM counted LEFT JOIN stopped USING (run_id)
ORDER BY last_time DESC, run_id
"""  # noqa: S608 (composed of module constants only; values are bound parameters)


def _query(
    name: str, description: str, sql: str, params: Mapping[str, Param], *, scope: QueryScope
) -> tuple[str, NamedQuery]:
    return name, NamedQuery(name, description, sql, dict(params), scope=scope)


QUERIES: Final[dict[str, NamedQuery]] = dict(
    [
        _query(
            "blocked_attempts",
            "Denied and blocked calls, newest first, with who, what tool, which interceptor and the message.",
            _BLOCKED_ATTEMPTS,
            {**_BLOCKED_PARAMS, **PAGE},
            scope="tenant",
        ),
        _query(
            "blocked_attempts_count",
            "How many calls the filters of blocked_attempts match: all, denied, blocked, first and last time.",
            _BLOCKED_ATTEMPTS_COUNT,
            _BLOCKED_PARAMS,
            scope="tenant",
        ),
        _query(
            "decision_trends",
            "Events per time bucket and type, newest bucket first.",
            _DECISION_TRENDS,
            {
                "since": SINCE,
                "until": UNTIL,
                "bucket_minutes": Param("int", "Bucket width in minutes.", default=1, minimum=1, maximum=10080),
                "bucket_seconds": BUCKET_SECONDS,
                "tenant": TENANT,
                **PAGE,
            },
            scope="tenant",
        ),
        _query(
            "denial_rate",
            "Share of calls denied or blocked per bucket, by tool or tenant (of that tool's or tenant's calls), "
            "or by interceptor or policy rule (of all calls in the bucket); newest bucket first, highest rate first.",
            _DENIAL_RATE,
            {
                "since": SINCE,
                "until": UNTIL,
                "bucket_minutes": Param("int", "Bucket width in minutes.", default=60, minimum=1, maximum=10080),
                "bucket_seconds": BUCKET_SECONDS,
                "by": Param(
                    "str",
                    "Rate per tool, tenant, interceptor or policy rule.",
                    default="tool",
                    choices=("tool", "tenant", "interceptor", "rule"),
                ),
                "tenant": TENANT,
                **PAGE,
            },
            scope="tenant",
        ),
        _query(
            "top_denied",
            "Who or what is denied most: denied and blocked calls grouped by tool, tenant, principal, agent or "
            "deciding interceptor.",
            _TOP_DENIED,
            {
                "since": SINCE,
                "until": UNTIL,
                "by": Param(
                    "str",
                    "What to group by.",
                    default="tool",
                    choices=("tool", "tenant", "principal", "agent", "decided_by"),
                ),
                "tenant": TENANT,
                "type": _BLOCKED_PARAMS["type"],
                "limit": Param("int", "How many rows at most.", default=10, minimum=1, maximum=MAX_LIMIT),
                "offset": OFFSET,
            },
            scope="tenant",
        ),
        _query(
            "call_detail",
            "Every event of one call (approval, outcome, an unmediated use during it) and of the calls it made "
            "as an agent used as a tool: decision trail, redacted args, redacted paths, trace id, and what its "
            "shadow decisions would have done (outcome events), and each event as stored (`stored_event`, JSON text).",
            _CALL_DETAIL,
            {"call_id": Param("str", "The call's id.", required=True), "tenant": TENANT, **PAGE},
            scope="tenant",
        ),
        _query(
            "unmediated",
            "Uses of guarded clients outside a mediated call of their tools, newest first.",
            _UNMEDIATED,
            {
                "since": SINCE,
                "until": UNTIL,
                "tenant": TENANT,
                "tool": Param("str", "Only clients bound to this tool."),
                **PAGE,
            },
            scope="tenant",
        ),
        _query(
            "unmediated_count",
            "How many unmediated uses the filters match (what a CI job asserts to be zero).",
            _UNMEDIATED_COUNT,
            {
                "since": SINCE,
                "until": UNTIL,
                "tenant": TENANT,
                "tool": Param("str", "Only clients bound to this tool."),
            },
            scope="tenant",
        ),
        _query(
            "registered_tools",
            "Tools as registered per scope (ToolsRegistered events): latest schema hash and interceptor chain, "
            "how often registered and with how many schemas.",
            _REGISTERED_TOOLS,
            {"gate": Param("str", "Only this gate."), "agent": Param("str", "Only this agent scope."), **PAGE},
            scope="global",
        ),
        _query(
            "exercised_tools",
            "Tools seen in outcome events per scope: calls, ran, ok, denied, substituted, blocked, and whether "
            "the scope registered the tool.",
            _EXERCISED_TOOLS,
            {"since": SINCE, "until": UNTIL, "gate": Param("str", "Only this gate."), "tenant": TENANT, **PAGE},
            scope="tenant",
        ),
        _query(
            "chain_breaks",
            "Recorded integrity problems (gaps, tampering, conflicts), newest first.",
            _CHAIN_BREAKS,
            {
                "producer_id": Param("str", "Only this producer (gate instance)."),
                "kind": Param(
                    "str",
                    "Only this kind.",
                    choices=(
                        "gap",
                        "tamper",
                        "conflict",
                        "bad_signature",
                        "unknown_key",
                        "root_mismatch",
                        "inconsistent",
                        "unsigned",
                        "uncovered",
                        "silent",
                        "truncated",
                    ),
                ),
                "since": Param("datetime", "Only breaks recorded at or after this time."),
                **PAGE,
            },
            scope="global",
        ),
        _query(
            "chain_status",
            "Per producer: highest seq, stored events, seqs missing now, recorded gaps, tampering and conflicts, "
            "ok; broken producers first.",
            _CHAIN_STATUS,
            {
                "producer_id": Param("str", "Only this producer (gate instance)."),
                "only_broken": Param("bool", "Only producers with something wrong.", default=False),
                "since": Param("datetime", "Only producers that wrote an event at or after this time."),
                "until": Param("datetime", "Only producers that wrote an event before this time."),
                **PAGE,
            },
            scope="global",
        ),
        _query(
            "dead_letters",
            "Records that were not events, per reason: how many, when, and the latest one's error and text.",
            _DEAD_LETTERS,
            {
                "since": Param("datetime", "Only dead letters received at or after this time."),
                "until": Param("datetime", "Only dead letters received before this time."),
                "topic": Param("str", "Only this Kafka topic."),
                **PAGE,
            },
            scope="global",
        ),
        _query(
            "dead_letter_records",
            "The dead letters themselves, newest first: position, reason, error, key and the start of the value.",
            _DEAD_LETTER_RECORDS,
            {
                "since": Param("datetime", "Only dead letters received at or after this time."),
                "until": Param("datetime", "Only dead letters received before this time."),
                "topic": Param("str", "Only this Kafka topic."),
                "reason": Param(
                    "str",
                    "Only this reason.",
                    # consumers.store.DEAD_LETTER_REASONS (tests/consumers/test_store.py checks they agree).
                    choices=(
                        "no_value",
                        "oversize",
                        "not_utf8",
                        "not_json",
                        "not_an_event",
                        "unknown_type",
                        "newer_schema",
                        "invalid",
                        "envelope_mismatch",
                        "error",
                    ),
                ),
                **PAGE,
            },
            scope="global",
        ),
        _query(
            "event_counts",
            "Events per type in [since, until) and in the window of the same length just before "
            "(defaults: the last hour and the hour before).",
            _EVENT_COUNTS,
            {"since": SINCE, "until": UNTIL, "tenant": TENANT},
            scope="tenant",
        ),
        _query(
            "pipeline_health",
            "Per Kafka partition the committed offset, with the store's last event and ingest times, events "
            "per minute recently, dead letters and chain breaks.",
            _PIPELINE_HEALTH,
            {
                "minutes": Param(
                    "int", "What 'recently' means, in minutes of ingest time.", default=15, minimum=1, maximum=1440
                )
            },
            scope="global",
        ),
        _query(
            "new_denial_reasons",
            "Denial and block reasons (messages with ids and numbers masked) first seen in the window "
            "(default: the last 24 hours), newest first.",
            _NEW_DENIAL_REASONS,
            {
                "since": SINCE,
                "until": UNTIL,
                "decided_by": _BLOCKED_PARAMS["decided_by"],
                "tenant": TENANT,
                **PAGE,
            },
            scope="tenant",
        ),
        # -- coverage
        _query(
            "coverage_summary",
            "One row for the coverage check: events and producers in the window, broken producer chains, missing "
            "seqs, tampering, conflicts, unmediated uses, tool uses and dead letters.",
            _COVERAGE_SUMMARY,
            {"since": SINCE, "until": UNTIL},
            scope="global",
        ),
        _query(
            "tool_use_verification",
            "ToolUse events in the window: how many, and how many are not verified (their producer's chain is "
            "broken, their scope never registered the tool, or their trail lacks a registered interceptor).",
            _TOOL_USE_VERIFICATION,
            {"since": SINCE, "until": UNTIL},
            scope="global",
        ),
        _query(
            "unverified_tool_uses",
            "ToolUse events that are not verified, newest first, with the problem and the missing interceptors.",
            _UNVERIFIED_TOOL_USES,
            {
                "since": SINCE,
                "until": UNTIL,
                "problem": Param(
                    "str",
                    "Only this problem.",
                    choices=("chain_not_verified", "not_registered", "incomplete_trail"),
                ),
                **PAGE,
            },
            scope="global",
        ),
        _query(
            "tool_exercise",
            "Per gate and tool registered anywhere: the scopes that registered it and whether it was called "
            "through the gate in the window; unexercised tools first.",
            _TOOL_EXERCISE,
            {
                "since": SINCE,
                "until": UNTIL,
                "gate": Param("str", "Only this gate."),
                "only_unexercised": Param("bool", "Only tools never called through the gate.", default=False),
                **PAGE,
            },
            scope="global",
        ),
        # -- dashboard
        _query(
            "overview_counts",
            "Headline figures in [since, until) and in the window of the same length before (default: the "
            "last hour): calls, allowed, denied, substituted, blocked, approvals asked and refused, "
            "unmediated uses, chain breaks recorded; one row per metric.",
            _OVERVIEW_COUNTS,
            {"since": SINCE, "until": UNTIL, "tenant": TENANT},
            scope="tenant",
        ),
        _query(
            "ingest_lag",
            "Per stored Kafka partition: the committed offset, when it moved, and the delay from decision to "
            "store (median, p95, max seconds) of what was ingested recently.",
            _INGEST_LAG,
            {
                "minutes": Param(
                    "int", "What 'recently' means, in minutes of ingest time.", default=15, minimum=1, maximum=10080
                )
            },
            scope="global",
        ),
        # -- shadow mode and replay
        _query(
            "shadow_impact",
            "What shadow decisions would have done: per deciding shadow interceptor or policy file "
            "(shadow_decided_by, null when the enforced chain decided the shadow outcome too) and rule, tool and "
            "tenant, the calls with a shadow outcome, how many it would have denied, blocked, substituted or sent "
            "to a human (would_ask), how many differ from what happened (divergent), first and last time; most "
            "divergent first.",
            _SHADOW_IMPACT,
            {**_SHADOW_PARAMS, **PAGE},
            scope="tenant",
        ),
        _query(
            "shadow_divergence",
            "Calls with a shadow outcome, and how many of them diverge from what happened, per time bucket and "
            "shadow decider and rule; newest bucket first.",
            _SHADOW_DIVERGENCE,
            {
                **_SHADOW_PARAMS,
                "bucket_minutes": Param("int", "Bucket width in minutes.", default=60, minimum=1, maximum=10080),
                "bucket_seconds": BUCKET_SECONDS,
                **PAGE,
            },
            scope="tenant",
        ),
        _query(
            "shadow_calls",
            "The calls behind shadow_impact, newest first: what happened (type, decided_by, message), what the "
            "shadow decisions would have done (shadow_outcome, divergent, shadow_decided_by, shadow_rule), and who.",
            _SHADOW_CALLS,
            {
                **_SHADOW_PARAMS,
                "principal": _BLOCKED_PARAMS["principal"],
                "divergent_only": Param("bool", "Only calls whose shadow outcome differs.", default=False),
                "shadow_outcome": Param(
                    "str",
                    "Only this shadow outcome.",
                    choices=("allowed", "denied", "blocked", "substituted", "approval"),
                ),
                **PAGE,
            },
            scope="tenant",
        ),
        _query(
            "replay_calls",
            _REPLAY_CALLS_DESCRIPTION,
            _REPLAY_CALLS,
            {
                "since": SINCE,
                "until": UNTIL,
                "gate": Param("str", "Only this gate."),
                "workflow": Param("str", "Only this workflow."),
                "agent": Param("str", "Only this agent scope."),
                "tool": Param("str", "Only this tool."),
                "tenant": TENANT,
                "after_time": Param(
                    "datetime", "The cursor: only calls after the row with this time (the last row's `time`)."
                ),
                "after_event_id": Param(
                    "str",
                    "The cursor's second half: the last row's `event_id` (rows at `after_time` with a larger "
                    "event_id come next). Without it, only rows strictly after `after_time`.",
                    requires="after_time",
                ),
                "limit": Param("int", "How many rows at most.", default=MAX_LIMIT, minimum=1, maximum=MAX_REPLAY_LIMIT),
            },
            scope="tenant",
        ),
        _query(
            "inclusion_material",
            "What an inclusion proof of one event is built from (callgate verify, consumers.proofs): a row `event` "
            "(the event's stored text), a row `checkpoint` (its producer's latest Checkpoint covering it), the rows "
            "`node` (level, idx, hash) of the store's tree index the audit path needs, and the rows `leaf` (seq, "
            "hash) of at most two blocks of 256 events. O(log n) rows.",
            _INCLUSION_MATERIAL,
            {"event_id": Param("str", "The event's id (no rows without it).")},
            scope="global",
        ),
        _query(
            "producer_signatures",
            "Per producer with events in the window (callgate coverage --require-signed): signed (it has a valid "
            "signed checkpoint from a trusted key), its last valid checkpoint (signed_tree_size, checkpoint_seq, "
            "checkpoint_event_id, checkpoint_time), and breaks: every checkpoint chain break recorded for it (kind "
            "bad_signature, unknown_key, root_mismatch, inconsistent, unsigned, uncovered, silent or truncated, with "
            "seq and detail); ok when signed without breaks. Failing producers first.",
            _PRODUCER_SIGNATURES,
            {
                "since": SINCE,
                "until": UNTIL,
                "only_failing": Param("bool", "Only producers that are not ok.", default=False),
                **PAGE,
            },
            scope="global",
        ),
        # -- the read API's access log
        _query(
            "access_log",
            "Who read what through the read API, newest first: subject, roles, query, params (as run, a tenant "
            "token's tenant bound), status (200, or 400 / 403 / 404 for a refused query, 401 with no subject for "
            "a caller without a valid token), row_count, duration_ms.",
            _ACCESS_LOG,
            {
                "since": SINCE,
                "until": UNTIL,
                "subject": Param("str", "Only what this subject (a token's subject, a JWT's sub) asked."),
                "query_name": Param("str", "Only this named query."),
                "status": Param("int", "Only this HTTP status.", minimum=100, maximum=599),
                **PAGE,
            },
            scope="admin",
        ),
        # -- runs (the dashboard's Run page)
        _query(
            "run_events",
            "Every event of one agent run in order (time, producer, seq): its turn decisions (turn, turn_decision, "
            "decided_by, message: the reason, message_count), its calls' approvals (approved_by, note) and outcomes "
            "with their decision trails and redacted args, and the events of agents nested under its calls that "
            "run under a run id of their own (their parent_call_id is a call of this run, at any depth). No rows "
            "without run_id.",
            _RUN_EVENTS,
            {
                "run_id": Param("str", "The run's id (no rows without it)."),
                "call_ids": Param(
                    "ids",
                    "The calls nested events are picked under (default: this store's own calls of the run and "
                    "of what is nested under them).",
                ),
                "tenant": TENANT,
                **PAGE,
            },
            scope="tenant",
        ),
        _query(
            "runs",
            "Agent runs with an event in [since, until), newest last event first: tenant, principal, thread_id, "
            "gate, agents, started_at, last_time, events, turns, calls, allowed, denied, substituted, blocked, "
            "approvals_asked (over all the run's events) and outcome: blocked (a call was blocked, which stops "
            "the run), turn_denied (a before-turn interceptor denied or failed), turn_substituted, had_denials "
            "(calls were denied, the run went on) or clean.",
            _RUNS,
            {
                "since": SINCE,
                "until": UNTIL,
                "run_id": Param("str", "Only runs whose id starts with this text."),
                "run_ids": Param(
                    "ids",
                    'Only these runs: a JSON list of run ids (["r-1", "r-2"]).',
                ),
                "principal": _BLOCKED_PARAMS["principal"],
                "thread_id": Param("str", "Only runs of this conversation thread."),
                "tenant": TENANT,
                **PAGE,
            },
            scope="tenant",
        ),
        _query(
            "merkle_material",
            "What this store holds of the RFC 6962 tree of one producer's leaves [lo, hi) (seqs lo + 1 .. hi): "
            "kind 'node' rows (level, idx, hash) for the indexed subtrees of level 8 and above inside the range "
            "whose parent is not, kind 'leaf' rows (seq, hash: the event hash) for the seqs of the range's edge "
            "blocks of 256: what an outside verifier recomputes a checkpoint's root from.",
            _MERKLE_MATERIAL,
            {
                "producer_id": Param("str", "The producer (gate instance; no rows without it)."),
                "lo": Param("int", "The range's first leaf (0-based: seq lo + 1).", default=0, minimum=0),
                "hi": Param("int", "One past the range's last leaf (seq hi; no rows without it).", minimum=1),
                **PAGE,
            },
            scope="global",
        ),
    ]
)
"""Every query a reader may run, by name."""


# -- approvals: durable requests and their decisions ------------------------------------------------
# A request is pending while it has an ApprovalRequested, no ApprovalResolved of the same approval id
# that decides it and its expires_at lies ahead. In a store given the desk's keys, an ApprovalResolved
# no desk key signed is flagged in decided_by (consumers.store.UNVERIFIED_DECISION): it decides only
# when the producer that asked wrote it (the gate's own answer), and is listed by unverified_decisions.
# A request asked again (the same call resumed in another process) repeats its approval id: the
# first ask's time and expiry stand.

_APPROVAL_REQUESTS = """
WITH requested AS (
    SELECT json_extract_string(event, '$.approval_id') AS approval_id,
           arg_min(event_id, time) AS event_id,
           min(time) AS requested_at,
           arg_min(CAST(json_extract_string(event, '$.expires_at') AS TIMESTAMPTZ), time) AS expires_at,
           -- Read once into a struct: a json_extract per column parsed the JSON again each
           -- time and, over thousands of requests, ran out of the store's memory.
           arg_min(json_transform(event, '{
               "gate": "VARCHAR", "workflow": "VARCHAR", "agent": "VARCHAR", "tool": "VARCHAR",
               "call_id": "VARCHAR", "run_id": "VARCHAR", "tenant": "VARCHAR", "principal": "VARCHAR",
               "reason": "VARCHAR", "rule": "VARCHAR", "policy_version": "VARCHAR",
               "args_digest": "VARCHAR", "requested_by": "JSON", "args": "JSON"}'), time) AS f
    FROM events
    WHERE type = 'ApprovalRequested' AND json_extract_string(event, '$.approval_id') IS NOT NULL
      AND ($tenant IS NULL OR tenant = $tenant)
    GROUP BY 1
),
resolved AS (
    SELECT json_extract_string(d.event, '$.approval_id') AS approval_id,
           arg_min(d.event, d.time) AS event,
           min(d.time) AS resolved_at
    FROM events d
    WHERE d.type = 'ApprovalResolved' AND json_extract_string(d.event, '$.approval_id') IS NOT NULL
      AND (d.decided_by IS NULL OR EXISTS (
          SELECT 1 FROM events q
          WHERE q.type = 'ApprovalRequested' AND q.producer_id = d.producer_id
            AND json_extract_string(q.event, '$.approval_id') = json_extract_string(d.event, '$.approval_id')))
    GROUP BY 1
)
SELECT r.approval_id,
       CASE
           WHEN d.approval_id IS NOT NULL AND json_extract(d.event, '$.approved')::BOOLEAN THEN 'approved'
           WHEN d.approval_id IS NOT NULL AND json_extract_string(d.event, '$.error') IS NOT NULL THEN 'expired'
           WHEN d.approval_id IS NOT NULL THEN 'denied'
           WHEN r.expires_at IS NOT NULL AND r.expires_at <= now() THEN 'expired'
           ELSE 'pending'
       END AS status,
       r.requested_at, r.expires_at,
       r.f.gate AS gate,
       r.f.workflow AS workflow,
       r.f.agent AS agent,
       r.f.tool AS tool,
       r.f.call_id AS call_id,
       r.f.run_id AS run_id,
       r.f.tenant AS tenant,
       r.f.principal AS principal,
       r.f.reason AS reason,
       r.f.requested_by AS requested_by,
       r.f.rule AS rule,
       r.f.policy_version AS policy_version,
       r.f.args_digest AS args_digest,
       r.f.args AS args,
       d.resolved_at,
       json_extract_string(d.event, '$.by') AS decided_by,
       json_extract_string(d.event, '$.note') AS note,
       json_extract_string(d.event, '$.error') AS error,
       r.event_id,
       d.event AS decision,
       c.claimed_at, c.claimant, c.claimed_by
FROM requested r LEFT JOIN resolved d USING (approval_id)
LEFT JOIN (
    SELECT approval_id, min(claimed_at) AS claimed_at, arg_min(claimant, claimed_at) AS claimant,
           arg_min(subject, claimed_at) AS claimed_by
    FROM approval_claims GROUP BY approval_id
) c USING (approval_id)
"""

_PENDING_APPROVALS = f"""
SELECT * FROM ({_APPROVAL_REQUESTS})
WHERE status = 'pending'
ORDER BY requested_at DESC, approval_id
LIMIT $limit OFFSET $offset
"""  # noqa: S608 (composed of module constants only; values are bound parameters)

_APPROVAL_REQUEST = f"""
SELECT * FROM ({_APPROVAL_REQUESTS})
WHERE approval_id = $approval_id
LIMIT $limit OFFSET $offset
"""  # noqa: S608 (composed of module constants only; values are bound parameters)

_APPROVAL_ID = Param("str", "The request's approval id (32 hex; no rows without it).")

_UNVERIFIED_DECISIONS = """
SELECT d.time, d.event_id, json_extract_string(d.event, '$.approval_id') AS approval_id,
       json_extract(d.event, '$.approved')::BOOLEAN AS approved,
       json_extract_string(d.event, '$.by') AS by,
       d.decided_by AS problem, d.producer_id, d.seq, d.tool, d.call_id, d.tenant,
       d.kafka_topic, d.kafka_partition, d.kafka_offset, d.event
FROM events d
WHERE d.type = 'ApprovalResolved' AND d.decided_by IS NOT NULL
  AND ($tenant IS NULL OR d.tenant = $tenant)
  AND NOT EXISTS (
      SELECT 1 FROM events q
      WHERE q.type = 'ApprovalRequested' AND q.producer_id = d.producer_id
        AND json_extract_string(q.event, '$.approval_id') = json_extract_string(d.event, '$.approval_id'))
ORDER BY d.time DESC, d.event_id
LIMIT $limit OFFSET $offset
"""

QUERIES.update(
    [
        _query(
            "pending_approvals",
            "Approval requests waiting for a reviewer (requested, neither decided nor expired), newest first: "
            "tool, redacted args, reason, rule, policy version, principal, tenant, run and expiry.",
            _PENDING_APPROVALS,
            {"tenant": TENANT, **PAGE},
            scope="tenant",
        ),
        _query(
            "approval_request",
            "One approval request by its id, with its status (pending, approved, denied, expired), what it "
            "asks and, once decided, who decided, when and with what note, the deciding ApprovalResolved "
            "event itself (decision: what a gate polling the read API checks the binding of) and, once an "
            "approved call was run, its claim: when (claimed_at), by which gate (claimant) and token subject "
            "(claimed_by).",
            _APPROVAL_REQUEST,
            {"approval_id": _APPROVAL_ID, "tenant": TENANT, **PAGE},
            scope="tenant",
        ),
        _query(
            "unverified_decisions",
            "Decisions refused as evidence, newest first: ApprovalResolved events that no desk key signed "
            "(stored by a materializer given the desk's public key) and that the gate which asked did not "
            "write, so they decided nothing: the approval id, approved, by, why (problem), the producer "
            "and Kafka position, and the event itself.",
            _UNVERIFIED_DECISIONS,
            {"tenant": TENANT, **PAGE},
            scope="tenant",
        ),
    ]
)
