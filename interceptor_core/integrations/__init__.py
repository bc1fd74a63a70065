"""Routes into the gate from MCP and from agent frameworks, one module each.

- `interceptor_core.integrations.mcp`: MCP servers' tools as gate tools (the gated client), and the
  gated proxy server behind `callgate mcp-proxy`.
- `interceptor_core.integrations.langchain`: LangChain `BaseTool`s whose invocation passes the gate.
- `interceptor_core.integrations.openai_agents`: OpenAI Agents SDK `FunctionTool`s and MCP servers,
  gated.
- `interceptor_core.integrations.pydantic_ai`: a Pydantic AI toolset wrapper that gates every call,
  and a toolset offering a gate scope's tools (MCP tools from `McpToolset` included).

Each module imports its library when it is imported itself, never before: importing
`interceptor_core` or this package loads none of them. Install them with the extras `mcp`,
`langchain`, `openai-agents`, `pydantic-ai` (or `integrations` for all four).
"""

from interceptor_core.integrations._schema import schema_tool

__all__ = ["schema_tool"]
