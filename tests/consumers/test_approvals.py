"""Reviewers decide durable approval requests through the read API, over the embedded broker, a real
materializer and store: the waiting gate runs the call once; four eyes, tenant reviewers, conflicts,
the access log."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from callgate.broker import EmbeddedBroker
from callgate.tokens import add_token
from consumers import RawRecord
from consumers.approvals import ApprovalDesk, DecisionConflict, RequestNotFound, StoreClaims
from consumers.auth import Forbidden, Identity, TokenFile
from consumers.materializer import Materializer
from consumers.queries import run_query
from consumers.store import AuditStore
from events import MemorySink
from events.chain import Producer, new_event_id
from events.codec import encode_event, parse_event
from events.decisions import ApiDecisions, KafkaDecisions, decision_problem, sign_decision
from events.kafka import KafkaSink
from events.models import ZERO_HASH, ApprovalResolvedEvent
from events.signing import SigningKey
from interceptor_core import (
    Approval,
    ApprovalRequest,
    Gate,
    RequireApproval,
    RunContext,
    ToolApprovalRequiredError,
    before_tool_call,
    tool,
)
from interceptor_core.approvals import PER_PROCESS, RemoteApprovals

SUBJECTS = {
    "rev-1": ["reviewer"],
    "rev-acme": ["reviewer", "tenant:acme"],
    "rev-globex": ["reviewer", "tenant:globex"],
    "u-1": ["reviewer"],
    "auditor-1": ["auditor"],
    "admin-1": ["admin"],
}


class Refund(BaseModel):
    order_id: str
    amount_cents: int


class Desk:
    """A materializer serving the read API with a reviewers' desk, and a gate waiting on decisions."""

    def __init__(
        self,
        api: str,
        tokens: dict[str, str],
        scope: Any,
        ran: list[int],
        sink: KafkaSink,
        remote: RemoteApprovals,
        topics: tuple[str, str, str],
    ) -> None:
        self.api = api
        self.tokens = tokens
        self.scope = scope
        self.ran = ran
        self.sink = sink
        self.remote = remote
        self.bootstrap, self.topic, self.decisions_topic = topics

    async def get(self, query: str, subject: str = "admin-1", **params: Any) -> list[dict[str, Any]]:
        async with httpx.AsyncClient() as client:
            response = await client.get(
                f"{self.api}/v1/queries/{query}", params=params, headers=self.auth(subject), timeout=10
            )
        assert response.status_code == 200, response.text
        return list(response.json()["rows"])

    async def decide(self, subject: str, approval_id: str, decision: str, note: str | None = None) -> httpx.Response:
        async with httpx.AsyncClient() as client:
            return await client.post(
                f"{self.api}/v1/approvals/{approval_id}",
                json={"decision": decision, "note": note},
                headers=self.auth(subject),
                timeout=15,
            )

    def auth(self, subject: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[subject]}"}

    async def pending(self, call_id: str, subject: str = "admin-1") -> dict[str, Any]:
        """The pending request of `call_id`, once the store has it."""
        rows: list[dict[str, Any]] = []

        async def found() -> bool:
            nonlocal rows
            rows = [r for r in await self.get("pending_approvals", subject) if r["call_id"] == call_id]
            return bool(rows)

        await until(found, 20, f"a pending request of {call_id}")
        return rows[0]

    async def events_of(self, call_id: str, count: int) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []

        async def stored() -> bool:
            nonlocal rows
            rows = [r for r in await self.get("call_detail", call_id=call_id) if r["relation"] == "call"]
            return len(rows) >= count

        await until(stored, 20, f"{count} events of {call_id}")
        return rows


async def until(condition: Callable[[], Awaitable[bool]], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        await asyncio.sleep(0.05)  # sleep-ok: polling with a deadline


@asynccontextmanager
async def desk(
    broker: EmbeddedBroker,
    tmp_path: Path,
    timeout_s: float = 60.0,
    *,
    poll_api: bool = False,
    decision_key: SigningKey | None = None,
    store_checks: bool = True,
) -> AsyncIterator[Desk]:
    """The stack; the gate learns decisions from the decisions topic, or (`poll_api`) by asking the
    read API. With `decision_key` the desk signs its decisions, the gate trusts only its key, and
    (unless not `store_checks`) the store lets no other decision decide a request."""
    topic = f"events-{uuid.uuid4().hex[:8]}"
    decisions_topic = f"decisions-{uuid.uuid4().hex[:8]}"
    token_file = tmp_path / "tokens.yaml"
    tokens = {subject: add_token(token_file, subject, roles) for subject, roles in SUBJECTS.items()}
    materializer = Materializer(
        broker.bootstrap,
        topic,
        str(tmp_path / "audit.duckdb"),
        api=("127.0.0.1", 0),
        api_auth=TokenFile(token_file),
        decisions_topic=decisions_topic,
        decision_key=decision_key,
        decision_keys=None if store_checks else {},
        poll_ms=50,
    )
    task = asyncio.create_task(materializer.run())
    await until(lambda: asyncio.sleep(0, materializer.api is not None), 20, "the read API")
    decisions: KafkaDecisions | ApiDecisions = (
        ApiDecisions(materializer.api.url, token=tokens["auditor-1"], interval_s=0.1)
        if poll_api
        else KafkaDecisions(broker.bootstrap, decisions_topic)
    )
    await decisions.start()
    ran: list[int] = []

    @tool
    def refund(args: Refund) -> str:
        ran.append(args.amount_cents)
        return "refunded"

    ask = before_tool_call(name="big-refunds")(lambda call: RequireApproval("refunds over 100.00 need a reviewer"))
    sink = KafkaSink(broker.bootstrap, topic, tmp_path / "spool", linger_ms=1)
    trusted = None if decision_key is None else {decision_key.key_id: decision_key.public()}
    remote = RemoteApprovals(decisions, trusted_keys=trusted, claims=None if poll_api else PER_PROCESS)
    gate = Gate("shop", interceptors=[ask], sinks=[sink], approval_handler=remote, approval_timeout_s=timeout_s)
    try:
        scope = gate.agent("desk", tools=[refund])
        yield Desk(materializer.api.url, tokens, scope, ran, sink, remote, (broker.bootstrap, topic, decisions_topic))
    finally:
        await sink.close(timeout=5)
        await decisions.close()
        materializer.stop()
        try:
            await asyncio.wait_for(task, 30)
        finally:
            materializer.close()


def call(d: Desk, call_id: str, *, tenant: str = "acme", principal: str = "u-1", amount: int = 20000) -> Any:
    run = RunContext(tenant=tenant, principal=principal, run_id=f"run-{call_id}")
    return asyncio.create_task(
        d.scope.call("refund", {"order_id": "ACME-1", "amount_cents": amount}, run=run, call_id=call_id)
    )


class TestDecidingThroughTheApi:
    async def test_an_approval_runs_the_waiting_call_once(self, kafka_broker: EmbeddedBroker, tmp_path: Path) -> None:
        """Pending in the store, approved by rev-1 over the API: the call runs once; events read
        ApprovalRequested, ApprovalResolved by rev-1, ToolUse; the request is no longer pending."""
        async with desk(kafka_broker, tmp_path) as d:
            waiting = call(d, "c-approve")
            request = await d.pending("c-approve")
            assert (request["tool"], request["tenant"], request["principal"]) == ("refund", "acme", "u-1")
            assert request["args"] == {"order_id": "ACME-1", "amount_cents": 20000}
            response = await d.decide("rev-1", request["approval_id"], "approve", "checked the order")
            assert response.status_code == 200, response.text
            assert response.json()["by"] == "rev-1"
            result = await asyncio.wait_for(waiting, 20)
            assert result.ok
            assert d.ran == [20000]
            rows = await d.events_of("c-approve", 3)
            assert [r["type"] for r in rows] == ["ApprovalRequested", "ApprovalResolved", "ToolUse"]
            detail = await d.get("approval_request", approval_id=request["approval_id"])
            assert [(r["status"], r["decided_by"], r["note"]) for r in detail] == [
                ("approved", "rev-1", "checked the order")
            ]
            again = await d.decide("rev-1", request["approval_id"], "deny")
            assert again.status_code == 409
            log = await d.get("access_log")
            decisions = sorted((r for r in log if str(r["query"]).startswith("approval:")), key=lambda r: r["time"])
            assert [(r["subject"], r["query"], r["status"]) for r in decisions] == [
                ("rev-1", "approval:approve", 200),
                ("rev-1", "approval:deny", 409),
            ]

    async def test_a_gate_asking_the_read_api_gets_the_decision(
        self, kafka_broker: EmbeddedBroker, tmp_path: Path
    ) -> None:
        """Without the decisions topic: the gate polls the read API and runs the approved call once,
        claiming it first; `callgate approvals show` says who claimed it (none before). A call
        asked again after its request was stored records no second request."""
        async with desk(kafka_broker, tmp_path, poll_api=True) as d:
            waiting = call(d, "c-poll")
            request = await d.pending("c-poll")
            assert (request["claimed_at"], request["claimant"], request["claimed_by"]) == (None, None, None)
            assert (await d.decide("rev-1", request["approval_id"], "approve")).status_code == 200
            assert (await asyncio.wait_for(waiting, 20)).ok
            assert d.ran == [20000]
            shown = await asyncio.to_thread(
                callgate, "show", request["approval_id"], "--api", d.api, token=d.tokens["rev-1"]
            )
            assert shown.returncode == 0, shown.stderr
            detail = json.loads(shown.stdout)
            assert (detail["status"], detail["claimed_by"]) == ("approved", "auditor-1")  # the gate's token
            assert detail["claimant"]
            assert detail["claimed_at"]

            # A call paused by its framework (the request stored, no outcome), approved, then made
            # again by this gate: the read API says the request is stored, so none is recorded again.
            ask = before_tool_call(name="big-refunds")(
                lambda call: RequireApproval("refunds over 100.00 need a reviewer")
            )
            pausing = Gate("shop", interceptors=[ask], sinks=[d.sink]).agent("desk", tools=[d.scope.tools["refund"]])
            run = RunContext(tenant="acme", principal="u-1", run_id="run-c-again")
            args = {"order_id": "ACME-1", "amount_cents": 20000}
            with pytest.raises(ToolApprovalRequiredError):
                await pausing.call("refund", args, run=run, call_id="c-again", pause_for_approval=True)
            paused = await d.pending("c-again")
            assert (await d.decide("rev-1", paused["approval_id"], "approve")).status_code == 200
            assert (await asyncio.wait_for(call(d, "c-again"), 20)).ok
            assert d.ran == [20000, 20000]
            rows = await d.events_of("c-again", 3)
            assert [r["type"] for r in rows] == ["ApprovalRequested", "ApprovalResolved", "ToolUse"]

    async def test_a_denial_refuses_the_call(self, kafka_broker: EmbeddedBroker, tmp_path: Path) -> None:
        """Denied by rev-1: the call does not run, and the model reads the reviewer and the note."""
        async with desk(kafka_broker, tmp_path) as d:
            waiting = call(d, "c-deny")
            request = await d.pending("c-deny")
            response = await d.decide("rev-1", request["approval_id"], "deny", "not this customer")
            assert response.status_code == 200
            result = await asyncio.wait_for(waiting, 20)
            assert result.kind == "denied"
            assert "by rev-1: not this customer" in (result.message or "")
            assert d.ran == []
            rows = await d.events_of("c-deny", 3)
            assert [r["type"] for r in rows] == ["ApprovalRequested", "ApprovalResolved", "ToolDenied"]

    async def test_who_may_decide(self, kafka_broker: EmbeddedBroker, tmp_path: Path) -> None:
        """One's own request, another tenant's, without the reviewer role: 403; a tenant reviewer sees
        only its tenant's requests; its own tenant's it decides."""
        async with desk(kafka_broker, tmp_path) as d:
            waiting = call(d, "c-who")
            request = await d.pending("c-who")
            approval_id = request["approval_id"]
            own = await d.decide("u-1", approval_id, "approve")
            assert own.status_code == 403
            assert "own request" in own.json()["error"]
            other_tenant = await d.decide("rev-globex", approval_id, "approve")
            assert other_tenant.status_code == 403
            assert "globex" in other_tenant.json()["error"]
            not_reviewer = await d.decide("auditor-1", approval_id, "approve")
            assert not_reviewer.status_code == 403
            assert [r for r in await d.get("pending_approvals", "rev-globex") if r["call_id"] == "c-who"] == []
            assert (await d.pending("c-who", "rev-acme"))["approval_id"] == approval_id
            assert not waiting.done()
            response = await d.decide("rev-acme", approval_id, "approve")
            assert response.status_code == 200
            assert (await asyncio.wait_for(waiting, 20)).ok
            assert (await d.decide("rev-1", "0" * 32, "approve")).status_code == 404
            bad = await d.decide("rev-1", approval_id, "maybe")
            assert bad.status_code == 400

    async def test_an_expired_request_is_refused_and_cannot_be_decided(
        self, kafka_broker: EmbeddedBroker, tmp_path: Path
    ) -> None:
        """No decision before the expiry: the call is refused, the request reads expired, a late decision is 409."""
        async with desk(kafka_broker, tmp_path, timeout_s=1.5) as d:
            waiting = call(d, "c-expire")
            request = await d.pending("c-expire")
            result = await asyncio.wait_for(waiting, 20)
            assert result.kind == "denied"
            assert d.ran == []
            rows = await d.events_of("c-expire", 3)
            assert [r["type"] for r in rows] == ["ApprovalRequested", "ApprovalResolved", "ToolDenied"]
            late = await d.decide("rev-1", request["approval_id"], "approve")
            assert late.status_code == 409
            detail = await d.get("approval_request", approval_id=request["approval_id"])
            assert [r["status"] for r in detail] == ["expired"]


def callgate(*args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", **({"CALLGATE_TOKEN": token} if token else {})}
    return subprocess.run(
        [sys.executable, "-c", "from callgate.cli import main; main()", "approvals", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


class TestTheCommandLine:
    async def test_list_show_and_approve_from_the_command_line(
        self, kafka_broker: EmbeddedBroker, tmp_path: Path
    ) -> None:
        """`callgate approvals list` shows the pending request, `show` its args, `approve` (as rev-1's
        token) lets the waiting call run; the self-approval is refused with exit 1."""
        async with desk(kafka_broker, tmp_path) as d:
            waiting = call(d, "c-cli")
            request = await d.pending("c-cli")
            approval_id = request["approval_id"]
            listed = await asyncio.to_thread(callgate, "list", "--api", d.api, "--json", token=d.tokens["rev-1"])
            assert listed.returncode == 0, listed.stderr
            assert approval_id in [row["approval_id"] for row in json.loads(listed.stdout)]
            shown = await asyncio.to_thread(callgate, "show", approval_id, "--api", d.api, token=d.tokens["rev-1"])
            assert shown.returncode == 0, shown.stderr
            assert json.loads(shown.stdout)["args"] == {"order_id": "ACME-1", "amount_cents": 20000}
            own = await asyncio.to_thread(callgate, "approve", approval_id, "--api", d.api, token=d.tokens["u-1"])
            assert own.returncode == 1
            assert "own request" in own.stderr
            approved = await asyncio.to_thread(
                callgate, "approve", approval_id, "--api", d.api, "--note", "fine", token=d.tokens["rev-1"]
            )
            assert approved.returncode == 0, approved.stderr
            assert approved.stdout.strip() == f"{approval_id} approved by rev-1"
            assert (await asyncio.wait_for(waiting, 20)).ok
            assert d.ran == [20000]
            no_api = await asyncio.to_thread(callgate, "deny", approval_id)
            assert no_api.returncode == 2
            assert "--api" in no_api.stderr
            await d.events_of("c-cli", 3)
        # The store file, once nobody writes it: the request reads approved, by rev-1.
        shown = await asyncio.to_thread(callgate, "show", approval_id, "--db", str(tmp_path / "audit.duckdb"))
        assert shown.returncode == 0, shown.stderr
        assert (json.loads(shown.stdout)["status"], json.loads(shown.stdout)["decided_by"]) == ("approved", "rev-1")
        missing = await asyncio.to_thread(callgate, "show", "0" * 32, "--db", str(tmp_path / "audit.duckdb"))
        assert missing.returncode == 1


class FakePublisher:
    def __init__(self) -> None:
        self.sent: list[ApprovalResolvedEvent] = []

    def publish(self, event: ApprovalResolvedEvent) -> None:
        self.sent.append(event)


def pending_request(**fields: Any) -> dict[str, Any]:
    return {
        "approval_id": "a" * 32,
        "status": "pending",
        "requested_at": "2026-01-01T00:00:00+00:00",
        "expires_at": "2999-01-01T00:00:00+00:00",
        "gate": "shop",
        "tool": "refund",
        "call_id": "c-1",
        "tenant": "acme",
        "principal": "u-1",
        "args_digest": "d" * 64,
        "policy_version": None,
        **fields,
    }


class TestTheDeskRules:
    def test_a_decision_names_the_reviewer_and_repeats_the_binding(self) -> None:
        """The event: by the reviewer's subject, the request's approval id, digest and call."""
        publisher = FakePublisher()
        desk = ApprovalDesk(lambda _: pending_request(), publisher)
        event = desk.decide(Identity("rev-1", frozenset({"reviewer"})), "a" * 32, approved=True, note="ok")
        assert publisher.sent == [event]
        assert (event.by, event.approval_id, event.args_digest, event.call_id, event.approved) == (
            "rev-1",
            "a" * 32,
            "d" * 64,
            "c-1",
            True,
        )

    def test_a_request_is_decided_once_even_before_the_store_knows(self) -> None:
        """A second decision on the same desk is a conflict while the store still reads pending."""
        desk = ApprovalDesk(lambda _: pending_request(), FakePublisher())
        desk.decide(Identity("rev-1", frozenset({"reviewer"})), "a" * 32, approved=True)
        with pytest.raises(DecisionConflict):
            desk.decide(Identity("rev-2", frozenset({"reviewer"})), "a" * 32, approved=False)

    def test_a_request_without_principal_is_not_anyones_own(self) -> None:
        """Four eyes compares subjects with the request's principal; an expired or missing request is refused."""
        reviewer = Identity("rev-1", frozenset({"reviewer"}))
        ApprovalDesk(lambda _: pending_request(principal=None), FakePublisher()).decide(reviewer, "x", approved=True)
        with pytest.raises(DecisionConflict, match="expired"):
            ApprovalDesk(lambda _: pending_request(expires_at="2000-01-01T00:00:00+00:00"), FakePublisher()).decide(
                reviewer, "x", approved=True
            )
        with pytest.raises(RequestNotFound):
            ApprovalDesk(lambda _: None, FakePublisher()).decide(reviewer, "x", approved=True)
        with pytest.raises(Forbidden, match="reviewer role"):
            ApprovalDesk(lambda _: pending_request(), FakePublisher()).decide(
                Identity("admin-1", frozenset({"admin"})), "x", approved=True
            )


# -- signed decisions and claims ------------------------------------------------------------------


def decision_for(
    request: dict[str, Any], *, key: SigningKey | None = None, by: str = "mallory", approved: bool = True
) -> ApprovalResolvedEvent:
    """A decision of `request` (approving unless told) as anyone could write it: unsigned, or signed
    by `key`."""
    producer = Producer()
    fields: dict[str, Any] = {
        "event_id": new_event_id(),
        "time": datetime.now(UTC),
        "gate": "callgate-desk",
        "tool": request["tool"],
        "call_id": request["call_id"],
        "run_id": request["run_id"],
        "tenant": request["tenant"],
        "principal": request["principal"],
        "approved": approved,
        "by": by,
        "waited_ms": 1.0,
        "approval_id": request["approval_id"],
        "args_digest": request["args_digest"],
        "policy_version": request["policy_version"],
    }
    if key is not None:
        unsigned = ApprovalResolvedEvent(
            **fields, producer_id=producer.producer_id, seq=1, prev_hash=ZERO_HASH, hash=ZERO_HASH
        )
        fields["signature"] = sign_decision(unsigned, key)
    return producer.seal(ApprovalResolvedEvent, fields)


async def write_straight(bootstrap: str, topic: str, *events: ApprovalResolvedEvent, by_producer: bool = False) -> None:
    """Records written to `topic` by someone who is not the desk (no callgate code in the way),
    keyed by approval id as on the decisions topic, or (`by_producer`) as on the events topic."""
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for event in events:
            key = event.producer_id if by_producer else event.approval_id or ""
            await producer.send_and_wait(topic, encode_event(event), key=key.encode())
    finally:
        await producer.stop()


class TestSignedDecisions:
    async def test_forged_decisions_on_the_decisions_topic_are_refused(
        self, kafka_broker: EmbeddedBroker, tmp_path: Path, caplog: pytest.LogCaptureFixture
    ) -> None:
        """Approvals written straight to the decisions topic (unsigned, signed by another key under
        the desk's name, a desk signature of another decision pasted on) are ignored, logged and
        counted; the call waits, and the desk's signed approval then runs it once."""
        key = SigningKey.generate("callgate-desk")
        async with desk(kafka_broker, tmp_path, decision_key=key) as d:
            waiting = call(d, "c-forged")
            request = await d.pending("c-forged")
            other_call = {**request, "approval_id": "b" * 32, "call_id": "c-other"}
            pasted = decision_for(request).model_copy(update={"signature": decision_for(other_call, key=key).signature})
            forgeries = [decision_for(request), decision_for(request, key=SigningKey.generate("callgate-desk")), pasted]
            await write_straight(kafka_broker.bootstrap, d.decisions_topic, *forgeries)
            await until(lambda: asyncio.sleep(0, d.remote.forged == 3), 20, "three forged decisions refused")
            assert (d.remote.ignored, waiting.done(), d.ran) == (3, False, [])
            assert caplog.text.count("ignored: not a trusted desk's decision") == 3
            response = await d.decide("rev-1", request["approval_id"], "approve")
            assert response.status_code == 200, response.text
            assert (await asyncio.wait_for(waiting, 20)).ok
            assert d.ran == [20000]
            assert d.remote.forged == 3
            await d.events_of("c-forged", 3)  # the desk's decision is stored, beside the request and the use
            (detail,) = await d.get("approval_request", approval_id=request["approval_id"])
            stored = detail["decision"]
            genuine = parse_event(stored if isinstance(stored, str) else json.dumps(stored))
            assert isinstance(genuine, ApprovalResolvedEvent)
            assert decision_problem(genuine, {key.key_id: key.public()}) is None

    async def test_a_forged_decision_in_the_store_approves_nothing(
        self, kafka_broker: EmbeddedBroker, tmp_path: Path
    ) -> None:
        """In a store that does not check decisions, an approval written straight to the events
        topic decides the request there; the gate polling the read API refuses it (not the desk's
        signature), the claim route refuses it too, and the call never runs (it expires: writing
        to the topic can stop an approval, not make one)."""
        key = SigningKey.generate("callgate-desk")
        async with desk(kafka_broker, tmp_path, timeout_s=4, poll_api=True, decision_key=key, store_checks=False) as d:
            waiting = call(d, "c-stored-forgery")
            request = await d.pending("c-stored-forgery")
            await write_straight(kafka_broker.bootstrap, d.topic, decision_for(request), by_producer=True)
            await until(lambda: asyncio.sleep(0, d.remote.forged == 1), 20, "the stored forgery refused")
            async with httpx.AsyncClient() as client:
                claim = await client.post(
                    f"{d.api}/v1/approvals/{request['approval_id']}/claim",
                    json={"call_id": "c-stored-forgery", "args_digest": request["args_digest"]},
                    headers=d.auth("auditor-1"),
                    timeout=10,
                )
            assert claim.status_code == 409
            assert "not approved" in claim.json()["error"]
            result = await asyncio.wait_for(waiting, 20)
            assert result.kind == "denied"
            assert d.ran == []

    async def test_the_store_keeps_forged_decisions_as_evidence_deciding_nothing(
        self, kafka_broker: EmbeddedBroker, tmp_path: Path
    ) -> None:
        """A materializer with the desk's key stores decisions written straight to the events topic
        (unsigned, signed by another key) flagged: `unverified_decisions` lists them with why, the
        request stays pending (listed, status pending, nobody's decision), a reviewer still decides
        it, and the call runs once; the gate's own unsigned answer, in the chain that asked, is not
        listed."""
        key = SigningKey.generate("callgate-desk")
        async with desk(kafka_broker, tmp_path, decision_key=key) as d:
            waiting = call(d, "c-evidence")
            request = await d.pending("c-evidence")
            forgeries = [decision_for(request), decision_for(request, key=SigningKey.generate("callgate-desk"))]
            await write_straight(kafka_broker.bootstrap, d.topic, *forgeries, by_producer=True)
            rows: list[dict[str, Any]] = []

            async def listed() -> bool:
                nonlocal rows
                rows = await d.get("unverified_decisions", "auditor-1")
                return len(rows) == 2

            await until(listed, 20, "two unverified decisions")
            assert {r["event_id"] for r in rows} == {f.event_id for f in forgeries}
            assert {r["problem"] for r in rows} == {
                "unverified decision: it is not signed",
                "unverified decision: its signature is not a trusted key's (forged, altered, or by a key not trusted)",
            }
            assert all(
                (r["approval_id"], r["approved"], r["by"]) == (request["approval_id"], True, "mallory") for r in rows
            )
            assert [r["call_id"] for r in await d.get("pending_approvals", "rev-1")] == ["c-evidence"]
            (detail,) = await d.get("approval_request", approval_id=request["approval_id"])
            assert (detail["status"], detail["decided_by"], detail["decision"]) == ("pending", None, None)
            assert (waiting.done(), d.ran) == (False, [])
            response = await d.decide("rev-1", request["approval_id"], "approve", "checked")
            assert response.status_code == 200, response.text
            assert (await asyncio.wait_for(waiting, 20)).ok
            assert d.ran == [20000]
            await d.events_of("c-evidence", 5)  # the request, the two forgeries, the desk's decision, the use
            (detail,) = await d.get("approval_request", approval_id=request["approval_id"])
            assert (detail["status"], detail["decided_by"], detail["note"]) == ("approved", "rev-1", "checked")
            assert len(await d.get("unverified_decisions", "auditor-1")) == 2


def racer(d: Desk, tmp_path: Path, name: str, mode: str, keys: Path) -> subprocess.Popen[str]:
    script = Path(__file__).with_name("approval_racer.py")
    return subprocess.Popen(
        [
            sys.executable,
            str(script),
            d.bootstrap,
            d.topic,
            d.decisions_topic,
            d.api,
            d.tokens["auditor-1"],
            str(keys),
            str(tmp_path / f"spool-{name}"),
            str(tmp_path / "ran.txt"),
            "c-race",
            mode,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


class TestClaims:
    async def test_two_processes_with_the_same_approved_call_run_it_once(
        self, kafka_broker: EmbeddedBroker, tmp_path: Path
    ) -> None:
        """Two agent processes ask for the same call (same call id, arguments, policy: one approval
        id); one signed approval reaches both, one learning it from the read API, the other from
        the decisions topic; both claim it from the read API, the store grants one claim: exactly
        one process runs the call, the other is refused with a message saying the approval was
        used, and a third claim is refused naming the holder. (About 10 s on a loaded machine: two
        agent processes start.)"""
        key = SigningKey.generate("callgate-desk")
        _, public = key.write(tmp_path / "keys")
        async with desk(kafka_broker, tmp_path, decision_key=key) as d:
            agents = [racer(d, tmp_path, mode, mode, public) for mode in ("api", "kafka")]
            try:
                for agent in agents:
                    line = await asyncio.to_thread(agent.stdout.readline)  # type: ignore[union-attr]
                    assert json.loads(line)["waiting"], line
                request = await d.pending("c-race")
                assert (await d.decide("rev-1", request["approval_id"], "approve")).status_code == 200
                outs = [json.loads((await asyncio.to_thread(a.communicate, timeout=60))[0]) for a in agents]
            finally:
                for agent in agents:
                    agent.kill() if agent.poll() is None else None
            assert sorted(o["kind"] for o in outs) == ["denied", "ok"]
            refused = next(o for o in outs if o["kind"] == "denied")
            assert "was approved by rev-1, but the approval of request" in refused["message"]
            assert "already used" in refused["message"]
            assert (tmp_path / "ran.txt").read_text().splitlines() == ["c-race 20000"]
            async with httpx.AsyncClient() as client:
                third = await client.post(
                    f"{d.api}/v1/approvals/{request['approval_id']}/claim",
                    json={"call_id": "c-race", "args_digest": request["args_digest"], "claimant": "late"},
                    headers=d.auth("auditor-1"),
                    timeout=10,
                )
            assert third.status_code == 409
            assert "already used (claimed by" in third.json()["error"]
            log = await d.get("access_log")
            claims = [(r["status"]) for r in log if r["query"] == "approval:claim"]
            assert sorted(claims) == [200, 409, 409]

    def test_the_store_grants_one_claim_among_racing_threads(self, tmp_path: Path) -> None:
        """Sixteen threads claim one approved request at once on a real store: one wins; the others
        are told who holds it; a claim for other arguments or of a pending request is refused."""
        store = AuditStore(str(tmp_path / "audit.duckdb"))
        try:
            key = SigningKey.generate("callgate-desk")
            request = pending_request(run_id="r-1")
            approved = {**request, "status": "approved"}
            decision = decision_for(request, key=key, by="rev-1")
            approved["decision"] = decision.model_dump_json()
            claims_desk = ApprovalDesk(lambda _: approved, FakePublisher(), signing_key=key, claims=StoreClaims(store))
            gate = Identity("gate-1", frozenset({"tenant:acme"}))
            barrier = threading.Barrier(16)
            results: list[str] = []

            def claim(n: int) -> None:
                barrier.wait()
                try:
                    claims_desk.claim(gate, "a" * 32, call_id="c-1", args_digest="d" * 64, claimant=f"p{n}")
                    results.append("won")
                except DecisionConflict as exc:
                    results.append(str(exc))

            threads = [threading.Thread(target=claim, args=(n,)) for n in range(16)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(30)
            assert results.count("won") == 1
            assert all("already used (claimed by p" in r for r in results if r != "won")
            with pytest.raises(DecisionConflict, match="other arguments"):
                claims_desk.claim(gate, "a" * 32, call_id="c-1", args_digest="e" * 64)
            with pytest.raises(RequestNotFound):
                claims_desk.claim(
                    Identity("gate-2", frozenset({"tenant:globex"})), "a" * 32, call_id="c-1", args_digest="d" * 64
                )
            pending = ApprovalDesk(lambda _: request, FakePublisher(), signing_key=key, claims=StoreClaims(store))
            with pytest.raises(DecisionConflict, match="pending, not approved"):
                pending.claim(gate, "a" * 32, call_id="c-1", args_digest="d" * 64)
            (count,) = store.cursor().execute("SELECT count(*) FROM approval_claims").fetchone() or (0,)
            assert count == 1
        finally:
            store.close()


def test_a_desk_with_a_key_signs_what_it_decides() -> None:
    """The desk's decision verifies with its key, and with no other; any change to it breaks it."""
    key = SigningKey.generate("callgate-desk")
    event = ApprovalDesk(lambda _: pending_request(), FakePublisher(), signing_key=key).decide(
        Identity("rev-1", frozenset({"reviewer"})), "a" * 32, approved=True, note="ok"
    )
    trusted = {key.key_id: key.public()}
    assert decision_problem(event, trusted) is None
    assert decision_problem(parse_event(encode_event(event)), trusted) is None  # type: ignore[arg-type]
    other = SigningKey.generate("callgate-desk")
    assert decision_problem(event, {other.key_id: other.public()}) is not None
    for change in ({"note": "ok!"}, {"by": "rev-2"}, {"args_digest": "e" * 64}, {"approved": False}):
        assert "not a trusted key" in (decision_problem(event.model_copy(update=change), trusted) or "")
    unsigned = ApprovalDesk(lambda _: pending_request(), FakePublisher()).decide(
        Identity("rev-1", frozenset({"reviewer"})), "a" * 32, approved=True
    )
    assert decision_problem(unsigned, trusted) == "it is not signed"


def test_two_lake_writers_grant_one_claim(new_lake: Any) -> None:
    """Two stores writing one lake (two materializers' read APIs) take claims of one approval at
    once from three threads each: the lake's commit check makes exactly one of them win. (Opening
    two lake stores takes most of its 5 to 15 s.)"""
    lake = new_lake()
    stores = [AuditStore(lake), AuditStore(lake)]
    try:
        key = SigningKey.generate("callgate-desk")
        request = pending_request(run_id="r-1")
        approved = {**request, "status": "approved", "decision": decision_for(request, key=key).model_dump_json()}
        desks = [
            ApprovalDesk(lambda _: approved, FakePublisher(), signing_key=key, claims=StoreClaims(s)) for s in stores
        ]
        gate = Identity("gate-1", frozenset({"tenant:acme"}))
        barrier = threading.Barrier(6)
        won: list[str] = []
        lost: list[str] = []

        def claim(n: int) -> None:
            barrier.wait()
            try:
                desks[n % 2].claim(gate, "a" * 32, call_id="c-1", args_digest="d" * 64, claimant=f"p{n}")
                won.append(f"p{n}")
            except DecisionConflict as exc:
                lost.append(str(exc))

        threads = [threading.Thread(target=claim, args=(n,)) for n in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert len(won) == 1, (won, lost)
        assert len(lost) == 5
        assert all(f"already used (claimed by {won[0]})" in reason for reason in lost)
    finally:
        for store in stores:
            store.close()


def test_the_calls_view_counts_no_unverified_decision_as_approved(tmp_path: Path) -> None:
    """A call that ran on a decision no desk key signed (written by someone who is not the gate
    that asked: the gate here trusted it) is not approved in `calls`, which names the unverified
    decision and why; a call approved by the desk's signed decision, or by the asking gate's own
    handler (its own, unsigned `ApprovalResolved`), is approved. Refusals alike: the Overview's
    `approvals_refused` counts the signed one and the gate's own, not the forged one."""
    key = SigningKey.generate("callgate-desk")
    taken: list[ApprovalResolvedEvent] = []

    async def handler(request: ApprovalRequest) -> Approval | bool:
        approved = not request.call_id.endswith("-deny")
        if request.call_id.startswith("c-own"):
            return approved
        row = {k: getattr(request, k) for k in ("approval_id", "call_id", "args_digest", "policy_version")}
        row.update(tool="refund", run_id=None, tenant="acme", principal="u-1")
        signed = request.call_id.startswith("c-signed")
        by = "rev-1" if signed else "mallory"
        decision = decision_for(row, key=key if signed else None, by=by, approved=approved)
        taken.append(decision)
        return Approval(approved, by=decision.by, event_id=decision.event_id)  # recorded where it was taken

    @tool
    def refund(args: Refund) -> str:
        return "refunded"

    sink = MemorySink()
    ask = before_tool_call(name="ask")(lambda call: RequireApproval("refunds need a reviewer"))
    scope = Gate("shop", interceptors=[ask], sinks=[sink], approval_handler=handler).agent("desk", tools=[refund])

    async def run() -> None:
        for call_id in ("c-signed", "c-forged", "c-own", "c-signed-deny", "c-forged-deny", "c-own-deny"):
            args = {"order_id": "A-1", "amount_cents": 20000}
            result = await scope.call("refund", args, run=RunContext(tenant="acme"), call_id=call_id)
            assert result.ok is not call_id.endswith("-deny")

    asyncio.run(run())
    events = [*sink.events, *taken]
    batch = [
        RawRecord("t", 0, offset, e.producer_id.encode(), encode_event(e), 1_700_000_000_000)
        for offset, e in enumerate(events)
    ]
    with AuditStore(tmp_path / "audit.duckdb", decision_keys={key.key_id: key.public()}) as store:
        store.ingest(batch, {("t", 0): len(batch)})
        columns = "call_id, outcome_type, approval_asked, approved, unverified_decision"
        rows = store.cursor().execute(f"SELECT {columns} FROM calls ORDER BY call_id").fetchall()  # noqa: S608
        overview = {r["metric"]: r["value"] for r in run_query(store.cursor(), "overview_counts").rows}
    assert rows == [
        ("c-forged", "ToolUse", True, None, "approved (unverified decision: it is not signed)"),
        ("c-forged-deny", "ToolDenied", True, None, "refused (unverified decision: it is not signed)"),
        ("c-own", "ToolUse", True, True, None),
        ("c-own-deny", "ToolDenied", True, False, None),
        ("c-signed", "ToolUse", True, True, None),
        ("c-signed-deny", "ToolDenied", True, False, None),
    ]
    assert (overview["approvals_asked"], overview["approvals_refused"]) == (6, 2)
