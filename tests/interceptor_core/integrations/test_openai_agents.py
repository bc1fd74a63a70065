"""OpenAI Agents SDK through the gate: gated `FunctionTool`s (an agent as a tool included) and a
gated MCP server (the real test server process) in the SDK's own runner, driven by a scripted
model (the SDK's `Model` interface), no network."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, ModelResponse, RunConfig, Runner, Usage, UserError, function_tool
from agents.mcp import MCPServerStdio
from agents.models.interface import Model
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

from events import MemorySink
from interceptor_core import Deny, Gate, RunContext, ToolBlockedError, ToolCall
from interceptor_core.integrations.openai_agents import GatedMCPServer, gate_function_tools

from .conftest import effects, upstream_command
from .files_policy import DENIAL, ProtectFiles

OFFLINE = RunConfig(tracing_disabled=True)


class ScriptedModel(Model):
    """Answers each turn with the scripted tool calls, then with the tool outputs it was sent."""

    def __init__(self, *turns: list[tuple[str, dict[str, Any]]]) -> None:
        self.turns = list(turns)
        self.asked = 0

    async def get_response(self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any) -> ModelResponse:
        self.asked += 1
        if self.asked <= len(self.turns):
            calls = [
                ResponseFunctionToolCall(
                    type="function_call", call_id=f"c{self.asked}-{i}", name=name, arguments=json.dumps(args_)
                )
                for i, (name, args_) in enumerate(self.turns[self.asked - 1])
            ]
            return ModelResponse(output=list(calls), usage=Usage(), response_id=None)
        outputs = [
            output_text(item["output"])
            for item in input
            if isinstance(item, dict) and item.get("type") == "function_call_output"
        ]
        text = ResponseOutputText(type="output_text", text=" | ".join(outputs), annotations=[])
        message = ResponseOutputMessage(id="m", type="message", role="assistant", status="completed", content=[text])
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError


def output_text(output: Any) -> str:
    """What the model was sent as a tool's output: plain text, or the text of content items."""
    if isinstance(output, list):
        return "".join(output_text(item) for item in output)
    if isinstance(output, dict) and output.get("type") in ("text", "input_text"):
        return str(output["text"])
    return str(output)


def file_tools(root: Path, done: list[str]) -> list[Any]:
    @function_tool
    def write_file(path: str, text: str) -> str:
        """Writes text to a file under the root."""
        (root / path).write_text(text)
        done.append(f"write {path}")
        return f"wrote {path}"

    @function_tool
    def delete_file(path: str) -> str:
        """Deletes a file under the root."""
        (root / path).unlink()
        done.append(f"delete {path}")
        return f"deleted {path}"

    return [write_file, delete_file]


class TestGateFunctionTools:
    async def test_parallel_calls_one_denied(self, root: Path) -> None:
        """Of two parallel calls in one turn the write runs and the delete is denied: the model reads
        the denial and the file stays."""
        memory, done = MemorySink(), []
        gate = Gate("files", interceptors=[ProtectFiles()], sinks=[memory])
        tools = gate_function_tools(file_tools(root, done), gate=gate, agent="writer")
        model = ScriptedModel(
            [("write_file", {"path": "note.txt", "text": "hi"}), ("delete_file", {"path": "precious.txt"})]
        )
        result = await Runner.run(Agent(name="writer", tools=tools, model=model), "tidy up", run_config=OFFLINE)
        assert result.final_output == f"wrote note.txt | {DENIAL}"
        assert (root / "precious.txt").read_text() == "keep me"
        assert done == ["write note.txt"]
        assert sorted(e.type for e in memory.events) == ["ToolDenied", "ToolUse", "ToolsRegistered"]

    async def test_block_ends_the_run(self, root: Path) -> None:
        """A Block ends the SDK's run (the SDK wraps the ToolBlockedError in its UserError); the tool
        never runs."""
        done: list[str] = []
        gate = Gate("files", interceptors=[ProtectFiles()])
        tools = gate_function_tools(file_tools(root, done), gate=gate)
        model = ScriptedModel([("delete_file", {"path": "*"})])
        with pytest.raises(UserError, match="wildcard") as stopped:
            await Runner.run(Agent(name="writer", tools=tools, model=model), "delete everything", run_config=OFFLINE)
        assert isinstance(stopped.value.__cause__, ToolBlockedError)
        assert done == []


class TestAgentAsTool:
    async def test_agent_tool_denied_before_the_inner_run(self, root: Path) -> None:
        """An agent turned into a tool (`as_tool`) passes the gate like any function tool: of two
        parallel calls one runs the inner agent (whose write happens), the denied one never starts it."""
        memory, done = MemorySink(), []
        inner_model = ScriptedModel([("write_file", {"path": "note.txt", "text": "hi"})])
        inner = Agent(name="clerk", tools=file_tools(root, done), model=inner_model)

        class NoPreciousDelegation:
            name = "no-precious-delegation"

            def before_tool_call(self, call: ToolCall) -> Deny | None:
                return Deny(DENIAL) if "precious.txt" in call.args.get("input", "") else None

        gate = Gate("files", interceptors=[NoPreciousDelegation()], sinks=[memory])
        tools = gate_function_tools([inner.as_tool("clerk", "Does file chores")], gate=gate, agent="boss")
        model = ScriptedModel([("clerk", {"input": "write note.txt"}), ("clerk", {"input": "delete precious.txt"})])
        result = await Runner.run(Agent(name="boss", tools=tools, model=model), "tidy up", run_config=OFFLINE)
        assert result.final_output == f"wrote note.txt | {DENIAL}"
        assert inner_model.asked == 2  # one inner run: its tool call, then its answer
        assert done == ["write note.txt"]
        assert (root / "precious.txt").read_text() == "keep me"
        assert sorted((e.type, e.tool) for e in memory.events if e.type != "ToolsRegistered") == [
            ("ToolDenied", "clerk"),
            ("ToolUse", "clerk"),
        ]


def mcp_server(root: Path) -> MCPServerStdio:
    """The SDK's own stdio client of the real test MCP server."""
    command = upstream_command()
    env = {**os.environ, "UPSTREAM_ROOT": str(root)}
    return MCPServerStdio({"command": command[0], "args": command[1:], "env": env}, name="files")


class TestGatedMCPServer:
    async def test_parallel_calls_one_denied(self, root: Path) -> None:
        """The SDK's MCP route, wrapped: of two parallel calls the write reaches the server and the
        delete is denied (the model reads why) and never does; events name the run's context and
        the SDK's call ids, after the tools' registration."""
        memory = MemorySink()
        gate = Gate("files", interceptors=[ProtectFiles()], sinks=[memory])
        acme = RunContext(tenant="acme", principal="u-1")
        model = ScriptedModel(
            [("write_file", {"path": "note.txt", "text": "hi"}), ("delete_file", {"path": "precious.txt"})]
        )
        async with GatedMCPServer(mcp_server(root), gate=gate, agent="writer") as files:
            agent = Agent(name="writer", mcp_servers=[files], model=model)
            result = await Runner.run(agent, "tidy up", context=acme, run_config=OFFLINE)
        assert result.final_output == f"wrote 2 chars to note.txt | {DENIAL}"
        assert (root / "precious.txt").read_text() == "keep me"
        assert effects(root) == ["write note.txt"]
        registered, *outcomes = memory.events
        assert registered.type == "ToolsRegistered"
        assert [t.name for t in registered.tools] == ["write_file", "delete_file", "enable_archive"]
        assert sorted((e.type, e.tool, e.call_id, e.tenant) for e in outcomes) == [
            ("ToolDenied", "delete_file", "c1-1", "acme"),
            ("ToolUse", "write_file", "c1-0", "acme"),
        ]
        assert gate.coverage().registered == {"write_file", "delete_file", "enable_archive"}

    async def test_block_ends_the_run(self, root: Path) -> None:
        """A Block ends the run even though the SDK turns MCP tool failures into text for the
        model; the server never sees the call."""
        gate = Gate("files", interceptors=[ProtectFiles()])
        model = ScriptedModel([("delete_file", {"path": "*"})])
        async with GatedMCPServer(mcp_server(root), gate=gate) as files:
            agent = Agent(name="writer", mcp_servers=[files], model=model)
            with pytest.raises(UserError, match="wildcard") as stopped:
                await Runner.run(agent, "delete everything", run_config=OFFLINE)
        assert isinstance(stopped.value.__cause__, ToolBlockedError)
        assert model.asked == 1
        assert effects(root) == []
