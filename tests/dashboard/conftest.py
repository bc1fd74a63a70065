"""A seeded audit store with known counts of every event type, shared by the dashboard's tests."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from consumers.store import AuditStore, RawRecord
from events import EventBase, MemorySink, Producer, ToolDeniedEvent, ToolUseEvent, encode_event
from events.signing import SigningKey, VerifyingKey
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
from interceptor_core.policy import Policy as PolicyFile

TOPIC = "callgate.audit"
ACME = RunContext(tenant="acme", principal="u-1")
GLOBEX = RunContext(tenant="globex", principal="u-2")

# Attacker-controlled text: an order id a prompt injection wrote, which the denial message quotes.
HOSTILE_ORDER = (
    "GLOBEX-666 <img src=https://evil.example/x.png onerror=alert(1)> [click me](https://evil.example/phish) "
    "![pixel](https://evil.example/pixel.png) <script>alert(2)</script>"
)
HOSTILE_MARKERS = ("evil.example", "<script>", "onerror")

ALLOWED_ORDERS = ("ACME-1", "ACME-2", "ACME-3", "ACME-4", "ACME-5")
DENIED_ORDERS = ("GLOBEX-7", "GLOBEX-8", "GLOBEX-9", HOSTILE_ORDER)
BLOCKED_QUERIES = ("DROP TABLE orders", "drop table users")
QUOTES = ("ACME-10", "ACME-11", "ACME-12")
OLD_DENIALS = 3  # 90 minutes before the fixture ran: the previous window of "Last hour"
# c-old-0 carries a well-formed trace id, c-old-1 one an attacker shaped into a link.
TRACE_IDS = ("0af7651916cd43dd8448eb211c80319c", "javascript:alert(1)//0af7651916cd43dd8448eb211c80319c", None)


@tool(description="Loads an order record by ID")
def get_order(order_id: str) -> str:
    return f"order {order_id}"


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


async def reviewer(request: ApprovalRequest) -> Approval:
    return Approval(approved=request.args["amount_cents"] < 1000, by="lead")


def shop_events() -> list[EventBase]:
    """Allowed, denied (one quoting hostile text), approved, refused, blocked and substituted calls,
    and one unmediated use of a guarded client, all now."""
    sink = MemorySink()
    gate = Gate("shop", interceptors=[TenantOrders(), Policy()], sinks=[sink], approval_handler=reviewer)
    desk = gate.workflow("support").agent("desk", tools=[get_order, refund, run_sql, quote])
    payments = gate.guard({"balance": 1}, name="payments", tools=["refund"])

    async def day() -> None:
        for i, order in enumerate(ALLOWED_ORDERS):
            await desk.call("get_order", {"order_id": order}, run=ACME, call_id=f"c-ok-{i}")
        for i, order in enumerate(DENIED_ORDERS):
            await desk.call("get_order", {"order_id": order}, run=ACME, call_id=f"c-deny-{i}")
        await desk.call("refund", {"order_id": "ACME-1", "amount_cents": 500}, run=ACME, call_id="c-approved")
        await desk.call("refund", {"order_id": "ACME-2", "amount_cents": 5000}, run=ACME, call_id="c-refused")
        for i, query in enumerate(BLOCKED_QUERIES):
            with pytest.raises(ToolBlockedError):
                await desk.call("run_sql", {"query": query}, run=GLOBEX, call_id=f"c-blocked-{i}")
        for i, order in enumerate(QUOTES):
            await desk.call("quote", {"order_id": order}, run=ACME, call_id=f"c-quote-{i}")

    asyncio.run(day())
    with pytest.raises(UnmediatedAccessError):
        payments["balance"]
    return list(sink.events)


def lab_events() -> list[EventBase]:
    """Another producer: its registration and three calls (the store will miss its seq 2)."""
    sink = MemorySink()
    lab = Gate("lab", sinks=[sink]).agent("bench", tools=[quote])

    async def run() -> None:
        for n in range(3):
            await lab.call("quote", {"order_id": f"LAB-{n}"}, run=GLOBEX)

    asyncio.run(run())
    return list(sink.events)


def old_denials(now: datetime) -> list[EventBase]:
    """Denials of a third producer 90 minutes ago."""
    producer = Producer()
    return [
        producer.seal(
            ToolDeniedEvent,
            {
                "event_id": uuid.uuid4().hex,
                "time": now - timedelta(minutes=90),
                "gate": "shop",
                "workflow": "support",
                "agent": "desk",
                "tool": "get_order",
                "call_id": f"c-old-{i}",
                "trace_id": TRACE_IDS[i],
                "tenant": "acme",
                "principal": "u-9",
                "args": {"order_id": f"GLOBEX-{100 + i}"},
                "message": f"Order GLOBEX-{100 + i} does not belong to tenant acme.",
                "decided_by": "tenant-orders",
                "cause": "deny",
            },
        )
        for i in range(OLD_DENIALS)
    ]


@dataclass(frozen=True)
class SeededStore:
    """A store file nobody writes, and what went into it."""

    path: Path
    events: list[EventBase]
    hostile_markers: tuple[str, ...] = HOSTILE_MARKERS
    old_denials: int = OLD_DENIALS
    trace_ids: tuple[str | None, ...] = TRACE_IDS

    def scalar(self, sql: str, *params: Any) -> Any:
        """One value from the store, by plain SQL (the test's own look, not the dashboard's queries)."""
        with AuditStore(self.path, read_only=True) as store:
            con = store.cursor()
            try:
                row = con.execute(sql, list(params)).fetchone()
            finally:
                con.close()
        return row[0] if row else None


def build_store(path: Path) -> SeededStore:
    """Shop and old events on partition 0; the lab's on partition 1 without its seq 2 (a gap); one
    record that is not JSON."""
    now = datetime.now(UTC)
    shop, lab, old = shop_events(), lab_events(), old_denials(now)
    kept_lab = [e for e in lab if e.seq != 2]
    first = shop + old
    batch = [RawRecord(TOPIC, 0, i, e.producer_id.encode(), encode_event(e)) for i, e in enumerate(first)]
    batch += [RawRecord(TOPIC, 1, i, e.producer_id.encode(), encode_event(e)) for i, e in enumerate(kept_lab)]
    batch.append(RawRecord(TOPIC, 1, 50, b"lab", b"{not json <b>bold</b>"))
    with AuditStore(path) as store:
        store.ingest(batch, {(TOPIC, 0): len(first), (TOPIC, 1): 51})
        store.close_open_gaps()
    return SeededStore(path, first + kept_lab)


@pytest.fixture(scope="session")
def seeded_store(tmp_path_factory: pytest.TempPathFactory) -> SeededStore:
    """The seeded store, built once per session (closed: readers may open it)."""
    return build_store(tmp_path_factory.mktemp("dashboard") / "audit.duckdb")


@pytest.fixture(scope="session")
def empty_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated store without events."""
    path = tmp_path_factory.mktemp("dashboard-empty") / "audit.duckdb"
    AuditStore(path).close()
    return path


# -- shadow mode: the Policy impact page's store -------------------------------------------------

# An enforced rule and a stricter candidate in shadow, in one policy file.
REFUNDS_POLICY = """\
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
"""
SHADOW_REFUNDS = (1000, 6000, 7000, 8000)  # the last three would be denied by stricter-refunds
HOSTILE_DECIDER = "frozen <img src=https://evil.example/x.png onerror=alert(1)> [x](https://evil.example/p)"


class FrozenTenants:
    """A candidate in shadow: globex would be blocked."""

    name = "frozen-tenants"

    def before_tool_call(self, call: ToolCall) -> Any:
        return Block("globex is frozen") if call.run.tenant == "globex" else None


def shadow_shop_events() -> list[EventBase]:
    """Refunds under a policy file with a shadow rule (c-refund-0..3: one allowed by both, three the
    rule would deny), a globex order a shadow interceptor would block (c-frozen), and an order of
    another tenant the enforced chain denied before any shadow interceptor ran (c-foreign)."""
    sink = MemorySink()
    gate = Gate(
        "shop",
        interceptors=[TenantOrders(), PolicyFile.from_text(REFUNDS_POLICY), shadow(FrozenTenants())],
        sinks=[sink],
    )
    desk = gate.workflow("support").agent("desk", tools=[get_order, refund])

    async def day() -> None:
        for i, amount in enumerate(SHADOW_REFUNDS):
            args = {"order_id": f"ACME-{i}", "amount_cents": amount}
            await desk.call("refund", args, run=ACME, call_id=f"c-refund-{i}")
        await desk.call("get_order", {"order_id": "GLOBEX-1"}, run=GLOBEX, call_id="c-frozen")
        await desk.call("get_order", {"order_id": "GLOBEX-2"}, run=ACME, call_id="c-foreign")

    asyncio.run(day())
    return list(sink.events)


def hostile_shadow_event() -> EventBase:
    """A call whose shadow decider's name an attacker wrote (a forged producer's event)."""
    return Producer().seal(
        ToolUseEvent,
        {
            "event_id": uuid.uuid4().hex,
            "time": datetime.now(UTC),
            "gate": "shop",
            "workflow": "support",
            "agent": "desk",
            "tool": "get_order",
            "call_id": "c-hostile",
            "tenant": "acme",
            "principal": "u-1",
            "args": {"order_id": "ACME-9"},
            "outcome": "ok",
            "duration_ms": 1.0,
            "shadow_outcome": "denied",
            "divergent": True,
            "shadow_decided_by": HOSTILE_DECIDER,
        },
    )


@dataclass(frozen=True)
class ShadowStore(SeededStore):
    """A store with shadow decisions, nobody writing it."""

    hostile_decider: str = HOSTILE_DECIDER


@pytest.fixture(scope="session")
def shadow_store(tmp_path_factory: pytest.TempPathFactory) -> ShadowStore:
    """The shop's shadow decisions and the hostile one, stored once per session (closed)."""
    path = tmp_path_factory.mktemp("dashboard-shadow") / "audit.duckdb"
    shop, hostile = shadow_shop_events(), hostile_shadow_event()
    batch = [RawRecord(TOPIC, 0, i, e.producer_id.encode(), encode_event(e)) for i, e in enumerate(shop)]
    batch.append(RawRecord(TOPIC, 1, 0, hostile.producer_id.encode(), encode_event(hostile)))
    with AuditStore(path) as store:
        store.ingest(batch, {(TOPIC, 0): len(shop), (TOPIC, 1): 1})
    return ShadowStore(path, [*shop, hostile])


# -- signed checkpoints: the Coverage page's signed check and the Call detail page's proofs -------

SIGNED_CALLS = 9  # s-0 .. s-8 through the signing gate, a checkpoint every 4 events and on close
UNSIGNED_CALLS = 2  # u-0, u-1 through a gate without a key: no checkpoint covers them


@dataclass(frozen=True)
class SignedStore(SeededStore):
    """A store of a signing gate and an unsigned one, verified with the signing gate's key."""

    key: VerifyingKey | None = None
    keys: Path = Path()
    """A directory with the signing gate's public key (`callgate dashboard --trusted-keys`)."""
    wrong_keys: Path = Path()
    """A directory with another key of the same name."""
    unsigned_producer: str = ""


def signed_events(key: SigningKey) -> tuple[list[EventBase], list[EventBase]]:
    """The signing gate's events (with its checkpoints) and the unsigned gate's."""
    signing_sink, plain_sink = MemorySink(), MemorySink()
    signing = Gate("shop", signing_key=key, sinks=[signing_sink], checkpoint_events=4, checkpoint_s=60, heartbeat_s=60)
    plain = Gate("lab", sinks=[plain_sink])
    desk = signing.agent("desk", tools=[quote])
    bench = plain.agent("bench", tools=[quote])

    async def run() -> None:
        for n in range(SIGNED_CALLS):
            await desk.call("quote", {"order_id": f"ACME-{n}"}, run=ACME, call_id=f"s-{n}")
        for n in range(UNSIGNED_CALLS):
            await bench.call("quote", {"order_id": f"LAB-{n}"}, run=GLOBEX, call_id=f"u-{n}")
        await signing.close()
        await plain.close()

    asyncio.run(run())
    return list(signing_sink.events), list(plain_sink.events)


@pytest.fixture(scope="session")
def signed_store(tmp_path_factory: pytest.TempPathFactory) -> SignedStore:
    """The signed and the unsigned gate's events, stored once per session by a store trusting the
    signing key (closed: readers may open it)."""
    base = tmp_path_factory.mktemp("dashboard-signed")
    key, other = SigningKey.generate("shop"), SigningKey.generate("shop")
    key.write(base / "keys")
    other.write(base / "wrong")
    for private in (base / "keys" / "shop.key", base / "wrong" / "shop.key"):
        private.unlink()  # the dashboard only ever needs the public half
    signed, plain = signed_events(key)
    events = signed + plain
    batch = [RawRecord(TOPIC, 0, i, e.producer_id.encode(), encode_event(e)) for i, e in enumerate(events)]
    path = base / "audit.duckdb"
    with AuditStore(path, trusted_keys={key.key_id: key.public()}) as store:
        store.ingest(batch, {(TOPIC, 0): len(batch)})
    return SignedStore(
        path,
        events,
        key=key.public(),
        keys=base / "keys",
        wrong_keys=base / "wrong",
        unsigned_producer=plain[0].producer_id,
    )


# -- agent runs: the Run page's store --------------------------------------------------------------

DESK_RUN = RunContext(tenant="acme", principal="u-1", thread_id="t-1", run_id="run-desk")
HELPER_RUN = "run-helper"
GLOBEX_RUN = RunContext(tenant="globex", principal="u-2", thread_id="t-2", run_id="run-globex")


class DeskRules:
    """Orders of other tenants are denied, refunds over 1.00 need a person, SQL is blocked."""

    name = "desk-rules"

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


async def lead(request: ApprovalRequest) -> Approval:
    return Approval(approved=True, by="lead", note="known customer")


def agent_run_events() -> list[EventBase]:
    """The desk's run (run-desk): an order and an approved refund; the research agent used as a tool
    (same run, nested under its call); the helper agent started by a tool in a run of its own
    (run-helper, nested under that call), denied an order; blocked SQL, which stops the run. And
    globex's run (run-globex): one denied order."""
    from interceptor_core import Agent, ModelTurn, ScriptedModel, ToolCallRequest, ToolContext

    def ask(name: str, **args: Any) -> ToolCallRequest:
        return ToolCallRequest(f"m-{name}", name, args)

    sink = MemorySink()
    gate = Gate("shop", interceptors=[DeskRules()], sinks=[sink], approval_handler=lead)
    research = Agent(
        gate.agent("research", tools=[get_order]),
        ScriptedModel([ModelTurn(tool_calls=[ask("get_order", order_id="ACME-2")]), ModelTurn("found")]),
        before_turn=[TurnGuard()],
    )
    helper = Agent(
        gate.agent("helper", tools=[get_order]),
        ScriptedModel([ModelTurn(tool_calls=[ask("get_order", order_id="GLOBEX-3")]), ModelTurn("no")]),
        before_turn=[TurnGuard()],
    )

    @tool
    async def delegate(task: str, ctx: ToolContext) -> str:
        """Hands a task to the helper agent, in a run of its own."""
        nested = RunContext(tenant=ctx.run.tenant, principal=ctx.run.principal, run_id=HELPER_RUN)
        return (await helper.run(task, run=nested)).output or ""

    ask_research = research.as_tool("ask_research", "Asks the research agent.")
    desk = Agent(
        gate.agent("desk", tools=[get_order, refund, run_sql, ask_research, delegate]),
        ScriptedModel(
            [
                ModelTurn(tool_calls=[ask("get_order", order_id="ACME-1")]),
                ModelTurn(tool_calls=[ask("refund", order_id="ACME-1", amount_cents=500)]),
                ModelTurn(tool_calls=[ask("ask_research", prompt="look up ACME-2")]),
                ModelTurn(tool_calls=[ask("delegate", task="check GLOBEX-3")]),
                ModelTurn(tool_calls=[ask("run_sql", query="DROP TABLE orders")]),
                ModelTurn("never reached"),
            ]
        ),
        before_turn=[TurnGuard()],
    )
    other = Agent(
        gate.agent("desk-globex", tools=[get_order]),
        ScriptedModel([ModelTurn(tool_calls=[ask("get_order", order_id="ACME-9")]), ModelTurn("sorry")]),
    )

    async def day() -> None:
        with pytest.raises(ToolBlockedError):
            await desk.run("refund my order", run=DESK_RUN)
        await other.run("where is ACME-9?", run=GLOBEX_RUN)

    asyncio.run(day())
    return list(sink.events)


@pytest.fixture(scope="session")
def run_store(tmp_path_factory: pytest.TempPathFactory) -> SeededStore:
    """The agent runs, stored once per session (closed: readers may open it)."""
    path = tmp_path_factory.mktemp("dashboard-runs") / "audit.duckdb"
    events = agent_run_events()
    batch = [RawRecord(TOPIC, 0, i, e.producer_id.encode(), encode_event(e)) for i, e in enumerate(events)]
    with AuditStore(path) as store:
        store.ingest(batch, {(TOPIC, 0): len(batch)})
    return SeededStore(path, events)


# -- logins: a token file with an auditor and a tenant administrator ----------------------------------

TOKENS = {
    "auditor": "tok-auditor-7f3a",
    "globex-admin": "tok-globex-91c2",
    "acme-admin": "tok-acme-55d0",
    "pair-admin": "tok-pair-0b7e",
}
ROLES = {
    "auditor": ["auditor"],
    "globex-admin": ["tenant:globex"],
    "acme-admin": ["tenant:acme"],
    "pair-admin": ["tenant:acme", "tenant:globex"],
}


@pytest.fixture(scope="session")
def token_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A token file (`callgate token new`'s format) with an auditor, two tenant administrators and
    one of both tenants; the tokens themselves are `TOKENS`."""
    import yaml

    from consumers.auth import hash_token

    path = tmp_path_factory.mktemp("dashboard-tokens") / "tokens.yaml"
    entries = [{"subject": s, "sha256": hash_token(TOKENS[s]), "roles": ROLES[s]} for s in TOKENS]
    path.write_text(yaml.safe_dump({"tokens": entries}), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def tokens() -> dict[str, str]:
    """The tokens of `token_file`, by subject."""
    return dict(TOKENS)


CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's chromium (`make test` installs it as root). Missing: a failure in CI, a loud skip
    elsewhere."""
    if os.access(CHROMIUM, os.X_OK):
        return CHROMIUM
    reason = f"!!! {CHROMIUM} is missing: the console's browser tests did NOT run (apt-get install chromium) !!!"
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser(chromium: str) -> Iterator[Any]:
    """One headless chromium for the module, driven by Playwright's sync API."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        try:
            yield launched
        finally:
            launched.close()


def download(page: Any, button: str, *, attempts: int = 3) -> Any:
    """The download the page's `button` starts (Playwright's `Download`). The click is repeated,
    up to `attempts` times of 15 s each, when no download starts: a Live rerun can replace the
    button between finding it and the click landing, and the click is then lost."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    for attempt in range(1, attempts + 1):
        try:
            with page.expect_download(timeout=15_000) as caught:
                page.get_by_role("button", name=button).click()
        except PlaywrightTimeout:
            if attempt == attempts:
                raise
            continue
        return caught.value
    raise AssertionError("unreachable")  # pragma: no cover
