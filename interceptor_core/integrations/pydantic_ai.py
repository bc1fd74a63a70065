"""Pydantic AI through the gate: `GatedToolset` wraps any toolset (function tools, combined
toolsets, Pydantic AI's own MCP toolset `pydantic_ai.mcp.MCPToolset`, which needs `fastmcp`) so
that every call its agent makes passes the chain first; `ScopeToolset` shows the tools of a gate
agent scope (local gate tools, an MCP server's tools attached by `McpToolset`) to a Pydantic AI
agent.

```python
toolset = GatedToolset(FunctionToolset([write_file, delete_file]), gate=gate, agent="writer")
agent = pydantic_ai.Agent(model, toolsets=[toolset])

files = GatedToolset(MCPToolset(StdioTransport(command="python", args=["my_server.py"])), gate=gate, agent="files")
agent = pydantic_ai.Agent(model, toolsets=[files])

async with McpToolset.connect(StdioServerParameters(command="python", args=["my_server.py"])) as mcp_tools:
    files = await mcp_tools.attach(gate.agent("files", tools=[]))
    agent = pydantic_ai.Agent(model, toolsets=[ScopeToolset(files)])
```

The wrapped toolset's tools are registered in `gate.agent(agent)` (one `ToolsRegistered` event)
the first time the agent lists them, and tools that appear later (an MCP server's list change)
when it lists them again, always before they can be called. Pydantic AI validates arguments
first; the gate then decides; the wrapped tool runs only if it allowed. Every event carries
Pydantic AI's `tool_call_id` as its `call_id`.

What Pydantic AI reports is what it would report ungated:

- a denial is its `ToolDenied`: a tool return with `outcome='denied'` whose content the model reads;
- whatever the wrapped tool raises is raised again once the gate has recorded the call (a
  `ToolUse` with outcome "error"): `ModelRetry` asks the model to retry, `ToolFailed` is an
  `outcome='failed'` return, `CallDeferred` and `ApprovalRequired` defer the call
  (`DeferredToolRequests`), and any other exception ends the run as it would without the gate;
- a failure of the gate's own (a timeout, an after-interceptor or output check that failed) is a
  `ToolFailed`; arguments the gate's schema check refuses are a `ModelRetry`, as Pydantic AI's own
  validation would be;
- `Block` raises `ToolBlockedError` and ends the run;
- `RequireApproval`, when the gate has no `approval_handler`, is Pydantic AI's approval flow: the
  call raises `ApprovalRequired` and the run ends with `DeferredToolRequests.approvals`; the gate
  records the pause as the durable `ApprovalRequested` (no outcome yet). The next run, in this
  process or another, given the message history and `DeferredToolResults`, decides it under the
  same call id: an approval makes the call pass the whole chain again, answered by that approval
  (`ApprovalRequested` again under the same approval id, `ApprovalResolved`, then the outcome;
  `DeferredToolResults.metadata[call_id]` may name who approved, `{"by": ..., "note": ...}`); a
  refusal (`False`, `ToolDenied`) never reaches the toolset, so the toolset finds it in the history
  when the run lists its tools for the next model request and records it then (`ApprovalRequested`,
  `ApprovalResolved` refused with Pydantic AI's message as the note, `ToolDenied`), naming nobody:
  Pydantic AI gives `DeferredToolResults.metadata` to approved calls only, and the history keeps a
  denied call's message alone. A gate with an `approval_handler` asks it, as on every route.
- Pydantic AI's own approvals (a tool registered with `requires_approval=True`) are recorded the
  same way: such a call asks for approval in the gate's chain too (`FrameworkApproval`, named
  "pydantic-ai-approval" in `requested_by`), after the rest of the chain.

Needs `pydantic-ai-slim` (the `pydantic-ai` extra); importing `interceptor_core` does not load it.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, assert_never

import pydantic_core
from pydantic_ai import ApprovalRequired, ModelRetry, ToolDenied, ToolFailed
from pydantic_ai import RunContext as AiRunContext
from pydantic_ai.messages import ModelRequest, ModelResponse, ToolCallPart, ToolReturnPart
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets.abstract import AbstractToolset, ToolsetTool
from pydantic_ai.toolsets.wrapper import WrapperToolset
from pydantic_core import SchemaValidator, core_schema

from interceptor_core.approvals import Approval
from interceptor_core.context import RunContext, ToolContext
from interceptor_core.exceptions import ToolApprovalRequiredError, ToolBlockedError
from interceptor_core.gate import AgentScope, Gate, Workflow
from interceptor_core.integrations._approval_probe import approval_asked
from interceptor_core.integrations._framework_approval import FrameworkApproval, framework_asks
from interceptor_core.integrations._schema import SchemaArgs, schema_model
from interceptor_core.results import ToolResult
from interceptor_core.tools import Tool

__all__ = ["GatedToolset", "ScopeToolset"]


@dataclass(slots=True)
class _Pending:
    """The framework's side of one call, handed to the gate tool's body through a context variable
    (the body runs in a copy of the caller's context)."""

    toolset: AbstractToolset[Any]
    """The wrapped toolset of this run (Pydantic AI may have replaced it for the run or the step)."""
    ctx: AiRunContext[Any]
    tool: ToolsetTool[Any]
    tool_args: dict[str, Any]
    """The arguments as Pydantic AI validated them."""
    sent: Any
    """The same as JSON, as the gate got them: the body compares them with what it is given."""
    raised: Exception | None = None
    """What the wrapped tool raised: raised again to Pydantic AI once the gate has recorded it."""


_pending: contextvars.ContextVar[_Pending | None] = contextvars.ContextVar("callgate_pydantic_ai_call", default=None)
"""The call in flight, for the gate tool's body; None while a refusal is recorded (the body must not run)."""

RunSource = RunContext | Callable[[AiRunContext[Any]], RunContext] | None
"""Where the `RunContext` of a call comes from: a fixed one, a function of the Pydantic AI run
context, or None (then a `RunContext` given as the run's `deps`, else `fallback`)."""


def _run_context(source: RunSource, ctx: AiRunContext[Any], fallback: RunContext) -> RunContext:
    if isinstance(source, RunContext):
        return source
    if source is not None:
        return source(ctx)
    if isinstance(ctx.deps, RunContext):
        return ctx.deps
    return fallback


_APPROVED_NOTE = "approved through Pydantic AI's deferred tool approvals"

_OWN_APPROVAL = "the tool requires approval in Pydantic AI (requires_approval=True)"
"""Why a call of a tool registered with `requires_approval=True` asks, as the gate records it."""

_FRAMEWORK = "pydantic-ai"

_CONCLUDED_KEPT = 4096
"""How many call ids a toolset remembers having recorded an outcome for (see `_record_refusals`)."""


def _approval(gate: Gate, ctx: AiRunContext[Any]) -> Approval | None:
    """The approval Pydantic AI's own flow gave this call, when the gate has no handler to ask:
    who approved and why from `DeferredToolResults.metadata[call_id]` (`by`, `note`) when given."""
    if not ctx.tool_call_approved or gate.approval_handler is not None:
        return None
    metadata = ctx.tool_call_metadata
    by = note = None
    if isinstance(metadata, dict):
        by = metadata.get("by") if isinstance(metadata.get("by"), str) else None
        note = metadata.get("note") if isinstance(metadata.get("note"), str) else None
    return Approval(approved=True, by=by, note=note or _APPROVED_NOTE)


def _own_approval(state: dict[str, Any], name: str) -> str | None:
    """Why Pydantic AI itself asks about calls of tool `name` (None: it does not)."""
    own: set[str] = state.get("own", set())
    return _OWN_APPROVAL if name in own else None


def _asked_here(state: dict[str, Any], tools: dict[str, ToolsetTool[Any]]) -> dict[str, ToolsetTool[Any]]:
    """`tools` with those Pydantic AI would defer for approval itself (`requires_approval=True`,
    kind "unapproved") shown to it as plain function tools, remembered in `state`: their calls then
    reach the toolset, whose gate asks for that approval (and pauses the call if nobody can give it
    now, raising `ApprovalRequired`, which defers it as Pydantic AI would have)."""
    own: set[str] = state.setdefault("own", set())
    shown: dict[str, ToolsetTool[Any]] = {}
    for name, tool in tools.items():
        if tool.tool_def.kind == "unapproved":
            own.add(name)
            tool = replace(tool, tool_def=replace(tool.tool_def, kind="function"))
        shown[name] = tool
    return shown


def _concluded(state: dict[str, Any]) -> dict[str, None]:
    """The call ids this toolset recorded an outcome for, oldest first (an ordered set, bounded)."""
    concluded: dict[str, None] = state.setdefault("concluded", {})
    return concluded


def _conclude(state: dict[str, Any], call_id: str) -> None:
    concluded = _concluded(state)
    concluded[call_id] = None
    if len(concluded) > _CONCLUDED_KEPT:
        del concluded[next(iter(concluded))]


def _refusals(messages: list[Any], names: set[str], concluded: dict[str, None]) -> list[tuple[ToolCallPart, str]]:
    """The calls of `names` that the newest request of `messages` answers as denied and that this
    toolset did not decide itself: refusals given through `DeferredToolResults`, with the message
    the model read. Only the newest request counts: an older one was seen by an earlier step."""
    if not messages or not isinstance(messages[-1], ModelRequest):
        return []
    denied = {
        part.tool_call_id: part.model_response_str()
        for part in messages[-1].parts
        if isinstance(part, ToolReturnPart)
        and part.outcome == "denied"
        and part.tool_name in names
        and part.tool_call_id not in concluded
    }
    if not denied:
        return []
    found: list[tuple[ToolCallPart, str]] = []
    for message in reversed(messages):
        if isinstance(message, ModelResponse):
            for part in message.parts:
                if isinstance(part, ToolCallPart) and part.tool_call_id in denied:
                    found.append((part, denied.pop(part.tool_call_id)))
        if not denied:
            break
    return found


async def _record_refusal(
    scope: AgentScope, state: dict[str, Any], call: ToolCallPart, message: str, run: RunContext, own: str | None
) -> None:
    """Record a refusal Pydantic AI gave without calling the toolset: the call passes the chain with
    that refusal as its answer (`ApprovalRequested`, `ApprovalResolved`, `ToolDenied`), so its
    approval id is the pause's. Only a call that asks for approval is recorded (the tool's own
    `requires_approval`, or a chain that asks): any other denied call in the history was not paused
    for approval by this toolset (a deferred call, `CallDeferred`, answered with a denial). A chain
    that now blocks the call records that instead; nothing is raised into the run, which goes on."""
    args = call.args_as_dict()
    if own is None and await approval_asked(scope, call.tool_name, args, run, call.tool_call_id) is None:
        return
    refusal = Approval(approved=False, note=message)
    token = _pending.set(None)  # the body must not run, whatever the chain says
    try:
        with framework_asks(own), contextlib.suppress(ToolBlockedError, ToolApprovalRequiredError):
            await scope.call(call.tool_name, args, run=run, call_id=call.tool_call_id, approval=refusal)
    finally:
        _pending.reset(token)
    _conclude(state, call.tool_call_id)


def _framework_result(result: ToolResult) -> Any:
    """What Pydantic AI gets back for the gate's result: the value, its `ToolDenied`, or the
    exception it turns into a failed or retried tool return."""
    kind = result.kind
    if kind == "ok":
        return result.value
    match kind:
        case "ok" | "substituted":
            return result.value
        case "denied":
            return ToolDenied(result.to_model_text())
        case "error":
            if result.decided_by == "validation":
                raise ModelRetry(result.message or "invalid arguments")
            raise ToolFailed(result.to_model_text())
        case _:
            assert_never(kind)


async def _gated_call(scope: AgentScope, name: str, args: Any, ctx: AiRunContext[Any], run: RunContext) -> ToolResult:
    """`scope.call` with Pydantic AI's call id and approval; `RequireApproval` with nobody to ask
    becomes Pydantic AI's `ApprovalRequired`, recorded as `Blocked`: a `ScopeToolset`'s tools are
    the scope's own, so a refusal given later cannot be recorded without the chain deciding it
    again, and the pause must leave its outcome."""
    try:
        return await scope.call(name, args, run=run, call_id=ctx.tool_call_id, approval=_approval(scope.gate, ctx))
    except ToolApprovalRequiredError as exc:
        raise _approval_required(exc) from exc


def _approval_required(exc: ToolApprovalRequiredError) -> ApprovalRequired:
    """Pydantic AI's request for approval of the call the gate could not get approved."""
    return ApprovalRequired({"reason": exc.reason, "requested_by": exc.interceptor})


@dataclass
class GatedToolset(WrapperToolset[Any]):
    """A toolset whose every call passes the gate (see the module docstring).

    - `gate`: the `Gate` (or a `Workflow` of it) the agent scope is made under.
    - `agent`: the agent scope's name.
    - `run`: the `RunContext` of the calls: a fixed one, a function of the Pydantic AI run context,
      or None (then a `RunContext` given as the run's `deps` is used, else a default one).
    - `interceptors`: agent-scope interceptors; `timeout_s` per tool (None: the gate's default).
    """

    gate: Gate | Workflow = field(kw_only=True)
    agent: str = field(default="pydantic-ai", kw_only=True)
    run: RunSource = field(default=None, kw_only=True)
    interceptors: tuple[object, ...] = field(default=(), kw_only=True)
    timeout_s: float | None = field(default=None, kw_only=True)
    # Shared by the copies Pydantic AI makes of this toolset (`for_run`, `for_run_step` and
    # `visit_and_replace` replace the wrapped one, e.g. a DynamicToolset's every run): one agent
    # scope and one registration of each tool, however many runs.
    _state: dict[str, Any] = field(default_factory=dict, repr=False, compare=False, kw_only=True)

    @property
    def scope(self) -> AgentScope | None:
        """The agent scope, once the agent has listed the tools."""
        scope: AgentScope | None = self._state.get("scope")
        return scope

    def _gate_tool(self, name: str, definition: Any) -> Tool[Any, Any]:
        """A gate tool for `name`, as `schema_tool` makes them (its input is the JSON Schema Pydantic
        AI shows the model), written out here: its body reads the arguments the gate passes it
        without copying them, one coroutine less on the path of every call."""
        model = schema_model(name, definition.parameters_json_schema)
        state = self._state

        async def forward(args: SchemaArgs, _ctx: ToolContext) -> Any:
            pending = _pending.get()
            if pending is None:
                raise RuntimeError(f"tool {name!r} of a GatedToolset was called outside the toolset")
            # Rewritten arguments are validated as the framework would; the others are passed as
            # the framework validated them, as an ungated call would get them.
            if args.__pydantic_extra__ == pending.sent:
                validated = pending.tool_args
            else:
                validated = pending.tool.args_validator.validate_python(args.model_dump())
            ctx = pending.ctx
            if _own_approval(state, name) is not None and not ctx.tool_call_approved:
                # The gate had the tool's own request for approval answered (its handler): the
                # wrapped toolset must not ask again.
                ctx = replace(ctx, tool_call_approved=True)
            try:
                return await pending.toolset.call_tool(name, validated, ctx, pending.tool)
            except Exception as exc:
                pending.raised = exc
                raise

        # Real classes rather than strings, so the signature resolves without this module's namespace.
        forward.__annotations__ = {"args": model, "_ctx": ToolContext, "return": Any}
        forward.__qualname__ = forward.__name__ = f"{name}_via_pydantic_ai"
        return Tool(forward, name=name, description=definition.description or "", timeout_s=self.timeout_s)

    async def get_tools(self, ctx: AiRunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        tools = await self.wrapped.get_tools(ctx)
        scope = self.scope
        known: set[str] = self._state.setdefault("names", set())
        new = [self._gate_tool(name, tool.tool_def) for name, tool in tools.items() if name not in known]
        if scope is None:
            interceptors = (*self.interceptors, FrameworkApproval(_FRAMEWORK))
            scope = self._state["scope"] = self.gate.agent(self.agent, tools=new, interceptors=interceptors)
        elif new:
            scope.add_tools(new)
        known.update(t.name for t in new)
        # Refusals given through DeferredToolResults reach no toolset: the step after them is
        # where they can be seen (the newest request of the history answers them).
        for call, message in _refusals(ctx.messages, known, _concluded(self._state)):
            own = _own_approval(self._state, call.tool_name)
            await _record_refusal(scope, self._state, call, message, self._run_context(ctx), own)
        return _asked_here(self._state, tools)

    def _run_context(self, ctx: AiRunContext[Any]) -> RunContext:
        default: RunContext | None = self._state.get("run")
        if default is None:
            default = self._state["run"] = RunContext()
        return _run_context(self.run, ctx, default)

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: AiRunContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        state = self._state
        scope: AgentScope | None = state.get("scope")
        if scope is None or name not in state["names"]:
            await self.get_tools(ctx)
            scope = state.get("scope")
        if scope is None:
            raise RuntimeError(f"tool {name!r} was called before the toolset {self.label} listed its tools")
        sent = pydantic_core.to_jsonable_python(tool_args)
        pending = _Pending(self.wrapped, ctx, tool, tool_args, sent)
        token = _pending.set(pending)
        # `_gated_call` written out: this is the path of every call.
        try:
            with framework_asks(_own_approval(state, name)):
                result = await scope.call(
                    name,
                    sent,
                    run=self._run_context(ctx),
                    call_id=ctx.tool_call_id,
                    approval=_approval(scope.gate, ctx),
                    pause_for_approval=True,
                )
        except ToolApprovalRequiredError as exc:
            raise _approval_required(exc) from exc
        finally:
            _pending.reset(token)
        if ctx.tool_call_id is not None:
            _conclude(state, ctx.tool_call_id)
        if pending.raised is not None:
            raise pending.raised
        return _framework_result(result)


_ANY_ARGS = SchemaValidator(core_schema.dict_schema(core_schema.str_schema(), core_schema.any_schema()))
"""The framework's check of a `ScopeToolset` call: a JSON object. The gate validates it against the
tool's schema (an invalid call is an error result the model reads)."""


class ScopeToolset(AbstractToolset[Any]):
    """The tools of a gate agent scope as a Pydantic AI toolset; every call is `scope.call`.

    The agent sees each tool's name, description and input schema (`Tool.definition()`), read
    from the scope at every step, so tools added to the scope later (an MCP server's list change
    followed by `McpToolset`) are offered from the next step on; their registration happened
    when they were added. A denial is Pydantic AI's `ToolDenied` (`outcome='denied'`, the model
    reads it); a tool error is a `ToolFailed` ("Tool error: ..." with `outcome='failed'`) and
    arguments the tool's schema refuses a `ModelRetry`; `Block` raises `ToolBlockedError` and ends
    the run; `RequireApproval` is Pydantic AI's approval flow as for `GatedToolset`, except that
    the pause is recorded as `Blocked` (cause "approval_required"): the tools are the scope's own,
    so a refusal given later could not be recorded without the chain deciding the call again. `run` is as
    for `GatedToolset`. Events carry Pydantic AI's `tool_call_id`. Safe to share between runs.
    """

    def __init__(self, scope: AgentScope, *, run: RunSource = None, id: str | None = None) -> None:
        self.scope = scope
        self.run = run
        self._id = id
        self._default_run = RunContext()
        self._definitions: dict[str, ToolDefinition] = {}

    @property
    def id(self) -> str | None:
        return self._id

    def _definition(self, tool: Tool[Any, Any]) -> ToolDefinition:
        # A scope never replaces a tool of a given name, so its definition is built once.
        known = self._definitions.get(tool.name)
        if known is None:
            shown = tool.definition()
            known = ToolDefinition(
                name=tool.name, description=shown["description"], parameters_json_schema=shown["input_schema"]
            )
            self._definitions[tool.name] = known
        return known

    async def get_tools(self, ctx: AiRunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        return {
            name: ToolsetTool(toolset=self, tool_def=self._definition(tool), max_retries=1, args_validator=_ANY_ARGS)
            for name, tool in self.scope.tools.items()
        }

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: AiRunContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        run = _run_context(self.run, ctx, self._default_run)
        args = pydantic_core.to_jsonable_python(tool_args)
        return _framework_result(await _gated_call(self.scope, name, args, ctx, run))
