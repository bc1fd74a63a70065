"""An agent process for the resume tests: one delete that needs a human, through a framework's own
pause and resume, its events in a JSONL file of its own.

    python paused_agent.py FRAMEWORK pause WORKDIR    # runs until the framework pauses the calls,
                                                      # saves the framework's state, prints "paused"
                                                      # and waits (for a reviewer who never comes)
    python paused_agent.py openai-agents decide WORKDIR   # a reviewer's process: loads the saved
                                                      # state, approves c1 and rejects c2 and c3,
                                                      # saves the decided state, prints "decided"
    python paused_agent.py FRAMEWORK resume WORKDIR   # a new process: loads the saved state,
                                                      # approves c1 and rejects c2 (LangGraph: c1
                                                      # only; OpenAI Agents: decided already), runs
                                                      # to the end, prints the output

FRAMEWORK: openai-agents (a `RunState` as a string; three calls, c3 rejected with the SDK's own
`state.reject`), pydantic-ai (the message history as JSON and `DeferredToolResults`), langgraph
(`create_agent` with a SQLite checkpointer). WORKDIR holds `files/` (old.txt for c1, other.txt for
c2, third.txt for c3), the saved state and `events-<phase>.jsonl`.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

from events import JsonlSink
from interceptor_core import Gate, RequireApproval, RunContext, ToolCall

RUN = RunContext(tenant="acme", principal="u-1", run_id="run-1")
CALLS = [("c1", "old.txt"), ("c2", "other.txt")]
"""The calls the model makes (call id, file to delete): c1 is approved on resume, c2 rejected."""
SDK_REJECTED = ("c3", "third.txt")
"""A third call the OpenAI Agents model makes, rejected with the SDK's own `state.reject`."""
PAUSED = "paused"
DECIDED = "decided"


class DeletesNeedApproval:
    name = "deletes-need-approval"

    def before_tool_call(self, call: ToolCall) -> RequireApproval | None:
        return RequireApproval("deletes need a human") if call.tool_name == "delete_file" else None


def delete_file_in(root: Path) -> Any:
    def delete_file(path: str) -> str:
        """Deletes a file under the root."""
        (root / path).unlink()
        return f"deleted {path}"

    return delete_file


def save(path: Path, text: str) -> None:
    """Written whole or not at all: the process may be killed at any time after."""
    partial = path.with_suffix(".partial")
    partial.write_text(text)
    partial.replace(path)


async def paused(gate: Gate) -> None:
    """The state is saved and the events are on disk: say so, and wait to be killed."""
    await gate.flush()
    print(PAUSED, flush=True)
    await asyncio.Event().wait()


async def openai_agents(gate: Gate, workdir: Path, phase: str) -> str:
    from agents import Agent, RunConfig, Runner, RunState, function_tool
    from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call

    from interceptor_core.integrations.openai_agents import approve, gate_function_tools, reject

    def answer(call: Any) -> list[Any]:
        outputs = [i["output"] for i in call.input if isinstance(i, dict) and i.get("type") == "function_call_output"]
        return [assistant_message(" | ".join(str(o) for o in outputs))]

    steps: list[Any] = [ModelStep.respond(answer)]
    if phase == "pause":
        calls = [*CALLS, SDK_REJECTED]
        steps.insert(0, [function_call("delete_file", {"path": name}, call_id=call_id) for call_id, name in calls])
    tools = gate_function_tools([function_tool(delete_file_in(workdir / "files"))], gate=gate, agent="writer")
    agent = Agent(name="writer", tools=tools, model=ScriptedModel(steps))
    config = RunConfig(tracing_disabled=True)
    state_file = workdir / "run_state.json"
    if phase == "pause":
        result = await Runner.run(agent, "tidy up", context=RUN, run_config=config)
        if not result.interruptions:
            raise SystemExit(f"the run was not paused: {result.final_output!r}")
        save(state_file, result.to_state().to_string())
        await paused(gate)
    state = await RunState.from_string(agent, state_file.read_text(), context_override=RUN)
    if phase == "decide":
        for item in state.get_interruptions():
            if item.call_id == "c1":
                approve(state, item, by="alice", note="looked at it")
            elif item.call_id == "c2":
                await reject(state, item, by="alice", note="not today")
            else:
                state.reject(item, rejection_message="no thanks")
        save(state_file, state.to_string())
        await gate.flush()
        return DECIDED
    result = await Runner.run(agent, state, run_config=config)
    return str(result.final_output)


async def pydantic_ai(gate: Gate, workdir: Path, phase: str) -> str:
    from pydantic_ai import Agent, DeferredToolRequests, DeferredToolResults, ToolDenied
    from pydantic_ai.messages import ModelMessagesTypeAdapter, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel
    from pydantic_ai.toolsets import FunctionToolset

    from interceptor_core.integrations.pydantic_ai import GatedToolset

    def respond(messages: list[Any], info: AgentInfo) -> ModelResponse:
        if not any(isinstance(m, ModelResponse) for m in messages):
            return ModelResponse(
                parts=[ToolCallPart("delete_file", {"path": name}, tool_call_id=i) for i, name in CALLS]
            )
        returns = [str(p.content) for m in messages for p in getattr(m, "parts", []) if isinstance(p, ToolReturnPart)]
        return ModelResponse(parts=[TextPart(" | ".join(returns))])

    toolset = GatedToolset(FunctionToolset([delete_file_in(workdir / "files")]), gate=gate, agent="cleaner", run=RUN)
    agent = Agent(FunctionModel(respond), toolsets=[toolset], output_type=[str, DeferredToolRequests])
    history = workdir / "history.json"
    if phase == "pause":
        first = await agent.run("clean up")
        if not isinstance(first.output, DeferredToolRequests):
            raise SystemExit(f"the run was not paused: {first.output!r}")
        save(history, ModelMessagesTypeAdapter.dump_json(first.all_messages()).decode())
        await paused(gate)
    messages = ModelMessagesTypeAdapter.validate_json(history.read_text())
    results = DeferredToolResults(
        approvals={"c1": True, "c2": ToolDenied("not today")}, metadata={"c1": {"by": "alice"}}
    )
    second = await agent.run(message_history=messages, deferred_tool_results=results)
    return str(second.output)


async def langgraph(gate: Gate, workdir: Path, phase: str) -> str:
    from langchain.agents import create_agent
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage, HumanMessage
    from langchain_core.tools import tool
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
    from langgraph.types import Command

    from interceptor_core.integrations.langchain import CallgateMiddleware

    class ScriptedChat(GenericFakeChatModel):
        def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedChat:  # type: ignore[override]
            return self

    turns = [AIMessage("done")]
    if phase == "pause":
        turns.insert(0, AIMessage("", tool_calls=[{"id": "c1", "name": "delete_file", "args": {"path": "old.txt"}}]))
    tools = [tool(delete_file_in(workdir / "files"))]
    middleware = [CallgateMiddleware(tools, gate=gate, agent="writer", run=RUN)]
    thread: Any = {"configurable": {"thread_id": "t1"}}
    async with AsyncSqliteSaver.from_conn_string(str(workdir / "checkpoints.sqlite")) as saver:
        graph = create_agent(ScriptedChat(messages=iter(turns)), tools=tools, middleware=middleware, checkpointer=saver)
        if phase == "pause":
            out = await graph.ainvoke({"messages": [HumanMessage("tidy up")]}, thread)
            if "__interrupt__" not in out:
                raise SystemExit("the run was not paused")
            await paused(gate)
        answer = {"approved": True, "by": "alice", "call_id": "c1"}
        out = await graph.ainvoke(Command(resume=answer), thread)
    return " | ".join(str(m.content) for m in out["messages"][-2:])


FRAMEWORKS = {"openai-agents": openai_agents, "pydantic-ai": pydantic_ai, "langgraph": langgraph}


async def main(framework: str, phase: str, workdir: Path) -> None:
    gate = Gate("files", interceptors=[DeletesNeedApproval()], sinks=[JsonlSink(workdir / f"events-{phase}.jsonl")])
    try:
        print(await FRAMEWORKS[framework](gate, workdir, phase), flush=True)
    finally:
        await gate.close()


if __name__ == "__main__":
    framework, phase, workdir = sys.argv[1:]
    asyncio.run(main(framework, phase, Path(workdir)))
