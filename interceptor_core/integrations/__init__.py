"""Routes into the gate from MCP and from agent frameworks, one module each.

- `interceptor_core.integrations.mcp`: MCP servers' tools as gate tools (the gated client), and the
  gated proxy server behind `callgate mcp-proxy`.
- `interceptor_core.integrations.langchain`: `CallgateMiddleware` for LangChain v1 agents
  (`create_agent(..., middleware=[...])`), and LangChain `BaseTool`s whose invocation passes the
  gate (`gate_tools`, for LangGraph's `ToolNode` and plain `invoke`).
- `interceptor_core.integrations.openai_agents`: OpenAI Agents SDK `FunctionTool`s and MCP servers,
  gated.
- `interceptor_core.integrations.pydantic_ai`: a Pydantic AI toolset wrapper that gates every call,
  and a toolset offering a gate scope's tools (MCP tools from `McpToolset` included).

Each module imports its library when it is imported itself, never before: importing
`interceptor_core` or this package loads none of them. Install them with the extras `mcp`,
`langchain` (`langgraph` for `create_agent` and `ToolNode`), `openai-agents`, `pydantic-ai` (or
`integrations` for all of them).
"""

from interceptor_core.integrations._schema import schema_tool

__all__ = ["schema_tool"]
