"""MCP through the gate: an MCP server's tools as gate tools, and a gated MCP proxy server.

- `McpToolset` (the gated client) wraps a connected MCP `Client` or `ClientSession`: each tool the
  server lists becomes a gate `Tool` (name, description and input schema from the server) whose
  body calls the server. `attach(scope)` registers them in an agent scope, so `Agent` and
  `scope.call` reach MCP tools through the chain like local tools; tools the server adds later
  (its list-changed notification) are registered in that scope, with a `ToolsRegistered` event,
  before any call of them can pass.
- `McpProxy` is the server side of `callgate mcp-proxy`: it serves an upstream server's tools to
  any MCP client (stdio or streamable HTTP), and every `tools/call` passes the gate first. A
  denial comes back as a tool result with `isError` and the denial message, a substitute as
  synthetic content, a block as a JSON-RPC error; the upstream never sees a call the gate refused.

Needs the `mcp` package (the `mcp` extra); importing `interceptor_core` does not load it.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any, TextIO

import anyio
import anyio.abc
import mcp_types as types
import pydantic_core
from mcp import Client, ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.subscriptions import listen
from mcp.server import Server
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import NotificationOptions
from mcp.server.session import ServerSession
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ToolsListChanged
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from interceptor_core.context import RunContext, ToolContext
from interceptor_core.exceptions import CallgateError, ConfigurationError, ToolApprovalRequiredError, ToolBlockedError
from interceptor_core.gate import AgentScope
from interceptor_core.integrations._schema import schema_tool
from interceptor_core.results import ToolResult
from interceptor_core.tools import Tool

log = logging.getLogger("callgate.integrations.mcp")

__all__ = ["McpProxy", "McpToolError", "McpToolset", "error_text", "result_from_gate", "value_from_result"]

_LIST_PAGE_CAP = 1000
"""Pages of a tools/list walk before giving up: a server whose cursor never ends cannot hang us."""


class McpToolError(CallgateError):
    """The MCP server answered a call with `isError`; the text is what it said."""


def value_from_result(result: types.CallToolResult) -> Any:
    """What a model reads of an MCP tool result: its text blocks joined, or, when it has other
    blocks (images, resources), the blocks as JSON-ready dicts; `structuredContent` when there is
    no content at all."""
    blocks = list(result.content)
    if not blocks and result.structured_content is not None:
        return result.structured_content
    if all(isinstance(block, types.TextContent) for block in blocks):
        return "\n".join(block.text for block in blocks if isinstance(block, types.TextContent))
    return [block.model_dump(mode="json", by_alias=True, exclude_none=True) for block in blocks]


def error_text(result: types.CallToolResult) -> str:
    """The text of an `isError` tool result (its text blocks joined)."""
    texts = [block.text for block in result.content if isinstance(block, types.TextContent)]
    return "\n".join(texts) or "the server reported an error without text"


def _list_changed(message: object) -> bool:
    return isinstance(message, types.ToolListChangedNotification)


class McpToolset:
    """The tools of one MCP server as gate tools (the gated client).

    `session` is a connected `mcp.Client` or `mcp.ClientSession`. `load()` lists the server's tools
    and builds a `Tool` per name; `attach(scope)` also adds them to an agent scope; `refresh()`
    lists again and adds tools not seen before to every attached scope. A tool's body calls the
    server: an `isError` answer becomes an `error` result (`McpToolError`), anything else the
    value of `value_from_result` (or, with `raw_results`, the `CallToolResult` itself, which is
    what the proxy forwards).

    List-changed notifications: pass `on_message` as the session's `message_handler` (servers
    before protocol 2026-07-28 send them there), and run `follow()` in a task (it opens the
    `subscriptions/listen` stream newer servers need, and refreshes on every change). `connect()`
    does all of this for a server started from a command.

    `prefix` is put before every tool name (to keep two servers' tools apart in one scope);
    `timeout_s`, `interceptors`, `exclude_interceptors`, `max_result_chars` apply to every tool.
    Not safe to share between event loops; `refresh()` calls are serialized.
    """

    def __init__(
        self,
        session: Client | ClientSession | None = None,
        *,
        prefix: str = "",
        raw_results: bool = False,
        timeout_s: float | None = None,
        interceptors: Sequence[object] = (),
        exclude_interceptors: Sequence[str] = (),
        max_result_chars: int | None = None,
    ) -> None:
        self._session = session
        self.prefix = prefix
        self.raw_results = raw_results
        self._tool_options: dict[str, Any] = {
            "timeout_s": timeout_s,
            "interceptors": tuple(interceptors),
            "exclude_interceptors": tuple(exclude_interceptors),
            "max_result_chars": max_result_chars,
        }
        self._tools: dict[str, Tool[Any, Any]] = {}
        self._definitions: dict[str, types.Tool] = {}
        self._scopes: list[AgentScope] = []
        self._lock: anyio.Lock | None = None
        self._changed: anyio.Event | None = None
        self._on_change: list[Callable[[list[Tool[Any, Any]]], Any]] = []

    # -- wiring ---------------------------------------------------------------------------------

    @property
    def session(self) -> Client | ClientSession:
        """The MCP session the tools call. Raises `ConfigurationError` before one is set."""
        if self._session is None:
            raise ConfigurationError("this McpToolset has no MCP session yet; use connect() or bind(session)")
        return self._session

    def bind(self, session: Client | ClientSession) -> None:
        """Set the session (when the toolset had to exist first, for `on_message`)."""
        self._session = session

    @classmethod
    @contextlib.asynccontextmanager
    async def connect(
        cls,
        server: StdioServerParameters | str,
        *,
        errlog: TextIO | None = None,
        **options: Any,
    ) -> AsyncIterator[McpToolset]:
        """Start (stdio) or reach (a streamable HTTP URL) an MCP server, load its tools and follow
        its list changes until the block ends. `errlog` takes the server process's stderr
        (default: this process's). `options` are `McpToolset`'s."""
        toolset = cls(**options)
        transport: Any = server
        if isinstance(server, StdioServerParameters):
            transport = stdio_client(server, errlog=errlog if errlog is not None else sys.stderr)
        async with Client(transport, message_handler=toolset.on_message) as client:
            toolset.bind(client)
            await toolset.load()
            async with anyio.create_task_group() as tasks:
                await tasks.start(toolset.follow)
                try:
                    yield toolset
                finally:
                    tasks.cancel_scope.cancel()

    async def on_message(self, message: object) -> None:
        """A session `message_handler`: a tools list-changed notification triggers a refresh (in
        `follow()`); everything else is ignored."""
        if _list_changed(message):
            self._change_event().set()

    def _change_event(self) -> anyio.Event:
        if self._changed is None:
            self._changed = anyio.Event()
        return self._changed

    async def follow(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Refresh on every tools list change until cancelled. On a 2026-07-28 connection it opens
        the `subscriptions/listen` stream first (started once the server acknowledged it);
        otherwise it waits for what `on_message` hears."""
        session = self.session
        raw = session.session if isinstance(session, Client) else session
        if raw.protocol_version in MODERN_PROTOCOL_VERSIONS:
            async with listen(raw, tools_list_changed=True) as subscription:
                task_status.started()
                # A change between the first listing and the acknowledgment had no stream to ride.
                await self.refresh()
                async for _event in subscription:
                    await self.refresh()
            return
        task_status.started()
        while True:
            await self._change_event().wait()
            self._changed = None
            await self.refresh()

    def on_change(self, callback: Callable[[list[Tool[Any, Any]]], Any]) -> None:
        """Call `callback(new_tools)` (sync or async) after a refresh registered new tools."""
        self._on_change.append(callback)

    # -- tools ----------------------------------------------------------------------------------

    @property
    def tools(self) -> list[Tool[Any, Any]]:
        """The gate tools built so far, in the server's order."""
        return list(self._tools.values())

    @property
    def definitions(self) -> list[types.Tool]:
        """The server's own tool definitions (as listed), for the tools built so far."""
        return list(self._definitions.values())

    def definition(self, name: str) -> types.Tool | None:
        """The server's definition of the gate tool `name`, if it was listed."""
        return self._definitions.get(name)

    def tool_name(self, server_name: str) -> str:
        """The gate tool name of the server's tool `server_name`."""
        return self.prefix + server_name

    async def _list_all(self) -> list[types.Tool]:
        session = self.session
        listed: list[types.Tool] = []
        cursor: str | None = None
        for _ in range(_LIST_PAGE_CAP):
            if isinstance(session, Client):
                page = await session.list_tools(cursor=cursor, cache_mode="refresh")
            else:
                page = await session.list_tools(params=types.PaginatedRequestParams(cursor=cursor))
            listed.extend(page.tools)
            cursor = page.next_cursor
            if cursor is None:
                return listed
        raise McpToolError(f"tools/list did not end within {_LIST_PAGE_CAP} pages")

    def _build(self, definition: types.Tool) -> Tool[Any, Any]:
        server_name = definition.name
        toolset = self

        async def call(args: dict[str, Any], ctx: ToolContext) -> Any:
            result = await toolset.session.call_tool(server_name, args)
            if not isinstance(result, types.CallToolResult):
                raise McpToolError(f"the server answered {type(result).__name__}, not a tool result")
            if result.is_error:
                raise McpToolError(error_text(result))
            return result if toolset.raw_results else value_from_result(result)

        return schema_tool(
            self.tool_name(server_name),
            definition.description or definition.title or "",
            definition.input_schema,
            call,
            **self._tool_options,
        )

    async def load(self) -> list[Tool[Any, Any]]:
        """List the server's tools and build a gate tool for each name not seen before; return
        the new ones. A tool the server stopped listing stays (a call of it gets the server's
        error); one whose schema changed keeps the schema it was registered with."""
        if self._lock is None:
            self._lock = anyio.Lock()
        async with self._lock:
            new: list[Tool[Any, Any]] = []
            for definition in await self._list_all():
                name = self.tool_name(definition.name)
                if name in self._tools:
                    continue
                tool = self._build(definition)
                self._tools[name] = tool
                self._definitions[name] = definition
                new.append(tool)
            return new

    async def attach(self, scope: AgentScope) -> AgentScope:
        """Load the tools (if not yet) and add them to `scope`; later refreshes add new tools to
        it too. Returns `scope`."""
        if not self._tools:
            await self.load()
        present = scope.tools
        scope.add_tools([t for t in self._tools.values() if t.name not in present])
        self._scopes.append(scope)
        return scope

    async def refresh(self) -> list[Tool[Any, Any]]:
        """List again; register tools not seen before in every attached scope (one
        `ToolsRegistered` event per scope) before returning them."""
        new = await self.load()
        if new:
            for scope in self._scopes:
                present = scope.tools
                scope.add_tools([t for t in new if t.name not in present])
            for callback in self._on_change:
                outcome = callback(new)
                if hasattr(outcome, "__await__"):
                    await outcome
        return new


def _text(text: str) -> list[types.ContentBlock]:
    return [types.TextContent(type="text", text=text)]


def _structured(value: Any, output_schema: dict[str, Any] | None) -> dict[str, Any] | None:
    if isinstance(value, dict):
        return value
    if output_schema is None:
        return None
    # A tool whose output is not an object declares it wrapped in a one-property object (MCP SDKs
    # use {"result": ...}); a substitute for it is wrapped the same way, or the client rejects it.
    required = output_schema.get("required", [])
    if len(required) == 1 and set(output_schema.get("properties", {})) == set(required):
        return {required[0]: value}
    return None


def result_from_gate(result: ToolResult, output_schema: dict[str, Any] | None = None) -> types.CallToolResult:
    """The MCP tool result for a gate's `ToolResult`: the upstream's own result when the tool ran
    and nothing changed it; a denial or an error as `isError` with what a model reads; any other
    value (a substitute, a transformed output) as text, with `structuredContent` for an object or
    when the tool declares an `output_schema` (a non-object value then wrapped as the schema's one
    property)."""
    match result.kind:
        case "ok" | "substituted":
            value = result.value
            if isinstance(value, types.CallToolResult):
                return value
            text = value if isinstance(value, str) else pydantic_core.to_json(value).decode()
            return types.CallToolResult(content=_text(text), structured_content=_structured(value, output_schema))
        case "denied" | "error":
            return types.CallToolResult(content=_text(result.to_model_text()), is_error=True)
    raise AssertionError(f"unknown result kind {result.kind!r}")  # pragma: no cover


class McpProxy:
    """A gated MCP server in front of an upstream one (what `callgate mcp-proxy` runs).

    `toolset` holds the upstream session (built with `raw_results=True`, so a result passes
    through unchanged); `scope` is the agent scope the upstream's tools are registered in.
    `tools/list` shows the upstream's definitions; `tools/call` goes through `scope.call` with
    `run` (a `RunContext`, or a function of the request context returning one). A name the proxy
    does not know yet makes it list the upstream again before answering, so a tool announced
    after start is registered before its first call. Upstream list changes are passed on to
    connected clients (a notification on older protocol versions, `subscriptions/listen` on
    2026-07-28).
    """

    def __init__(
        self,
        toolset: McpToolset,
        scope: AgentScope,
        *,
        name: str = "callgate-mcp-proxy",
        run: RunContext | Callable[[ServerRequestContext[Any]], RunContext] | None = None,
    ) -> None:
        if not toolset.raw_results:
            raise ConfigurationError("McpProxy needs a toolset built with raw_results=True")
        self.toolset = toolset
        self.scope = scope
        self._run = run if run is not None else RunContext(principal="mcp-client")
        self._bus = InMemorySubscriptionBus()
        self._listen = ListenHandler(self._bus)
        self._legacy_sessions: weakref.WeakSet[ServerSession] = weakref.WeakSet()
        self.server: Server[Any] = Server(
            name,
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
            on_subscriptions_listen=self._listen,
        )
        toolset.on_change(self._announce)

    def _remember(self, ctx: ServerRequestContext[Any]) -> None:
        if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            self._legacy_sessions.add(ctx.session)

    async def _announce(self, _new: list[Tool[Any, Any]]) -> None:
        await self._bus.publish(ToolsListChanged())
        for session in list(self._legacy_sessions):
            try:
                await session.send_tool_list_changed()
            except Exception:  # a client that went away must not stop the others hearing of it
                log.debug("could not notify an MCP client of a tools list change", exc_info=True)

    async def _list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        self._remember(ctx)
        # Only the tools some path of the chain can allow for this client's run; calls of the
        # others are still mediated (and refused) if a client asks for them by name.
        run = self._run if isinstance(self._run, RunContext) else self._run(ctx)
        registered = set(self.scope.shown_tools(run))
        tools = []
        for definition in self.toolset.definitions:
            if self.toolset.tool_name(definition.name) in registered:
                tools.append(definition.model_copy(update={"name": self.toolset.tool_name(definition.name)}))
        return types.ListToolsResult(tools=tools)

    async def _call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        self._remember(ctx)
        if params.name not in self.scope.tools:
            await self.toolset.refresh()
        run = self._run if isinstance(self._run, RunContext) else self._run(ctx)
        try:
            result = await self.scope.call(params.name, dict(params.arguments or {}), run=run)
        except (ToolBlockedError, ToolApprovalRequiredError) as exc:
            # A block stops the caller's run: a protocol error, not a result a model would read on.
            raise MCPError(types.INTERNAL_ERROR, str(exc)) from exc
        definition = self.toolset.definition(params.name)
        return result_from_gate(result, definition.output_schema if definition is not None else None)

    async def serve_stdio(self) -> None:
        """Serve MCP clients on this process's stdin/stdout until stdin closes."""
        from mcp.server.stdio import stdio_server

        async with stdio_server() as (read, write):
            await self.server.run(read, write, self._init_options())

    async def serve_http(self, host: str, port: int, *, stop: anyio.Event | None = None) -> None:
        """Serve streamable HTTP on `host:port` (path `/mcp`) until `stop` is set (then it shuts
        down gracefully and returns) or the task is cancelled. Installs no signal handlers:
        whether a signal stops the server is the caller's decision."""
        import uvicorn

        class _Server(uvicorn.Server):
            # uvicorn's own handlers re-raise the signal after shutting down, which would kill the
            # process before its caller could close the gate's sinks.
            @contextlib.contextmanager
            def capture_signals(self) -> Iterator[None]:
                yield

        app = self.server.streamable_http_app(host=host)
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on")
        server = _Server(config)

        async def stop_when_asked(stop: anyio.Event) -> None:
            await stop.wait()
            server.should_exit = True

        async with anyio.create_task_group() as tasks:
            if stop is not None:
                tasks.start_soon(stop_when_asked, stop)
            await server.serve()
            tasks.cancel_scope.cancel()

    def _init_options(self) -> Any:
        return self.server.create_initialization_options(NotificationOptions(tools_changed=True))
