"""Approvals: asked after the whole chain, answered by the handler, refused on silence."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from interceptor_core import (
    Approval,
    ApprovalRequest,
    Deny,
    Gate,
    RequireApproval,
    RunContext,
    Tool,
    ToolApprovalRequiredError,
    before_tool_call,
)

from .conftest import Effects

needs_approval = before_tool_call(name="big-refund")(lambda call: RequireApproval("above the limit"))


def desk(tool: Tool[Any, Any], *interceptors: object, handler: Any = None, **options: Any) -> Any:
    gate = Gate("shop", interceptors=list(interceptors), approval_handler=handler, **options)
    return gate.agent("desk", tools=[tool])


class TestApprovals:
    async def test_approved_call_runs_and_the_handler_sees_the_request(
        self, refund: Tool[Any, Any], effects: Effects, acme: RunContext
    ) -> None:
        """The handler receives tool, args, reason, run and call id; True lets the tool run."""
        asked: list[ApprovalRequest] = []

        async def handler(request: ApprovalRequest) -> bool:
            asked.append(request)
            return True

        args = {"order_id": "A-1", "amount_cents": 90000}
        result = await desk(refund, needs_approval, handler=handler).call("refund", args, run=acme, call_id="c-9")
        assert result.ok
        assert effects.calls == [("refund", ("A-1", 90000))]
        (request,) = asked
        assert (request.tool, dict(request.args), request.reason, request.run, request.call_id) == (
            "refund",
            args,
            "above the limit",
            acme,
            "c-9",
        )
        assert request.requested_by == ("big-refund",)
        assert [d.interceptor for d in result.decisions] == ["big-refund", "approval"]

    async def test_no_human_is_asked_about_a_call_a_later_interceptor_denies(
        self, refund: Tool[Any, Any], effects: Effects
    ) -> None:
        """RequireApproval waits for the whole chain: a later Deny means the handler is never called."""
        asked: list[ApprovalRequest] = []

        async def handler(request: ApprovalRequest) -> bool:
            asked.append(request)
            return True

        deny = before_tool_call(lambda call: Deny("refunds are frozen"))
        result = await desk(refund, needs_approval, deny, handler=handler).call(
            "refund", {"order_id": "A-1", "amount_cents": 1}
        )
        assert result.kind == "denied"
        assert asked == []
        assert effects.calls == []

    async def test_refusal_with_reviewer_and_note(self, refund: Tool[Any, Any], effects: Effects) -> None:
        """An Approval(False, by, note) is a denial the model can read, naming who and why."""

        async def handler(request: ApprovalRequest) -> Approval:
            return Approval(approved=False, by="lead@acme", note="escalate to finance")

        result = await desk(refund, needs_approval, handler=handler).call(
            "refund", {"order_id": "A-1", "amount_cents": 1}
        )
        assert result.kind == "denied"
        assert "lead@acme" in result.to_model_text()
        assert "escalate to finance" in result.to_model_text()
        assert effects.calls == []

    async def test_silence_past_the_timeout_is_a_refusal(self, refund: Tool[Any, Any], effects: Effects) -> None:
        """A handler that never answers within approval_timeout_s refuses the call."""
        never = asyncio.Event()

        async def handler(request: ApprovalRequest) -> bool:
            await never.wait()
            return True

        result = await desk(refund, needs_approval, handler=handler, approval_timeout_s=0.05).call(
            "refund", {"order_id": "A-1", "amount_cents": 1}
        )
        assert result.kind == "denied"
        assert result.decisions[-1].error is not None
        assert "no answer" in result.decisions[-1].error
        assert effects.calls == []

    async def test_failing_or_odd_handler_refuses(self, refund: Tool[Any, Any], effects: Effects) -> None:
        """A handler that raises, or answers something that is no approval, refuses the call."""

        async def raising(request: ApprovalRequest) -> bool:
            raise ConnectionError("review queue down")

        async def odd(request: ApprovalRequest) -> str:
            return "yes"

        for handler in (raising, odd):
            result = await desk(refund, needs_approval, handler=handler).call(
                "refund", {"order_id": "A-1", "amount_cents": 1}
            )
            assert result.kind == "denied"
        assert effects.calls == []

    async def test_several_requests_ask_once(self, refund: Tool[Any, Any]) -> None:
        """Two interceptors asking for approval lead to one question carrying both reasons."""
        asked: list[ApprovalRequest] = []

        def handler(request: ApprovalRequest) -> bool:  # a sync handler is accepted
            asked.append(request)
            return True

        second = before_tool_call(name="new-payee")(lambda call: RequireApproval("new payee"))
        await desk(refund, needs_approval, second, handler=handler).call(
            "refund", {"order_id": "A-1", "amount_cents": 1}
        )
        (request,) = asked
        assert request.reason == "above the limit; new payee"
        assert request.requested_by == ("big-refund", "new-payee")

    async def test_no_handler_raises(self, refund: Tool[Any, Any], effects: Effects) -> None:
        """Without an approval handler the call raises ToolApprovalRequiredError naming the interceptor."""
        with pytest.raises(ToolApprovalRequiredError) as caught:
            await desk(refund, needs_approval).call("refund", {"order_id": "A-1", "amount_cents": 1})
        assert caught.value.tool == "refund"
        assert caught.value.interceptor == "big-refund"
        assert effects.calls == []
