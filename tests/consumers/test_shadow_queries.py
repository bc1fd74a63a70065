"""Shadow mode in the store: the shadow columns (ingested and migrated), the shadow queries, the
replay export and its cursor, and coverage that never counts a shadow step as mediation."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from consumers.coverage import run_checks
from consumers.queries import MAX_REPLAY_LIMIT, QueryError, describe_queries, run_query
from consumers.reader import FileReader
from consumers.store import MIGRATIONS, SCHEMA_VERSION, AuditStore, RawRecord, connect
from events import EventBase, MemorySink, Redactor, ToolsRegisteredEvent, ToolUseEvent, encode_event
from events.chain import Producer
from events.models import OUTCOME_TYPES, RegisteredTool
from interceptor_core import Block, Deny, Gate, RunContext, Substitute, ToolCall, shadow, tool
from interceptor_core.policy import Policy

TOPIC = "callgate.events"
ACME = RunContext(tenant="acme", principal="u-1")
GLOBEX = RunContext(tenant="globex", principal="u-2")
SHADOW_COLUMNS = ("shadow_outcome", "divergent", "shadow_decided_by", "shadow_rule")

# An enforced rule and two shadow candidates in one policy file.
REFUNDS = """\
version: 1
name: refunds
rules:
  - id: big-refunds
    tools: [refund]
    when: "args.amount_cents > 20000"
    decision: deny
    message: "over 200.00"
  - id: stricter-refunds
    mode: shadow
    tools: [refund]
    when: "args.amount_cents > 5000"
    decision: deny
    message: "over 50.00"
  - id: review-quotes
    mode: shadow
    tools: [quote]
    when: "args.order_id == 'ACME-7'"
    decision: require_approval
    message: "a person looks at this quote"
"""


@tool
def refund(order_id: str, amount_cents: int) -> str:
    """Refunds an order."""
    return f"refunded {amount_cents}"


@tool
def get_order(order_id: str) -> str:
    """Loads an order."""
    return f"order {order_id}"


@tool
def quote(order_id: str) -> str:
    """Quotes a price."""
    return "42"


class TenantOrders:
    """Enforced: an order of another tenant is denied."""

    name = "tenant-orders"

    def before_tool_call(self, call: ToolCall) -> Any:
        order = call.args.get("order_id")
        if order is not None and not order.startswith((call.run.tenant or "").upper() + "-"):
            return Deny(f"Order {order} does not belong to tenant {call.run.tenant}.")
        return None


class FrozenTenants:
    """A candidate, in shadow: globex would be blocked."""

    name = "frozen-tenants"

    def before_tool_call(self, call: ToolCall) -> Any:
        return Block("globex is frozen") if call.run.tenant == "globex" else None


class CachedQuotes:
    """A candidate, in shadow: the quote of ACME-5 would come from the cache."""

    name = "cached-quotes"

    def before_tool_call(self, call: ToolCall) -> Any:
        return Substitute("cached quote") if call.args.get("order_id") == "ACME-5" else None


# call id -> (what happened, shadow_outcome, divergent, shadow_decided_by, shadow_rule); None: no
# shadow decision at all.
EXPECTED: dict[str, tuple[str, str, bool, str | None, str | None] | None] = {
    "small": ("ToolUse", "allowed", False, None, None),
    "mid-1": ("ToolUse", "denied", True, "refunds", "stricter-refunds"),
    "mid-2": ("ToolUse", "denied", True, "refunds", "stricter-refunds"),
    "big": ("ToolDenied", "denied", False, "refunds", "big-refunds"),
    "frozen": ("ToolUse", "blocked", True, "frozen-tenants", None),
    "foreign": None,  # the enforced deny ended the call before any shadow interceptor ran
    "globex-mid": ("ToolUse", "denied", True, "refunds", "stricter-refunds"),
    "cached": ("ToolUse", "substituted", True, "cached-quotes", None),
    "reviewed": ("ToolUse", "approval", True, "refunds", "review-quotes"),
}


def shop_events() -> list[EventBase]:
    """A shop with an enforced interceptor, a policy file with shadow rules and two shadow
    interceptors; one call per EXPECTED entry, in its order."""
    sink = MemorySink()
    gate = Gate(
        "shop",
        interceptors=[TenantOrders(), Policy.from_text(REFUNDS), shadow(FrozenTenants()), shadow(CachedQuotes())],
        sinks=[sink],
    )
    desk = gate.workflow("support").agent("desk", tools=[refund, get_order, quote])
    calls: list[tuple[str, str, dict[str, Any], RunContext]] = [
        ("small", "refund", {"order_id": "ACME-1", "amount_cents": 1000}, ACME),
        ("mid-1", "refund", {"order_id": "ACME-2", "amount_cents": 6000}, ACME),
        ("mid-2", "refund", {"order_id": "ACME-3", "amount_cents": 7000}, ACME),
        ("big", "refund", {"order_id": "ACME-4", "amount_cents": 30000}, ACME),
        ("frozen", "get_order", {"order_id": "GLOBEX-1"}, GLOBEX),
        ("foreign", "get_order", {"order_id": "GLOBEX-2"}, ACME),
        ("globex-mid", "refund", {"order_id": "GLOBEX-3", "amount_cents": 6000}, GLOBEX),
        ("cached", "quote", {"order_id": "ACME-5"}, ACME),
        ("reviewed", "quote", {"order_id": "ACME-7"}, ACME),
    ]

    async def day() -> None:
        for call_id, name, args, run in calls:
            await desk.call(name, args, run=run, call_id=call_id)

    asyncio.run(day())
    return list(sink.events)


def lab_events() -> list[EventBase]:
    """Another gate without any shadow decision: two calls."""
    sink = MemorySink()
    lab = Gate("lab", interceptors=[TenantOrders()], sinks=[sink]).workflow("research").agent("bench", tools=[quote])

    async def run() -> None:
        for n in range(2):
            await lab.call("quote", {"order_id": f"GLOBEX-{n}"}, run=GLOBEX, call_id=f"lab-{n}")

    asyncio.run(run())
    return list(sink.events)


class BrokenDetector:
    """A redaction detector that fails: the gate then keeps no arguments at all."""

    name = "broken"

    def find(self, text: str) -> Any:
        raise RuntimeError("detector broke")


@tool
def note(text: str) -> str:
    """Takes a note."""
    return "noted"


def archive_events() -> list[EventBase]:
    """Two gates whose events hold no usable arguments: one cuts them (archive-cut), one failed to
    redact them (archive-broken)."""
    events: list[EventBase] = []
    for call_id, redactor in (
        ("archive-cut", Redactor(max_chars=30)),
        ("archive-broken", Redactor(extra_detectors=[BrokenDetector()])),
    ):
        sink = MemorySink()
        clerk = Gate("archive", sinks=[sink], redactor=redactor).agent("clerk", tools=[note])
        asyncio.run(clerk.call("note", {"text": "x" * 100}, run=ACME, call_id=call_id))
        events += sink.events
    return events


def records(events: list[EventBase], start: int = 0) -> list[RawRecord]:
    return [RawRecord(TOPIC, 0, start + i, e.producer_id.encode(), encode_event(e)) for i, e in enumerate(events)]


def store_of(path: Path, events: list[EventBase]) -> Path:
    with AuditStore(path) as store:
        store.ingest(records(events), {(TOPIC, 0): len(events)})
    return path


def outcomes(events: list[EventBase]) -> list[Any]:
    return [e for e in events if e.type in OUTCOME_TYPES]  # type: ignore[attr-defined]


class Fixture:
    """The store every query test here reads (closed, read through a FileReader), and its events."""

    def __init__(self, reader: FileReader, path: Path, shop: list[EventBase], lab: list[EventBase]) -> None:
        self.reader = reader
        self.path = path
        self.shop = shop
        self.lab = lab

    def run(self, name: str, **params: Any) -> list[dict[str, Any]]:
        return self.reader.query(name, params).rows

    def sql(self, sql: str) -> list[tuple[Any, ...]]:
        con = self.reader._open().cursor()
        try:
            return con.execute(sql).fetchall()
        finally:
            con.close()


@pytest.fixture(scope="module")
def fx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fixture]:
    shop, lab = shop_events(), lab_events() + archive_events()
    path = store_of(tmp_path_factory.mktemp("shadow") / "audit.duckdb", shop + lab)
    with FileReader(path) as reader:
        yield Fixture(reader, path, shop, lab)


def shadow_row(row: dict[str, Any]) -> tuple[Any, ...]:
    return (row["type"], row["shadow_outcome"], row["divergent"], row["shadow_decided_by"], row["shadow_rule"])


class TestShadowColumns:
    """The four shadow columns and the trail, as ingest writes them."""

    def test_ingest_fills_the_shadow_columns_from_the_outcome_events(self, fx: Fixture) -> None:
        """Every outcome event's columns are its shadow fields; a call without a shadow decision has none."""
        stored = {
            call_id: (kind, *shadow)
            for call_id, kind, *shadow in fx.sql(
                "SELECT call_id, type, shadow_outcome, divergent, shadow_decided_by, shadow_rule FROM events "
                "WHERE type IN ('ToolUse', 'ToolDenied', 'Substitute', 'Blocked') AND gate = 'shop'"
            )
        }
        assert set(stored) == set(EXPECTED)
        for call_id, expected in EXPECTED.items():
            assert stored[call_id] == (expected or (stored[call_id][0], None, None, None, None)), call_id
        assert stored["foreign"][0] == "ToolDenied"
        others = fx.sql(
            "SELECT count(*) FROM events WHERE (gate = 'lab' OR type NOT IN ('ToolUse', 'ToolDenied', 'Substitute', "
            "'Blocked')) AND (shadow_outcome IS NOT NULL OR divergent IS NOT NULL OR shadow_decided_by IS NOT NULL)"
        )
        assert others == [(0,)]

    def test_the_trail_names_only_the_enforced_steps(self, fx: Fixture) -> None:
        """Shadow steps stay in the event's decisions but not in `trail`, which coverage reads."""
        (row,) = fx.sql("SELECT trail, event FROM events WHERE call_id = 'frozen' AND type = 'ToolUse'")
        trail, event = row
        assert trail == ["tenant-orders", "refunds"]
        steps = json.loads(event)["decisions"]
        assert [(s["interceptor"], s["enforced"]) for s in steps] == [
            ("tenant-orders", True),
            ("refunds", True),
            ("frozen-tenants", False),
            ("cached-quotes", False),
        ]


def v3_copy(source: Path, target: Path) -> None:
    """`target` as the previous code (schema version 3) would have stored `source`'s events: the
    first three migrations only, and the trail as migration 3 wrote it (every step's interceptor)."""
    con = connect(target)
    try:
        con.execute(
            "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name VARCHAR NOT NULL, "
            "applied_at TIMESTAMPTZ NOT NULL)"
        )
        for migration in MIGRATIONS[:3]:
            for statement in migration.statements:
                con.execute(statement)
            con.execute("INSERT INTO schema_migrations VALUES (?, ?, now())", [migration.version, migration.name])
        con.execute(f"ATTACH '{source}' AS current (READ_ONLY)")
        con.execute(
            "INSERT INTO events BY NAME SELECT * EXCLUDE (trail, shadow_outcome, divergent, shadow_decided_by, "
            "shadow_rule, event_uuid), coalesce(json_extract_string(event, '$.decisions[*].interceptor'), []) AS trail "
            "FROM current.events"
        )
        con.execute("DETACH current")
    finally:
        con.close()


class TestMigration:
    """Migration 4 on a store the previous code wrote."""

    def test_a_version_3_store_upgrades_to_the_columns_ingest_writes(self, fx: Fixture, tmp_path: Path) -> None:
        """Opening a v3 file for writing adds and backfills the shadow columns and drops shadow steps from
        the trail: the same rows a fresh ingest stores."""
        old = tmp_path / "v3.duckdb"
        v3_copy(fx.path, old)
        query = "SELECT event_id, trail, shadow_outcome, divergent, shadow_decided_by, shadow_rule FROM events"
        con = connect(old)
        try:
            (frozen_trail,) = con.execute(
                "SELECT trail FROM events WHERE call_id = 'frozen' AND type = 'ToolUse'"
            ).fetchall()
            assert frozen_trail[0] == ["tenant-orders", "refunds", "frozen-tenants", "cached-quotes"]
            with pytest.raises(Exception, match="shadow_outcome"):
                con.execute("SELECT shadow_outcome FROM events")
        finally:
            con.close()
        with pytest.raises(Exception, match="open it for writing"):
            AuditStore(old, read_only=True)
        with AuditStore(old) as upgraded:
            assert upgraded.schema_version() == SCHEMA_VERSION
            con = upgraded.cursor()
            migrated = sorted(con.execute(query + " ORDER BY event_id").fetchall())
            (name,) = con.execute("SELECT name FROM schema_migrations WHERE version = 4").fetchone() or ("",)
        assert name == "shadow mode columns"
        assert migrated == sorted(fx.sql(query))
        assert sum(1 for row in migrated if row[2] is not None) == sum(1 for e in EXPECTED.values() if e)

    def test_an_upgraded_store_ingests_on(self, fx: Fixture, tmp_path: Path) -> None:
        """After the upgrade new events are stored with their shadow columns, the old ones kept."""
        old = tmp_path / "v3.duckdb"
        v3_copy(fx.path, old)
        more = shop_events()
        with AuditStore(old) as store:
            before = store.counts().total_events
            result = store.ingest(records(more, start=1000), {(TOPIC, 0): 1000 + len(more)})
            assert result.stored == len(more)
            con = store.cursor()
            (divergent,) = con.execute("SELECT count(*) FROM events WHERE divergent").fetchone() or (0,)
            assert store.counts().total_events == before + len(more)
        assert divergent == 2 * sum(1 for e in EXPECTED.values() if e and e[2])


class TestShadowImpact:
    """`shadow_impact`: what each shadow decider would have done, per tool and tenant."""

    def test_counts_per_decider_tool_and_tenant_most_divergent_first(self, fx: Fixture) -> None:
        """Each group counts its calls, what they would have become, and the divergent ones."""
        rows = fx.run("shadow_impact")
        table = [
            (
                r["shadow_decided_by"],
                r["shadow_rule"],
                r["tool"],
                r["tenant"],
                r["calls"],
                r["would_deny"],
                r["would_block"],
                r["would_substitute"],
                r["would_ask"],
                r["divergent"],
            )
            for r in rows
        ]
        assert table == [
            ("refunds", "stricter-refunds", "refund", "acme", 2, 2, 0, 0, 0, 2),
            ("cached-quotes", None, "quote", "acme", 1, 0, 0, 1, 0, 1),
            ("frozen-tenants", None, "get_order", "globex", 1, 0, 1, 0, 0, 1),
            ("refunds", "review-quotes", "quote", "acme", 1, 0, 0, 0, 1, 1),
            ("refunds", "stricter-refunds", "refund", "globex", 1, 1, 0, 0, 0, 1),
            ("refunds", "big-refunds", "refund", "acme", 1, 1, 0, 0, 0, 0),
            (None, None, "refund", "acme", 1, 0, 0, 0, 0, 0),
        ]
        mids = [e.time for e in outcomes(fx.shop) if e.call_id in ("mid-1", "mid-2")]
        assert (rows[0]["first_time"], rows[0]["last_time"]) == (min(mids).isoformat(), max(mids).isoformat())

    def test_filters_narrow_the_groups(self, fx: Fixture) -> None:
        """decider, rule, tool, tenant and gate are filters; a gate without shadow decisions has no rows."""
        assert {r["shadow_rule"] for r in fx.run("shadow_impact", decider="refunds")} == {
            "stricter-refunds",
            "review-quotes",
            "big-refunds",
        }
        (row,) = fx.run("shadow_impact", decider="refunds", rule="stricter-refunds", tenant="globex")
        assert (row["calls"], row["divergent"]) == (1, 1)
        assert [r["shadow_decided_by"] for r in fx.run("shadow_impact", tool="get_order")] == ["frozen-tenants"]
        assert fx.run("shadow_impact", gate="lab") == []
        assert len(fx.run("shadow_impact", gate="shop", limit=2)) == 2

    def test_time_window(self, fx: Fixture) -> None:
        """since and until bound the calls counted."""
        after = max(e.time for e in fx.shop) + timedelta(seconds=1)
        assert fx.run("shadow_impact", since=after.isoformat()) == []
        assert sum(r["calls"] for r in fx.run("shadow_impact", until=after.isoformat())) == 8


class TestShadowDivergence:
    """`shadow_divergence`: the same calls per time bucket."""

    def test_buckets_add_up_to_the_impact(self, fx: Fixture) -> None:
        """Per decider and rule, the buckets' calls and divergent calls sum to shadow_impact's."""
        totals: dict[tuple[Any, Any], list[int]] = {}
        for r in fx.run("shadow_divergence", bucket_minutes=1):
            total = totals.setdefault((r["shadow_decided_by"], r["shadow_rule"]), [0, 0])
            total[0] += r["calls"]
            total[1] += r["divergent"]
        impact: dict[tuple[Any, Any], list[int]] = {}
        for r in fx.run("shadow_impact"):
            total = impact.setdefault((r["shadow_decided_by"], r["shadow_rule"]), [0, 0])
            total[0] += r["calls"]
            total[1] += r["divergent"]
        assert totals == impact
        assert totals[("refunds", "stricter-refunds")] == [3, 3]
        (frozen,) = fx.run("shadow_divergence", decider="frozen-tenants", bucket_minutes=10080)
        assert (frozen["calls"], frozen["divergent"]) == (1, 1)


class TestShadowCalls:
    """`shadow_calls`: the calls behind the counts."""

    def test_lists_calls_with_a_shadow_outcome_newest_first(self, fx: Fixture) -> None:
        """Every call with a shadow outcome, with what happened and what would have, newest first."""
        rows = fx.run("shadow_calls")
        assert {r["call_id"]: shadow_row(r) for r in rows} == {k: v for k, v in EXPECTED.items() if v}
        times = [r["time"] for r in rows]
        assert times == sorted(times, reverse=True)
        assert list(rows[0]) == [
            "time",
            "event_id",
            "call_id",
            "type",
            "shadow_outcome",
            "divergent",
            "shadow_decided_by",
            "shadow_rule",
            "gate",
            "workflow",
            "agent",
            "tool",
            "tenant",
            "principal",
            "run_id",
            "decided_by",
            "message",
        ]
        big = next(r for r in rows if r["call_id"] == "big")
        assert (big["decided_by"], big["message"]) == ("refunds", "over 200.00")

    def test_filters_combine(self, fx: Fixture) -> None:
        """Decider, rule, divergent_only, shadow_outcome, principal and tenant narrow the list together."""

        def ids(**params: Any) -> set[str]:
            return {r["call_id"] for r in fx.run("shadow_calls", **params)}

        assert ids(decider="refunds", rule="stricter-refunds") == {"mid-1", "mid-2", "globex-mid"}
        assert ids(decider="refunds", divergent_only="true") == {"mid-1", "mid-2", "globex-mid", "reviewed"}
        assert ids(shadow_outcome="blocked") == {"frozen"}
        assert ids(principal="u-2") == {"frozen", "globex-mid"}
        assert ids(tenant="acme", tool="quote", shadow_outcome="approval") == {"reviewed"}
        assert ids(gate="lab") == set()

    def test_pages_with_limit_and_offset(self, fx: Fixture) -> None:
        """limit and offset page through the same order."""
        everything = [r["event_id"] for r in fx.run("shadow_calls")]
        pages = [r["event_id"] for off in range(0, 8, 3) for r in fx.run("shadow_calls", limit=3, offset=off)]
        assert pages == everything

    @pytest.mark.parametrize(
        ("params", "culprit"),
        [
            ({"shadow_outcome": "maybe"}, "shadow_outcome"),
            ({"divergent_only": "sometimes"}, "divergent_only"),
            ({"limit": 1001}, "limit"),
            ({"decidr": "refunds"}, "decidr"),
        ],
    )
    def test_bad_parameters_are_named(self, fx: Fixture, params: dict[str, Any], culprit: str) -> None:
        """A value outside the spec raises QueryError naming the parameter."""
        with pytest.raises(QueryError) as caught:
            fx.run("shadow_calls", **params)
        assert caught.value.param == culprit


def page_through(run: Any, limit: int, after: dict[str, Any] | None = None, **params: Any) -> list[dict[str, Any]]:
    """Every row of replay_calls after row `after` (from the start without it), a page of `limit` at a
    time, by its cursor (as `callgate replay` does)."""
    rows: list[dict[str, Any]] = []
    while True:
        cursor = {"after_time": after["time"], "after_event_id": after["event_id"]} if after else {}
        page = run("replay_calls", limit=limit, **params, **cursor)
        rows.extend(page)
        if len(page) < limit:
            return rows
        after = page[-1]


class TestReplayCalls:
    """`replay_calls`: the stored calls a replay needs, paged by a stable cursor."""

    def test_every_outcome_event_once_oldest_first(self, fx: Fixture) -> None:
        """Only outcome events, each once, ordered by (time, event_id); paging by cursor gives the same rows."""
        rows = fx.run("replay_calls")
        expected = outcomes(fx.shop + fx.lab)
        assert sorted(r["event_id"] for r in rows) == sorted(e.event_id for e in expected)
        assert [(r["time"], r["event_id"]) for r in rows] == sorted((r["time"], r["event_id"]) for r in rows)
        for limit in (1, 2, 5):
            assert page_through(fx.run, limit) == rows

    def test_columns_carry_what_a_replay_needs(self, fx: Fixture) -> None:
        """args and decisions are the event's JSON as text, redacted_paths a list, cause the denial's cause."""
        rows = {r["call_id"]: r for r in fx.run("replay_calls")}
        assert list(next(iter(rows.values()))) == [
            "event_id",
            "time",
            "type",
            "cause",
            "decided_by",
            "gate",
            "workflow",
            "agent",
            "tool",
            "call_id",
            "run_id",
            "thread_id",
            "tenant",
            "principal",
            "args",
            "redacted_paths",
            "decisions",
            "shadow_outcome",
            "args_truncated",
        ]
        events = {e.call_id: e for e in outcomes(fx.shop + fx.lab)}
        for call_id, row in rows.items():
            event = events[call_id]
            if call_id != "archive-broken":
                assert isinstance(row["args"], str)
                assert json.loads(row["args"]) == event.args
            assert row["args_truncated"] is event.args_truncated
            assert json.loads(row["decisions"]) == event.model_dump(mode="json")["decisions"]
            assert row["redacted_paths"] == list(event.redacted_paths)
            assert row["shadow_outcome"] == event.shadow_outcome
            assert (row["time"], row["tenant"], row["run_id"]) == (event.time.isoformat(), event.tenant, event.run_id)
        assert (rows["big"]["cause"], rows["big"]["decided_by"]) == ("deny", "refunds")
        assert rows["small"]["cause"] is None
        assert rows["cached"]["type"] == "ToolUse"
        assert (rows["lab-0"]["workflow"], rows["lab-0"]["agent"]) == ("research", "bench")
        assert rows["archive-broken"]["args"] is None  # the gate could not redact: it kept nothing
        cut = rows["archive-cut"]
        assert (cut["args_truncated"], list(json.loads(cut["args"]))) == (True, ["_truncated"])

    def test_filters(self, fx: Fixture) -> None:
        """gate, workflow, agent, tool, tenant and the window narrow the rows."""

        def ids(**params: Any) -> list[str]:
            return [r["call_id"] for r in fx.run("replay_calls", **params)]

        assert ids(gate="lab") == ["lab-0", "lab-1"]
        assert ids(workflow="research") == ids(agent="bench") == ["lab-0", "lab-1"]
        assert ids(gate="shop", tool="refund", tenant="acme") == ["small", "mid-1", "mid-2", "big"]
        after = max(e.time for e in fx.shop + fx.lab) + timedelta(seconds=1)
        assert ids(since=after.isoformat()) == []

    def test_the_cursor_is_stable_while_events_arrive(self, tmp_path: Path) -> None:
        """Events stored between two pages come after the cursor; no row is repeated or skipped."""
        first, second = shop_events(), shop_events()
        path = tmp_path / "audit.duckdb"
        with AuditStore(path) as store:
            store.ingest(records(first), {(TOPIC, 0): len(first)})
            con = store.cursor()

            def run(name: str, **params: Any) -> list[dict[str, Any]]:
                return run_query(con, name, params).rows

            page = run("replay_calls", limit=4)
            store.ingest(records(second, start=len(first)), {(TOPIC, 0): len(first) + len(second)})
            rest = page_through(run, 4, after=page[-1])
            ids = [r["event_id"] for r in page + rest]
        assert len(ids) == len(set(ids))
        assert sorted(ids) == sorted(e.event_id for e in outcomes(first + second))

    def test_limit_and_cursor_parameters_are_checked(self, fx: Fixture) -> None:
        """limit goes up to MAX_REPLAY_LIMIT; after_event_id alone is refused; after_time alone means strictly after."""
        assert MAX_REPLAY_LIMIT == 10_000
        assert len(fx.run("replay_calls", limit=MAX_REPLAY_LIMIT)) == len(outcomes(fx.shop + fx.lab))
        with pytest.raises(QueryError) as too_many:
            fx.run("replay_calls", limit=MAX_REPLAY_LIMIT + 1)
        assert too_many.value.param == "limit"
        with pytest.raises(QueryError, match="'after_event_id' needs 'after_time'") as half:
            fx.run("replay_calls", after_event_id="x")
        assert half.value.param == "after_event_id"
        with pytest.raises(QueryError) as offset:
            fx.run("replay_calls", offset=10)
        assert offset.value.param == "offset"
        rows = fx.run("replay_calls")
        assert fx.run("replay_calls", after_time=rows[2]["time"]) == rows[3:]

    def test_the_contract_is_described(self) -> None:
        """The listing describes the cursor and the limit, and that after_event_id requires after_time."""
        (spec,) = [q for q in describe_queries() if q["name"] == "replay_calls"]
        assert "after_time" in spec["description"]
        assert "after_event_id" in spec["description"]
        params = {p["name"]: p for p in spec["parameters"]}
        assert params["after_event_id"]["requires"] == "after_time"
        assert (params["limit"]["default"], params["limit"]["maximum"]) == (1000, MAX_REPLAY_LIMIT)
        assert "offset" not in params


def forged_shadow_only(*, enforced: bool) -> list[EventBase]:
    """A registration of `refund` with the chain ["refunds"], then a ToolUse whose only step named
    "refunds" is a shadow step (`enforced` False) or the enforced one."""
    producer = Producer()
    envelope = {"gate": "shop", "agent": "desk", "time": datetime.now(UTC)}
    tools = (RegisteredTool(name="refund", input_schema_sha256="0" * 64, interceptors=("refunds",)),)
    step = {
        "interceptor": "refunds",
        "scope": "application",
        "kind": "deny",
        "duration_ms": 0.0,
        "enforced": enforced,
    }
    return [
        producer.seal(ToolsRegisteredEvent, {**envelope, "event_id": "r1", "tools": tools}),
        producer.seal(
            ToolUseEvent,
            {
                **envelope,
                "event_id": "u1",
                "tool": "refund",
                "call_id": "c-forged",
                "outcome": "ok",
                "duration_ms": 1.0,
                "decisions": [step],
                "shadow_outcome": "denied",
                "divergent": True,
                "shadow_decided_by": "refunds",
            },
        ),
    ]


class TestCoverage:
    """A shadow interceptor is not part of what mediates a call."""

    def test_enforced_and_shadow_interceptors_verify(self, fx: Fixture) -> None:
        """The shop's tool runs carry their enforced chain; coverage passes with shadow interceptors beside it."""
        (summary,) = fx.run("coverage_summary")
        assert (summary["broken_producers"], summary["unmediated"]) == (0, 0)
        (verification,) = fx.run("tool_use_verification")
        tool_uses = sum(1 for e in fx.shop + fx.lab if e.type == "ToolUse")  # type: ignore[attr-defined]
        assert (verification["tool_uses"], verification["unverified"]) == (tool_uses, 0)
        registered = {r["tool"]: r["interceptors"] for r in fx.run("registered_tools", gate="shop")}
        assert registered == {t: ["tenant-orders", "refunds"] for t in ("refund", "get_order", "quote")}
        report = run_checks(fx.reader)
        assert report.ok, [c.to_dict() for c in report.checks if not c.ok]

    @pytest.mark.parametrize(("enforced", "unverified"), [(False, 1), (True, 0)])
    def test_a_shadow_step_does_not_stand_for_its_enforced_namesake(
        self, tmp_path: Path, enforced: bool, unverified: int
    ) -> None:
        """A run whose registered interceptor appears only as a shadow step is an incomplete trail."""
        path = store_of(tmp_path / "a.duckdb", forged_shadow_only(enforced=enforced))
        with FileReader(path) as reader:
            (verification,) = reader.query("tool_use_verification").rows
            problems = [r["problem"] for r in reader.query("unverified_tool_uses").rows]
        assert verification["unverified"] == unverified
        assert problems == ["incomplete_trail"] * unverified
