"""LangChain through the gate: wrapped `BaseTool`s driven by langchain-core's own fake chat model."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import BaseTool, tool

from events import MemorySink
from interceptor_core import Gate, RunContext, ToolBlockedError
from interceptor_core.integrations.langchain import RUN_CONFIG_KEY, gate_tools

from .files_policy import DENIAL, ProtectFiles


def file_tools(root: Path, done: list[str]) -> list[BaseTool]:
    @tool
    def write_file(path: str, text: str) -> str:
        """Writes text to a file under the root."""
        (root / path).write_text(text)
        done.append(f"write {path}")
        return f"wrote {path}"

    @tool
    def delete_file(path: str) -> str:
        """Deletes a file under the root."""
        (root / path).unlink()
        done.append(f"delete {path}")
        return f"deleted {path}"

    return [write_file, delete_file]


class TestGateTools:
    async def test_parallel_tool_calls_of_a_model_turn(self, root: Path) -> None:
        """The model's two parallel tool calls run as a ToolNode would: the write runs, the delete
        becomes the ToolMessage with the denial, and the file stays."""
        memory, done = MemorySink(), []
        gate = Gate("files", interceptors=[ProtectFiles()], sinks=[memory])
        tools = {t.name: t for t in gate_tools(file_tools(root, done), gate=gate, agent="writer")}
        model = FakeMessagesListChatModel(
            responses=[
                AIMessage(
                    content="",
                    tool_calls=[
                        {"id": "c1", "name": "write_file", "args": {"path": "note.txt", "text": "hi"}},
                        {"id": "c2", "name": "delete_file", "args": {"path": "precious.txt"}},
                    ],
                )
            ]
        )
        turn = await model.ainvoke("tidy up")
        assert isinstance(turn, AIMessage)
        replies = await asyncio.gather(*(tools[c["name"]].ainvoke({**c, "type": "tool_call"}) for c in turn.tool_calls))
        assert all(isinstance(r, ToolMessage) for r in replies)
        assert [(r.tool_call_id, r.content) for r in replies] == [("c1", "wrote note.txt"), ("c2", DENIAL)]
        assert (root / "precious.txt").read_text() == "keep me"
        assert done == ["write note.txt"]
        assert sorted(e.type for e in memory.events) == ["ToolDenied", "ToolUse", "ToolsRegistered"]

    def test_sync_invoke_batch_and_retry(self, root: Path) -> None:
        """Sync invoke, batch (threads) and with_retry all pass the gate: every denial is an output,
        never an effect."""
        done: list[str] = []
        gate = Gate("files", interceptors=[ProtectFiles()])
        _, delete = gate_tools(file_tools(root, done), gate=gate)
        assert delete.invoke({"path": "precious.txt"}) == DENIAL
        assert delete.batch([{"path": "old.txt"}, {"path": "precious.txt"}]) == ["deleted old.txt", DENIAL]
        assert delete.with_retry(stop_after_attempt=3).invoke({"path": "precious.txt"}) == DENIAL
        with pytest.raises(ToolBlockedError, match="wildcard"):
            delete.invoke({"path": "*"})
        assert (root / "precious.txt").read_text() == "keep me"
        assert done == ["delete old.txt"]

    async def test_run_context_from_the_config(self, root: Path) -> None:
        """A RunContext passed in the invocation's config is the one the gate's events carry."""
        memory = MemorySink()
        gate = Gate("files", sinks=[memory])
        write, _ = gate_tools(file_tools(root, []), gate=gate)
        acme = RunContext(tenant="acme", principal="u-1")
        await write.ainvoke({"path": "a.txt", "text": "x"}, config={"configurable": {RUN_CONFIG_KEY: acme}})
        used = next(e for e in memory.events if e.type == "ToolUse")
        assert (used.tenant, used.run_id) == ("acme", acme.run_id)
