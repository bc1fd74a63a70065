"""`callgate serve`'s federation: every named query over three shard stores answers what one store of
the same events answers; chains and tool uses judged per producer across shards (a producer split by a
handoff); a shard down; tenants kept to their rows.

Real parts only: events from real gates, each shard a DuckDB store filled through `AuditStore.ingest`
and served by the read API of consumers/api.py, serve's app over them, all over real HTTP.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import zlib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import BaseModel
from rich.console import Console

from consumers import QUERIES, AuditStore, RawRecord, run_query
from consumers.api import ApiServer, HealthStatus, build_app
from consumers.auth import TokenFile, hash_token
from consumers.coverage import run_checks
from consumers.federation import _CUSTOM, FederatedRunner, Shard, _time, held_seqs, stitch_segments
from consumers.metrics import MaterializerMetrics
from consumers.queries import NamedQuery, page
from consumers.reader import ApiReader, FileReader
from consumers.runner import StoreQueryRunner
from events import EventBase, MemorySink, ToolsRegisteredEvent, ToolUseEvent, encode_event
from events.chain import Producer, new_event_id
from events.models import RegisteredTool
from events.signing import SigningKey
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
    shadow,
    tool,
)

TOPIC = "callgate.audit"
PARTITIONS = 6
KEY = SigningKey.generate("fed")
TRUSTED = {KEY.key_id: KEY.public()}


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


class Frozen:
    """In shadow: every globex call would be blocked."""

    name = "frozen"

    def before_tool_call(self, call: ToolCall) -> Any:
        return Block("globex is frozen") if call.run.tenant == "globex" else None


async def reviewer(request: ApprovalRequest) -> Approval:
    return Approval(approved=request.args["amount_cents"] < 1000, by="lead")


def gate_events(name: str, n: int, *, signed: bool) -> list[EventBase]:
    """One gate instance (one producer): every outcome, approvals, shadow decisions, a nested call, an
    unmediated use, and signed checkpoints when `signed`."""
    sink = MemorySink()
    gate = Gate(
        name,
        interceptors=[TenantOrders(), Policy(), shadow(Frozen())],
        sinks=[sink],
        approval_handler=reviewer,
        **({"signing_key": KEY, "checkpoint_events": 8} if signed else {}),
    )
    desk = gate.workflow("support").agent("desk", tools=[get_order, refund, run_sql, quote])
    payments = gate.guard({"balance": 1}, name="payments", tools=["refund"])

    @tool
    async def delegate() -> str:
        """Asks the desk."""
        run = RunContext(tenant="acme", principal="u-1", run_id=f"{name}-{n}-nested")
        result = await desk.call("get_order", {"order_id": "ACME-9"}, run=run, call_id=f"{name}-{n}-child")
        return result.to_model_text()

    outer = gate.agent("outer", tools=[delegate])
    acme = RunContext(tenant="acme", principal=f"u-{n % 2}", run_id=f"run-{name}-{n}")
    globex = RunContext(tenant="globex", principal="u-9", run_id=f"run-{name}-{n}-g")

    async def day() -> None:
        c = f"{name}-{n}"
        await desk.call("get_order", {"order_id": "ACME-1"}, run=acme, call_id=f"{c}-ok")
        await desk.call("get_order", {"order_id": f"GLOBEX-{n}"}, run=acme, call_id=f"{c}-deny")
        await desk.call("get_order", {"order_id": "ACME-3"}, run=globex, call_id=f"{c}-deny-globex")
        await desk.call("get_order", {"order_id": "GLOBEX-3"}, run=globex, call_id=f"{c}-globex-ok")
        await desk.call("refund", {"order_id": "ACME-1", "amount_cents": 500}, run=acme, call_id=f"{c}-approved")
        await desk.call("refund", {"order_id": "ACME-2", "amount_cents": 5000}, run=acme, call_id=f"{c}-refused")
        with pytest.raises(ToolBlockedError):
            await desk.call("run_sql", {"query": "DROP TABLE orders"}, run=acme, call_id=f"{c}-blocked")
        await desk.call("quote", {"order_id": "ACME-4"}, run=acme, call_id=f"{c}-quote")
        await outer.call("delegate", {}, run=acme, call_id=f"{c}-parent")
        if n % 2 == 0:
            with pytest.raises(UnmediatedAccessError):
                payments["balance"]
        await gate.close()

    asyncio.run(day())
    return list(sink.events)


def partition_of(producer_id: str) -> int:
    return zlib.crc32(producer_id.encode()) % PARTITIONS


def records(events: list[EventBase], *, offsets: dict[int, int]) -> list[RawRecord]:
    """The events as Kafka records of their producer's partition, numbered on from `offsets`."""
    out = []
    for event in events:
        partition = partition_of(event.producer_id)
        offset = offsets.get(partition, 0)
        offsets[partition] = offset + 1
        out.append(RawRecord(TOPIC, partition, offset, event.producer_id.encode(), encode_event(event)))
    return out


def dead_records(offsets: dict[int, int]) -> list[RawRecord]:
    """Two records that are not events, on partitions 0 and 1."""
    out = []
    for partition, value in ((0, b"not json"), (1, b'{"type": "Teleported"}')):
        offset = offsets.get(partition, 0)
        offsets[partition] = offset + 1
        out.append(RawRecord(TOPIC, partition, offset, b"k", value))
    return out


def fill(path: Path, batch: list[RawRecord], *, require_signed: bool = False) -> AuditStore:
    """A store of `batch`: the events in one ingest, then each dead letter in one of its own (stores are
    filled one after the other, so dead letters are received in the same order in all of them)."""
    store = AuditStore(path, trusted_keys=TRUSTED, require_signed=require_signed)
    events = [r for r in batch if r.key != b"k"]
    for part in ([events] if events else []) + [[r] for r in batch if r.key == b"k"]:
        store.ingest(part, {(r.topic, r.partition): r.offset + 1 for r in part})
    return store


def serve_store(store: AuditStore, **options: Any) -> ApiServer:
    """A shard: the read API of consumers/api.py over `store`."""
    app = build_app(StoreQueryRunner(store), MaterializerMetrics(), lambda: HealthStatus(ok=True), **options)
    server = ApiServer(app)
    server.start()
    return server


def serve_federation(urls: list[str], token: str | None = None, **options: Any) -> tuple[ApiServer, FederatedRunner]:
    runner = FederatedRunner([Shard(url, token) for url in urls], timeout_s=10)
    server = ApiServer(build_app(runner, MaterializerMetrics(), runner.health, **options))
    server.start()
    return server, runner


class Deployment:
    """Three shards holding disjoint partitions of one event stream, serve over them, and one store
    holding all of it."""

    def __init__(self, root: Path, events: list[EventBase]) -> None:
        offsets: dict[int, int] = {}
        batch = records(events, offsets=offsets) + dead_records(offsets)
        self.events = events
        self.single = fill(root / "single.duckdb", batch)
        self.shards = [fill(root / f"shard-{i}.duckdb", [r for r in batch if r.partition % 3 == i]) for i in range(3)]
        for store in (self.single, *self.shards):
            store.close_open_gaps()
            store.close_checkpoints()
        self.servers = [serve_store(store) for store in self.shards]
        self.serve, self.runner = serve_federation([s.url for s in self.servers])
        self.client = httpx.Client(base_url=self.serve.url, timeout=30)

    def federated(self, name: str, params: dict[str, Any]) -> httpx.Response:
        return self.client.get(f"/v1/queries/{name}", params={k: _text(v) for k, v in params.items()})

    def expected(self, name: str, params: dict[str, Any]) -> dict[str, Any]:
        con = self.single.cursor()
        try:
            return run_query(con, name, params).to_dict()
        finally:
            con.close()

    def close(self) -> None:
        self.client.close()
        self.serve.stop()
        self.runner.close()
        for server in self.servers:
            server.stop()
        for store in (self.single, *self.shards):
            store.close()


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    gates = [("shop", True), ("shop", False), ("shop", True), ("lab", False), ("lab", True), ("shop", False)]
    events = [e for i, (name, signed) in enumerate(gates) for e in gate_events(name, i, signed=signed)]
    deployed = Deployment(tmp_path_factory.mktemp("federation"), events)
    yield deployed
    deployed.close()


# Columns that depend on the store's own clock (ingest and commit times, now()): one store and three
# shards filled a moment apart differ there, whatever the federation does.
VOLATILE = {
    "dead_letters": {"first_received", "last_received"},
    "dead_letter_records": {"received_at"},
    "pipeline_health": {"offset_updated_at", "last_ingested_at", "seconds_since_last_ingest"},
    "ingest_lag": {"offset_updated_at", "seconds_since_commit", "last_ingested_at"}
    | {"median_delay_s", "p95_delay_s", "max_delay_s"},
}
# Columns bounded by now() when no window is given: the federation pins its own now for every shard.
NOW_BOUND = {"since", "until", "previous_since"}


def cases(d: Deployment) -> dict[str, list[dict[str, Any]]]:
    """Each query's parameter sets: its defaults and the filters and pages that merge differently."""
    times = sorted(e.time for e in d.events)
    start, end = times[0] - timedelta(seconds=1), times[-1] + timedelta(seconds=1)
    middle = times[len(times) // 2]
    window = {"since": start, "until": end}
    outcome = next(e for e in d.events if e.type == "ToolUse")
    checkpointed = next(e for e in d.events if e.type == "ToolUse" and e.producer_id == _signed_producer(d))
    out: dict[str, list[dict[str, Any]]] = {name: [{}] for name in QUERIES}
    paged = [{"limit": 3}, {"limit": 4, "offset": 5}, {"limit": 2, "offset": 1000}]
    for name, query in QUERIES.items():
        if "offset" in query.params:
            out[name] += paged
        if "until" in query.params and "since" in query.params and not name.startswith("dead_letter"):
            out[name].append(window)  # (dead letters are windowed by the time each store received them)
        if "tenant" in query.params:
            out[name].append({"tenant": "globex"})
    out["decision_trends"] += [{"bucket_seconds": 1}, {"bucket_seconds": 1, "limit": 3, "offset": 2}]
    out["denial_rate"] += [{"by": "interceptor"}, {"by": "interceptor", "bucket_seconds": 1}, {"bucket_seconds": 1}]
    out["top_denied"] += [{"by": by} for by in ("tenant", "principal", "agent", "decided_by")] + [{"limit": 1}]
    out["call_detail"] = [{"call_id": outcome.call_id}, {"call_id": "shop-0-parent"}, {"call_id": "lab-3-deny"}]
    out["chain_status"] += [{"only_broken": True}, {"since": middle}]
    out["shadow_divergence"] += [{"bucket_seconds": 1}]
    out["shadow_calls"] += [{"divergent_only": True}, {"shadow_outcome": "blocked", "limit": 2, "offset": 1}]
    out["replay_calls"] = [{}, {"limit": 5}, {"limit": 4, "after_time": middle, "after_event_id": "0"}]
    out["inclusion_material"] = [{"event_id": checkpointed.event_id}, {"event_id": "nope"}]
    signed = [e.seq for e in d.events if e.producer_id == checkpointed.producer_id]
    out["merkle_material"] = [
        {"producer_id": checkpointed.producer_id, "lo": lo, "hi": hi} for lo, hi in ((0, max(signed)), (3, 20))
    ]
    out["tool_exercise"] += [{"only_unexercised": True}, {"gate": "lab"}]
    out["exercised_tools"] += [{"gate": "shop"}]
    out["registered_tools"] += [{"gate": "lab"}, {"agent": "outer"}]
    out["producer_signatures"] += [{"only_failing": True}]
    out["run_events"] = [{"run_id": "run-shop-0"}, {"run_id": "shop-2-nested"}, {"run_id": "run-lab-3", "limit": 2}]
    out["run_call_ids"] = [{"run_id": "run-shop-0"}, {"run_id": "run-shop-0", "parent_call_ids": '["shop-0-parent"]'}]
    out["runs"] += [{"principal": "u-1"}, {"run_id": "run-shop"}]
    out["new_denial_reasons"] += [{"since": middle, "until": end}]
    judged = d.expected("tool_use_judgements", {"limit": 1000})["rows"]
    group = next(r for r in judged if r["agent"] == "desk")
    use = {k: group[k] for k in ("producer_id", "gate", "workflow", "agent", "tool", "trail") if group[k] is not None}
    out["tool_use_rows"] = [use, {**use, **window, "limit": 1}, {**use, "trail": "[]"}]
    out["tool_use_judgements"] += [{"producer_id": group["producer_id"]}]
    out["producer_tool_chains"] += [{"producer_id": group["producer_id"]}]
    for name in ("blocked_attempts", "chain_status", "coverage_summary", "top_denied"):
        out[name].append({"include_archive": True, **window})  # each shard reads its archive too
    return out


def _signed_producer(d: Deployment) -> str:
    return next(e.producer_id for e in d.events if e.type == "Checkpoint")


def comparable(name: str, result: dict[str, Any], params: dict[str, Any]) -> list[dict[str, Any]]:
    drop = set(VOLATILE.get(name, ()))
    if "until" in QUERIES[name].params and "until" not in params:
        drop |= NOW_BOUND
    return [{k: v for k, v in row.items() if k not in drop} for row in result["rows"]]


class TestEveryQuery:
    """Every named query, federated over three shards, answers what one store of the same events does."""

    @pytest.mark.parametrize("name", sorted(QUERIES))
    def test_the_federated_answer_equals_the_single_store(self, deployment: Deployment, name: str) -> None:
        """For each parameter set: the same columns and rows (same order) through serve as from one store."""
        for params in cases(deployment)[name]:
            response = deployment.federated(name, params)
            assert response.status_code == 200, (params, response.text)
            got, want = response.json(), deployment.expected(name, params)
            assert got["columns"] == want["columns"], params
            assert comparable(name, got, params) == comparable(name, want, params), params
            if "until" in params:
                assert got["params"] == want["params"], params

    def test_the_cases_are_not_all_empty(self, deployment: Deployment) -> None:
        """The fixture has rows for every query but the access log (nothing was read through a logged API),
        chain breaks and unverified tool uses (real gates write whole chains; TestChainSplitAcrossShards
        federates breaks)."""
        empty = [n for n in QUERIES if not any(deployment.expected(n, p)["rows"] for p in cases(deployment)[n])]
        assert sorted(empty) == [
            "access_log",
            "approval_request",  # no gate of the fixture asks a reviewer (tests/consumers/test_approvals.py)
            "chain_breaks",
            "pending_approvals",
            "unverified_tool_uses",
        ]


class TestDeclarations:
    """Every query says how it merges, and the declaration fits what it returns."""

    def test_every_groups_merge_names_every_column(self, deployment: Deployment) -> None:
        """A groups declaration has a rule for each column the query returns."""
        for name, query in QUERIES.items():
            if query.merge.kind == "groups":
                columns = deployment.expected(name, cases(deployment)[name][0])["columns"]
                missing = [c for c in columns if c not in query.merge.keys and c not in query.merge.columns]
                assert not missing, (name, missing)

    def test_a_query_cannot_be_made_without_a_merge(self) -> None:
        """`merge` is a constructor argument without a default, and must be a Merge."""
        with pytest.raises(TypeError, match="merge"):
            NamedQuery("q", "d", "SELECT 1", {}, scope="global")  # type: ignore[call-arg]
        with pytest.raises(ValueError, match="merge must be a Merge"):
            NamedQuery("q", "d", "SELECT 1", {}, scope="global", merge="sum")

    def test_every_custom_merge_has_its_function(self) -> None:
        """A query declared custom is one serve knows how to merge."""
        declared = {n for n, q in QUERIES.items() if q.merge.kind == "custom"}
        assert declared == set(_CUSTOM)

    def test_the_listing_shows_each_merge(self, deployment: Deployment) -> None:
        """/v1/queries of serve lists every query with its merge kind."""
        listing = deployment.client.get("/v1/queries").json()["queries"]
        assert {q["name"]: q["merge"]["kind"] for q in listing} == {n: q.merge.kind for n, q in QUERIES.items()}


class TestCoverageThroughServe:
    """`callgate coverage --api` and its checks read serve as they read one store."""

    def test_the_report_equals_the_single_stores(self, deployment: Deployment, tmp_path: Path) -> None:
        """Every check's status, summary and violation count through serve equal those over the file."""
        via_serve = run_checks(ApiReader(deployment.serve.url), require_exercised=True, require_signed=True)
        deployment.single.close()
        try:
            with FileReader(deployment.single.path) as reader:
                direct = run_checks(reader, require_exercised=True, require_signed=True)
        finally:
            deployment.single = AuditStore(deployment.single.path, trusted_keys=TRUSTED)
        assert [(c.name, c.status, c.summary, c.total) for c in via_serve.checks] == [
            (c.name, c.status, c.summary, c.total) for c in direct.checks
        ]
        assert via_serve.facts == direct.facts

    def test_the_command_exits_as_over_the_file(self, deployment: Deployment) -> None:
        """run_coverage --api serve exits 1 (the fixture has unmediated uses), as over the file."""
        from callgate.coverage import run_coverage

        out = io.StringIO()
        console = Console(file=out, width=200)
        code = run_coverage(api=deployment.serve.url, db=None, require_exercised=False, since=None, junit=None,
                            json_path=None, console=console, err=console)  # fmt: skip
        assert code == 1, out.getvalue()
        assert "use(s) of guarded clients outside the gate" in out.getvalue()


def chain(n: int) -> list[EventBase]:
    """One producer's chain of about `n` events (a gate making n // 2 calls)."""
    sink = MemorySink()
    desk = Gate("split", sinks=[sink]).agent("desk", tools=[quote])

    async def run() -> None:
        for i in range(n // 2):
            await desk.call("quote", {"order_id": f"ACME-{i}"}, run=RunContext(tenant="acme"))

    asyncio.run(run())
    return sorted(sink.events, key=lambda e: e.seq)


class SplitShards:
    """Two shards of one event stream (`first` in a, `rest` in b), serve over them, one store of all of it."""

    require_signed = False
    """The stores' `require_signed` (materialized with --require-signed)."""

    def deploy(self, root: Path, first: list[EventBase], rest: list[EventBase]) -> tuple[list[AuditStore], list[Any]]:
        offsets: dict[int, int] = {}
        a, b = records(first, offsets=offsets), records(rest, offsets=offsets)
        signed = self.require_signed
        stores = [fill(root / n, batch, require_signed=signed) for n, batch in (("a.duckdb", a), ("b.duckdb", b),
                                                                                ("single.duckdb", a + b))]  # fmt: skip
        for store in stores:
            store.close_open_gaps()
        servers = [serve_store(s) for s in stores[:2]]
        serve, runner = serve_federation([s.url for s in servers])
        client = httpx.Client(base_url=serve.url, timeout=30)
        return stores, [client, serve, runner, *servers]

    def close(self, stores: Any, parts: list[Any]) -> None:
        parts[0].close()
        for part in parts[1:]:
            (part.close if isinstance(part, FederatedRunner) else part.stop)()
        for store in stores:
            store.close()

    def answers(self, stores: list[AuditStore], parts: list[Any], name: str, **params: Any) -> tuple[Any, Any]:
        """(federated, single store) rows of `name`."""
        response = parts[0].get(f"/v1/queries/{name}", params={k: _text(v) for k, v in params.items()})
        assert response.status_code == 200, response.text
        con = stores[2].cursor()
        try:
            return response.json()["rows"], run_query(con, name, params).rows
        finally:
            con.close()

    def coverage(self, parts: list[Any]) -> tuple[int, str]:
        """`callgate coverage --api <serve> --require-exercised`: its exit code and what it printed."""
        from callgate.coverage import run_coverage

        out = io.StringIO()
        console = Console(file=out, width=250)
        code = run_coverage(api=parts[1].url, db=None, require_exercised=True, since=None, junit=None,
                            json_path=None, console=console, err=console)  # fmt: skip
        return code, out.getvalue()

    def shard_alone(self, store: AuditStore, name: str) -> list[dict[str, Any]]:
        """`name`'s rows (defaults) over `store` alone."""
        con = store.cursor()
        try:
            return run_query(con, name, {}).rows
        finally:
            con.close()


class TestChainSplitAcrossShards(SplitShards):
    """A producer's first seqs in one shard and the rest in another (a partition handed over)."""

    def federated(self, parts: list[Any], name: str, **params: Any) -> list[dict[str, Any]]:
        response = parts[0].get(f"/v1/queries/{name}", params={k: _text(v) for k, v in params.items()})
        assert response.status_code == 200, response.text
        return list(response.json()["rows"])

    def test_no_false_gap(self, tmp_path: Path) -> None:
        """Each shard alone sees a hole (the second even records gaps); federated the chain is whole."""
        events = chain(40)
        stores, parts = self.deploy(tmp_path, events[:15], events[15:])
        try:
            assert stores[1].counts().chain_breaks.get("gap", 0) == 15  # seqs 1..15, as shard b sees it
            (status,) = self.federated(parts, "chain_status")
            assert (status["max_seq"], status["events"], status["missing"], status["gaps_recorded"], status["ok"]) == (
                len(events), len(events), 0, 0, True)  # fmt: skip
            assert self.federated(parts, "chain_breaks") == []
            (facts,) = self.federated(parts, "coverage_summary")
            assert (facts["producers"], facts["broken_producers"], facts["missing_seqs"], facts["gaps_recorded"]) == (
                1, 0, 0, 0)  # fmt: skip
        finally:
            self.close(stores, parts)

    def test_a_real_gap_is_still_reported(self, tmp_path: Path) -> None:
        """An event missing from both shards is a gap federated, as in one store without it."""
        events = chain(40)
        lost = events[18]
        stores, parts = self.deploy(tmp_path, events[:15], [e for e in events[15:] if e is not lost])
        try:
            (status,) = self.federated(parts, "chain_status")
            assert (status["missing"], status["gaps_recorded"], status["ok"]) == (1, 1, False)
            breaks = self.federated(parts, "chain_breaks")
            assert [(b["kind"], b["seq"]) for b in breaks] == [("gap", lost.seq)]
            con = stores[2].cursor()
            want = run_query(con, "chain_status").rows
            con.close()
            drop = {"first_time", "last_time"}
            assert [{k: v for k, v in r.items() if k not in drop} for r in want] == [
                {k: v for k, v in status.items() if k not in drop}
            ]
            (facts,) = self.federated(parts, "coverage_summary")
            assert (facts["broken_producers"], facts["missing_seqs"], facts["gaps_recorded"]) == (1, 1, 1)
        finally:
            self.close(stores, parts)


def registered_then_used(name: str, calls: int) -> list[EventBase]:
    """One gate instance (producer): its agent scope registered (ToolsRegistered, seq 1) with an
    interceptor on every tool, then `calls` mediated calls of it, in seq order."""
    sink = MemorySink()
    gate = Gate(name, interceptors=[TenantOrders()], sinks=[sink])
    desk = gate.workflow("support").agent("desk", tools=[get_order, quote])

    async def run() -> None:
        acme = RunContext(tenant="acme", principal="u-1")
        for i in range(calls):
            await desk.call("get_order" if i % 2 else "quote", {"order_id": f"ACME-{i}"}, run=acme)
        await gate.close()

    asyncio.run(run())
    return sorted(sink.events, key=lambda e: e.seq)


def forged_uses(uses: list[tuple[str, list[str]]]) -> list[EventBase]:
    """A whole chain of a producer that is not a gate: `delete_file` registered by agent desk with the chain
    ["policy"] (seq 1), then one ToolUse per (tool, trail) of `uses`, a microsecond apart."""
    producer = Producer()
    start = datetime.now(UTC)
    envelope = {"gate": "files", "workflow": None, "agent": "desk"}
    tools = (RegisteredTool(name="delete_file", input_schema_sha256="0" * 64, interceptors=("policy",)),)
    registration = {**envelope, "time": start, "tools": tools, "event_id": new_event_id()}
    events: list[EventBase] = [producer.seal(ToolsRegisteredEvent, registration)]
    for i, (name, trail) in enumerate(uses):
        steps = [{"interceptor": step, "scope": "application", "kind": "allow", "duration_ms": 0.01} for step in trail]
        fields = {"time": start + timedelta(microseconds=i + 1), "tool": name, "call_id": f"forged-{i}",
                  "event_id": new_event_id()}  # fmt: skip
        body = {**envelope, **fields, "outcome": "ok", "duration_ms": 1.0, "decisions": steps}
        events.append(producer.seal(ToolUseEvent, body))
    return events


# The contract of the shards' chain_segments query (consumers/shards.py, once it is a named query): per
# producer and run of consecutive seqs, its first seq and prev_hash, last seq and hash, holes inside.
_SEGMENTS_SQL = """
WITH ordered AS (
    SELECT producer_id, seq, hash, prev_hash, seq - row_number() OVER (PARTITION BY producer_id ORDER BY seq) AS run
    FROM events WHERE $producer_id IS NULL OR producer_id = $producer_id
)
SELECT producer_id, run AS segment, min(seq) AS first_seq, arg_min(prev_hash, seq) AS first_prev_hash,
       max(seq) AS last_seq, arg_max(hash, seq) AS last_hash, count(*) AS events, []::BIGINT[][] AS holes
FROM ordered GROUP BY producer_id, run
ORDER BY producer_id, first_seq
LIMIT $limit OFFSET $offset
"""
SEGMENTS = NamedQuery(
    "chain_segments",
    "Per producer, each run of consecutive seqs this store holds.",
    _SEGMENTS_SQL,
    {k: QUERIES["chain_breaks"].params[k] for k in ("producer_id", "limit", "offset")},
    scope="global",
    merge=page("producer_id", "first_seq"),
)


class TestToolUsesSplitAcrossShards(SplitShards):
    """A producer's ToolsRegistered and first calls in one shard, its later calls in another (a partition
    moved): its tool uses are judged over both, as one store of every event judges them; with the shards'
    chain_segments query and without it."""

    JUDGING = ("coverage_summary", "tool_use_verification", "unverified_tool_uses", "tool_use_judgements")

    @pytest.fixture(autouse=True, params=["without chain_segments", "with chain_segments"])
    def segments(self, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
        """Every case twice: the shards (and serve, one process here) without, then with chain_segments."""
        if request.param == "with chain_segments":
            if "chain_segments" not in QUERIES:
                monkeypatch.setitem(QUERIES, "chain_segments", SEGMENTS)
        elif "chain_segments" in QUERIES:
            monkeypatch.delitem(QUERIES, "chain_segments")

    def test_coverage_stays_green(self, tmp_path: Path) -> None:
        """Registration in shard a, most calls in shard b: shard b alone reads them chain_not_verified and
        not_registered; through serve the judging queries equal one store's, all verified, coverage exits 0."""
        events = registered_then_used("moved", 30)
        stores, parts = self.deploy(tmp_path, events[:8], events[8:])
        try:
            (alone,) = self.shard_alone(stores[1], "tool_use_verification")
            assert alone["chain_not_verified"] == alone["tool_uses"] > 0
            for name in self.JUDGING:
                got, want = self.answers(stores, parts, name)
                assert got == want, name
            (counts,) = self.answers(stores, parts, "tool_use_verification")[0]
            assert (counts["tool_uses"], counts["unverified"]) == (30, 0)
            assert self.answers(stores, parts, "unverified_tool_uses")[0] == []
            code, output = self.coverage(parts)
            assert code == 0, output
        finally:
            self.close(stores, parts)

    def test_every_query_equals_one_store(self, tmp_path: Path) -> None:
        """With one producer split across the shards and one whole in the first: every named query through
        serve (its defaults, a page of 1,000 where it pages; chain_segments aside, a shard's own holdings)
        answers what one store of every event does."""
        events = registered_then_used("moved", 30)
        stores, parts = self.deploy(tmp_path, events[:8] + registered_then_used("whole", 6), events[8:])
        try:
            con = stores[2].cursor()
            group = run_query(con, "tool_use_judgements", {}).rows[0]
            con.close()
            special: dict[str, dict[str, Any]] = {
                "call_detail": {"call_id": events[12].call_id},
                "run_events": {"run_id": events[12].run_id},
                "inclusion_material": {"event_id": events[12].event_id},
                "tool_use_rows": {k: v for k, v in group.items() if k in QUERIES["tool_use_rows"].params and v},
            }
            for name, query in QUERIES.items():
                if name == "chain_segments":
                    continue  # what each shard holds: no single store's answer to compare with
                params = special.get(name, {"limit": 1000} if "limit" in query.params else {})
                got, want = self.answers(stores, parts, name, **params)
                drop = VOLATILE.get(name, set()) | NOW_BOUND
                assert [{k: v for k, v in r.items() if k not in drop} for r in got] == [
                    {k: v for k, v in r.items() if k not in drop} for r in want
                ], name
        finally:
            self.close(stores, parts)

    def test_an_unregistered_tool_use_still_fails(self, tmp_path: Path) -> None:
        """Among the moved tool uses two of a tool never registered and one whose trail lacks the registered
        interceptor: federated exactly those are unverified, as in one store; coverage exits 1 naming them."""
        ok = ("delete_file", ["policy"])
        events = forged_uses([ok, ok, ok, ("wire_money", ["policy"]), ok, ("delete_file", []), ok, ("wire_money", [])])
        stores, parts = self.deploy(tmp_path, events[:3], events[3:])
        try:
            for name in self.JUDGING:
                got, want = self.answers(stores, parts, name)
                assert got == want, name
            rows = self.answers(stores, parts, "unverified_tool_uses")[0]
            assert [(r["problem"], r["tool"], r["missing_interceptors"]) for r in rows] == [
                ("not_registered", "wire_money", None), ("incomplete_trail", "delete_file", ["policy"]),
                ("not_registered", "wire_money", None)]  # fmt: skip
            for page in ({"limit": 1, "offset": 1}, {"problem": "incomplete_trail"}):
                got, want = self.answers(stores, parts, "unverified_tool_uses", **page)
                assert got == want, page
            code, output = self.coverage(parts)
            assert code == 1, output
            assert "3 of 8 tool run(s) not verified: 2 from a scope that never registered the tool, 1 missing" in output
        finally:
            self.close(stores, parts)

    def test_a_real_gap_fails_every_tool_use_of_the_producer(self, tmp_path: Path) -> None:
        """An event of the moved part lost from both shards: every tool use of the producer, those of shard a
        too (whole there), is chain_not_verified, as in one store; another producer's unregistered call
        stays listed among them, pages cut as one store cuts them; coverage exits 1."""
        events = registered_then_used("moved", 24)
        lost = events[14]
        whole = forged_uses([("delete_file", ["policy"]), ("wire_money", [])])
        stores, parts = self.deploy(tmp_path, events[:8] + whole, [e for e in events[8:] if e is not lost])
        try:
            for name in self.JUDGING:
                got, want = self.answers(stores, parts, name)
                assert got == want, name
            for page in ({"limit": 1000}, {"limit": 3, "offset": 2}, {"problem": "not_registered"}):
                got, want = self.answers(stores, parts, "unverified_tool_uses", **page)
                assert got == want, page
            (counts,) = self.answers(stores, parts, "tool_use_verification")[0]
            assert (counts["chain_not_verified"], counts["not_registered"]) == (24 - 1, 1)
            code, output = self.coverage(parts)
            assert code == 1, output
        finally:
            self.close(stores, parts)


class TestAfterARealHandoff(SplitShards):
    """Shard b took the producer's partition at an offset (its tenure recorded, consumers.shards), so it
    records no gap for what came before; serve stitches by the shards' own chain_segments SQL."""

    @pytest.fixture(autouse=True)
    def segments(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """The shards' chain_segments query (consumers.shards.CHAIN_SEGMENTS_SQL), if not a named query yet."""
        from consumers import shards

        if "chain_segments" not in QUERIES:
            monkeypatch.setitem(QUERIES, "chain_segments", dataclasses.replace(SEGMENTS, sql=shards.CHAIN_SEGMENTS_SQL))

    def deploy(self, root: Path, first: list[EventBase], rest: list[EventBase]) -> tuple[list[AuditStore], list[Any]]:
        from consumers import shards

        offsets: dict[int, int] = {}
        a, b = records(first, offsets=offsets), records(rest, offsets=offsets)
        stores = [AuditStore(root / n) for n in ("a.duckdb", "b.duckdb", "single.duckdb")]
        stores[0].ingest(a, {(r.topic, r.partition): r.offset + 1 for r in a})
        start = b[0].offset
        stores[1].transaction(
            lambda con: shards.record_own_tenure(con, tenure_id="t-b", topic=TOPIC, partition=b[0].partition,
                                                 owner="shard-b", start_offset=start, stored_before=None)
        )  # fmt: skip
        stores[1].ingest(b, {(r.topic, r.partition): r.offset + 1 for r in b})
        stores[2].ingest(a + b, {(r.topic, r.partition): r.offset + 1 for r in a + b})
        for store in stores:
            store.close_open_gaps()
        servers = [serve_store(s) for s in stores[:2]]
        serve, runner = serve_federation([s.url for s in servers])
        return stores, [httpx.Client(base_url=serve.url, timeout=30), serve, runner, *servers]

    def test_the_split_producer_is_whole_and_verified(self, tmp_path: Path) -> None:
        """No gap recorded anywhere; chain_status, coverage_summary and the tool-use judgements equal one
        store's; coverage exits 0."""
        events = registered_then_used("moved", 20)
        stores, parts = self.deploy(tmp_path, events[:6], events[6:])
        try:
            assert [s.counts().chain_breaks.get("gap", 0) for s in stores] == [0, 0, 0]
            for name in ("chain_status", "chain_breaks", *TestToolUsesSplitAcrossShards.JUDGING):
                got, want = self.answers(stores, parts, name)
                assert got == want, name
            code, output = self.coverage(parts)
            assert code == 0, output
        finally:
            self.close(stores, parts)

    def test_a_seq_lost_after_the_handoff_fails(self, tmp_path: Path) -> None:
        """A seq missing among what shard b read itself: a gap, the producer broken, every tool use
        chain_not_verified, as in one store; coverage exits 1."""
        events = registered_then_used("moved", 20)
        lost = events[10]
        stores, parts = self.deploy(tmp_path, events[:6], [e for e in events[6:] if e is not lost])
        try:
            for name in ("chain_status", *TestToolUsesSplitAcrossShards.JUDGING):
                got, want = self.answers(stores, parts, name)
                assert got == want, name
            (counts,) = self.answers(stores, parts, "tool_use_verification")[0]
            assert counts["chain_not_verified"] == counts["tool_uses"] == 19
            code, output = self.coverage(parts)
            assert code == 1, output
        finally:
            self.close(stores, parts)


def signed_chain(calls: int, every: int) -> list[EventBase]:
    """One signed producer's chain of `calls` calls, a checkpoint after every `every` events."""
    sink = MemorySink()
    desk = Gate("signed-split", sinks=[sink], signing_key=KEY, checkpoint_events=every).agent("desk", tools=[quote])

    async def run() -> None:
        for i in range(calls):
            await desk.call("quote", {"order_id": f"ACME-{i}"}, run=RunContext(tenant="acme"))
        await desk.gate.close()

    asyncio.run(run())
    return sorted(sink.events, key=lambda e: e.seq)


class TestSignedCheckpointsSplitAcrossShards(SplitShards):
    """A signed producer split at seq 700: shard b holds checkpoints over seqs 1..n of which shard a holds
    the first 699, so b alone records them `truncated`; serve checks them against both shards' trees."""

    def deploy(self, root: Path, first: list[EventBase], rest: list[EventBase]) -> tuple[list[AuditStore], list[Any]]:
        stores, parts = super().deploy(root, first, rest)
        for store in stores:
            store.close_checkpoints()
        return stores, parts

    def split(self) -> tuple[list[EventBase], list[EventBase]]:
        events = signed_chain(1500, 100)  # seqs 1..1516: shard b's blocks 3 and 4 are whole
        return [e for e in events if e.seq < 700], [e for e in events if e.seq >= 700]

    def signatures(self, stores: list[AuditStore], parts: list[Any]) -> tuple[list[Any], list[Any]]:
        keep = ("producer_id", "ok", "signed", "signed_tree_size", "checkpoint_seq", "checkpoint_event_id", "breaks")
        got, want = self.answers(stores, parts, "producer_signatures")
        return [{k: r[k] for k in keep} for r in got], [{k: r[k] for k in keep} for r in want]

    def test_no_false_truncated(self, tmp_path: Path) -> None:
        """chain_breaks and producer_signatures through serve equal one store's (no break, signed up to
        the last checkpoint, its time too); coverage --require-signed passes."""
        first, rest = self.split()
        stores, parts = self.deploy(tmp_path, first, rest)
        try:
            alone = [r for r in self.shard_alone(stores[1], "chain_breaks") if r["kind"] == "truncated"]
            assert len(alone) >= 2, "shard b alone should find its checkpoints truncated"
            got, want = self.answers(stores, parts, "chain_breaks")
            assert got == want == []
            got, want = self.signatures(stores, parts)
            assert got == want
            assert want[0]["ok"]
            fed, single = self.answers(stores, parts, "producer_signatures")
            assert _time(fed[0]["checkpoint_time"]) == _time(single[0]["checkpoint_time"])
            report = run_checks(ApiReader(parts[1].url), require_signed=True)
            assert report.exit_code == 0, [(c.name, c.summary) for c in report.checks]
            for name in ("chain_status", *TestToolUsesSplitAcrossShards.JUDGING):
                got, want = self.answers(stores, parts, name)
                assert got == want, name
            # The store-wide break counts leave the verified checkpoints out too.
            got, want = self.answers(stores, parts, "pipeline_health")
            assert [r["chain_breaks"] for r in got] == [want[0]["chain_breaks"]] * len(got) == [0] * len(got)
            got, want = self.answers(stores, parts, "overview_counts")
            breaks = [(r["value"], r["previous"]) for r in got if r["metric"] == "chain_breaks"]
            assert breaks == [(r["value"], r["previous"]) for r in want if r["metric"] == "chain_breaks"] == [(0, 0)]
        finally:
            self.close(stores, parts)

    def test_a_tree_that_disagrees_is_a_root_mismatch(self, tmp_path: Path) -> None:
        """A node of shard b's tree index changed: the root over the shards is not the signed one, so serve
        reports root_mismatch for the checkpoints over it, and coverage --require-signed fails."""
        first, rest = self.split()
        stores, parts = self.deploy(tmp_path, first, rest)
        try:
            changed = stores[1].transaction(
                lambda con: con.execute(
                    "UPDATE merkle_nodes SET hash = repeat('0', 64) WHERE level = 8 AND idx = 3"
                ).fetchall()
            )
            assert changed == [(1,)]
            breaks = [(b["kind"], b["seq"]) for b in self.answers(stores, parts, "chain_breaks")[0]]
            assert breaks
            assert {kind for kind, _ in breaks} == {"root_mismatch"}
            assert [
                (b["kind"], b["seq"]) for b in self.answers(stores, parts, "chain_breaks", kind="truncated")[0]
            ] == []
            mismatches = self.answers(stores, parts, "chain_breaks", kind="root_mismatch")[0]
            assert sorted((b["kind"], b["seq"]) for b in mismatches) == sorted(breaks)
            (row,) = self.signatures(stores, parts)[0]
            assert not row["ok"]
            assert {b["kind"] for b in row["breaks"]} == {"root_mismatch"}
            report = run_checks(ApiReader(parts[1].url), require_signed=True)
            assert report.exit_code == 1
        finally:
            self.close(stores, parts)

    def test_the_signing_states_of_each_part_are_answered_by_the_other(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Materialized with --require-signed, shard a finds its last checkpoint silent and the events after
        it uncovered (the producer went on in shard b), shard b finds the producer unsigned (none of its
        checkpoints verified there); through serve neither holds, as in one store: no break, coverage
        --require-signed passes."""
        monkeypatch.setattr(self, "require_signed", True)
        sink = MemorySink()
        # A heartbeat of 10 ms: by the time the stores close their checks, 30 ms make events late.
        gate = Gate("signed-split", sinks=[sink], signing_key=KEY, checkpoint_events=100, heartbeat_s=0.01)
        desk = gate.agent("desk", tools=[quote])

        async def run() -> None:
            for i in range(1500):
                await desk.call("quote", {"order_id": f"ACME-{i}"}, run=RunContext(tenant="acme"))
            await gate.close()

        asyncio.run(run())
        events = sorted(sink.events, key=lambda e: e.seq)
        # Split between two checkpoints, so shard a holds events after its last one: the heartbeat's
        # checkpoints fall where the machine's timing puts them (one just before seq 700 left none).
        marks = [e.seq for e in events if e.type == "Checkpoint"]
        last = next(seq for seq in marks if seq >= 650)
        split = last + max(2, (next(seq for seq in marks if seq > last) - last) // 2)
        stores, parts = self.deploy(
            tmp_path, [e for e in events if e.seq < split], [e for e in events if e.seq >= split]
        )
        try:
            kinds = [{r["kind"] for r in self.shard_alone(store, "chain_breaks")} for store in stores]
            assert {"silent", "uncovered"} <= kinds[0]
            assert "unsigned" in kinds[1]
            assert kinds[2] == set()
            got, want = self.answers(stores, parts, "chain_breaks")
            assert got == want == []
            got, want = self.signatures(stores, parts)
            assert got == want
            assert want[0]["ok"]
            report = run_checks(ApiReader(parts[1].url), require_signed=True)
            assert report.exit_code == 0, [(c.name, c.summary) for c in report.checks]
        finally:
            self.close(stores, parts)

    def test_events_no_shard_holds_leave_it_truncated(self, tmp_path: Path) -> None:
        """Seq 900 in neither shard: the checkpoints over it stay truncated through serve, beside the gap."""
        first, rest = self.split()
        stores, parts = self.deploy(tmp_path, first, [e for e in rest if e.seq != 900])
        try:
            kinds = {b["kind"] for b in self.answers(stores, parts, "chain_breaks")[0]}
            assert {"gap", "truncated"} <= kinds
            assert "root_mismatch" not in kinds
            report = run_checks(ApiReader(parts[1].url), require_signed=True)
            assert report.exit_code == 1
        finally:
            self.close(stores, parts)


class TestARunSplitAcrossShards(SplitShards):
    """Run r-long's first calls in shard a, its last ones in shard b (its producer's partition moved), and
    five later runs of another producer in shard a: a's first runs do not reach r-long."""

    def events(self) -> tuple[list[EventBase], list[EventBase]]:
        sink = MemorySink()
        long, busy = Gate("long", sinks=[sink]), Gate("busy", sinks=[sink])
        desk, other = long.agent("desk", tools=[quote]), busy.agent("desk", tools=[quote])
        run = RunContext(tenant="acme", principal="u-1", run_id="r-long")

        async def day() -> None:
            for i in range(3):
                await desk.call("quote", {"order_id": f"ACME-{i}"}, run=run)
            for i in range(5):
                await other.call("quote", {"order_id": "ACME-9"}, run=RunContext(tenant="acme", run_id=f"r-busy-{i}"))
            for i in range(2):
                await desk.call("quote", {"order_id": f"GLOBEX-{i}"}, run=run)

        asyncio.run(day())
        events = list(sink.events)
        moved = sorted(e.seq for e in events if e.producer_id == events[0].producer_id)[3]
        first = [e for e in events if e.producer_id != events[0].producer_id or e.seq < moved]
        return first, [e for e in events if e not in first]

    def test_its_counts_are_whole_on_every_page(self, tmp_path: Path) -> None:
        """runs through serve equals one store's on pages where shard a's own first runs leave r-long out."""
        first, rest = self.events()
        stores, parts = self.deploy(tmp_path, first, rest)
        try:
            assert "r-long" not in [r["run_id"] for r in self.shard_alone(stores[0], "runs")[:1]]
            for params in ({"limit": 1}, {"limit": 2}, {"limit": 2, "offset": 1}, {"limit": 1000}, {"run_id": "r-l"}):
                got, want = self.answers(stores, parts, "runs", **params)
                assert got == want, params
            (row,) = self.answers(stores, parts, "runs", limit=1)[0]
            assert (row["run_id"], row["calls"]) == ("r-long", 5)
        finally:
            self.close(stores, parts)


class TestANestedRunInAnotherShard(SplitShards):
    """An agent of gate `outer` calls a tool that starts an agent of gate `inner` (another producer, so
    another partition and shard) under a run id of its own, two levels deep."""

    def events(self) -> tuple[list[EventBase], list[EventBase]]:
        sink = MemorySink()
        outer_gate, inner_gate = Gate("outer", sinks=[sink]), Gate("inner", sinks=[sink])
        desk = inner_gate.agent("desk", tools=[quote])

        @tool
        async def deeper() -> str:
            """Asks the desk again, under a third run."""
            run = RunContext(tenant="acme", run_id="r-deeper")
            return (await desk.call("quote", {"order_id": "ACME-3"}, run=run)).to_model_text()

        helper = inner_gate.agent("helper", tools=[deeper])

        @tool
        async def delegate() -> str:
            """Asks the inner gate's agents."""
            run = RunContext(tenant="acme", run_id="r-nested")
            await desk.call("quote", {"order_id": "ACME-2"}, run=run)
            return (await helper.call("deeper", {}, run=run)).to_model_text()

        outer = outer_gate.agent("outer", tools=[delegate, quote])
        run = RunContext(tenant="acme", principal="u-1", run_id="r-parent")

        async def day() -> None:
            await outer.call("quote", {"order_id": "ACME-1"}, run=run)
            await outer.call("delegate", {}, run=run)
            await desk.call("quote", {"order_id": "ACME-9"}, run=RunContext(tenant="acme", run_id="r-other"))

        asyncio.run(day())
        events = list(sink.events)
        outer_id = next(e.producer_id for e in events if e.gate == "outer")
        return [e for e in events if e.producer_id == outer_id], [e for e in events if e.producer_id != outer_id]

    def test_its_events_are_in_the_run(self, tmp_path: Path) -> None:
        """run_events of the parent run through serve equals one store's, the nested runs' events included
        (shard a alone has none of them); every page too."""
        first, rest = self.events()
        stores, parts = self.deploy(tmp_path, first, rest)
        try:
            got, want = self.answers(stores, parts, "run_events", run_id="r-parent")
            assert got == want
            assert {"r-nested", "r-deeper"} <= {r["run_id"] for r in want}
            assert "r-other" not in {r["run_id"] for r in want}
            assert not {"r-nested", "r-deeper"} & {
                r["run_id"] for r in self.shard_alone_with(stores[0], "run_events", run_id="r-parent")
            }
            for params in ({"limit": 2}, {"limit": 3, "offset": 2}, {"tenant": "globex"}):
                got, want = self.answers(stores, parts, "run_events", run_id="r-parent", **params)
                assert got == want, params
        finally:
            self.close(stores, parts)

    def shard_alone_with(self, store: AuditStore, name: str, **params: Any) -> list[dict[str, Any]]:
        con = store.cursor()
        try:
            return run_query(con, name, params).rows
        finally:
            con.close()


class TestALinkAcrossShardsThatDoesNotHold:
    """Shard b's first event names another prev_hash than the hash of shard a's last (a forged
    continuation): only chain_segments can see it, and it fails the tool uses as one store's tamper does."""

    def test_every_tool_use_of_the_producer_is_chain_not_verified(self, tmp_path: Path) -> None:
        """chain_status counts the link as tampering; every tool use of the producer, shard a's too, is
        chain_not_verified, as in one store; coverage exits 1."""
        assert "chain_segments" in QUERIES
        ok = ("delete_file", ["policy"])
        first = forged_uses([ok, ok])
        forger = Producer(first[0].producer_id)
        forger._seq, forger._prev = len(first), "f" * 64  # a chain that goes on from a hash never written
        step = {"interceptor": "policy", "scope": "application", "kind": "allow", "duration_ms": 0.01}
        body = {"gate": "files", "agent": "desk", "tool": "delete_file", "outcome": "ok", "duration_ms": 1.0}
        rest = [
            forger.seal(ToolUseEvent, {**body, "time": datetime.now(UTC), "call_id": f"forged-b-{i}",
                                       "event_id": new_event_id(), "decisions": [step]})
            for i in range(3)
        ]  # fmt: skip
        split = SplitShards()
        stores, parts = split.deploy(tmp_path, first, rest)
        try:
            (status,) = split.answers(stores, parts, "chain_status")[0]
            assert (status["tampered"], status["ok"]) == (1, False)
            for name in ("tool_use_verification", "unverified_tool_uses", "tool_use_judgements"):
                got, want = split.answers(stores, parts, name)
                assert got == want, name
            (counts,) = split.answers(stores, parts, "tool_use_verification")[0]
            assert counts["chain_not_verified"] == counts["tool_uses"] == 5
            code, output = split.coverage(parts)
            assert code == 1, output
        finally:
            split.close(stores, parts)


class TestChainSegments:
    """Stitching by the shards' chain_segments (first seq and prev_hash, last seq and hash, holes)."""

    def test_held_ranges_leave_out_the_holes(self) -> None:
        """first..last minus the holes, in any of the hole shapes."""
        segment = {"first_seq": 5, "last_seq": 20, "holes": [[8, 9], {"first": 12, "last": 12}, 15]}
        assert held_seqs(segment) == [(5, 7), (10, 11), (13, 14), (16, 20)]

    def test_segments_that_link_make_one_range(self) -> None:
        """Shard 0 holds 1..10, shard 1 11..30 linking to it: one range, no link break."""
        union, breaks = stitch_segments({
            0: [{"first_seq": 1, "first_prev_hash": "0" * 64, "last_seq": 10, "last_hash": "h10"}],
            1: [{"first_seq": 11, "first_prev_hash": "h10", "last_seq": 30, "last_hash": "h30"}],
        })  # fmt: skip
        assert (union, breaks) == ([(1, 30)], [])

    def test_a_link_that_does_not_hold_is_a_break(self) -> None:
        """Shard 1's first event names another hash than shard 0's last: a break naming both."""
        _, breaks = stitch_segments({
            0: [{"first_seq": 1, "first_prev_hash": "0" * 64, "last_seq": 10, "last_hash": "h10"}],
            1: [{"first_seq": 11, "first_prev_hash": "forged", "last_seq": 30, "last_hash": "h30"}],
        })  # fmt: skip
        assert breaks == ["seq 11 (shard 1) does not link to the hash of seq 10 (shard 0)"]


class TestShardDown:
    """A shard that cannot be reached fails the query, naming it; never a partial answer."""

    def test_a_query_answers_503_naming_the_shard(self, tmp_path: Path) -> None:
        """With one shard stopped, counts through serve are 503 and the error names that shard's URL."""
        events = chain(10)
        stores = [fill(tmp_path / f"{i}.duckdb", records(events, offsets={}) if i == 0 else []) for i in range(2)]
        servers = [serve_store(s) for s in stores]
        serve, runner = serve_federation([s.url for s in servers])
        try:
            with httpx.Client(base_url=serve.url, timeout=30) as client:
                assert client.get("/v1/queries/blocked_attempts_count").status_code == 200
                assert client.get("/healthz").status_code == 200
                down = servers[1].url
                servers[1].stop()
                response = client.get("/v1/queries/blocked_attempts_count")
                assert response.status_code == 503
                assert down in response.json()["error"]
                health = client.get("/healthz")
                assert health.status_code == 503
                assert [(s["url"], s["reachable"]) for s in health.json()["shards"]] == [
                    (servers[0].url, True), (down, False)]  # fmt: skip
        finally:
            serve.stop()
            runner.close()
            servers[0].stop()
            for store in stores:
                store.close()


class TestAuthThroughServe:
    """Clients authenticate to serve with serve's tokens; serve reads the shards with its own."""

    def test_a_tenant_token_sees_only_its_tenant(self, tmp_path: Path) -> None:
        """A tenant:globex token through serve gets globex's rows only, what one store gives for tenant=globex;
        a global query is 403; the shards refuse serve without its shard token."""
        events = gate_events("shop", 0, signed=False) + gate_events("lab", 1, signed=False)
        offsets: dict[int, int] = {}
        batch = records(events, offsets=offsets)
        shard_tokens = tmp_path / "shard-tokens.yaml"
        shard_tokens.write_text(f"tokens: [{{subject: serve, sha256: {hash_token('serve-secret')}, roles: [admin]}}]\n")
        client_tokens = tmp_path / "tokens.yaml"
        client_tokens.write_text(
            f"tokens: [{{subject: globex-admin, sha256: {hash_token('globex-secret')}, roles: ['tenant:globex']}}]\n"
        )
        stores = [fill(tmp_path / f"{i}.duckdb", [r for r in batch if r.partition % 2 == i]) for i in range(2)]
        single = fill(tmp_path / "single.duckdb", batch)
        servers = [serve_store(s, auth=TokenFile(shard_tokens)) for s in stores]
        serve, runner = serve_federation([s.url for s in servers], "serve-secret", auth=TokenFile(client_tokens))
        tokenless, tokenless_runner = serve_federation([s.url for s in servers])
        try:
            with httpx.Client(base_url=serve.url, headers={"Authorization": "Bearer globex-secret"}) as client:
                got = client.get("/v1/queries/blocked_attempts", params={"limit": 1000}).json()
                con = single.cursor()
                want = run_query(con, "blocked_attempts", {"tenant": "globex", "limit": 1000}).rows
                con.close()
                assert want
                assert got["rows"] == want
                assert {r["tenant"] for r in got["rows"]} == {"globex"}
                assert client.get("/v1/queries/chain_status").status_code == 403
                assert client.get("/v1/queries/blocked_attempts", params={"tenant": "acme"}).status_code == 403
            assert httpx.get(f"{serve.url}/v1/queries/blocked_attempts").status_code == 401
            refused = httpx.get(f"{tokenless.url}/v1/queries/blocked_attempts")
            assert refused.status_code == 502
            assert servers[0].url in refused.json()["error"]
        finally:
            for server in (serve, tokenless, *servers):
                server.stop()
            runner.close()
            tokenless_runner.close()
            for store in (*stores, single):
                store.close()


class TestDashboardThroughServe:
    """The dashboard's loaders (dashboard/data.py) read serve as they read one store."""

    def test_its_pages_equal_the_single_stores(self, deployment: Deployment) -> None:
        """Overview, trends, the blocked attempts page, a call and a run: the same through serve."""
        from dashboard.data import (
            BlockedFilters,
            RunFilters,
            Window,
            load_blocked,
            load_call,
            load_overview,
            load_run,
            load_runs,
            load_trends,
        )

        reader = ApiReader(deployment.serve.url)

        def federated(name: str, params: Any) -> list[dict[str, Any]]:
            return reader.query(name, params).rows

        def single(name: str, params: Any) -> list[dict[str, Any]]:
            return list(deployment.expected(name, dict(params))["rows"])

        now = max(e.time for e in deployment.events) + timedelta(seconds=1)
        window = Window.named("Last hour", now=now)
        for load in (
            lambda q: load_overview(q, window, now=now),
            lambda q: load_trends(q, window, now=now),
            lambda q: load_trends(q, window, "globex", now=now),
            lambda q: load_blocked(q, BlockedFilters(), page=2, page_size=5),
            lambda q: load_call(q, "shop-0-parent"),
            lambda q: load_runs(q, window, RunFilters(), page=1, page_size=5),
            lambda q: load_run(q, "run-lab-3"),
        ):
            assert settled(load(federated)) == settled(load(single))


def settled(value: Any) -> Any:
    """`value` as plain data without the window ends bound to now() (serve's clock and the store's differ)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if isinstance(value, dict):
        return {k: settled(v) for k, v in value.items() if k not in ("until", "previous_since")}
    if isinstance(value, list | tuple):
        return [settled(v) for v in value]
    return value
