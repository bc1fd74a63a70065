"""The run queries over a real store of real agent runs: `run_events` (one run's story in order, the
runs of agents nested under its calls included) and `runs` (search by run id, principal, thread;
newest first, paged, with counts and outcome), each checked against plain SQL over the same file."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from consumers.queries import QUERIES, run_query
from consumers.store import AuditStore, RawRecord
from events import EventBase, MemorySink, encode_event
from interceptor_core import (
    Agent,
    Approval,
    ApprovalRequest,
    Block,
    Deny,
    Gate,
    ModelTurn,
    RequireApproval,
    RunContext,
    ScriptedModel,
    ToolBlockedError,
    ToolCall,
    ToolCallRequest,
    ToolContext,
    TurnDeniedError,
    tool,
)

TOPIC = "callgate.events"
DESK = RunContext(tenant="acme", principal="u-1", thread_id="t-1", run_id="run-desk")
OTHER = RunContext(tenant="globex", principal="u-2", thread_id="t-2", run_id="run-globex")
HELPER_RUN = "run-helper"
DENIED_TURN = RunContext(tenant="globex", principal="u-3", run_id="run-denied-turn")


@tool
def get_order(order_id: str) -> str:
    """Loads an order."""
    return f"order {order_id}"


@tool
def refund(order_id: str, amount_cents: int) -> str:
    """Refunds an order."""
    return f"refunded {amount_cents}"


@tool
def run_sql(query: str) -> str:
    """Runs SQL."""
    return "done"


class TenantOrders:
    name = "tenant-orders"

    def before_tool_call(self, call: ToolCall) -> Any:
        order = call.args.get("order_id")
        if order is not None and not order.startswith((call.run.tenant or "").upper() + "-"):
            return Deny(f"Order {order} does not belong to tenant {call.run.tenant}.")
        if call.tool_name == "refund" and call.args["amount_cents"] > 100:
            return RequireApproval("refund over 1.00")
        if call.tool_name == "run_sql":
            return Block("SQL is never run from chat")
        return None


class TurnGuard:
    name = "turn-guard"

    def before_turn(self, messages: list[Any]) -> None:
        return None


class NoRefundTalk:
    name = "no-refund-talk"

    def before_turn(self, messages: list[Any]) -> Any:
        return Deny("refunds are not discussed here")


async def lead(request: ApprovalRequest) -> Approval:
    return Approval(approved=True, by="lead", note="known customer")


def call(name: str, call_id: str, **args: Any) -> ToolCallRequest:
    return ToolCallRequest(call_id, name, args)


def run_events() -> list[EventBase]:
    """The desk's run (run-desk): a turn with an order and an approved refund; a turn asking the
    research agent (an agent used as a tool: same run); a turn delegating to the helper agent, which
    runs under a run id of its own (run-helper) and is denied an order; a turn whose SQL is blocked,
    which stops the run. And globex's run, one denied call."""
    sink = MemorySink()
    gate = Gate("shop", interceptors=[TenantOrders()], sinks=[sink], approval_handler=lead)
    research = Agent(
        gate.agent("research", tools=[get_order]),
        ScriptedModel([ModelTurn(tool_calls=[call("get_order", "c-research", order_id="ACME-2")]), ModelTurn("ok")]),
        before_turn=[TurnGuard()],
    )
    helper = Agent(
        gate.agent("helper", tools=[get_order]),
        ScriptedModel([ModelTurn(tool_calls=[call("get_order", "c-helper", order_id="GLOBEX-3")]), ModelTurn("no")]),
        before_turn=[TurnGuard()],
    )

    @tool
    async def delegate(task: str, ctx: ToolContext) -> str:
        """Hands a task to the helper agent, in a run of its own."""
        nested = RunContext(tenant=ctx.run.tenant, principal=ctx.run.principal, run_id=HELPER_RUN)
        return (await helper.run(task, run=nested)).output or ""

    desk = Agent(
        gate.agent(
            "desk", tools=[get_order, refund, run_sql, research.as_tool("ask_research", "Asks research."), delegate]
        ),
        ScriptedModel(
            [
                ModelTurn(
                    tool_calls=[
                        call("get_order", "c-order", order_id="ACME-1"),
                        call("refund", "c-refund", order_id="ACME-1", amount_cents=500),
                    ]
                ),
                ModelTurn(tool_calls=[call("ask_research", "c-ask", prompt="look up ACME-2")]),
                ModelTurn(tool_calls=[call("delegate", "c-delegate", task="check GLOBEX-3")]),
                ModelTurn(tool_calls=[call("run_sql", "c-sql", query="DROP TABLE orders")]),
                ModelTurn("never reached"),
            ]
        ),
        before_turn=[TurnGuard()],
    )
    other = Agent(
        gate.agent("desk-globex", tools=[get_order]),
        ScriptedModel([ModelTurn(tool_calls=[call("get_order", "c-globex", order_id="ACME-9")]), ModelTurn("sorry")]),
    )

    guarded = Agent(gate.agent("guarded", tools=[get_order]), ScriptedModel([]), before_turn=[NoRefundTalk()])

    async def day() -> None:
        with pytest.raises(ToolBlockedError):
            await desk.run("refund my order", run=DESK)
        await other.run("where is ACME-9?", run=OTHER)
        with pytest.raises(TurnDeniedError):
            await guarded.run("refund?", run=DENIED_TURN)

    asyncio.run(day())
    return list(sink.events)


@dataclass(frozen=True)
class RunStore:
    path: Path
    events: list[EventBase]

    def scalar(self, sql: str, *params: Any) -> Any:
        with AuditStore(self.path, read_only=True) as store:
            con = store.cursor()
            try:
                row = con.execute(sql, list(params)).fetchone()
            finally:
                con.close()
        return row[0] if row else None


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> RunStore:
    path = tmp_path_factory.mktemp("runs") / "audit.duckdb"
    events = run_events()
    batch = [RawRecord(TOPIC, 0, i, e.producer_id.encode(), encode_event(e)) for i, e in enumerate(events)]
    with AuditStore(path) as audit:
        audit.ingest(batch, {(TOPIC, 0): len(batch)})
    return RunStore(path, events)


@pytest.fixture
def run(store: RunStore) -> Iterator[Any]:
    """Runs a named query on the store, read-only."""
    with AuditStore(store.path, read_only=True) as audit:
        con = audit.cursor()
        try:
            yield lambda name, params=None: run_query(con, name, params).rows
        finally:
            con.close()


class TestRunEvents:
    def test_one_runs_events_in_order_with_the_nested_runs(self, store: RunStore, run: Any) -> None:
        """run_events holds every event of run-desk and of run-helper (nested under c-delegate), and
        nothing of globex's run, in time, producer, seq order; as many as plain SQL counts."""
        rows = run("run_events", {"run_id": "run-desk", "limit": 1000})
        expected = store.scalar("select count(*) from events where run_id in ('run-desk', 'run-helper')")
        assert len(rows) == expected
        assert {r["run_id"] for r in rows} == {"run-desk", HELPER_RUN}
        assert [(r["time"], r["seq"]) for r in rows] == sorted((r["time"], r["seq"]) for r in rows)
        helper = [r for r in rows if r["run_id"] == HELPER_RUN]
        (delegate,) = [r for r in rows if r["tool"] == "delegate" and r["type"] == "ToolUse"]
        assert {r["parent_call_id"] for r in helper} == {delegate["call_id"]}
        assert "desk-globex" not in {r["agent"] for r in rows}

    def test_turns_calls_approvals_and_the_block_read_as_a_story(self, run: Any) -> None:
        """The desk's four turns are allowed; the refund's approval names who decided; the research
        agent's call names c-ask as parent; the helper's order is denied; the SQL is blocked last."""
        rows = run("run_events", {"run_id": "run-desk", "limit": 1000})
        desk_turns = [r for r in rows if r["type"] == "TurnDecision" and r["agent"] == "desk"]
        assert [(r["turn"], r["turn_decision"]) for r in desk_turns] == [(n, "allow") for n in (1, 2, 3, 4)]
        assert all(r["message_count"] >= 1 for r in desk_turns)
        (resolved,) = [r for r in rows if r["type"] == "ApprovalResolved"]
        outcomes = {(r["agent"], r["tool"]): r for r in rows if r["type"] in ("ToolUse", "ToolDenied", "Blocked")}
        refund_call = outcomes[("desk", "refund")]["call_id"]
        assert (resolved["call_id"], resolved["approved_by"], resolved["note"]) == (
            refund_call,
            "lead",
            "known customer",
        )
        research = outcomes[("research", "get_order")]
        assert research["parent_call_id"] == outcomes[("desk", "ask_research")]["call_id"]
        helper = outcomes[("helper", "get_order")]
        assert (helper["type"], helper["decided_by"]) == ("ToolDenied", "tenant-orders")
        assert (rows[-1]["type"], rows[-1]["tool"]) == ("Blocked", "run_sql")
        assert rows[-1]["message"] == "SQL is never run from chat"
        assert [d["interceptor"] for d in rows[-1]["decisions"]] == ["tenant-orders"]
        order = [(r["agent"], r["tool"]) for r in rows if r["type"] in ("ToolUse", "ToolDenied", "Blocked")]
        assert order.index(("research", "get_order")) < order.index(("desk", "ask_research"))
        assert order.index(("desk", "ask_research")) < order.index(("helper", "get_order"))
        assert order.index(("helper", "get_order")) < order.index(("desk", "delegate"))

    def test_a_tenant_sees_only_its_own_run(self, run: Any) -> None:
        """With tenant bound, another tenant's run id gives no rows; the own one gives all of them."""
        assert run("run_events", {"run_id": "run-desk", "tenant": "globex"}) == []
        assert len(run("run_events", {"run_id": "run-globex", "tenant": "globex"})) > 0
        assert run("run_events", {}) == []

    def test_pages(self, run: Any) -> None:
        """limit and offset page through the same order."""
        every = run("run_events", {"run_id": "run-desk", "limit": 1000})
        pages = [run("run_events", {"run_id": "run-desk", "limit": 5, "offset": o}) for o in range(0, len(every), 5)]
        assert [r["event_id"] for page in pages for r in page] == [r["event_id"] for r in every]


class TestRuns:
    def test_counts_and_outcome_equal_plain_sql(self, store: RunStore, run: Any) -> None:
        """Each run's figures are the store's counts over its events; a blocked run says blocked,
        a run with a denial had_denials."""
        rows = {r["run_id"]: r for r in run("runs")}
        assert set(rows) == {"run-desk", HELPER_RUN, "run-globex", "run-denied-turn"}
        desk = rows["run-desk"]
        count = store.scalar
        assert desk["events"] == count("select count(*) from events where run_id = 'run-desk'")
        assert desk["calls"] == count(
            "select count(*) from events where run_id = 'run-desk' and type in "
            "('ToolUse', 'ToolDenied', 'Substitute', 'Blocked')"
        )
        assert (desk["turns"], desk["blocked"], desk["approvals_asked"]) == (4 + 2, 1, 1)
        assert (desk["tenant"], desk["principal"], desk["thread_id"], desk["outcome"]) == (
            "acme",
            "u-1",
            "t-1",
            "blocked",
        )
        assert desk["agents"] == ["desk", "research"]
        assert rows[HELPER_RUN]["outcome"] == "had_denials"
        assert rows["run-globex"]["outcome"] == "had_denials"
        assert (rows["run-denied-turn"]["outcome"], rows["run-denied-turn"]["turns"]) == ("turn_denied", 1)

    def test_newest_first_and_paged(self, run: Any) -> None:
        """Runs come newest last event first; limit and offset page them."""
        rows = run("runs")
        assert [r["last_time"] for r in rows] == sorted((r["last_time"] for r in rows), reverse=True)
        assert [r["run_id"] for r in run("runs", {"limit": 1, "offset": 1})] == [rows[1]["run_id"]]

    @pytest.mark.parametrize(
        ("params", "found"),
        [
            ({"run_id": "run-des"}, {"run-desk"}),
            ({"principal": "u-2"}, {"run-globex"}),
            ({"tenant": "globex"}, {"run-globex", "run-denied-turn"}),
            ({"thread_id": "t-1"}, {"run-desk"}),
            ({"tenant": "acme"}, {"run-desk", HELPER_RUN}),
            ({"since": "2999-01-01T00:00:00Z"}, set()),
        ],
    )
    def test_search(self, run: Any, params: dict[str, str], found: set[str]) -> None:
        """A run id prefix, a principal, a thread, a tenant or a window narrow the runs found."""
        assert {r["run_id"] for r in run("runs", params)} == found

    def test_both_are_tenant_scoped(self) -> None:
        """Both queries declare the tenant scope, with the tenant parameter the read API binds."""
        for name in ("runs", "run_events"):
            assert QUERIES[name].scope == "tenant"
            assert "tenant" in QUERIES[name].params


class TestBucketSeconds:
    """The chart queries take `bucket_seconds` (the dashboard's short windows): a run of a second or
    two falls into second-wide buckets, where minute buckets hold it in one."""

    @pytest.mark.parametrize("name", ["decision_trends", "denial_rate", "shadow_divergence"])
    def test_seconds_instead_of_minutes(self, run: Any, name: str) -> None:
        """Every bucket starts on a whole multiple of the width asked for, in seconds when given."""
        for params, width in (({"bucket_seconds": 1}, 1), ({"bucket_minutes": 1}, 60)):
            for row in run(name, {**params, "limit": 1000}):
                bucket = datetime.fromisoformat(row["bucket"])
                assert bucket.timestamp() % width == 0

    def test_seconds_buckets_sum_to_the_minute_buckets(self, run: Any) -> None:
        """Counts per second-wide bucket add up to the counts per minute-wide bucket."""
        seconds = run("decision_trends", {"bucket_seconds": 1, "limit": 1000})
        minutes = run("decision_trends", {"bucket_minutes": 1, "limit": 1000})
        assert sum(r["events"] for r in seconds) == sum(r["events"] for r in minutes) > 0
