"""One read API over several shards: `FederatedRunner`, the `QueryRunner` behind `callgate serve`.

Scaling the materializer out gives several stores, one per materializer of a consumer group, each with
its own read API (a shard). `FederatedRunner` answers the same named queries over all of them: it checks
the parameters itself, asks every shard in parallel (httpx, with serve's own bearer token for the shards)
and merges the answers as the query declares (`consumers.queries.Merge`):

- "page": each shard's first offset + limit rows (paged through the shard's own limit), merge-sorted by
  the query's order, then cut to the page asked: a deep offset over the merged order is exact.
- "cursor": every shard answers the same cursor; the rows merge-sorted and cut to `limit`.
- "groups": rows of equal keys combined column by column (counts add, first/last times are the
  earliest/latest, samples come from the newest row), ratios computed again from the summed parts,
  sorted and paged. Each shard gives its first offset + limit groups when the order is on the keys
  alone, else every group (a top-k over summed counts needs every shard's count of every key).
- "lookup": the rows of the shard that has them.
- "custom": a function here, named after the query (`_CUSTOM`): chains stitched per producer across
  shards (`chain_status`, `chain_breaks`, `coverage_summary`, ...), distinct counts recounted from
  helper queries (`denial_reason_tenants`, `tool_schemas`), counts that one shard's answer hides.
- "not_federatable": 501 with the declaration's reason.

A producer's chain may be split over shards (a partition handed from one materializer to another): its
first seqs in one store, the rest in another. Each shard then sees a hole where the other holds the
events; the federation adds the events of every shard, takes the highest seq, and drops a recorded gap at
a seq another shard holds. With the shards' `chain_segments` query (first seq and its prev_hash, last seq
and its hash, holes inside, per producer) the seqs each shard holds are exact and the links between the
shards' segments are checked; without it a shard is taken to hold every seq up to its highest but the
gaps it recorded.

Never a silently partial answer: a shard that cannot be reached, times out or fails makes the query fail
with 503 naming the shard (`ShardUnavailableError`); a shard that refuses serve's token or the query is a
502 naming it. `health()` says per shard whether it is reachable.

Tool uses are judged per producer across shards too (`tool_use_verification`, `unverified_tool_uses`,
`tool_use_judgements`): a split producer's ToolUses are judged again against its chain stitched over the
shards and the registrations every shard holds of it (`producer_tool_chains`), as one store of all the
events judges them, so a ToolsRegistered in one shard verifies the calls stored in another.

A signed producer's checkpoint that a shard could not check for lack of the seqs another shard holds is
`truncated` there; serve checks its root over the shards' trees (`merkle_material`, `_checkpoint_roots`):
verified, it is no break; contradicted, a `root_mismatch`. A shard's `unsigned`, `uncovered` and `silent`
rows of a split producer that another shard's checkpoints answer are dropped (`_signing_break_stands`).

`runs` counts each run of the page again on every shard that did not list it (`_runs`); `run_events`
follows a run's nesting over every shard (`_run_events`).
"""

from __future__ import annotations

import json
import logging
import math
import ssl
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any, Final, TypeVar

import httpx

from consumers.api import RunnerError
from consumers.archive import ARCHIVE_PARAM
from consumers.queries import INCLUDE_ARCHIVE, QUERIES, RUN_GROUPS, Merge, NamedQuery, _coerce, describe_queries
from events.merkle import leaf_hash, node_hash
from events.models import OUTCOME_TYPES

__all__ = [
    "FederatedRunner",
    "FederationHealth",
    "Shard",
    "ShardHealth",
    "ShardRefusedError",
    "ShardUnavailableError",
    "held_seqs",
    "stitch_segments",
]

log = logging.getLogger(__name__)

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_PAGE_CAP: Final = 1000
"""Rows asked of a shard per request when paging through it (the named queries' usual maximum)."""
_WAVE: Final = 4
"""Pages asked of one shard at once when every row is needed."""

T = TypeVar("T")
Row = dict[str, Any]


class ShardUnavailableError(RunnerError):
    """A shard could not answer (unreachable, timed out, 5xx): the read API answers 503 naming it."""

    def __init__(self, shard: str, reason: str) -> None:
        super().__init__(f"shard {shard} is unavailable: {reason}; no partial answer is given", status_code=503)
        self.shard = shard


class ShardRefusedError(RunnerError):
    """A shard refused serve's request (its token, or a query it does not know): 502 naming it."""

    def __init__(self, shard: str, reason: str) -> None:
        super().__init__(f"shard {shard} refused the request: {reason}", status_code=502)
        self.shard = shard


@dataclass(frozen=True, slots=True)
class Shard:
    """One shard: a materializer's read API (`url`, http(s)://HOST:PORT) and the bearer token serve
    reads it with (None: no header; the token's roles bound what serve can read)."""

    url: str
    token: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        parsed = httpx.URL(self.url)
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise ValueError(f"a shard's URL must look like http://HOST:PORT, got {self.url!r}")


@dataclass(frozen=True, slots=True)
class ShardHealth:
    """One shard as serve's `/healthz` reports it."""

    url: str
    reachable: bool
    status: str | None = None
    """The shard's own `/healthz` status ("ok" or "unavailable"), when it answered."""
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"url": self.url, "reachable": self.reachable, "status": self.status, "detail": self.detail}


@dataclass(frozen=True, slots=True)
class FederationHealth:
    """serve's `/healthz`: ok when every shard is reachable (its own health is shown, not required:
    a materializer lagging behind still answers reads)."""

    shards: tuple[ShardHealth, ...]

    @property
    def ok(self) -> bool:
        return all(shard.reachable for shard in self.shards)

    def to_json(self) -> dict[str, Any]:
        down = [shard.url for shard in self.shards if not shard.reachable]
        detail = f"shards unreachable: {', '.join(down)}" if down else f"{len(self.shards)} shards reachable"
        return {
            "status": "ok" if self.ok else "unavailable",
            "detail": detail,
            "shards": [shard.to_json() for shard in self.shards],
        }


class FederatedRunner:
    """The named queries over several shards (see the module docstring). Implements
    `consumers.api.QueryRunner`; safe from several threads (one httpx client per shard, a thread pool
    for the fan-out). `run` blocks for the shards' answers; raises `UnknownQueryError` / `QueryError`
    before asking any shard, `ShardUnavailableError` (503) or `ShardRefusedError` (502) naming a shard,
    and `RunnerError` 501 for a query declared not federatable.

    `verify` is httpx's: True (the system's certificates), False, a CA bundle path or an SSL context.
    """

    def __init__(
        self,
        shards: Sequence[Shard],
        *,
        timeout_s: float = 30.0,
        verify: bool | str | ssl.SSLContext = True,
        max_workers: int | None = None,
    ) -> None:
        if not shards:
            raise ValueError("a federation needs at least one shard")
        urls = [shard.url.rstrip("/") for shard in shards]
        if len(set(urls)) != len(urls):
            raise ValueError(f"a shard is given twice: {sorted(u for u in urls if urls.count(u) > 1)[0]}")
        self.shards = tuple(Shard(url, shard.token) for url, shard in zip(urls, shards, strict=True))
        self.timeout_s = timeout_s
        self._clients = {
            shard.url: httpx.Client(
                base_url=shard.url,
                timeout=timeout_s,
                verify=verify,
                headers={"Accept": "application/json"}
                | ({"Authorization": f"Bearer {shard.token}"} if shard.token else {}),
            )
            for shard in self.shards
        }
        self._pool = ThreadPoolExecutor(max_workers or 4 * len(self.shards), thread_name_prefix="callgate-serve")
        # Pages are asked from inside the pool's tasks: a pool of their own, so they never wait for a free
        # worker held by the task waiting for them.
        self._pages = ThreadPoolExecutor(_WAVE * len(self.shards) * 2, thread_name_prefix="callgate-serve-page")
        self._closed = threading.Event()

    def close(self) -> None:
        """Close the shards' connections and the thread pool; idempotent."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._pages.shutdown(wait=False, cancel_futures=True)
        for client in self._clients.values():
            client.close()

    def __enter__(self) -> FederatedRunner:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- QueryRunner ------------------------------------------------------------------------------

    def names(self) -> list[dict[str, Any]]:
        """Every named query, as this code declares them (each shard must run the same release)."""
        return describe_queries()

    def run(self, name: str, params: Mapping[str, Any]) -> dict[str, Any]:
        """One named query over every shard, merged as it declares; see the class docstring."""
        query = QUERIES.get(name)
        if query is None:
            from consumers.queries import UnknownQueryError

            raise UnknownQueryError(f"unknown query {name!r}; known: {', '.join(sorted(QUERIES))}", query=name)
        given = dict(params)
        # Every query takes it besides its own parameters (consumers.archive): each shard reads its archive.
        archived = bool(_coerce(name, ARCHIVE_PARAM, INCLUDE_ARCHIVE, given.pop(ARCHIVE_PARAM, None)))
        bound = query.bind(given)
        merge = query.merge
        call = _Call(self, query, bound, archived=archived)
        match merge.kind:
            case "not_federatable":
                raise RunnerError(
                    f"query {name!r} cannot be answered over several shards: {merge.note}", status_code=501
                )
            case "page":
                columns, rows = call.page()
            case "cursor":
                columns, rows = call.cursor()
            case "groups":
                columns, rows = call.groups()
            case "lookup":
                columns, rows = call.lookup()
            case "custom":
                merger = _CUSTOM.get(name)
                if merger is None:
                    raise RunnerError(
                        f"query {name!r} declares a custom merge that serve does not have", status_code=501
                    )
                columns, rows = merger(call)
            case _:
                raise RunnerError(f"query {name!r}: unknown merge kind {merge.kind!r}", status_code=501)
        return {
            "query": name,
            "params": {k: _json_value(v) for k, v in bound.items()} | ({ARCHIVE_PARAM: True} if archived else {}),
            "columns": columns,
            "rows": rows,
        }

    def health(self) -> FederationHealth:
        """Every shard's `/healthz`, asked in parallel (a few seconds at most)."""

        def ask(shard: Shard) -> ShardHealth:
            try:
                response = self._clients[shard.url].get("/healthz", timeout=min(self.timeout_s, 5.0))
                body = response.json()
            except (httpx.HTTPError, ValueError) as exc:
                return ShardHealth(shard.url, False, detail=_reason(exc))
            status = body.get("status") if isinstance(body, dict) else None
            detail = body.get("detail", "") if isinstance(body, dict) else ""
            return ShardHealth(shard.url, True, str(status) if status is not None else None, str(detail))

        return FederationHealth(tuple(self._pool.map(ask, self.shards)))

    # -- asking shards ----------------------------------------------------------------------------

    def ask(self, shard: Shard, name: str, params: Mapping[str, Any]) -> Row:
        """One named query on one shard; its JSON answer. Raises the shard errors."""
        query = {key: _param_text(value) for key, value in params.items() if value is not None}
        try:
            response = self._clients[shard.url].get(f"/v1/queries/{name}", params=query)
        except httpx.HTTPError as exc:
            raise ShardUnavailableError(shard.url, _reason(exc)) from exc
        if response.status_code == 200:
            try:
                data = response.json()
            except ValueError as exc:
                raise ShardUnavailableError(shard.url, f"query {name!r} answered something that is not JSON") from exc
            if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
                raise ShardUnavailableError(shard.url, f"query {name!r} answered no rows")
            return data
        message = _error_text(response)
        if response.status_code in (401, 403):
            hint = "give serve a token of the shards with the admin role (--shard-token)"
            raise ShardRefusedError(
                shard.url, f"{response.status_code} to serve's token for {name!r} ({message}): {hint}"
            )
        if response.status_code in (400, 404):
            hint = "does it run the same callgate release as serve?"
            raise ShardRefusedError(shard.url, f"{response.status_code} to query {name!r} ({message}): {hint}")
        raise ShardUnavailableError(shard.url, f"{response.status_code} to query {name!r} ({message})")

    def each(self, work: Callable[[Shard], T]) -> list[T]:
        """`work(shard)` for every shard in parallel, in shard order; every shard that failed is named."""
        futures = [self._pool.submit(work, shard) for shard in self.shards]
        results: list[T] = []
        failures: list[RunnerError] = []
        for future in futures:
            try:
                results.append(future.result())
            except RunnerError as exc:
                failures.append(exc)
        if failures:
            if len(failures) == 1:
                raise failures[0]
            first = failures[0]
            others = ", ".join(getattr(f, "shard", "?") for f in failures[1:])
            raise RunnerError(f"{first} (and shards {others})", status_code=first.status_code) from first
        return results

    def each_indexed(self, work: Callable[[int, Shard], T]) -> list[T]:
        """`each` with the shard's index."""
        index = {shard.url: i for i, shard in enumerate(self.shards)}
        return self.each(lambda shard: work(index[shard.url], shard))

    def prefix(
        self, shard: Shard, query: NamedQuery, params: Mapping[str, Any], n: float
    ) -> tuple[list[str], list[Row]]:
        """The first `n` rows (math.inf: all) of `query` on `shard` in its own order, paged through its
        `limit` from offset 0; the columns and the rows."""
        spec = query.params.get("limit")
        if spec is None:
            data = self.ask(shard, query.name, params)
            return list(data["columns"]), list(data["rows"])
        cap = spec.maximum or _PAGE_CAP
        rows: list[Row] = []
        columns: list[str] = []
        while len(rows) < n:
            size = int(min(cap, n - len(rows)))
            # Past the first page of a long read, the next pages are asked at once: a shard answers each
            # with the whole query again, and waiting for them one by one added their times.
            wave = 1 if not rows or "offset" not in query.params else int(min(_WAVE, -(-(n - len(rows)) // cap)))
            asked = [
                {**params, "limit": size} | ({"offset": len(rows) + i * size} if "offset" in query.params else {})
                for i in range(wave)
            ]
            if wave == 1:
                answers = [self.ask(shard, query.name, asked[0])]
            else:
                futures = [self._pages.submit(self.ask, shard, query.name, page) for page in asked]
                answers = [future.result() for future in futures]
            short = False
            for data in answers:
                columns = list(data["columns"])
                page = list(data["rows"])
                rows.extend(page)
                if len(page) < size:
                    short = True
                    break
            if short or "offset" not in query.params:
                break
        return columns, rows[: int(n)] if n != math.inf else rows

    def gather(self, name: str, params: Mapping[str, Any], n: float = math.inf) -> tuple[list[str], list[list[Row]]]:
        """`prefix` of query `name` on every shard in parallel: the columns and each shard's rows."""
        query = QUERIES[name]
        answers = self.each(lambda shard: self.prefix(shard, query, params, n))
        columns = next((c for c, _ in answers if c), [])
        return columns, [rows for _, rows in answers]


class _Call:
    """One federated query: its spec, bound parameters and the shards' runner."""

    def __init__(self, runner: FederatedRunner, query: NamedQuery, bound: dict[str, Any], *, archived: bool) -> None:
        self.runner = runner
        self.archived = archived
        self.query = query
        self.bound = bound
        self.merge: Merge = query.merge
        self.fan = dict(bound)
        """The parameters sent to the shards (a pinned `until`, paging of their own)."""
        if self.merge.pin_until and "until" in self.fan and self.fan["until"] is None:
            self.fan["until"] = datetime.now(UTC)
        self.fan.pop("offset", None)
        self.fan.pop("limit", None)

    @property
    def wanted(self) -> float:
        """How many merged rows the page needs: offset + limit (all for a query without a limit)."""
        if "limit" not in self.bound:
            return math.inf
        return int(self.bound["limit"]) + int(self.bound.get("offset") or 0)

    def cut(self, rows: list[Row]) -> list[Row]:
        """The page asked of the merged, sorted rows."""
        if "limit" not in self.bound:
            return rows
        offset = int(self.bound.get("offset") or 0)
        return rows[offset : offset + int(self.bound["limit"])]

    def page(self) -> tuple[list[str], list[Row]]:
        columns, per_shard = self.gather(self.query.name, self.fan, self.wanted)
        return columns, self.cut(sort_rows([row for rows in per_shard for row in rows], self.merge.order))

    def cursor(self) -> tuple[list[str], list[Row]]:
        params = {**self.fan, "limit": self.bound["limit"]}
        params = self.with_archive(params)
        answers = self.runner.each(lambda shard: self.runner.ask(shard, self.query.name, params))
        columns = next((list(a["columns"]) for a in answers if a["columns"]), [])
        rows = sort_rows([row for a in answers for row in a["rows"]], self.merge.order)
        return columns, rows[: int(self.bound["limit"])]

    def groups(self) -> tuple[list[str], list[Row]]:
        keys_only = self.merge.prefix or (
            bool(self.merge.order) and all(_term(t)[0] in self.merge.keys for t in self.merge.order)
        )
        if keys_only:
            columns, per_shard = self.gather(self.query.name, self.fan, self.wanted)
        elif self.merge.order and _term(self.merge.order[0])[0] in self.merge.keys:
            columns, per_shard = self.leading(self.query.name, self.fan, self.merge.order[0])
        else:
            columns, per_shard = self.gather(self.query.name, self.fan)
        rows = combine(per_shard, self.merge, columns)
        return columns, self.cut(sort_rows(rows, self.merge.order) if self.merge.order else rows)

    def leading(self, name: str, params: Mapping[str, Any], term: str) -> tuple[list[str], list[list[Row]]]:
        """Every shard's rows of the groups that can make the page, for an order led by the key `term`
        (a time bucket) and followed by aggregates: each shard's first offset + limit rows; the boundary
        is the tightest value of the lead among the shards those rows did not exhaust (the merged page
        lies at or before it, since that shard alone has offset + limit groups up to it); the shards
        cut at the boundary are read on past it; then only the rows up to it are kept, each complete."""
        lead, descending, nulls_first = _term(term)
        query = QUERIES[name]
        n = self.wanted
        params = self.with_archive(params)
        columns, per_shard = self.runner.gather(name, params, n)
        last = [rows[-1].get(lead) for rows in per_shard if len(rows) >= n]
        if (
            n == math.inf
            or not last
            or nulls_first
            or any(v is None for rows in per_shard for v in (r.get(lead) for r in rows))
        ):
            return self.gather(name, params) if last else (columns, per_shard)
        boundary = max(last) if descending else min(last)

        def before(value: Any) -> bool:
            return bool(value > boundary) if descending else bool(value < boundary)

        def read_on(index: int, shard: Shard) -> list[Row]:
            rows = list(per_shard[index])
            if len(rows) < n or before(rows[-1][lead]) or rows[-1][lead] != boundary:
                return rows
            cap = query.params["limit"].maximum or _PAGE_CAP
            while True:
                page = self.runner.ask(shard, name, {**params, "limit": cap, "offset": len(rows)})["rows"]
                rows.extend(page)
                if len(page) < cap or page[-1][lead] != boundary:
                    return rows

        complete = self.runner.each_indexed(read_on)
        return columns, [[r for r in rows if r[lead] == boundary or before(r[lead])] for rows in complete]

    def lookup(self) -> tuple[list[str], list[Row]]:
        columns, per_shard = self.gather(self.query.name, self.fan, self.wanted)
        found = [rows for rows in per_shard if rows]
        if not found:
            return columns, []
        # A handoff may leave the event in two stores: the one holding its checkpoint can prove it.
        best = next((rows for rows in found if any(r.get("part") == "checkpoint" for r in rows)), found[0])
        return columns, self.cut(best)

    def prefix_without(
        self, name: str, params: Mapping[str, Any], n: float, producers: set[str]
    ) -> tuple[list[str], list[list[Row]]]:
        """Each shard's first `n` rows of query `name` whose `producer_id` is not among `producers` (paged
        on past the rows of those), in parallel; the columns and each shard's rows."""
        query = QUERIES[name]
        size = int(query.params["limit"].maximum or _PAGE_CAP)
        asked = self.with_archive(params)

        def kept(shard: Shard) -> tuple[list[str], list[Row]]:
            columns: list[str] = []
            read = 0
            rows: list[Row] = []
            while True:
                data = self.runner.ask(shard, name, {**asked, "limit": size, "offset": read})
                columns = list(data["columns"]) or columns
                page = list(data["rows"])
                read += len(page)
                rows.extend(r for r in page if r.get("producer_id") not in producers)
                if len(page) < size or len(rows) >= n:
                    return columns, rows[: int(n)] if n != math.inf else rows

        answers = self.runner.each(kept)
        return next((c for c, _ in answers if c), []), [rows for _, rows in answers]

    def gather(self, name: str, params: Mapping[str, Any], n: float = math.inf) -> tuple[list[str], list[list[Row]]]:
        """`FederatedRunner.gather` with this call's archive choice."""
        return self.runner.gather(name, self.with_archive(params), n)

    def with_archive(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """`params`, reading each shard's archive too when the call asked for it."""
        return {**params, ARCHIVE_PARAM: True} if self.archived else dict(params)


# -- merging ----------------------------------------------------------------------------------------


def _term(term: str) -> tuple[str, bool, bool]:
    """(column, descending, nulls first) of an order term: "-name", "name nulls first"."""
    text = term.strip()
    nulls_first = text.lower().endswith(" nulls first")
    if nulls_first:
        text = text[: -len(" nulls first")].strip()
    descending = text.startswith("-")
    return text.lstrip("-"), descending, nulls_first


def sort_rows(rows: Iterable[Row], order: Sequence[str]) -> list[Row]:
    """`rows` sorted as DuckDB's ORDER BY `order` would (NULLs last unless "nulls first"); stable."""
    out = list(rows)
    for term in reversed(order):
        column, descending, nulls_first = _term(term)
        present = [row for row in out if row.get(column) is not None]
        missing = [row for row in out if row.get(column) is None]
        present.sort(key=lambda row: _sort_key(row[column]), reverse=descending)
        out = missing + present if nulls_first else present + missing
    return out


def _sort_key(value: Any) -> Any:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, list | dict):
        return json.dumps(value, sort_keys=True, default=str)
    return value


def _key(row: Mapping[str, Any], keys: Sequence[str]) -> tuple[str, ...]:
    return tuple(json.dumps(row.get(k), sort_keys=True, default=str) for k in keys)


def combine(per_shard: Sequence[Sequence[Row]], merge: Merge, columns: Sequence[str]) -> list[Row]:
    """The rows of every shard with equal `merge.keys` combined per `merge.columns`, `merge.derive`
    computed on the result; in the order keys first appear (shard by shard)."""
    undeclared = [c for c in columns if c not in merge.keys and c not in merge.columns]
    if undeclared:
        raise RuntimeError(f"merge declaration lacks columns {undeclared}")
    merged: dict[tuple[str, ...], Row] = {}
    best: dict[tuple[tuple[str, ...], str], Any] = {}
    for rows in per_shard:
        for row in rows:
            key = _key(row, merge.keys)
            into = merged.get(key)
            if into is None:
                merged[key] = dict(row)
                for column, how in merge.columns.items():
                    if how.startswith(("arg_max:", "arg_min:")):
                        best[(key, column)] = row.get(how.partition(":")[2])
                    elif how == "union":
                        merged[key][column] = _union(None, row.get(column))
                continue
            for column, how in merge.columns.items():
                mine, theirs = into.get(column), row.get(column)
                base, _, arg = how.partition(":")
                if base == "sum":
                    into[column] = theirs if mine is None else mine if theirs is None else mine + theirs
                elif base == "min":
                    into[column] = _pick(mine, theirs, min)
                elif base == "max":
                    into[column] = _pick(mine, theirs, max)
                elif base == "any":
                    into[column] = theirs if mine is None else mine
                elif base == "or":
                    into[column] = bool(mine) or bool(theirs)
                elif base == "union":
                    into[column] = _union(mine, theirs)
                elif base in ("arg_max", "arg_min"):
                    by, candidate = best[(key, column)], row.get(arg)
                    better = candidate is not None and (
                        by is None or (candidate > by if base == "arg_max" else candidate < by)
                    )
                    if better:
                        best[(key, column)] = candidate
                        into[column] = theirs
                elif base == "rank":
                    ranks = arg.split(",")
                    into[column] = min((v for v in (mine, theirs) if v in ranks), key=ranks.index, default=mine)
    out = list(merged.values())
    for row in out:
        for column, compute in merge.derive.items():
            row[column] = compute(row)
    return out


def _pick(a: Any, b: Any, choose: Callable[[Any, Any], Any]) -> Any:
    if a is None:
        return b
    if b is None:
        return a
    return choose(a, b)


def _union(a: Any, b: Any) -> Any:
    if a is None and b is None:
        return None
    items: list[Any] = []
    for value in (a or [], b or []):
        for item in value:
            if item not in items:
                items.append(item)
    return sort_list(items)


def sort_list(items: Iterable[Any]) -> list[Any]:
    """Distinct items sorted, NULL last (DuckDB's `list(DISTINCT x ORDER BY x)`)."""
    present = sorted({json.dumps(i, default=str): i for i in items if i is not None}.values(), key=_sort_key)
    return present + ([None] if any(i is None for i in items) else [])


# -- chains across shards ---------------------------------------------------------------------------


def held_seqs(segment: Mapping[str, Any]) -> list[tuple[int, int]]:
    """The seq ranges (inclusive) a `chain_segments` row says its shard holds: first..last minus holes.

    Holes may come as [[from, to], ...], [{"first": .., "last": ..}, ...] or single seqs."""
    first, last = int(segment["first_seq"]), int(segment["last_seq"])
    holes: list[tuple[int, int]] = []
    for hole in segment.get("holes") or []:
        if isinstance(hole, Mapping):
            lo = hole.get("first", hole.get("from", hole.get("first_seq")))
            hi = hole.get("last", hole.get("to", hole.get("last_seq", lo)))
        elif isinstance(hole, list | tuple):
            lo, hi = hole[0], hole[-1]
        else:
            lo = hi = hole
        holes.append((int(lo), int(hi)))
    ranges: list[tuple[int, int]] = []
    at = first
    for lo, hi in sorted(holes):
        if lo > at:
            ranges.append((at, lo - 1))
        at = max(at, hi + 1)
    if at <= last:
        ranges.append((at, last))
    return ranges


@dataclass(frozen=True, slots=True)
class CheckpointFacts:
    """A checkpoint a shard recorded as truncated, as its evidence describes it."""

    tree_size: int
    event_id: Any
    time: Any
    """Its `time`, as the shards' JSON writes times (None in evidence recorded before it was kept)."""


@dataclass(frozen=True, slots=True)
class Stitched:
    """A producer's chain over every shard that holds part of it."""

    events: int
    max_seq: int
    gaps: frozenset[int]
    """Recorded gap seqs no shard holds."""
    false_gaps: frozenset[tuple[int, int]]
    """(shard index, seq) of recorded gaps another shard fills."""
    link_breaks: tuple[str, ...] = ()
    """Links between two shards' segments that do not hold (a prev_hash that is not the hash before)."""
    distrusted: bool = False
    """Some shard recorded a break other than a gap that says the chain's content cannot be trusted (tamper,
    conflict, bad_signature, root_mismatch, inconsistent, truncated: not a signing state)."""

    false_gaps_recorded_at: tuple[datetime, ...] = ()
    """When each of `false_gaps`, and each truncated checkpoint `checkpoints` verified, was recorded (what
    overview_counts counts chain breaks by)."""
    checkpoints: Mapping[tuple[int, int], str] = field(default_factory=dict)
    """(shard index, seq) of `truncated` checkpoints judged over the shards (`_checkpoint_roots`):
    "verified" (every event it covers is held by some shard and their root is the signed one) or
    "root_mismatch" (they are all held, and their root is not)."""
    checkpoint_sizes: Mapping[tuple[int, int], CheckpointFacts] = field(default_factory=dict)
    """(shard index, seq) of each judged checkpoint -> what `producer_signatures` says of it."""

    @property
    def broken(self) -> bool:
        """Whether one store holding every shard's events would take the chain as broken when judging its
        tool uses (`tool_use_verification`: a seq missing, a gap, or a break that is not a signing state)."""
        return self.max_seq != self.events or bool(self.gaps) or bool(self.link_breaks) or self.distrusted


def stitch_segments(segments: Mapping[int, Sequence[Mapping[str, Any]]]) -> tuple[list[tuple[int, int]], list[str]]:
    """From one producer's `chain_segments` rows per shard index: the union of the seq ranges held (merged,
    inclusive) and a description of every link across shards that does not hold."""
    ends: dict[int, tuple[int, str]] = {}
    for shard, rows in segments.items():
        for row in rows:
            ends[int(row["last_seq"])] = (shard, str(row.get("last_hash")))
    breaks: list[str] = []
    ranges: list[tuple[int, int]] = []
    for shard, rows in segments.items():
        for row in rows:
            ranges.extend(held_seqs(row))
            first = int(row["first_seq"])
            before = ends.get(first - 1)
            if first > 1 and before is not None and before[0] != shard and before[1] != str(row.get("first_prev_hash")):
                breaks.append(
                    f"seq {first} (shard {shard}) does not link to the hash of seq {first - 1} (shard {before[0]})"
                )
    ranges.sort()
    union: list[tuple[int, int]] = []
    for lo, hi in ranges:
        if union and lo <= union[-1][1] + 1:
            union[-1] = (union[-1][0], max(union[-1][1], hi))
        else:
            union.append((lo, hi))
    return union, breaks


_SIGNING_STATES: Final = frozenset({"unsigned", "uncovered", "silent", "unknown_key"})
"""Break kinds that say how far a producer is signed, not that its chain's content is wrong (the
`tool_uses` check leaves them to the `signed` one: consumers/queries.py, `_TOOL_USE_PROBLEMS`)."""


class _Chains:
    """Every producer's chain status over the shards, stitched where a producer is split."""

    def __init__(self, call: _Call, producer_id: str | None = None) -> None:
        self.call = call
        self.columns, per_shard = call.gather("chain_status", {"producer_id": producer_id, "only_broken": False})
        self.by_shard: list[dict[str, Row]] = [{str(r["producer_id"]): r for r in rows} for rows in per_shard]
        holders: dict[str, list[int]] = {}
        for index, rows in enumerate(self.by_shard):
            for producer in rows:
                holders.setdefault(producer, []).append(index)
        self.holders = holders
        self.split = sorted(p for p, shards in holders.items() if len(shards) > 1)
        self.stitched: dict[str, Stitched] = {p: self._stitch(p) for p in self.split} if self.split else {}

    def _break_rows(self, producer: str) -> dict[int, list[Row]]:
        def breaks(shard: Shard) -> list[Row]:
            params = self.call.with_archive({"producer_id": producer})
            _, rows = self.call.runner.prefix(shard, QUERIES["chain_breaks"], params, math.inf)
            return rows

        found = self.call.runner.each(breaks)
        return {i: found[i] for i in self.holders[producer]}

    def _stitch(self, producer: str) -> Stitched:
        recorded = self._break_rows(producer)
        gaps = {i: {int(r["seq"]) for r in rows if r["kind"] == "gap"} for i, rows in recorded.items()}
        shards = self.holders[producer]
        rows = {i: self.by_shard[i][producer] for i in shards}
        max_seq = max(int(r["max_seq"]) for r in rows.values())
        link_breaks: tuple[str, ...] = ()
        if "chain_segments" in QUERIES:
            _, per_shard = self.call.gather("chain_segments", {"producer_id": producer})
            segments = {i: [r for r in per_shard[i] if r.get("producer_id") == producer] for i in shards}
            union, broken = stitch_segments(segments)
            events = sum(hi - lo + 1 for lo, hi in union)
            link_breaks = tuple(broken)
            held_by = {i: held_seqs_any(segments[i]) for i in shards}

            def holds(i: int, seq: int) -> bool:
                return any(lo <= seq <= hi for lo, hi in held_by[i])
        else:
            events = sum(int(r["events"]) for r in rows.values())

            def holds(i: int, seq: int) -> bool:
                return seq <= int(rows[i]["max_seq"]) and seq not in gaps[i]

        real: set[int] = set()
        false: set[tuple[int, int]] = set()
        for i in shards:
            for seq in gaps[i]:
                if any(holds(j, seq) for j in shards if j != i):
                    false.add((i, seq))
                else:
                    real.add(seq)
        recorded_at = tuple(
            _time(r["recorded_at"])
            for i, rows in recorded.items()
            for r in rows
            if r["kind"] == "gap" and (i, int(r["seq"])) in false and r.get("recorded_at") is not None
        )
        checkpoints: dict[tuple[int, int], str] = {}
        sizes: dict[tuple[int, int], CheckpointFacts] = {}
        if "chain_segments" in QUERIES and not link_breaks:
            checkpoints, sizes = _checkpoint_roots(self.call, producer, recorded, held_by)
        distrusted = any(
            r["kind"] not in _SIGNING_STATES
            and r["kind"] != "gap"
            and checkpoints.get((i, int(r["seq"]))) != "verified"
            for i, rows in recorded.items()
            for r in rows
        )
        # A checkpoint the shards' events verify is no break either (as chain_breaks drops it).
        recorded_at += tuple(
            _time(r["recorded_at"])
            for i, rows in recorded.items()
            for r in rows
            if r["kind"] == "truncated"
            and checkpoints.get((i, int(r["seq"]))) == "verified"
            and r.get("recorded_at") is not None
        )
        return Stitched(
            events, max_seq, frozenset(real), frozenset(false), link_breaks, distrusted, recorded_at, checkpoints, sizes
        )

    def status(self, producer: str) -> Row:
        """The producer's `chain_status` row over every shard."""
        shards = self.holders[producer]
        if len(shards) == 1:
            return dict(self.by_shard[shards[0]][producer])
        rows = [self.by_shard[i][producer] for i in shards]
        stitched = self.stitched[producer]
        missing = stitched.max_seq - stitched.events
        tampered = sum(int(r["tampered"]) for r in rows) + len(stitched.link_breaks)
        conflicts = sum(int(r["conflicts"]) for r in rows)
        return {
            "producer_id": producer,
            "gate": next((r["gate"] for r in rows if r.get("gate") is not None), None),
            "max_seq": stitched.max_seq,
            "events": stitched.events,
            "missing": missing,
            "gaps_recorded": len(stitched.gaps),
            "tampered": tampered,
            "conflicts": conflicts,
            "ok": missing == 0 and not stitched.gaps and tampered == 0 and conflicts == 0,
            "first_time": min((r["first_time"] for r in rows if r["first_time"] is not None), default=None),
            "last_time": max((r["last_time"] for r in rows if r["last_time"] is not None), default=None),
        }

    def false_gap(self, shard: int, row: Mapping[str, Any]) -> bool:
        """Whether a `chain_breaks` row of shard index `shard` is a gap another shard fills."""
        stitched = self.stitched.get(str(row.get("producer_id")))
        return stitched is not None and row.get("kind") == "gap" and (shard, int(row["seq"])) in stitched.false_gaps

    def checkpoint_verdict(self, shard: int, producer: str, kind: Any, seq: Any) -> str | None:
        """What serve found of a `truncated` checkpoint break of shard index `shard` (see
        `Stitched.checkpoints`), or None: the break stands as the shard recorded it."""
        stitched = self.stitched.get(producer)
        if stitched is None or kind != "truncated" or seq is None:
            return None
        return stitched.checkpoints.get((shard, int(seq)))

    def judged_break(self, shard: int, row: Mapping[str, Any]) -> Row | None:
        """A shard's `chain_breaks` row as serve reports it: None when it is no break over every shard
        (a gap another shard fills, a truncated checkpoint the shards' events verify), a root_mismatch
        when those events' root is not the signed one, else the row."""
        if self.false_gap(shard, row):
            return None
        verdict = self.checkpoint_verdict(shard, str(row.get("producer_id")), row.get("kind"), row.get("seq"))
        if verdict == "verified":
            return None
        if verdict == "root_mismatch":
            return {
                **row,
                "kind": "root_mismatch",
                "detail": f"{row.get('detail')}; the shards together hold them, and their root is not the signed one",
            }
        return dict(row)

    def false_gap_count(self) -> int:
        """Break rows of the shards that are none over every shard: gaps another shard fills, truncated
        checkpoints the shards' events verify."""
        verified = sum(1 for s in self.stitched.values() for v in s.checkpoints.values() if v == "verified")
        return sum(len(s.false_gaps) for s in self.stitched.values()) + verified

    def false_gaps_recorded_at(self) -> list[datetime]:
        return [t for s in self.stitched.values() for t in s.false_gaps_recorded_at]


def held_seqs_any(rows: Sequence[Mapping[str, Any]]) -> list[tuple[int, int]]:
    """`held_seqs` of several segment rows."""
    return [r for row in rows for r in held_seqs(row)]


def _checkpoint_roots(
    call: _Call, producer: str, recorded: Mapping[int, Sequence[Row]], held_by: Mapping[int, list[tuple[int, int]]]
) -> tuple[dict[tuple[int, int], str], dict[tuple[int, int], CheckpointFacts]]:
    """Judge a split producer's `truncated` checkpoints over the shards: (shard index, seq) ->
    "verified" or "root_mismatch" (see `Stitched.checkpoints`), and their tree sizes and event ids; those
    whose events no shard holds stay out. A shard records `truncated` only for a checkpoint whose note
    its trusted keys verified (consumers.checkpoints), for want of events another shard holds; serve
    asks every shard for its part of the tree (`merkle_material`) and compares the root they make with
    the signed one."""
    wanted: list[tuple[int, int, bytes, CheckpointFacts]] = []
    for index, rows in recorded.items():
        for row in rows:
            if row["kind"] != "truncated":
                continue
            evidence = row.get("evidence")
            if isinstance(evidence, str):
                evidence = json.loads(evidence)
            try:
                size, root = int(evidence["tree_size"]), bytes.fromhex(str(evidence["root"]))
            except (TypeError, KeyError, ValueError):
                continue
            at = evidence.get("time")
            facts = CheckpointFacts(size, row.get("event_id"), None if at is None else _json_value(_time(at)))
            wanted.append((index, int(row["seq"]), root, facts))
    verdicts: dict[tuple[int, int], str] = {}
    sizes: dict[tuple[int, int], CheckpointFacts] = {}
    roots: dict[int, bytes | None] = {}
    for index, seq, root, facts in wanted:
        if facts.tree_size not in roots:
            roots[facts.tree_size] = _root_over_shards(call, producer, facts.tree_size, held_by)
        found = roots[facts.tree_size]
        if found is not None:
            verdicts[(index, seq)] = "verified" if found == root else "root_mismatch"
            sizes[(index, seq)] = facts
    return verdicts, sizes


def _root_over_shards(
    call: _Call, producer: str, size: int, held_by: Mapping[int, list[tuple[int, int]]]
) -> bytes | None:
    """The RFC 6962 root of the producer's seqs 1..size from the shards' `merkle_material`, or None when
    the shards do not hold every one of them (or their index lacks a node it needs)."""
    pieces: list[tuple[int, int, int]] = []  # (leaf lo, leaf hi, shard index), each seq from one shard
    covered = 0
    for lo, hi, index in sorted((lo, hi, i) for i, ranges in held_by.items() for lo, hi in ranges):
        lo, hi = max(lo - 1, covered), min(hi, size)  # seqs lo..hi are leaves lo - 1 .. hi - 1
        if lo > covered:
            return None  # no shard holds seq covered + 1
        if hi > lo:
            pieces.append((lo, hi, index))
            covered = hi
    if covered < size:
        return None
    nodes: dict[tuple[int, int], bytes] = {}
    leaves: dict[int, bytes] = {}
    for lo, hi, index in pieces:
        params = {"producer_id": producer, "lo": lo, "hi": hi}
        _, rows = call.runner.prefix(call.runner.shards[index], QUERIES["merkle_material"], params, math.inf)
        for row in rows:
            if row["kind"] == "node":
                nodes[(int(row["level"]), int(row["idx"]))] = bytes.fromhex(str(row["hash"]))
            elif lo < int(row["seq"]) <= hi:
                leaves[int(row["seq"]) - 1] = leaf_hash(bytes.fromhex(str(row["hash"])))
    return _subtree_root(nodes, leaves, 0, size)


def _subtree_root(
    nodes: Mapping[tuple[int, int], bytes], leaves: Mapping[int, bytes], lo: int, hi: int
) -> bytes | None:
    """MTH of leaves lo..hi-1 (a range RFC 9162's recursion visits) from indexed nodes and leaf hashes;
    None when one it needs is not there."""
    width = hi - lo
    if width & (width - 1) == 0:
        level = width.bit_length() - 1
        found = nodes.get((level, lo >> level))
        if found is not None:
            return found
        if width == 1:
            return leaves.get(lo)
    split = 1 << ((width - 1).bit_length() - 1)  # the largest power of two below the width
    left = _subtree_root(nodes, leaves, lo, lo + split)
    if left is None:
        return None
    right = _subtree_root(nodes, leaves, lo + split, hi)
    return None if right is None else node_hash(left, right)


# -- tool uses across shards ------------------------------------------------------------------------

_FEW: Final = 8
"""Split producers up to which serve asks the shards about each one apart, rather than about all."""
_USE_KEYS: Final = ("producer_id", "gate", "workflow", "agent", "tool", "trail")
_JUDGED_ORDER: Final = ("producer_id", "gate", "workflow nulls first", "agent nulls first", "tool", "trail")
_PROBLEMS: Final = ("chain_not_verified", "not_registered", "incomplete_trail")


def _about(call: _Call, name: str, params: Mapping[str, Any], producers: Sequence[str]) -> list[list[Row]]:
    """Each shard's rows of helper query `name` (which takes `producer_id`) for `producers` only: asked per
    producer when they are few, else once for all and filtered."""
    if not producers:
        return [[] for _ in call.runner.shards]
    if len(producers) > _FEW:
        wanted = set(producers)
        _, per_shard = call.gather(name, {**params, "producer_id": None})
        return [[r for r in rows if r["producer_id"] in wanted] for rows in per_shard]
    out: list[list[Row]] = [[] for _ in call.runner.shards]
    for producer in producers:
        _, per_shard = call.gather(name, {**params, "producer_id": producer})
        for index, rows in enumerate(per_shard):
            out[index].extend(rows)
    return out


def _satisfied(chain: Any, trail: set[str]) -> bool | None:
    """DuckDB's `list_has_all(trail, chain)`: None for a NULL chain."""
    if chain is None:
        return None
    return all(step in trail for step in json.loads(chain) if step is not None)


def _missing_interceptors(chains: Sequence[Any], trail: Sequence[str]) -> list[Any] | None:
    """What `trail` lacks of the chain it comes closest to (unverified_tool_uses' list_reduce: the first of
    the shortest)."""
    lacks = [[x for x in json.loads(c) if x not in trail] for c in chains if c is not None]
    best: list[Any] | None = None
    for candidate in lacks:
        if best is None or len(candidate) < len(best):
            best = candidate
    return best


def _scope_of(row: Mapping[str, Any]) -> tuple[str, ...]:
    # As _PRODUCER_REGISTRATIONS joins a call to its registrations: a scope without workflow or agent is ''.
    return (str(row["producer_id"]), str(row["gate"]), row["workflow"] or "", row["agent"] or "", str(row["tool"]))


class _SplitUses:
    """The ToolUses of the producers split across shards, judged as one store of every shard's events
    would: the producer's chain stitched (`_Chains`), its registrations of every shard."""

    def __init__(self, call: _Call, chains: _Chains, since: Any, until: Any) -> None:
        self.call = call
        self.chains = chains
        producers = chains.split
        window = {"since": since, "until": until}
        self.local: list[list[Row]] = _about(call, "tool_use_judgements", window, producers)
        """Each shard's own judgement of the split producers' tool uses, per group."""
        registered = _about(call, "producer_tool_chains", {}, producers)
        self.registered: dict[tuple[str, ...], list[Any]] = {}
        for rows in registered:
            for row in rows:
                key = _scope_of(row)
                held = self.registered.setdefault(key, [])
                if row["chain"] not in held:
                    held.append(row["chain"])
        merged: dict[tuple[str, ...], Row] = {}
        self.holders: dict[tuple[str, ...], list[int]] = {}
        for index, rows in enumerate(self.local):
            for row in rows:
                key = _key(row, _USE_KEYS)
                into = merged.get(key)
                if into is None:
                    merged[key] = {**row, "tool_uses": int(row["tool_uses"])}
                else:
                    into["tool_uses"] += int(row["tool_uses"])
                if index not in self.holders.setdefault(key, []):
                    self.holders[key].append(index)
        for row in merged.values():
            row["problem"] = self.problem(row)
        self.judged: list[Row] = sort_rows(merged.values(), (*_JUDGED_ORDER, "problem nulls first"))
        """One row per split producer, scope, tool and trail, with the problem judged across shards."""

    def chains_of(self, row: Mapping[str, Any]) -> list[Any] | None:
        return self.registered.get(_scope_of(row))

    def problem(self, row: Mapping[str, Any]) -> str | None:
        """_TOOL_USE_PROBLEMS' verdict for a group of tool uses, over every shard."""
        if self.chains.stitched[str(row["producer_id"])].broken:
            return "chain_not_verified"
        chains = self.chains_of(row)
        if chains is None:
            return "not_registered"
        trail = set(json.loads(row["trail"]))
        verdicts = [_satisfied(c, trail) for c in chains]
        if any(verdicts) or all(v is None for v in verdicts):
            return None
        return "incomplete_trail"

    def rows(self, problem: str | None, n: float) -> list[Row]:
        """The split producers' unverified tool uses (only `problem`'s, when given) as `unverified_tool_uses`
        lists them: each shard's first `n` of each unverified group, newest first."""
        out: list[Row] = []
        for group in self.judged:
            if group["problem"] is None or (problem is not None and group["problem"] != problem):
                continue
            params = self.call.with_archive(
                {k: group[k] for k in _USE_KEYS} | {k: self.call.bound.get(k) for k in ("since", "until")}
            )
            chains = self.chains_of(group) or []
            for index in self.holders[_key(group, _USE_KEYS)]:
                shard = self.call.runner.shards[index]
                _, rows = self.call.runner.prefix(shard, QUERIES["tool_use_rows"], params, n)
                for row in rows:
                    missing = (
                        _missing_interceptors(chains, row["trail"]) if group["problem"] == "incomplete_trail" else None
                    )
                    out.append({**row, "problem": group["problem"], "missing_interceptors": missing})
        return out


# -- the custom merges ------------------------------------------------------------------------------

Merger = Callable[[_Call], tuple[list[str], list[Row]]]


def _chain_status(call: _Call) -> tuple[list[str], list[Row]]:
    chains = _Chains(call, call.bound.get("producer_id"))
    rows = [chains.status(p) for p in chains.holders]
    since, until = call.bound.get("since"), call.bound.get("until")
    rows = [
        r
        for r in rows
        if (not call.bound.get("only_broken") or not r["ok"])
        and (since is None or (r["last_time"] is not None and _time(r["last_time"]) >= since))
        and (until is None or (r["first_time"] is not None and _time(r["first_time"]) < until))
    ]
    return chains.columns or _columns("chain_status", rows), call.cut(
        sort_rows(rows, ("ok", "-last_time", "producer_id"))
    )


def _chain_breaks(call: _Call) -> tuple[list[str], list[Row]]:
    columns, per_shard = call.gather("chain_breaks", call.fan)
    kind = call.bound.get("kind")
    judged_kinds = (None, "gap", "truncated", "root_mismatch", *_SIGNING_STATES)
    chains = _Chains(call, call.bound.get("producer_id")) if kind in judged_kinds else None
    signing: dict[str, Row] = {}
    if chains is not None and chains.split and kind in (None, "unsigned", "uncovered", "silent"):
        _, merged = _merged_signatures(call, chains, {})
        signing = {str(r["producer_id"]): r for r in merged if str(r["producer_id"]) in chains.stitched}
    rows: list[Row] = []
    for index, shard_rows in enumerate(per_shard):
        for row in shard_rows:
            judged = dict(row) if chains is None else chains.judged_break(index, row)
            if judged is None or (kind is not None and judged["kind"] != kind):
                continue
            facts = signing.get(str(judged.get("producer_id")))
            if facts is not None and not _signing_break_stands(judged, facts):
                continue
            rows.append(judged)
    if kind == "root_mismatch" and chains is not None:
        # What serve found of checkpoints the shards recorded as truncated.
        _, truncated = call.gather("chain_breaks", {**call.fan, "kind": "truncated"})
        for index, shard_rows in enumerate(truncated):
            for row in shard_rows:
                judged = chains.judged_break(index, row)
                if judged is not None and judged["kind"] == "root_mismatch":
                    rows.append(judged)
    return columns, call.cut(sort_rows(rows, ("-recorded_at", "producer_id", "seq", "kind")))


def _coverage_summary(call: _Call) -> tuple[list[str], list[Row]]:
    columns, per_shard = call.gather("coverage_summary", call.fan)
    facts = [rows[0] for rows in per_shard if rows]
    summed = {c: sum(int(f.get(c) or 0) for f in facts) for c in columns}
    chains = _Chains(call)
    if chains.split:
        _, active_rows = call.gather(
            "producer_signatures", {"since": call.bound["since"], "until": call.bound["until"]}
        )
        active = sorted({str(r["producer_id"]) for rows in active_rows for r in rows})
        statuses = [chains.status(p) for p in active if p in chains.holders]
        summed["producers"] = len(active)
        summed["broken_producers"] = sum(1 for s in statuses if not s["ok"])
        summed["missing_seqs"] = sum(int(s["missing"]) for s in statuses)
        summed["gaps_recorded"] = sum(int(s["gaps_recorded"]) for s in statuses)
        summed["tampered"] = sum(int(s["tampered"]) for s in statuses)
        summed["conflicts"] = sum(int(s["conflicts"]) for s in statuses)
    return columns, [{c: summed[c] for c in columns}]


def _pipeline_health(call: _Call) -> tuple[list[str], list[Row]]:
    columns, per_shard = call.gather("pipeline_health", call.fan)
    figures = [rows[0] for rows in per_shard if rows]
    store: dict[str, Any] = {
        "total_events": _sum(f["total_events"] for f in figures),
        "recent_events": _sum(f["recent_events"] for f in figures),
        "last_event_time": max((f["last_event_time"] for f in figures if f["last_event_time"]), default=None),
        "last_ingested_at": max((f["last_ingested_at"] for f in figures if f["last_ingested_at"]), default=None),
        "seconds_since_last_ingest": min(
            (f["seconds_since_last_ingest"] for f in figures if f["seconds_since_last_ingest"] is not None),
            default=None,
        ),
        "dead_letters": _sum(f["dead_letters"] for f in figures),
        "recent_dead_letters": _sum(f["recent_dead_letters"] for f in figures),
        "chain_breaks": _sum(f["chain_breaks"] for f in figures),
    }
    store["events_per_minute"] = _round2(store["recent_events"] / int(call.bound["minutes"]))
    chains = _Chains(call)
    store["chain_breaks"] -= chains.false_gap_count()
    partitions: dict[tuple[str, ...], Row] = {}
    for rows in per_shard:
        for row in rows:
            if row.get("topic") is None:
                continue
            key = _key(row, ("topic", "partition"))
            held = partitions.get(key)
            if held is None or (row.get("next_offset") or 0) > (held.get("next_offset") or 0):
                partitions[key] = row
    rows = list(partitions.values()) or [next(r for rows in per_shard for r in rows)]
    merged = [{c: (store[c] if c in store else row.get(c)) for c in columns} for row in rows]
    return columns, sort_rows(merged, ("topic", "partition"))


_SIGNATURES: Final = Merge(
    "groups",
    keys=("producer_id",),
    columns={
        "gate": "any",
        "events": "sum",
        "ok": "or",
        "signed": "or",
        "signed_tree_size": "max",
        "checkpoint_seq": "arg_max:signed_tree_size",
        "checkpoint_event_id": "arg_max:signed_tree_size",
        "checkpoint_time": "arg_max:signed_tree_size",
        "breaks": "union",
        "last_time": "max",
    },
)


def _merged_signatures(call: _Call, chains: _Chains, params: Mapping[str, Any]) -> tuple[list[str], list[Row]]:
    """`producer_signatures` over every shard, unsorted: a split producer's truncated checkpoints judged
    over the shards (`_judged_signature`), and its signing states that another shard's checkpoints
    answer dropped (`_signing_break_stands`)."""
    columns, per_shard = call.gather("producer_signatures", {**params, "only_failing": False})
    if chains.split:
        per_shard = [[_judged_signature(chains, index, row) for row in rows] for index, rows in enumerate(per_shard)]
    rows = combine(per_shard, _SIGNATURES, columns)
    for row in rows:
        breaks = row.get("breaks") or []
        if str(row["producer_id"]) in chains.stitched:
            breaks = [b for b in breaks if _signing_break_stands(b, row)]
        row["breaks"] = sorted(breaks, key=lambda b: (b.get("seq") is None, b.get("seq") or 0, str(b.get("kind"))))
        row["ok"] = bool(row["signed"]) and not row["breaks"]
    return columns, rows


def _signing_break_stands(entry: Mapping[str, Any], signatures: Mapping[str, Any]) -> bool:
    """Whether a shard's `unsigned`, `uncovered` or `silent` row of a split producer still holds over every
    shard (`signatures`: its merged `producer_signatures` row). Each shard judges only its part: the one
    holding the chain's first part records `uncovered` and `silent` for the events and checkpoint after
    which the producer went on in another shard, and one whose part has no checkpoint of its own that
    verified records `unsigned`."""
    kind, seq = entry.get("kind"), entry.get("seq")
    size, last = signatures.get("signed_tree_size"), signatures.get("checkpoint_seq")
    if kind == "unsigned":
        return not signatures.get("signed")
    if kind == "uncovered":  # events after a valid checkpoint: covered when a later one is over them
        return size is None or seq is None or int(seq) > int(size)
    if kind == "silent":  # a last checkpoint no other followed: one did, in another shard
        return last is None or seq is None or int(seq) >= int(last)
    return True


_RUN_IDS_PER_ASK: Final = 100
"""Run or call ids per request when they travel in the URL (`runs`, `run_events`)."""

_NESTING: Final = 16
"""The levels of nesting `run_events` follows (as consumers.queries' _RUN_CALLS)."""


def _chunks(ids: Sequence[str]) -> list[list[str]]:
    return [list(ids[at : at + _RUN_IDS_PER_ASK]) for at in range(0, len(ids), _RUN_IDS_PER_ASK)] or [[]]


def _run_events(call: _Call) -> tuple[list[str], list[Row]]:
    """One run's events over every shard: its calls and those nested under them followed level by level
    over every shard (`run_call_ids`; a nested agent's events may be in another shard than its caller's,
    its producer's partition another), then each shard's events of the run and under those calls."""
    run_id = call.bound.get("run_id")
    if run_id is None or call.bound.get("call_ids") is not None:
        return call.page()
    tenant = call.bound.get("tenant")
    calls: set[str] = set()
    level: list[str] | None = None
    for _ in range(_NESTING + 1):
        found: set[str] = set()
        for chunk in [None] if level is None else _chunks(level):
            params = {
                "run_id": run_id,
                "tenant": tenant,
                "parent_call_ids": None if chunk is None else json.dumps(chunk),
            }
            _, per_shard = call.gather("run_call_ids", params)
            found.update(str(r["call_id"]) for rows in per_shard for r in rows)
        level = sorted(found - calls)
        calls.update(level)
        if not level:
            break
    seen: set[str] = set()
    rows: list[Row] = []
    columns: list[str] = []
    for chunk in _chunks(sorted(calls)):
        columns, per_shard = call.gather("run_events", {**call.fan, "call_ids": json.dumps(chunk)}, call.wanted)
        for shard_rows in per_shard:
            for row in shard_rows:
                if row["event_id"] not in seen:
                    seen.add(row["event_id"])
                    rows.append(row)
    return columns, call.cut(sort_rows(rows, ("time", "producer_id", "seq")))


def _runs(call: _Call) -> tuple[list[str], list[Row]]:
    """The page of runs over every shard: membership and order from each shard's first offset + limit runs
    (a run's latest event is in the shard holding its latest part, where no run ranks above it that does not
    globally); then each run of the page counted on every shard that did not list it, where the rest of its
    events may be (a run whose producer's partition moved)."""
    columns, per_shard = call.gather("runs", call.fan, call.wanted)
    page = call.cut(sort_rows(combine(per_shard, RUN_GROUPS, columns), RUN_GROUPS.order))
    ids = [str(r["run_id"]) for r in page]
    wanted = set(ids)
    kept = [[r for r in rows if str(r["run_id"]) in wanted] for rows in per_shard]

    def recount(index: int, shard: Shard) -> list[Row]:
        listed = {str(r["run_id"]) for r in kept[index]}
        missing = [i for i in ids if i not in listed]
        found: list[Row] = []
        for at in range(0, len(missing), _RUN_IDS_PER_ASK):
            chunk = missing[at : at + _RUN_IDS_PER_ASK]
            params = call.with_archive({**call.fan, "run_ids": json.dumps(chunk)})
            _, rows = call.runner.prefix(shard, QUERIES["runs"], params, len(chunk))
            found.extend(r for r in rows if str(r["run_id"]) in wanted)
        return found

    if ids and len(call.runner.shards) > 1:
        more = call.runner.each_indexed(recount)
        kept = [rows + extra for rows, extra in zip(kept, more, strict=True)]
    rows = combine(kept, RUN_GROUPS, columns)
    by_id = {str(r["run_id"]): r for r in rows}
    return columns, [by_id[i] for i in ids]


def _producer_signatures(call: _Call) -> tuple[list[str], list[Row]]:
    columns, rows = _merged_signatures(call, _Chains(call), call.fan)
    if call.bound.get("only_failing"):
        rows = [r for r in rows if not r["ok"]]
    return columns, call.cut(sort_rows(rows, ("ok", "producer_id")))


def _judged_signature(chains: _Chains, index: int, row: Row) -> Row:
    """A shard's `producer_signatures` row with its truncated checkpoints as serve judged them: one the
    shards' events verify is no break and signs the producer up to its tree_size; one they contradict is a
    root_mismatch."""
    producer = str(row["producer_id"])
    if producer not in chains.stitched:
        return row
    breaks: list[Any] = []
    out = dict(row)
    for entry in row.get("breaks") or []:
        verdict = chains.checkpoint_verdict(index, producer, entry.get("kind"), entry.get("seq"))
        if verdict == "verified":
            facts = chains.stitched[producer].checkpoint_sizes[(index, int(entry["seq"]))]
            out["signed"] = True
            if out.get("signed_tree_size") is None or facts.tree_size > int(out["signed_tree_size"]):
                out["signed_tree_size"] = facts.tree_size
                out["checkpoint_seq"] = int(entry["seq"])
                out["checkpoint_event_id"] = facts.event_id
                out["checkpoint_time"] = facts.time
            continue
        breaks.append({**entry, "kind": "root_mismatch"} if verdict == "root_mismatch" else entry)
    out["breaks"] = breaks
    return out


def _denial_rate(call: _Call) -> tuple[list[str], list[Row]]:
    columns, per_shard = call.leading("denial_rate", call.fan, "-bucket")
    by_tool = call.bound["by"] == "tool"
    merge = Merge("groups", keys=("bucket", "key"), columns={"calls": "sum", "denied": "sum", "rate": "any"})
    rows = combine(per_shard, merge, columns)
    if not by_tool:
        # By interceptor a row's calls are every outcome of its bucket, which a shard without a denial
        # in that bucket never reports: count them from every shard's decision trends instead.
        trend_params = {k: call.fan.get(k) for k in ("since", "until", "bucket_minutes", "bucket_seconds", "tenant")}
        _, trends = call.gather("decision_trends", trend_params)
        calls: dict[Any, int] = {}
        for shard_rows in trends:
            for row in shard_rows:
                if row["type"] in OUTCOME_TYPES:
                    calls[row["bucket"]] = calls.get(row["bucket"], 0) + int(row["events"])
        for row in rows:
            row["calls"] = calls.get(row["bucket"], row["calls"])
    for row in rows:
        row["rate"] = _round(row["denied"] / row["calls"], 4) if row["calls"] else None
    return columns, call.cut(sort_rows(rows, ("-bucket", "-rate", "key")))


def _unmediated_count(call: _Call) -> tuple[list[str], list[Row]]:
    columns, per_shard = call.gather("unmediated_count", call.fan)
    facts = [rows[0] for rows in per_shard if rows]
    with_accesses = [f for f in facts if int(f["accesses"] or 0) > 0]
    row: Row = {
        "accesses": sum(int(f["accesses"] or 0) for f in facts),
        "resources": int(with_accesses[0]["resources"]) if len(with_accesses) == 1 else 0,
        "first_time": min((f["first_time"] for f in facts if f["first_time"]), default=None),
        "last_time": max((f["last_time"] for f in facts if f["last_time"]), default=None),
    }
    if len(with_accesses) > 1:
        _, listed = call.gather("unmediated", call.fan)
        row["resources"] = len({r["resource"] for rows in listed for r in rows if r.get("resource") is not None})
    return columns, [{c: row[c] for c in columns}]


_SCOPE_ORDER: Final = ("gate", "workflow nulls first", "agent nulls first", "tool")
_SCOPE_KEYS: Final = ("gate", "workflow", "agent", "tool")


def _registered_tools(call: _Call) -> tuple[list[str], list[Row]]:
    columns, per_shard = call.gather("registered_tools", call.fan, call.wanted)
    latest = "arg_max:last_registered"
    merge = Merge(
        "groups",
        keys=_SCOPE_KEYS,
        columns={"description": latest, "input_schema_sha256": latest, "interceptors": latest, "excluded": latest,
                 "schema_versions": "max", "registrations": "sum", "first_registered": "min", "last_registered": "max"},
    )  # fmt: skip
    rows = combine(per_shard, merge, columns)
    seen: dict[tuple[str, ...], int] = {}
    for shard_rows in per_shard:
        for row in shard_rows:
            key = _key(row, _SCOPE_KEYS)
            seen[key] = seen.get(key, 0) + 1
    if any(n > 1 for n in seen.values()):
        _, schemas = call.gather("tool_schemas", call.fan)
        distinct: dict[tuple[str, ...], set[Any]] = {}
        for shard_rows in schemas:
            for row in shard_rows:
                distinct.setdefault(_key(row, _SCOPE_KEYS), set()).add(row["input_schema_sha256"])
        for row in rows:
            key = _key(row, _SCOPE_KEYS)
            if seen[key] > 1:
                row["schema_versions"] = len({h for h in distinct.get(key, set()) if h is not None})
    return columns, call.cut(sort_rows(rows, _SCOPE_ORDER))


def _exercised_tools(call: _Call) -> tuple[list[str], list[Row]]:
    columns, per_shard = call.gather("exercised_tools", call.fan, call.wanted)
    counts = dict.fromkeys(("calls", "ran", "ok", "denied", "substituted", "blocked"), "sum")
    merge = Merge(
        "groups", keys=_SCOPE_KEYS, columns={**counts, "first_seen": "min", "last_seen": "max", "registered": "or"}
    )
    rows = combine(per_shard, merge, columns)
    if len(call.runner.shards) > 1 and any(not r["registered"] for r in rows):
        # Registered in a shard that stored none of its calls: that shard lists no row for the scope.
        _, registered = call.gather("registered_tools", {"gate": call.bound.get("gate"), "agent": None})
        known = {_key(r, _SCOPE_KEYS) for shard_rows in registered for r in shard_rows}
        for row in rows:
            row["registered"] = bool(row["registered"]) or _key(row, _SCOPE_KEYS) in known
    return columns, call.cut(sort_rows(rows, _SCOPE_ORDER))


def _tool_exercise(call: _Call) -> tuple[list[str], list[Row]]:
    columns, per_shard = call.gather("tool_exercise", {**call.fan, "only_unexercised": False})
    listed = {"scopes": "union", "last_registered": "max"}
    tallies = dict.fromkeys(("calls", "ran", "exercised", "last_called"), "any")
    merge = Merge("groups", keys=("gate", "tool"), columns={**listed, **tallies})
    rows = combine(per_shard, merge, columns)
    # A shard lists only what it holds a registration of: the calls come from every shard's outcomes.
    _, exercised = call.gather("exercised_tools", {k: call.fan.get(k) for k in ("since", "until", "gate")})
    calls: dict[tuple[str, ...], list[Any]] = {}
    for shard_rows in exercised:
        for row in shard_rows:
            tally = calls.setdefault(_key(row, ("gate", "tool")), [0, 0, None])
            tally[0] += int(row["calls"])
            tally[1] += int(row["ran"])
            tally[2] = _pick(tally[2], row["last_seen"], max)
    for row in rows:
        n, ran, last = calls.get(_key(row, ("gate", "tool")), [0, 0, None])
        row.update(calls=n, ran=ran, exercised=n > 0, last_called=last)
    if call.bound.get("only_unexercised"):
        rows = [r for r in rows if not r["exercised"]]
    return columns, call.cut(sort_rows(rows, ("exercised", "gate", "tool")))


def _new_denial_reasons(call: _Call) -> tuple[list[str], list[Row]]:
    until = call.fan.get("until") or datetime.now(UTC)
    since = call.bound.get("since") or until - timedelta(days=1)
    # Every reason before `until`, so one first seen in another shard before the window is not "new".
    everything = {**call.fan, "since": _EPOCH, "until": until}
    columns, per_shard = call.gather("new_denial_reasons", everything)
    first = "arg_min:first_seen"
    merge = Merge("groups", keys=("reason", "decided_by"), columns={
        "first_seen": "min", "last_seen": "max", "occurrences": "sum", "tenants": "max",
        "sample_message": first, "sample_tool": first, "type": first})  # fmt: skip
    seen: dict[tuple[str, ...], int] = {}
    for shard_rows in per_shard:
        for row in shard_rows:
            key = _key(row, ("reason", "decided_by"))
            seen[key] = seen.get(key, 0) + 1
    rows = [r for r in combine(per_shard, merge, columns) if _time(r["first_seen"]) >= since]
    if any(seen[_key(r, ("reason", "decided_by"))] > 1 for r in rows):
        helper = {"until": until, "decided_by": call.bound.get("decided_by"), "tenant": call.bound.get("tenant")}
        _, met = call.gather("denial_reason_tenants", helper)
        tenants: dict[tuple[str, ...], set[Any]] = {}
        for shard_rows in met:
            for row in shard_rows:
                tenants.setdefault(_key(row, ("reason", "decided_by")), set()).add(row["tenant"])
        for row in rows:
            key = _key(row, ("reason", "decided_by"))
            if seen[key] > 1:
                row["tenants"] = len({t for t in tenants.get(key, set()) if t is not None})
    return columns, call.cut(sort_rows(rows, ("-first_seen", "reason")))


_OVERVIEW: Final = Merge(
    "groups",
    keys=("metric",),
    columns={"value": "sum", "previous": "sum", "since": "any", "until": "any", "previous_since": "any",
             "change": "derived"},
    derive={"change": lambda row: row["value"] - row["previous"]},
)  # fmt: skip


def _overview_counts(call: _Call) -> tuple[list[str], list[Row]]:
    columns, per_shard = call.gather("overview_counts", call.fan)
    rows = combine(per_shard, _OVERVIEW, columns)
    chains = _Chains(call)
    for row in rows if chains.split else ():
        if row["metric"] != "chain_breaks":
            continue
        # A gap one shard recorded where another holds the events is no break (as chain_breaks drops it),
        # nor is a truncated checkpoint the shards' events verify.
        since, until, before = (_time(row[c]) for c in ("since", "until", "previous_since"))
        for recorded in chains.false_gaps_recorded_at():
            if since <= recorded < until:
                row["value"] -= 1
            elif before <= recorded < since:
                row["previous"] -= 1
        row["change"] = row["value"] - row["previous"]
    return columns, rows


def _tool_use_judgements(call: _Call) -> tuple[list[str], list[Row]]:
    chains = _Chains(call, call.bound.get("producer_id"))
    split = set(chains.split)
    # Ordered by its keys: each shard's first offset + limit rows of the producers it holds whole suffice.
    columns, per_shard = call.prefix_without("tool_use_judgements", call.fan, call.wanted, split)
    rows = [r for shard_rows in per_shard for r in shard_rows]
    if split:
        uses = _SplitUses(call, chains, call.bound.get("since"), call.bound.get("until"))
        rows += [{c: r[c] for c in columns} for r in uses.judged]
    return columns, call.cut(sort_rows(rows, (*_JUDGED_ORDER, "problem nulls first")))


def _tool_use_verification(call: _Call) -> tuple[list[str], list[Row]]:
    columns, per_shard = call.gather("tool_use_verification", call.fan)
    totals = {c: sum(int(r.get(c) or 0) for rows in per_shard for r in rows) for c in columns}
    chains = _Chains(call)
    if chains.split:
        # Each shard judged the split producers' tool uses alone: take its verdicts out, the federation's in.
        uses = _SplitUses(call, chains, call.bound.get("since"), call.bound.get("until"))
        local = [r for shard_rows in uses.local for r in shard_rows]
        for sign, groups in ((-1, local), (1, uses.judged)):
            for row in groups:
                if row["problem"] is not None:
                    totals["unverified"] += sign * int(row["tool_uses"])
                    totals[row["problem"]] += sign * int(row["tool_uses"])
    return columns, [{c: totals[c] for c in columns}]


def _unverified_tool_uses(call: _Call) -> tuple[list[str], list[Row]]:
    chains = _Chains(call)
    if not chains.split:
        return call.page()
    split = set(chains.split)
    columns, per_shard = call.prefix_without("unverified_tool_uses", call.fan, call.wanted, split)
    uses = _SplitUses(call, chains, call.bound.get("since"), call.bound.get("until"))
    rows = [r for shard_rows in per_shard for r in shard_rows] + uses.rows(call.bound.get("problem"), call.wanted)
    return columns, call.cut(sort_rows([{c: r.get(c) for c in columns} for r in rows], ("-time", "event_id")))


_CUSTOM: Final[dict[str, Merger]] = {
    "chain_breaks": _chain_breaks,
    "chain_status": _chain_status,
    "coverage_summary": _coverage_summary,
    "denial_rate": _denial_rate,
    "exercised_tools": _exercised_tools,
    "new_denial_reasons": _new_denial_reasons,
    "overview_counts": _overview_counts,
    "pipeline_health": _pipeline_health,
    "producer_signatures": _producer_signatures,
    "registered_tools": _registered_tools,
    "run_events": _run_events,
    "runs": _runs,
    "tool_exercise": _tool_exercise,
    "tool_use_judgements": _tool_use_judgements,
    "tool_use_verification": _tool_use_verification,
    "unmediated_count": _unmediated_count,
    "unverified_tool_uses": _unverified_tool_uses,
}
"""The queries declared `custom`, by name (a test checks every one has its function)."""


# -- helpers ----------------------------------------------------------------------------------------


def _columns(name: str, rows: Sequence[Row]) -> list[str]:
    return list(rows[0]) if rows else []


def _sum(values: Iterable[Any]) -> int:
    return sum(int(v or 0) for v in values)


def _round(value: float, digits: int) -> float:
    # DuckDB rounds half away from zero; Python's round() rounds half to even.
    scale = 10.0**digits
    shifted = value * scale
    return float(math.floor(shifted + 0.5) if shifted >= 0 else -math.floor(-shifted + 0.5)) / scale


def _round2(value: float) -> float:
    return _round(value, 2)


def _time(value: Any) -> datetime:
    parsed = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed


def _json_value(value: Any) -> Any:
    if isinstance(value, datetime | date):
        return value.isoformat()
    return value


def _param_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime | date):
        return value.isoformat()
    return str(value)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, httpx.TimeoutException):
        return f"no answer in time ({type(exc).__name__})"
    if isinstance(exc, httpx.ConnectError):
        return f"cannot connect ({exc})"
    return f"{type(exc).__name__}: {exc}"


def _error_text(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:200]
    return str(body.get("error", body)) if isinstance(body, dict) else str(body)[:200]
