"""`approval_asked`: what a chain would ask a human about a call, found without recording anything."""

from __future__ import annotations

from typing import Any

import pytest

from events import MemorySink
from events.models import ApprovalRequestedEvent
from interceptor_core import (
    Deny,
    Gate,
    RequireApproval,
    Rewrite,
    RunContext,
    ToolApprovalRequiredError,
    ToolCall,
    before_tool_call,
    tool,
)
from interceptor_core.integrations._approval_probe import AskedApproval, approval_asked
from interceptor_core.policy import Policy

POLICY = """\
version: 1
name: files
rules:
  - id: deletes
    tools: [delete_file]
    decision: require_approval
    message: "Deletes need a reviewer."
"""


@tool(description="Deletes a file")
def delete_file(path: str) -> str:
    return f"deleted {path}"


strip = before_tool_call(name="strip")(lambda call: Rewrite({"path": call.args["path"].strip()}))
ask_owner = before_tool_call(name="ask-owner")(lambda call: RequireApproval("deletes need the owner"))
ask_security = before_tool_call(name="ask-security")(lambda call: RequireApproval("and security"))
deny_all = before_tool_call(name="deny-all")(lambda call: Deny("no"))


def explode(call: ToolCall) -> None:
    raise RuntimeError("broken")


broken = before_tool_call(name="broken")(explode)


async def asked(*interceptors: object, args: dict[str, Any] | None = None) -> tuple[AskedApproval | None, MemorySink]:
    memory = MemorySink()
    scope = Gate("files", interceptors=list(interceptors), sinks=[memory]).agent("desk", tools=[delete_file])
    found = await approval_asked(scope, "delete_file", args or {"path": " old.txt "}, RunContext(), "c1")
    return found, memory


class TestApprovalAsked:
    async def test_the_rewritten_arguments_and_every_reason(self) -> None:
        """Rewrites apply first; the reasons are joined as the gate joins them, with who asked."""
        found, _ = await asked(strip, ask_owner, ask_security)
        assert found is not None
        assert found == AskedApproval(
            {"path": "old.txt"},
            "deletes need the owner; and security",
            ("ask-owner", "ask-security"),
            found.approval_id,
        )

    async def test_the_approval_id_is_the_one_the_gate_records(self) -> None:
        """With a policy asking too (its version binds the request), the id is the recorded request's."""
        policy = Policy.from_text(POLICY)
        found, memory = await asked(strip, policy, ask_owner)
        assert found is not None
        scope = Gate("files", interceptors=[strip, policy, ask_owner], sinks=[memory]).agent(
            "desk", tools=[delete_file]
        )
        with pytest.raises(ToolApprovalRequiredError):
            await scope.call("delete_file", {"path": " old.txt "}, call_id="c1", pause_for_approval=True)
        (requested,) = [e for e in memory.events if isinstance(e, ApprovalRequestedEvent)]
        assert requested.policy_version is not None
        assert found.approval_id == requested.approval_id

    async def test_nothing_is_recorded(self) -> None:
        """Asking emits no event beyond the scope's registration."""
        _, memory = await asked(strip, ask_owner)
        assert [e.type for e in memory.events] == ["ToolsRegistered"]

    async def test_none_when_a_later_interceptor_denies(self) -> None:
        """No human is asked about a call the chain ends otherwise."""
        found, _ = await asked(ask_owner, deny_all)
        assert found is None

    async def test_none_when_nothing_asks(self) -> None:
        """A chain that allows the call asks nobody."""
        found, _ = await asked(strip)
        assert found is None

    async def test_none_when_an_interceptor_fails(self) -> None:
        """A failing interceptor ends the call when it is made (failing closed); nobody is asked."""
        found, _ = await asked(ask_owner, broken)
        assert found is None

    async def test_none_for_invalid_arguments_or_an_unknown_tool(self) -> None:
        """Arguments the tool refuses, or a tool the scope lacks, ask nobody."""
        found, _ = await asked(ask_owner, args={"path": 3})
        assert found is None
        scope = Gate("files", interceptors=[ask_owner]).agent("desk", tools=[delete_file])
        assert await approval_asked(scope, "rename_file", {"path": "a"}, RunContext(), "c1") is None
