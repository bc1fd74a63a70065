"""OpenAI Agents SDK through the gate: `gate_function_tools` gates `FunctionTool`s (an agent's
`as_tool()` included), `GatedMCPServer` gates an SDK MCP server.

```python
tools = gate_function_tools([write_file, delete_file], gate=gate, agent="writer")
files = GatedMCPServer(MCPServerStdio({"command": "python", "args": ["my_server.py"]}), gate=gate, agent="files")
agent = agents.Agent(name="writer", tools=tools, mcp_servers=[files])
```

Each gated tool is the original `FunctionTool` with its invocation replaced: the SDK parses the
model's JSON arguments into the gate, and only an allowed call reaches the original invocation
(with the SDK's own tool context, so its validation, context injection and error handling still
apply). A denial is the tool's output, so the model reads it; `Block` raises `ToolBlockedError`
and ends the run. The `RunContext` is the run's `context` when that is one, else `run`.

An MCP server handed to the SDK as it is (`Agent(mcp_servers=[server])`) is called by the SDK
directly: wrap it in `GatedMCPServer` first, so that its tools are registered and every call of
them passes the chain before it reaches the server.

Needs `openai-agents` (the `openai-agents` extra); importing `interceptor_core` does not load it.
"""

from __future__ import annotations

import contextvars
import dataclasses
import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import mcp_types as types
from agents import FunctionTool
from agents.agent import AgentBase
from agents.mcp import MCPServer, MCPToolMetaContext
from agents.run_context import RunContextWrapper
from agents.tool import ToolErrorFunction
from agents.tool_context import ToolContext as SdkToolContext

from interceptor_core.context import RunContext, ToolContext
from interceptor_core.exceptions import ToolApprovalRequiredError, ToolBlockedError
from interceptor_core.gate import AgentScope, Gate, Workflow
from interceptor_core.integrations._schema import schema_tool
from interceptor_core.integrations.mcp import McpToolError, error_text, result_from_gate
from interceptor_core.tools import Tool

__all__ = ["GatedMCPServer", "gate_function_tools"]

_sdk_context: contextvars.ContextVar[SdkToolContext[Any] | None] = contextvars.ContextVar(
    "callgate_openai_agents_call", default=None
)
"""The SDK's context of the call in flight, for the gate tool's body (run in a copy of the caller's
context)."""


def _gate_tool(original: FunctionTool, timeout_s: float | None) -> Tool[Any, Any]:
    async def body(args: dict[str, Any], _ctx: ToolContext) -> Any:
        sdk_ctx = _sdk_context.get()
        if sdk_ctx is None:
            raise RuntimeError(f"tool {original.name!r} was called outside the OpenAI Agents runner")
        return await original.on_invoke_tool(sdk_ctx, json.dumps(args))

    return schema_tool(original.name, original.description, original.params_json_schema, body, timeout_s=timeout_s)


def gate_function_tools(
    tools: Sequence[FunctionTool],
    *,
    gate: Gate | Workflow,
    agent: str = "openai-agents",
    run: RunContext | None = None,
    interceptors: Sequence[object] = (),
    timeout_s: float | None = None,
) -> list[FunctionTool]:
    """Gated copies of `tools`, registered in `gate.agent(agent)` (one `ToolsRegistered` event)
    before this returns. Raises `ConfigurationError` for a name or schema the gate cannot take."""
    scope = gate.agent(agent, tools=[_gate_tool(t, timeout_s) for t in tools], interceptors=interceptors)
    default_run = run if run is not None else RunContext()
    return [_wrap(t, scope, default_run) for t in tools]


def _wrap(original: FunctionTool, scope: AgentScope, default_run: RunContext) -> FunctionTool:
    name = original.name

    async def gated(ctx: SdkToolContext[Any], arguments: str) -> Any:
        run = ctx.context if isinstance(ctx.context, RunContext) else default_run
        token = _sdk_context.set(ctx)
        try:
            result = await scope.call(name, arguments or "{}", run=run)
        finally:
            _sdk_context.reset(token)
        if result.kind in ("ok", "substituted"):
            return result.value
        return result.to_model_text()

    return dataclasses.replace(original, on_invoke_tool=gated)


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

_STOPPING = (ToolBlockedError, ToolApprovalRequiredError)


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
        # No await from here on: concurrent listings cannot both create the scope.
        known = set(self._scope.tools) if self._scope is not None else set()
        new: list[Tool[Any, Any]] = []
        for definition in tools:
            if definition.name in known:
                continue
            known.add(definition.name)
            self._output_schemas[definition.name] = definition.output_schema
            new.append(self._gate_tool(definition))
        if self._scope is None:
            self._scope = self.gate.agent(self.agent, tools=new, interceptors=self.interceptors)
        elif new:
            self._scope.add_tools(new)
        return tools

    def _gate_tool(self, definition: types.Tool) -> Tool[Any, Any]:
        server_name = definition.name
        server = self.server

        async def body(args: dict[str, Any], _ctx: ToolContext) -> Any:
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
        call_id = sdk_ctx.tool_call_id if isinstance(sdk_ctx, SdkToolContext) else None
        token = _mcp_meta.set(meta)
        try:
            result = await scope.call(tool_name, dict(arguments or {}), run=run, call_id=call_id)
        finally:
            _mcp_meta.reset(token)
        return result_from_gate(result, self._output_schemas.get(tool_name))

    # -- the wrapped server's policies ----------------------------------------------------------
    # The SDK asks the server it was given for these when it turns MCP tools into function tools.

    def _get_needs_approval_for_tool(
        self, tool: types.Tool, agent: AgentBase | None
    ) -> bool | Callable[[RunContextWrapper[Any], dict[str, Any], str], Awaitable[bool]]:
        return self.server._get_needs_approval_for_tool(tool, agent)

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
