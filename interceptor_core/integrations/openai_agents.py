"""OpenAI Agents SDK through the gate: `gate_function_tools` gates `FunctionTool`s (an agent's
`as_tool()` included, with the tools of the agents nested in it), `GatedMCPServer` gates an SDK MCP
server; `approve` and `reject` decide a call paused for approval naming who decided (the SDK's own
`state.approve(item)` and `state.reject(item)` work too, naming nobody; a plain rejection is
recorded when the resumed run lists its tools, in this process or another one resuming from the
state string).

```python
tools = gate_function_tools([write_file, delete_file], gate=gate, agent="writer")
files = GatedMCPServer(MCPServerStdio({"command": "python", "args": ["my_server.py"]}), gate=gate, agent="files")
agent = agents.Agent(name="writer", tools=tools, mcp_servers=[files])
```

Each gated tool is the original `FunctionTool` with its invocation replaced: the gate decides on
the model's arguments, and only an allowed call reaches the original's own invocation (with the
SDK's tool context, so its argument validation, context injection and output checks apply as
ungated). A denial is the tool's output, so the model reads it; `Block` raises `ToolBlockedError`
and ends the run. A failure of the tool, invalid arguments included, gets the SDK's failure handling
(`failure_error_function`: the default text, a custom one, or `None` to raise) as ungated. The
`RunContext` is the run's `context` when that is one, else `run`; the call id is the SDK's.

An MCP server handed to the SDK as it is (`Agent(mcp_servers=[server])`) is called by the SDK
directly: wrap it in `GatedMCPServer` first, so that its tools are registered and every call of
them passes the chain before it reaches the server.

Needs `openai-agents` (the `openai-agents` extra); importing `interceptor_core` does not load it.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import inspect
import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, assert_never

import mcp_types as types
from agents import FunctionTool
from agents.agent import AgentBase
from agents.agent_tool_state import get_agent_tool_state_scope, peek_agent_tool_run_result
from agents.exceptions import ModelBehaviorError
from agents.mcp import MCPServer, MCPToolMetaContext
from agents.run_context import RunContextWrapper, _ApprovalRecord
from agents.tool import (
    ToolErrorFunction,
    _FailureHandlingFunctionToolInvoker,
    _parse_function_tool_json_input,
    maybe_invoke_function_tool_failure_error_function,
)
from agents.tool_context import ToolContext as SdkToolContext
from agents.util._approvals import evaluate_needs_approval_setting
from pydantic import ValidationError

from interceptor_core.approvals import Approval
from interceptor_core.context import RunContext, ToolContext
from interceptor_core.exceptions import ConfigurationError, ToolApprovalRequiredError, ToolBlockedError
from interceptor_core.gate import AgentScope, Gate, Workflow
from interceptor_core.integrations._approval_probe import approval_asked
from interceptor_core.integrations._framework_approval import FrameworkApproval, framework_asks
from interceptor_core.integrations._schema import SchemaArgs, schema_model, schema_tool
from interceptor_core.integrations.mcp import McpToolError, error_text, result_from_gate
from interceptor_core.tools import Tool

__all__ = ["GatedMCPServer", "approve", "gate_function_tools", "reject"]

# The SDK's invocation pipeline is private API (`_FailureHandlingFunctionToolInvoker` and its
# `_invoke_tool_impl`, `_parse_function_tool_json_input`): the `openai-agents` extra pins 0.24.x,
# and the tests run the real runner over every path that uses them.

_SDK_APPROVED = Approval(approved=True, note="approved in the OpenAI Agents SDK run (RunState.approve)")

_FRAMEWORK = "openai-agents"

_OWN_APPROVAL = "the tool requires approval in the OpenAI Agents SDK (needs_approval)"
"""Why a call asks when the tool's own `needs_approval` does, as the gate records it."""

_STOPPING = (ToolBlockedError, ToolApprovalRequiredError)


@dataclasses.dataclass(slots=True)
class _InFlight:
    """One gated invocation: the SDK's context for the gate tool's body (None while the approval
    step only records that the call waits for approval), and what the original raised."""

    ctx: SdkToolContext[Any] | None
    error: Exception | None = None
    args: Any = None
    """The arguments the gate was given, validated here from `input` (None when they could not be)."""
    input: str = ""
    """The model's arguments as it sent them: what the body passes on while no interceptor rewrote them."""
    nested_pause: Any = None
    """For an agent made a tool whose own run paused for approval: what its invocation returned."""
    nested_paused: bool = False


_in_flight: contextvars.ContextVar[_InFlight | None] = contextvars.ContextVar(
    "callgate_openai_agents_call", default=None
)
"""The gated invocation in flight, for the gate tool's body (run in a copy of the caller's context)."""


def _sdk_invocation(original: FunctionTool) -> Callable[[SdkToolContext[Any], str], Awaitable[Any]]:
    """What the original runs for a call, without its failure handling (the gated tool applies that
    to the gate's outcome): its arguments checked and its function called, as the SDK would."""
    invoker = original.on_invoke_tool
    if isinstance(invoker, _FailureHandlingFunctionToolInvoker):
        return invoker._invoke_tool_impl
    return invoker


def _gate_tool(original: FunctionTool, timeout_s: float | None) -> Tool[Any, Any]:
    """The gate's tool for `original`: its JSON Schema shown as is, and no schema check of its own,
    because the SDK's validation (in the body, before the function) decides what is valid, as it
    does ungated. Interceptors see the model's arguments as a plain mapping."""
    shown = schema_model(original.name, original.params_json_schema)
    model = type(shown.__name__, (shown,), {"__module__": shown.__module__, "validate_schema": None})
    invoke = _sdk_invocation(original)
    name = original.name
    runs_an_agent = bool(getattr(original, "_is_agent_tool", False))

    async def run(args: SchemaArgs, ctx: ToolContext) -> Any:
        flight = _in_flight.get()
        if flight is None or flight.ctx is None:
            raise RuntimeError(f"tool {name!r} was called outside the OpenAI Agents runner")
        # Unchanged by the chain: the model's own text, as the SDK would parse it ungated.
        payload = flight.input if args is flight.args else json.dumps(args.model_dump())
        try:
            value = await invoke(flight.ctx, payload)
        except Exception as exc:
            flight.error = exc  # the SDK's failure handling wants the exception, not its text
            raise
        if runs_an_agent and _nested_run_paused(flight.ctx):
            # The nested run stopped on a call waiting for approval: this call pauses with it (no
            # outcome yet), and the SDK resumes both from the outer run's state.
            flight.nested_pause, flight.nested_paused = value, True
            raise ToolApprovalRequiredError(
                f"a call of the agent run by {name!r} waits for approval",
                tool=name,
                call_id=ctx.call_id,
                interceptor=name,
            )
        return value

    run.__annotations__ = {"args": model, "ctx": ToolContext, "return": Any}
    run.__qualname__ = run.__name__ = f"{name}_via_openai_agents"
    return Tool(run, name=name, description=original.description, timeout_s=timeout_s)


def _nested_run_paused(ctx: SdkToolContext[Any]) -> bool:
    """Whether the nested run of the agent-tool call `ctx` stopped on interruptions (the SDK keeps
    that run's result by the call, to resume it)."""
    if ctx.tool_call is None:
        return False
    result = peek_agent_tool_run_result(ctx.tool_call, scope_id=get_agent_tool_state_scope(ctx))
    return bool(getattr(result, "interruptions", None))


def gate_function_tools(
    tools: Sequence[FunctionTool],
    *,
    gate: Gate | Workflow,
    agent: str = "openai-agents",
    run: RunContext | None = None,
    interceptors: Sequence[object] = (),
    timeout_s: float | None = None,
    sdk_approvals: bool = True,
) -> list[FunctionTool]:
    """Gated copies of `tools`, registered in `gate.agent(agent)` (one `ToolsRegistered` event)
    before this returns. Raises `ConfigurationError` for a name or schema the gate cannot take.

    `sdk_approvals` (default True): when the gate has no `approval_handler`, a call its chain
    requires approval for interrupts the SDK's run (`RunResult.interruptions`; decide it on the
    run's state with `approve(state, item, by=)` or `reject(state, item, by=)`, or the SDK's own
    `state.approve` / `state.reject`, and run again), as a tool's own
    `needs_approval` does. The chain is then asked at the SDK's approval step too, and the pause is
    recorded as the durable `ApprovalRequested` (no outcome: the resumed call has it); the tools'
    `needs_approval` is a function, which the SDK asks only for arguments that are a JSON object:
    other arguments ask for approval first. A tool's own `needs_approval` is recorded the same way
    (asked by `FrameworkApproval`, "openai-agents-approval", after the rest of the chain). False
    leaves `needs_approval` as it is; such a call then raises `ToolApprovalRequiredError`, as on the
    gate's other routes.

    An agent made a tool (`agent.as_tool()`) runs its own tools in a run of its own, which the gate
    would not see: so its function tools are replaced, in place (its `tools` list), by gated copies
    in an agent scope of their own, named `<agent>/<tool name>` (and so on down, for agents nested
    deeper), with the same `run`, `interceptors`, `timeout_s` and `sdk_approvals`. A nested agent
    whose effects the gate cannot reach raises `ConfigurationError` naming it: a tool that is not a
    `FunctionTool`, an MCP server that is not a `GatedMCPServer`, a handoff."""
    options = _Options(gate, run, tuple(interceptors), timeout_s, sdk_approvals)
    return _gate_function_tools(tools, agent, options, set())


@dataclasses.dataclass(frozen=True, slots=True)
class _Options:
    gate: Gate | Workflow
    run: RunContext | None
    interceptors: tuple[object, ...]
    timeout_s: float | None
    sdk_approvals: bool


def _gate_function_tools(
    tools: Sequence[FunctionTool], agent: str, options: _Options, seen: set[int]
) -> list[FunctionTool]:
    for tool in tools:
        _gate_nested_agent(tool, agent, options, seen)
    scope = options.gate.agent(
        agent,
        tools=[_gate_tool(t, options.timeout_s) for t in tools],
        interceptors=(*options.interceptors, FrameworkApproval(_FRAMEWORK)),
    )
    default_run = options.run if options.run is not None else RunContext()
    return [_wrap(t, scope, default_run, options.sdk_approvals) for t in tools]


def _gate_nested_agent(tool: FunctionTool, outer: str, options: _Options, seen: set[int]) -> None:
    """Gate, in place, the tools of the agent `tool` runs when it is an agent made a tool (see
    `gate_function_tools`); an agent met again (a cycle, or one agent behind two tools) is gated once."""
    inner = getattr(tool, "_agent_instance", None) if getattr(tool, "_is_agent_tool", False) else None
    if inner is None or id(inner) in seen:
        return
    seen.add(id(inner))
    where = f"agent {inner.name!r} (the tool {tool.name!r} of {outer!r})"
    for server in inner.mcp_servers:
        if not isinstance(server, GatedMCPServer):
            raise ConfigurationError(
                f"{where} calls the MCP server {server.name!r} ungated: wrap it in GatedMCPServer first"
            )
    if inner.handoffs:
        raise ConfigurationError(f"{where} has handoffs, whose agents' tools the gate cannot see from here")
    ungated: list[FunctionTool] = []
    for own in inner.tools:
        if not isinstance(own, FunctionTool):
            raise ConfigurationError(
                f"{where} has the tool {own.name!r}, which is not a FunctionTool the gate can wrap"
            )
        if not isinstance(own.on_invoke_tool, _GatedInvocation):
            ungated.append(own)
    if not ungated:
        return
    gated = iter(_gate_function_tools(ungated, f"{outer}/{tool.name}", options, seen))
    replaced = {id(t) for t in ungated}
    inner.tools[:] = [next(gated) if id(t) in replaced else t for t in inner.tools]


def _wrap(original: FunctionTool, scope: AgentScope, default_run: RunContext, sdk_approvals: bool) -> FunctionTool:
    invoker = original.on_invoke_tool
    handled = (
        getattr(invoker, "_on_handled_error", None)
        if isinstance(invoker, _FailureHandlingFunctionToolInvoker)
        else None
    )
    gated = _GatedInvocation(
        scope,
        original.name,
        default_run,
        isinstance(invoker, _FailureHandlingFunctionToolInvoker),
        handled,
        own_approval=original.needs_approval,
        pauses_with_nested=sdk_approvals and bool(getattr(original, "_is_agent_tool", False)),
    )
    if not sdk_approvals:
        return dataclasses.replace(original, on_invoke_tool=gated)
    inspectable = invoker if isinstance(invoker, _FailureHandlingFunctionToolInvoker) else None
    needs_approval = _needs_approval(original.needs_approval, inspectable, scope, original.name, default_run)
    is_enabled = _records_rejections(original.is_enabled, _GatedTarget(scope, original.name, default_run))
    return dataclasses.replace(original, on_invoke_tool=gated, needs_approval=needs_approval, is_enabled=is_enabled)


_NOTES = "callgate:paused-calls"
"""Where the gate keeps, in a run's own state, what it knows of the run's calls paused for approval:
the key of an approval record of the run (`RunContextWrapper._approvals`, private), the one place
the SDK's state string (`RunState.to_string`) carries data of ours into another process. The
model API allows no tool the name (no colon in tool names), and the record approves and rejects
nothing; its per-call messages (`rejection_messages`, kept in the string as given) hold, by call
id, a JSON object: the paused call's `tool` and `arguments` (so that a rejection given with the
SDK's own `state.reject` is recorded wherever the run resumes), and `by` and `note` once `approve`
named who approved."""


def _notes(wrapper: object, *, create: bool = False) -> dict[str, str] | None:
    """The notes of the run whose approvals `wrapper` holds (None when it has none)."""
    approvals = getattr(wrapper, "_approvals", None)
    if not isinstance(approvals, dict):
        return None
    record = approvals.get(_NOTES)
    if record is None and create:
        record = approvals[_NOTES] = _ApprovalRecord()
    return record.rejection_messages if isinstance(record, _ApprovalRecord) else None


def _read_note(text: str | None) -> dict[str, Any]:
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _note(wrapper: object, call_id: str, fields: dict[str, Any]) -> None:
    """Add `fields` to the note of the paused call `call_id` in the run's state."""
    notes = _notes(wrapper, create=True)
    if notes is not None:
        notes[call_id] = json.dumps({**_read_note(notes.get(call_id)), **fields})


def _take_note(wrapper: object, call_id: str) -> dict[str, Any]:
    """The note of the call `call_id`, removed from the run's state: the call is concluded."""
    notes = _notes(wrapper)
    return _read_note(notes.pop(call_id, None)) if notes else {}


def _text(note: dict[str, Any], field: str) -> str | None:
    value = note.get(field)
    return value if isinstance(value, str) else None


def _sdk_approval(note: dict[str, Any]) -> Approval:
    """The approval the SDK's run gave a call: who approved and why when `approve` said so in its
    `note`."""
    return Approval(approved=True, by=_text(note, "by"), note=_text(note, "note") or _SDK_APPROVED.note)


def _sdk_rejections(
    wrapper: RunContextWrapper[Any], name: str, default_run: RunContext
) -> list[tuple[str, Any, RunContext]]:
    """The calls of tool `name` paused in this run (noted in its state, wherever it paused) that its
    approvals (`wrapper`) reject, with their arguments and `RunContext`: concluded here, so each is
    recorded once, whichever listing of the tools sees it first. A rejection of every call of the
    tool (`always_reject`) reaches only this run's pauses."""
    notes = _notes(wrapper)
    if not notes:
        return []
    context = wrapper.context
    run = context if isinstance(context, RunContext) else default_run
    found: list[tuple[str, Any, RunContext]] = []
    for call_id, text in list(notes.items()):
        note = _read_note(text)
        if note.get("tool") == name and wrapper.is_tool_approved(name, call_id) is False:
            del notes[call_id]
            found.append((call_id, note.get("arguments"), run))
    return found


IsEnabled = bool | Callable[[RunContextWrapper[Any], AgentBase], Any]

_SDK_REJECTED = "rejected in the OpenAI Agents SDK run (RunState.reject)"


def _records_rejections(own: IsEnabled, target: _GatedTarget) -> IsEnabled:
    """The gated tool's `is_enabled`: the original's, after recording the rejections the SDK gave
    its paused calls with `state.reject(item)`. The SDK answers such a call with its rejection text
    without calling the tool, and lists the agent's tools (asking each `is_enabled`, with the run's
    approvals) before its next model call: that is where the rejection is seen and recorded, as
    `reject` records it, with `by` unknown and the SDK's rejection message as the note, in this
    process or in another one resuming the run from its state string."""

    async def is_enabled(wrapper: RunContextWrapper[Any], agent: AgentBase) -> bool:
        for call_id, params, run in _sdk_rejections(wrapper, target.name, target.default_run):
            note = wrapper.get_rejection_message(target.name, call_id) or _SDK_REJECTED
            with contextlib.suppress(ToolBlockedError):  # a block now is recorded; the run goes on
                await _record_rejection(target, params, run, call_id, None, note)
        if callable(own):
            decided = own(wrapper, agent)
            return bool(await decided if inspect.isawaitable(decided) else decided)
        return own

    return is_enabled


class _GatedInvocation:
    """A gated tool's `on_invoke_tool`: the call passes the gate, whose tool body is the original's
    own invocation; then the SDK's failure handling of the original's kind applies to a failure,
    so the model reads (or the run raises) what it would ungated. A block, or an approval nobody
    can give, ends the run whatever `failure_error_function` says."""

    # The SDK reads the invoker's signature on every call to choose the context it passes; with
    # the annotation a class rather than a string, that is a lookup instead of parsing it twice.
    __signature__ = inspect.Signature(
        [
            inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=SdkToolContext),
            inspect.Parameter("input", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=str),
        ]
    )

    def __init__(
        self,
        scope: AgentScope,
        name: str,
        default_run: RunContext,
        handles_failures: bool,
        on_handled_error: Callable[..., None] | None,
        tool: FunctionTool | None = None,
        *,
        own_approval: bool | NeedsApproval = False,
        pauses_with_nested: bool = False,
    ) -> None:
        self.scope = scope
        self.own_approval = own_approval
        """The original tool's own `needs_approval`: whether an approval the SDK gave answered it."""
        self.pauses_with_nested = pauses_with_nested
        """An agent made a tool, with the SDK's approvals on: its call pauses when its run does."""
        self.name = name
        self.default_run = default_run
        self.handles_failures = handles_failures
        self.on_handled_error = on_handled_error
        self.tool = tool
        self.input_model = scope.tools[name].input_model

    def __agents_bind_function_tool__(self, tool: FunctionTool) -> _GatedInvocation:
        # The SDK binds an invoker to each FunctionTool (copies included) so that failures are
        # formatted with that tool's own `failure_error_function`.
        if tool is self.tool:
            return self
        return _GatedInvocation(
            self.scope,
            self.name,
            self.default_run,
            self.handles_failures,
            self.on_handled_error,
            tool,
            own_approval=self.own_approval,
            pauses_with_nested=self.pauses_with_nested,
        )

    async def __call__(self, ctx: SdkToolContext[Any], input: str) -> Any:
        try:
            return await self._through_gate(ctx, input)
        except _STOPPING:
            raise
        except Exception as exc:
            tool = self.tool
            if not self.handles_failures or tool is None:
                raise
            text = await maybe_invoke_function_tool_failure_error_function(function_tool=tool, context=ctx, error=exc)
            if text is None:
                raise
            if self.on_handled_error is not None:
                self.on_handled_error(tool, exc, input, ctx)
            return text

    async def _through_gate(self, ctx: SdkToolContext[Any], input: str) -> Any:
        scope = self.scope
        context = ctx.context
        run = context if isinstance(context, RunContext) else self.default_run
        approval = None
        asks = None
        note = _take_note(ctx, ctx.tool_call_id)  # it reached the tool: no rejection to look for
        if scope.gate.approval_handler is None and ctx.is_tool_approved(ctx.tool_name, ctx.tool_call_id):
            approval = _sdk_approval(note)
            # The SDK's approval answers the tool's own request too: record it as one.
            asks = await _own_request(self.own_approval, ctx, input, ctx.tool_call_id)
        text = input or "{}"
        flight = _InFlight(ctx, input=text)
        gate_args: Any = text
        # Validated here, so the body can tell whether the chain changed them; bad input is left to
        # the gate, which validates the text again and answers as it does for any.
        with contextlib.suppress(ValidationError):
            gate_args = flight.args = self.input_model.model_validate_json(text)
        token = _in_flight.set(flight)
        try:
            with framework_asks(asks):
                result = await scope.call(
                    self.name,
                    gate_args,
                    run=run,
                    call_id=ctx.tool_call_id,
                    approval=approval,
                    pause_for_approval=self.pauses_with_nested,
                )
        except ToolApprovalRequiredError:
            if flight.nested_paused:
                return flight.nested_pause  # what the SDK's agent tool returns for a paused run
            raise
        finally:
            _in_flight.reset(token)
        match result.kind:
            case "ok" | "substituted":
                return result.value
            case "denied":
                return result.to_model_text()
            case "error":
                if flight.error is not None:
                    raise flight.error
                if result.decided_by == "validation":
                    # Not a JSON object: the SDK's own error for it, then its failure handling.
                    _parse_function_tool_json_input(tool_name=self.name, input_json=input)
                    raise ModelBehaviorError(f"Invalid JSON input for tool {self.name}: {result.message}")
                return result.to_model_text()  # the gate's own failure (a timeout, an after-interceptor)
            case _:
                assert_never(result.kind)


NeedsApproval = Callable[[RunContextWrapper[Any], dict[str, Any], str], Awaitable[bool]]


async def _own_request(
    own: bool | NeedsApproval, run_ctx: RunContextWrapper[Any], input: str, call_id: str
) -> str | None:
    """Why the tool's own `needs_approval` asks about this call (None: it does not)."""
    if own is True:
        return _OWN_APPROVAL
    if not callable(own):
        return None
    try:
        params = json.loads(input or "{}")
    except ValueError:
        return _OWN_APPROVAL  # the SDK asks for approval of arguments it cannot read
    if not isinstance(params, dict):
        return _OWN_APPROVAL
    return _OWN_APPROVAL if await evaluate_needs_approval_setting(own, run_ctx, params, call_id) else None


async def _pause(scope: AgentScope, name: str, params: Any, run: RunContext, call_id: str, asks: str | None) -> bool:
    """Record that the call waits for approval (the durable `ApprovalRequested`, no outcome) when the
    chain, with the tool's own request `asks` added, would ask about it; True if it would."""
    with framework_asks(asks):
        if await approval_asked(scope, name, params, run, call_id) is None:
            return False
        token = _in_flight.set(_InFlight(None))  # the body must not run now, whatever the chain says
        try:
            await scope.call(name, params, run=run, call_id=call_id, pause_for_approval=True)
        except ToolApprovalRequiredError:
            return True
        finally:
            _in_flight.reset(token)
    return False  # the chain changed its mind; the call itself decides again


def _needs_approval(
    own: bool | NeedsApproval,
    invoker: _FailureHandlingFunctionToolInvoker | None,
    scope: AgentScope,
    name: str,
    default_run: RunContext,
) -> NeedsApproval:
    """The gated tool's `needs_approval`: the tool's own setting, or else (when the gate has no
    approval handler) whether the chain requires approval for the call. Either way, with no
    handler, the gate records the pause as the durable `ApprovalRequested` (the tool's own request
    asked by `FrameworkApproval`, "openai-agents-approval") and the SDK interrupts the run; the
    resumed run passes the whole chain again, with the SDK's approval as the answer."""

    async def needs_approval(run_ctx: RunContextWrapper[Any], params: dict[str, Any], call_id: str) -> bool:
        asks = None
        if own is True:
            asks = _OWN_APPROVAL
        elif callable(own):
            # As the SDK does for its own tools: a policy sees the arguments only when the tool's
            # validation leaves them as they are (no default filled in, nothing coerced).
            prepared = invoker.prepare_arguments(json.dumps(params), name) if invoker is not None else None
            if (prepared is not None and not prepared.unchanged) or await evaluate_needs_approval_setting(
                own, run_ctx, params, call_id
            ):
                asks = _OWN_APPROVAL
        if scope.gate.approval_handler is not None:
            return asks is not None
        context = run_ctx.context
        run = context if isinstance(context, RunContext) else default_run
        paused = await _pause(scope, name, params, run, call_id, asks)
        if paused or asks is not None:  # noted for the SDK's own rejection (which never reaches the tool)
            _note(run_ctx, call_id, {"tool": name, "arguments": params})
        return paused or asks is not None

    return needs_approval


async def reject(
    state: Any,
    item: Any,
    *,
    by: str | None = None,
    note: str | None = None,
    run: RunContext | None = None,
    always_reject: bool = False,
) -> str | None:
    """Reject an interrupted call on the run's state, as `state.reject(item)` does, and record the
    refusal: a call the SDK rejects never reaches its tool again, so the gate records it here
    (`ApprovalRequested` under the pause's approval id, `ApprovalResolved` refused `by`, with
    `note`, and the call's one outcome, `ToolDenied`). The model reads the gate's refusal (which
    names `by` and `note`). Returns that text, or None when `item` is not a call of a gated tool
    (then it is rejected with `note` as the message, and nothing is recorded).

    `state` is a `RunState` (`result.to_state()` or `RunState.from_string(...)`), `item` one of
    its `interruptions`. The `RunContext` is `run`, else the run's context when that is one, else
    the tool's default. Raises `ToolBlockedError` if the chain now blocks the call (the SDK's
    rejection is not given then: the block ends the run).
    """
    target = _gated_target(item)
    if target is None:
        state.reject(item, always_reject=always_reject, rejection_message=note)
        return None
    params: Any = item.arguments or "{}"
    with contextlib.suppress(ValueError):
        params = json.loads(params)
    if run is None:
        wrapper = getattr(state, "_context", None)  # the state's own RunContextWrapper (no public accessor)
        context = getattr(wrapper, "context", None)
        run = context if isinstance(context, RunContext) else target.default_run
    call_id = item.call_id or ""
    _take_note(_holder(state, item), call_id)  # recorded here, not again when the run lists its tools
    text = await _record_rejection(target, params, run, call_id, by, note)
    state.reject(item, always_reject=always_reject, rejection_message=text)
    return text


def approve(
    state: Any, item: Any, *, by: str | None = None, note: str | None = None, always_approve: bool = False
) -> None:
    """Approve an interrupted call on the run's state, as `state.approve(item)` does, naming who
    approved: the resumed call's `ApprovalResolved` carries `by` and `note` (the SDK's own approval
    says neither). They are kept in the run's state, its string (`to_string`) included, so a run
    resumed in another process names them too; the SDK checks neither, so whoever may write the
    state may name anyone, as they may approve anything. `state` and `item` are as for `reject`;
    `item` not a call of a gated tool is approved and nothing is kept."""
    state.approve(item, always_approve=always_approve)
    if _gated_target(item) is not None:
        _note(_holder(state, item), item.call_id or "", {"by": by, "note": note})


def _holder(state: Any, item: Any) -> object:
    """The `RunContextWrapper` of the run `item` paused: `state`'s, or that of the nested run of an
    agent made a tool, which the SDK resumes from it (both private)."""
    find = getattr(state, "_find_nested_approval_state", None)
    nested = find(item) if callable(find) else None
    return getattr(nested[0] if nested is not None else state, "_context", None)


async def _record_rejection(
    target: _GatedTarget, params: Any, run: RunContext, call_id: str, by: str | None, note: str | None
) -> str:
    """Record the refusal of a paused call: it passes the chain with the refusal as its answer
    (`ApprovalRequested` under the pause's approval id, `ApprovalResolved`, `ToolDenied`), the
    body never running. Returns the text the gate gives the model. Raises `ToolBlockedError` if
    the chain now blocks the call."""
    scope, name = target.scope, target.name
    asks = None
    if not isinstance(params, dict) or await approval_asked(scope, name, params, run, call_id) is None:
        asks = _OWN_APPROVAL  # the tool's own request (or a chain that no longer asks) was refused
    token = _in_flight.set(_InFlight(None))  # the body must not run, whatever the chain says
    try:
        with framework_asks(asks):
            result = await scope.call(
                name, params, run=run, call_id=call_id, approval=Approval(approved=False, by=by, note=note)
            )
    finally:
        _in_flight.reset(token)
    return result.to_model_text()


@dataclasses.dataclass(frozen=True, slots=True)
class _GatedTarget:
    """Where an interrupted call of a gated tool is decided: its scope, its name there, its default run."""

    scope: AgentScope
    name: str
    default_run: RunContext


def _gated_target(item: Any) -> _GatedTarget | None:
    """The gated tool `item` (a `ToolApprovalItem`) interrupted, among its agent's function tools
    or the tools of its agent's `GatedMCPServer`s; None when it is not gated."""
    agent = getattr(item, "agent", None)
    origin = getattr(item, "tool_origin", None)
    server_name = getattr(origin, "mcp_server_name", None)
    if server_name is not None:
        for server in getattr(agent, "mcp_servers", None) or ():
            scope = server._scope if isinstance(server, GatedMCPServer) else None
            if scope is not None and server.name == server_name and item.tool_name in scope.tools:
                default_run = server.run if server.run is not None else server._default_run
                return _GatedTarget(scope, item.tool_name, default_run)
        return None
    for tool in getattr(agent, "tools", None) or ():
        if isinstance(tool, FunctionTool) and tool.name == item.tool_name:
            invoker = tool.on_invoke_tool
            if isinstance(invoker, _GatedInvocation):
                return _GatedTarget(invoker.scope, invoker.name, invoker.default_run)
            return None
    return None


# -- MCP servers ----------------------------------------------------------------------------------

_mcp_sdk_context: contextvars.ContextVar[RunContextWrapper[Any] | None] = contextvars.ContextVar(
    "callgate_openai_agents_mcp_call", default=None
)
"""The SDK's context of the MCP tool call in flight. The SDK runs the server's meta resolver in the
task of the call just before it starts `call_tool` (in a task copying that context)."""

_mcp_meta: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "callgate_openai_agents_mcp_meta", default=None
)
"""The request `_meta` of the call in flight, for the gate tool's body."""


def _stopping_error(error: BaseException) -> BaseException | None:
    """The block (or unanswerable approval) behind an SDK tool failure, if that is what it was."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, _STOPPING):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


class GatedMCPServer(MCPServer):
    """An Agents SDK MCP server (`MCPServerStdio`, `MCPServerStreamableHttp`, ...) whose tool calls
    pass the gate; hand it to `Agent(mcp_servers=[...])` in place of the server it wraps.

    - Listing: the SDK lists the tools (every turn, or from the wrapped server's cache); tools not
      seen before are registered in `gate.agent(agent)` (one `ToolsRegistered` event) before the
      listing returns, so a tool the server adds later is registered before it can be called.
    - Calling: the gate decides first; only an allowed call reaches the wrapped server. A denial is
      an `isError` result carrying the denial message (what the model reads); a substitute is the
      result; an error the server reports is an `error` outcome. `Block` (or an approval nobody
      can give) ends the SDK's run with `ToolBlockedError` (`ToolApprovalRequiredError`) as the
      cause, whatever the agent's `failure_error_function`.
    - Approvals (`sdk_approvals`, default True): when the gate has no `approval_handler`, a call
      the chain requires approval for interrupts the SDK's run, as for `gate_function_tools`; the
      wrapped server's own approval policy still comes first. False: such a call ends the run.
    - The `RunContext` of a call is the run's `context` when that is one, else `run`, else a
      default one; the call id is the SDK's tool call id.

    Everything else (connecting, cleanup, prompts, resources, the approval policy, tool filters,
    guardrails, structured content, meta resolver and error formatting) is the wrapped server's.
    Safe to share between the runs of one event loop, like the server it wraps.
    """

    def __init__(
        self,
        server: MCPServer,
        *,
        gate: Gate | Workflow,
        agent: str = "openai-agents-mcp",
        run: RunContext | None = None,
        interceptors: Sequence[object] = (),
        timeout_s: float | None = None,
        sdk_approvals: bool = True,
    ) -> None:
        super().__init__(
            use_structured_content=server.use_structured_content,
            tool_meta_resolver=self._remember_call,
            custom_data_extractor=server.custom_data_extractor,
            tool_input_guardrails=server.tool_input_guardrails,
            tool_output_guardrails=server.tool_output_guardrails,
        )
        self.server = server
        self.gate = gate
        self.agent = agent
        self.run = run
        self.interceptors = tuple(interceptors)
        self.timeout_s = timeout_s
        self.sdk_approvals = sdk_approvals
        self._own_approvals: dict[str, bool | NeedsApproval] = {}
        """The wrapped server's own approval setting of each tool, as the SDK last asked for it."""
        self._scope: AgentScope | None = None
        self._output_schemas: dict[str, dict[str, Any] | None] = {}
        self._default_run = RunContext()

    @property
    def scope(self) -> AgentScope | None:
        """The agent scope, once the tools were listed."""
        return self._scope

    @property
    def name(self) -> str:
        return self.server.name

    @property
    def cached_tools(self) -> list[types.Tool] | None:
        return self.server.cached_tools

    async def connect(self) -> None:
        await self.server.connect()  # type: ignore[no-untyped-call]  # the SDK leaves it unannotated

    async def cleanup(self) -> None:
        await self.server.cleanup()  # type: ignore[no-untyped-call]  # the SDK leaves it unannotated

    async def __aenter__(self) -> GatedMCPServer:
        await self.connect()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.cleanup()

    # -- tools ----------------------------------------------------------------------------------

    async def list_tools(
        self, run_context: RunContextWrapper[Any] | None = None, agent: AgentBase | None = None
    ) -> list[types.Tool]:
        """The wrapped server's tools; new ones are registered in the agent scope first."""
        tools = await self.server.list_tools(run_context, agent)
        # No await from here on, until the scope exists: concurrent listings cannot both create it.
        known = set(self._scope.tools) if self._scope is not None else set()
        new: list[Tool[Any, Any]] = []
        for definition in tools:
            if definition.name in known:
                continue
            known.add(definition.name)
            self._output_schemas[definition.name] = definition.output_schema
            new.append(self._gate_tool(definition))
        if self._scope is None:
            interceptors = (*self.interceptors, FrameworkApproval(_FRAMEWORK))
            self._scope = self.gate.agent(self.agent, tools=new, interceptors=interceptors)
        elif new:
            self._scope.add_tools(new)
        if run_context is not None:
            await self._record_sdk_rejections(run_context, self._scope)
        return tools

    async def _record_sdk_rejections(self, wrapper: RunContextWrapper[Any], scope: AgentScope) -> None:
        """Record the rejections the SDK gave paused calls with `state.reject(item)`, as the gated
        function tools do (the SDK lists the server's tools, with the run's approvals, before
        its next model call)."""
        default_run = self.run if self.run is not None else self._default_run
        for name in list(scope.tools):
            for call_id, params, run in _sdk_rejections(wrapper, name, default_run):
                note = wrapper.get_rejection_message(name, call_id) or _SDK_REJECTED
                with contextlib.suppress(ToolBlockedError):
                    await _record_rejection(_GatedTarget(scope, name, default_run), params, run, call_id, None, note)

    def _gate_tool(self, definition: types.Tool) -> Tool[Any, Any]:
        server_name = definition.name
        server = self.server

        async def body(args: dict[str, Any], _ctx: ToolContext) -> Any:
            flight = _in_flight.get()
            if flight is not None and flight.ctx is None:
                raise RuntimeError(f"tool {server_name!r} was called at the SDK's approval step")
            result = await server.call_tool(server_name, args, meta=_mcp_meta.get())
            if result.is_error:
                raise McpToolError(error_text(result))
            return result

        return schema_tool(
            server_name,
            definition.description or definition.title or "",
            definition.input_schema,
            body,
            timeout_s=self.timeout_s,
        )

    def _remember_call(self, call: MCPToolMetaContext) -> Any:
        _mcp_sdk_context.set(call.run_context)
        resolver = self.server.tool_meta_resolver
        return resolver(call) if resolver is not None else None

    async def call_tool(
        self, tool_name: str, arguments: dict[str, Any] | None, meta: dict[str, Any] | None = None
    ) -> types.CallToolResult:
        """Call `tool_name` through the gate (see the class docstring). Raises `ToolBlockedError`
        on `Block`; a tool not listed yet makes it list the wrapped server first."""
        if self._scope is None or tool_name not in self._scope.tools:
            await self.list_tools()
        scope = self._scope
        if scope is None:  # pragma: no cover - list_tools always builds it
            raise RuntimeError(f"MCP server {self.name!r} has no agent scope")
        sdk_ctx = _mcp_sdk_context.get()
        context = sdk_ctx.context if sdk_ctx is not None else None
        if isinstance(context, RunContext):
            run = context
        else:
            run = self.run if self.run is not None else self._default_run
        call_id: str | None = None
        approval: Approval | None = None
        asks = None
        if isinstance(sdk_ctx, SdkToolContext):
            call_id = sdk_ctx.tool_call_id
            note = _take_note(sdk_ctx, call_id)  # it reached the tool: no rejection to look for
            if scope.gate.approval_handler is None and sdk_ctx.is_tool_approved(sdk_ctx.tool_name, call_id):
                approval = _sdk_approval(note)
                own = self._own_approvals.get(tool_name, False)
                asks = await _own_request(own, sdk_ctx, json.dumps(arguments or {}), call_id)
        token = _mcp_meta.set(meta)
        try:
            with framework_asks(asks):
                result = await scope.call(tool_name, dict(arguments or {}), run=run, call_id=call_id, approval=approval)
        finally:
            _mcp_meta.reset(token)
        return result_from_gate(result, self._output_schemas.get(tool_name))

    # -- the wrapped server's policies ----------------------------------------------------------
    # The SDK asks the server it was given for these when it turns MCP tools into function tools.

    def _get_needs_approval_for_tool(
        self, tool: types.Tool, agent: AgentBase | None
    ) -> bool | Callable[[RunContextWrapper[Any], dict[str, Any], str], Awaitable[bool]]:
        own = self.server._get_needs_approval_for_tool(tool, agent)
        self._own_approvals[tool.name] = own
        scope = self._scope
        if not self.sdk_approvals or scope is None or tool.name not in scope.tools:
            return own
        default_run = self.run if self.run is not None else self._default_run
        return _needs_approval(own, None, scope, tool.name, default_run)

    def _get_failure_error_function(
        self, agent_failure_error_function: ToolErrorFunction | None
    ) -> ToolErrorFunction | None:
        inner = self.server._get_failure_error_function(agent_failure_error_function)

        def failure(ctx: RunContextWrapper[Any], error: Exception) -> Any:
            # The SDK turns tool failures into text for the model; a block must end the run instead.
            stop = _stopping_error(error)
            if stop is not None:
                raise stop
            if inner is None:
                raise error
            return inner(ctx, error)

        return failure

    # -- everything else is the wrapped server's ------------------------------------------------

    async def list_prompts(self) -> types.ListPromptsResult:
        return await self.server.list_prompts()

    async def get_prompt(self, name: str, arguments: dict[str, Any] | None = None) -> types.GetPromptResult:
        return await self.server.get_prompt(name, arguments)

    async def list_resources(self, cursor: str | None = None) -> types.ListResourcesResult:
        return await self.server.list_resources(cursor)

    async def list_resource_templates(self, cursor: str | None = None) -> types.ListResourceTemplatesResult:
        return await self.server.list_resource_templates(cursor)

    async def read_resource(self, uri: str) -> types.ReadResourceResult:
        return await self.server.read_resource(uri)
