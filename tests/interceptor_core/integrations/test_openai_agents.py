"""OpenAI Agents SDK through the gate: gated `FunctionTool`s in the SDK's own runner, driven by a
scripted model (the SDK's `Model` interface), no network."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, ModelResponse, RunConfig, Runner, Usage, UserError, function_tool
from agents.models.interface import Model
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

from events import MemorySink
from interceptor_core import Gate, ToolBlockedError
from interceptor_core.integrations.openai_agents import gate_function_tools

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
            str(item["output"])
            for item in input
            if isinstance(item, dict) and item.get("type") == "function_call_output"
        ]
        text = ResponseOutputText(type="output_text", text=" | ".join(outputs), annotations=[])
        message = ResponseOutputMessage(id="m", type="message", role="assistant", status="completed", content=[text])
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError


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
