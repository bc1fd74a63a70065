"""LangChain and LangGraph through the gate: `create_agent` with `CallgateMiddleware`, a LangGraph
`ToolNode` of `gate_tools` tools, and the tools invoked by hand, all driven by langchain-core's own
fake chat model; every test checks the effects, the messages the model reads and the events."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import ToolRetryMiddleware
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, InjectedToolCallId, StructuredTool, ToolException, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import InjectedState, ToolNode, ToolRuntime, tools_condition
from langgraph.types import Command, interrupt
from pydantic import BaseModel, Field, ValidationError

from events import EventBase, MemorySink, verify_chain
from events.chain import Producer, new_event_id
from events.decisions import sign_decision
from events.models import ZERO_HASH, ApprovalResolvedEvent
from events.signing import SigningKey
from interceptor_core import (
    Approval,
    ApprovalRequest,
    Deny,
    Gate,
    RequireApproval,
    Rewrite,
    RunContext,
    ToolApprovalRequiredError,
    ToolBlockedError,
    ToolCall,
)
from interceptor_core.approvals import RemoteApprovals
from interceptor_core.integrations.langchain import (
    APPROVAL_INTERRUPT,
    RUN_CONFIG_KEY,
    CallgateMiddleware,
    gate_tools,
)

from .files_policy import DENIAL, SUBSTITUTE, ProtectFiles

OUTCOMES = {"ToolUse", "ToolDenied", "Substitute", "Blocked"}


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


@tool
def read_file(path: str) -> str:
    """Reads a file (there is none: it always fails)."""
    raise FileNotFoundError(path)


def _missing(exc: ToolException) -> str:
    return f"cannot read: {exc}"


@tool
def read_note(path: str) -> str:
    """Reads a note (there is none: it fails, and the tool's own handle_tool_error answers)."""
    raise ToolException(f"no note {path}")


read_note.handle_tool_error = _missing


class ScriptedChat(GenericFakeChatModel):
    """langchain-core's fake chat model, which `create_agent` can bind tools to."""

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedChat:  # type: ignore[override]
        return self


def chat(*turns: AIMessage) -> ScriptedChat:
    return ScriptedChat(messages=iter([*turns, AIMessage("done")]))


def turn(*calls: tuple[str, str, dict[str, Any]]) -> AIMessage:
    """A model turn making the tool calls `(id, name, args)`, in parallel."""
    return AIMessage("", tool_calls=[{"id": id_, "name": name, "args": args} for id_, name, args in calls])


TIDY_UP = turn(
    ("c1", "write_file", {"path": "note.txt", "text": "hi"}),
    ("c2", "delete_file", {"path": "precious.txt"}),
    ("c3", "read_note", {"path": "missing.txt"}),
)


def replies(messages: Sequence[AnyMessage]) -> dict[str, tuple[str, Any]]:
    """The ToolMessages the model reads, by tool call id: (status, content)."""
    return {m.tool_call_id: (m.status, m.content) for m in messages if isinstance(m, ToolMessage)}


def outcomes(memory: MemorySink) -> dict[str, str]:
    """Each call's one outcome event type, by call id (a second outcome of a call fails)."""
    found: dict[str, str] = {}
    for event in memory.events:
        if event.type in OUTCOMES:
            call_id = event.call_id  # type: ignore[attr-defined]
            assert call_id not in found, f"two outcomes for {call_id}"
            found[call_id] = event.type
    return found


def assert_tidy_up(root: Path, done: list[str], messages: Sequence[AnyMessage], memory: MemorySink) -> None:
    """The write ran, the denied delete had no effect and the model read the denial, the failing
    read is the error message its own handle_tool_error made; one outcome per call, under the
    model's ids; the chain verifies."""
    assert (root / "note.txt").read_text() == "hi"
    assert (root / "precious.txt").read_text() == "keep me"
    assert done == ["write note.txt"]
    got = replies(messages)
    assert got["c1"] == ("success", "wrote note.txt")
    assert got["c2"] == ("error", DENIAL)
    assert got["c3"] == ("error", "cannot read: no note missing.txt")
    assert outcomes(memory) == {"c1": "ToolUse", "c2": "ToolDenied", "c3": "ToolUse"}
    failed = next(e for e in memory.events if e.call_id == "c3")
    assert failed.outcome == "error"  # type: ignore[attr-defined]
    assert "no note missing.txt" in (failed.error or "")  # type: ignore[attr-defined]
    assert verify_chain(memory.events).ok


def flaky_tool(tries: list[str]) -> BaseTool:
    """A tool that fails twice, then answers; each attempt's key lands in `tries`."""

    @tool
    def flaky(key: str) -> str:
        """Fails twice, then answers."""
        tries.append(key)
        if len(tries) < 3:
            raise ConnectionError("try again")
        return f"value of {key}"

    return flaky


def agent_for(model: ScriptedChat, tools: list[BaseTool], gate: Gate, **kwargs: Any) -> Any:
    return create_agent(model, tools=tools, middleware=[CallgateMiddleware(tools, gate=gate, agent="writer", **kwargs)])


class TestCallgateMiddleware:
    async def test_parallel_calls_of_a_create_agent_run(self, root: Path) -> None:
        """Three parallel calls of one model turn: allowed, denied, raising; the run goes on."""
        memory, done = MemorySink(), []
        gate = Gate("files", interceptors=[ProtectFiles()], sinks=[memory])
        agent = agent_for(chat(TIDY_UP), [*file_tools(root, done), read_note], gate)
        out = await agent.ainvoke({"messages": [HumanMessage("tidy up")]})
        assert out["messages"][-1].content == "done"
        assert_tidy_up(root, done, out["messages"], memory)

    def test_the_same_run_sync(self, root: Path) -> None:
        """`agent.invoke` takes the sync hook, with the same answers and events."""
        memory, done = MemorySink(), []
        gate = Gate("files", interceptors=[ProtectFiles()], sinks=[memory])
        agent = agent_for(chat(TIDY_UP), [*file_tools(root, done), read_note], gate)
        out = agent.invoke({"messages": [HumanMessage("tidy up")]})
        assert_tidy_up(root, done, out["messages"], memory)

    async def test_sync_invoke_inside_a_running_loop(self, root: Path) -> None:
        """A sync `agent.invoke` from async code (a loop runs in the thread) does not raise."""
        memory, done = MemorySink(), []
        gate = Gate("files", interceptors=[ProtectFiles()], sinks=[memory])
        agent = agent_for(chat(TIDY_UP), [*file_tools(root, done), read_note], gate)
        out = agent.invoke({"messages": [HumanMessage("tidy up")]})
        assert_tidy_up(root, done, out["messages"], memory)

    @pytest.mark.parametrize("sync", [False, True])
    async def test_a_raising_tool_ends_the_run_as_it_does_ungated(self, root: Path, sync: bool) -> None:
        """A tool's own exception ends a `create_agent` run, gated as ungated; the gate recorded
        the call's error outcome first, and the denied call of the same turn still reached the
        model as a denial."""
        read = ("c1", "read_file", {"path": "missing.txt"})
        memory = MemorySink()
        gate = Gate("files", interceptors=[ProtectFiles()], sinks=[memory])
        ungated = create_agent(chat(turn(read)), tools=[read_file])
        both = turn(read, ("c2", "delete_file", {"path": "precious.txt"}))
        gated = agent_for(chat(both), [*file_tools(root, []), read_file], gate)
        for agent in (ungated, gated):
            given = {"messages": [HumanMessage("read it")]}
            with pytest.raises(FileNotFoundError, match=r"missing\.txt"):
                agent.invoke(given) if sync else await agent.ainvoke(given)
        assert outcomes(memory) == {"c1": "ToolUse", "c2": "ToolDenied"}
        assert memory.of_type("ToolUse")[0].outcome == "error"
        assert (root / "precious.txt").read_text() == "keep me"

    @pytest.mark.parametrize("sync", [False, True])
    async def test_a_retry_middleware_retries_and_each_attempt_is_a_call(self, sync: bool) -> None:
        """`ToolRetryMiddleware` listed before the gate's retries a gated tool's exception; each
        attempt passes the chain and is its own call (`c1`, `c1#2`, `c1#3`)."""
        tries: list[str] = []
        flaky = flaky_tool(tries)

        memory = MemorySink()
        retry = ToolRetryMiddleware(max_retries=2, initial_delay=0, jitter=False)
        gated = CallgateMiddleware([flaky], gate=Gate("g", sinks=[memory]))
        agent = create_agent(chat(turn(("c1", "flaky", {"key": "k"}))), tools=[flaky], middleware=[retry, gated])
        given = {"messages": [HumanMessage("get it")]}
        out = agent.invoke(given) if sync else await agent.ainvoke(given)
        assert replies(out["messages"]) == {"c1": ("success", "value of k")}
        assert tries == ["k", "k", "k"]
        used = [(e.call_id, e.outcome) for e in memory.of_type("ToolUse")]
        assert used == [("c1", "error"), ("c1#2", "error"), ("c1#3", "ok")]

    async def test_registration_and_coverage(self, root: Path) -> None:
        """The tools are registered in the scope when the middleware is built, before any call;
        the agent's own tool list is unchanged (the middleware adds none)."""
        memory = MemorySink()
        gate = Gate("files", sinks=[memory])
        tools = file_tools(root, [])
        middleware = CallgateMiddleware(tools, gate=gate, agent="writer")
        assert [e.type for e in memory.events] == ["ToolsRegistered"]
        assert sorted(middleware.scope.tools) == ["delete_file", "write_file"]
        assert getattr(middleware, "tools", []) == []
        out = await create_agent(
            chat(turn(("c1", "write_file", {"path": "a.txt", "text": "x"}))), tools=tools, middleware=[middleware]
        ).ainvoke({"messages": [HumanMessage("write")]})
        assert replies(out["messages"]) == {"c1": ("success", "wrote a.txt")}
        assert gate.coverage().ok

    async def test_substitute_and_block(self, root: Path) -> None:
        """A substitute is the message and nothing is written; a block ends the run."""
        memory, done = MemorySink(), []
        gate = Gate("files", interceptors=[ProtectFiles()], sinks=[memory])
        dry = turn(("c1", "write_file", {"path": "dry-run.txt", "text": "x"}))
        out = await agent_for(chat(dry), file_tools(root, done), gate).ainvoke({"messages": [HumanMessage("x")]})
        assert replies(out["messages"]) == {"c1": ("success", SUBSTITUTE)}
        wildcard = turn(("c2", "delete_file", {"path": "*"}))
        with pytest.raises(ToolBlockedError, match="wildcard"):
            await agent_for(chat(wildcard), file_tools(root, done), gate).ainvoke({"messages": [HumanMessage("x")]})
        assert done == []
        assert not (root / "dry-run.txt").exists()
        assert outcomes(memory) == {"c1": "Substitute", "c2": "Blocked"}

    async def test_a_rewrite_reaches_the_tool(self, root: Path) -> None:
        """The chain's rewritten arguments are the ones the tool runs with."""
        done: list[str] = []

        class IntoDrafts:
            name = "into-drafts"

            def before_tool_call(self, call: ToolCall) -> Rewrite | None:
                return Rewrite({**call.args, "path": f"draft-{call.args['path']}"})

        gate = Gate("files", interceptors=[IntoDrafts()])
        call = turn(("c1", "write_file", {"path": "a.txt", "text": "x"}))
        out = await agent_for(chat(call), file_tools(root, done), gate).ainvoke({"messages": [HumanMessage("x")]})
        assert replies(out["messages"]) == {"c1": ("success", "wrote draft-a.txt")}
        assert done == ["write draft-a.txt"]

    async def test_invalid_arguments_are_langchains_error(self, root: Path) -> None:
        """LangChain's own validation answers invalid arguments; the call is an error outcome."""
        memory, done = MemorySink(), []
        gate = Gate("files", sinks=[memory])
        bad = turn(("c1", "write_file", {"path": "a.txt"}))
        out = await agent_for(chat(bad), file_tools(root, done), gate).ainvoke({"messages": [HumanMessage("x")]})
        status, content = replies(out["messages"])["c1"]
        assert status == "error"
        assert "text" in content
        assert "Field required" in content
        assert done == []
        assert outcomes(memory) == {"c1": "ToolUse"}

    async def test_an_unknown_tool_is_the_gates_error(self, root: Path) -> None:
        """A call of a tool the middleware was not given never runs, and is recorded."""
        memory, done = MemorySink(), []
        gate = Gate("files", sinks=[memory])
        write, delete = file_tools(root, done)
        agent = create_agent(
            chat(turn(("c1", "delete_file", {"path": "old.txt"}))),
            tools=[write, delete],
            middleware=[CallgateMiddleware([write], gate=gate)],
        )
        out = await agent.ainvoke({"messages": [HumanMessage("x")]})
        status, content = replies(out["messages"])["c1"]
        assert status == "error"
        assert "Unknown tool 'delete_file'" in content
        assert (root / "old.txt").exists()
        assert done == []
        assert outcomes(memory) == {"c1": "ToolDenied"}

    async def test_run_context_from_the_agent_context_or_the_config(self, root: Path) -> None:
        """The agent's `context=` RunContext is the one the events carry; the config's wins."""
        memory = MemorySink()
        gate = Gate("files", sinks=[memory])
        acme, globex = RunContext(tenant="acme"), RunContext(tenant="globex")
        call = turn(("c1", "write_file", {"path": "a.txt", "text": "x"}))
        await agent_for(chat(call), file_tools(root, []), gate).ainvoke({"messages": [HumanMessage("x")]}, context=acme)
        call = turn(("c2", "write_file", {"path": "b.txt", "text": "x"}))
        await agent_for(chat(call), file_tools(root, []), gate).ainvoke(
            {"messages": [HumanMessage("x")]}, {"configurable": {RUN_CONFIG_KEY: globex}}, context=acme
        )
        used = {e.call_id: e.tenant for e in memory.events if e.type == "ToolUse"}  # type: ignore[attr-defined]
        assert used == {"c1": "acme", "c2": "globex"}


def tool_node_graph(
    model: ScriptedChat, tools: Sequence[BaseTool], checkpointer: InMemorySaver | None = None, *, handle: bool = False
) -> Any:
    """The classic LangGraph agent: a model node, and a ToolNode while the model calls tools (one
    that answers every tool error when `handle`, else LangGraph's default: invalid arguments only)."""

    def call_model(state: MessagesState) -> dict[str, list[AnyMessage]]:
        return {"messages": [model.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", call_model)
    graph.add_node("tools", ToolNode(tools, handle_tool_errors=True) if handle else ToolNode(tools))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition, ["tools", END])
    graph.add_edge("tools", "agent")
    return graph.compile(checkpointer=checkpointer)


class TestToolNode:
    async def test_parallel_calls_through_a_tool_node(self, root: Path) -> None:
        """A LangGraph graph whose ToolNode holds the gated tools: the same answers and events."""
        memory, done = MemorySink(), []
        gate = Gate("files", interceptors=[ProtectFiles()], sinks=[memory])
        tools = gate_tools([*file_tools(root, done), read_note], gate=gate, agent="writer")
        out = await tool_node_graph(chat(TIDY_UP), tools).ainvoke({"messages": [HumanMessage("tidy up")]})
        assert out["messages"][-1].content == "done"
        assert_tidy_up(root, done, out["messages"], memory)

    def test_the_same_graph_sync(self, root: Path) -> None:
        """The sync graph runs the calls on its worker threads, through the gate's sync path."""
        memory, done = MemorySink(), []
        gate = Gate("files", interceptors=[ProtectFiles()], sinks=[memory])
        tools = gate_tools([*file_tools(root, done), read_note], gate=gate, agent="writer")
        out = tool_node_graph(chat(TIDY_UP), tools).invoke({"messages": [HumanMessage("tidy up")]})
        assert_tidy_up(root, done, out["messages"], memory)

    @pytest.mark.parametrize("handle", [False, True])
    async def test_a_raising_tool_in_a_tool_node_as_ungated(self, handle: bool) -> None:
        """A ToolNode told to handle every tool error gives the model its own error text for the
        gated tool as for the original; a default ToolNode raises, gated as ungated."""
        memory = MemorySink()
        gated = gate_tools([read_file], gate=Gate("g", sinks=[memory]))
        answers = []
        for tools in ([read_file], gated):
            graph = tool_node_graph(chat(turn(("r1", "read_file", {"path": "missing.txt"}))), tools, handle=handle)
            given = {"messages": [HumanMessage("read it")]}
            if handle:
                answers.append(replies((await graph.ainvoke(given))["messages"]))
            else:
                with pytest.raises(FileNotFoundError):
                    await graph.ainvoke(given)
        if handle:
            assert answers[0] == answers[1]
            assert answers[0]["r1"][0] == "error"
        assert [(e.call_id, e.outcome) for e in memory.of_type("ToolUse")] == [("r1", "error")]


class Shout(BaseModel):
    text: str = Field(description="What to shout")


@tool(args_schema=Shout)
def shout(text: str) -> str:
    """Shouts the text."""
    return text.upper()


@tool
def remember(fact: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> Command[Any]:
    """Stores a fact in the agent's state, answering the call itself."""
    return Command(update={"messages": [ToolMessage(f"noted: {fact}", tool_call_id=tool_call_id)]})


@tool(response_format="content_and_artifact")
def search(query: str) -> tuple[str, list[dict[str, Any]]]:
    """Searches; the model reads a summary, the application keeps the hits."""
    return f"2 hits for {query}", [{"id": 1}, {"id": 2}]


def a_call(name: str, args: dict[str, Any], id_: str = "k1") -> dict[str, Any]:
    return {"type": "tool_call", "id": id_, "name": name, "args": args}


class TestGatedTool:
    def test_the_originals_schema_is_kept(self) -> None:
        """`args_schema` is the original's pydantic model, and what the model sees is unchanged."""
        (gated,) = gate_tools([shout], gate=Gate("g"))
        assert gated.args_schema is Shout
        assert gated.args_schema.model_json_schema() == Shout.model_json_schema()
        assert gated.tool_call_schema.model_json_schema() == shout.tool_call_schema.model_json_schema()  # type: ignore[union-attr]
        assert gated.original is shout
        assert gated.scope.tools["shout"].definition()["input_schema"]["properties"] == {
            "text": {"description": "What to shout", "title": "Text", "type": "string"}
        }

    def test_a_json_schema_tool_is_checked_by_the_gate(self) -> None:
        """LangChain does not check a JSON Schema `args_schema`: the gate does, and an invalid call
        never reaches the tool."""
        ran: list[dict[str, Any]] = []

        def set_quota(**kwargs: Any) -> str:
            ran.append(kwargs)
            return "set"

        schema = {"type": "object", "properties": {"quota": {"type": "integer"}}, "required": ["quota"]}
        original = StructuredTool(name="set_quota", description="Sets the quota.", args_schema=schema, func=set_quota)
        (gated,) = gate_tools([original], gate=Gate("g"))
        assert gated.args_schema == schema
        assert gated.invoke(a_call("set_quota", {"quota": 5})).content == "set"
        refused = gated.invoke(a_call("set_quota", {"quota": "lots"}))
        assert refused.status == "error"
        assert "'lots' is not of type 'integer'" in refused.content
        assert ran == [{"quota": 5}]

    def test_injected_tool_call_id_and_command(self) -> None:
        """A tool taking the call's id runs, and its Command comes back as it would ungated."""
        memory = MemorySink()
        (gated,) = gate_tools([remember], gate=Gate("g", sinks=[memory]))
        assert "tool_call_id" not in gated.tool_call_schema.model_json_schema()["properties"]  # type: ignore[union-attr]
        got = gated.invoke(a_call("remember", {"fact": "sky is blue"}))
        assert isinstance(got, Command)
        assert got == remember.invoke(a_call("remember", {"fact": "sky is blue"}))
        assert outcomes(memory) == {"k1": "ToolUse"}

    async def test_content_and_artifact(self) -> None:
        """The model reads the content; the artifact stays on the message, sync and async."""
        (gated,) = gate_tools([search], gate=Gate("g"))
        for got in (
            gated.invoke(a_call("search", {"query": "q"})),
            await gated.ainvoke(a_call("search", {"query": "q"})),
        ):
            assert isinstance(got, ToolMessage)
            assert (got.content, got.artifact, got.status) == ("2 hits for q", [{"id": 1}, {"id": 2}], "success")

    async def test_sync_invoke_inside_a_running_loop(self, root: Path) -> None:
        """`invoke` from async code answers as it would anywhere else."""
        gate = Gate("files", interceptors=[ProtectFiles()])
        _, delete = gate_tools(file_tools(root, []), gate=gate)
        assert delete.invoke(a_call("delete_file", {"path": "old.txt"})).content == "deleted old.txt"
        denied = delete.invoke(a_call("delete_file", {"path": "precious.txt"}))
        assert (denied.status, denied.content) == ("error", DENIAL)

    def test_an_interceptor_that_waits_on_the_sync_path(self, root: Path) -> None:
        """An async interceptor that really waits (its check is I/O) works from sync `invoke`."""

        class SlowCheck:
            name = "slow-check"

            async def before_tool_call(self, call: ToolCall) -> Deny | None:
                await asyncio.sleep(0)  # stands for a policy service's answer
                return Deny(DENIAL) if call.args["path"] == "precious.txt" else None

        done: list[str] = []
        _, delete = gate_tools(file_tools(root, done), gate=Gate("files", interceptors=[SlowCheck()]))
        assert delete.invoke({"path": "precious.txt"}) == DENIAL
        assert delete.invoke({"path": "old.txt"}) == "deleted old.txt"
        assert done == ["delete old.txt"]

    async def test_the_tool_gets_its_config_and_callbacks(self) -> None:
        """A tool function taking the RunnableConfig gets the invocation's, sync and async; the
        callbacks of the invocation see the tool run once."""
        seen: list[str] = []

        @tool
        def whoami(config: RunnableConfig) -> str:
            """Says who the run is for."""
            return str(config["configurable"]["user"])

        @tool
        async def awhoami(config: RunnableConfig) -> str:
            """Says who the run is for."""
            return str(config["configurable"]["user"])

        class Starts(BaseCallbackHandler):
            def on_tool_start(self, serialized: dict[str, Any], input_str: str, **kwargs: Any) -> None:
                seen.append(serialized["name"])

        sync_tool, async_tool = gate_tools([whoami, awhoami], gate=Gate("g"))
        config: RunnableConfig = {"configurable": {"user": "ada"}, "callbacks": [Starts()]}
        assert sync_tool.invoke({}, config) == "ada"
        assert await async_tool.ainvoke({}, config) == "ada"
        assert seen == ["whoami", "awhoami"]

    def test_a_tool_that_runs_its_own_loop(self) -> None:
        """A sync tool may start an event loop of its own (`asyncio.run`), as it could ungated."""

        async def fetch(key: str) -> str:
            return f"value of {key}"

        @tool
        def lookup(key: str) -> str:
            """Looks a key up through an async client."""
            return asyncio.run(fetch(key))

        (gated,) = gate_tools([lookup], gate=Gate("g"))
        assert gated.invoke({"key": "k"}) == "value of k"

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

    async def test_invalid_arguments_are_langchains_error(self, root: Path) -> None:
        """Invalid arguments pass the chain and leave an error outcome; then LangChain answers
        them as it would ungated: a ToolNode's error message, a plain invoke's ValidationError."""
        memory, done = MemorySink(), []
        tools = gate_tools(file_tools(root, done), gate=Gate("files", sinks=[memory]))
        bad = turn(("c1", "write_file", {"path": "a.txt"}))
        out = await tool_node_graph(chat(bad), tools).ainvoke({"messages": [HumanMessage("x")]})
        status, content = replies(out["messages"])["c1"]
        assert status == "error"
        assert "Field required" in content
        with pytest.raises(ValidationError):
            tools[0].invoke({"path": "a.txt"})
        assert done == []
        assert [e.type for e in memory.events if e.type in OUTCOMES] == ["ToolUse", "ToolUse"]
        assert outcomes(memory)["c1"] == "ToolUse"

    @pytest.mark.parametrize("route", ["invoke", "ainvoke"])
    async def test_a_raising_tool_raises_as_it_does_ungated(self, route: str) -> None:
        """A tool's own exception reaches the caller, as ungated, after the gate recorded the call's
        error outcome under the model's id."""
        memory = MemorySink()
        (gated,) = gate_tools([read_file], gate=Gate("g", sinks=[memory]))
        call = a_call("read_file", {"path": "x"}, "r1")
        for tool_ in (read_file, gated):
            with pytest.raises(FileNotFoundError, match="x"):
                tool_.invoke(call) if route == "invoke" else await tool_.ainvoke(call)
        assert outcomes(memory) == {"r1": "ToolUse"}
        used = memory.of_type("ToolUse")[0]
        assert (used.outcome, "FileNotFoundError" in (used.error or "")) == ("error", True)

    @pytest.mark.parametrize("route", ["invoke", "ainvoke"])
    async def test_the_tools_handle_tool_error_answers(self, route: str) -> None:
        """A ToolException the tool's `handle_tool_error` answers is that answer, as ungated; the
        outcome records the failure."""
        memory = MemorySink()
        (gated,) = gate_tools([read_note], gate=Gate("g", sinks=[memory]))
        call = a_call("read_note", {"path": "x"}, "r1")
        got = [tool_.invoke(call) if route == "invoke" else await tool_.ainvoke(call) for tool_ in (read_note, gated)]
        assert [(m.status, m.content) for m in got] == [("error", "cannot read: no note x")] * 2
        assert [(e.call_id, e.outcome) for e in memory.of_type("ToolUse")] == [("r1", "error")]

    async def test_the_gates_timeout_is_a_message_not_an_exception(self) -> None:
        """A tool cut off by the gate's `timeout_s` is the gate's decision: an error ToolMessage the
        model reads, never an exception, and a `ToolUse` with outcome timeout."""

        @tool
        async def hang(key: str) -> str:
            """Never answers."""
            await asyncio.Event().wait()
            return key

        memory = MemorySink()
        (gated,) = gate_tools([hang], gate=Gate("g", sinks=[memory]), timeout_s=0.05)
        got = await gated.ainvoke(a_call("hang", {"key": "k"}, "h1"))
        assert (got.tool_call_id, got.status) == ("h1", "error")
        assert [(e.call_id, e.outcome) for e in memory.of_type("ToolUse")] == [("h1", "timeout")]

    @pytest.mark.parametrize("given", ["call", "args"])
    def test_with_retry_retries_and_records_each_attempt(self, given: str) -> None:
        """A gated tool under `with_retry` is retried on its exception; each attempt passes the
        chain and is its own call (a tool call's id gets `#N` from the second attempt)."""
        tries: list[str] = []
        flaky = flaky_tool(tries)

        memory = MemorySink()
        (gated,) = gate_tools([flaky], gate=Gate("g", sinks=[memory]))
        retrying = gated.with_retry(stop_after_attempt=3, wait_exponential_jitter=False)
        got = retrying.invoke(a_call("flaky", {"key": "k"}, "f1") if given == "call" else {"key": "k"})
        assert (got.content if given == "call" else got) == "value of k"
        assert tries == ["k", "k", "k"]
        used = [(e.call_id, e.outcome) for e in memory.of_type("ToolUse")]
        assert [outcome for _, outcome in used] == ["error", "error", "ok"]
        assert len({call_id for call_id, _ in used}) == 3
        if given == "call":
            assert [call_id for call_id, _ in used] == ["f1", "f1#2", "f1#3"]
        assert verify_chain(memory.events).ok

    def test_a_denial_under_with_retry_is_an_answer_not_retried(self, root: Path) -> None:
        """A denial is what the model reads, not an exception: `with_retry` does not run it again."""
        memory = MemorySink()
        _, delete = gate_tools(file_tools(root, []), gate=Gate("files", interceptors=[ProtectFiles()], sinks=[memory]))
        got = delete.with_retry(stop_after_attempt=3).invoke(a_call("delete_file", {"path": "precious.txt"}, "d1"))
        assert (got.status, got.content) == ("error", DENIAL)
        assert outcomes(memory) == {"d1": "ToolDenied"}


def _events_of(memory: MemorySink, type_: str) -> list[EventBase]:
    return [e for e in memory.events if e.type == type_]


class TestBothRoutes:
    async def test_command_and_artifact_tools_in_create_agent(self) -> None:
        """With the middleware, a Command tool updates the state and an artifact stays on its message."""
        memory = MemorySink()
        gate = Gate("g", sinks=[memory])
        model = chat(turn(("m1", "remember", {"fact": "sky is blue"}), ("s1", "search", {"query": "q"})))
        out = await agent_for(model, [remember, search], gate).ainvoke({"messages": [HumanMessage("x")]})
        messages = {m.tool_call_id: m for m in out["messages"] if isinstance(m, ToolMessage)}
        assert messages["m1"].content == "noted: sky is blue"
        assert (messages["s1"].content, messages["s1"].artifact) == ("2 hits for q", [{"id": 1}, {"id": 2}])
        assert outcomes(memory) == {"m1": "ToolUse", "s1": "ToolUse"}
        assert len(_events_of(memory, "ToolsRegistered")) == 1

    async def test_command_and_artifact_tools_in_a_tool_node(self) -> None:
        """With gate_tools in a ToolNode, the same: the Command's message, the artifact kept."""
        memory = MemorySink()
        tools = gate_tools([remember, search], gate=Gate("g", sinks=[memory]))
        model = chat(turn(("m1", "remember", {"fact": "sky is blue"}), ("s1", "search", {"query": "q"})))
        out = await tool_node_graph(model, tools).ainvoke({"messages": [HumanMessage("x")]})
        messages = {m.tool_call_id: m for m in out["messages"] if isinstance(m, ToolMessage)}
        assert messages["m1"].content == "noted: sky is blue"
        assert (messages["s1"].content, messages["s1"].artifact) == ("2 hits for q", [{"id": 1}, {"id": 2}])
        assert outcomes(memory) == {"m1": "ToolUse", "s1": "ToolUse"}


@tool
def ask_human(question: str) -> str:
    """Asks a person, pausing the run until they answer."""
    return f"they said {interrupt(question)}"


class TestInterrupts:
    def test_an_interrupt_pauses_the_run_and_the_resume_is_a_new_call(self) -> None:
        """LangGraph's `interrupt()` in a gated tool pauses the run as it would ungated; the
        resumed run calls the tool again through the gate, under the same tool call id."""
        memory = MemorySink()
        gate = Gate("g", sinks=[memory])
        agent = create_agent(
            chat(turn(("q1", "ask_human", {"question": "delete it?"}))),
            tools=[ask_human],
            middleware=[CallgateMiddleware([ask_human], gate=gate)],
            checkpointer=InMemorySaver(),
        )
        thread = {"configurable": {"thread_id": "t1"}}
        paused = agent.invoke({"messages": [HumanMessage("x")]}, thread)
        assert [i.value for i in paused["__interrupt__"]] == ["delete it?"]
        out = agent.invoke(Command(resume="no"), thread)
        assert replies(out["messages"]) == {"q1": ("success", "they said no")}
        uses = [(e.call_id, e.outcome) for e in memory.events if e.type == "ToolUse"]  # type: ignore[attr-defined]
        assert uses == [("q1", "error"), ("q1", "ok")]
        assert verify_chain(memory.events).ok


# -- RequireApproval as LangGraph's interrupt() ----------------------------------------------------


class StripDotSlash:
    """Paths lose a leading "./" (so the reviewer sees rewritten arguments)."""

    name = "strip-dot-slash"

    def before_tool_call(self, call: ToolCall) -> Rewrite | None:
        path = call.args.get("path", "")
        return Rewrite({**call.args, "path": path[2:]}) if path.startswith("./") else None


class DeletesNeedApproval:
    """Every delete needs a human."""

    name = "deletes-need-approval"

    def before_tool_call(self, call: ToolCall) -> RequireApproval | None:
        return RequireApproval("deletes need a human") if call.tool_name == "delete_file" else None


def approvals_gate(memory: MemorySink, **options: Any) -> Gate:
    return Gate("files", interceptors=[StripDotSlash(), DeletesNeedApproval()], sinks=[memory], **options)


class ReadingChat(ScriptedChat):
    """The scripted model, keeping what it was shown at each turn."""

    shown: list[list[AnyMessage]] = Field(default_factory=list)

    def _generate(self, messages: list[AnyMessage], *args: Any, **kwargs: Any) -> Any:
        self.shown.append(list(messages))
        return super()._generate(messages, *args, **kwargs)


DELETE = turn(("c1", "delete_file", {"path": "./old.txt"}))

PAYLOAD = {
    "kind": APPROVAL_INTERRUPT,
    "tool": "delete_file",
    "args": {"path": "old.txt"},
    "call_id": "c1",
    "reason": "deletes need a human",
    "requested_by": ["deletes-need-approval"],
}


def trail(memory: MemorySink, call_id: str) -> list[str]:
    """The event types of one call id, in order."""
    return [e.type for e in memory.events if getattr(e, "call_id", None) == call_id]


class Route:
    """One way of running the files tools in a graph with a checkpointer: `create_agent` with the
    middleware, or a LangGraph ToolNode of `gate_tools`; sync (`invoke`) or async (`ainvoke`)."""

    def __init__(
        self, name: str, root: Path, gate: Gate, model: ScriptedChat, *, checkpointer: bool = True, desk: Any = None
    ) -> None:
        self.done: list[str] = []
        tools = file_tools(root, self.done)
        saver = InMemorySaver() if checkpointer else None
        if name.startswith("middleware"):
            middleware = [CallgateMiddleware(tools, gate=gate, agent="writer", desk=desk)]
            self.graph = create_agent(model, tools=tools, middleware=middleware, checkpointer=saver)
        else:
            gated = gate_tools(tools, gate=gate, agent="writer", desk=desk)
            self.graph = tool_node_graph(model, gated, checkpointer=saver)
        self.sync = name.endswith("sync")
        self.thread: RunnableConfig = {"configurable": {"thread_id": "t1"}}

    async def run(self, given: Any) -> dict[str, Any]:
        if self.sync:
            out: dict[str, Any] = self.graph.invoke(given, self.thread)
        else:
            out = await self.graph.ainvoke(given, self.thread)
        return out


MIDDLEWARE = ["middleware-async", "middleware-sync"]
TOOL_NODE = ["tool-node-async", "tool-node-sync"]
ROUTES = [*MIDDLEWARE, *TOOL_NODE]


class TestApprovalAsInterrupt:
    """`RequireApproval` with no approval handler pauses the graph with `interrupt()`; the
    `Command(resume=...)` answer decides the call, on both routes, sync and async."""

    @pytest.mark.parametrize("route", ROUTES)
    async def test_the_run_pauses_with_the_payload_and_nothing_deleted(self, root: Path, route: str) -> None:
        """The interrupt carries the tool, the arguments as the gate holds them (rewritten), the
        call id, the reason and who asked; the delete has not run; the gate recorded the pause as
        the durable `ApprovalRequested`, and no outcome yet."""
        memory = MemorySink()
        graph = Route(route, root, approvals_gate(memory), chat(DELETE))
        paused = await graph.run({"messages": [HumanMessage("tidy up")]})
        (pause,) = paused["__interrupt__"]
        requested = memory.of_type("ApprovalRequested")[0]
        assert requested.approval_id is not None
        assert pause.value == {**PAYLOAD, "approval_id": requested.approval_id}
        assert (root / "old.txt").exists()
        assert graph.done == []
        assert trail(memory, "c1") == ["ApprovalRequested"]
        assert requested.reason == "deletes need a human"

    @pytest.mark.parametrize(
        ("route", "answer", "by"),
        [
            *[(route, {"approved": True, "by": "alice", "call_id": "c1"}, "alice") for route in ROUTES],
            *[(route, True, None) for route in MIDDLEWARE],
            *[(route, {"approved": True, "by": "bob"}, "bob") for route in MIDDLEWARE],
        ],
    )
    async def test_approved_on_resume_the_tool_runs_once(self, root: Path, route: str, answer: Any, by: Any) -> None:
        """Resumed with an approval: the delete runs once, the model reads its result, and the
        call's trail is the pause (the durable request), the request asked again on resume under
        the same approval id, the approval (who decided, through LangGraph) and its one outcome."""
        memory = MemorySink()
        graph = Route(route, root, approvals_gate(memory), chat(DELETE))
        await graph.run({"messages": [HumanMessage("tidy up")]})
        out = await graph.run(Command(resume=answer))
        assert "__interrupt__" not in out
        assert out["messages"][-1].content == "done"
        assert not (root / "old.txt").exists()
        assert graph.done == ["delete old.txt"]
        assert replies(out["messages"]) == {"c1": ("success", "deleted old.txt")}
        assert trail(memory, "c1") == ["ApprovalRequested", "ApprovalRequested", "ApprovalResolved", "ToolUse"]
        resolved = memory.of_type("ApprovalResolved")[0]
        assert (resolved.approved, resolved.by) == (True, by)
        assert "LangGraph" in (resolved.note or "")
        paused, resumed = memory.of_type("ApprovalRequested")
        assert paused.approval_id == resumed.approval_id == resolved.approval_id
        assert paused.args_digest == resumed.args_digest
        assert verify_chain(memory.events).ok

    @pytest.mark.parametrize("route", ROUTES)
    async def test_denied_on_resume_the_tool_never_runs_and_the_model_reads_why(self, root: Path, route: str) -> None:
        """Resumed with a refusal and a note: the delete never runs; the model's next turn is
        shown an error ToolMessage with the refusal, who refused and the note; the outcome is
        `ToolDenied`."""
        memory = MemorySink()
        model = ReadingChat(messages=iter([DELETE, AIMessage("done")]))
        graph = Route(route, root, approvals_gate(memory), model)
        await graph.run({"messages": [HumanMessage("tidy up")]})
        out = await graph.run(Command(resume={"approved": False, "by": "alice", "note": "not today", "call_id": "c1"}))
        refusal = "The call to delete_file needs approval (deletes need a human) and was refused by alice: not today"
        assert out["messages"][-1].content == "done"
        assert (root / "old.txt").read_text() == "old"
        assert graph.done == []
        assert replies(model.shown[-1]) == {"c1": ("error", refusal)}
        assert trail(memory, "c1") == ["ApprovalRequested", "ApprovalRequested", "ApprovalResolved", "ToolDenied"]
        resolved = memory.of_type("ApprovalResolved")[0]
        assert (resolved.approved, resolved.by, resolved.note) == (False, "alice", "not today")
        assert memory.of_type("ToolDenied")[0].message == refusal
        assert verify_chain(memory.events).ok

    async def test_the_other_calls_of_the_turn_run_once(self, root: Path) -> None:
        """With `create_agent` each tool call is a task of its own: a write beside the paused delete
        runs before the pause and not again on resume."""
        memory = MemorySink()
        both = turn(
            ("c1", "delete_file", {"path": "old.txt"}), ("c2", "write_file", {"path": "note.txt", "text": "hi"})
        )
        graph = Route("middleware-async", root, approvals_gate(memory), chat(both))
        await graph.run({"messages": [HumanMessage("tidy up")]})
        assert graph.done == ["write note.txt"]
        out = await graph.run(Command(resume=True))
        assert graph.done == ["write note.txt", "delete old.txt"]
        assert replies(out["messages"]) == {"c1": ("success", "deleted old.txt"), "c2": ("success", "wrote note.txt")}
        assert trail(memory, "c2") == ["ToolUse"]

    @pytest.mark.parametrize("route", ROUTES)
    async def test_without_a_checkpointer_the_call_fails_closed(self, root: Path, route: str) -> None:
        """A graph with no checkpointer cannot resume: the run ends with `ToolApprovalRequiredError`
        saying a checkpointer is needed, and the tool has not run."""
        memory = MemorySink()
        gate = approvals_gate(memory)
        graph = Route(route, root, gate, chat(turn(("c1", "delete_file", {"path": "old.txt"}))), checkpointer=False)
        with pytest.raises(ToolApprovalRequiredError, match="only with a checkpointer") as raised:
            await graph.run({"messages": [HumanMessage("tidy up")]})
        assert (raised.value.tool, raised.value.call_id) == ("delete_file", "c1")
        assert (root / "old.txt").exists()
        assert graph.done == []
        assert trail(memory, "c1") == ["Blocked"]

    @pytest.mark.parametrize(
        ("route", "bad"),
        [
            *[(route, bad) for route in ROUTES for bad in ["yes", {"approved": True, "message": "fine"}]],
            *[(route, {"approved": True, "call_id": "c9"}) for route in ROUTES],
            *[(route, bad) for route in TOOL_NODE for bad in [True, {"approved": True}]],
        ],
    )
    async def test_an_invalid_answer_is_refused_and_the_call_still_waits(
        self, root: Path, route: str, bad: Any
    ) -> None:
        """A resume value that is not an answer to this call (a string, an unknown field, another
        call's id; on a ToolNode, an answer that does not name its call) fails the resumed run
        with LangGraph's `ValidationError`, records nothing and runs nothing; a valid answer then
        still decides the call."""
        memory = MemorySink()
        graph = Route(route, root, approvals_gate(memory), chat(turn(("c1", "delete_file", {"path": "old.txt"}))))
        paused = await graph.run({"messages": [HumanMessage("tidy up")]})
        assert paused["__interrupt__"][0].response_schema is not None  # what a client may send
        with pytest.raises(ValidationError):
            await graph.run(Command(resume=bad))
        assert trail(memory, "c1") == ["ApprovalRequested"]
        assert (root / "old.txt").exists()
        out = await graph.run(Command(resume={"approved": True, "call_id": "c1"}))
        assert replies(out["messages"]) == {"c1": ("success", "deleted old.txt")}
        assert trail(memory, "c1") == ["ApprovalRequested", "ApprovalRequested", "ApprovalResolved", "ToolUse"]

    async def test_two_calls_waiting_are_answered_by_interrupt_id(self, root: Path) -> None:
        """Two deletes of one turn pause together; `Command(resume={interrupt id: answer})`
        approves one and refuses the other."""
        memory = MemorySink()
        gate = approvals_gate(memory)
        (root / "older.txt").write_text("older")
        two = turn(("c1", "delete_file", {"path": "old.txt"}), ("c2", "delete_file", {"path": "older.txt"}))
        graph = Route("middleware-async", root, gate, chat(two))
        paused = await graph.run({"messages": [HumanMessage("tidy up")]})
        ids = {i.value["call_id"]: i.id for i in paused["__interrupt__"]}
        out = await graph.run(Command(resume={ids["c1"]: True, ids["c2"]: {"approved": False, "note": "keep it"}}))
        assert graph.done == ["delete old.txt"]
        assert (root / "older.txt").exists()
        got = replies(out["messages"])
        assert got["c1"] == ("success", "deleted old.txt")
        assert got["c2"] == (
            "error",
            "The call to delete_file needs approval (deletes need a human) and was refused: keep it",
        )
        assert trail(memory, "c2") == ["ApprovalRequested", "ApprovalRequested", "ApprovalResolved", "ToolDenied"]

    async def test_a_gate_with_a_handler_asks_it_and_never_pauses(self, root: Path) -> None:
        """The gate's own `approval_handler` answers, as on every route: no interrupt."""
        asked: list[ApprovalRequest] = []

        def approve(request: ApprovalRequest) -> Approval:
            asked.append(request)
            return Approval(approved=True, by="bob")

        memory = MemorySink()
        gate = approvals_gate(memory, approval_handler=approve)
        graph = Route("middleware-async", root, gate, chat(turn(("c1", "delete_file", {"path": "old.txt"}))))
        out = await graph.run({"messages": [HumanMessage("tidy up")]})
        assert "__interrupt__" not in out
        assert [r.call_id for r in asked] == ["c1"]
        assert trail(memory, "c1") == ["ApprovalRequested", "ApprovalResolved", "ToolUse"]


class Desk:
    """The reviewers' desk as a gate reaches it (the read API): the requests it holds, the decisions
    taken on them (signed by `key`, or forged), and the claims it grants (once per approval id)."""

    def __init__(self) -> None:
        self.key = SigningKey.generate("callgate-desk")
        self.held: dict[str, ApprovalRequest] = {}
        self.by_id: dict[str, list[ApprovalResolvedEvent]] = {}
        self.claimed: list[str] = []
        self.producer = Producer()

    def decide(self, requested: Any, *, approved: bool, forged: bool = False) -> None:
        fields: dict[str, Any] = {
            "event_id": new_event_id(),
            "time": datetime.now(UTC),
            "gate": "callgate-desk",
            "call_id": requested.call_id,
            "approved": approved,
            "by": "rev-1",
            "note": None if approved else "not this one",
            "waited_ms": 1.0,
            "approval_id": requested.approval_id,
            "args_digest": requested.args_digest,
            "policy_version": requested.policy_version,
        }
        if not forged:
            unsigned = ApprovalResolvedEvent(
                **fields, producer_id=self.producer.producer_id, seq=1, prev_hash=ZERO_HASH, hash=ZERO_HASH
            )
            fields["signature"] = sign_decision(unsigned, self.key)
        self.by_id.setdefault(requested.approval_id, []).append(self.producer.seal(ApprovalResolvedEvent, fields))

    def hold(self, requested: Any) -> None:
        """The store has the request (its expiry: none)."""
        self.held[requested.approval_id] = ApprovalRequest(
            "delete_file", {}, "", RunContext(), requested.call_id, (), requested.approval_id,
            requested.args_digest, requested.policy_version, None, None,
        )  # fmt: skip

    def decisions(self, approval_id: str) -> list[ApprovalResolvedEvent]:
        return list(self.by_id.get(approval_id, ()))

    def changed(self) -> asyncio.Event:
        return asyncio.Event()  # every decision is there before the resume

    async def recorded(self, request: ApprovalRequest) -> ApprovalRequest | None:
        return self.held.get(request.approval_id)

    async def claim(self, request: ApprovalRequest, decision: ApprovalResolvedEvent) -> str | None:
        if request.approval_id in self.claimed:
            return "it was claimed already"
        self.claimed.append(request.approval_id)
        return None

    def remote(self) -> RemoteApprovals:
        return RemoteApprovals(self, trusted_keys={self.key.key_id: self.key.public()})


class TestResumedFromTheDesk:
    """`Command(resume={"approval_id": ...})` with a `desk`: the reviewers' decision, fetched,
    verified and claimed by the gate, decides the paused call."""

    async def paused(self, route: str, root: Path, desk: Desk, **gate_options: Any) -> tuple[Route, MemorySink, Any]:
        memory = MemorySink()
        graph = Route(route, root, approvals_gate(memory, **gate_options), chat(DELETE), desk=desk.remote())
        paused = await graph.run({"messages": [HumanMessage("tidy up")]})
        (requested,) = memory.of_type("ApprovalRequested")
        assert paused["__interrupt__"][0].value["approval_id"] == requested.approval_id
        return graph, memory, requested

    @pytest.mark.parametrize("route", ROUTES)
    async def test_the_reviewers_approval_runs_the_call_once(self, root: Path, route: str) -> None:
        """Approved at the desk (which holds the request): the delete runs once, the desk's
        approval is claimed, and this gate records neither the request again nor a decision."""
        desk = Desk()
        graph, memory, requested = await self.paused(route, root, desk)
        desk.decide(requested, approved=True)
        desk.hold(requested)
        out = await graph.run(Command(resume={"approval_id": requested.approval_id}))
        assert replies(out["messages"]) == {"c1": ("success", "deleted old.txt")}
        assert graph.done == ["delete old.txt"]
        assert desk.claimed == [requested.approval_id]
        assert trail(memory, "c1") == ["ApprovalRequested", "ToolUse"]
        assert verify_chain(memory.events).ok

    async def test_the_reviewers_denial_refuses_it(self, root: Path) -> None:
        """Denied at the desk: the model reads who refused and why; nothing is claimed or run."""
        desk = Desk()
        graph, memory, requested = await self.paused("middleware-async", root, desk)
        desk.decide(requested, approved=False)
        desk.hold(requested)
        out = await graph.run(Command(resume={"approval_id": requested.approval_id}))
        status, text = replies(out["messages"])["c1"]
        assert status == "error"
        assert "refused by rev-1: not this one" in text
        assert (graph.done, desk.claimed) == ([], [])
        assert trail(memory, "c1") == ["ApprovalRequested", "ToolDenied"]

    async def test_a_forged_decision_decides_nothing(self, root: Path) -> None:
        """A decision no desk key signed is ignored: the call waits until its request expires,
        and is refused with no decision given (a desk that does not hold the request yet: this
        gate records it again)."""
        desk = Desk()
        graph, memory, requested = await self.paused("middleware-async", root, desk, approval_timeout_s=0.5)
        desk.decide(requested, approved=True, forged=True)
        out = await graph.run(Command(resume={"approval_id": requested.approval_id}))
        assert "no decision was given" in replies(out["messages"])["c1"][1]
        assert (graph.done, desk.claimed) == ([], [])
        assert trail(memory, "c1") == ["ApprovalRequested", "ApprovalRequested", "ApprovalResolved", "ToolDenied"]

    async def test_another_approval_id_or_no_desk_is_refused_by_langgraph(self, root: Path) -> None:
        """An approval id that is not the call's, or the answer without a desk, fails the resumed
        run with LangGraph's `ValidationError`; nothing is recorded or run."""
        desk = Desk()
        graph, memory, requested = await self.paused("middleware-async", root, desk)
        with pytest.raises(ValidationError):
            await graph.run(Command(resume={"approval_id": "0" * 32}))
        memory2 = MemorySink()
        without = Route("middleware-async", root, approvals_gate(memory2), chat(DELETE))
        await without.run({"messages": [HumanMessage("tidy up")]})
        with pytest.raises(ValidationError):
            await without.run(Command(resume={"approval_id": requested.approval_id}))
        assert trail(memory, "c1") == trail(memory2, "c1") == ["ApprovalRequested"]
        assert graph.done == without.done == []


@tool
def tidy_report(state: Annotated[dict[str, Any], InjectedState], runtime: ToolRuntime) -> str:
    """Reports how many messages the run has, from the graph's state."""
    return f"{len(state['messages'])} messages, call {runtime.tool_call_id}"


class TestInjectedArguments:
    async def test_state_and_runtime_reach_a_gated_tool_in_a_tool_node(self) -> None:
        """LangGraph injects the state and the ToolRuntime into a gated tool as into the original;
        the chain sees only the model's arguments."""
        seen: list[dict[str, Any]] = []

        class Record:
            name = "record"

            def before_tool_call(self, call: ToolCall) -> None:
                seen.append(dict(call.args))

        tools = gate_tools([tidy_report], gate=Gate("g", interceptors=[Record()]))
        out = await tool_node_graph(chat(turn(("r1", "tidy_report", {}))), tools).ainvoke(
            {"messages": [HumanMessage("x")]}
        )
        assert replies(out["messages"]) == {"r1": ("success", "2 messages, call r1")}
        assert seen == [{}]


def test_importing_the_module_leaves_langchain_agents_unloaded() -> None:
    """`gate_tools` needs langchain-core only: the middleware's langchain loads on first use."""
    code = (
        "import sys, interceptor_core.integrations.langchain as lc; a = 'langchain.agents' in sys.modules; "
        "lc.CallgateMiddleware; print(a, 'langchain.agents' in sys.modules)"
    )
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert found.split() == ["False", "True"]
