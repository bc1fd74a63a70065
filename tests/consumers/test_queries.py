"""The named queries over a small store filled by a real gate: expected rows, paging, parameter checks."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import duckdb
import pytest
from pydantic import BaseModel

from consumers import QUERIES, AuditStore, QueryError, RawRecord, UnknownQueryError, describe_queries, run_query
from events import EVENT_TYPES, EventBase, MemorySink, encode_event
from interceptor_core import (
    Approval,
    ApprovalRequest,
    Block,
    Deny,
    Gate,
    RequireApproval,
    RunContext,
    Substitute,
    ToolBlockedError,
    ToolCall,
    UnmediatedAccessError,
    tool,
)

TOPIC = "callgate.audit"
ACME = RunContext(tenant="acme", principal="u-1")
GLOBEX = RunContext(tenant="globex", principal="u-2")
SECRET = "sk-" + "a1B2c3D4" * 6


class OrderQuery(BaseModel):
    order_id: str


@tool(description="Loads an order record by ID")
def get_order(args: OrderQuery) -> str:
    return f"order {args.order_id}"


@tool
def refund(order_id: str, amount_cents: int) -> str:
    """Refunds an order."""
    return f"refunded {amount_cents}"


@tool
def run_sql(query: str) -> str:
    """Runs SQL."""
    return "done"


@tool
def send_email(to: str, body: str, api_key: str) -> str:
    """Sends an email."""
    return "sent"


@tool
def quote(order_id: str) -> str:
    """Quotes a price."""
    return "42"


class TenantOrders:
    name = "tenant-orders"

    def before_tool_call(self, call: ToolCall) -> Any:
        order = call.args.get("order_id")
        if order is not None and not order.startswith((call.run.tenant or "").upper() + "-"):
            return Deny(f"Order {order} does not belong to tenant {call.run.tenant}.")
        return None


class Policy:
    name = "policy"

    def before_tool_call(self, call: ToolCall) -> Any:
        if call.tool_name == "refund" and call.args["amount_cents"] > 100:
            return RequireApproval("refund over 100")
        if call.tool_name == "run_sql" and "drop" in call.args["query"].lower():
            return Block("DROP statements are never allowed")
        if call.tool_name == "quote":
            return Substitute("cached quote")
        return None


async def reviewer(request: ApprovalRequest) -> Approval:
    return Approval(approved=request.args["amount_cents"] < 1000, by="lead")


def shop_events() -> list[EventBase]:
    """A small day at the shop: allowed, denied, approved, refused, blocked, substituted, unknown-tool,
    redacted and nested calls, and one unmediated use of a guarded client."""
    sink = MemorySink()
    gate = Gate("shop", interceptors=[TenantOrders(), Policy()], sinks=[sink], approval_handler=reviewer)
    desk = gate.workflow("support").agent("desk", tools=[get_order, refund, run_sql, send_email, quote])
    payments = gate.guard({"balance": 1}, name="payments", tools=["refund"])

    @tool
    async def delegate() -> str:
        """Asks the desk."""
        return (await desk.call("get_order", {"order_id": "ACME-9"}, run=ACME, call_id="c-child")).to_model_text()

    outer = gate.agent("outer", tools=[delegate])

    async def day() -> None:
        await desk.call("get_order", {"order_id": "ACME-1"}, run=ACME, call_id="c-ok")
        await desk.call("get_order", {"order_id": "GLOBEX-7"}, run=ACME, call_id="c-deny-7")
        await desk.call("get_order", {"order_id": "GLOBEX-8"}, run=ACME, call_id="c-deny-8")
        await desk.call("get_order", {"order_id": "ACME-3"}, run=GLOBEX, call_id="c-deny-globex")
        await desk.call("refund", {"order_id": "ACME-1", "amount_cents": 500}, run=ACME, call_id="c-approved")
        await desk.call("refund", {"order_id": "ACME-2", "amount_cents": 5000}, run=ACME, call_id="c-refused")
        with pytest.raises(ToolBlockedError):
            await desk.call("run_sql", {"query": "DROP TABLE orders"}, run=GLOBEX, call_id="c-blocked")
        await desk.call("quote", {"order_id": "ACME-5"}, run=ACME, call_id="c-quote")
        await desk.call("wire_money", {"to": "elsewhere"}, run=ACME, call_id="c-unknown")
        await desk.call("send_email", {"to": "a@b.c", "body": "hi", "api_key": SECRET}, run=ACME, call_id="c-email")
        await outer.call("delegate", {}, run=ACME, call_id="c-outer")

    asyncio.run(day())
    with pytest.raises(UnmediatedAccessError):
        payments["balance"]
    return list(sink.events)


def lab_events() -> list[EventBase]:
    """Another producer: its registration and three calls."""
    sink = MemorySink()
    lab = Gate("lab", sinks=[sink]).agent("bench", tools=[quote])

    async def run() -> None:
        for n in range(3):
            await lab.call("quote", {"order_id": f"LAB-{n}"}, run=GLOBEX)

    asyncio.run(run())
    return list(sink.events)


class Fixture:
    """The store every test here reads, and what was put in it."""

    def __init__(self, con: duckdb.DuckDBPyConnection, shop: list[EventBase], lab: list[EventBase]) -> None:
        self.con = con
        self.shop = shop
        self.lab = lab
        self.start = min(e.time for e in shop + lab)

    def run(self, name: str, **params: Any) -> list[dict[str, Any]]:
        return run_query(self.con, name, params).rows


@pytest.fixture(scope="module")
def fx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fixture]:
    """Shop events on partition 0; the lab's on partition 1 without its seq 2 (a gap, once closed); one
    record that is not JSON."""
    shop, lab = shop_events(), lab_events()
    kept_lab = [e for e in lab if e.seq != 2]
    batch = [RawRecord(TOPIC, 0, i, e.producer_id.encode(), encode_event(e)) for i, e in enumerate(shop)]
    batch += [RawRecord(TOPIC, 1, i, e.producer_id.encode(), encode_event(e)) for i, e in enumerate(kept_lab)]
    batch.append(RawRecord(TOPIC, 1, 50, b"lab", b"{oops"))
    store = AuditStore(tmp_path_factory.mktemp("queries") / "audit.duckdb")
    store.ingest(batch, {(TOPIC, 0): len(shop), (TOPIC, 1): 51})
    store.close_open_gaps()
    try:
        yield Fixture(store.cursor(), shop, lab)
    finally:
        store.close()


class TestBlockedAttempts:
    def test_lists_denials_and_blocks_newest_first(self, fx: Fixture) -> None:
        """Every ToolDenied and Blocked event is listed, newest first, with the deciding interceptor and message."""
        rows = fx.run("blocked_attempts")
        assert sorted(r["call_id"] for r in rows) == [
            "c-blocked",
            "c-deny-7",
            "c-deny-8",
            "c-deny-globex",
            "c-refused",
            "c-unknown",
        ]
        times = [r["time"] for r in rows]
        assert times == sorted(times, reverse=True)
        blocked = next(r for r in rows if r["type"] == "Blocked")
        assert (blocked["decided_by"], blocked["cause"], blocked["tenant"], blocked["tool"]) == (
            "policy",
            "block",
            "globex",
            "run_sql",
        )
        assert blocked["message"] == "DROP statements are never allowed"

    def test_filters_combine(self, fx: Fixture) -> None:
        """Tenant, type, interceptor, tool and case-insensitive text filters narrow the list together."""
        assert {r["call_id"] for r in fx.run("blocked_attempts", tenant="globex")} == {"c-deny-globex", "c-blocked"}
        assert [r["call_id"] for r in fx.run("blocked_attempts", type="Blocked")] == ["c-blocked"]
        denied = fx.run("blocked_attempts", decided_by="tenant-orders", text="DOES NOT BELONG", principal="u-1")
        assert {r["call_id"] for r in denied} == {"c-deny-7", "c-deny-8"}
        assert fx.run("blocked_attempts", tool="refund", agent="desk")[0]["cause"] == "approval_refused"
        assert fx.run("blocked_attempts", text="%") == []  # text is literal, no wildcards

    def test_pages_with_limit_and_offset(self, fx: Fixture) -> None:
        """limit and offset page through the same order."""
        everything = [r["event_id"] for r in fx.run("blocked_attempts")]
        pages = [r["event_id"] for off in range(0, 6, 2) for r in fx.run("blocked_attempts", limit=2, offset=off)]
        assert pages == everything

    def test_time_window(self, fx: Fixture) -> None:
        """since and until bound the time; a window after every event is empty."""
        after = (max(e.time for e in fx.shop) + timedelta(seconds=1)).isoformat()
        assert fx.run("blocked_attempts", since=after) == []
        assert len(fx.run("blocked_attempts", until=after)) == 6

    def test_count_matches_the_list(self, fx: Fixture) -> None:
        """blocked_attempts_count counts what the same filters list, split into denied and blocked."""
        (row,) = fx.run("blocked_attempts_count")
        assert (row["attempts"], row["denied"], row["blocked"]) == (6, 5, 1)
        (acme,) = fx.run("blocked_attempts_count", tenant="acme")
        assert (acme["attempts"], acme["blocked"]) == (4, 0)


class TestTrends:
    def test_decision_trends_count_every_event_by_type(self, fx: Fixture) -> None:
        """The per-bucket counts add up to the stored events of each type."""
        rows = fx.run("decision_trends", bucket_minutes=60)
        totals: dict[str, int] = {}
        for r in rows:
            totals[r["type"]] = totals.get(r["type"], 0) + r["events"]
        stored = [e for e in fx.shop + fx.lab if not (e.producer_id == fx.lab[0].producer_id and e.seq == 2)]
        expected: dict[str, int] = {}
        for e in stored:
            expected[e.type] = expected.get(e.type, 0) + 1  # type: ignore[attr-defined]
        assert totals == expected

    def test_denial_rate_per_tool(self, fx: Fixture) -> None:
        """By tool, the rate is the tool's denied and blocked calls over its calls."""
        rows = fx.run("denial_rate", by="tool", bucket_minutes=10080)
        per_tool: dict[str, tuple[int, int]] = {}
        for r in rows:
            calls, denied = per_tool.get(r["key"], (0, 0))
            per_tool[r["key"]] = (calls + r["calls"], denied + r["denied"])
        assert per_tool["get_order"] == (5, 3)
        assert per_tool["run_sql"] == (1, 1)
        assert per_tool["quote"][1] == 0

    def test_denial_rate_per_interceptor(self, fx: Fixture) -> None:
        """By interceptor, only deciding interceptors appear, with their denials."""
        rows = fx.run("denial_rate", by="interceptor", bucket_minutes=10080, tenant="acme")
        denied: dict[str, int] = {}
        for r in rows:
            denied[r["key"]] = denied.get(r["key"], 0) + r["denied"]
            assert 0 < r["rate"] <= 1
        assert denied == {"tenant-orders": 2, "approval": 1, "registry": 1}

    def test_top_denied_by_tenant(self, fx: Fixture) -> None:
        """top_denied groups blocked attempts by the chosen column, most first."""
        rows = fx.run("top_denied", by="tenant")
        assert [(r["key"], r["attempts"], r["blocked"]) for r in rows] == [("acme", 4, 0), ("globex", 2, 1)]
        (top,) = fx.run("top_denied", by="decided_by", limit=1)
        assert (top["key"], top["attempts"]) == ("tenant-orders", 3)

    def test_event_counts_compare_with_the_previous_window(self, fx: Fixture) -> None:
        """Every known type is listed with its count in the window and in the window before it."""
        rows = {r["type"]: r for r in fx.run("event_counts")}
        assert len(rows) == len(EVENT_TYPES)
        assert rows["Blocked"]["events"] == 1
        assert rows["Blocked"]["previous_events"] == 0
        assert rows["Unmediated"]["events"] == 1
        later = (fx.start + timedelta(hours=2)).isoformat()
        shifted = {
            r["type"]: r for r in fx.run("event_counts", since=(fx.start + timedelta(hours=1)).isoformat(), until=later)
        }
        assert shifted["Blocked"]["events"] == 0
        assert shifted["Blocked"]["previous_events"] == 1

    def test_new_denial_reasons_mask_ids(self, fx: Fixture) -> None:
        """Messages differing only in numbers are one reason; none are new in a window after all of them."""
        rows = fx.run("new_denial_reasons")
        reasons = {r["reason"]: r for r in rows}
        merged = reasons["Order GLOBEX-N does not belong to tenant acme."]
        assert (merged["occurrences"], merged["decided_by"]) == (2, "tenant-orders")
        assert merged["sample_message"] == "Order GLOBEX-7 does not belong to tenant acme."
        after = max(e.time for e in fx.shop) + timedelta(seconds=1)
        later = fx.run("new_denial_reasons", since=after.isoformat(), until=(after + timedelta(hours=1)).isoformat())
        assert later == []


class TestCalls:
    def test_call_detail_shows_the_approval_trail(self, fx: Fixture) -> None:
        """An approved call shows its request, resolution and outcome with the decision trail and args."""
        rows = fx.run("call_detail", call_id="c-approved")
        assert [r["type"] for r in rows] == ["ApprovalRequested", "ApprovalResolved", "ToolUse"]
        assert rows[1]["outcome"] == "approved"
        assert rows[2]["args"] == {"order_id": "ACME-1", "amount_cents": 500}
        assert [d["interceptor"] for d in rows[2]["decisions"] if d["phase"] == "before"] == ["tenant-orders", "policy"]
        assert {r["relation"] for r in rows} == {"call"}

    def test_call_detail_shows_redacted_paths_and_nested_calls(self, fx: Fixture) -> None:
        """Redacted args never show the secret; an outer call lists its child call's events as 'child'."""
        (email,) = fx.run("call_detail", call_id="c-email")
        assert email["redacted_paths"] == ["/api_key"]
        assert SECRET not in json.dumps(email)
        outer = fx.run("call_detail", call_id="c-outer")
        assert [(r["relation"], r["tool"]) for r in outer] == [("call", "delegate"), ("child", "get_order")]

    def test_call_detail_needs_a_call_id(self, fx: Fixture) -> None:
        """call_detail without call_id raises QueryError naming the parameter."""
        with pytest.raises(QueryError, match="call_id") as caught:
            fx.run("call_detail")
        assert caught.value.param == "call_id"


class TestCoverage:
    def test_unmediated_lists_guarded_client_misuse(self, fx: Fixture) -> None:
        """The unmediated use is listed with resource, attribute and bound tools; the count agrees."""
        (row,) = fx.run("unmediated", tool="refund")
        assert (row["resource"], row["attribute"], row["bound_tools"]) == ("payments", "__getitem__", ["refund"])
        assert fx.run("unmediated", tool="get_order") == []
        assert fx.run("unmediated_count")[0]["accesses"] == 1

    def test_registered_tools_come_from_tools_registered_events(self, fx: Fixture) -> None:
        """Each scope's tools are listed with their effective interceptor chain."""
        rows = fx.run("registered_tools", gate="shop")
        scoped = {(r["agent"], r["tool"]): r for r in rows}
        assert set(scoped) == {
            ("desk", "get_order"),
            ("desk", "refund"),
            ("desk", "run_sql"),
            ("desk", "send_email"),
            ("desk", "quote"),
            ("outer", "delegate"),
        }
        assert scoped[("desk", "refund")]["interceptors"] == ["tenant-orders", "policy"]
        assert scoped[("desk", "get_order")]["description"] == "Loads an order record by ID"

    def test_exercised_tools_come_from_outcome_events(self, fx: Fixture) -> None:
        """Each tool called is listed with its outcomes; an unknown tool shows as not registered."""
        rows = {(r["gate"], r["agent"], r["tool"]): r for r in fx.run("exercised_tools")}
        order = rows[("shop", "desk", "get_order")]
        assert (order["calls"], order["ok"], order["denied"], order["registered"]) == (5, 2, 3, True)
        assert rows[("shop", "desk", "wire_money")]["registered"] is False
        assert rows[("shop", "desk", "quote")]["substituted"] == 1
        assert ("shop", "desk", "refund") in rows
        assert ("lab", "bench", "quote") in rows


class TestIntegrity:
    def test_chain_breaks_and_status(self, fx: Fixture) -> None:
        """The lab's missing seq is a recorded gap; chain_status shows the lab broken and the shop whole."""
        lab = fx.lab[0].producer_id
        (gap,) = fx.run("chain_breaks")
        assert (gap["producer_id"], gap["seq"], gap["kind"], gap["gate"]) == (lab, 2, "gap", "lab")
        assert fx.run("chain_breaks", kind="tamper") == []
        status = {r["gate"]: r for r in fx.run("chain_status")}
        assert (status["lab"]["ok"], status["lab"]["missing"], status["lab"]["gaps_recorded"]) == (False, 1, 1)
        assert (status["shop"]["ok"], status["shop"]["events"]) == (True, len(fx.shop))
        assert [r["gate"] for r in fx.run("chain_status", only_broken="true")] == ["lab"]

    def test_dead_letters_summary_and_records(self, fx: Fixture) -> None:
        """Dead letters are summarized per reason with a sample, and listed with position and key."""
        (summary,) = fx.run("dead_letters")
        assert (summary["reason"], summary["messages"], summary["sample_preview"]) == ("not_json", 1, "{oops")
        assert summary["sample_position"] == f"{TOPIC}/1/50"
        (record,) = fx.run("dead_letter_records", reason="not_json")
        assert (record["partition"], record["offset"], record["key"], record["value_bytes"]) == (1, 50, "lab", 5)

    def test_pipeline_health_per_partition(self, fx: Fixture) -> None:
        """One row per partition with its committed offset and the store-wide recent rate."""
        rows = fx.run("pipeline_health")
        assert [(r["partition"], r["next_offset"]) for r in rows] == [(0, len(fx.shop)), (1, 51)]
        assert rows[0]["total_events"] == len(fx.shop) + len(fx.lab) - 1
        assert rows[0]["events_per_minute"] > 0
        assert (rows[0]["dead_letters"], rows[0]["chain_breaks"]) == (1, 1)


class TestRunQuery:
    def test_every_query_runs_with_its_defaults_and_is_json_safe(self, fx: Fixture) -> None:
        """Every registered query (call_detail with its id) runs and its result serializes as JSON."""
        for name in QUERIES:
            params = {"call_id": "c-ok"} if name == "call_detail" else {}
            result = run_query(fx.con, name, params)
            decoded = json.loads(json.dumps(result.to_dict()))
            assert decoded["columns"] == list(result.columns)
            assert all(list(row) == list(result.columns) for row in result.rows)

    def test_text_values_are_converted(self, fx: Fixture) -> None:
        """Parameters given as text (as in a URL) are converted: integers, ISO times with Z, booleans."""
        result = run_query(fx.con, "blocked_attempts", {"limit": "2", "since": "2000-01-01T00:00:00Z"})
        assert len(result.rows) == 2
        assert result.params["since"] == "2000-01-01T00:00:00+00:00"
        assert isinstance(result.rows[0]["time"], str)
        datetime.fromisoformat(result.rows[0]["time"])

    @pytest.mark.parametrize(
        ("name", "params", "culprit"),
        [
            ("blocked_attempts", {"tenantt": "acme"}, "tenantt"),
            ("blocked_attempts", {"limit": "ten"}, "limit"),
            ("blocked_attempts", {"limit": 1001}, "limit"),
            ("blocked_attempts", {"offset": -1}, "offset"),
            ("blocked_attempts", {"type": "ToolUse"}, "type"),
            ("blocked_attempts", {"since": "yesterday"}, "since"),
            ("runs", {"run_ids": "r-1"}, "run_ids"),
            ("runs", {"run_ids": "[1, 2]"}, "run_ids"),
            ("blocked_attempts", {"since": "2024-02-01T00:00:00Z", "until": "2024-01-01T00:00:00Z"}, "since"),
            ("blocked_attempts", {"limit": True}, "limit"),
            ("top_denied", {"by": "event_id; DROP TABLE events"}, "by"),
            ("chain_status", {"only_broken": "maybe"}, "only_broken"),
            ("decision_trends", {"bucket_minutes": 0}, "bucket_minutes"),
        ],
    )
    def test_bad_parameters_raise_query_error_naming_them(
        self, fx: Fixture, name: str, params: dict[str, Any], culprit: str
    ) -> None:
        """An unknown parameter or a bad value raises QueryError naming the parameter, before any SQL runs."""
        with pytest.raises(QueryError) as caught:
            run_query(fx.con, name, params)
        assert caught.value.param == culprit
        assert repr(culprit) in str(caught.value)

    def test_unknown_parameters_are_all_named(self, fx: Fixture) -> None:
        """Several unknown parameters are named together."""
        with pytest.raises(QueryError, match="'bogus', 'other'"):
            run_query(fx.con, "chain_breaks", {"other": 1, "bogus": 2})

    def test_unknown_query_raises_unknown_query_error(self, fx: Fixture) -> None:
        """A name outside QUERIES raises UnknownQueryError (a QueryError and a KeyError) naming it; no SQL from a
        caller ever runs."""
        with pytest.raises(UnknownQueryError, match="unknown query 'SELECT 1'") as caught:
            run_query(fx.con, "SELECT 1")
        assert isinstance(caught.value, QueryError)
        assert isinstance(caught.value, KeyError)
        assert caught.value.param is None

    def test_describe_lists_every_query_with_its_parameters(self) -> None:
        """describe_queries lists each query with its parameter specs, JSON-safe."""
        listing = describe_queries()
        assert [q["name"] for q in listing] == sorted(QUERIES)
        detail = next(q for q in listing if q["name"] == "blocked_attempts")
        limit = next(p for p in detail["parameters"] if p["name"] == "limit")
        assert (limit["type"], limit["default"], limit["maximum"]) == ("int", 100, 1000)
        json.dumps(listing)

    def test_a_naive_time_means_utc(self, fx: Fixture) -> None:
        """A time without a zone is taken as UTC, not as the host's zone."""
        result = run_query(fx.con, "blocked_attempts_count", {"since": "2030-01-01T00:00:00"})
        assert result.params["since"] == datetime(2030, 1, 1, tzinfo=UTC).isoformat()


class TestDashboardQueries:
    def test_overview_counts_split_the_window_from_the_one_before(self, fx: Fixture) -> None:
        """One row per metric in display order: the last hour's counts, and zeros for the hour before."""
        rows = fx.run("overview_counts")
        counts = {r["metric"]: (r["value"], r["previous"]) for r in rows}
        assert [r["metric"] for r in rows][:3] == ["calls", "allowed", "denied"]
        assert counts["denied"] == (5, 0)
        assert counts["blocked"] == (1, 0)
        assert counts["approvals_asked"] == (2, 0)
        assert counts["approvals_refused"] == (1, 0)
        assert counts["unmediated"] == (1, 0)
        assert counts["chain_breaks"] == (1, 0)
        assert counts["calls"][0] == sum(counts[k][0] for k in ("allowed", "denied", "substituted", "blocked"))
        since, until = fx.start + timedelta(hours=1), fx.start + timedelta(hours=2)
        shifted = {r["metric"]: r for r in fx.run("overview_counts", since=since.isoformat(), until=until.isoformat())}
        assert (shifted["denied"]["value"], shifted["denied"]["previous"]) == (0, 5)
        acme = {r["metric"]: r["value"] for r in fx.run("overview_counts", tenant="acme")}
        assert (acme["denied"], acme["blocked"]) == (4, 0)

    def test_ingest_lag_per_partition(self, fx: Fixture) -> None:
        """Each consumed partition with its committed offset and the events ingested from it recently."""
        rows = fx.run("ingest_lag")
        assert [(r["partition"], r["next_offset"]) for r in rows] == [(0, len(fx.shop)), (1, 51)]
        assert [r["recent_events"] for r in rows] == [len(fx.shop), len(fx.lab) - 1]
        assert all(r["median_delay_s"] >= 0 for r in rows)


class TestApprovalQueriesAtScale:
    def test_thousands_of_pending_requests_list_within_the_stores_memory(self, tmp_path: Any) -> None:
        """6,000 pending requests under the store's default memory limit: `pending_approvals` pages
        them and `approval_request` finds one (reading each request's JSON once per row, not once per
        column, which ran out of memory here)."""
        from events.chain import Producer, new_event_id
        from events.models import ApprovalRequestedEvent

        producer, now = Producer(), datetime.now(UTC)
        requests = [
            producer.seal(
                ApprovalRequestedEvent,
                {
                    "event_id": new_event_id(),
                    "time": now + timedelta(microseconds=i),
                    "gate": "g",
                    "tool": "refund",
                    "call_id": f"c-{i}",
                    "run_id": f"run-{i // 20}",
                    "tenant": f"tenant-{i % 50}",
                    "principal": f"user-{i % 500}",
                    "args": {"order_id": f"ACME-{i}", "amount_cents": i},
                    "decisions": [],
                    "reason": "refund over 100",
                    "requested_by": ("policy",),
                    "approval_id": f"{i:032x}",
                    "args_digest": "d" * 64,
                    "policy_version": "p" * 64,
                    "rule": "big-refunds",
                    "expires_at": (now + timedelta(hours=1)).isoformat(),
                },
            )
            for i in range(6000)
        ]
        with AuditStore(tmp_path / "audit.duckdb") as store:
            records = [RawRecord(TOPIC, 0, i, e.producer_id.encode(), encode_event(e)) for i, e in enumerate(requests)]
            store.ingest(records, {(TOPIC, 0): len(records)})
            con = store.cursor()
            page = run_query(con, "pending_approvals", {"limit": 100}).rows
            one = run_query(con, "approval_request", {"approval_id": f"{17:032x}"}).rows
        assert [row["approval_id"] for row in page] == [f"{i:032x}" for i in range(5999, 5899, -1)]
        assert page[0]["args"] == {"order_id": "ACME-5999", "amount_cents": 5999}
        assert page[0]["requested_by"] == ["policy"]
        assert (one[0]["status"], one[0]["tenant"], one[0]["rule"]) == ("pending", "tenant-17", "big-refunds")
