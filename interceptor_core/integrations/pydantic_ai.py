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
  call raises `ApprovalRequired` (the gate records `Blocked` with cause "approval_required"), the
  run ends with `DeferredToolRequests.approvals`, and when the next run brings the approval
  (`DeferredToolResults.approvals`) the call passes the whole chain again and that approval
  answers it (`ApprovalRequested`, `ApprovalResolved`, then the outcome). A refusal never reaches
  the toolset: Pydantic AI answers it with `ToolDenied` itself. A gate with an `approval_handler`
  asks it, as on every route.

Needs `pydantic-ai-slim` (the `pydantic-ai` extra); importing `interceptor_core` does not load it.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, assert_never

import pydantic_core
from pydantic_ai import ApprovalRequired, ModelRetry, ToolDenied, ToolFailed
from pydantic_ai import RunContext as AiRunContext
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets.abstract import AbstractToolset, ToolsetTool
from pydantic_ai.toolsets.wrapper import WrapperToolset
from pydantic_core import SchemaValidator, core_schema

from interceptor_core.approvals import Approval
from interceptor_core.context import RunContext, ToolContext
from interceptor_core.exceptions import ToolApprovalRequiredError
from interceptor_core.gate import AgentScope, Gate, Workflow
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


_APPROVED = Approval(approved=True, note="approved through Pydantic AI's deferred tool approvals")


def _approval(gate: Gate, ctx: AiRunContext[Any]) -> Approval | None:
    """The approval Pydantic AI's own flow gave this call, when the gate has no handler to ask."""
    return _APPROVED if ctx.tool_call_approved and gate.approval_handler is None else None


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
    becomes Pydantic AI's `ApprovalRequired`."""
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
            try:
                return await pending.toolset.call_tool(name, validated, pending.ctx, pending.tool)
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
            self._state["scope"] = self.gate.agent(self.agent, tools=new, interceptors=self.interceptors)
        elif new:
            scope.add_tools(new)
        known.update(t.name for t in new)
        return tools

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
            result = await scope.call(
                name, sent, run=self._run_context(ctx), call_id=ctx.tool_call_id, approval=_approval(scope.gate, ctx)
            )
        except ToolApprovalRequiredError as exc:
            raise _approval_required(exc) from exc
        finally:
            _pending.reset(token)
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
    the run; `RequireApproval` is Pydantic AI's approval flow as for `GatedToolset`. `run` is as
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
