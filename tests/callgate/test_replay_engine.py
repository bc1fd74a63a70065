"""Replay over real stores: calls recorded by a real gate, stored by the store's ingest, decided
again by a candidate policy or interceptor in its place, and classified; file and read API alike."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar

import pytest

from callgate.replay_engine import (
    CHANGES,
    OUTCOMES,
    ApiCalls,
    FileCalls,
    InterceptorCandidate,
    PolicyCandidate,
    ReplayedCall,
    ReplayReport,
    StoredCall,
    Window,
    candidate_from_object,
    classify,
    recorded_outcome,
    replay,
)
from consumers import AuditStore, RawRecord, UnknownQueryError
from consumers.api import ApiServer, HealthStatus, build_app
from consumers.metrics import MaterializerMetrics
from consumers.reader import SourceUnavailableError
from consumers.runner import StoreQueryRunner
from events import EventBase, MemorySink, encode_event
from events.chain import Producer
from interceptor_core import (
    Approval,
    ApprovalRequest,
    Block,
    ConfigurationError,
    Deny,
    Gate,
    RequireApproval,
    RunContext,
    Substitute,
    ToolApprovalRequiredError,
    ToolBlockedError,
    ToolCall,
    tool,
)
from interceptor_core.policy import Policy

TOPIC = "callgate.events"
ACME = RunContext(tenant="acme", principal="u-1")
GLOBEX = RunContext(tenant="globex", principal="u-2")


@tool
def refund(order_id: str, amount_cents: int) -> str:
    """Refunds an order."""
    return "refunded"


@tool
def get_order(order_id: str) -> str:
    """Loads an order."""
    return "order"


@tool
def quote(order_id: str) -> str:
    """Quotes a price."""
    return "42"


@tool
def login(user: str, password: str) -> str:
    """Logs in."""
    return "welcome"


@tool
def pay(card: str, amount_cents: int) -> str:
    """Charges a card."""
    return "paid"


TOOLS = [refund, get_order, quote, login, pay]

DESK_V1 = """version: 1
name: desk
rules:
  - id: tenant-orders
    tools: [refund, get_order]
    when: "!args.order_id.startsWith(run.tenant.upperAscii() + '-')"
    decision: deny
  - id: big-refunds
    tools: [refund]
    when: "args.amount_cents > 10000"
    decision: require_approval
  - id: cached-quotes
    tools: [quote]
    decision: substitute
    result: "'1.00'"
  - id: cursed-order
    tools: [get_order]
    when: "args.order_id == 'ACME-666'"
    decision: block
"""


def policy(text: str) -> Policy:
    return Policy.from_text(text, "candidate.yaml")


def v1_with(*rules: str, without: Sequence[str] = ()) -> str:
    """DESK_V1 with rules dropped (by id) and rules added at the end."""
    kept = DESK_V1.split("  - id: ")
    head, body = kept[0], [f"  - id: {r}" for r in kept[1:] if r.split("\n", 1)[0] not in without]
    return head + "".join(body) + "".join(rules)


async def reviewer(request: ApprovalRequest) -> Approval:
    return Approval(approved=request.args["amount_cents"] < 50_000, by="lead")


Call = tuple[str, dict[str, Any], RunContext]


def record(
    calls: Sequence[Call],
    *,
    interceptors: Sequence[object] | None = None,
    approvals: bool = True,
) -> list[EventBase]:
    """A real gate's events for `calls` (desk v1 by default as its one interceptor)."""
    sink = MemorySink()
    chain = list(interceptors) if interceptors is not None else [policy(DESK_V1)]
    gate = Gate("shop", interceptors=chain, sinks=[sink], approval_handler=reviewer if approvals else None)
    desk = gate.agent("desk", tools=TOOLS)

    async def work() -> None:
        for name, args, run in calls:
            with contextlib.suppress(ToolBlockedError, ToolApprovalRequiredError):
                await desk.call(name, args, run=run)

    asyncio.run(work())
    return list(sink.events)


def store_of(path: Path, events: Sequence[EventBase]) -> Path:
    records = [RawRecord(TOPIC, 0, i, e.producer_id.encode(), encode_event(e)) for i, e in enumerate(events)]
    with AuditStore(path) as store:
        store.ingest(records, {(TOPIC, 0): len(records)})
    return path


def at_times(events: Sequence[EventBase], start: datetime, step: timedelta) -> list[EventBase]:
    """The same events re-sealed by one producer, each `step` after the one before from `start`."""
    producer = Producer()
    chain = {"producer_id", "seq", "prev_hash", "hash"}
    return [
        producer.seal(type(event), {**event.model_dump(exclude=chain), "time": start + step * index})
        for index, event in enumerate(events)
    ]


def replayed(path: Path, candidate: Any, window: Window | None = None, **options: Any) -> ReplayReport:
    source = FileCalls(path, window or Window())
    try:
        return replay(source, candidate, **options)
    finally:
        source.close()


def stored(path: Path) -> list[StoredCall]:
    source = FileCalls(path)
    try:
        return [call for batch in source.calls() for call in batch]
    finally:
        source.close()


def counts(report: ReplayReport) -> dict[str, int]:
    """The non-zero changes."""
    return {name: summary.count for name, summary in report.changes.items() if summary.count}


MIXED: list[Call] = [
    ("refund", {"order_id": "ACME-1", "amount_cents": 100}, ACME),  # allowed
    ("refund", {"order_id": "ACME-2", "amount_cents": 20_000}, ACME),  # approval, approved
    ("refund", {"order_id": "ACME-3", "amount_cents": 90_000}, ACME),  # approval, refused
    ("refund", {"order_id": "GLOBEX-1", "amount_cents": 100}, ACME),  # denied
    ("quote", {"order_id": "ACME-4"}, ACME),  # substituted
    ("get_order", {"order_id": "ACME-666"}, ACME),  # blocked
    ("get_order", {"order_id": "GLOBEX-7"}, GLOBEX),  # allowed
    ("refund", {"order_id": "ACME-5", "amount_cents": "many"}, ACME),  # validation: never reached the chain
]


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store of MIXED recorded with desk v1, plus a call of an unknown tool."""
    events = record(MIXED)
    sink = MemorySink()
    gate = Gate("shop", interceptors=[policy(DESK_V1)], sinks=[sink])
    asyncio.run(gate.agent("desk", tools=TOOLS).call("teleport", {}, run=ACME))
    return store_of(tmp_path_factory.mktemp("mixed") / "a.duckdb", events + list(sink.events))


class TestRecordedOutcome:
    """What the recording says each stored call ended with."""

    def test_every_outcome_of_a_real_gate(self, mixed: Path) -> None:
        """Allowed, approved, refused, denied, substituted, blocked; validation and unknown tools are None."""
        found = [(call.tool, recorded_outcome(call), call.cause) for call in stored(mixed)]
        assert found == [
            ("refund", "allowed", None),
            ("refund", "approval", None),
            ("refund", "approval", "approval_refused"),
            ("refund", "denied", "deny"),
            ("quote", "substituted", None),
            ("get_order", "blocked", "block"),
            ("get_order", "allowed", None),
            ("refund", None, "validation"),
            ("teleport", None, "unknown_tool"),
        ]

    def test_an_approval_required_without_a_handler(self, tmp_path: Path) -> None:
        """A Blocked with cause approval_required is an approval outcome, not a block."""
        db = store_of(tmp_path / "a.duckdb", record(MIXED[1:2], approvals=False))
        (call,) = stored(db)
        assert (call.type, call.cause, recorded_outcome(call)) == ("Blocked", "approval_required", "approval")

    def test_the_trail_is_read_as_the_enforced_before_steps(self, mixed: Path) -> None:
        """Each call's steps are (interceptor, kind) of its before-phase; the approval step marks it asked."""
        calls = stored(mixed)
        assert calls[0].steps == (("desk", "allow"),)
        assert calls[1].steps == (("desk", "require_approval"),)
        assert calls[1].asked
        assert not calls[0].asked
        assert calls[3].steps == (("desk", "deny"),)


class TestClassify:
    """Every (recorded, new) pair falls in exactly one change."""

    def test_the_whole_table(self) -> None:
        """The classes a security engineer reads: breaks, loosenings, asks, substitutes."""
        expected = {
            ("allowed", "denied"): "newly_denied",
            ("approval", "denied"): "newly_denied",
            ("substituted", "denied"): "newly_denied",
            ("blocked", "denied"): "block_to_deny",
            ("allowed", "blocked"): "newly_blocked",
            ("denied", "blocked"): "newly_blocked",
            ("approval", "blocked"): "newly_blocked",
            ("substituted", "blocked"): "newly_blocked",
            ("denied", "allowed"): "newly_allowed",
            ("blocked", "allowed"): "newly_allowed",
            ("denied", "approval"): "newly_allowed",
            ("blocked", "substituted"): "newly_allowed",
            ("denied", "substituted"): "newly_allowed",
            ("blocked", "approval"): "newly_allowed",
            ("allowed", "approval"): "newly_asking",
            ("approval", "allowed"): "no_longer_asking",
            ("allowed", "substituted"): "changed_substitute",
            ("approval", "substituted"): "changed_substitute",
            ("substituted", "allowed"): "changed_substitute",
            ("substituted", "approval"): "changed_substitute",
        }
        for recorded in OUTCOMES:
            for new in OUTCOMES:
                want = "unchanged" if recorded == new else expected[(recorded, new)]
                assert classify(recorded, new) == want, (recorded, new)

    def test_every_class_is_documented(self) -> None:
        """CHANGES names every class classify gives, plus uncertain."""
        given = {classify(r, n) for r in OUTCOMES for n in OUTCOMES}
        assert given | {"uncertain"} == set(CHANGES)


class TestReplacingThePolicyThatDecided:
    """A candidate named like a recorded step replaces it: a new version against the one that decided."""

    def test_the_same_policy_changes_nothing(self, mixed: Path) -> None:
        """Desk v1 replayed over its own decisions: every checked call unchanged, the skipped counted apart."""
        report = replayed(mixed, PolicyCandidate(policy(DESK_V1)))
        assert counts(report) == {"unchanged": 7}
        assert report.checked == 7
        assert report.read == 9
        assert report.skipped == {"unknown_tool": 1, "validation": 1}
        assert report.placement == {"replaced": 7, "outermost": 0, "not_reached": 0}
        assert report.exit_code == 0

    def test_a_new_deny_rule_breaks_traffic(self, mixed: Path) -> None:
        """A stricter amount rule newly denies the allowed and approved refunds, named by rule, tool, tenant."""
        stricter = (
            '  - id: small-refunds-only\n    tools: [refund]\n    when: "args.amount_cents > 50"\n    decision: deny\n'
        )
        report = replayed(mixed, PolicyCandidate(policy(v1_with(stricter))))
        assert counts(report) == {"unchanged": 4, "newly_denied": 3}
        denied = report.changes["newly_denied"]
        assert denied.by_rule == {"small-refunds-only": 3}
        assert denied.by_tool == {"refund": 3}
        assert denied.by_tenant == {"acme": 3}
        assert denied.by_principal == {"u-1": 3}
        assert [s["recorded"] for s in denied.samples] == ["allowed", "approval", "approval"]
        assert report.exit_code == 1

    def test_shadow_rules_replay_as_enforced(self, mixed: Path) -> None:
        """A rule still in mode: shadow is replayed as it will be once enforced, and named as the rule."""
        stricter = (
            '  - id: small-refunds-only\n    tools: [refund]\n    when: "args.amount_cents > 50"\n'
            "    decision: deny\n    mode: shadow\n"
        )
        report = replayed(mixed, PolicyCandidate(policy(v1_with(stricter))))
        assert counts(report) == {"unchanged": 4, "newly_denied": 3}
        assert report.changes["newly_denied"].by_rule == {"small-refunds-only": 3}
        whole = DESK_V1.replace("name: desk\n", "name: desk\nmode: shadow\n")
        assert counts(replayed(mixed, PolicyCandidate(policy(whole)))) == {"unchanged": 7}

    def test_a_replay_agrees_with_the_recorded_shadow_outcomes(self, tmp_path: Path) -> None:
        """Recorded with a shadow rule, the same file replayed: exactly the divergent calls change, to their
        recorded shadow outcome."""
        shadowed = v1_with(
            '  - id: small-refunds-only\n    tools: [refund]\n    when: "args.amount_cents > 50"\n'
            "    decision: deny\n    mode: shadow\n"
        )
        events = record(MIXED, interceptors=[policy(shadowed)])
        db = store_of(tmp_path / "a.duckdb", events)
        report = replayed(db, PolicyCandidate(policy(shadowed)))
        divergent = {e.call_id: e.shadow_outcome for e in events if getattr(e, "divergent", None)}
        changed = [s for name, c in report.changes.items() if name != "unchanged" for s in c.samples]
        assert {s["call_id"]: s["new"] for s in changed} == divergent
        assert report.placement["replaced"] == 7

    def test_dropping_a_deny_rule_newly_allows(self, mixed: Path) -> None:
        """Without tenant-orders the cross-tenant refund goes through; the rest of the chain is known: not partial."""
        report = replayed(mixed, PolicyCandidate(policy(v1_with(without=["tenant-orders"]))))
        assert counts(report) == {"unchanged": 6, "newly_allowed": 1}
        (sample,) = report.changes["newly_allowed"].samples
        assert (sample["tool"], sample["recorded"], sample["new"], sample["rule"]) == (
            "refund",
            "denied",
            "allowed",
            "(default)",
        )
        assert report.partial == 0  # the registered chain ends with desk
        assert report.exit_code == 0
        assert (
            replayed(
                mixed, PolicyCandidate(policy(v1_with(without=["tenant-orders"]))), fail_on_new_allows=True
            ).exit_code
            == 1
        )

    def test_asking_changes(self, mixed: Path) -> None:
        """Dropping big-refunds stops asking (also for the refused one); a new ask on get_order newly asks."""
        asks = (
            "  - id: orders-ask\n    tools: [get_order]\n    when: \"run.tenant == 'globex'\"\n"
            "    decision: require_approval\n"
        )
        report = replayed(mixed, PolicyCandidate(policy(v1_with(asks, without=["big-refunds"]))))
        assert counts(report) == {"unchanged": 4, "no_longer_asking": 2, "newly_asking": 1}
        assert report.changes["newly_asking"].by_rule == {"orders-ask": 1}
        assert report.changes["no_longer_asking"].by_rule == {"(default)": 2}
        assert report.new_allows == 2

    def test_substitutes_and_blocks(self, mixed: Path) -> None:
        """No more cached quotes is a substitute change; the cursed order denied instead of blocked is apart."""
        softer = (
            "  - id: cursed-order\n    tools: [get_order]\n    when: \"args.order_id == 'ACME-666'\"\n"
            "    decision: deny\n"
        )
        report = replayed(mixed, PolicyCandidate(policy(v1_with(softer, without=["cached-quotes", "cursed-order"]))))
        assert counts(report) == {"unchanged": 5, "changed_substitute": 1, "block_to_deny": 1}
        assert report.new_blocks == 0

    def test_an_ending_decision_replaces_a_substitute(self, mixed: Path) -> None:
        """Quotes denied where they were substituted: newly denied; a denial substituted: newly allowed."""
        rules = (
            "  - id: no-quotes\n    tools: [quote]\n    decision: deny\n"
            "  - id: cached-refunds\n    tools: [refund]\n    when: \"args.order_id.startsWith('GLOBEX')\"\n"
            "    decision: substitute\n    result: \"'cached'\"\n"
        )
        report = replayed(mixed, PolicyCandidate(policy(v1_with(rules, without=["cached-quotes", "tenant-orders"]))))
        assert counts(report) == {"unchanged": 5, "newly_denied": 1, "newly_allowed": 1}
        assert report.changes["newly_allowed"].samples[0]["new"] == "substituted"


class TestOutermost:
    """A candidate with a name the trail lacks runs first, as the outermost application interceptor."""

    def test_its_ending_decision_wins(self, mixed: Path) -> None:
        """A guard blocking every get_order: the allowed one newly blocked, the blocked one unchanged."""
        guard = "version: 1\nname: guard\nrules:\n  - id: no-orders\n    tools: [get_order]\n    decision: block\n"
        report = replayed(mixed, PolicyCandidate(policy(guard)))
        assert counts(report) == {"unchanged": 6, "newly_blocked": 1}
        assert report.placement == {"replaced": 0, "outermost": 7, "not_reached": 0}

    def test_its_ask_only_counts_where_the_chain_let_the_call_through(self, mixed: Path) -> None:
        """Asking on every refund: the allowed refund newly asks; the denied one stays denied."""
        guard = "version: 1\nname: guard\nrules:\n  - id: ask\n    tools: [refund]\n    decision: require_approval\n"
        report = replayed(mixed, PolicyCandidate(policy(guard)))
        assert counts(report) == {"unchanged": 6, "newly_asking": 1}

    def test_an_allow_changes_nothing(self, mixed: Path) -> None:
        """A candidate that allows everything cannot undo what the recorded chain stopped."""
        report = replayed(mixed, PolicyCandidate(policy("version: 1\nname: guard\nrules: []\n")))
        assert counts(report) == {"unchanged": 7}


class TestNotReached:
    """A call the recorded chain stopped before the candidate's place never reached it."""

    def test_the_registered_chain_places_an_unreached_candidate(self, tmp_path: Path) -> None:
        """Chain desk then second: calls desk denied stay unchanged, calls that reached second are replaced."""
        second = policy("version: 1\nname: second\nrules: []\n")
        events = record(MIXED[:4], interceptors=[policy(DESK_V1), second])
        db = store_of(tmp_path / "a.duckdb", events)
        strict = "version: 1\nname: second\nrules:\n  - id: no-refunds\n    tools: [refund]\n    decision: deny\n"
        report = replayed(db, PolicyCandidate(policy(strict)))
        assert report.placement == {"replaced": 3, "outermost": 0, "not_reached": 1}
        assert counts(report) == {"unchanged": 1, "newly_denied": 3}

    def test_a_candidate_before_later_steps_lets_through_partially(self, tmp_path: Path) -> None:
        """Desk before a second interceptor: a call desk denied and the candidate allows is partial."""
        second = policy("version: 1\nname: second\nrules: []\n")
        db = store_of(tmp_path / "a.duckdb", record(MIXED[3:4], interceptors=[policy(DESK_V1), second]))
        report = replayed(db, PolicyCandidate(policy(v1_with(without=["tenant-orders"]))))
        assert counts(report) == {"newly_allowed": 1}
        assert report.partial == 1
        assert report.changes["newly_allowed"].samples[0]["partial"] is True
        assert any("rest of the chain was not replayed" in note for note in report.notes)


class TestUncertain:
    """A decision that read a redacted argument or unstored run metadata is uncertain, changed or not."""

    CALLS: ClassVar[list[Call]] = [
        ("login", {"user": "bob", "password": "hunter2"}, ACME),
        ("pay", {"card": "4111 1111 1111 1111", "amount_cents": 500}, ACME),
    ]

    @pytest.fixture
    def secrets(self, tmp_path: Path) -> Path:
        return store_of(tmp_path / "a.duckdb", record(self.CALLS))

    def test_the_redactor_redacted_the_arguments(self, secrets: Path) -> None:
        """The store holds placeholders and the pointers of what was replaced."""
        login_call, pay_call = stored(secrets)
        assert login_call.redacted_paths == ("/password",)
        assert login_call.args is not None
        assert login_call.args["password"] == "[REDACTED]"  # noqa: S105 (the placeholder, not a password)
        assert pay_call.redacted_paths == ("/card",)

    def test_a_changed_outcome_that_read_a_redacted_value(self, secrets: Path) -> None:
        """A rule on the password denies the placeholder, one on the card misses it: both uncertain."""
        text = v1_with(
            "  - id: no-empty-passwords\n    tools: [login]\n    when: \"args.password != ''\"\n    decision: deny\n"
            "  - id: no-visa\n    tools: [pay]\n    when: \"args.card.startsWith('4')\"\n    decision: deny\n"
        )
        report = replayed(secrets, PolicyCandidate(policy(text)))
        assert counts(report) == {"uncertain": 2}
        assert report.uncertain_would_be == {"newly_denied": 1, "unchanged": 1}
        assert report.changes["uncertain"].by_rule == {"no-empty-passwords": 1, "(default)": 1}
        assert report.exit_code == 0  # never silently a match

    def test_a_miss_on_a_redacted_value_is_uncertain_too(self, secrets: Path) -> None:
        """A rule on the password misses the placeholder, but the real password would match: uncertain."""
        text = v1_with(
            "  - id: weak\n    tools: [login]\n    when: \"args.password == 'hunter2'\"\n    decision: deny\n"
        )
        report = replayed(secrets, PolicyCandidate(policy(text)))
        assert counts(report) == {"uncertain": 1, "unchanged": 1}
        assert report.uncertain_would_be == {"unchanged": 1}

    def test_an_unredacted_argument_is_certain(self, secrets: Path) -> None:
        """A rule on the user name (stored as it was) newly denies for certain."""
        text = v1_with("  - id: no-bob\n    tools: [login]\n    when: \"args.user == 'bob'\"\n    decision: deny\n")
        assert counts(replayed(secrets, PolicyCandidate(policy(text)))) == {"newly_denied": 1, "unchanged": 1}

    def test_run_metadata_is_not_stored(self, secrets: Path) -> None:
        """A rule reading run.metadata that changes the outcome is uncertain."""
        text = v1_with("  - id: vip\n    tools: [pay]\n    when: \"!('vip' in run.metadata)\"\n    decision: deny\n")
        assert counts(replayed(secrets, PolicyCandidate(policy(text)))) == {"uncertain": 1, "unchanged": 1}

    def test_arguments_the_gate_could_not_redact(self, tmp_path: Path) -> None:
        """A call stored without its arguments (redaction failed): any rule on arguments is uncertain."""
        (event,) = [e for e in record(self.CALLS[1:]) if e.type == "ToolUse"]
        producer = Producer()
        fields = event.model_dump(exclude={"producer_id", "seq", "prev_hash", "hash"})
        fields.update(args=None, redacted_paths=(), redaction_error="ValueError: boom")
        db = store_of(tmp_path / "a.duckdb", [producer.seal(type(event), fields)])
        text = v1_with('  - id: cap\n    tools: [pay]\n    when: "args.amount_cents > 100"\n    decision: deny\n')
        report = replayed(db, PolicyCandidate(policy(text)))
        assert counts(report) == {"uncertain": 1}

    def test_a_python_interceptor_reading_a_redacted_key(self, secrets: Path) -> None:
        """call.args['password'] marks the call; call.args['user'] does not."""

        class PasswordRule:
            name = "pw"

            def before_tool_call(self, call: ToolCall) -> Any:
                if call.tool_name == "login" and call.args["password"]:
                    return Deny("no")
                return None

        class UserRule:
            name = "user"

            def before_tool_call(self, call: ToolCall) -> Any:
                return Deny("no") if call.args.get("user") == "bob" else None

        assert counts(replayed(secrets, InterceptorCandidate(PasswordRule()))) == {"uncertain": 1, "unchanged": 1}
        assert counts(replayed(secrets, InterceptorCandidate(UserRule()))) == {"newly_denied": 1, "unchanged": 1}


class TestCountCalls:
    """count_calls answers from the replayed calls, in time order, at each call's own time."""

    def test_a_rate_limit_over_stored_times(self, tmp_path: Path) -> None:
        """Five acme refunds a minute apart (a globex one among them), two more two hours later: the 4th and
        5th are over 3 an hour."""
        acme = [("refund", {"order_id": f"ACME-{i}", "amount_cents": 100}, ACME) for i in range(5)]
        calls = [*acme[:2], ("refund", {"order_id": "GLOBEX-1", "amount_cents": 100}, GLOBEX), *acme[2:]]
        start = datetime.now(UTC) - timedelta(hours=5)
        first = at_times(record(calls), start, timedelta(minutes=1))
        later = at_times(record(acme[:2]), start + timedelta(hours=2), timedelta(minutes=1))
        db = store_of(tmp_path / "a.duckdb", [*first, *later])
        limit = v1_with(
            "  - id: refund-rate\n    tools: [refund]\n"
            "    when: \"count_calls('refund', 'tenant', duration('1h')) > 3\"\n    decision: deny\n"
        )
        report = replayed(db, PolicyCandidate(policy(limit)), Window(since=start - timedelta(minutes=1)))
        assert counts(report) == {"unchanged": 6, "newly_denied": 2}
        calls_in_order = [call.call_id for call in stored(db) if call.tenant == "acme"]
        assert report.changes["newly_denied"].sample_call_ids == calls_in_order[3:5]
        assert report.counts_calls
        assert any("count_calls" in note for note in report.notes)


class TestPythonCandidates:
    """Interceptors (sync, async, factories) and what they see."""

    def test_an_async_interceptor_is_awaited(self, mixed: Path) -> None:
        """An async before_tool_call that blocks quotes: the substituted quote newly blocked."""

        class NoQuotes:
            name = "no-quotes"

            async def before_tool_call(self, call: ToolCall) -> Any:
                await asyncio.sleep(0)
                return Block("no quotes") if call.tool_name == "quote" else None

        candidate = InterceptorCandidate(NoQuotes())
        try:
            report = replayed(mixed, candidate)
        finally:
            candidate.close()
        assert counts(report) == {"unchanged": 6, "newly_blocked": 1}
        assert report.changes["newly_blocked"].by_rule == {"no-quotes": 1}

    def test_an_interceptor_that_raises_is_a_denial_under_error(self, mixed: Path) -> None:
        """The live gate fails closed: every call the chain let through is newly denied under "(error)"."""

        class Broken:
            name = "broken"

            def before_tool_call(self, call: ToolCall) -> Any:
                raise RuntimeError("lookup service down")

        report = replayed(mixed, InterceptorCandidate(Broken()))
        assert report.changes["newly_denied"].by_rule == {"(error)": 5}
        assert report.changes["newly_denied"].samples[0]["detail"] == "RuntimeError: lookup service down"
        assert [rule.rule for rule in report.rules] == ["broken", "(error)"]

    def test_what_a_replayed_call_shows(self, mixed: Path) -> None:
        """The ToolCall attributes interceptors use, from the stored call; args_model validates them."""
        seen: list[ReplayedCall] = []

        class Looks:
            name = "looks"

            def before_tool_call(self, call: ReplayedCall) -> None:
                seen.append(call)

        replayed(mixed, InterceptorCandidate(Looks()))
        call = seen[0]
        assert (call.tool_name, call.workflow, call.agent, call.run.tenant, call.run.principal) == (
            "refund",
            None,
            "desk",
            "acme",
            "u-1",
        )
        assert str(call.scope_path) == "shop/desk/refund"
        assert dict(call.args) == {"order_id": "ACME-1", "amount_cents": 100}
        assert call.args_model.model_dump() == {"order_id": "ACME-1", "amount_cents": 100}
        assert call.tool.name == "refund"

    def test_factories_and_policies(self) -> None:
        """A class or function is called to build the interceptor; a Policy becomes a policy candidate."""

        class Guard:
            name = "guard"

            def before_tool_call(self, call: ToolCall) -> None:
                return None

        assert candidate_from_object(Guard).info.name == "guard"
        assert candidate_from_object(lambda: Guard()).info.name == "guard"
        assert isinstance(candidate_from_object(policy(DESK_V1)), PolicyCandidate)
        assert isinstance(candidate_from_object(lambda: policy(DESK_V1)), PolicyCandidate)

    def test_what_cannot_be_replayed(self) -> None:
        """An after-only interceptor, or something that is no interceptor, is a ConfigurationError."""

        class AfterOnly:
            name = "after"

            def after_tool_call(self, call: ToolCall, output: Any) -> Any:
                return output

        with pytest.raises(ConfigurationError, match="no before_tool_call"):
            candidate_from_object(AfterOnly())
        with pytest.raises(ConfigurationError, match="neither before_tool_call nor after_tool_call"):
            candidate_from_object(42)

    def test_decisions_as_values(self, mixed: Path) -> None:
        """Substitute and RequireApproval from Python interceptors, and a non-decision is an error."""

        class Mixed:
            name = "mixed"

            def before_tool_call(self, call: ToolCall) -> Any:
                if call.tool_name == "get_order":
                    return RequireApproval("look twice")
                if call.tool_name == "login":
                    return "yes"
                return Substitute("cached") if call.args.get("order_id") == "ACME-1" else None

        report = replayed(mixed, InterceptorCandidate(Mixed()))
        assert counts(report) == {"unchanged": 5, "changed_substitute": 1, "newly_asking": 1}


class TestSources:
    """The store file and the read API give the same calls; what cannot be read says so."""

    def test_a_missing_file(self, tmp_path: Path) -> None:
        """No file: SourceUnavailableError naming it."""
        with pytest.raises(SourceUnavailableError, match="does not exist"):
            FileCalls(tmp_path / "none.duckdb")

    def test_a_file_held_by_a_writer(self, mixed: Path, tmp_path: Path) -> None:
        """A store another process holds for writing cannot be opened; the message says to use --api."""
        db = store_of(tmp_path / "held.duckdb", record(MIXED[:1]))
        holder = subprocess.Popen(
            [sys.executable, "-c", f"from consumers import AuditStore; s = AuditStore({str(db)!r}); print('ready', "
             "flush=True); input()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )  # fmt: skip
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline().strip() == b"ready"
            with pytest.raises(SourceUnavailableError, match="--api"):
                FileCalls(db)
        finally:
            holder.communicate(b"\n", timeout=30)

    def test_the_window_filters(self, mixed: Path) -> None:
        """tool, tenant and time bounds select the calls replayed."""
        candidate = PolicyCandidate(policy(DESK_V1))
        assert replayed(mixed, candidate, Window(tool="get_order")).read == 2
        assert replayed(mixed, candidate, Window(tenant="globex")).read == 1
        assert replayed(mixed, candidate, Window(gate="other")).read == 0
        assert replayed(mixed, candidate, Window(since=datetime.now(UTC) + timedelta(minutes=1))).read == 0
        assert replayed(mixed, candidate, Window(until=datetime.now(UTC) + timedelta(minutes=1))).read == 9

    def test_slices_keep_time_order(self, tmp_path: Path) -> None:
        """Read in slices of 3 calls, every call comes once, in (time, event_id) order."""
        calls = [("refund", {"order_id": f"ACME-{i}", "amount_cents": 100}, ACME) for i in range(10)]
        db = store_of(tmp_path / "a.duckdb", record(calls))
        source = FileCalls(db, batch_rows=3)
        try:
            batches = list(source.calls())
        finally:
            source.close()
        assert [len(b) for b in batches] == [3, 3, 3, 1]
        found = [(c.time_s, c.event_id) for b in batches for c in b]
        assert found == sorted(found)
        assert len({c.call_id for b in batches for c in b}) == 10


class OlderRunner(StoreQueryRunner):
    """A read API of a materializer from before replay: every query but replay_calls."""

    def names(self) -> list[dict[str, Any]]:
        return [query for query in super().names() if query["name"] != "replay_calls"]

    def run(self, name: str, params: Any) -> dict[str, Any]:
        if name == "replay_calls":
            raise UnknownQueryError(f"unknown query {name!r}", query=name)
        return super().run(name, params)


@pytest.fixture
def served(mixed: Path, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A copy of the mixed store held for writing and served by the read API, as the materializer serves it."""
    db = tmp_path / "served.duckdb"
    db.write_bytes(mixed.read_bytes())
    store = AuditStore(db)
    server = ApiServer(build_app(StoreQueryRunner(store), MaterializerMetrics(), lambda: HealthStatus(True)), port=0)
    try:
        with server:
            yield server.url, db
    finally:
        store.close()


class TestThroughTheApi:
    """The read API's replay_calls, paged by its cursor, gives the report the file gives."""

    def test_api_and_file_agree(self, served: tuple[str, Path], mixed: Path) -> None:
        """Same counts, samples and placement through the API (pages of 2) as from the file."""
        url, _ = served
        stricter = '  - id: small\n    tools: [refund]\n    when: "args.amount_cents > 50"\n    decision: deny\n'
        text = v1_with(stricter, without=["tenant-orders"])
        via_file = replayed(mixed, PolicyCandidate(policy(text)))
        source = ApiCalls(url, page_rows=2)
        via_api = replay(source, PolicyCandidate(policy(text)))
        assert via_api.source == url
        keep = ("changes", "rules", "placement", "skipped", "read", "checked", "partial")
        assert {k: via_api.to_dict()[k] for k in keep} == {k: via_file.to_dict()[k] for k in keep}

    def test_an_api_without_replay_calls(self, mixed: Path) -> None:
        """A materializer older than replay: SourceUnavailableError saying so."""
        with AuditStore(mixed, read_only=True) as store:
            app = build_app(OlderRunner(store), MaterializerMetrics(), lambda: HealthStatus(True))
            with ApiServer(app, port=0) as server, pytest.raises(SourceUnavailableError, match="no replay_calls"):
                replay(ApiCalls(server.url), PolicyCandidate(policy(DESK_V1)))


class TestReport:
    """The verdict, the limits, and the JSON and JUnit forms."""

    STRICTER = (
        '  - id: small-refunds-only\n    tools: [refund]\n    when: "args.amount_cents > 50"\n    decision: deny\n'
    )

    def test_max_new_blocks_is_a_share_of_the_checked_calls(self, mixed: Path) -> None:
        """3 of 7 calls newly denied: 42% passes, 40% fails, rounding down the allowed count."""
        candidate = PolicyCandidate(policy(v1_with(self.STRICTER)))
        assert replayed(mixed, candidate, max_new_blocks=0.43).exit_code == 0
        assert replayed(mixed, candidate, max_new_blocks=0.40).allowed_new_blocks == 2
        assert replayed(mixed, candidate, max_new_blocks=0.40).exit_code == 1
        with pytest.raises(ValueError, match=r"\[0, 1\]"):
            replayed(mixed, candidate, max_new_blocks=1.5)

    def test_an_empty_window_cannot_tell(self, mixed: Path) -> None:
        """Nothing checked is exit 2, never a pass."""
        report = replayed(mixed, PolicyCandidate(policy(DESK_V1)), Window(tool="nothing"))
        assert report.checked == 0
        assert report.exit_code == 2
        assert "nothing to replay" in report.summary()

    def test_json_has_the_whole_report(self, mixed: Path) -> None:
        """Every class, the candidate with its version, the window, limits and samples."""
        candidate = PolicyCandidate(policy(v1_with(self.STRICTER)))
        data = replayed(mixed, candidate, Window(tool="refund")).to_dict()
        assert list(data["changes"]) == list(CHANGES)
        assert data["candidate"]["version"] == candidate.policy.version
        assert data["candidate"]["rules"][-1] == "(default)"
        assert data["window"]["tool"] == "refund"
        assert data["changes"]["newly_denied"]["sample_call_ids"] == [
            s["call_id"] for s in data["changes"]["newly_denied"]["samples"]
        ]
        assert data["skipped"] == {"total": 1, "by_cause": {"validation": 1}}
        assert data["exit_code"] == 1
        assert data["limits"] == {"max_new_blocks": 0.0, "allowed_new_blocks": 0, "fail_on_new_allows": False}

    def test_junit_has_a_case_per_rule(self, mixed: Path) -> None:
        """Each rule is a case (the breaking one fails, with samples); one more case carries the verdict."""
        report = replayed(mixed, PolicyCandidate(policy(v1_with(self.STRICTER))))
        suite = ET.fromstring(report.to_junit()).find("testsuite")  # noqa: S314 (our own output)
        assert suite is not None
        cases = {case.get("name"): case for case in suite.findall("testcase")}
        assert list(cases) == [
            "tenant-orders",
            "big-refunds",
            "cached-quotes",
            "cursed-order",
            "small-refunds-only",
            "(default)",
            "(all rules)",
        ]
        failing = [name for name, case in cases.items() if case.find("failure") is not None]
        assert failing == ["small-refunds-only", "(all rules)"]
        failure = cases["small-refunds-only"].find("failure")
        assert failure is not None
        assert failure.text is not None
        assert report.changes["newly_denied"].sample_call_ids[0] in failure.text
        assert suite.get("failures") == "2"
