"""OpenAI Agents SDK through the gate: gated `FunctionTool`s (an agent as a tool included) and a
gated MCP server (the real test server process) in the SDK's own runner, driven by the SDK's own
scripted model (`agents.testing.ScriptedModel`), no network.

Where a test says "as ungated", it runs the same script against the original tools too and
compares what the model read or what the run raised."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from agents import (
    Agent,
    FunctionTool,
    RunConfig,
    RunContextWrapper,
    Runner,
    RunResult,
    UserError,
    function_tool,
)
from agents.mcp import MCPServerStdio
from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message, function_call

from events import MemorySink, verify_chain
from interceptor_core import (
    Approval,
    ApprovalRequest,
    ConfigurationError,
    Deny,
    Gate,
    RequireApproval,
    Rewrite,
    RunContext,
    ToolApprovalRequiredError,
    ToolBlockedError,
    ToolCall,
)
from interceptor_core.integrations.openai_agents import GatedMCPServer, approve, gate_function_tools, reject

from .conftest import effects, upstream_command
from .files_policy import DENIAL, ProtectFiles

OFFLINE = RunConfig(tracing_disabled=True)
OUTCOMES = ("ToolUse", "ToolDenied", "Substitute", "Blocked")


def output_text(output: Any) -> str:
    """What the model was sent as a tool's output: plain text, or the text of content items."""
    if isinstance(output, list):
        return "".join(output_text(item) for item in output)
    if isinstance(output, dict) and output.get("type") in ("text", "input_text"):
        return str(output["text"])
    return str(output)


def echo_outputs(call: ModelCall) -> list[Any]:
    """The model's answer once it has tool outputs: every output it was sent this turn, joined."""
    outputs = [
        output_text(item["output"])
        for item in call.input
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    ]
    return [assistant_message(" | ".join(outputs))]


def script(*turns: Sequence[tuple[str, Any]]) -> ScriptedModel:
    """A model that makes each turn's tool calls (ids `c<turn>-<index>`), then echoes the outputs."""
    steps: list[Any] = [
        [function_call(name, args, call_id=f"c{t}-{i}") for i, (name, args) in enumerate(turn)]
        for t, turn in enumerate(turns, start=1)
    ]
    return ScriptedModel([*steps, ModelStep.respond(echo_outputs)])


def file_tools(root: Path, done: list[str], **options: Any) -> list[FunctionTool]:
    @function_tool(**options)
    def write_file(path: str, text: str) -> str:
        """Writes text to a file under the root."""
        (root / path).write_text(text)
        done.append(f"write {path}")
        return f"wrote {path}"

    @function_tool(**options)
    def delete_file(path: str) -> str:
        """Deletes a file under the root."""
        (root / path).unlink()
        done.append(f"delete {path}")
        return f"deleted {path}"

    return [write_file, delete_file]


def outcomes(memory: MemorySink) -> list[tuple[str, str, str | None]]:
    """(type, tool, call id) of each outcome event, in order."""
    return [(e.type, e.tool, e.call_id) for e in memory.events if e.type in OUTCOMES]


def assert_chain_whole(memory: MemorySink) -> None:
    report = verify_chain(memory.sealed)
    assert report.ok, report


async def run_agent(tools: list[FunctionTool], model: ScriptedModel, **options: Any) -> RunResult:
    return await Runner.run(Agent(name="writer", tools=tools, model=model), "tidy up", run_config=OFFLINE, **options)


class TestGateFunctionTools:
    async def test_parallel_calls_one_denied(self, root: Path) -> None:
        """Of two parallel calls in one turn the write runs and the delete is denied: the model reads
        the denial, the file stays, and each call leaves one outcome event with the SDK's call id."""
        memory, done = MemorySink(), []
        gate = Gate("files", interceptors=[ProtectFiles()], sinks=[memory])
        tools = gate_function_tools(file_tools(root, done), gate=gate, agent="writer")
        model = script([("write_file", {"path": "note.txt", "text": "hi"}), ("delete_file", {"path": "precious.txt"})])
        result = await run_agent(tools, model, context=RunContext(tenant="acme"))
        assert result.final_output == f"wrote note.txt | {DENIAL}"
        assert (root / "precious.txt").read_text() == "keep me"
        assert done == ["write note.txt"]
        assert sorted(outcomes(memory)) == [("ToolDenied", "delete_file", "c1-1"), ("ToolUse", "write_file", "c1-0")]
        assert {e.tenant for e in memory.events if e.type in OUTCOMES} == {"acme"}
        assert_chain_whole(memory)

    async def test_block_ends_the_run(self, root: Path) -> None:
        """A Block ends the SDK's run (the SDK wraps the ToolBlockedError in its UserError), even with
        the default `failure_error_function`, which turns other failures into text; the tool never runs."""
        memory, done = MemorySink(), []
        gate = Gate("files", interceptors=[ProtectFiles()], sinks=[memory])
        tools = gate_function_tools(file_tools(root, done), gate=gate)
        with pytest.raises(UserError, match="wildcard") as stopped:
            await run_agent(tools, script([("delete_file", {"path": "*"})]))
        assert isinstance(stopped.value.__cause__, ToolBlockedError)
        assert done == []
        assert outcomes(memory) == [("Blocked", "delete_file", "c1-0")]

    async def test_rewrite_reaches_the_tool(self, root: Path) -> None:
        """A Rewrite's arguments are what the original tool gets, through the SDK's own validation."""
        done: list[str] = []

        class KeepOutOfPrecious:
            name = "keep-out-of-precious"

            def before_tool_call(self, call: ToolCall) -> Rewrite | None:
                return Rewrite({**call.args, "path": "safe.txt"}) if call.args["path"] == "precious.txt" else None

        gate = Gate("files", interceptors=[KeepOutOfPrecious()])
        tools = gate_function_tools(file_tools(root, done), gate=gate)
        result = await run_agent(tools, script([("write_file", {"path": "precious.txt", "text": "x"})]))
        assert result.final_output == "wrote safe.txt"
        assert (root / "precious.txt").read_text() == "keep me"
        assert (root / "safe.txt").read_text() == "x"


def failing_tool(failure: Any) -> FunctionTool:
    """A tool that always raises; `failure` is its `failure_error_function` ("unset" for the default)."""
    options = {} if failure == "unset" else {"failure_error_function": failure}

    @function_tool(**options)
    def flaky(path: str, retries: int = 1) -> str:
        """Reads a file that is never there."""
        raise FileNotFoundError(f"no such file: {path}")

    return flaky


def custom_failure(ctx: RunContextWrapper[Any], error: Exception) -> str:
    return f"custom: {type(error).__name__}: {error}"


FAILURES: dict[str, Any] = {"default": "unset", "custom": custom_failure, "none": None}


async def read_or_raise(tools: list[FunctionTool], arguments: Any) -> str:
    """What the model read after one call of `flaky` with `arguments`, or what the run raised."""
    try:
        result = await run_agent(tools, script([("flaky", arguments)]))
    except Exception as exc:
        return f"raised {type(exc).__name__}: {exc}"
    return str(result.final_output)


class TestSdkErrorHandling:
    @pytest.mark.parametrize("failure", FAILURES.values(), ids=FAILURES.keys())
    async def test_tool_errors_as_ungated(self, failure: Any) -> None:
        """A tool that raises: with the default `failure_error_function` the model reads the SDK's
        fixed text, with a custom one that function's text, with None the run raises the SDK's
        UserError, as ungated; the gate records one ToolUse with outcome "error"."""
        memory = MemorySink()
        gated = gate_function_tools([failing_tool(failure)], gate=Gate("files", sinks=[memory]))
        ungated = await read_or_raise([failing_tool(failure)], {"path": "gone.txt"})
        assert await read_or_raise(gated, {"path": "gone.txt"}) == ungated
        assert ("no such file" in ungated) == (failure != "unset")
        (use,) = [e for e in memory.events if e.type in OUTCOMES]
        assert (use.type, use.outcome, use.call_id) == ("ToolUse", "error", "c1-0")
        assert "FileNotFoundError: no such file: gone.txt" in use.error

    @pytest.mark.parametrize("failure", FAILURES.values(), ids=FAILURES.keys())
    @pytest.mark.parametrize(
        "arguments", [{"path": 3}, {"retries": 2}, {"path": "a", "retries": "many"}], ids=["type", "missing", "bad"]
    )
    async def test_invalid_arguments_as_ungated(self, failure: Any, arguments: Any) -> None:
        """Arguments the SDK's validation refuses: the model reads (or the run raises) the SDK's own
        answer, with each failure function, and the gate records the call."""
        memory = MemorySink()
        gated = gate_function_tools([failing_tool(failure)], gate=Gate("files", sinks=[memory]))
        ungated = await read_or_raise([failing_tool(failure)], arguments)
        assert await read_or_raise(gated, arguments) == ungated
        assert "FileNotFoundError" not in ungated  # the SDK refused the arguments; the tool never ran
        (use,) = [e for e in memory.events if e.type in OUTCOMES]
        assert (use.type, use.outcome, use.call_id) == ("ToolUse", "error", "c1-0")
        assert "ModelBehaviorError: Invalid JSON input for tool flaky" in use.error

    async def test_arguments_the_sdk_accepts_reach_the_tool(self, root: Path) -> None:
        """The SDK's validation decides what is valid, not the strict JSON Schema it shows the model:
        a call leaving out a parameter with a default runs, gated as ungated."""
        seen: list[int] = []

        @function_tool
        def count(path: str, times: int = 2) -> str:
            """Counts."""
            seen.append(times)
            return f"{path} x{times}"

        assert count.params_json_schema["required"] == ["path", "times"]
        gated = gate_function_tools([count], gate=Gate("files"))
        assert (await run_agent(gated, script([("count", {"path": "a"})]))).final_output == "a x2"
        assert seen == [2]

    @pytest.mark.parametrize("failure", FAILURES.values(), ids=FAILURES.keys())
    async def test_invalid_json_as_ungated(self, failure: Any) -> None:
        """Arguments that are not JSON: the SDK's own error, then its failure handling, as ungated;
        the gate records the call (refused by validation). With `sdk_approvals` off: by default the
        SDK asks for approval of a call it cannot show an approval policy (next test)."""
        memory = MemorySink()
        gate = Gate("files", sinks=[memory])
        gated = gate_function_tools([failing_tool(failure)], gate=gate, sdk_approvals=False)
        ungated = await read_or_raise([failing_tool(failure)], "{not json")
        assert await read_or_raise(gated, "{not json") == ungated
        assert "Invalid JSON input" in ungated or "An error occurred" in ungated
        (refused,) = [e for e in memory.events if e.type in OUTCOMES]
        assert (refused.type, refused.cause, refused.call_id) == ("ToolDenied", "validation", "c1-0")

    async def test_invalid_json_asks_for_approval_first(self) -> None:
        """With `sdk_approvals` (the default) and no approval handler, the tools' `needs_approval` is a
        policy, and the SDK asks for approval of arguments a policy cannot read; once approved, the
        call gets the SDK's own error handling."""
        memory = MemorySink()
        gated = gate_function_tools([failing_tool("unset")], gate=Gate("files", sinks=[memory]))
        agent = Agent(name="writer", tools=gated, model=script([("flaky", "{not json")]))
        paused = await Runner.run(agent, "go", run_config=OFFLINE)
        (pending,) = paused.interruptions
        state = paused.to_state()
        state.approve(pending)
        resumed = await Runner.run(agent, state, run_config=OFFLINE)
        assert resumed.final_output == "An error occurred while running the tool. Please try again."
        assert [e.type for e in memory.events if e.type in OUTCOMES] == ["ToolDenied"]


class DeleteNeedsApproval:
    name = "delete-needs-approval"

    def before_tool_call(self, call: ToolCall) -> RequireApproval | None:
        return RequireApproval("deleting needs a human") if call.tool_name == "delete_file" else None


class TestApprovals:
    async def gated_run(
        self, root: Path, done: list[str], memory: MemorySink, **gate_options: Any
    ) -> tuple[Agent[Any], RunResult]:
        gate = Gate("files", interceptors=[DeleteNeedsApproval()], sinks=[memory], **gate_options)
        tools = gate_function_tools(file_tools(root, done), gate=gate, agent="writer")
        model = script([("write_file", {"path": "note.txt", "text": "hi"}), ("delete_file", {"path": "old.txt"})])
        agent = Agent(name="writer", tools=tools, model=model)
        return agent, await Runner.run(agent, "tidy up", run_config=OFFLINE, context=RunContext(tenant="acme"))

    async def test_require_approval_interrupts_and_resumes_approved(self, root: Path) -> None:
        """With no approval handler, `RequireApproval` is the SDK's interruption: the run pauses
        with the call in `interruptions` (the other call ran), nothing deleted, the pause recorded as
        the durable `ApprovalRequested` and no outcome; approved on the run's state, the resumed run
        passes the chain again (the request asked again under the same approval id), deletes, and
        the call leaves one outcome."""
        memory, done = MemorySink(), []
        agent, paused = await self.gated_run(root, done, memory)
        (pending,) = paused.interruptions
        assert (pending.name, pending.call_id) == ("delete_file", "c1-1")
        assert done == ["write note.txt"]
        assert (root / "old.txt").exists()

        state = paused.to_state()
        state.approve(pending)
        resumed = await Runner.run(agent, state, run_config=OFFLINE)
        assert resumed.interruptions == []
        assert done == ["write note.txt", "delete old.txt"]
        assert not (root / "old.txt").exists()
        assert "deleted old.txt" in str(resumed.final_output)
        calls = [(e.type, e.tool, e.call_id) for e in memory.events if e.type != "ToolsRegistered"]
        assert sorted(calls[:2]) == [("ApprovalRequested", "delete_file", "c1-1"), ("ToolUse", "write_file", "c1-0")]
        assert calls[2:] == [
            ("ApprovalRequested", "delete_file", "c1-1"),
            ("ApprovalResolved", "delete_file", "c1-1"),
            ("ToolUse", "delete_file", "c1-1"),
        ]
        paused_request = next(e for e in memory.events if e.type == "ApprovalRequested")
        assert (paused_request.tenant, paused_request.requested_by) == ("acme", ("delete-needs-approval",))
        resolved = next(e for e in memory.events if e.type == "ApprovalResolved")
        assert resolved.approved is True
        assert {e.approval_id for e in memory.of_type("ApprovalRequested")} == {resolved.approval_id}
        assert outcomes(memory).count(("ToolUse", "delete_file", "c1-1")) == 1
        assert_chain_whole(memory)

    async def test_streamed_run_interrupts_too(self, root: Path) -> None:
        """`Runner.run_streamed` pauses on the same call, and resumes streamed."""
        done: list[str] = []
        gate = Gate("files", interceptors=[DeleteNeedsApproval()])
        tools = gate_function_tools(file_tools(root, done), gate=gate)
        agent = Agent(name="writer", tools=tools, model=script([("delete_file", {"path": "old.txt"})]))
        paused = Runner.run_streamed(agent, "tidy up", run_config=OFFLINE)
        async for _ in paused.stream_events():
            pass
        (pending,) = paused.interruptions
        assert done == []
        state = paused.to_state()
        state.approve(pending)
        resumed = Runner.run_streamed(agent, state, run_config=OFFLINE)
        async for _ in resumed.stream_events():
            pass
        assert done == ["delete old.txt"]
        assert resumed.final_output == "deleted old.txt"

    async def test_rejected_never_runs_and_is_recorded(self, root: Path) -> None:
        """Rejected with `reject(state, item, by=, note=)`, the call never reaches the tool: the
        model reads the gate's refusal naming the reviewer and the note, and the call leaves the
        request under the pause's approval id, the refusal and one `ToolDenied`."""
        memory, done = MemorySink(), []
        agent, paused = await self.gated_run(root, done, memory)
        (pending,) = paused.interruptions
        state = paused.to_state()
        refusal = await reject(state, pending, by="alice", note="not today")
        resumed = await Runner.run(agent, state, run_config=OFFLINE)
        assert (
            refusal
            == "The call to delete_file needs approval (deleting needs a human) and was refused by alice: not today"
        )
        assert refusal in str(resumed.final_output)
        assert done == ["write note.txt"]
        assert (root / "old.txt").exists()
        assert sorted(outcomes(memory)) == [("ToolDenied", "delete_file", "c1-1"), ("ToolUse", "write_file", "c1-0")]
        delete = [e.type for e in memory.events if e.call_id == "c1-1"]
        assert delete == ["ApprovalRequested", "ApprovalRequested", "ApprovalResolved", "ToolDenied"]
        resolved = memory.of_type("ApprovalResolved")[0]
        assert (resolved.approved, resolved.by, resolved.note) == (False, "alice", "not today")
        assert {e.approval_id for e in memory.of_type("ApprovalRequested")} == {resolved.approval_id}
        assert_chain_whole(memory)

    async def test_a_plain_sdk_rejection_is_recorded_once(self, root: Path) -> None:
        """`state.reject(item)`, the SDK's own, is recorded too: the call never reaches the tool,
        the model reads the SDK's rejection message, and the call leaves the request under the
        pause's approval id, the refusal (`by` unknown, the SDK's message as the note) and one
        `ToolDenied`, not again when the run lists its tools on later turns."""
        memory, done = MemorySink(), []
        gate = Gate("files", interceptors=[DeleteNeedsApproval()], sinks=[memory])
        tools = gate_function_tools(file_tools(root, done), gate=gate, agent="writer")
        model = script([("delete_file", {"path": "old.txt"})], [("write_file", {"path": "note.txt", "text": "hi"})])
        agent = Agent(name="writer", tools=tools, model=model)
        paused = await Runner.run(agent, "tidy up", run_config=OFFLINE, context=RunContext(tenant="acme"))
        (pending,) = paused.interruptions
        state = paused.to_state()
        state.reject(pending, rejection_message="not today")
        resumed = await Runner.run(agent, state, run_config=OFFLINE)
        assert resumed.final_output == "not today | wrote note.txt"
        sent = [output_text(i["output"]) for i in model.calls[1].input if i.get("type") == "function_call_output"]
        assert sent == ["not today"]
        assert done == ["write note.txt"]
        assert (root / "old.txt").exists()
        trail = [e.type for e in memory.events if e.call_id == "c1-0"]
        assert trail == ["ApprovalRequested", "ApprovalRequested", "ApprovalResolved", "ToolDenied"]
        resolved = memory.of_type("ApprovalResolved")[0]
        assert (resolved.approved, resolved.by, resolved.note) == (False, None, "not today")
        assert resolved.tenant == "acme"
        assert {e.approval_id for e in memory.of_type("ApprovalRequested")} == {resolved.approval_id}
        assert outcomes(memory) == [("ToolDenied", "delete_file", "c1-0"), ("ToolUse", "write_file", "c2-0")]
        assert_chain_whole(memory)

    async def test_a_sticky_rejection_reaches_only_its_own_runs_pause(self, root: Path) -> None:
        """Two runs of one agent paused on the same tool; one rejects every call of it
        (`always_reject=True`): only its own pause is recorded refused, the other stays pending and
        is approved later."""
        memory, done = MemorySink(), []
        gate = Gate("files", interceptors=[DeleteNeedsApproval()], sinks=[memory])
        tools = gate_function_tools(file_tools(root, done), gate=gate, agent="writer")

        def agent(call_id: str) -> Agent[Any]:
            steps = [[function_call("delete_file", {"path": "old.txt"}, call_id=call_id)], [assistant_message("ok")]]
            return Agent(name="writer", tools=tools, model=ScriptedModel(steps))

        first, second = agent("r1"), agent("r2")
        paused_first = await Runner.run(first, "go", run_config=OFFLINE)
        paused_second = await Runner.run(second, "go", run_config=OFFLINE)
        state = paused_first.to_state()
        state.reject(paused_first.interruptions[0], always_reject=True)
        await Runner.run(first, state, run_config=OFFLINE)
        assert [(e.call_id, e.approved) for e in memory.of_type("ApprovalResolved")] == [("r1", False)]
        other = paused_second.to_state()
        other.approve(paused_second.interruptions[0])
        await Runner.run(second, other, run_config=OFFLINE)
        assert [(e.call_id, e.approved) for e in memory.of_type("ApprovalResolved")] == [("r1", False), ("r2", True)]
        assert done == ["delete old.txt"]
        assert outcomes(memory) == [("ToolDenied", "delete_file", "r1"), ("ToolUse", "delete_file", "r2")]

    async def test_a_plain_sdk_rejection_after_a_round_trip(self, root: Path) -> None:
        """The state read back from its string and rejected with no message: recorded once, the
        note saying the SDK's run rejected it; `reject` on another pause is not recorded twice."""
        from agents import RunState

        memory, done = MemorySink(), []
        gate = Gate("files", interceptors=[DeleteNeedsApproval()], sinks=[memory])
        tools = gate_function_tools(file_tools(root, done), gate=gate, agent="writer")
        model = script([("delete_file", {"path": "old.txt"}), ("delete_file", {"path": "b.txt"})])
        agent = Agent(name="writer", tools=tools, model=model)
        paused = await Runner.run(agent, "tidy up", run_config=OFFLINE)
        state = await RunState.from_string(agent, paused.to_state().to_string())
        first, second = state.get_interruptions()
        state.reject(first)
        await reject(state, second, by="alice")
        await Runner.run(agent, state, run_config=OFFLINE)
        assert done == []
        resolved = {e.call_id: (e.by, e.note) for e in memory.of_type("ApprovalResolved")}
        assert resolved == {
            "c1-0": (None, "rejected in the OpenAI Agents SDK run (RunState.reject)"),
            "c1-1": ("alice", None),
        }
        assert sorted(outcomes(memory)) == [
            ("ToolDenied", "delete_file", "c1-0"),
            ("ToolDenied", "delete_file", "c1-1"),
        ]
        assert_chain_whole(memory)

    async def test_approve_names_the_approver(self, root: Path) -> None:
        """Approved with `approve(state, item, by=, note=)`, the call runs once and its
        `ApprovalResolved` names the approver and the note, under the pause's approval id."""
        memory, done = MemorySink(), []
        agent, paused = await self.gated_run(root, done, memory)
        (pending,) = paused.interruptions
        state = paused.to_state()
        approve(state, pending, by="alice", note="looked at it")
        await Runner.run(agent, state, run_config=OFFLINE)
        assert done == ["write note.txt", "delete old.txt"]
        (resolved,) = memory.of_type("ApprovalResolved")
        assert (resolved.approved, resolved.by, resolved.note) == (True, "alice", "looked at it")
        assert {e.approval_id for e in memory.of_type("ApprovalRequested")} == {resolved.approval_id}
        assert outcomes(memory).count(("ToolUse", "delete_file", "c1-1")) == 1
        assert_chain_whole(memory)

    async def test_decisions_travel_in_the_state_string(self, root: Path) -> None:
        """Each side built anew, as separate processes would be (no pause of theirs in memory): one
        pauses two calls and writes its state to a string; one reads it, approves the first with
        `approve(by=)`, rejects the second with the SDK's own `state.reject` and writes the state
        again; one resumes from that string. The approval names who approved; the SDK's rejection
        is recorded once (the request under the pause's approval id, the refusal by nobody with the
        SDK's message, `ToolDenied`) and the call never runs."""
        from agents import RunState

        def side(memory: MemorySink, done: list[str], model: ScriptedModel) -> Agent[Any]:
            gate = Gate("files", interceptors=[DeleteNeedsApproval()], sinks=[memory])
            return Agent(name="writer", tools=gate_function_tools(file_tools(root, done), gate=gate), model=model)

        (root / "b.txt").write_text("b")
        pausing, deciding, resuming = MemorySink(), MemorySink(), MemorySink()
        done: list[str] = []
        first_model = script([("delete_file", {"path": "old.txt"}), ("delete_file", {"path": "b.txt"})])
        paused = await Runner.run(side(pausing, done, first_model), "tidy up", run_config=OFFLINE)
        assert [e.call_id for e in pausing.of_type("ApprovalRequested")] == ["c1-0", "c1-1"]
        reviewer = side(deciding, done, ScriptedModel([]))
        state = await RunState.from_string(reviewer, paused.to_state().to_string())
        first, second = state.get_interruptions()
        approve(state, first, by="alice", note="looked at it")
        state.reject(second, rejection_message="no thanks")
        decided = state.to_string()
        agent = side(resuming, done, ScriptedModel([ModelStep.respond(echo_outputs)]))
        resumed = await Runner.run(agent, await RunState.from_string(agent, decided), run_config=OFFLINE)
        assert resumed.final_output == "deleted old.txt | no thanks"
        assert done == ["delete old.txt"]
        assert (root / "b.txt").exists()
        assert [e.type for e in deciding.events if e.type != "ToolsRegistered"] == []
        resolved = {e.call_id: (e.approved, e.by, e.note) for e in resuming.of_type("ApprovalResolved")}
        assert resolved == {"c1-0": (True, "alice", "looked at it"), "c1-1": (False, None, "no thanks")}
        for call_id in ("c1-0", "c1-1"):
            trail = [e for e in [*pausing.events, *resuming.events] if e.call_id == call_id]
            assert [e.type for e in trail][:3] == ["ApprovalRequested", "ApprovalRequested", "ApprovalResolved"]
            assert len({e.approval_id for e in trail[:3]}) == 1
        assert sorted(outcomes(resuming)) == [("ToolDenied", "delete_file", "c1-1"), ("ToolUse", "delete_file", "c1-0")]
        assert_chain_whole(resuming)

    async def test_state_survives_serialization(self, root: Path) -> None:
        """The paused run's state, written to JSON and read back, resumes like the original."""
        from agents import RunState

        memory, done = MemorySink(), []
        agent, paused = await self.gated_run(root, done, memory)
        state = await RunState.from_string(agent, paused.to_state().to_string())
        (pending,) = state.get_interruptions()
        state.approve(pending)
        await Runner.run(agent, state, run_config=OFFLINE)
        assert done == ["write note.txt", "delete old.txt"]

    async def test_gate_handler_answers_instead(self, root: Path) -> None:
        """A gate with an approval handler of its own asks it, inside the call: no interruption."""
        memory, done, asked = MemorySink(), [], []

        def handler(request: ApprovalRequest) -> Approval:
            asked.append((request.tool, request.call_id))
            return Approval(approved=False, by="ops", note="not now")

        _, result = await self.gated_run(root, done, memory, approval_handler=handler)
        assert result.interruptions == []
        assert asked == [("delete_file", "c1-1")]
        assert "refused by ops: not now" in str(result.final_output)
        assert (root / "old.txt").exists()

    async def test_sdk_approvals_off_raises(self, root: Path) -> None:
        """`sdk_approvals=False`: an approval nobody can give ends the run, as on the other routes."""
        done: list[str] = []
        gate = Gate("files", interceptors=[DeleteNeedsApproval()])
        tools = gate_function_tools(file_tools(root, done), gate=gate, sdk_approvals=False)
        with pytest.raises(UserError) as stopped:
            await run_agent(tools, script([("delete_file", {"path": "old.txt"})]))
        assert isinstance(stopped.value.__cause__, ToolApprovalRequiredError)
        assert (root / "old.txt").exists()

    @pytest.mark.parametrize("approved", [True, False], ids=["approved", "rejected"])
    async def test_the_tools_own_needs_approval_is_recorded(self, root: Path, approved: bool) -> None:
        """A tool's own `needs_approval=True` interrupts as ungated, and the gate records it: the
        pause is the request (asked by "openai-agents-approval"); approved, the call runs once after
        the request and the approval; rejected with `reject`, it never reaches the tool and leaves
        the refusal and one `ToolDenied`."""
        memory, done = MemorySink(), []
        gate = Gate("files", interceptors=[ProtectFiles()], sinks=[memory])
        tools = gate_function_tools(file_tools(root, done, needs_approval=True), gate=gate)
        agent = Agent(name="writer", tools=tools, model=script([("delete_file", {"path": "old.txt"})]))
        paused = await Runner.run(agent, "go", run_config=OFFLINE)
        (pending,) = paused.interruptions
        assert [e.type for e in memory.events if e.call_id == "c1-0"] == ["ApprovalRequested"]
        assert memory.of_type("ApprovalRequested")[0].requested_by == ("openai-agents-approval",)
        state = paused.to_state()
        if approved:
            state.approve(pending)
        else:
            await reject(state, pending, by="bob")
        await Runner.run(agent, state, run_config=OFFLINE)
        assert done == (["delete old.txt"] if approved else [])
        outcome = "ToolUse" if approved else "ToolDenied"
        trail = [e.type for e in memory.events if e.call_id == "c1-0"]
        assert trail == ["ApprovalRequested", "ApprovalRequested", "ApprovalResolved", outcome]
        resolved = memory.of_type("ApprovalResolved")[0]
        assert (resolved.approved, resolved.by) == (approved, None if approved else "bob")
        assert_chain_whole(memory)

    async def test_tool_own_needs_approval_is_kept(self, root: Path) -> None:
        """A tool's own `needs_approval` still interrupts, before the gate sees the call; approved,
        the call then passes the chain."""
        memory, done = MemorySink(), []
        gate = Gate("files", interceptors=[ProtectFiles()], sinks=[memory])
        tools = gate_function_tools(file_tools(root, done, needs_approval=True), gate=gate)
        agent = Agent(name="writer", tools=tools, model=script([("delete_file", {"path": "precious.txt"})]))
        paused = await Runner.run(agent, "go", run_config=OFFLINE)
        (pending,) = paused.interruptions
        assert outcomes(memory) == []
        state = paused.to_state()
        state.approve(pending)
        resumed = await Runner.run(agent, state, run_config=OFFLINE)
        assert resumed.final_output == DENIAL
        assert outcomes(memory) == [("ToolDenied", "delete_file", "c1-0")]

    @pytest.mark.parametrize("arguments", [{"path": "a", "times": 3}, {"path": "a"}], ids=["given", "default"])
    async def test_tool_own_approval_policy_as_ungated(self, arguments: dict[str, Any]) -> None:
        """A tool's own `needs_approval` function is asked as the SDK asks it ungated: with the
        arguments when the tool's validation leaves them as they are; a call relying on a default
        asks for approval without asking the policy."""

        def counting_tool(asked: list[dict[str, Any]]) -> FunctionTool:
            async def policy(ctx: RunContextWrapper[Any], params: dict[str, Any], call_id: str) -> bool:
                asked.append(params)
                return False

            @function_tool(needs_approval=policy)
            def count(path: str, times: int = 2) -> str:
                """Counts."""
                return f"{path} x{times}"

            return count

        seen: list[tuple[int, list[dict[str, Any]]]] = []
        for gated in (False, True):
            asked: list[dict[str, Any]] = []
            tools = [counting_tool(asked)]
            if gated:
                tools = gate_function_tools(tools, gate=Gate("files"))
            result = await run_agent(tools, script([("count", arguments)]))
            seen.append((len(result.interruptions), asked))
        assert seen[0] == seen[1]
        assert seen[0] == ((0, [arguments]) if "times" in arguments else (1, []))


class TestAgentAsTool:
    async def test_agent_tool_denied_before_the_inner_run(self, root: Path) -> None:
        """An agent turned into a tool (`as_tool`) passes the gate like any function tool: of two
        parallel calls one runs the inner agent (whose write happens), the denied one never starts it."""
        memory, done = MemorySink(), []
        inner_model = script([("write_file", {"path": "note.txt", "text": "hi"})])
        inner = Agent(name="clerk", tools=file_tools(root, done), model=inner_model)

        class NoPreciousDelegation:
            name = "no-precious-delegation"

            def before_tool_call(self, call: ToolCall) -> Deny | None:
                return Deny(DENIAL) if "precious.txt" in call.args.get("input", "") else None

        gate = Gate("files", interceptors=[NoPreciousDelegation()], sinks=[memory])
        tools = gate_function_tools([inner.as_tool("clerk", "Does file chores")], gate=gate, agent="boss")
        model = script([("clerk", {"input": "write note.txt"}), ("clerk", {"input": "delete precious.txt"})])
        result = await Runner.run(Agent(name="boss", tools=tools, model=model), "tidy up", run_config=OFFLINE)
        assert result.final_output == f"wrote note.txt | {DENIAL}"
        assert len(inner_model.calls) == 2  # one inner run: its tool call, then its answer
        assert done == ["write note.txt"]
        assert (root / "precious.txt").read_text() == "keep me"
        # The inner agent's own write passed the gate too, in the scope boss/clerk.
        assert sorted(outcomes(memory)) == [
            ("ToolDenied", "clerk", "c1-1"),
            ("ToolUse", "clerk", "c1-0"),
            ("ToolUse", "write_file", "c1-0"),
        ]


class TestNestedAgentsTools:
    """Gating an agent made a tool gates the tools of the agents nested in it."""

    @staticmethod
    def support_agent(closed: list[str], model: ScriptedModel) -> Agent[Any]:
        @function_tool
        def delete_account(account: str) -> str:
            """Deletes a customer account."""
            closed.append(account)
            return f"deleted {account}"

        @function_tool
        def lookup(account: str) -> str:
            """Looks an account up."""
            return f"{account}: active"

        return Agent(name="support", tools=[lookup, delete_account], model=model)

    async def test_a_nested_delete_is_decided_and_recorded(self) -> None:
        """The nested agent's `delete_account` passes the gate in a scope of its own (`boss/support`,
        registered with the outer tools): denied, it never runs, the nested model reads the denial,
        and the events record both the outer call and the nested one."""
        memory, closed = MemorySink(), []

        class NoDeletes:
            name = "no-deletes"

            def before_tool_call(self, call: ToolCall) -> Deny | None:
                return Deny("accounts are closed by people") if call.tool_name == "delete_account" else None

        inner_model = script([("lookup", {"account": "7"}), ("delete_account", {"account": "7"})])
        support = self.support_agent(closed, inner_model)
        gate = Gate("shop", interceptors=[NoDeletes()], sinks=[memory])
        tools = gate_function_tools([support.as_tool("support", "Handles accounts")], gate=gate, agent="boss")
        model = script([("support", {"input": "close account 7"})])
        result = await Runner.run(Agent(name="boss", tools=tools, model=model), "go", run_config=OFFLINE)
        assert closed == []
        assert result.final_output == "7: active | accounts are closed by people"
        registered = {e.agent: sorted(t.name for t in e.tools) for e in memory.of_type("ToolsRegistered")}
        assert registered == {"boss": ["support"], "boss/support": ["delete_account", "lookup"]}
        decided = sorted((e.type, e.agent, e.tool) for e in memory.events if e.type in OUTCOMES)
        assert decided == [
            ("ToolDenied", "boss/support", "delete_account"),
            ("ToolUse", "boss", "support"),
            ("ToolUse", "boss/support", "lookup"),
        ]
        assert gate.coverage().registered == {"support", "lookup", "delete_account"}
        assert_chain_whole(memory)

    async def test_agents_nested_deeper_are_gated_once(self) -> None:
        """An agent two levels down is gated in `boss/desk/support`; gating again leaves the gated
        tools as they are (no second scope)."""
        memory, closed = MemorySink(), []
        support = self.support_agent(closed, script([("delete_account", {"account": "9"})]))
        desk = Agent(
            name="desk", tools=[support.as_tool("support", "Accounts")], model=script([("support", {"input": "x"})])
        )
        gate = Gate("shop", sinks=[memory])
        tools = gate_function_tools([desk.as_tool("desk", "The desk")], gate=gate, agent="boss")
        gate_function_tools([desk.as_tool("desk", "The desk")], gate=gate, agent="boss-again")
        await Runner.run(
            Agent(name="boss", tools=tools, model=script([("desk", {"input": "y"})])), "go", run_config=OFFLINE
        )
        assert closed == ["9"]
        scopes = [e.agent for e in memory.of_type("ToolsRegistered")]
        assert sorted(scopes) == ["boss", "boss-again", "boss/desk", "boss/desk/support"]
        assert [(e.agent, e.tool) for e in memory.of_type("ToolUse") if e.tool == "delete_account"] == [
            ("boss/desk/support", "delete_account")
        ]

    @pytest.mark.parametrize("approved", [True, False], ids=["approved", "rejected"])
    async def test_a_nested_call_paused_for_approval_is_decided_from_the_outer_run(self, approved: bool) -> None:
        """A nested call the chain requires approval for interrupts the outer run (the SDK carries
        nested interruptions up); approved or rejected there (`approve` and `reject` find the nested
        gated tool), it leaves its request, the decision naming who and one outcome, in the nested
        scope. The outer call
        that ran the nested agent paused with it, and leaves one outcome, once resumed."""
        memory, closed = MemorySink(), []

        class AskBeforeDeleting:
            name = "ask-before-deleting"

            def before_tool_call(self, call: ToolCall) -> RequireApproval | None:
                return RequireApproval("closing needs a human") if call.tool_name == "delete_account" else None

        support = self.support_agent(closed, script([("delete_account", {"account": "7"})]))
        gate = Gate("shop", interceptors=[AskBeforeDeleting()], sinks=[memory])
        tools = gate_function_tools([support.as_tool("support", "Handles accounts")], gate=gate, agent="boss")
        boss = Agent(name="boss", tools=tools, model=script([("support", {"input": "close account 7"})]))
        paused = await Runner.run(boss, "go", run_config=OFFLINE)
        (pending,) = paused.interruptions
        assert (pending.tool_name, closed) == ("delete_account", [])
        assert outcomes(memory) == []
        state = paused.to_state()
        if approved:
            approve(state, pending, by="alice")
        else:
            await reject(state, pending, by="alice")
        await Runner.run(boss, state, run_config=OFFLINE)
        assert closed == (["7"] if approved else [])
        assert [(e.approved, e.by) for e in memory.of_type("ApprovalResolved")] == [(approved, "alice")]
        nested = [
            (e.type, e.agent) for e in memory.events if e.tool == "delete_account" and e.type != "ToolsRegistered"
        ]
        outcome = "ToolUse" if approved else "ToolDenied"
        assert nested == [
            (kind, "boss/support") for kind in ("ApprovalRequested", "ApprovalRequested", "ApprovalResolved", outcome)
        ]
        assert [(e.type, e.agent) for e in memory.events if e.tool == "support" and e.type in OUTCOMES] == [
            ("ToolUse", "boss")
        ]
        assert_chain_whole(memory)

    def test_an_ungated_mcp_server_inside_is_refused(self) -> None:
        """A nested agent with an MCP server the gate cannot see is a configuration error naming it."""
        inner = Agent(name="files", mcp_servers=[MCPServerStdio({"command": "true"}, name="disk")])
        with pytest.raises(ConfigurationError, match=r"'files'.*MCP server 'disk'.*GatedMCPServer"):
            gate_function_tools([inner.as_tool("files", "Files")], gate=Gate("shop"), agent="boss")


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
        model = script([("write_file", {"path": "note.txt", "text": "hi"}), ("delete_file", {"path": "precious.txt"})])
        async with GatedMCPServer(mcp_server(root), gate=gate, agent="writer") as files:
            agent = Agent(name="writer", mcp_servers=[files], model=model)
            result = await Runner.run(agent, "tidy up", context=acme, run_config=OFFLINE)
        assert result.final_output == f"wrote 2 chars to note.txt | {DENIAL}"
        assert (root / "precious.txt").read_text() == "keep me"
        assert effects(root) == ["write note.txt"]
        registered, *rest = memory.events
        assert registered.type == "ToolsRegistered"
        assert [t.name for t in registered.tools] == ["write_file", "delete_file", "enable_archive"]
        assert sorted((e.type, e.tool, e.call_id, e.tenant) for e in rest) == [
            ("ToolDenied", "delete_file", "c1-1", "acme"),
            ("ToolUse", "write_file", "c1-0", "acme"),
        ]
        assert gate.coverage().registered == {"write_file", "delete_file", "enable_archive"}
        assert_chain_whole(memory)

    async def test_require_approval_interrupts_and_resumes(self, root: Path) -> None:
        """`RequireApproval` with no handler is the SDK's interruption on the MCP route too: the
        server never sees the call until it is approved on the run's state; resumed, the call
        passes the chain again and reaches the server."""
        memory = MemorySink()
        gate = Gate("files", interceptors=[DeleteNeedsApproval()], sinks=[memory])
        async with GatedMCPServer(mcp_server(root), gate=gate, agent="writer") as files:
            agent = Agent(name="writer", mcp_servers=[files], model=script([("delete_file", {"path": "old.txt"})]))
            paused = await Runner.run(agent, "tidy up", run_config=OFFLINE)
            (pending,) = paused.interruptions
            assert effects(root) == []
            state = paused.to_state()
            state.approve(pending)
            resumed = await Runner.run(agent, state, run_config=OFFLINE)
        assert resumed.interruptions == []
        assert effects(root) == ["delete old.txt"]
        assert outcomes(memory) == [("ToolUse", "delete_file", "c1-0")]
        trail = [e.type for e in memory.events if e.call_id == "c1-0"]
        assert trail == ["ApprovalRequested", "ApprovalRequested", "ApprovalResolved", "ToolUse"]
        assert next(e for e in memory.events if e.type == "ApprovalResolved").approved is True
        assert_chain_whole(memory)

    async def test_a_rejection_is_recorded(self, root: Path) -> None:
        """Rejected with `reject`, the MCP call never reaches the server and leaves the request, the
        refusal and one `ToolDenied`."""
        memory = MemorySink()
        gate = Gate("files", interceptors=[DeleteNeedsApproval()], sinks=[memory])
        async with GatedMCPServer(mcp_server(root), gate=gate, agent="writer") as files:
            agent = Agent(name="writer", mcp_servers=[files], model=script([("delete_file", {"path": "old.txt"})]))
            paused = await Runner.run(agent, "tidy up", run_config=OFFLINE)
            (pending,) = paused.interruptions
            state = paused.to_state()
            assert await reject(state, pending, by="alice") is not None
            resumed = await Runner.run(agent, state, run_config=OFFLINE)
        assert "refused by alice" in str(resumed.final_output)
        assert effects(root) == []
        trail = [e.type for e in memory.events if e.call_id == "c1-0"]
        assert trail == ["ApprovalRequested", "ApprovalRequested", "ApprovalResolved", "ToolDenied"]

    async def test_a_plain_sdk_rejection_is_recorded(self, root: Path) -> None:
        """`state.reject(item)` on an MCP call, decided and resumed by a gate and `GatedMCPServer`
        built anew from the state string (as another process would: no pause of theirs in memory):
        recorded when the run lists the server's tools (the request, the refusal with the SDK's
        message, one `ToolDenied`); the server never sees the call."""
        from agents import RunState

        pausing, memory = MemorySink(), MemorySink()
        async with mcp_server(root) as server:
            gate = Gate("files", interceptors=[DeleteNeedsApproval()], sinks=[pausing])
            files = GatedMCPServer(server, gate=gate, agent="writer")
            agent = Agent(name="writer", mcp_servers=[files], model=script([("delete_file", {"path": "old.txt"})]))
            paused = await Runner.run(agent, "tidy up", run_config=OFFLINE)
            assert [e.call_id for e in pausing.of_type("ApprovalRequested")] == ["c1-0"]
            gate = Gate("files", interceptors=[DeleteNeedsApproval()], sinks=[memory])
            files = GatedMCPServer(server, gate=gate, agent="writer")
            agent = Agent(name="writer", mcp_servers=[files], model=ScriptedModel([ModelStep.respond(echo_outputs)]))
            state = await RunState.from_string(agent, paused.to_state().to_string())
            (pending,) = state.get_interruptions()
            state.reject(pending, rejection_message="no")
            resumed = await Runner.run(agent, state, run_config=OFFLINE)
        assert resumed.final_output == "no"
        assert effects(root) == []
        trail = [e.type for e in memory.events if e.call_id == "c1-0"]
        assert trail == ["ApprovalRequested", "ApprovalResolved", "ToolDenied"]
        resolved = memory.of_type("ApprovalResolved")[0]
        assert resolved.approval_id == pausing.of_type("ApprovalRequested")[0].approval_id
        assert (resolved.approved, resolved.by, resolved.note) == (False, None, "no")

    async def test_block_ends_the_run(self, root: Path) -> None:
        """A Block ends the run even though the SDK turns MCP tool failures into text for the
        model; the server never sees the call."""
        gate = Gate("files", interceptors=[ProtectFiles()])
        model = script([("delete_file", {"path": "*"})])
        async with GatedMCPServer(mcp_server(root), gate=gate) as files:
            agent = Agent(name="writer", mcp_servers=[files], model=model)
            with pytest.raises(UserError, match="wildcard") as stopped:
                await Runner.run(agent, "delete everything", run_config=OFFLINE)
        assert isinstance(stopped.value.__cause__, ToolBlockedError)
        assert len(model.calls) == 1
        assert effects(root) == []
