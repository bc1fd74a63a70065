"""Durable approval requests: bound to the exact call, decided from outside, honoured once."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from events import MemorySink
from events.chain import Producer, new_event_id
from events.models import ApprovalRequestedEvent, ApprovalResolvedEvent, ToolDeniedEvent, ToolUseEvent
from interceptor_core import (
    ApprovalRequest,
    ConfigurationError,
    Gate,
    RequireApproval,
    RunContext,
    ToolApprovalRequiredError,
    before_tool_call,
    tool,
)
from interceptor_core.approvals import PER_PROCESS, RemoteApprovals, approval_id_for, args_digest
from interceptor_core.policy import Policy

ACME = RunContext(tenant="acme", principal="u-1", run_id="r-1")

POLICY = """\
version: 1
name: refunds
rules:
  - id: big-refunds
    tools: [refund]
    when: "args.amount_cents > 10000"
    decision: require_approval
    message: "Refunds over 100.00 need a reviewer."
"""


class Refund(BaseModel):
    order_id: str
    amount_cents: int


class ListedDecisions:
    """A `DecisionSource` fed by the test: `add` a decision, waiters wake."""

    def __init__(self) -> None:
        self.by_id: dict[str, list[ApprovalResolvedEvent]] = {}
        self._changed = asyncio.Event()
        self.producer = Producer()

    def decisions(self, approval_id: str) -> list[ApprovalResolvedEvent]:
        return list(self.by_id.get(approval_id, ()))

    def changed(self) -> asyncio.Event:
        return self._changed

    def add(self, request: ApprovalRequest, *, approved: bool = True, **override: Any) -> ApprovalResolvedEvent:
        fields: dict[str, Any] = {
            "event_id": new_event_id(),
            "time": datetime.now(UTC),
            "gate": "shop",
            "call_id": request.call_id,
            "approved": approved,
            "by": "rev-1",
            "note": "looks fine" if approved else "no",
            "waited_ms": 1.0,
            "approval_id": request.approval_id,
            "args_digest": request.args_digest,
            "policy_version": request.policy_version,
        }
        fields.update(override)
        event = self.producer.seal(ApprovalResolvedEvent, fields)
        self.by_id.setdefault(request.approval_id, []).append(event)
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
        return event


class Asked:
    """Records each request the remote handler gets, so the test can answer it."""

    def __init__(self, inner: RemoteApprovals) -> None:
        self.inner = inner
        self.requests: asyncio.Queue[ApprovalRequest] = asyncio.Queue()

    async def __call__(self, request: ApprovalRequest) -> Any:
        self.requests.put_nowait(request)
        return await self.inner(request)


def build(timeout_s: float = 30.0) -> tuple[Any, MemorySink, ListedDecisions, Asked, list[int]]:
    ran: list[int] = []

    @tool
    def refund(args: Refund) -> str:
        ran.append(args.amount_cents)
        return "refunded"

    source = ListedDecisions()
    asked = Asked(RemoteApprovals(source, claims=PER_PROCESS))
    sink = MemorySink()
    gate = Gate(
        "shop",
        interceptors=[Policy.from_text(POLICY)],
        sinks=[sink],
        approval_handler=asked,
        approval_timeout_s=timeout_s,
    )
    return gate.agent("desk", tools=[refund]), sink, source, asked, ran


def of(sink: MemorySink, call_id: str) -> list[Any]:
    return [e for e in sink.events if e.call_id == call_id and e.type != "ToolsRegistered"]


class TestTheRequest:
    async def test_the_request_is_bound_to_the_call(self) -> None:
        """ApprovalRequested carries approval id, args digest, policy version, rule, expiry and who asked."""
        scope, sink, source, asked, _ = build()
        task = asyncio.create_task(
            scope.call("refund", {"order_id": "ACME-1", "amount_cents": 20000}, run=ACME, call_id="c-1")
        )
        request = await asked.requests.get()
        source.add(request)
        assert (await task).ok
        requested = next(e for e in of(sink, "c-1") if isinstance(e, ApprovalRequestedEvent))
        digest = args_digest({"order_id": "ACME-1", "amount_cents": 20000})
        assert requested.args_digest == digest == request.args_digest
        assert requested.policy_version is not None
        assert len(requested.policy_version) == 64
        assert requested.approval_id == approval_id_for("c-1", digest, requested.policy_version)
        assert requested.rule == "big-refunds"
        assert (requested.tenant, requested.principal, requested.run_id) == ("acme", "u-1", "r-1")
        assert requested.expires_at is not None
        expires = datetime.fromisoformat(requested.expires_at)
        assert timedelta(seconds=29) < expires - requested.time <= timedelta(seconds=30)


class TestRemoteDecisions:
    async def test_an_approval_from_outside_runs_the_call_once(self) -> None:
        """Requested, resolved by the reviewer (recorded once, by the desk), then one ToolUse."""
        scope, sink, source, asked, ran = build()
        task = asyncio.create_task(
            scope.call("refund", {"order_id": "ACME-1", "amount_cents": 20000}, run=ACME, call_id="c-1")
        )
        decision = source.add(await asked.requests.get())
        result = await task
        assert result.ok
        assert ran == [20000]
        # The desk's ApprovalResolved is the record: the gate writes no second one.
        assert [e.type for e in of(sink, "c-1")] == ["ApprovalRequested", "ToolUse"]
        assert decision.by == "rev-1"
        assert [d.interceptor for d in result.decisions][-1] == "approval"

    async def test_a_denial_from_outside_refuses_with_the_reviewers_note(self) -> None:
        """A reviewer's denial is a ToolDenied (approval_refused) whose message names the reviewer and note."""
        scope, sink, source, asked, ran = build()
        task = asyncio.create_task(
            scope.call("refund", {"order_id": "ACME-1", "amount_cents": 20000}, run=ACME, call_id="c-2")
        )
        source.add(await asked.requests.get(), approved=False)
        result = await task
        assert result.kind == "denied"
        assert ran == []
        assert "by rev-1: no" in (result.message or "")
        (outcome,) = [e for e in of(sink, "c-2") if isinstance(e, ToolDeniedEvent)]
        assert outcome.cause == "approval_refused"

    async def test_a_decision_for_other_arguments_or_policy_is_not_honoured(self) -> None:
        """A decision whose digest or policy version differs from the request's is ignored; the call waits."""
        scope, sink, source, asked, ran = build(timeout_s=0.5)
        task = asyncio.create_task(
            scope.call("refund", {"order_id": "ACME-1", "amount_cents": 20000}, run=ACME, call_id="c-3")
        )
        request = await asked.requests.get()
        source.add(request, args_digest="0" * 64)
        source.add(request, policy_version="f" * 64)
        source.add(request, call_id="c-other")
        result = await task
        assert result.kind == "denied"
        assert ran == []
        resolved = [e for e in of(sink, "c-3") if isinstance(e, ApprovalResolvedEvent)]
        assert [(e.approved, e.by, e.approval_id) for e in resolved] == [(False, None, request.approval_id)]
        assert resolved[0].error is not None

    async def test_expiry_refuses_the_call_and_records_it(self) -> None:
        """No decision before expires_at: the gate records an unanswered ApprovalResolved and a refusal."""
        scope, sink, _, asked, ran = build(timeout_s=0.2)
        result = await scope.call("refund", {"order_id": "ACME-1", "amount_cents": 20000}, run=ACME, call_id="c-4")
        assert result.kind == "denied"
        assert ran == []
        assert asked.requests.qsize() == 1
        assert [e.type for e in of(sink, "c-4")] == ["ApprovalRequested", "ApprovalResolved", "ToolDenied"]

    async def test_an_approval_is_used_once(self) -> None:
        """The same call asked again after its approval was used waits for a new decision."""
        scope, _, source, asked, ran = build(timeout_s=0.3)
        args = {"order_id": "ACME-1", "amount_cents": 20000}
        task = asyncio.create_task(scope.call("refund", args, run=ACME, call_id="c-5"))
        source.add(await asked.requests.get())
        assert (await task).ok
        again = await scope.call("refund", args, run=ACME, call_id="c-5")
        assert again.kind == "denied"
        assert ran == [20000]

    async def test_changed_arguments_ask_again(self) -> None:
        """The same call id with other arguments is another request, with another approval id."""
        scope, _, source, asked, ran = build(timeout_s=0.3)
        task = asyncio.create_task(
            scope.call("refund", {"order_id": "ACME-1", "amount_cents": 20000}, run=ACME, call_id="c-6")
        )
        first = await asked.requests.get()
        source.add(first)
        assert (await task).ok
        other = await scope.call("refund", {"order_id": "ACME-1", "amount_cents": 30000}, run=ACME, call_id="c-6")
        second = await asked.requests.get()
        assert second.approval_id != first.approval_id
        assert second.args_digest != first.args_digest
        assert other.kind == "denied"
        assert ran == [20000]

    async def test_a_decision_given_before_the_call_is_found(self) -> None:
        """A decision already taken (a resumed run in a new process) is honoured at once."""
        scope, _sink, source, asked, ran = build()
        args = {"order_id": "ACME-1", "amount_cents": 20000}
        # The same call, asked before (in a process that is gone): same approval id.
        first = asyncio.create_task(scope.call("refund", args, run=ACME, call_id="c-7"))
        request = await asked.requests.get()
        first.cancel()
        source.add(request)
        resumed, sink2, resumed_source, _, ran2 = build()
        resumed_source.by_id.update(source.by_id)
        assert (await resumed.call("refund", args, run=ACME, call_id="c-7")).ok
        assert ran2 == [20000]
        assert ran == []
        assert [e.type for e in of(sink2, "c-7")] == ["ApprovalRequested", "ToolUse"]
        assert isinstance(of(sink2, "c-7")[-1], ToolUseEvent)

    async def test_a_waiting_call_is_cancelled_with_its_run(self) -> None:
        """Cancelling the run ends the wait; the call leaves one outcome (interrupted)."""
        scope, sink, _, asked, ran = build()
        task = asyncio.create_task(
            scope.call("refund", {"order_id": "ACME-1", "amount_cents": 20000}, run=ACME, call_id="c-8")
        )
        await asked.requests.get()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        outcomes = [e for e in of(sink, "c-8") if isinstance(e, ToolDeniedEvent | ToolUseEvent)]
        assert [e.cause for e in outcomes] == ["interrupted"]
        assert ran == []


def test_the_approval_id_changes_with_each_binding() -> None:
    """call id, digest and policy version each change the approval id."""
    base = approval_id_for("c", "d", "p")
    assert len(base) == 32
    assert (
        len({base, approval_id_for("c2", "d", "p"), approval_id_for("c", "d2", "p"), approval_id_for("c", "d", None)})
        == 4
    )


async def test_a_plain_interceptors_request_has_no_policy_version() -> None:
    """An interceptor that is no policy file asks with no policy version and no rule."""
    sink = MemorySink()

    @tool
    def refund(args: Refund) -> str:
        return "refunded"

    ask = before_tool_call(name="ask")(lambda call: RequireApproval("why"))
    gate = Gate("shop", interceptors=[ask], sinks=[sink], approval_handler=lambda request: True)
    assert (
        await gate.agent("desk", tools=[refund]).call("refund", {"order_id": "A", "amount_cents": 1}, call_id="c")
    ).ok
    (requested,) = [e for e in sink.events if isinstance(e, ApprovalRequestedEvent)]
    assert (requested.policy_version, requested.rule) == (None, None)
    assert requested.approval_id == approval_id_for("c", requested.args_digest or "", None)
    (resolved,) = [e for e in sink.events if isinstance(e, ApprovalResolvedEvent)]
    assert (resolved.approved, resolved.approval_id) == (True, requested.approval_id)


class OneClaim:
    """An `ApprovalClaims` that grants each approval id to its first claimant, as the read API's store does."""

    def __init__(self) -> None:
        self.holders: dict[str, int] = {}
        self.asked = 0

    async def claim(self, request: ApprovalRequest, decision: ApprovalResolvedEvent) -> str | None:
        self.asked += 1
        holder = self.holders.setdefault(request.approval_id, self.asked)
        return None if holder == self.asked else f"the approval was already used (claimed by claimant {holder})"


def test_a_source_that_cannot_claim_needs_claims_or_says_once_per_process() -> None:
    """A decisions source that cannot claim (as KafkaDecisions cannot) and no `claims`: a
    configuration error naming both ways out, not an approval silently usable once per process."""
    with pytest.raises(ConfigurationError, match=r"claims=ApiDecisions\(url, token=...\).*claims=PER_PROCESS"):
        RemoteApprovals(ListedDecisions())
    assert RemoteApprovals(ListedDecisions(), claims=PER_PROCESS).claims is None


async def test_a_claim_refused_elsewhere_refuses_the_call() -> None:
    """Two gates (as two processes would) get the same approval; the claims arbiter grants it to
    one: the other refuses its call, and the model reads that the approval was used, to ask again."""
    claims, source, runs = OneClaim(), ListedDecisions(), []
    args = {"order_id": "ACME-1", "amount_cents": 20000}
    tasks, asks = [], []
    for _ in ("first", "second"):

        @tool
        def refund(args: Refund) -> str:
            runs.append(args.order_id)
            return "refunded"

        asked = Asked(RemoteApprovals(source, claims=claims))
        gate = Gate("shop", interceptors=[Policy.from_text(POLICY)], approval_handler=asked)
        tasks.append(
            asyncio.create_task(gate.agent("desk", tools=[refund]).call("refund", args, run=ACME, call_id="c-9"))
        )
        asks.append(asked)
    requests = [await asked.requests.get() for asked in asks]
    assert requests[0].approval_id == requests[1].approval_id
    source.add(requests[0])
    results = await asyncio.gather(*tasks)
    assert sorted(r.kind for r in results) == ["denied", "ok"]
    assert len(runs) == 1
    refused = next(r for r in results if r.kind == "denied")
    assert "was approved by rev-1, but the approval was already used (claimed by claimant 1); ask again" in (
        refused.message or ""
    )


async def test_an_approval_that_cannot_be_claimed_does_not_run() -> None:
    """The read API that grants claims is out of reach (nothing listens on the port): the approved
    call is asked again until its request expires, then refused; the tool never runs."""
    from events.decisions import ApiDecisions

    claims = ApiDecisions("http://127.0.0.1:9", interval_s=0.05, timeout_s=0.5)
    source, runs = ListedDecisions(), []

    @tool
    def refund(args: Refund) -> str:
        runs.append(args.order_id)
        return "refunded"

    asked = Asked(RemoteApprovals(source, claims=claims))
    gate = Gate("shop", interceptors=[Policy.from_text(POLICY)], approval_handler=asked, approval_timeout_s=1.0)
    args = {"order_id": "ACME-1", "amount_cents": 20000}
    task = asyncio.create_task(gate.agent("desk", tools=[refund]).call("refund", args, run=ACME, call_id="c-10"))
    source.add(await asked.requests.get())
    result = await task
    assert result.kind == "denied"
    assert runs == []


class TestABodyThatPauses:
    """A tool body that is itself an agent run whose own call paused (it raises
    `ToolApprovalRequiredError`) pauses a call made with `pause_for_approval=True`."""

    @staticmethod
    def scope(memory: MemorySink) -> Any:
        @tool(description="Runs a nested agent whose call waits for approval")
        async def delegate(task: str) -> str:
            raise ToolApprovalRequiredError("a nested call waits", tool="delegate", call_id="n1", interceptor="nested")

        return Gate("shop", sinks=[memory]).agent("boss", tools=[delegate])

    async def test_a_pausable_call_pauses_with_no_outcome(self) -> None:
        """The call records no outcome and raises, so that its caller resumes it later."""
        memory = MemorySink()
        with contextlib.suppress(ToolApprovalRequiredError):
            await self.scope(memory).call("delegate", {"task": "x"}, call_id="o1", pause_for_approval=True)
            raise AssertionError("the call did not pause")
        assert [e.type for e in of(memory, "o1")] == []

    async def test_otherwise_it_is_an_error(self) -> None:
        """Without `pause_for_approval` the body's error is the call's error result, recorded once."""
        memory = MemorySink()
        result = await self.scope(memory).call("delegate", {"task": "x"}, call_id="o1")
        assert (result.kind, "ToolApprovalRequiredError" in (result.message or "")) == ("error", True)
        assert [e.type for e in of(memory, "o1")] == ["ToolUse"]


class StoredRequests:
    """A `RecordedRequests` holding the requests a store holds (the read API's `approval_request`)."""

    def __init__(self, *held: ApprovalRequest, fails: bool = False) -> None:
        self.held = {r.approval_id: r for r in held}
        self.fails = fails

    async def recorded(self, request: ApprovalRequest) -> ApprovalRequest | None:
        if self.fails:
            raise OSError("the read API is not reachable")
        return self.held.get(request.approval_id)


class TestARequestAskedAgain:
    async def asked_once(self, call_id: str) -> tuple[ListedDecisions, ApprovalRequest]:
        """A call asked in a process that is gone: its request, and the decision source it saw."""
        scope, _, source, asked, _ = build()
        first = asyncio.create_task(
            scope.call("refund", {"order_id": "ACME-1", "amount_cents": 20000}, run=ACME, call_id=call_id)
        )
        request = await asked.requests.get()
        first.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await first
        return source, request

    def resumed(
        self, source: ListedDecisions, records: StoredRequests, timeout_s: float = 300.0
    ) -> tuple[Any, MemorySink, list[int]]:
        ran: list[int] = []

        @tool
        def refund(args: Refund) -> str:
            ran.append(args.amount_cents)
            return "refunded"

        sink = MemorySink()
        handler = RemoteApprovals(source, claims=PER_PROCESS, records=records)
        gate = Gate(
            "shop",
            interceptors=[Policy.from_text(POLICY)],
            sinks=[sink],
            approval_handler=handler,
            approval_timeout_s=timeout_s,
        )
        return gate.agent("desk", tools=[refund]), sink, ran

    async def test_a_recorded_request_is_not_recorded_again(self) -> None:
        """The store holds the request (decided meanwhile): the resumed call records only its outcome,
        and the decision is held to the first ask's expiry."""
        source, request = await self.asked_once("c-9")
        source.add(request)
        records = StoredRequests(request)
        scope, sink, ran = self.resumed(source, records)
        result = await scope.call("refund", {"order_id": "ACME-1", "amount_cents": 20000}, run=ACME, call_id="c-9")
        assert result.ok
        assert ran == [20000]
        assert [e.type for e in of(sink, "c-9")] == ["ToolUse"]

        # Decided after the first ask's expiry: refused, though this process would have waited longer.
        # The refusal is this gate's own answer, so it records the request it answers first (a
        # store takes an unsigned decision only from the producer that asked).
        source2, late = await self.asked_once("c-10")
        source2.add(late)
        expired = dataclasses.replace(late, expires_at=datetime.now(UTC) - timedelta(seconds=1))
        scope, sink, ran = self.resumed(source2, StoredRequests(expired))
        result = await scope.call("refund", {"order_id": "ACME-1", "amount_cents": 20000}, run=ACME, call_id="c-10")
        assert result.kind == "denied"
        assert ran == []
        assert [e.type for e in of(sink, "c-10")] == ["ApprovalRequested", "ApprovalResolved", "ToolDenied"]
        requested = of(sink, "c-10")[0]
        assert datetime.fromisoformat(requested.expires_at) == expired.expires_at

    async def test_when_nothing_can_tell_the_request_is_recorded(self) -> None:
        """A store that cannot be asked, or holds another binding under that id, leaves the request recorded."""
        source, request = await self.asked_once("c-11")
        source.add(request)
        for records in (
            StoredRequests(request, fails=True),
            StoredRequests(dataclasses.replace(request, args_digest="0" * 64)),
        ):
            scope, sink, _ = self.resumed(source, records)
            args = {"order_id": "ACME-1", "amount_cents": 20000}
            assert (await scope.call("refund", args, run=ACME, call_id="c-11")).ok
            assert [e.type for e in of(sink, "c-11")] == ["ApprovalRequested", "ToolUse"]

    async def test_a_recorded_expiry_never_lengthens_the_wait(self) -> None:
        """A store that says the request expires much later does not make this gate wait past its
        own `approval_timeout_s`: the request it answers is recorded with its own, earlier expiry."""
        source, request = await self.asked_once("c-12")
        far = dataclasses.replace(request, expires_at=datetime(2999, 1, 1, tzinfo=UTC))
        scope, sink, ran = self.resumed(source, StoredRequests(far), timeout_s=0.3)
        result = await scope.call("refund", {"order_id": "ACME-1", "amount_cents": 20000}, run=ACME, call_id="c-12")
        assert (result.kind, ran) == ("denied", [])
        requested, resolved, _ = of(sink, "c-12")
        assert datetime.fromisoformat(requested.expires_at) < datetime.now(UTC) + timedelta(seconds=1)
        assert resolved.error is not None
