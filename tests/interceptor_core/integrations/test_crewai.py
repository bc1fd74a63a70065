"""CrewAI through the gate: gated tools in a real crew's kickoff (CrewAI's own agent executor,
ReAct parsing, argument validation, retries and error handling), driven offline by a scripted
`BaseLLM` that emits tool calls and then a final answer.

Where a test says "as ungated", it runs the same script against the original tools too and
compares what the model read or what the kickoff raised."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

# Before CrewAI is imported: no telemetry, and no first-run prompt about traces (it reads stdin).
os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("CREWAI_TESTING", "true")
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")

crewai = pytest.importorskip("crewai")

from crewai import Agent, Crew, Task  # noqa: E402
from crewai.llms.base_llm import BaseLLM  # noqa: E402
from crewai.tools import BaseTool, tool  # noqa: E402
from pydantic import BaseModel  # noqa: E402

from events import MemorySink, verify_chain  # noqa: E402
from interceptor_core import (  # noqa: E402
    Approval,
    ApprovalRequest,
    Gate,
    RequireApproval,
    Rewrite,
    RunContext,
    ToolApprovalRequiredError,
    ToolBlockedError,
    ToolCall,
)
from interceptor_core.integrations.crewai import GatedTool, gate_name, gate_tools, refuse_ungated_tools  # noqa: E402

from .files_policy import DENIAL, SUBSTITUTE, ProtectFiles  # noqa: E402

OUTCOMES = ("ToolUse", "ToolDenied", "Substitute", "Blocked")

Turn = str | Callable[[list[dict[str, Any]]], str]


class ScriptedLLM(BaseLLM):
    """A CrewAI LLM that answers each call with the next entry of its script (a text, or a function
    of the messages it was sent) and keeps every prompt it was sent."""

    def __init__(self, turns: Sequence[Turn]) -> None:
        super().__init__(model="scripted")
        self.turns = list(turns)
        self.prompts: list[list[dict[str, Any]]] = []

    def call(self, messages: Any, *args: Any, **kwargs: Any) -> str:
        sent = [{"role": "user", "content": messages}] if isinstance(messages, str) else [dict(m) for m in messages]
        self.prompts.append(sent)
        if not self.turns:
            raise AssertionError("the crew called the model after its script ended")
        turn = self.turns.pop(0)
        return turn(sent) if callable(turn) else turn

    def supports_function_calling(self) -> bool:
        return False

    def get_context_window_size(self) -> int:
        return 8192


def action(name: str, args: Any) -> str:
    """A ReAct step calling `name` with `args` (a JSON object, or raw text)."""
    given = args if isinstance(args, str) else json.dumps(args)
    return f"Thought: I need {name}.\nAction: {name}\nAction Input: {given}"


def final(text: str) -> str:
    return f"Thought: I now know the final answer\nFinal Answer: {text}"


def last_observation(messages: list[dict[str, Any]]) -> str:
    """What the model read as the last tool's observation (CrewAI appends it to its last message)."""
    text = str(messages[-1]["content"])
    return text.rsplit("Observation:", 1)[-1].strip()


def last_prompt(llm: ScriptedLLM) -> str:
    """The last message of the last prompt the model was sent (where CrewAI puts observations)."""
    return str(llm.prompts[-1][-1]["content"])


def echo_observation(messages: list[dict[str, Any]]) -> str:
    return final(last_observation(messages))


def file_tools(root: Path, done: list[str]) -> list[BaseTool]:
    @tool("write_file")
    def write_file(path: str, text: str) -> str:
        """Writes text to a file under the root."""
        (root / path).write_text(text)
        done.append(f"write {path}")
        return f"wrote {path}"

    @tool("delete_file")
    def delete_file(path: str) -> str:
        """Deletes a file under the root."""
        (root / path).unlink()
        done.append(f"delete {path}")
        return f"deleted {path}"

    return [write_file, delete_file]


def kickoff(tools: Sequence[BaseTool], llm: ScriptedLLM, **agent_options: Any) -> str:
    """One agent with `tools`, one task, one sequential crew: the kickoff's final output."""
    writer = Agent(
        role="writer", goal="tidy up", backstory="keeps files tidy", llm=llm, tools=list(tools), **agent_options
    )
    task = Task(description="tidy up the files", expected_output="one line", agent=writer)
    return str(Crew(agents=[writer], tasks=[task]).kickoff().raw)


def outcomes(memory: MemorySink) -> list[tuple[str, str]]:
    """(type, tool) of each outcome event, in order."""
    return [(e.type, e.tool) for e in memory.events if e.type in OUTCOMES]


def assert_chain_whole(memory: MemorySink) -> None:
    report = verify_chain(memory.sealed)
    assert report.ok, report


class TestGateTools:
    def test_registered_once_as_crewai_shows_them(self, root: Path) -> None:
        """gate_tools registers the tools in one ToolsRegistered event, and CrewAI shows the gated
        tools exactly as the originals: name, rendered description, the same args_schema."""
        memory = MemorySink()
        originals = file_tools(root, [])
        gated = gate_tools(originals, gate=Gate("files", sinks=[memory]), agent="writer")
        (registered,) = [e for e in memory.events if e.type == "ToolsRegistered"]
        assert [t.name for t in registered.tools] == ["write_file", "delete_file"]
        assert registered.agent == "writer"
        for ours, theirs in zip(gated, originals, strict=True):
            assert isinstance(ours, GatedTool)
            assert (ours.name, ours.description, ours.args_schema) == (
                theirs.name,
                theirs.description,
                theirs.args_schema,
            )
            assert ours.original is theirs

    def test_allowed_call_runs_once(self, root: Path) -> None:
        """An allowed call runs the tool once, the model reads its output, and the gate records one
        ToolUse (with the gate's own call id: CrewAI's ReAct calls have none) with the run's tenant."""
        memory, done = MemorySink(), []
        gate = Gate("files", interceptors=[ProtectFiles(root)], sinks=[memory])
        tools = gate_tools(file_tools(root, done), gate=gate, run=RunContext(tenant="acme"))
        llm = ScriptedLLM([action("write_file", {"path": "note.txt", "text": "hi"}), echo_observation])
        assert kickoff(tools, llm) == "wrote note.txt"
        assert done == ["write note.txt"]
        assert (root / "note.txt").read_text() == "hi"
        assert outcomes(memory) == [("ToolUse", "write_file")]
        (use,) = [e for e in memory.events if e.type == "ToolUse"]
        assert (use.outcome, use.tenant) == ("ok", "acme")
        assert use.call_id
        assert_chain_whole(memory)

    def test_run_from_the_crew(self, root: Path) -> None:
        """`run` as a function of CrewAI's hook context: each call carries what it derives from the
        calling crew, agent and task (here: the crew's name as tenant, the agent's role as principal)."""
        memory, done = MemorySink(), []
        seen: list[str] = []

        def run_of(call: Any) -> RunContext:
            seen.append(call.task.description)
            return RunContext(tenant=call.crew.name, principal=call.agent.role)

        tools = gate_tools(file_tools(root, done), gate=Gate("files", sinks=[memory]), run=run_of)
        llm = ScriptedLLM([action("write_file", {"path": "note.txt", "text": "hi"}), echo_observation])
        writer = Agent(role="writer", goal="tidy up", backstory="keeps files tidy", llm=llm, tools=tools)
        task = Task(description="tidy up for {tenant}", expected_output="one line", agent=writer)
        Crew(name="acme", agents=[writer], tasks=[task]).kickoff(inputs={"tenant": "acme"})
        (use,) = [e for e in memory.events if e.type in OUTCOMES]
        assert (use.type, use.tenant, use.principal) == ("ToolUse", "acme", "writer")
        assert seen == ["tidy up for acme"]

    def test_denied_call_never_runs_and_the_model_reads_why(self, root: Path) -> None:
        """A denied call never runs; the model's next prompt holds the denial message; one ToolDenied."""
        memory, done = MemorySink(), []
        gate = Gate("files", interceptors=[ProtectFiles(root)], sinks=[memory])
        tools = gate_tools(file_tools(root, done), gate=gate)
        llm = ScriptedLLM([action("delete_file", {"path": "precious.txt"}), echo_observation])
        assert kickoff(tools, llm) == DENIAL
        assert DENIAL in str(llm.prompts[1][-1]["content"])
        assert done == []
        assert (root / "precious.txt").read_text() == "keep me"
        assert outcomes(memory) == [("ToolDenied", "delete_file")]
        (denied,) = [e for e in memory.events if e.type == "ToolDenied"]
        assert denied.message == DENIAL
        assert_chain_whole(memory)

    def test_denial_is_not_cached(self, root: Path) -> None:
        """CrewAI caches tool results; a denial is not one: the same call made again is asked again."""
        memory, done = MemorySink(), []
        gate = Gate("files", interceptors=[ProtectFiles(root)], sinks=[memory])
        tools = gate_tools(file_tools(root, done), gate=gate)
        deny = action("delete_file", {"path": "precious.txt"})
        llm = ScriptedLLM([deny, action("write_file", {"path": "a.txt", "text": "a"}), deny, final("done")])
        assert kickoff(tools, llm) == "done"
        assert DENIAL in str(llm.prompts[3][-1]["content"])
        assert outcomes(memory) == [
            ("ToolDenied", "delete_file"),
            ("ToolUse", "write_file"),
            ("ToolDenied", "delete_file"),
        ]

    def test_substitute_is_what_the_model_reads(self, root: Path) -> None:
        """A Substitute is the observation, and the tool does not run."""
        memory, done = MemorySink(), []
        gate = Gate("files", interceptors=[ProtectFiles(root)], sinks=[memory])
        tools = gate_tools(file_tools(root, done), gate=gate)
        llm = ScriptedLLM([action("write_file", {"path": "dry-run.txt", "text": "x"}), echo_observation])
        assert kickoff(tools, llm) == SUBSTITUTE
        assert done == []
        assert outcomes(memory) == [("Substitute", "write_file")]

    def test_rewrite_reaches_the_tool(self, root: Path) -> None:
        """A Rewrite's arguments are what the original tool gets."""
        done: list[str] = []

        class KeepOutOfPrecious:
            name = "keep-out-of-precious"

            def before_tool_call(self, call: ToolCall) -> Rewrite | None:
                return Rewrite({**call.args, "path": "safe.txt"}) if call.args["path"] == "precious.txt" else None

        tools = gate_tools(file_tools(root, done), gate=Gate("files", interceptors=[KeepOutOfPrecious()]))
        llm = ScriptedLLM([action("write_file", {"path": "precious.txt", "text": "x"}), echo_observation])
        assert kickoff(tools, llm) == "wrote safe.txt"
        assert (root / "precious.txt").read_text() == "keep me"
        assert (root / "safe.txt").read_text() == "x"


class TestStoppingTheRun:
    def test_block_ends_the_kickoff(self, root: Path) -> None:
        """A Block ends the kickoff with ToolBlockedError: not turned into text by CrewAI's tool
        error handling, no retry of the task, no model call after the block, one Blocked event."""
        memory, done = MemorySink(), []
        gate = Gate("files", interceptors=[ProtectFiles(root)], sinks=[memory])
        tools = gate_tools(file_tools(root, done), gate=gate)
        llm = ScriptedLLM([action("delete_file", {"path": "*"}), final("should never be asked")])
        with pytest.raises(ToolBlockedError, match="wildcard delete requested"):
            kickoff(tools, llm)
        assert len(llm.prompts) == 1
        assert done == []
        assert outcomes(memory) == [("Blocked", "delete_file")]
        assert_chain_whole(memory)

    def test_block_under_max_execution_time(self, root: Path) -> None:
        """With `max_execution_time`, CrewAI runs the agent in a worker thread and wraps what it raises
        in its RuntimeError: the block still ends the kickoff (as its cause), with no model call after it."""
        memory, done = MemorySink(), []
        gate = Gate("files", interceptors=[ProtectFiles(root)], sinks=[memory])
        tools = gate_tools(file_tools(root, done), gate=gate)
        llm = ScriptedLLM([action("delete_file", {"path": "*"}), final("should never be asked")])
        with pytest.raises(RuntimeError, match="wildcard delete requested") as stopped:
            kickoff(tools, llm, max_execution_time=60)
        assert isinstance(stopped.value.__cause__, ToolBlockedError)
        assert (len(llm.prompts), done) == (1, [])
        assert outcomes(memory) == [("Blocked", "delete_file")]

    def test_a_later_kickoff_is_mediated_as_usual(self, root: Path) -> None:
        """The gate keeps no state of a blocked run: the same tools serve the next kickoff."""
        memory, done = MemorySink(), []
        gate = Gate("files", interceptors=[ProtectFiles(root)], sinks=[memory])
        tools = gate_tools(file_tools(root, done), gate=gate)
        with pytest.raises(ToolBlockedError):
            kickoff(tools, ScriptedLLM([action("delete_file", {"path": "*"})]))
        llm = ScriptedLLM([action("write_file", {"path": "note.txt", "text": "hi"}), echo_observation])
        assert kickoff(tools, llm) == "wrote note.txt"
        assert outcomes(memory) == [("Blocked", "delete_file"), ("ToolUse", "write_file")]

    def test_approval_without_handler_ends_the_kickoff(self, root: Path) -> None:
        """RequireApproval with no approval_handler fails closed: the kickoff ends with
        ToolApprovalRequiredError naming the reason, the tool never runs, one Blocked event with
        cause "approval_required"."""
        memory, done = MemorySink(), []

        class AskFirst:
            name = "ask-first"

            def before_tool_call(self, call: ToolCall) -> RequireApproval:
                return RequireApproval("writes need a reviewer")

        tools = gate_tools(file_tools(root, done), gate=Gate("files", interceptors=[AskFirst()], sinks=[memory]))
        llm = ScriptedLLM([action("write_file", {"path": "note.txt", "text": "hi"}), final("never")])
        with pytest.raises(ToolApprovalRequiredError, match="writes need a reviewer"):
            kickoff(tools, llm)
        assert (done, len(llm.prompts)) == ([], 1)
        (blocked,) = [e for e in memory.events if e.type in OUTCOMES]
        assert (blocked.type, blocked.cause) == ("Blocked", "approval_required")

    def test_approval_handler_is_asked(self, root: Path) -> None:
        """With an approval_handler, its answer decides: approved runs the tool, as on every route."""
        memory, done = MemorySink(), []
        asked: list[str] = []

        class AskFirst:
            name = "ask-first"

            def before_tool_call(self, call: ToolCall) -> RequireApproval:
                return RequireApproval("writes need a reviewer")

        async def reviewer(request: ApprovalRequest) -> Approval:
            asked.append(request.tool)
            return Approval(approved=True, by="reviewer")

        gate = Gate("files", interceptors=[AskFirst()], sinks=[memory], approval_handler=reviewer)
        tools = gate_tools(file_tools(root, done), gate=gate)
        llm = ScriptedLLM([action("write_file", {"path": "note.txt", "text": "hi"}), echo_observation])
        assert kickoff(tools, llm) == "wrote note.txt"
        assert asked == ["write_file"]
        assert [e.type for e in memory.events if e.type != "ToolsRegistered"] == [
            "ApprovalRequested",
            "ApprovalResolved",
            "ToolUse",
        ]

    def test_failing_interceptor_fails_closed(self, root: Path) -> None:
        """An interceptor that raises denies the call: the tool never runs, the model reads the
        denial, and one ToolDenied records the interceptor's error."""
        memory, done = MemorySink(), []

        class Broken:
            name = "broken"

            def before_tool_call(self, call: ToolCall) -> None:
                raise RuntimeError("policy store unreachable")

        tools = gate_tools(file_tools(root, done), gate=Gate("files", interceptors=[Broken()], sinks=[memory]))
        llm = ScriptedLLM([action("write_file", {"path": "note.txt", "text": "hi"}), echo_observation])
        observation = kickoff(tools, llm)
        assert done == []
        assert not (root / "note.txt").exists()
        (denied,) = [e for e in memory.events if e.type in OUTCOMES]
        assert (denied.type, denied.cause) == ("ToolDenied", "interceptor_error")
        assert observation == denied.message
        assert_chain_whole(memory)


class Unreliable(BaseTool):
    """A tool that always fails, and counts its runs."""

    name: str = "read_report"
    description: str = "Reads a report that is never there."
    runs: int = 0

    def _run(self, path: str) -> str:
        self.runs += 1
        raise FileNotFoundError(f"no such file: {path}")


class TestCrewAIHandling:
    def test_tool_error_as_ungated(self) -> None:
        """A tool that raises: CrewAI's own handling runs it again (as it does ungated, the same
        number of times) and the model then reads the same error text; each run is one ToolUse
        with outcome "error"."""
        ungated_tool = Unreliable()
        ungated_llm = ScriptedLLM([action("read_report", {"path": "q3.txt"}), final("done")])
        kickoff([ungated_tool], ungated_llm)
        memory = MemorySink()
        original = Unreliable()
        gated = gate_tools([original], gate=Gate("reports", sinks=[memory]))
        llm = ScriptedLLM([action("read_report", {"path": "q3.txt"}), final("done")])
        assert kickoff(gated, llm) == "done"
        read = last_prompt(llm)
        assert read == last_prompt(ungated_llm)
        assert "no such file: q3.txt" in read
        assert original.runs == ungated_tool.runs > 1
        uses = [e for e in memory.events if e.type in OUTCOMES]
        assert [(e.type, e.outcome) for e in uses] == [("ToolUse", "error")] * original.runs
        assert "FileNotFoundError: no such file: q3.txt" in uses[0].error
        assert_chain_whole(memory)

    def test_invalid_arguments_as_ungated(self, root: Path) -> None:
        """Arguments args_schema refuses are CrewAI's to answer, as ungated: the same text for the
        model, the tool never runs, and the gate is not asked (nothing to decide on)."""
        bad = {"path": ["not", "a", "string"], "text": "hi"}
        ungated_done: list[str] = []
        ungated_llm = ScriptedLLM([action("write_file", bad), final("done")])
        kickoff(file_tools(root, ungated_done), ungated_llm)
        memory, done = MemorySink(), []
        tools = gate_tools(file_tools(root, done), gate=Gate("files", sinks=[memory]))
        llm = ScriptedLLM([action("write_file", bad), final("done")])
        kickoff(tools, llm)
        assert last_prompt(llm) == last_prompt(ungated_llm)
        assert "validation failed" in last_prompt(llm)
        assert done == ungated_done == []
        assert outcomes(memory) == []


class Stuck(BaseTool):
    """An async tool that never finishes, and counts its starts."""

    name: str = "wait_for_report"
    description: str = "Waits for a report that never comes."
    starts: int = 0

    async def _run(self, path: str) -> str:
        self.starts += 1
        await asyncio.Event().wait()
        return path


class TestGateOutcomes:
    def test_gate_timeout_is_text_not_a_retry(self) -> None:
        """A call the gate times out is the observation text, not an exception: CrewAI does not run
        the tool again; one ToolUse with outcome "timeout"."""
        memory = MemorySink()
        stuck = Stuck()
        tools = gate_tools([stuck], gate=Gate("reports", sinks=[memory]), timeout_s=0.05)
        llm = ScriptedLLM([action("wait_for_report", {"path": "q3.txt"}), echo_observation])
        assert "timed out after 0.05 s" in kickoff(tools, llm)
        assert stuck.starts == 1
        assert [(e.type, e.outcome) for e in memory.events if e.type in OUTCOMES] == [("ToolUse", "timeout")]

    def test_after_interceptor_output_is_what_the_model_reads(self, root: Path) -> None:
        """An after-interceptor's transformed output is the observation."""

        class Shout:
            name = "shout"

            def after_tool_call(self, call: ToolCall, output: Any) -> Any:
                return str(output).upper()

        tools = gate_tools(file_tools(root, []), gate=Gate("files", interceptors=[Shout()]))
        llm = ScriptedLLM([action("write_file", {"path": "note.txt", "text": "hi"}), echo_observation])
        assert kickoff(tools, llm) == "WROTE NOTE.TXT"


class Summer(BaseTool):
    """A tool whose `_run` is a coroutine function."""

    name: str = "add"
    description: str = "Adds two numbers."

    async def _run(self, a: int, b: int) -> str:
        return str(a + b)


@tool("multiply")
async def multiply(a: int, b: int) -> str:
    """Multiplies two numbers."""
    return str(a * b)


class Fraction(BaseModel):
    numerator: int
    denominator: int


class TestToolKinds:
    @pytest.mark.parametrize(("made", "name", "expected"), [(Summer, "add", "5"), (lambda: multiply, "multiply", "6")])
    def test_async_tools(self, made: Callable[[], BaseTool], name: str, expected: str) -> None:
        """An async tool (a coroutine `_run`, or an async function under @tool) runs once, awaited."""
        memory = MemorySink()
        tools = gate_tools([made()], gate=Gate("maths", sinks=[memory]))
        llm = ScriptedLLM([action(name, {"a": 2, "b": 3}), echo_observation])
        assert kickoff(tools, llm) == expected
        assert outcomes(memory) == [("ToolUse", name)]

    def test_tool_starting_its_own_loop(self) -> None:
        """A sync tool that runs its own event loop (asyncio.run, as many CrewAI tools do) works gated."""

        @tool("slow_add")
        def slow_add(a: int, b: int) -> str:
            """Adds two numbers the long way."""

            async def add() -> int:
                await asyncio.sleep(0)
                return a + b

            return str(asyncio.run(add()))

        tools = gate_tools([slow_add], gate=Gate("maths"))
        assert kickoff(tools, ScriptedLLM([action("slow_add", {"a": 2, "b": 3}), echo_observation])) == "5"

    def test_name_the_gate_cannot_take(self, root: Path) -> None:
        """A CrewAI name with spaces is registered under its gate_name, and calls keep working."""
        memory = MemorySink()

        @tool("Read Notes")
        def read_notes(topic: str) -> str:
            """Reads the notes on a topic."""
            return f"notes on {topic}"

        tools = gate_tools([read_notes], gate=Gate("notes", sinks=[memory]))
        assert gate_name("Read Notes") == "Read_Notes"
        assert kickoff(tools, ScriptedLLM([action("Read Notes", {"topic": "q3"}), echo_observation])) == "notes on q3"
        assert outcomes(memory) == [("ToolUse", "Read_Notes")]

    async def test_kickoff_async(self, root: Path) -> None:
        """`kickoff_async` (CrewAI runs the crew in a worker thread) is gated the same way."""
        memory, done = MemorySink(), []
        gate = Gate("files", interceptors=[ProtectFiles(root)], sinks=[memory])
        tools = gate_tools(file_tools(root, done), gate=gate)
        llm = ScriptedLLM([action("delete_file", {"path": "precious.txt"}), echo_observation])
        writer = Agent(role="writer", goal="tidy up", backstory="keeps files tidy", llm=llm, tools=tools)
        task = Task(description="tidy up the files", expected_output="one line", agent=writer)
        result = await Crew(agents=[writer], tasks=[task]).kickoff_async()
        assert result.raw == DENIAL
        assert outcomes(memory) == [("ToolDenied", "delete_file")]

    def test_direct_run_is_gated(self, root: Path) -> None:
        """Calling a gated tool's `run` outside a crew passes the gate too."""
        memory, done = MemorySink(), []
        gate = Gate("files", interceptors=[ProtectFiles(root)], sinks=[memory])
        write, delete = gate_tools(file_tools(root, done), gate=gate)
        assert delete.run(path="precious.txt") == DENIAL
        assert write.run(path="n.txt", text="x") == "wrote n.txt"
        assert outcomes(memory) == [("ToolDenied", "delete_file"), ("ToolUse", "write_file")]


class TestRefuseUngatedTools:
    def test_ungated_tool_is_refused_and_recorded(self, root: Path) -> None:
        """With refuse_ungated_tools, a tool handed to CrewAI ungated does not run: the model reads
        CrewAI's text for a hooked-off call, the gate records one Unmediated event and its coverage
        check fails; the gated tools of the same agent run as usual."""
        memory, done = MemorySink(), []
        gate = Gate("files", sinks=[memory])
        write, delete = file_tools(root, done)
        (gated_write,) = gate_tools([write], gate=gate)
        stop = refuse_ungated_tools(gate)
        try:
            llm = ScriptedLLM(
                [
                    action("delete_file", {"path": "old.txt"}),
                    action("write_file", {"path": "note.txt", "text": "hi"}),
                    final("done"),
                ]
            )
            assert kickoff([gated_write, delete], llm) == "done"
        finally:
            stop()
        assert "Tool execution blocked by hook. Tool: delete_file" in str(llm.prompts[1][-1]["content"])
        assert done == ["write note.txt"]
        assert (root / "old.txt").exists()
        (unmediated,) = [e for e in memory.events if e.type == "Unmediated"]
        assert unmediated.resource == "crewai tool delete_file"
        assert outcomes(memory) == [("ToolUse", "write_file")]
        assert not gate.coverage().ok

    def test_allowed_names_and_stop(self, root: Path) -> None:
        """A name in `allow` runs ungated; once stopped, the hook refuses nothing."""
        done: list[str] = []
        gate = Gate("files")
        write, delete = file_tools(root, done)
        stop = refuse_ungated_tools(gate, allow=["write_file"])
        try:
            kickoff([write], ScriptedLLM([action("write_file", {"path": "a.txt", "text": "a"}), final("done")]))
        finally:
            stop()
        kickoff([delete], ScriptedLLM([action("delete_file", {"path": "old.txt"}), final("done")]))
        assert done == ["write a.txt", "delete old.txt"]
        assert gate.coverage().ok
