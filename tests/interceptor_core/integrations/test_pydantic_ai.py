"""Pydantic AI through the gate: `GatedToolset` (around function tools and around Pydantic AI's own
MCP toolset, against the real test server process) and `ScopeToolset` (an MCP server's tools through
`McpToolset`), driven by the framework's own FunctionModel and TestModel, no network.

Every test checks what the framework reports (the tool return's `outcome`, a deferred run, an
exception out of the run) against what it reports without the gate, and that the events carry its
`tool_call_id` and verify as a chain."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, TextIO

import anyio
import pytest
from mcp import StdioServerParameters
from pydantic_ai import (
    Agent,
    ApprovalRequired,
    CallDeferred,
    DeferredToolRequests,
    DeferredToolResults,
    ModelRetry,
    ToolDenied,
    ToolFailed,
)
from pydantic_ai.mcp import MCPToolset, StdioTransport
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel
from pydantic_ai.toolsets import AbstractToolset, DynamicToolset, FunctionToolset

from events import EventBase, MemorySink, verify_chain
from interceptor_core import (
    Approval,
    ApprovalRequest,
    Gate,
    RequireApproval,
    Rewrite,
    RunContext,
    ToolBlockedError,
    ToolCall,
)
from interceptor_core.integrations.mcp import McpToolset
from interceptor_core.integrations.pydantic_ai import GatedToolset, ScopeToolset

from .conftest import UPSTREAM, effects, upstream_command
from .files_policy import DENIAL, SUBSTITUTE, ProtectFiles


def file_tools(root: Path, done: list[str]) -> FunctionToolset[Any]:
    attempts: dict[str, int] = {}

    def write_file(path: str, text: str) -> str:
        """Writes text to a file under the root."""
        attempts[path] = attempts.get(path, 0) + 1
        if path == "flaky.txt" and attempts[path] == 1:
            raise ModelRetry("disk busy, try again")
        (root / path).write_text(text)
        done.append(f"write {path}")
        return f"wrote {path}"

    def delete_file(path: str) -> str:
        """Deletes a file under the root."""
        if path == "later.txt":
            raise CallDeferred({"queue": "deletions"})
        if path == "ask.txt":
            raise ApprovalRequired({"why": "the tool asks"})
        if not (root / path).exists():
            raise ToolFailed(f"{path} does not exist")
        if path == "old.txt" and (root / "locked").exists():
            raise PermissionError(f"{path} is locked")
        (root / path).unlink()
        done.append(f"delete {path}")
        return f"deleted {path}"

    return FunctionToolset([write_file, delete_file])


def returns(messages: list[ModelMessage]) -> list[str]:
    return [
        f"{part.tool_name}: {part.content}"
        for message in messages
        for part in getattr(message, "parts", [])
        if isinstance(part, ToolReturnPart)
    ]


def outcomes(messages: list[ModelMessage]) -> dict[str, str]:
    """Each tool return's outcome, by tool call id: what Pydantic AI reports for the call."""
    return {
        part.tool_call_id: part.outcome
        for message in messages
        for part in getattr(message, "parts", [])
        if isinstance(part, ToolReturnPart)
    }


def calls(events: list[EventBase]) -> list[tuple[str, str | None, str | None]]:
    """(type, tool, call_id) of every event but the registrations, in order."""
    return [(e.type, e.tool, e.call_id) for e in events if e.type != "ToolsRegistered"]


def scripted(*turns: list[ToolCallPart]) -> FunctionModel:
    """Each turn's tool calls in order, then a final answer listing every tool return seen."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        asked = sum(isinstance(m, ModelResponse) for m in messages)
        if asked < len(turns):
            return ModelResponse(parts=list(turns[asked]))
        return ModelResponse(parts=[TextPart(" | ".join(returns(messages)))])

    return FunctionModel(respond)


class AskForDeletes:
    """Every delete needs a human's approval."""

    name = "ask-for-deletes"

    def before_tool_call(self, call: ToolCall) -> RequireApproval | None:
        return RequireApproval("deletes need a human") if call.tool_name.endswith("delete_file") else None


async def run_both(root: Path, toolsets: tuple[AbstractToolset[Any], AbstractToolset[Any]], *turns: list[ToolCallPart]):
    """The same script run ungated and gated: (ungated result or exception, gated result or exception)."""
    answers: list[Any] = []
    for toolset in toolsets:
        try:
            answers.append(
                await Agent(scripted(*turns), toolsets=[toolset], output_type=[str, DeferredToolRequests]).run("go")
            )
        except Exception as exc:
            answers.append(exc)
    return answers


class TestGatedToolset:
    async def test_parallel_calls_one_denied(self, root: Path) -> None:
        """Of two parallel calls the write runs and the delete is denied: Pydantic AI reports the
        denial as its own `denied` outcome, the model reads it, the file stays, and each call
        leaves its event under the framework's call id."""
        memory, done = MemorySink(), []
        gate = Gate("files", interceptors=[ProtectFiles()], sinks=[memory])
        toolset = GatedToolset(file_tools(root, done), gate=gate, agent="writer")
        model = scripted(
            [
                ToolCallPart("write_file", {"path": "note.txt", "text": "hi"}, tool_call_id="call-write"),
                ToolCallPart("delete_file", {"path": "precious.txt"}, tool_call_id="call-delete"),
            ]
        )
        result = await Agent(model, toolsets=[toolset]).run("tidy up")
        assert result.output == f"write_file: wrote note.txt | delete_file: {DENIAL}"
        assert outcomes(result.all_messages()) == {"call-write": "success", "call-delete": "denied"}
        assert (root / "precious.txt").read_text() == "keep me"
        assert done == ["write note.txt"]
        assert sorted(calls(memory.events)) == [
            ("ToolDenied", "delete_file", "call-delete"),
            ("ToolUse", "write_file", "call-write"),
        ]
        assert gate.coverage().registered == {"write_file", "delete_file"}
        assert toolset.scope is not None
        shown = {t["name"]: t["input_schema"] for t in toolset.scope.tool_definitions()}
        assert shown == {name: t.function_schema.json_schema for name, t in toolset.wrapped.tools.items()}
        assert verify_chain(memory.events).ok

    async def test_substitute_is_the_tools_result(self, root: Path) -> None:
        """A substitute is a successful return carrying the substitute; nothing is written."""
        memory, done = MemorySink(), []
        gate = Gate("files", interceptors=[ProtectFiles()], sinks=[memory])
        toolset = GatedToolset(file_tools(root, done), gate=gate)
        model = scripted([ToolCallPart("write_file", {"path": "dry-run.txt", "text": "x"}, tool_call_id="c1")])
        result = await Agent(model, toolsets=[toolset]).run("write")
        assert result.output == f"write_file: {SUBSTITUTE}"
        assert outcomes(result.all_messages()) == {"c1": "success"}
        assert done == []
        assert calls(memory.events) == [("Substitute", "write_file", "c1")]

    async def test_rewritten_arguments_reach_the_tool(self, root: Path) -> None:
        """A Rewrite's arguments are what the tool gets (validated by Pydantic AI's validator again)."""

        class Sandbox:
            name = "sandbox"

            def before_tool_call(self, call: ToolCall) -> Rewrite | None:
                path = call.args["path"]
                return None if path.startswith("sandbox-") else Rewrite({**call.args, "path": f"sandbox-{path}"})

        memory, done = MemorySink(), []
        gate = Gate("files", interceptors=[Sandbox()], sinks=[memory])
        toolset = GatedToolset(file_tools(root, done), gate=gate)
        model = scripted([ToolCallPart("write_file", {"path": "note.txt", "text": "hi"}, tool_call_id="c1")])
        result = await Agent(model, toolsets=[toolset]).run("write")
        assert result.output == "write_file: wrote sandbox-note.txt"
        assert done == ["write sandbox-note.txt"]
        assert not (root / "note.txt").exists()
        assert memory.of_type("ToolUse")[0].args_rewritten

    async def test_retry_passes_the_gate_each_time(self, root: Path) -> None:
        """A tool's ModelRetry still makes the model retry (outcome `retried`), and each attempt
        passes the gate."""
        memory, done = MemorySink(), []
        gate = Gate("files", interceptors=[ProtectFiles()], sinks=[memory])
        toolset = GatedToolset(file_tools(root, done), gate=gate)
        model = scripted(
            [ToolCallPart("write_file", {"path": "flaky.txt", "text": "x"}, tool_call_id="c1")],
            [ToolCallPart("write_file", {"path": "flaky.txt", "text": "x"}, tool_call_id="c2")],
            [ToolCallPart("delete_file", {"path": "precious.txt"}, tool_call_id="c3")],
        )
        result = await Agent(model, toolsets=[toolset]).run("write")
        assert (
            result.output == f"write_file: disk busy, try again | write_file: wrote flaky.txt | delete_file: {DENIAL}"
        )
        assert outcomes(result.all_messages()) == {"c1": "retried", "c2": "success", "c3": "denied"}
        assert done == ["write flaky.txt"]
        assert [(kind, call_id) for kind, _, call_id in calls(memory.events)] == [
            ("ToolUse", "c1"),
            ("ToolUse", "c2"),
            ("ToolDenied", "c3"),
        ]
        first = next(e for e in memory.events if e.type == "ToolUse")
        assert first.outcome == "error"
        assert "disk busy" in (first.error or "")

    async def test_tool_failed_keeps_the_failed_outcome(self, root: Path) -> None:
        """A tool's ToolFailed is a `failed` return with its message, gated as ungated, and the gate
        records the call as an error."""
        memory = MemorySink()
        gate = Gate("files", interceptors=[ProtectFiles()], sinks=[memory])
        call = [ToolCallPart("delete_file", {"path": "missing.txt"}, tool_call_id="c1")]
        plain, gated = await run_both(root, (file_tools(root, []), GatedToolset(file_tools(root, []), gate=gate)), call)
        for result in (plain, gated):
            assert result.output == "delete_file: missing.txt does not exist"
            assert outcomes(result.all_messages()) == {"c1": "failed"}
        (event,) = [e for e in memory.events if e.type == "ToolUse"]
        assert (event.call_id, event.outcome) == ("c1", "error")
        assert "missing.txt does not exist" in (event.error or "")

    async def test_call_deferred_still_defers_the_run(self, root: Path) -> None:
        """A tool's CallDeferred ends the run with DeferredToolRequests carrying the call and its
        metadata, gated as ungated; the gate records the call under the same id."""
        memory = MemorySink()
        gate = Gate("files", interceptors=[ProtectFiles()], sinks=[memory])
        call = [ToolCallPart("delete_file", {"path": "later.txt"}, tool_call_id="c1")]
        plain, gated = await run_both(root, (file_tools(root, []), GatedToolset(file_tools(root, []), gate=gate)), call)
        for result in (plain, gated):
            assert isinstance(result.output, DeferredToolRequests)
            assert [c.tool_call_id for c in result.output.calls] == ["c1"]
            assert result.output.metadata == {"c1": {"queue": "deletions"}}
            assert result.output.approvals == []
        assert calls(memory.events) == [("ToolUse", "delete_file", "c1")]
        assert "CallDeferred" in (memory.events[-1].error or "")

    async def test_the_tools_own_approval_request_defers_the_run(self, root: Path) -> None:
        """A tool raising ApprovalRequired asks through Pydantic AI's approvals, gated as ungated."""
        gate = Gate("files", interceptors=[ProtectFiles()])
        call = [ToolCallPart("delete_file", {"path": "ask.txt"}, tool_call_id="c1")]
        plain, gated = await run_both(root, (file_tools(root, []), GatedToolset(file_tools(root, []), gate=gate)), call)
        for result in (plain, gated):
            assert isinstance(result.output, DeferredToolRequests)
            assert [c.tool_call_id for c in result.output.approvals] == ["c1"]
            assert result.output.metadata == {"c1": {"why": "the tool asks"}}

    async def test_an_exception_that_ends_an_ungated_run_ends_the_gated_one(self, root: Path) -> None:
        """A tool's PermissionError comes out of the gated run as out of the ungated one, the file
        stays, and the gate has recorded the call as an error."""
        (root / "locked").write_text("")
        memory, done = MemorySink(), []
        gate = Gate("files", interceptors=[ProtectFiles()], sinks=[memory])
        call = [ToolCallPart("delete_file", {"path": "old.txt"}, tool_call_id="c1")]
        plain, gated = await run_both(
            root, (file_tools(root, done), GatedToolset(file_tools(root, done), gate=gate)), call
        )
        for raised in (plain, gated):
            assert isinstance(raised, PermissionError)
            assert str(raised) == "old.txt is locked"
        assert (root / "old.txt").exists()
        assert done == []
        (event,) = [e for e in memory.events if e.type == "ToolUse"]
        assert (event.call_id, event.outcome) == ("c1", "error")
        assert "PermissionError: old.txt is locked" in (event.error or "")
        assert verify_chain(memory.events).ok

    async def test_gate_failure_is_a_failed_outcome(self, root: Path) -> None:
        """An after-interceptor that fails withholds the output: a `failed` return the model reads."""

        class Broken:
            name = "broken"

            def after_tool_call(self, call: ToolCall, output: Any) -> Any:
                raise RuntimeError("cannot check")

        memory = MemorySink()
        gate = Gate("files", interceptors=[Broken()], sinks=[memory])
        toolset = GatedToolset(file_tools(root, []), gate=gate)
        model = scripted([ToolCallPart("write_file", {"path": "note.txt", "text": "hi"}, tool_call_id="c1")])
        result = await Agent(model, toolsets=[toolset]).run("write")
        assert result.output == "write_file: Tool error: output withheld: after-interceptor 'broken' failed"
        assert outcomes(result.all_messages()) == {"c1": "failed"}

    async def test_block_ends_the_run(self, root: Path) -> None:
        """A Block raises ToolBlockedError out of the run and the tool never runs."""
        memory, done = MemorySink(), []
        gate = Gate("files", interceptors=[ProtectFiles()], sinks=[memory])
        toolset = GatedToolset(file_tools(root, done), gate=gate)
        model = scripted([ToolCallPart("delete_file", {"path": "*"}, tool_call_id="c1")])
        with pytest.raises(ToolBlockedError, match="wildcard"):
            await Agent(model, toolsets=[toolset]).run("delete everything")
        assert done == []
        assert calls(memory.events) == [("Blocked", "delete_file", "c1")]

    async def test_a_toolset_built_per_run_is_registered_once(self, root: Path) -> None:
        """Around a DynamicToolset (a new toolset every run, so Pydantic AI copies the wrapper for
        each run), the tools are registered once and every run calls its own toolset."""
        memory, done = MemorySink(), []
        gate = Gate("files", interceptors=[ProtectFiles()], sinks=[memory])
        built: list[FunctionToolset[Any]] = []

        def per_run(ctx: Any) -> FunctionToolset[Any]:
            built.append(file_tools(root, done))
            return built[-1]

        toolset = GatedToolset(DynamicToolset(per_run, per_run_step=False), gate=gate)
        for index in range(3):
            model = scripted(
                [ToolCallPart("write_file", {"path": f"n{index}.txt", "text": "x"}, tool_call_id=f"c{index}")]
            )
            await Agent(model, toolsets=[toolset]).run("write")
        assert len(built) == 3
        assert done == ["write n0.txt", "write n1.txt", "write n2.txt"]
        assert [e.type for e in memory.events] == ["ToolsRegistered", "ToolUse", "ToolUse", "ToolUse"]
        assert toolset.scope is not None

    async def test_test_model_call_ids_are_the_events_call_ids(self, root: Path) -> None:
        """With TestModel calling every tool, each event's call_id is the id of the return Pydantic AI
        recorded for that call."""
        memory = MemorySink()
        gate = Gate("files", sinks=[memory])
        toolset = GatedToolset(FunctionToolset([lambda_free_echo]), gate=gate)
        result = await Agent(TestModel(), toolsets=[toolset]).run("echo")
        ids = list(outcomes(result.all_messages()))
        assert ids
        assert [call_id for _, _, call_id in calls(memory.events)] == ids


def lambda_free_echo(text: str) -> str:
    """Returns the text."""
    return text


class TestApprovals:
    """`RequireApproval` with no gate handler is Pydantic AI's approval flow; with one, the gate asks."""

    def agent(self, root: Path, gate: Gate, done: list[str]) -> Agent[None, str | DeferredToolRequests]:
        toolset = GatedToolset(file_tools(root, done), gate=gate, agent="cleaner")
        model = scripted([ToolCallPart("delete_file", {"path": "old.txt"}, tool_call_id="c1")])
        return Agent(model, toolsets=[toolset], output_type=[str, DeferredToolRequests])

    async def test_approved_in_the_next_run(self, root: Path) -> None:
        """The run ends with the call in DeferredToolRequests.approvals and nothing deleted, the pause
        recorded as the durable `ApprovalRequested` (no outcome); the next run brings the approval
        (who gave it in the results' metadata), the call asks again under the same approval id, runs,
        and leaves one outcome."""
        memory, done = MemorySink(), []
        gate = Gate("files", interceptors=[AskForDeletes()], sinks=[memory])
        agent = self.agent(root, gate, done)
        first = await agent.run("clean up")
        assert isinstance(first.output, DeferredToolRequests)
        assert [c.tool_call_id for c in first.output.approvals] == ["c1"]
        assert first.output.metadata == {"c1": {"reason": "deletes need a human", "requested_by": "ask-for-deletes"}}
        assert (root / "old.txt").exists()
        assert calls(memory.events) == [("ApprovalRequested", "delete_file", "c1")]

        answers = DeferredToolResults(approvals={"c1": True}, metadata={"c1": {"by": "alice", "note": "fine"}})
        second = await agent.run(message_history=first.all_messages(), deferred_tool_results=answers)
        assert second.output == "delete_file: deleted old.txt"
        assert outcomes(second.all_messages()) == {"c1": "success"}
        assert done == ["delete old.txt"]
        assert calls(memory.events)[1:] == [
            ("ApprovalRequested", "delete_file", "c1"),
            ("ApprovalResolved", "delete_file", "c1"),
            ("ToolUse", "delete_file", "c1"),
        ]
        resolved = memory.of_type("ApprovalResolved")[0]
        assert (resolved.approved, resolved.by, resolved.note) == (True, "alice", "fine")
        assert len({e.approval_id for e in memory.of_type("ApprovalRequested")} | {resolved.approval_id}) == 1
        assert verify_chain(memory.events).ok

    @pytest.mark.parametrize("answer", [False, ToolDenied("not today")])
    async def test_refused_in_the_next_run(self, root: Path, answer: Any) -> None:
        """A refusal is Pydantic AI's own `denied` outcome and the tool never runs; it never reaches
        the toolset, which records it at the next step: the request asked again, refused with the
        message the model read as the note, and one `ToolDenied`."""
        memory, done = MemorySink(), []
        gate = Gate("files", interceptors=[AskForDeletes()], sinks=[memory])
        agent = self.agent(root, gate, done)
        first = await agent.run("clean up")
        second = await agent.run(
            message_history=first.all_messages(), deferred_tool_results=DeferredToolResults(approvals={"c1": answer})
        )
        shown = "not today" if isinstance(answer, ToolDenied) else "The tool call was denied."
        assert second.output == f"delete_file: {shown}"
        assert outcomes(second.all_messages()) == {"c1": "denied"}
        assert done == []
        assert (root / "old.txt").exists()
        assert [kind for kind, _, _ in calls(memory.events)] == [
            "ApprovalRequested",
            "ApprovalRequested",
            "ApprovalResolved",
            "ToolDenied",
        ]
        resolved = memory.of_type("ApprovalResolved")[0]
        assert (resolved.approved, resolved.note) == (False, shown)
        assert memory.of_type("ToolDenied")[0].call_id == "c1"
        assert len({e.approval_id for e in memory.of_type("ApprovalRequested")} | {resolved.approval_id}) == 1
        assert verify_chain(memory.events).ok

    async def test_a_refusal_is_recorded_once_over_later_steps(self, root: Path) -> None:
        """After a refusal the run goes on (here a write in the next turn): the refusal is recorded
        once, and the write is recorded as itself."""
        memory, done = MemorySink(), []
        gate = Gate("files", interceptors=[AskForDeletes()], sinks=[memory])
        toolset = GatedToolset(file_tools(root, done), gate=gate, agent="cleaner")
        model = scripted(
            [ToolCallPart("delete_file", {"path": "old.txt"}, tool_call_id="c1")],
            [ToolCallPart("write_file", {"path": "note.txt", "text": "kept"}, tool_call_id="c2")],
        )
        agent = Agent(model, toolsets=[toolset], output_type=[str, DeferredToolRequests])
        first = await agent.run("clean up")
        await agent.run(
            message_history=first.all_messages(), deferred_tool_results=DeferredToolResults(approvals={"c1": False})
        )
        assert done == ["write note.txt"]
        assert [(kind, call_id) for kind, _, call_id in calls(memory.events) if kind in ("ToolDenied", "ToolUse")] == [
            ("ToolDenied", "c1"),
            ("ToolUse", "c2"),
        ]

    async def test_the_gates_handler_answers_instead(self, root: Path) -> None:
        """A gate with its own approval handler asks it: the run is not deferred, and a refusal is a
        `denied` return carrying the reviewer's note."""
        asked: list[ApprovalRequest] = []

        def refuse(request: ApprovalRequest) -> Approval:
            asked.append(request)
            return Approval(approved=False, by="alice", note="keep it")

        memory, done = MemorySink(), []
        gate = Gate("files", interceptors=[AskForDeletes()], sinks=[memory], approval_handler=refuse)
        result = await self.agent(root, gate, done).run("clean up")
        assert result.output == (
            "delete_file: The call to delete_file needs approval (deletes need a human) "
            "and was refused by alice: keep it"
        )
        assert outcomes(result.all_messages()) == {"c1": "denied"}
        assert [r.call_id for r in asked] == ["c1"]
        assert done == []
        assert [kind for kind, _, _ in calls(memory.events)] == ["ApprovalRequested", "ApprovalResolved", "ToolDenied"]


class TestFrameworksOwnApprovals:
    """A tool registered with `requires_approval=True` asks through Pydantic AI whatever the chain
    says; the gate records the request, the answer and the one outcome."""

    def agent(
        self, root: Path, memory: MemorySink, done: list[str], **gate_options: Any
    ) -> Agent[None, str | DeferredToolRequests]:
        def delete_file(path: str) -> str:
            """Deletes a file under the root."""
            (root / path).unlink()
            done.append(f"delete {path}")
            return f"deleted {path}"

        tools = FunctionToolset[Any]()
        tools.add_function(delete_file, requires_approval=True)
        gate = Gate("files", interceptors=[ProtectFiles()], sinks=[memory], **gate_options)
        toolset = GatedToolset(tools, gate=gate, agent="cleaner")
        model = scripted([ToolCallPart("delete_file", {"path": "old.txt"}, tool_call_id="c1")])
        return Agent(model, toolsets=[toolset], output_type=[str, DeferredToolRequests])

    async def test_the_pause_is_a_request_and_the_approval_runs_the_call_once(self, root: Path) -> None:
        """The run defers the call as ungated; the gate records the framework's request (asked by
        "pydantic-ai-approval"), and on approval the request again, the approval and the `ToolUse`."""
        memory, done = MemorySink(), []
        agent = self.agent(root, memory, done)
        first = await agent.run("clean up")
        assert isinstance(first.output, DeferredToolRequests)
        assert [c.tool_call_id for c in first.output.approvals] == ["c1"]
        assert calls(memory.events) == [("ApprovalRequested", "delete_file", "c1")]
        assert memory.of_type("ApprovalRequested")[0].requested_by == ("pydantic-ai-approval",)
        answers = DeferredToolResults(approvals={"c1": True}, metadata={"c1": {"by": "bob"}})
        second = await agent.run(message_history=first.all_messages(), deferred_tool_results=answers)
        assert second.output == "delete_file: deleted old.txt"
        assert done == ["delete old.txt"]
        assert [kind for kind, _, _ in calls(memory.events)] == [
            "ApprovalRequested",
            "ApprovalRequested",
            "ApprovalResolved",
            "ToolUse",
        ]
        assert memory.of_type("ApprovalResolved")[0].by == "bob"
        assert verify_chain(memory.events).ok

    async def test_a_rejection_that_never_reaches_the_tool_is_recorded(self, root: Path) -> None:
        """Rejected, the tool never runs, the model reads Pydantic AI's denial, and the gate records
        the refusal and a `ToolDenied`."""
        memory, done = MemorySink(), []
        agent = self.agent(root, memory, done)
        first = await agent.run("clean up")
        second = await agent.run(
            message_history=first.all_messages(),
            deferred_tool_results=DeferredToolResults(approvals={"c1": ToolDenied("keep it")}),
        )
        assert second.output == "delete_file: keep it"
        assert done == []
        assert [kind for kind, _, _ in calls(memory.events)] == [
            "ApprovalRequested",
            "ApprovalRequested",
            "ApprovalResolved",
            "ToolDenied",
        ]
        resolved = memory.of_type("ApprovalResolved")[0]
        assert (resolved.approved, resolved.note) == (False, "keep it")

    async def test_the_gates_handler_answers_the_tools_own_request(self, root: Path) -> None:
        """With an approval handler on the gate, the tool's own request is put to it inside the
        call: approved, the run is not deferred and the tool runs once."""
        memory, done = MemorySink(), []
        asked: list[tuple[str, ...]] = []

        def approve(request: ApprovalRequest) -> Approval:
            asked.append(request.requested_by)
            return Approval(approved=True, by="ops")

        result = await self.agent(root, memory, done, approval_handler=approve).run("clean up")
        assert result.output == "delete_file: deleted old.txt"
        assert (done, asked) == (["delete old.txt"], [("pydantic-ai-approval",)])
        assert [kind for kind, _, _ in calls(memory.events)] == ["ApprovalRequested", "ApprovalResolved", "ToolUse"]

    async def test_a_call_the_chain_denies_is_not_put_to_a_human(self, root: Path) -> None:
        """The chain runs before the framework's request is honoured: a denied call is never
        deferred, the model reads the denial, and no request is recorded."""
        memory, done = MemorySink(), []
        agent = self.agent(root, memory, done)
        agent = Agent(
            scripted([ToolCallPart("delete_file", {"path": "precious.txt"}, tool_call_id="c1")]),
            toolsets=agent.toolsets,
            output_type=[str, DeferredToolRequests],
        )
        result = await agent.run("clean up")
        assert result.output == f"delete_file: {DENIAL}"
        assert calls(memory.events) == [("ToolDenied", "delete_file", "c1")]


def mcp_toolset(root: Path, **options: Any) -> MCPToolset[Any]:
    """Pydantic AI's own MCP client on the test server, started as its own process."""
    transport = StdioTransport(
        command=sys.executable, args=[str(UPSTREAM)], env={**os.environ, "UPSTREAM_ROOT": str(root)}
    )
    return MCPToolset(transport, **options)


async def archive_then_block(toolset: AbstractToolset[Any], run: RunContext) -> None:
    """The tool the server added (archive_file) is offered to the next run and runs; a wildcard
    delete then blocks the run."""
    offered: list[str] = []

    def archive(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        offered.extend(t.name for t in info.function_tools)
        if any(isinstance(m, ModelResponse) for m in messages):
            return ModelResponse(parts=[TextPart(" | ".join(returns(messages)))])
        return ModelResponse(parts=[ToolCallPart("archive_file", {"path": "old.txt"}, tool_call_id="a1")])

    result = await Agent(FunctionModel(archive), toolsets=[toolset]).run("archive", deps=run)
    assert result.output == "archive_file: archived old.txt"
    assert "archive_file" in offered

    with pytest.raises(ToolBlockedError, match="wildcard"):
        await Agent(scripted([ToolCallPart("delete_file", {"path": "*"}, tool_call_id="b1")]), toolsets=[toolset]).run(
            "x"
        )


def assert_mcp_trail(root: Path, memory: MemorySink, *also: tuple[str, str, str]) -> None:
    """After the MCP tests' runs: the protected file untouched, only the allowed effects, the added
    tool registered before its call, one event per call under Pydantic AI's ids (and `also`), all
    for the caller's tenant, and the chain verifies."""
    assert (root / "precious.txt").read_text() == "keep me"
    assert effects(root) == ["write note.txt", "enable_archive", "archive old.txt"]
    order = [(e.type, [t.name for t in e.tools] if e.type == "ToolsRegistered" else e.tool) for e in memory.events]
    assert order.index(("ToolsRegistered", ["archive_file"])) < order.index(("ToolUse", "archive_file"))
    assert sorted(calls(memory.events)) == sorted(
        [
            ("Blocked", "delete_file", "b1"),
            ("ToolDenied", "delete_file", "d1"),
            ("ToolUse", "archive_file", "a1"),
            ("ToolUse", "enable_archive", "e1"),
            ("ToolUse", "write_file", "w1"),
            *also,
        ]
    )
    assert {e.tenant for e in memory.events if e.type == "ToolUse"} == {"acme"}
    assert verify_chain(memory.events).ok


class TestGatedMcpToolset:
    """`GatedToolset` around `pydantic_ai.mcp.MCPToolset` and a real MCP server process."""

    async def test_parallel_calls_one_denied_a_tool_added_later_and_a_block(self, root: Path) -> None:
        """Of two parallel calls the write reaches the server and the delete is denied (`denied`, the
        model reads why) and never does; a tool the server adds later is registered when the agent
        next lists the tools, before its first call; a block ends the run; every event carries
        Pydantic AI's call id.

        `cache_tools=False`: on the 2026-07-28 protocol era the fastmcp client does not hear the
        server's list change, so the toolset must list again to see the new tool."""
        memory = MemorySink()
        gate = Gate("files", interceptors=[ProtectFiles()], sinks=[memory])
        toolset = GatedToolset(mcp_toolset(root, cache_tools=False), gate=gate, agent="files")
        acme = RunContext(tenant="acme", principal="u-1")
        async with toolset:
            model = scripted(
                [
                    ToolCallPart("write_file", {"path": "note.txt", "text": "hi"}, tool_call_id="w1"),
                    ToolCallPart("delete_file", {"path": "precious.txt"}, tool_call_id="d1"),
                ],
                [ToolCallPart("enable_archive", {}, tool_call_id="e1")],
            )
            result = await Agent(model, toolsets=[toolset]).run("tidy up", deps=acme)
            assert result.output == " | ".join(
                [
                    "write_file: wrote 2 chars to note.txt",
                    f"delete_file: {DENIAL}",
                    "enable_archive: archive_file is available",
                ]
            )
            assert outcomes(result.all_messages()) == {"w1": "success", "d1": "denied", "e1": "success"}

            await archive_then_block(toolset, acme)

        assert_mcp_trail(root, memory)

    async def test_a_server_error_keeps_the_toolsets_error_behaviour(self, root: Path) -> None:
        """A tool error from the server is what MCPToolset makes of it: a `retried` return by default,
        a `failed` one with tool_error_behavior='failed'."""
        memory = MemorySink()
        gate = Gate("files", interceptors=[ProtectFiles()], sinks=[memory])
        server = mcp_toolset(root)
        toolset = GatedToolset(server, gate=gate)
        async with toolset:
            for behaviour, outcome, call_id in (("retry", "retried", "m1"), ("failed", "failed", "m2")):
                server.tool_error_behavior = behaviour
                model = scripted([ToolCallPart("delete_file", {"path": "missing.txt"}, tool_call_id=call_id)])
                result = await Agent(model, toolsets=[toolset]).run("delete")
                assert outcomes(result.all_messages()) == {call_id: outcome}
                assert result.output == "delete_file: Error executing tool delete_file"
        assert [(e.call_id, e.outcome) for e in memory.events if e.type == "ToolUse"] == [
            ("m1", "error"),
            ("m2", "error"),
        ]

    async def test_require_approval_through_the_mcp_toolset(self, root: Path) -> None:
        """Pydantic AI's approval flow works around its MCP toolset: deferred, then approved, then run."""
        memory = MemorySink()
        gate = Gate("files", interceptors=[AskForDeletes()], sinks=[memory])
        toolset = GatedToolset(mcp_toolset(root), gate=gate)
        model = scripted([ToolCallPart("delete_file", {"path": "old.txt"}, tool_call_id="c1")])
        agent = Agent(model, toolsets=[toolset], output_type=[str, DeferredToolRequests])
        async with toolset:
            first = await agent.run("clean up")
            assert isinstance(first.output, DeferredToolRequests)
            assert effects(root) == []
            second = await agent.run(
                message_history=first.all_messages(), deferred_tool_results=DeferredToolResults(approvals={"c1": True})
            )
        assert second.output == "delete_file: deleted old.txt"
        assert effects(root) == ["delete old.txt"]
        assert [kind for kind, _, _ in calls(memory.events)] == [
            "ApprovalRequested",
            "ApprovalRequested",
            "ApprovalResolved",
            "ToolUse",
        ]


class TestMcpThroughScopeToolset:
    """An MCP server reaches Pydantic AI agents through `McpToolset` (registration, list changes)
    and `ScopeToolset` too, with the same outcomes."""

    async def test_parallel_calls_one_denied_and_a_tool_added_later(self, root: Path, errlog: TextIO) -> None:
        """Of two parallel calls the write reaches the server and the delete is denied (`denied`, the
        model reads why) and never does; a tool the server announces later is offered to the next run,
        registered before its call; a server error is a `failed` return; a block ends the run."""
        memory = MemorySink()
        gate = Gate("files", interceptors=[ProtectFiles()], sinks=[memory])
        command = upstream_command()
        params = StdioServerParameters(
            command=command[0], args=command[1:], env={**os.environ, "UPSTREAM_ROOT": str(root)}
        )
        acme = RunContext(tenant="acme", principal="u-1")
        async with McpToolset.connect(params, errlog=errlog) as mcp_tools:
            added = anyio.Event()
            mcp_tools.on_change(lambda new: added.set())
            toolset = ScopeToolset(await mcp_tools.attach(gate.agent("files", tools=[])))
            model = scripted(
                [
                    ToolCallPart("write_file", {"path": "note.txt", "text": "hi"}, tool_call_id="w1"),
                    ToolCallPart("delete_file", {"path": "precious.txt"}, tool_call_id="d1"),
                ],
                [ToolCallPart("enable_archive", {}, tool_call_id="e1")],
                [ToolCallPart("delete_file", {"path": "missing.txt"}, tool_call_id="m1")],
            )
            result = await Agent(model, toolsets=[toolset]).run("tidy up", deps=acme)
            assert result.output.startswith(
                " | ".join(
                    [
                        "write_file: wrote 2 chars to note.txt",
                        f"delete_file: {DENIAL}",
                        "enable_archive: archive_file is available",
                        "delete_file: Tool error: ",
                    ]
                )
            )
            assert outcomes(result.all_messages()) == {"w1": "success", "d1": "denied", "e1": "success", "m1": "failed"}
            with anyio.fail_after(20):
                await added.wait()

            await archive_then_block(toolset, acme)

        assert_mcp_trail(root, memory, ("ToolUse", "delete_file", "m1"))

    async def test_invalid_arguments_ask_the_model_to_retry(self, root: Path, errlog: TextIO) -> None:
        """Arguments the tool's schema refuses are a `retried` return, as Pydantic AI's own
        validation would make them; the server never sees the call."""
        memory = MemorySink()
        gate = Gate("files", sinks=[memory])
        command = upstream_command()
        params = StdioServerParameters(
            command=command[0], args=command[1:], env={**os.environ, "UPSTREAM_ROOT": str(root)}
        )
        async with McpToolset.connect(params, errlog=errlog) as mcp_tools:
            toolset = ScopeToolset(await mcp_tools.attach(gate.agent("files", tools=[])))
            model = scripted([ToolCallPart("write_file", {"path": "note.txt"}, tool_call_id="v1")])
            result = await Agent(model, toolsets=[toolset]).run("write")
        assert outcomes(result.all_messages()) == {"v1": "retried"}
        assert "text" in result.output
        assert effects(root) == []
        assert calls(memory.events) == [("ToolDenied", "write_file", "v1")]
