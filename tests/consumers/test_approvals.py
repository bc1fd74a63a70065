"""Reviewers decide durable approval requests through the read API, over the embedded broker, a real
materializer and store: the waiting gate runs the call once; four eyes, tenant reviewers, conflicts,
the access log."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from callgate.broker import EmbeddedBroker
from callgate.tokens import add_token
from consumers.approvals import ApprovalDesk, DecisionConflict, RequestNotFound
from consumers.auth import Forbidden, Identity, TokenFile
from consumers.materializer import Materializer
from events.decisions import ApiDecisions, KafkaDecisions
from events.kafka import KafkaSink
from events.models import ApprovalResolvedEvent
from interceptor_core import Gate, RequireApproval, RunContext, before_tool_call, tool
from interceptor_core.approvals import RemoteApprovals

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

    def __init__(self, api: str, tokens: dict[str, str], scope: Any, ran: list[int], sink: KafkaSink) -> None:
        self.api = api
        self.tokens = tokens
        self.scope = scope
        self.ran = ran
        self.sink = sink

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
    broker: EmbeddedBroker, tmp_path: Path, timeout_s: float = 60.0, *, poll_api: bool = False
) -> AsyncIterator[Desk]:
    """The stack; the gate learns decisions from the decisions topic, or (`poll_api`) by asking the read API."""
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
    gate = Gate(
        "shop",
        interceptors=[ask],
        sinks=[sink],
        approval_handler=RemoteApprovals(decisions),
        approval_timeout_s=timeout_s,
    )
    try:
        yield Desk(materializer.api.url, tokens, gate.agent("desk", tools=[refund]), ran, sink)
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
        """Without the decisions topic: the gate polls the read API and runs the approved call once."""
        async with desk(kafka_broker, tmp_path, poll_api=True) as d:
            waiting = call(d, "c-poll")
            request = await d.pending("c-poll")
            assert (await d.decide("rev-1", request["approval_id"], "approve")).status_code == 200
            assert (await asyncio.wait_for(waiting, 20)).ok
            assert d.ran == [20000]

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
