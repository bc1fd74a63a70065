"""LangChain through the gate: `gate_tools` wraps `BaseTool`s so that every invocation passes the chain.

```python
tools = gate_tools([write_file, delete_file], gate=gate, agent="writer")
model.bind_tools(tools)   # and run them as usual: invoke, ainvoke, batch, a ToolNode
```

Each wrapped tool is a `StructuredTool` with the original's name, description and argument schema;
invoking it (sync or async, with arguments or a model's `ToolCall`) calls the gate, and only an
allowed call runs the original. A denial is the tool's output, so with a `ToolCall` input it is
the `ToolMessage` the model reads; `Block` raises `ToolBlockedError`. The `RunContext` comes from
`config["configurable"]["callgate_run"]` when the invocation passes one, else from `run`.

Needs `langchain-core` (the `langchain` extra); importing `interceptor_core` does not load it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, StructuredTool
from pydantic import BaseModel

from interceptor_core.context import RunContext, ToolContext
from interceptor_core.gate import AgentScope, Gate, Workflow
from interceptor_core.integrations._schema import schema_tool
from interceptor_core.tools import Tool

__all__ = ["RUN_CONFIG_KEY", "gate_tools"]

RUN_CONFIG_KEY = "callgate_run"
"""Where an invocation's `config["configurable"]` may carry the `RunContext` of its calls."""


def _input_schema(tool: BaseTool) -> dict[str, Any]:
    schema = tool.tool_call_schema
    if isinstance(schema, dict):
        return schema
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        return schema.model_json_schema()
    return {"type": "object", "properties": {}}


def _gate_tool(original: BaseTool, timeout_s: float | None) -> Tool[Any, Any]:
    async def body(args: dict[str, Any], _ctx: ToolContext) -> Any:
        return await original.ainvoke(args)

    return schema_tool(original.name, original.description, _input_schema(original), body, timeout_s=timeout_s)


def gate_tools(
    tools: Sequence[BaseTool],
    *,
    gate: Gate | Workflow,
    agent: str = "langchain",
    run: RunContext | None = None,
    interceptors: Sequence[object] = (),
    timeout_s: float | None = None,
) -> list[StructuredTool]:
    """Wrap `tools` so their invocation passes the gate; registers them in `gate.agent(agent)`
    (one `ToolsRegistered` event) before returning. Raises `ConfigurationError` for a tool name
    or schema the gate cannot take. The scope is the wrapped tools' `metadata["callgate_scope"]`."""
    scope = gate.agent(agent, tools=[_gate_tool(t, timeout_s) for t in tools], interceptors=interceptors)
    default_run = run if run is not None else RunContext()
    return [_wrap(t, scope, default_run) for t in tools]


def _wrap(original: BaseTool, scope: AgentScope, default_run: RunContext) -> StructuredTool:
    name = original.name

    def run_of(config: RunnableConfig | None) -> RunContext:
        given = ((config or {}).get("configurable") or {}).get(RUN_CONFIG_KEY)
        return given if isinstance(given, RunContext) else default_run

    async def gated(config: RunnableConfig, **kwargs: Any) -> Any:
        result = await scope.call(name, kwargs, run=run_of(config))
        if result.kind in ("ok", "substituted"):
            return result.value
        return result.to_model_text()

    def gated_sync(config: RunnableConfig, **kwargs: Any) -> Any:
        # A sync invocation has no event loop running in its thread (LangChain calls sync tools
        # from plain threads), so the call gets one of its own; a Gate is not bound to a loop.
        return asyncio.run(gated(config, **kwargs))

    return StructuredTool(
        name=name,
        description=original.description,
        args_schema=_input_schema(original),
        func=gated_sync,
        coroutine=gated,
        return_direct=original.return_direct,
        response_format="content",
        metadata={**(original.metadata or {}), "callgate_scope": scope},
        tags=original.tags,
    )
