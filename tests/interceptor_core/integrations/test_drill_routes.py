"""The deny-all drill over the integration routes: the gated MCP client, the MCP proxy and the
LangChain adapter each show one denial per attempt and no effect on the real tools."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any, TextIO

from langchain_core.messages import ToolMessage
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from events import MemorySink
from interceptor_core import Agent, Gate, ModelTurn, ScriptedModel
from interceptor_core.integrations.langchain import gate_tools
from interceptor_core.integrations.mcp import McpToolset
from interceptor_core.messages import call
from interceptor_core.testing import DRILL_INTERCEPTOR, deny_all

from .conftest import effects, upstream_command
from .test_langchain import file_tools
from .test_mcp import proxy_params, read_events, text_of


class TestDrillRoutes:
    async def test_gated_mcp_client_in_the_agent_loop(self, root: Path, errlog: TextIO) -> None:
        """Two parallel MCP calls under the drill: both denied, the server never called."""
        gate = Gate("files", sinks=[MemorySink()])
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
                            call("delete_file", {"path": "old.txt"}),
                        ]
                    ),
                    ModelTurn(text="done"),
                ]
            )
            async with deny_all(gate) as drill:
                result = await Agent(desk, model).run("tidy up")
        assert [r.result.kind for r in result.tool_calls] == ["denied", "denied"]
        assert effects(root) == []
        assert (root / "old.txt").exists()
        assert (drill.report.attempts, drill.report.denials, drill.report.effects) == (2, 2, 0)

    async def test_mcp_proxy_under_the_drill(self, root: Path, tmp_path: Path, errlog: TextIO) -> None:
        """A proxy whose gate runs the drill refuses every call, and the upstream sees none."""
        events = tmp_path / "events.jsonl"
        params = proxy_params(root, events)
        params.args[params.args.index("files_policy:build_gate")] = "files_policy:build_drill_gate"
        async with Client(stdio_client(params, errlog=errlog)) as client:
            replies = [
                await client.call_tool("write_file", {"path": "note.txt", "text": "hi"}),
                await client.call_tool("delete_file", {"path": "old.txt"}),
            ]
        assert [r.is_error for r in replies] == [True, True]
        assert all("deny-all drill" in text_of(r) for r in replies)
        assert effects(root) == []
        found = read_events(events, lambda evs: sum(e.type == "ToolDenied" for e in evs) >= 2)
        denials = [(e.tool, e.decided_by) for e in found if e.type in ("ToolDenied", "Blocked", "ToolUse")]
        assert denials == [("write_file", DRILL_INTERCEPTOR), ("delete_file", DRILL_INTERCEPTOR)]

    async def test_langchain_tools_under_the_drill(self, root: Path) -> None:
        """Wrapped LangChain tools invoked as a ToolNode would: denial messages, no effect."""
        done: list[str] = []
        gate = Gate("files", sinks=[MemorySink()])
        tools = {t.name: t for t in gate_tools(file_tools(root, done), gate=gate, agent="writer")}
        calls: list[dict[str, Any]] = [
            {"id": "c1", "name": "write_file", "args": {"path": "note.txt", "text": "hi"}, "type": "tool_call"},
            {"id": "c2", "name": "delete_file", "args": {"path": "old.txt"}, "type": "tool_call"},
        ]
        async with deny_all(gate) as drill:
            replies = await asyncio.gather(*(tools[c["name"]].ainvoke(c) for c in calls))
        assert all(isinstance(r, ToolMessage) and "deny-all drill" in str(r.content) for r in replies)
        assert done == []
        assert (drill.report.attempts, drill.report.denials, drill.report.effects) == (2, 2, 0)
