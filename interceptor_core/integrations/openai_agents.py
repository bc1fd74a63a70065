"""OpenAI Agents SDK through the gate: `gate_function_tools` gates `FunctionTool`s.

```python
tools = gate_function_tools([write_file, delete_file], gate=gate, agent="writer")
agent = agents.Agent(name="writer", tools=tools)
```

Each gated tool is the original `FunctionTool` with its invocation replaced: the SDK parses the
model's JSON arguments into the gate, and only an allowed call reaches the original invocation
(with the SDK's own tool context, so its validation, context injection and error handling still
apply). A denial is the tool's output, so the model reads it; `Block` raises `ToolBlockedError`
and ends the run. The `RunContext` is the run's `context` when that is one, else `run`.

Needs `openai-agents` (the `openai-agents` extra); importing `interceptor_core` does not load it.
"""

from __future__ import annotations

import contextvars
import dataclasses
from collections.abc import Sequence
from typing import Any

from agents import FunctionTool
from agents.tool_context import ToolContext as SdkToolContext

from interceptor_core.context import RunContext, ToolContext
from interceptor_core.gate import AgentScope, Gate, Workflow
from interceptor_core.integrations._schema import schema_tool
from interceptor_core.tools import Tool

__all__ = ["gate_function_tools"]

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
        import json

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
