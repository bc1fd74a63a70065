"""The MCP routes through the gate: `callgate mcp-proxy` and the gated client (`McpToolset`),
each against a real MCP server process that records its effects."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import anyio
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.subscriptions import listen
from mcp.shared.exceptions import MCPError

from events import MemorySink, parse_event, verify_chain
from interceptor_core import Agent, Gate, ModelTurn, ScriptedModel, ToolBlockedError
from interceptor_core.integrations.mcp import CROSSING_TOOLS, McpToolset, result_from_gate
from interceptor_core.messages import call
from interceptor_core.results import ToolResult

from .conftest import HERE, effects, upstream_command
from .files_policy import DENIAL, SUBSTITUTE, ProtectFiles

DEADLINE_S = 20.0


def text_of(result: types.CallToolResult) -> str:
    return "\n".join(b.text for b in result.content if isinstance(b, types.TextContent))


def read_events(path: Path, until: Any) -> list[Any]:
    """The proxy's events once `until(events)` holds (it writes from a background thread)."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        lines = path.read_text().splitlines() if path.exists() else []
        parsed = [parse_event(line) for line in lines if line.strip()]
        if until(parsed) or time.monotonic() > deadline:
            return parsed
        time.sleep(0.02)  # sleep-ok: polling a file another process writes, with a deadline


def proxy_params(root: Path, events: Path, *extra: str) -> StdioServerParameters:
    env = {**os.environ, "UPSTREAM_ROOT": str(root), "PYTHONPATH": str(HERE)}
    return StdioServerParameters(
        command=sys.executable,
        args=[
            "-m",
            "callgate.cli",
            "mcp-proxy",
            "--gate",
            "files_policy:build_gate",
            "--events",
            str(events),
            *extra,
            "--",
            *upstream_command(),
        ],
        env=env,
    )


class TestResultFromGate:
    def test_denial_is_an_error_result_with_the_message(self) -> None:
        """A denied call becomes a tool result with isError and the denial message."""
        result = result_from_gate(ToolResult(kind="denied", message=DENIAL))
        assert result.is_error
        assert text_of(result) == DENIAL

    def test_substitute_object_is_text_and_structured(self) -> None:
        """A substituted object becomes JSON text plus structuredContent."""
        result = result_from_gate(ToolResult(kind="substituted", value={"n": 1}))
        assert not result.is_error
        assert json.loads(text_of(result)) == {"n": 1}
        assert result.structured_content == {"n": 1}


class TestProxy:
    async def test_every_decision_over_stdio(self, root: Path, tmp_path: Path, errlog: TextIO) -> None:
        """Through the proxy: listed tools, an allowed write, a denied delete and a substitute that never
        reach the upstream, a block as a protocol error, and one event per decision."""
        events = tmp_path / "events.jsonl"
        async with Client(stdio_client(proxy_params(root, events), errlog=errlog)) as client:
            listed = await client.list_tools()
            assert {t.name for t in listed.tools} == {"write_file", "delete_file", "enable_archive"}
            schema = next(t for t in listed.tools if t.name == "write_file").input_schema
            assert schema["required"] == ["path", "text"]

            ok = await client.call_tool("write_file", {"path": "note.txt", "text": "hi"})
            assert not ok.is_error
            assert text_of(ok) == "wrote 2 chars to note.txt"
            denied = await client.call_tool("delete_file", {"path": "precious.txt"})
            assert denied.is_error
            assert text_of(denied) == DENIAL
            substituted = await client.call_tool("write_file", {"path": "dry-run.txt", "text": "x"})
            assert not substituted.is_error
            assert text_of(substituted) == SUBSTITUTE
            with pytest.raises(MCPError, match="wildcard delete requested"):
                await client.call_tool("delete_file", {"path": "*"})
            invalid = await client.call_tool("delete_file", {"file": "old.txt"})
            assert invalid.is_error
            assert "'path' is a required property" in text_of(invalid)

        assert (root / "precious.txt").read_text() == "keep me"
        assert not (root / "dry-run.txt").exists()
        assert effects(root) == ["write note.txt"]
        found = read_events(events, lambda evs: sum(e.type != "ToolsRegistered" for e in evs) >= 5)
        outcomes = [(e.type, e.tool) for e in found if e.type != "ToolsRegistered"]
        assert outcomes == [
            ("ToolUse", "write_file"),
            ("ToolDenied", "delete_file"),
            ("Substitute", "write_file"),
            ("Blocked", "delete_file"),
            ("ToolDenied", "delete_file"),
        ]
        registered = [e for e in found if e.type == "ToolsRegistered"]
        # The upstream's tools, then the gate tools of the other crossings it can take.
        assert [t.name for t in registered[0].tools] == ["write_file", "delete_file", "enable_archive", *CROSSING_TOOLS]
        assert verify_chain(found).ok

    async def test_tools_added_later_are_registered_before_their_first_call(
        self, root: Path, tmp_path: Path, errlog: TextIO
    ) -> None:
        """A tool the upstream announces later is passed on to the client as a list change, and its
        ToolsRegistered event precedes its first call through the gate."""
        events = tmp_path / "events.jsonl"
        async with Client(stdio_client(proxy_params(root, events), errlog=errlog)) as client:
            heard = anyio.Event()

            async def follow(*, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
                async with listen(client.session, tools_list_changed=True) as changes:
                    task_status.started()
                    async for _ in changes:
                        heard.set()

            async with anyio.create_task_group() as tasks:
                await tasks.start(follow)
                await client.call_tool("enable_archive", {})
                with anyio.fail_after(DEADLINE_S):
                    await heard.wait()
                listed = await client.list_tools()
                assert "archive_file" in {t.name for t in listed.tools}
                archived = await client.call_tool("archive_file", {"path": "old.txt"})
                assert not archived.is_error, text_of(archived)
                tasks.cancel_scope.cancel()

        assert (root / "old.txt.archived").exists()
        found = read_events(events, lambda evs: any(e.type == "ToolUse" and e.tool == "archive_file" for e in evs))
        order = [(e.type, [t.name for t in e.tools] if e.type == "ToolsRegistered" else e.tool) for e in found]
        assert order.index(("ToolsRegistered", ["archive_file"])) < order.index(("ToolUse", "archive_file"))


class TestGatedClient:
    async def test_agent_calls_mcp_tools_through_the_chain(self, root: Path, errlog: TextIO) -> None:
        """In the agent loop, MCP tools meet the chain like local tools: of two parallel calls the
        write runs, the delete is denied (the model reads why) and never reaches the server."""
        memory = MemorySink()
        gate = Gate("files", interceptors=[ProtectFiles()], sinks=[memory])
        params = StdioServerParameters(
            command=upstream_command()[0], args=upstream_command()[1:], env={**os.environ, "UPSTREAM_ROOT": str(root)}
        )
        async with McpToolset.connect(params, errlog=errlog) as mcp_tools:
            desk = await mcp_tools.attach(gate.agent("desk", tools=[]))
            model = ScriptedModel(
                [
                    ModelTurn(
                        tool_calls=[
                            call("write_file", {"path": "note.txt", "text": "hi"}),
                            call("delete_file", {"path": "precious.txt"}),
                        ]
                    ),
                    lambda messages: ModelTurn(text=" | ".join(m.content or "" for m in messages[-2:])),
                ]
            )
            result = await Agent(desk, model).run("tidy up")
            assert result.output == f"wrote 2 chars to note.txt | {DENIAL}"
            assert {t["name"] for t in model.calls[0][1]} == {"write_file", "delete_file", "enable_archive"}

            with pytest.raises(ToolBlockedError, match="wildcard"):
                await Agent(desk, ScriptedModel([ModelTurn(tool_calls=[call("delete_file", {"path": "*"})])])).run("x")

        assert (root / "precious.txt").read_text() == "keep me"
        assert effects(root) == ["write note.txt"]
        outcomes = sorted((e.type, e.tool) for e in memory.events if e.type != "ToolsRegistered")
        assert outcomes == [("Blocked", "delete_file"), ("ToolDenied", "delete_file"), ("ToolUse", "write_file")]
        assert gate.coverage().registered == {"write_file", "delete_file", "enable_archive"}

    async def test_list_change_registers_new_tools_in_the_scope(self, root: Path, errlog: TextIO) -> None:
        """After the server announces a tool, it is in the agent's scope with a ToolsRegistered event,
        and the next run can call it through the gate."""
        memory = MemorySink()
        gate = Gate("files", sinks=[memory])
        params = StdioServerParameters(
            command=upstream_command()[0], args=upstream_command()[1:], env={**os.environ, "UPSTREAM_ROOT": str(root)}
        )
        async with McpToolset.connect(params, errlog=errlog) as mcp_tools:
            added = anyio.Event()
            mcp_tools.on_change(lambda new: added.set())
            desk = await mcp_tools.attach(gate.agent("desk", tools=[]))
            assert (await desk.call("enable_archive", {})).ok
            with anyio.fail_after(DEADLINE_S):
                await added.wait()
            assert "archive_file" in desk.tools
            assert (await desk.call("archive_file", {"path": "old.txt"})).ok

        registered = [[t.name for t in e.tools] for e in memory.events if e.type == "ToolsRegistered"]
        assert ["archive_file"] in registered
        assert "archive_file" in gate.coverage().registered
        assert effects(root) == ["enable_archive", "archive old.txt"]
