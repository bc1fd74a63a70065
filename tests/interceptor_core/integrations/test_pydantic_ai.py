"""Pydantic AI through the gate: `GatedToolset` and `ScopeToolset` (an MCP server's tools, from the
real test server process) with the framework's own FunctionModel, no network."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, TextIO

import anyio
import pytest
from mcp import StdioServerParameters
from pydantic_ai import Agent, ModelRetry
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.toolsets import FunctionToolset

from events import MemorySink
from interceptor_core import Gate, RunContext, ToolBlockedError
from interceptor_core.integrations.mcp import McpToolset
from interceptor_core.integrations.pydantic_ai import GatedToolset, ScopeToolset

from .conftest import effects, upstream_command
from .files_policy import DENIAL, ProtectFiles


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


def scripted(*turns: list[ToolCallPart]) -> FunctionModel:
    """Each turn's tool calls in order, then a final answer listing every tool return seen."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        asked = sum(isinstance(m, ModelResponse) for m in messages)
        if asked < len(turns):
            return ModelResponse(parts=list(turns[asked]))
        return ModelResponse(parts=[TextPart(" | ".join(returns(messages)))])

    return FunctionModel(respond)


class TestGatedToolset:
    async def test_parallel_calls_one_denied(self, root: Path) -> None:
        """Of two parallel calls the write runs and the delete is denied: the model reads the denial,
        the file stays, and each call leaves its event."""
        memory, done = MemorySink(), []
        gate = Gate("files", interceptors=[ProtectFiles()], sinks=[memory])
        toolset = GatedToolset(file_tools(root, done), gate=gate, agent="writer")
        model = scripted(
            [
                ToolCallPart("write_file", {"path": "note.txt", "text": "hi"}),
                ToolCallPart("delete_file", {"path": "precious.txt"}),
            ]
        )
        result = await Agent(model, toolsets=[toolset]).run("tidy up")
        assert result.output == f"write_file: wrote note.txt | delete_file: {DENIAL}"
        assert (root / "precious.txt").read_text() == "keep me"
        assert done == ["write note.txt"]
        assert sorted((e.type, e.tool) for e in memory.events) == [
            ("ToolDenied", "delete_file"),
            ("ToolUse", "write_file"),
            ("ToolsRegistered", None),
        ]
        assert gate.coverage().registered == {"write_file", "delete_file"}

    async def test_retry_passes_the_gate_each_time(self, root: Path) -> None:
        """A tool's ModelRetry still makes the model retry, and each attempt passes the gate."""
        memory, done = MemorySink(), []
        gate = Gate("files", interceptors=[ProtectFiles()], sinks=[memory])
        toolset = GatedToolset(file_tools(root, done), gate=gate)
        model = scripted(
            [ToolCallPart("write_file", {"path": "flaky.txt", "text": "x"})],
            [ToolCallPart("write_file", {"path": "flaky.txt", "text": "x"})],
            [ToolCallPart("delete_file", {"path": "precious.txt"})],
        )
        result = await Agent(model, toolsets=[toolset]).run("write")
        assert (
            result.output == f"write_file: disk busy, try again | write_file: wrote flaky.txt | delete_file: {DENIAL}"
        )
        assert done == ["write flaky.txt"]
        outcomes = [(e.type, e.tool) for e in memory.events if e.type != "ToolsRegistered"]
        assert [kind for kind, _ in outcomes] == ["ToolUse", "ToolUse", "ToolDenied"]
        first = next(e for e in memory.events if e.type == "ToolUse")
        assert first.outcome == "error"
        assert "disk busy" in (first.error or "")

    async def test_block_ends_the_run(self, root: Path) -> None:
        """A Block raises ToolBlockedError out of the run and the tool never runs."""
        done: list[str] = []
        gate = Gate("files", interceptors=[ProtectFiles()])
        toolset = GatedToolset(file_tools(root, done), gate=gate)
        model = scripted([ToolCallPart("delete_file", {"path": "*"})])
        with pytest.raises(ToolBlockedError, match="wildcard"):
            await Agent(model, toolsets=[toolset]).run("delete everything")
        assert done == []


class TestMcpThroughScopeToolset:
    """Pydantic AI's own MCP client needs `fastmcp`; an MCP server reaches its agents through
    `McpToolset` (registration, list changes) and `ScopeToolset`."""

    def test_pydantic_ai_mcp_client_needs_fastmcp(self) -> None:
        """The reason for this route: `pydantic_ai.mcp` does not import without fastmcp."""
        with pytest.raises(ImportError, match="fastmcp"):
            import pydantic_ai.mcp  # noqa: F401

    async def test_parallel_calls_one_denied_and_a_tool_added_later(self, root: Path, errlog: TextIO) -> None:
        """Of two parallel calls the write reaches the server and the delete is denied (the model
        reads why) and never does; a tool the server announces later is offered to the next run,
        registered before its call; a block ends the run."""
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
                    ToolCallPart("write_file", {"path": "note.txt", "text": "hi"}),
                    ToolCallPart("delete_file", {"path": "precious.txt"}),
                ],
                [ToolCallPart("enable_archive", {})],
            )
            result = await Agent(model, toolsets=[toolset]).run("tidy up", deps=acme)
            assert result.output == " | ".join(
                [
                    "write_file: wrote 2 chars to note.txt",
                    f"delete_file: {DENIAL}",
                    "enable_archive: archive_file is available",
                ]
            )
            with anyio.fail_after(20):
                await added.wait()

            offered: list[str] = []

            def archive(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
                offered.extend(t.name for t in info.function_tools)
                if any(isinstance(m, ModelResponse) for m in messages):
                    return ModelResponse(parts=[TextPart(" | ".join(returns(messages)))])
                return ModelResponse(parts=[ToolCallPart("archive_file", {"path": "old.txt"})])

            result = await Agent(FunctionModel(archive), toolsets=[toolset]).run("archive", deps=acme)
            assert result.output == "archive_file: archived old.txt"
            assert "archive_file" in offered

            with pytest.raises(ToolBlockedError, match="wildcard"):
                await Agent(scripted([ToolCallPart("delete_file", {"path": "*"})]), toolsets=[toolset]).run("x")

        assert (root / "precious.txt").read_text() == "keep me"
        assert effects(root) == ["write note.txt", "enable_archive", "archive old.txt"]
        order = [(e.type, [t.name for t in e.tools] if e.type == "ToolsRegistered" else e.tool) for e in memory.events]
        assert order.index(("ToolsRegistered", ["archive_file"])) < order.index(("ToolUse", "archive_file"))
        outcomes = sorted((e.type, e.tool) for e in memory.events if e.type != "ToolsRegistered")
        assert outcomes == [
            ("Blocked", "delete_file"),
            ("ToolDenied", "delete_file"),
            ("ToolUse", "archive_file"),
            ("ToolUse", "enable_archive"),
            ("ToolUse", "write_file"),
        ]
        assert {e.tenant for e in memory.events if e.type == "ToolUse"} == {"acme"}
