"""Pydantic AI through the gate: `GatedToolset` wraps any toolset (function tools, MCP servers,
combined toolsets) so that every call its agent makes passes the chain first.

```python
toolset = GatedToolset(FunctionToolset([write_file, delete_file]), gate=gate, agent="writer")
agent = pydantic_ai.Agent(model, toolsets=[toolset])
```

The wrapped toolset's tools are registered in `gate.agent(agent)` (one `ToolsRegistered` event)
the first time the agent lists them, and tools that appear later (an MCP server's list change)
when it lists them again, always before they can be called. Pydantic AI validates arguments
first; the gate then decides; the wrapped tool runs only if it allowed. A denial is the tool's
return value, so the model reads it; `Block` raises `ToolBlockedError` and ends the run; a tool's
`ModelRetry` still asks the model to retry (and the gate records that call as an error).

Needs `pydantic-ai-slim` (the `pydantic-ai` extra); importing `interceptor_core` does not load it.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pydantic_core
from pydantic_ai import ModelRetry
from pydantic_ai import RunContext as AiRunContext
from pydantic_ai.toolsets.abstract import ToolsetTool
from pydantic_ai.toolsets.wrapper import WrapperToolset

from interceptor_core.context import RunContext, ToolContext
from interceptor_core.gate import AgentScope, Gate, Workflow
from interceptor_core.integrations._schema import schema_tool
from interceptor_core.tools import Tool

__all__ = ["GatedToolset"]


@dataclass
class _Pending:
    """The framework's side of one call, handed to the gate tool's body through a context variable
    (the body runs in a copy of the caller's context)."""

    ctx: AiRunContext[Any]
    tool: ToolsetTool[Any]
    retry: ModelRetry | None = None


_pending: contextvars.ContextVar[_Pending | None] = contextvars.ContextVar("callgate_pydantic_ai_call", default=None)


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
    run: RunContext | Callable[[AiRunContext[Any]], RunContext] | None = field(default=None, kw_only=True)
    interceptors: tuple[object, ...] = field(default=(), kw_only=True)
    timeout_s: float | None = field(default=None, kw_only=True)
    _state: dict[str, Any] = field(default_factory=dict, init=False, repr=False)

    @property
    def scope(self) -> AgentScope | None:
        """The agent scope, once the agent has listed the tools."""
        scope: AgentScope | None = self._state.get("scope")
        return scope

    def _gate_tool(self, name: str, definition: Any) -> Tool[Any, Any]:
        wrapped = self

        async def body(args: dict[str, Any], _ctx: ToolContext) -> Any:
            pending = _pending.get()
            if pending is None:
                raise RuntimeError(f"tool {name!r} of a GatedToolset was called outside the toolset")
            # The gate's arguments may have been rewritten: validate them as the framework would.
            validated = pending.tool.args_validator.validate_python(args)
            try:
                return await wrapped.wrapped.call_tool(name, validated, pending.ctx, pending.tool)
            except ModelRetry as retry:
                pending.retry = retry
                raise

        return schema_tool(
            name,
            definition.description or "",
            definition.parameters_json_schema,
            body,
            timeout_s=self.timeout_s,
        )

    async def get_tools(self, ctx: AiRunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        tools = await self.wrapped.get_tools(ctx)
        scope = self.scope
        known = scope.tools if scope is not None else {}
        new = [self._gate_tool(name, tool.tool_def) for name, tool in tools.items() if name not in known]
        if scope is None:
            self._state["scope"] = self.gate.agent(self.agent, tools=new, interceptors=self.interceptors)
        elif new:
            scope.add_tools(new)
        return tools

    def _run_context(self, ctx: AiRunContext[Any]) -> RunContext:
        if isinstance(self.run, RunContext):
            return self.run
        if self.run is not None:
            return self.run(ctx)
        if isinstance(ctx.deps, RunContext):
            return ctx.deps
        default: RunContext = self._state.setdefault("run", RunContext())
        return default

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: AiRunContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        scope = self.scope
        if scope is None or name not in scope.tools:
            await self.get_tools(ctx)
            scope = self.scope
        if scope is None:
            raise RuntimeError(f"tool {name!r} was called before the toolset {self.label} listed its tools")
        pending = _Pending(ctx, tool)
        token = _pending.set(pending)
        try:
            args = pydantic_core.to_jsonable_python(tool_args)
            result = await scope.call(name, args, run=self._run_context(ctx), call_id=ctx.tool_call_id)
        finally:
            _pending.reset(token)
        if pending.retry is not None:
            raise pending.retry
        if result.kind in ("ok", "substituted"):
            return result.value
        return result.to_model_text()
