"""MCP through the gate: an MCP server's tools as gate tools, and a gated MCP proxy server.

- `McpToolset` (the gated client) wraps a connected MCP `Client` or `ClientSession`: each tool the
  server lists becomes a gate `Tool` (name, description and input schema from the server) whose
  body calls the server. `attach(scope)` registers them in an agent scope, so `Agent` and
  `scope.call` reach MCP tools through the chain like local tools; tools the server adds later
  (its list-changed notification) are registered in that scope, with a `ToolsRegistered` event,
  before any call of them can pass.
- `McpProxy` is the server side of `callgate mcp-proxy`: it serves what an upstream server offers
  to any MCP client (stdio or streamable HTTP), relaying the whole protocol, and every crossing
  passes the gate first: `tools/call` as the tool, `resources/read` and `prompts/get` and, from
  the server, sampling, elicitation and roots requests as the gate tools of `CROSSING_TOOLS`. A
  denied tool call comes back as a tool result with `isError` and the denial message, a substitute
  as synthetic content, a block as a JSON-RPC error; another denied crossing as the JSON-RPC error
  `DENIED`; the other side never sees a request the gate refused. `McpRelay` carries what the
  upstream sends of its own accord to the proxy's clients.

Needs the `mcp` package (the `mcp` extra); importing `interceptor_core` does not load it.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import queue
import socket
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any, TextIO, TypeVar

import anyio
import anyio.abc
import mcp_types as types
import pydantic
import pydantic_core
from mcp import Client, ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.subscriptions import listen
from mcp.server import Server
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import NotificationOptions
from mcp.server.models import InitializationOptions
from mcp.server.subscriptions import (
    InMemorySubscriptionBus,
    ListenHandler,
    PromptsListChanged,
    ResourcesListChanged,
    ToolsListChanged,
)
from mcp.shared._context_streams import create_context_streams
from mcp.shared.exceptions import MCPError
from mcp.shared.jsonrpc_dispatcher import progress_token_from_params
from mcp.shared.message import ServerMessageMetadata, SessionMessage
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, LATEST_MODERN_VERSION, MODERN_PROTOCOL_VERSIONS

from interceptor_core.context import RunContext, ToolContext
from interceptor_core.exceptions import CallgateError, ConfigurationError, ToolApprovalRequiredError, ToolBlockedError
from interceptor_core.gate import AgentScope
from interceptor_core.integrations._schema import schema_tool
from interceptor_core.results import ToolResult
from interceptor_core.tools import Tool

log = logging.getLogger("callgate.integrations.mcp")

__all__ = [
    "CROSSING_TOOLS",
    "DENIED",
    "McpProxy",
    "McpRelay",
    "McpToolError",
    "McpToolset",
    "UpstreamConnect",
    "crossing_tools",
    "error_text",
    "result_from_gate",
    "upstream_client",
    "value_from_result",
]

_LIST_PAGE_CAP = 1000
"""Pages of a tools/list walk before giving up: a server whose cursor never ends cannot hang us."""

MAX_NAME_CHARS = 128
"""The longest tool name `McpProxy` accepts by default (the MCP specification's own bound)."""

MAX_ARGS_BYTES = 1_048_576
"""The largest `tools/call` arguments (as JSON) `McpProxy` accepts by default."""

MAX_URI_CHARS = 8192
"""The longest `resources/read` URI the proxy passes on (a prompt's name is held to MAX_NAME_CHARS
and its arguments to MAX_ARGS_BYTES): longer ones are refused, with a small event, before the gate
or the server reads them."""

MAX_LINE_BYTES = 4 * 1_048_576
"""The longest JSON-RPC message line `McpProxy.serve_stdio` reads by default."""

HTTP_GRACE_S = 3.0
"""How long `McpProxy.serve_http`, once stopped, lets requests in flight finish before it cancels
them (whole seconds: uvicorn's graceful shutdown timeout)."""

STDIO_GRACE_S = 30.0
"""How long `McpProxy.serve_stdio`, once stopped, lets requests in flight finish by default."""

_TEARDOWN_S = 5.0
"""Past the grace, how long the server has to answer what it cancelled and return."""

_SHOWN_NAME_CHARS = 64
"""How much of a refused tool name the audit keeps."""


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

    def current(self) -> Client | ClientSession:
        """The session a call made now goes to: the upstream session of the client being served,
        when it has one of its own (`McpProxy` routes each client's requests to it), else
        `session`."""
        routes = _routes.get()
        routed = routes.get(self) if routes is not None else None
        return routed if routed is not None else self.session

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
        the `subscriptions/listen` stream first (started once the server acknowledged it and the
        tools were listed again); otherwise it waits for what `on_message` hears."""
        session = self.session
        raw = session.session if isinstance(session, Client) else session
        if raw.protocol_version in MODERN_PROTOCOL_VERSIONS:
            async with listen(raw, tools_list_changed=True) as subscription:
                # A change between the first listing and the acknowledgment had no stream to ride.
                # Started only after this listing: whoever waits for `follow` to start then sees
                # the tools as of the subscription, and no listing of it lands later.
                await self.refresh()
                task_status.started()
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
        session = self.current()
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
            # A proxied call passes the client's progress token on (its handler set the client's
            # request in this task's context before the gate started the call).
            client = _downstream.get()
            progress = _progress_relay(client) if client is not None else None
            result = await toolset.current().call_tool(server_name, args, progress_callback=progress)
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


def _read_result(uri: Any, value: Any) -> types.ReadResourceResult:
    """A gated resource read's value as the read's result: the upstream's own result, or what an
    interceptor substituted, as the resource's text."""
    if isinstance(value, types.ReadResourceResult):
        return value
    text = value if isinstance(value, str) else pydantic_core.to_json(value).decode()
    return types.ReadResourceResult(contents=[types.TextResourceContents(uri=uri, text=text)])


def _prompt_result(value: Any) -> types.GetPromptResult:
    """A gated prompt get's value as the get's result: the upstream's own result, or what an
    interceptor substituted, as one user message."""
    if isinstance(value, types.GetPromptResult):
        return value
    text = value if isinstance(value, str) else pydantic_core.to_json(value).decode()
    return types.GetPromptResult(
        messages=[types.PromptMessage(role="user", content=types.TextContent(type="text", text=text))]
    )


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


_downstream: contextvars.ContextVar[ServerRequestContext[Any] | None] = contextvars.ContextVar(
    "callgate_mcp_downstream", default=None
)
"""The client request a gated call serves, read by the call's body (which runs in a task copied
from the handler's context) to pass the client's progress token on."""

_routes: contextvars.ContextVar[dict[McpToolset, Client] | None] = contextvars.ContextVar(
    "callgate_mcp_routes", default=None
)
"""The upstream sessions of the client a request serves, by toolset (see `McpToolset.current`)."""

_upstream_failure: contextvars.ContextVar[list[MCPError] | None] = contextvars.ContextVar(
    "callgate_mcp_upstream_failure", default=None
)
"""Where a crossing's body leaves the error the other side answered with, so the proxy can answer
with that same error (code and message) instead of the gate's error text."""

CROSSING_TOOLS: dict[str, str] = {
    "mcp.resources.read": "resource",
    "mcp.prompts.get": "prompt",
    "mcp.sampling.createMessage": "sampling",
    "mcp.elicitation.create": "elicitation",
    "mcp.roots.list": "roots",
}
"""The gate tools an `McpProxy` registers for the crossings that are not tool calls (name to the
events' `crossing`); a policy names them in `tools:` like any tool. Never listed by tools/list and
never callable with tools/call."""

DENIED = -32003
"""The JSON-RPC error code of a crossing the gate denied (a resource read, a prompt get; a
sampling, elicitation or roots request answered to the server): an implementation-defined server
error, the message being what the gate said. (Not -32001 or -32000: the MCP SDKs use those for a
request timeout and a closed connection, which a client may retry.)"""

_MAX_CLIENTS = 1024
"""How many client connections an `McpProxy` remembers for notifications and server requests
(the least recently active are forgotten first)."""

_SHOWN_ERROR_CHARS = 512
"""How much of the other side's error message a relayed error keeps."""


def _progress_relay(ctx: ServerRequestContext[Any]) -> Any:
    """A progress callback passing the upstream's progress to the client request `ctx` (None when
    the client asked for no progress)."""
    if progress_token_from_params(ctx.params) is None:
        return None

    async def relay(progress: float, total: float | None, message: str | None) -> None:
        try:
            await ctx.session.report_progress(progress, total, message)
        except Exception:  # the client went away; the call itself goes on
            log.debug("could not pass progress on to an MCP client", exc_info=True)

    return relay


def _params(model: pydantic.BaseModel) -> dict[str, Any]:
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


def _bounded(text: str) -> str:
    return text if len(text) <= _SHOWN_ERROR_CHARS else text[:_SHOWN_ERROR_CHARS] + "…"


class _Refresh:
    """When the tools were last listed again for an unknown name, and the listing running now."""

    __slots__ = ("next", "running")

    def __init__(self) -> None:
        self.next = 0.0
        self.running: anyio.Event | None = None


class _Link:
    """A client connection's own upstream session, opened with exactly the capabilities the
    client declared, held by a task of the proxy's until the connection closes."""

    __slots__ = ("client", "closing", "done", "error", "ready")

    def __init__(self) -> None:
        self.client: Client | None = None
        self.error: str | None = None
        self.ready = anyio.Event()
        self.closing = anyio.Event()
        self.done = anyio.Event()

    async def aclose(self) -> None:
        self.closing.set()
        await self.done.wait()


class _Client:
    """What an `McpProxy` knows of one client connection: its most recent request (whose session
    reaches the connection's standalone channel), its requests in flight, its subscriptions, its
    own upstream session (`link`, when it has one) and its listing again of the tools."""

    __slots__ = ("inflight", "last", "link", "refresh", "subscriptions")

    def __init__(self, ctx: ServerRequestContext[Any]) -> None:
        self.last = ctx
        self.inflight: dict[Any, ServerRequestContext[Any]] = {}
        self.subscriptions: set[str] = set()
        self.link: _Link | None = None
        self.refresh = _Refresh()

    def can(self, capability: types.ClientCapabilities) -> bool:
        return self.last.session.check_client_capability(capability)


def upstream_client(server: Any, capabilities: types.ClientCapabilities | None, **options: Any) -> Client:
    """An `mcp.Client` of `server` (a transport, a URL, `StdioServerParameters`) that declares
    exactly `capabilities` to it (none when None), whatever callbacks `options` holds: the
    callbacks answer what the server asks anyway (through the gate, which records a refusal)."""
    declared = capabilities if capabilities is not None else types.ClientCapabilities()
    client = Client(server, **options)
    build = client._build_session

    async def build_declaring(exit_stack: contextlib.AsyncExitStack) -> ClientSession:
        session = await build(exit_stack)
        session._build_capabilities = lambda version: declared  # type: ignore[method-assign]
        return session

    client._build_session = build_declaring  # type: ignore[method-assign]
    return client


UpstreamConnect = Callable[
    [types.ClientCapabilities | None, dict[str, Any]], contextlib.AbstractAsyncContextManager[Client]
]
"""Opens an upstream session declaring the given client capabilities, with the `mcp.Client`
keyword arguments given (its callbacks): how `McpProxy` gives each client connection its own."""


class _LinkRelay:
    """The callbacks of one client's own upstream session: what the server sends on it of its own
    accord reaches that client only (list changes, resource updates, log messages; sampling,
    elicitation and roots requests through the gate)."""

    def __init__(self, proxy: McpProxy, client: _Client) -> None:
        self.proxy = proxy
        self.client = client

    def options(self) -> dict[str, Any]:
        return {
            "message_handler": self.on_message,
            "logging_callback": self.on_log,
            "sampling_callback": self.on_sampling,
            "elicitation_callback": self.on_elicitation,
            "list_roots_callback": self.on_roots,
        }

    async def _forward(self, message: Any) -> None:
        try:
            await self.client.last.session.send_notification(message)
        except Exception:  # the client went away; its connection's close ends the link
            log.debug("could not pass a notification on to an MCP client", exc_info=True)

    async def on_message(self, message: object) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            # New tools are registered in the gate (listed through this client's session, which
            # sees what the server shows this client) before the client hears of them.
            link = self.client.link
            if link is not None and link.client is not None:
                token = _routes.set({self.proxy.toolset: link.client})
                try:
                    await self.proxy.toolset.refresh()
                except Exception:
                    log.warning("listing the upstream's tools again failed", exc_info=True)
                finally:
                    _routes.reset(token)
            await self._forward(message)
        elif isinstance(
            message,
            types.ResourceListChangedNotification
            | types.PromptListChangedNotification
            | types.ResourceUpdatedNotification,
        ):
            await self._forward(message)

    async def on_log(self, params: types.LoggingMessageNotificationParams) -> None:
        await self._forward(types.LoggingMessageNotification(params=params))

    async def on_sampling(
        self, context: Any, params: types.CreateMessageRequestParams
    ) -> types.CreateMessageResult | types.CreateMessageResultWithTools | types.ErrorData:
        result_type = types.CreateMessageResultWithTools if params.tools else types.CreateMessageResult
        return await self.proxy.ask_client("mcp.sampling.createMessage", _params(params), result_type, self.client)

    async def on_elicitation(
        self, context: Any, params: types.ElicitRequestParams
    ) -> types.ElicitResult | types.ErrorData:
        return await self.proxy.ask_client("mcp.elicitation.create", _params(params), types.ElicitResult, self.client)

    async def on_roots(self, context: Any) -> types.ListRootsResult | types.ErrorData:
        return await self.proxy.ask_client("mcp.roots.list", {}, types.ListRootsResult, self.client)


class McpRelay:
    """The callbacks of a gateway's upstream `Client`: what the upstream server sends of its own
    accord (list changes, resource updates, log messages, sampling, elicitation and roots requests)
    reaches the clients of the `McpProxy` bound to it. Build it before the upstream connection
    (`client_options()` are the `Client`'s keyword arguments), bind it when the proxy exists.

    Before a proxy is bound, notifications are dropped and server requests answered with an error.
    """

    def __init__(self, toolset: McpToolset | None = None) -> None:
        self.toolset = toolset
        self.proxy: McpProxy | None = None
        self.unrecorded: list[str] = []
        """Server requests refused before a proxy was bound (their crossing tools), recorded by
        the proxy when it binds: every refusal leaves an event."""

    def _too_early(self, crossing: str) -> types.ErrorData:
        self.unrecorded.append(crossing)
        return types.ErrorData(code=types.INVALID_REQUEST, message="no client is connected yet")

    def client_options(self) -> dict[str, Any]:
        """Keyword arguments for `mcp.Client`: the handlers, and the client capabilities the proxy
        relays (sampling, elicitation, roots)."""
        return {
            "message_handler": self.on_message,
            "logging_callback": self.on_log,
            "sampling_callback": self.on_sampling,
            "elicitation_callback": self.on_elicitation,
            "list_roots_callback": self.on_roots,
        }

    async def on_message(self, message: object) -> None:
        if self.toolset is not None:
            await self.toolset.on_message(message)
        if self.proxy is not None and not isinstance(message, Exception):
            await self.proxy.notify_clients(message)

    async def on_log(self, params: types.LoggingMessageNotificationParams) -> None:
        if self.proxy is not None:
            await self.proxy.notify_clients(types.LoggingMessageNotification(params=params))

    async def on_sampling(
        self, context: Any, params: types.CreateMessageRequestParams
    ) -> types.CreateMessageResult | types.CreateMessageResultWithTools | types.ErrorData:
        if self.proxy is None:
            return self._too_early("mcp.sampling.createMessage")
        result_type = types.CreateMessageResultWithTools if params.tools else types.CreateMessageResult
        return await self.proxy.ask_client("mcp.sampling.createMessage", _params(params), result_type)

    async def on_elicitation(
        self, context: Any, params: types.ElicitRequestParams
    ) -> types.ElicitResult | types.ErrorData:
        if self.proxy is None:
            return self._too_early("mcp.elicitation.create")
        return await self.proxy.ask_client("mcp.elicitation.create", _params(params), types.ElicitResult)

    async def on_roots(self, context: Any) -> types.ListRootsResult | types.ErrorData:
        if self.proxy is None:
            return self._too_early("mcp.roots.list")
        return await self.proxy.ask_client("mcp.roots.list", {}, types.ListRootsResult)


_R = TypeVar("_R", bound=pydantic.BaseModel)

_CLIENT_CAPABILITY = {
    "mcp.sampling.createMessage": types.ClientCapabilities(sampling=types.SamplingCapability()),
    "mcp.elicitation.create": types.ClientCapabilities(elicitation=types.ElicitationCapability()),
    "mcp.roots.list": types.ClientCapabilities(roots=types.RootsCapability()),
}


def _kind(value: object) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number"
    )


def _params_problem(method: str, params: Any) -> tuple[str, str] | None:
    """For a gated method whose params are of the wrong shape: the tool the audit names and the
    refusal (saying what was wrong, never the value); else None."""
    if method == "tools/call":
        tool = "unnamed-tool"
        if not isinstance(params, dict):
            return tool, f"tools/call params must be an object, got {_kind(params)}"
        name = params.get("name")
        if not isinstance(name, str):
            return tool, f"tools/call name must be a string, got {_kind(name)}"
        tool = name if len(name) <= _SHOWN_NAME_CHARS else name[:_SHOWN_NAME_CHARS] + "…"
        arguments = params.get("arguments")
        if arguments is not None and not isinstance(arguments, dict):
            return tool, f"tools/call arguments must be an object, got {_kind(arguments)}"
    elif method == "resources/read":
        uri = params.get("uri") if isinstance(params, dict) else None
        if not isinstance(uri, str):
            return "mcp.resources.read", f"resources/read uri must be a string, got {_kind(uri)}"
        if len(uri) > MAX_URI_CHARS:
            return "mcp.resources.read", (
                f"resources/read uri of {len(uri)} characters refused: this proxy accepts at most {MAX_URI_CHARS}"
            )
    elif method == "prompts/get":
        name = params.get("name") if isinstance(params, dict) else None
        arguments = params.get("arguments") if isinstance(params, dict) else None
        if not isinstance(name, str):
            return "mcp.prompts.get", f"prompts/get name must be a string, got {_kind(name)}"
        if arguments is not None and not isinstance(arguments, dict):
            return "mcp.prompts.get", f"prompts/get arguments must be an object, got {_kind(arguments)}"
        if len(name) > MAX_NAME_CHARS:
            return "mcp.prompts.get", (
                f"prompts/get name of {len(name)} characters refused: this proxy accepts at most {MAX_NAME_CHARS}"
            )
        if arguments and (size := len(pydantic_core.to_json(arguments))) > MAX_ARGS_BYTES:
            return "mcp.prompts.get", (
                f"prompts/get arguments of {size} bytes refused: this proxy accepts at most {MAX_ARGS_BYTES}"
            )
    return None


def crossing_tools(toolset: McpToolset) -> list[Tool[Any, Any]]:
    """The gate tools of the crossings that are not tool calls (`CROSSING_TOOLS`) that the
    toolset's connected upstream can take: `mcp.resources.read` and `mcp.prompts.get` when it
    offers resources and prompts, the server-to-client ones always. Register them in the scope the
    upstream's tools are in (`McpProxy` adds those missing)."""
    session = toolset.session
    caps = session.server_capabilities if isinstance(session, Client) else types.ServerCapabilities()
    offered = {"mcp.resources.read": caps.resources is not None, "mcp.prompts.get": caps.prompts is not None}
    return [_crossing_tool(toolset, name) for name in CROSSING_TOOLS if offered.get(name, True)]


_CROSSING_SCHEMAS: dict[str, dict[str, Any]] = {
    # What a policy can name (and the static check knows of); other params the spec adds pass too.
    "mcp.sampling.createMessage": {
        "type": "object",
        "properties": {
            "messages": {"type": "array"},
            "maxTokens": {"type": "integer"},
            "systemPrompt": {"type": "string"},
            "includeContext": {"type": "string"},
            "temperature": {"type": "number"},
            "stopSequences": {"type": "array"},
            "modelPreferences": {"type": "object"},
            "metadata": {"type": "object"},
            "tools": {"type": "array"},
            "toolChoice": {"type": "object"},
        },
        "required": ["messages", "maxTokens"],
    },
    "mcp.elicitation.create": {
        "type": "object",
        "properties": {
            "mode": {"type": "string"},
            "message": {"type": "string"},
            "requestedSchema": {"type": "object"},
            "url": {"type": "string"},
            "elicitationId": {"type": "string"},
        },
        "required": ["message"],
    },
    "mcp.resources.read": {"type": "object", "properties": {"uri": {"type": "string"}}, "required": ["uri"]},
    "mcp.prompts.get": {
        "type": "object",
        "properties": {"name": {"type": "string"}, "arguments": {"type": "object"}},
        "required": ["name"],
    },
}


def _crossing_tool(toolset: McpToolset, name: str) -> Tool[Any, Any]:
    async def cross(args: dict[str, Any], _ctx: ToolContext) -> Any:
        try:
            return await _cross(toolset, name, args, _downstream.get())
        except MCPError as exc:
            failures = _upstream_failure.get()
            if failures is not None:
                failures.append(exc)
            raise

    schema = _CROSSING_SCHEMAS.get(name, {"type": "object"})
    tool = schema_tool(name, f"MCP {name[4:]} through the gateway", schema, cross)
    tool.crossing = CROSSING_TOOLS[name]
    return tool


async def _cross(toolset: McpToolset, name: str, args: dict[str, Any], target: ServerRequestContext[Any] | None) -> Any:
    """What a crossing tool does once the gate let it through: ask the upstream (a read, a get)
    or the client `target` (a server request), with the arguments as the chain left them."""
    session = toolset.current()
    raw = session.session if isinstance(session, Client) else session
    progress = _progress_relay(target) if target is not None else None
    meta = target.meta if target is not None else None
    match name:
        case "mcp.resources.read":
            params = types.ReadResourceRequestParams(uri=args["uri"], _meta=meta)
            return await raw.send_request(
                types.ReadResourceRequest(params=params), types.ReadResourceResult, progress_callback=progress
            )
        case "mcp.prompts.get":
            params_get = types.GetPromptRequestParams(name=args["name"], arguments=args.get("arguments"), _meta=meta)
            return await raw.send_request(
                types.GetPromptRequest(params=params_get), types.GetPromptResult, progress_callback=progress
            )
    if target is None:
        raise MCPError(types.INVALID_REQUEST, "no connected client can answer this request")
    related = ServerMessageMetadata(related_request_id=target.request_id) if target.request_id is not None else None
    match name:
        case "mcp.sampling.createMessage":
            sampling = types.CreateMessageRequestParams.model_validate(args, by_name=False)
            result_type: Any = types.CreateMessageResultWithTools if sampling.tools else types.CreateMessageResult
            return await target.session.send_request(
                types.CreateMessageRequest(params=sampling), result_type, metadata=related
            )
        case "mcp.elicitation.create":
            adapter = pydantic.TypeAdapter[types.ElicitRequestParams](types.ElicitRequestParams)
            elicit = adapter.validate_python(args, by_name=False)
            return await target.session.send_request(
                types.ElicitRequest(params=elicit), types.ElicitResult, metadata=related
            )
        case "mcp.roots.list":
            return await target.session.send_request(types.ListRootsRequest(), types.ListRootsResult, metadata=related)
    raise AssertionError(f"unknown crossing {name}")  # pragma: no cover


class _ProxyServer(Server[Any]):
    """The SDK's server, whose default initialization options advertise the list changes the
    proxy passes on: the streamable HTTP transport asks for the defaults, stdio for these too."""

    notification_options: NotificationOptions | None = None

    def create_initialization_options(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> InitializationOptions:
        return super().create_initialization_options(
            notification_options or self.notification_options, experimental_capabilities, extensions
        )


class _GatedServer:
    """How a gated MCP server (`McpProxy`, `McpGateway`) serves its clients: over stdio or
    streamable HTTP, with the same answers to unreadable input and the same graceful stop."""

    server: Server[Any]
    _legacy: bool = False
    """Whether the server speaks only the initialize handshake (`server/discover` is answered
    with -32022 naming the handshake versions)."""
    _tasks: anyio.abc.TaskGroup | None = None
    """While serving: where tasks that live as long as the serving (a client's own upstream
    session) run."""
    _one_client: bool = False
    """Whether the server serves one client only (over stdio), whose sessions are the only ones."""

    def _refuse_unread(self, tool: str, message: str, run: RunContext | None = None) -> None:
        raise NotImplementedError

    def _set_tasks(self, tasks: anyio.abc.TaskGroup | None) -> None:
        self._tasks = tasks

    async def serve_stdio(
        self,
        *,
        stop: anyio.Event | None = None,
        max_line_bytes: int = MAX_LINE_BYTES,
        grace_s: float = STDIO_GRACE_S,
        draining: Callable[[int], object] | None = None,
    ) -> None:
        """Serve one MCP client on this process's stdin/stdout until stdin closes or `stop` is set.
        While serving, fd 0 reads the null device and fd 1 writes to stderr, so stray output misses
        the wire.

        Stopping (`stop` set, or end of stdin) is graceful, as `serve_http`'s is: no line is read
        after it (a blocked read of stdin does not hold it up), the requests in flight run to their
        end and their responses are written, for up to `grace_s` seconds; a request still running
        then is cancelled (its outcome is recorded as cancelled) and answered with the SDK's
        "Connection closed" error. `draining(n)` is called once, when serving stops with `n` > 0
        requests in flight. A `subscriptions/listen` stream is not waited for (it never ends of
        its own accord). The caller's own cancellation stops serving at once, as before.

        Unlike the MCP SDK's stdio transport, which drops such lines unanswered, every line that is
        not a JSON-RPC message gets an error response: -32700 (parse error, id null) for text that
        is not JSON, -32600 (invalid request) for JSON that is not a message, for JSON nested deeper
        than the parser's limit (with the request's id when it can be read) and for a line longer
        than `max_line_bytes` (its content is skipped, never buffered whole)."""
        if grace_s < 0:
            raise ConfigurationError(f"grace_s must not be negative, got {grace_s}")
        async with (
            _stdio_transport(max_line_bytes, stop, grace_s, draining, self._legacy, self._refuse_unread) as (
                read,
                write,
            ),
            anyio.create_task_group() as tasks,
        ):
            if stop is not None:

                async def give_up_after_grace(stop: anyio.Event) -> None:
                    # The transport ends the read side once the requests in flight are answered
                    # (or the grace is over), and the server then returns; this bounds its teardown.
                    await stop.wait()
                    await anyio.sleep(grace_s + _TEARDOWN_S)
                    tasks.cancel_scope.cancel()

                tasks.start_soon(give_up_after_grace, stop)
            self._set_tasks(tasks)
            self._one_client = True
            try:
                await self.server.run(read, write, self._init_options())
            finally:
                self._set_tasks(None)
            tasks.cancel_scope.cancel()

    async def serve_http(
        self,
        host: str,
        port: int,
        *,
        stop: anyio.Event | None = None,
        sock: socket.socket | None = None,
        authenticate: Callable[[str | None], object | None] | None = None,
        ready: Callable[[], object] | None = None,
        resource_metadata: dict[str, Any] | None = None,
    ) -> None:
        """Serve streamable HTTP on `host:port` (path `/mcp`) until `stop` is set (then it shuts
        down gracefully and returns) or the task is cancelled. Installs no signal handlers:
        whether a signal stops the server is the caller's decision. `sock`: a socket already
        bound to `host:port` and listening (so the caller learns of a port in use before it starts
        anything else).

        `authenticate(bearer_token_or_None)` returns who the request is from, or None to answer it
        401 (`WWW-Authenticate: Bearer`) before the MCP layer sees it; what it returned is in the
        request's ASGI scope under `"callgate.client"`, which a `run` function reads with
        `client_of(ctx)`. `ready()` is called once the server has started serving.
        `resource_metadata` (OAuth protected-resource metadata, RFC 9728) is served without
        authentication at `/.well-known/oauth-protected-resource` (and that path followed by
        `/mcp`), and named in the 401's `WWW-Authenticate`."""
        import uvicorn

        class _Server(uvicorn.Server):
            # uvicorn's own handlers re-raise the signal after shutting down, which would kill the
            # process before its caller could close the gate's sinks.
            @contextlib.contextmanager
            def capture_signals(self) -> Iterator[None]:
                yield

        app: Any = self.server.streamable_http_app(host=host)
        app = _HttpScreen(app, self._refuse_unread, max_bytes=MAX_LINE_BYTES, handshake_only=self._legacy)
        if authenticate is not None:
            app = _BearerAuth(app, authenticate, resource_metadata)
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level="warning",
            lifespan="on",
            timeout_graceful_shutdown=int(HTTP_GRACE_S),
        )
        server = _Server(config)
        manager = self.server.session_manager

        async def stop_when_asked(stop: anyio.Event) -> None:
            await stop.wait()
            server.should_exit = True
            # A client's notification stream (its GET) never ends of its own accord, and uvicorn
            # waits for every connection to end: those streams are closed now and until serving
            # returns (a client may open one again before the listening socket is closed). The
            # requests in flight run on, up to uvicorn's graceful timeout; then they are cancelled.
            while True:
                for transport in list(manager._server_instances.values()):
                    transport.close_standalone_sse_stream()
                await anyio.sleep(0.1)

        async def say_when_ready(ready: Callable[[], object]) -> None:
            # uvicorn has no started callback; its flag is set once the app's lifespan ran.
            while not server.started:  # noqa: ASYNC110 - a flag of uvicorn's, with no event to wait on
                await anyio.sleep(0.01)
            ready()

        async with anyio.create_task_group() as tasks:
            if stop is not None:
                tasks.start_soon(stop_when_asked, stop)
            if ready is not None:
                tasks.start_soon(say_when_ready, ready)
            self._set_tasks(tasks)
            try:
                await server.serve(sockets=[sock] if sock is not None else None)
            finally:
                self._set_tasks(None)
            tasks.cancel_scope.cancel()

    def _init_options(self) -> Any:
        return self.server.create_initialization_options()


class McpProxy(_GatedServer):
    """A gated MCP server in front of an upstream one (what `callgate mcp-proxy` runs).

    `toolset` holds the upstream session (built with `raw_results=True`, so a result passes
    through unchanged); `scope` is the agent scope the upstream's tools are registered in.

    What crosses, and what decides:

    - The proxy offers what the upstream offers (its capabilities, `serverInfo` name, version and
      title, `instructions`); its description says callgate serves it. When the upstream speaks a
      handshake-era protocol (2025-11-25 and before), so does the proxy to its clients.
    - `tools/list`, `resources/list`, `resources/templates/list` and `prompts/list` are relayed
      page by page (the upstream's cursors pass through; the upstream's error for a bad cursor
      comes back as it is); `tools/list` pages hide the tools no path of the chain can allow for
      the client's run. `completion/complete`, `logging/setLevel`, `resources/subscribe` and
      `resources/unsubscribe` are relayed as they are.
    - `tools/call` goes through `scope.call` with `run` (a `RunContext`, or a function of the
      request context returning one). A name the proxy does not know yet makes it list the
      upstream again before answering (at most once per `refresh_interval_s`).
    - `resources/read` and `prompts/get` go through `scope.call` too, as the gate tools
      `mcp.resources.read` (args `{"uri"}`) and `mcp.prompts.get` (args `{"name", "arguments"}`),
      so a policy decides on them and each leaves an outcome event with its `crossing`. A denial
      is the JSON-RPC error `DENIED` with the gate's message; an upstream error is passed on.
    - With `connect` (how to open an upstream session declaring given client capabilities), each
      handshake-era client connection gets an upstream session of its own once its handshake
      ends, declaring exactly what the client declared; its requests go to that session, which
      closes with the connection (its exit stack). Without it, and for clients of the newest
      protocol (no session), clients share the toolset's session.
    - `sampling/createMessage`, `elicitation/create` and `roots/list` from the upstream go through
      `scope.call` as `mcp.sampling.createMessage`, `mcp.elicitation.create` and `mcp.roots.list`
      (args: the request's params; a rewrite changes what the client is asked) and then to the
      client whose own session they came on (on the stream of its request in flight, when it has
      one); from the shared session (given to `McpRelay`), to a client sharing it that declared
      the capability (the one with a request in flight, most recent first, else the most recently
      active one). A denial is answered to the upstream as the error `DENIED`.
    - Progress the client asked for (`progressToken`) is passed on from the upstream; upstream
      notifications (list changes, resource updates for the client's subscriptions, log
      messages) reach the client of the session they came on (from the shared session, the
      clients sharing it). `on_link_lost(exc)` hears of a client's own session that ended while
      the client was connected. List changes for clients of the newest protocol are published on
      `bus` (the listen streams' bus: a gateway shares one between its servers' proxies).

    Hostile input is refused before the gate sees it: a tool name longer than `max_name_chars` or
    arguments larger than `max_args_bytes` (as JSON) get a JSON-RPC error (invalid params) that
    states the sizes, never the input, and one small `ToolDenied` event (decided by validation,
    the name cut to 64 characters, no arguments).
    """

    def __init__(
        self,
        toolset: McpToolset,
        scope: AgentScope,
        *,
        name: str = "callgate-mcp-proxy",
        run: RunContext | Callable[[ServerRequestContext[Any]], RunContext] | None = None,
        max_name_chars: int = MAX_NAME_CHARS,
        max_args_bytes: int = MAX_ARGS_BYTES,
        refresh_interval_s: float = 1.0,
        relay: McpRelay | None = None,
        connect: UpstreamConnect | None = None,
        on_link_lost: Callable[[BaseException], object] | None = None,
        bus: InMemorySubscriptionBus | None = None,
    ) -> None:
        if not toolset.raw_results:
            raise ConfigurationError("McpProxy needs a toolset built with raw_results=True")
        if max_name_chars < 1 or max_args_bytes < 2 or refresh_interval_s < 0:
            raise ConfigurationError(
                "max_name_chars must be at least 1, max_args_bytes at least 2 and refresh_interval_s not negative"
            )
        self.toolset = toolset
        self.scope = scope
        self.max_name_chars = max_name_chars
        self.max_args_bytes = max_args_bytes
        self.refresh_interval_s = refresh_interval_s
        self._run = run if run is not None else RunContext(principal="mcp-client")
        self._shared_refresh = _Refresh()
        self._connect = connect
        self._on_link_lost = on_link_lost
        self._bus = bus if bus is not None else InMemorySubscriptionBus()
        self._listen = ListenHandler(self._bus)
        self._clients: OrderedDict[object, _Client] = OrderedDict()
        session = toolset.session
        upstream = session if isinstance(session, Client) else None
        info = upstream.server_info if upstream is not None else None
        caps = upstream.server_capabilities if upstream is not None else types.ServerCapabilities()
        self._upstream_caps = caps
        self._legacy = upstream is not None and upstream.protocol_version not in MODERN_PROTOCOL_VERSIONS
        described = f"served through callgate ({name})"
        self.server: Server[Any] = _ProxyServer(
            info.name if info is not None else name,
            version=info.version if info is not None else "",
            title=info.title if info is not None else None,
            description=f"{info.description} ({described})" if info is not None and info.description else described,
            instructions=upstream.instructions if upstream is not None else None,
            website_url=info.website_url if info is not None else None,
            icons=info.icons if info is not None else None,
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
            on_subscriptions_listen=self._listen,
        )
        self.server.notification_options = NotificationOptions(
            tools_changed=True,
            resources_changed=bool(caps.resources and caps.resources.list_changed),
            prompts_changed=bool(caps.prompts and caps.prompts.list_changed),
        )
        # The proxy serves (and so advertises) what the upstream offers, no more. Registered one by
        # one: the constructor's logging keyword warns that the newest protocol deprecates it, and
        # the upstream still offers it.
        add = self.server.add_request_handler
        paginated = types.PaginatedRequestParams
        if caps.resources is not None:
            add("resources/list", paginated, self._list_resources)
            add("resources/templates/list", paginated, self._list_resource_templates)
            add("resources/read", types.ReadResourceRequestParams, self._read_resource)
            if caps.resources.subscribe:
                add("resources/subscribe", types.SubscribeRequestParams, self._subscribe)
                add("resources/unsubscribe", types.UnsubscribeRequestParams, self._unsubscribe)
        if caps.prompts is not None:
            add("prompts/list", paginated, self._list_prompts)
            add("prompts/get", types.GetPromptRequestParams, self._get_prompt)
        if caps.completions is not None:
            add("completion/complete", types.CompleteRequestParams, self._complete)
        if caps.logging is not None:
            add("logging/setLevel", types.SetLevelRequestParams, self._set_level)
        self.server.middleware.append(self._screen_params)
        if self._legacy:
            # Without discovery, a client falls back to the handshake the upstream speaks.
            self.server._request_handlers.pop("server/discover", None)
        present = scope.tools
        missing = [tool for tool in crossing_tools(toolset) if tool.name not in present]
        if missing:
            scope.add_tools(missing)
        toolset.on_change(self._announce)
        if relay is not None:
            relay.toolset = relay.toolset or toolset
            relay.proxy = self
            for crossing in relay.unrecorded:
                message = f"no client was connected yet to answer the {CROSSING_TOOLS[crossing]} request"
                self.scope.refuse(crossing, message, run=self._refuse_run(), crossing=CROSSING_TOOLS[crossing])
            relay.unrecorded.clear()

    # -- clients --------------------------------------------------------------------------------

    def _remember(self, ctx: ServerRequestContext[Any]) -> _Client:
        """The client of `ctx` (remembered, most recently active last), its last request `ctx`."""
        key = getattr(ctx.session, "_connection", ctx.session)
        client = self._clients.get(key)
        if client is None:
            client = self._clients[key] = _Client(ctx)
            while len(self._clients) > _MAX_CLIENTS:
                self._clients.popitem(last=False)
        else:
            client.last = ctx
            self._clients.move_to_end(key)
        return client

    def link_of(self, ctx: ServerRequestContext[Any]) -> _Link | None:
        """The upstream session of its own the client of `ctx` has, if any."""
        client = self._clients.get(getattr(ctx.session, "_connection", ctx.session))
        return client.link if client is not None else None

    def forget_link(self, ctx: ServerRequestContext[Any]) -> bool:
        """Close the upstream session of its own the client of `ctx` has (it failed) without
        waiting for it to end; the client's next request opens a new one. Whether it had one."""
        client = self._clients.get(getattr(ctx.session, "_connection", ctx.session))
        if client is None or client.link is None:
            return False
        client.link.closing.set()
        client.link = None
        return True

    def _links(self, ctx: ServerRequestContext[Any]) -> bool:
        """Whether the connection of `ctx` gets an upstream session of its own: a handshake-era
        connection (it declared its capabilities once, for the session) of a proxy that can open
        one (`connect`) and is serving."""
        connection = getattr(ctx.session, "_connection", None)
        return (
            self._connect is not None
            and self._tasks is not None
            and connection is not None
            and connection.protocol_version not in MODERN_PROTOCOL_VERSIONS
        )

    def _open_link(self, ctx: ServerRequestContext[Any], client: _Client) -> _Link:
        """Start the task holding the client's own upstream session; it ends when the client's
        connection closes (or the proxy stops serving)."""
        link = client.link = _Link()
        connection = ctx.session._connection
        connection.exit_stack.push_async_callback(link.aclose)
        capabilities = ctx.session.client_capabilities
        assert self._tasks is not None
        self._tasks.start_soon(self._hold, client, link, capabilities)
        return link

    async def _hold(self, client: _Client, link: _Link, capabilities: types.ClientCapabilities | None) -> None:
        assert self._connect is not None
        relay = _LinkRelay(self, client)
        try:
            async with self._connect(capabilities, relay.options()) as upstream, anyio.create_task_group() as tasks:
                if upstream.session.protocol_version in MODERN_PROTOCOL_VERSIONS:
                    # A server on the newest protocol tells of list changes on a listen stream only
                    # (open before the client's first request: no change can pass unheard); the
                    # stream also tells when the server goes away.
                    await tasks.start(self._follow_link, upstream, relay)
                link.client = upstream
                link.ready.set()
                await link.closing.wait()
                tasks.cancel_scope.cancel()
        except Exception as exc:
            link.error = _bounded(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
            if link.client is not None and not link.closing.is_set() and self._on_link_lost is not None:
                self._on_link_lost(exc)
            elif link.client is None:
                log.warning("could not open an upstream session for an MCP client: %s", link.error)
        finally:
            link.client = None
            link.ready.set()
            link.done.set()

    async def _follow_link(
        self,
        upstream: Client,
        relay: _LinkRelay,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        caps = upstream.server_capabilities
        async with listen(
            upstream.session,
            tools_list_changed=True,
            prompts_list_changed=bool(caps.prompts and caps.prompts.list_changed),
            resources_list_changed=bool(caps.resources and caps.resources.list_changed),
        ) as subscription:
            task_status.started()
            # Each event also reaches the session's message handler, which passes it on.
            async for _event in subscription:
                pass

    @contextlib.asynccontextmanager
    async def _serving(self, ctx: ServerRequestContext[Any]) -> AsyncIterator[_Client]:
        """Remember the client of `ctx` and its request while it runs, and route what the request
        asks of the upstream to the client's own upstream session when it has one."""
        client = self._remember(ctx)
        link = client.link
        if link is None and self._links(ctx):
            link = self._open_link(ctx, client)
        token = None
        if link is not None:
            await link.ready.wait()
            if link.client is None:
                raise MCPError(
                    types.INTERNAL_ERROR, f"the upstream session of this client is not available: {link.error}"
                )
            token = _routes.set({self.toolset: link.client})
        request_id = ctx.request_id
        if request_id is not None:
            client.inflight[request_id] = ctx
        try:
            yield client
        finally:
            if request_id is not None:
                client.inflight.pop(request_id, None)
            if token is not None:
                _routes.reset(token)

    async def _screen_params(self, ctx: ServerRequestContext[Any], call_next: Callable[..., Any]) -> Any:
        """Server middleware: params of a gated method that are not of the shape the method takes
        (arguments that are not an object, a name that is not a string) are refused with a short
        error and a `ToolDenied` event before the SDK validates them; any other validation failure
        is answered without echoing the input."""
        if ctx.method == "notifications/initialized":
            result = await call_next(ctx)
            await self._client_ready(ctx)
            return result
        problem = _params_problem(ctx.method, ctx.params) if ctx.request_id is not None else None
        if problem is not None:
            tool, message = problem
            crossing = CROSSING_TOOLS.get(tool)
            self.scope.refuse(tool, message, run=self._run_for(ctx), crossing=crossing)
            raise MCPError(types.INVALID_PARAMS, message)
        try:
            return await call_next(ctx)
        except pydantic.ValidationError as exc:
            where = sorted({".".join(str(part) for part in error["loc"]) or "params" for error in exc.errors()})
            shown = ", ".join(where[:5]) + (", …" if len(where) > 5 else "")
            raise MCPError(types.INVALID_PARAMS, _bounded(f"Invalid params: {shown}")) from None

    async def _client_ready(self, ctx: ServerRequestContext[Any]) -> None:
        """A client finished its handshake: open its own upstream session (declaring what it
        declared); or, sharing the proxy's, when it can give roots, tell the upstream its roots
        changed (a server that asked at its own start, before any client, asks again and gets
        this client's answer through the gate)."""
        client = self._remember(ctx)
        if client.link is None and self._links(ctx):
            self._open_link(ctx, client)
            return
        if client.link is not None or not client.can(_CLIENT_CAPABILITY["mcp.roots.list"]):
            return
        try:
            await self._upstream.send_notification(types.RootsListChangedNotification())
        except Exception:  # the upstream's own trouble shows on the next request
            log.debug("could not tell the upstream that the roots changed", exc_info=True)

    def _refuse_run(self) -> RunContext:
        """Whom a refusal that no client request carried is recorded for: the proxy's own run."""
        return self._run if isinstance(self._run, RunContext) else RunContext(principal="mcp-client")

    def _refuse_unread(self, tool: str, message: str, run: RunContext | None = None) -> None:
        """Record a request refused before it could be read as one (one `ToolDenied`, decided by
        validation, with the size and depth the message states and no arguments)."""
        self.scope.refuse(tool, message, run=run if run is not None else self._refuse_run())

    def _run_for(self, ctx: ServerRequestContext[Any]) -> RunContext:
        return self._run if isinstance(self._run, RunContext) else self._run(ctx)

    def _target(self, crossing: str) -> ServerRequestContext[Any] | None:
        """The client request a server request is put to: of the clients that declared the
        capability, the one with a request in flight (most recently active first), else the most
        recently active one. Only clients sharing the proxy's upstream session are candidates:
        the others have their own, and its requests go to them alone."""
        capability = _CLIENT_CAPABILITY[crossing]
        able = [client for client in reversed(self._clients.values()) if client.link is None and client.can(capability)]
        for client in able:
            if client.inflight:
                return next(reversed(client.inflight.values()))
        return able[0].last if able else None

    async def ask_client(
        self, crossing: str, args: dict[str, Any], result_type: type[_R], owner: _Client | None = None
    ) -> _R | types.ErrorData:
        """Put a server request (`crossing`: one of the `mcp.sampling.createMessage`,
        `mcp.elicitation.create`, `mcp.roots.list` tools) through the gate to a client: `owner`,
        the client whose own upstream session it came on (on the stream of its request in flight,
        most recent first, when it has one), else one sharing the proxy's (see `_target`). The
        client's result (a substitute is validated as `result_type`), or the `ErrorData` the
        upstream is answered with."""
        if owner is None:
            target = self._target(crossing)
        elif owner.can(_CLIENT_CAPABILITY[crossing]):
            target = next(reversed(owner.inflight.values())) if owner.inflight else owner.last
        else:
            target = None
        if target is None:
            # No client to ask: recorded like any other refusal, so the audit shows the attempt.
            who = "this client did not" if owner is not None else "no connected client"
            message = f"{who} declared the {CROSSING_TOOLS[crossing]} capability"
            run = self._run_for(owner.last) if owner is not None else self._refuse_run()
            self.scope.refuse(crossing, message, run=run, crossing=CROSSING_TOOLS[crossing])
            return types.ErrorData(code=types.INVALID_REQUEST, message=message)
        failures: list[MCPError] = []
        token_d = _downstream.set(target)
        token_f = _upstream_failure.set(failures)
        try:
            result = await self.scope.call(crossing, args, run=self._run_for(target))
        except (ToolBlockedError, ToolApprovalRequiredError) as exc:
            return types.ErrorData(code=DENIED, message=_bounded(str(exc)))
        finally:
            _downstream.reset(token_d)
            _upstream_failure.reset(token_f)
        if failures:
            return failures[0].error
        match result.kind:
            case "ok" | "substituted":
                value = result.value
                if isinstance(value, result_type):
                    return value
                try:
                    return result_type.model_validate(value, by_name=False)
                except pydantic.ValidationError:
                    return types.ErrorData(
                        code=types.INTERNAL_ERROR, message="the gate's answer is not a client result"
                    )
            case "denied":
                return types.ErrorData(code=DENIED, message=_bounded(result.to_model_text()))
            case "error":
                return types.ErrorData(code=types.INTERNAL_ERROR, message=_bounded(result.to_model_text()))
        raise AssertionError(f"unknown result kind {result.kind!r}")  # pragma: no cover

    async def notify_clients(self, message: object) -> None:
        """Pass a notification of the proxy's own upstream session on to the clients sharing it:
        list changes and log messages to every one, a resource update to those subscribed to its
        URI. Others are dropped (progress rides its own request; tools list changes go through
        the toolset's refresh). Clients with their own upstream session hear it on that one."""
        shared = [c for c in self._clients.values() if c.link is None]
        if isinstance(message, types.ResourceUpdatedNotification):
            clients = [c for c in shared if message.params.uri in c.subscriptions]
        elif isinstance(message, types.ResourceListChangedNotification | types.PromptListChangedNotification):
            # (Clients of the newest protocol hear list changes on their listen streams.)
            clients = [c for c in shared if c.last.protocol_version not in MODERN_PROTOCOL_VERSIONS]
        elif isinstance(
            message,
            types.LoggingMessageNotification,
        ):
            clients = shared
        else:
            return
        for client in clients:
            try:
                await client.last.session.send_notification(message)
            except Exception:  # a client that went away must not stop the others hearing of it
                log.debug("could not pass a notification on to an MCP client", exc_info=True)

    async def follow_lists(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Pass the upstream's resources and prompts list changes on, until cancelled: on the
        newest protocol the proxy's own session hears them on a listen stream, published here to
        the clients' listen streams.
        On an older protocol they arrive as notifications (`McpRelay`); this returns at once.
        Tools list changes are `McpToolset.follow`'s."""
        session = self.toolset.session
        raw = session.session if isinstance(session, Client) else session
        caps = self._upstream_caps
        prompts = caps.prompts is not None and bool(caps.prompts.list_changed)
        resources = caps.resources is not None and bool(caps.resources.list_changed)
        if raw.protocol_version not in MODERN_PROTOCOL_VERSIONS or not (prompts or resources):
            task_status.started()
            return
        async with listen(raw, prompts_list_changed=prompts, resources_list_changed=resources) as subscription:
            task_status.started()
            # (Each event also reaches the session's message handler, `McpRelay`, which tells the
            # clients of older protocols.)
            async for event in subscription:
                if isinstance(event, PromptsListChanged | ResourcesListChanged):
                    await self._bus.publish(event)

    async def reopened(self) -> None:
        """After the toolset was bound to a new session with the upstream (the old one was lost):
        every client's own upstream session (a session with the server as it was) is closed, so
        each client's next request opens a new one, and every client that hears list changes is
        told that the tools, resources and prompts lists changed."""
        for client in self._clients.values():
            if client.link is not None:
                client.link.closing.set()
                client.link = None
        caps = self._upstream_caps
        changes: list[Any] = [ToolsListChanged()]
        notes: list[Any] = []
        if caps.resources is not None and caps.resources.list_changed:
            changes.append(ResourcesListChanged())
            notes.append(types.ResourceListChangedNotification())
        if caps.prompts is not None and caps.prompts.list_changed:
            changes.append(PromptsListChanged())
            notes.append(types.PromptListChangedNotification())
        for change in changes:
            await self._bus.publish(change)
        for client in list(self._clients.values()):
            if client.last.protocol_version in MODERN_PROTOCOL_VERSIONS:
                continue  # (heard on its listen stream)
            try:
                await client.last.session.send_tool_list_changed()
                for note in notes:
                    await client.last.session.send_notification(note)
            except Exception:  # a client that went away must not stop the others hearing of it
                log.debug("could not notify an MCP client of list changes", exc_info=True)

    async def _announce(self, _new: list[Tool[Any, Any]]) -> None:
        await self._bus.publish(ToolsListChanged())
        for client in list(self._clients.values()):
            if client.last.protocol_version in MODERN_PROTOCOL_VERSIONS or client.link is not None:
                # (A client with its own upstream session hears that session's own notification.)
                continue
            try:
                await client.last.session.send_tool_list_changed()
            except Exception:  # a client that went away must not stop the others hearing of it
                log.debug("could not notify an MCP client of a tools list change", exc_info=True)

    # -- relayed as they are ------------------------------------------------------------------------

    @property
    def _upstream(self) -> ClientSession:
        session = self.toolset.current()
        return session.session if isinstance(session, Client) else session

    async def _relay(self, ctx: ServerRequestContext[Any], request: Any, result_type: Any) -> Any:
        async with self._serving(ctx):
            return await self._upstream.send_request(request, result_type, progress_callback=_progress_relay(ctx))

    async def _list_resources(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        result: types.ListResourcesResult = await self._relay(
            ctx, types.ListResourcesRequest(params=params), types.ListResourcesResult
        )
        return result

    async def _list_resource_templates(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        result: types.ListResourceTemplatesResult = await self._relay(
            ctx, types.ListResourceTemplatesRequest(params=params), types.ListResourceTemplatesResult
        )
        return result

    async def _list_prompts(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListPromptsResult:
        result: types.ListPromptsResult = await self._relay(
            ctx, types.ListPromptsRequest(params=params), types.ListPromptsResult
        )
        return result

    async def _complete(
        self, ctx: ServerRequestContext[Any], params: types.CompleteRequestParams
    ) -> types.CompleteResult:
        result: types.CompleteResult = await self._relay(
            ctx, types.CompleteRequest(params=params), types.CompleteResult
        )
        return result

    async def _set_level(
        self, ctx: ServerRequestContext[Any], params: types.SetLevelRequestParams
    ) -> types.EmptyResult:
        # Per client when it has its own upstream session; else the last level asked for holds for
        # every client sharing the proxy's.
        result: types.EmptyResult = await self._relay(ctx, types.SetLevelRequest(params=params), types.EmptyResult)
        return result

    async def _subscribe(
        self, ctx: ServerRequestContext[Any], params: types.SubscribeRequestParams
    ) -> types.EmptyResult:
        async with self._serving(ctx) as client:
            result: types.EmptyResult = await self._upstream.send_request(
                types.SubscribeRequest(params=params), types.EmptyResult
            )
            client.subscriptions.add(params.uri)
            return result

    async def _unsubscribe(
        self, ctx: ServerRequestContext[Any], params: types.UnsubscribeRequestParams
    ) -> types.EmptyResult:
        async with self._serving(ctx) as client:
            client.subscriptions.discard(params.uri)
            # Another client sharing the upstream session may still want the updates of this URI:
            # the upstream keeps sending them.
            if client.link is None and any(
                params.uri in other.subscriptions for other in self._clients.values() if other.link is None
            ):
                return types.EmptyResult()
            result: types.EmptyResult = await self._upstream.send_request(
                types.UnsubscribeRequest(params=params), types.EmptyResult
            )
            return result

    # -- decided by the gate ------------------------------------------------------------------------

    async def _gated(self, ctx: ServerRequestContext[Any], crossing: str, args: dict[str, Any]) -> Any:
        """Put a client request through the gate as the crossing tool `crossing`; the upstream's
        result, or an `MCPError` (the gate's denial, or the upstream's own error)."""
        failures: list[MCPError] = []
        async with self._serving(ctx):
            token_d = _downstream.set(ctx)
            token_f = _upstream_failure.set(failures)
            try:
                result = await self.scope.call(crossing, args, run=self._run_for(ctx))
            except (ToolBlockedError, ToolApprovalRequiredError) as exc:
                raise MCPError(types.INTERNAL_ERROR, _bounded(str(exc))) from exc
            finally:
                _downstream.reset(token_d)
                _upstream_failure.reset(token_f)
        if failures:
            raise failures[0]
        match result.kind:
            case "ok" | "substituted":
                return result.value
            case "denied":
                raise MCPError(DENIED, _bounded(result.to_model_text()))
            case "error":
                raise MCPError(types.INTERNAL_ERROR, _bounded(result.to_model_text()))
        raise AssertionError(f"unknown result kind {result.kind!r}")  # pragma: no cover

    async def _read_resource(
        self, ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        value = await self._gated(ctx, "mcp.resources.read", {"uri": params.uri})
        return _read_result(params.uri, value)

    async def _get_prompt(
        self, ctx: ServerRequestContext[Any], params: types.GetPromptRequestParams
    ) -> types.GetPromptResult:
        args: dict[str, Any] = {"name": params.name}
        if params.arguments is not None:
            args["arguments"] = dict(params.arguments)
        value = await self._gated(ctx, "mcp.prompts.get", args)
        return _prompt_result(value)

    async def _list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        async with self._serving(ctx) as client:
            page: types.ListToolsResult = await self._upstream.send_request(
                types.ListToolsRequest(params=params), types.ListToolsResult
            )
            if any(self.toolset.tool_name(d.name) not in self.scope.tools for d in page.tools):
                await self._refresh_for_unknown(client)
        # Only the tools some path of the chain can allow for this client's run; calls of the
        # others are still mediated (and refused) if a client asks for them by name.
        shown = set(self.scope.shown_tools(self._run_for(ctx)))
        tools = []
        for definition in page.tools:
            name = self.toolset.tool_name(definition.name)
            if name in shown and name not in CROSSING_TOOLS:
                tools.append(definition.model_copy(update={"name": name}))
        return page.model_copy(update={"tools": tools})

    def _refusal(self, name: str, args: dict[str, Any]) -> str | None:
        """Why a call is refused before the gate (sizes only, never the input), or None."""
        if len(name) > self.max_name_chars:
            return f"tool name of {len(name)} characters refused: this proxy accepts at most {self.max_name_chars}"
        if len(args) and (size := len(pydantic_core.to_json(args))) > self.max_args_bytes:
            return f"arguments of {size} bytes refused: this proxy accepts at most {self.max_args_bytes}"
        return None

    async def _refresh_for_unknown(self, client: _Client) -> None:
        """List the upstream again for a name the proxy does not know (through the client's own
        upstream session, which lists what the server shows this client), at most once per
        `refresh_interval_s` per upstream session; callers arriving during a listing wait for it
        instead of starting one."""
        refresh = client.refresh if client.link is not None else self._shared_refresh
        if refresh.running is not None:
            await refresh.running.wait()
            return
        if time.monotonic() < refresh.next:
            return
        refresh.running = done = anyio.Event()
        try:
            await self.toolset.refresh()
        except Exception:
            # The call is then answered as unknown; the upstream's failure is not the client's to read.
            log.warning("listing the upstream's tools again failed", exc_info=True)
        finally:
            refresh.next = time.monotonic() + self.refresh_interval_s
            refresh.running = None
            done.set()

    async def _call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        async with self._serving(ctx) as client:
            run = self._run_for(ctx)
            args = dict(params.arguments or {})
            refusal = self._refusal(params.name, args)
            if refusal is not None:
                name = params.name
                shown = name if len(name) <= _SHOWN_NAME_CHARS else name[:_SHOWN_NAME_CHARS] + "…"
                self.scope.refuse(shown, refusal, run=run)
                raise MCPError(types.INVALID_PARAMS, refusal)
            if params.name in CROSSING_TOOLS:
                # The gate tools of other crossings are not tools of the upstream's.
                self.scope.refuse(params.name, f"unknown tool {params.name}", run=run)
                raise MCPError(types.INVALID_PARAMS, f"Unknown tool: {params.name}")
            if params.name not in self.scope.tools:
                await self._refresh_for_unknown(client)
            token = _downstream.set(ctx)
            try:
                result = await self.scope.call(params.name, args, run=run)
            except (ToolBlockedError, ToolApprovalRequiredError) as exc:
                # A block stops the caller's run: a protocol error, not a result a model would read on.
                raise MCPError(types.INTERNAL_ERROR, str(exc)) from exc
            finally:
                _downstream.reset(token)
        definition = self.toolset.definition(params.name)
        return result_from_gate(result, definition.output_schema if definition is not None else None)


def client_of(ctx: ServerRequestContext[Any]) -> object | None:
    """Who sent this request over streamable HTTP, as `serve_http(authenticate=...)` said (None
    over stdio or without authentication)."""
    request = ctx.request
    scope = getattr(request, "scope", None)
    return scope.get("callgate.client") if isinstance(scope, dict) else None


_METADATA_PATH = "/.well-known/oauth-protected-resource"


class _BearerAuth:
    """ASGI middleware: every HTTP request needs `Authorization: Bearer <token>` that
    `authenticate` accepts; others are answered 401 and never reach the MCP app."""

    def __init__(
        self,
        app: Any,
        authenticate: Callable[[str | None], object | None],
        metadata: dict[str, Any] | None = None,
    ) -> None:
        self.app = app
        self.authenticate = authenticate
        self.metadata = json.dumps(metadata).encode() if metadata is not None else None
        self.challenge = b'Bearer realm="callgate"'
        if metadata is not None:
            where = str(metadata["resource"]).split("://", 1)
            origin = where[0] + "://" + where[1].split("/", 1)[0] if len(where) == 2 else ""
            self.challenge += f', resource_metadata="{origin}{_METADATA_PATH}"'.encode()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.metadata is not None and scope.get("path") in (_METADATA_PATH, _METADATA_PATH + "/mcp"):
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(self.metadata)).encode())]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": self.metadata})
            return
        token = None
        for key, value in scope.get("headers", ()):
            if key == b"authorization":
                scheme, _, credentials = value.decode("latin-1").partition(" ")
                if scheme.lower() == "bearer":
                    token = credentials.strip()
                break
        client = self.authenticate(token)
        if client is None:
            body = b'{"error":"unauthorized","error_description":"a valid bearer token is required"}'
            await send(
                {
                    "type": "http.response.start",
                    "status": 401,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                        (b"www-authenticate", self.challenge),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        await self.app({**scope, "callgate.client": client}, receive, send)


_DISCOVER = "server/discover"


def _handshake_only_error(request_id: Any) -> types.JSONRPCError:
    """The answer to `server/discover` from a proxy whose upstream speaks a handshake-era protocol:
    -32022 naming the handshake versions, on which a client falls back to `initialize` (a
    discovery the SDK's server answered itself would lock the connection to the newest era)."""
    data = types.UnsupportedProtocolVersionErrorData(
        supported=list(HANDSHAKE_PROTOCOL_VERSIONS), requested=LATEST_MODERN_VERSION
    )
    return types.JSONRPCError(
        jsonrpc="2.0",
        id=request_id,
        error=types.ErrorData(
            code=types.UNSUPPORTED_PROTOCOL_VERSION,
            message="this server speaks the initialize handshake",
            data=data.model_dump(mode="json"),
        ),
    )


class _HttpScreen:
    """ASGI middleware in front of the MCP app: every POST body is read whole (up to
    `max_bytes`) and refused here, with the JSON-RPC error the specification prescribes, a bounded
    message that never repeats the input and one `ToolDenied` event (via `refused`), when it is
    too large, not JSON, nested past the parser, not a JSON-RPC message or carries an id of no
    legal type. With `handshake_only`, `server/discover` gets `_handshake_only_error`."""

    def __init__(
        self,
        app: Any,
        refused: Callable[[str, str, RunContext | None], object],
        *,
        max_bytes: int,
        handshake_only: bool,
    ) -> None:
        self.app = app
        self.refused = refused
        self.max_bytes = max_bytes
        self.handshake_only = handshake_only

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        client = scope.get("callgate.client")
        run = getattr(client, "run", None)
        run = run if isinstance(run, RunContext) else None
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                await self.app(scope, _replay([], receive, message), send)
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                declared = dict(scope.get("headers", ())).get(b"content-length", b"")
                total = int(declared) if declared.isdigit() else size
                why = f"Invalid request: longer than {self.max_bytes} bytes"
                self.refused(_UNREADABLE, f"request of {total} bytes refused: at most {self.max_bytes} bytes", run)
                await _json_error(send, 413, _error_line(types.INVALID_REQUEST, why))
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        answer = _screen_body(body, self.handshake_only)
        if answer is None:
            await self.app(scope, _replay([body], receive), send)
            return
        status, error, record = answer
        if record:
            self.refused(*_refusal_record(body, error), run)
        await _json_error(send, status, error)


async def _json_error(send: Any, status: int, error: SessionMessage) -> None:
    body = error.message.model_dump_json(by_alias=True, exclude_unset=True).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _screen_body(body: bytes, handshake_only: bool) -> tuple[int, SessionMessage, bool] | None:
    """The answer to an HTTP body the MCP app must not see (status, error, whether it is a
    refusal to record), or None to pass it on."""
    try:
        parsed = json.loads(body)
    except RecursionError:
        return 400, _error_line(types.INVALID_REQUEST, "Invalid request: nested too deep"), True
    except ValueError:
        return 400, _error_line(types.PARSE_ERROR, "Parse error: not JSON"), True
    if not isinstance(parsed, dict):
        return 400, _error_line(types.INVALID_REQUEST, "Invalid request: not a JSON-RPC 2.0 message"), True
    request_id = parsed.get("id")
    if "id" in parsed and (isinstance(request_id, bool) or not isinstance(request_id, str | int)):
        return 400, _error_line(types.INVALID_REQUEST, _BAD_ID), True
    answered = "result" in parsed or "error" in parsed
    if parsed.get("jsonrpc") != "2.0" or (not answered and not isinstance(parsed.get("method"), str)):
        not_jsonrpc = "Invalid request: not a JSON-RPC 2.0 message"
        return 400, _error_line(types.INVALID_REQUEST, not_jsonrpc, request_id), True
    if handshake_only and parsed.get("method") == _DISCOVER and request_id is not None:
        return 200, SessionMessage(_handshake_only_error(request_id)), False
    return None


def _replay(bodies: list[bytes], receive: Any, first: dict[str, Any] | None = None) -> Callable[[], Any]:
    """An ASGI `receive` that hands out `first` or `bodies` (already read), then defers to `receive`."""
    pending = (
        [first] if first is not None else [{"type": "http.request", "body": b, "more_body": False} for b in bodies]
    )

    async def replayed() -> Any:
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed


# -- stdio ----------------------------------------------------------------------------------------

_EOF = object()


class _TooLong:
    """A line over the limit, skipped: only its size is known."""

    __slots__ = ("size",)

    def __init__(self, size: int) -> None:
        self.size = size


_STOP = object()

_LONG_LIVED = frozenset({"subscriptions/listen"})
"""Requests that stay open for the life of the connection: stopping does not wait for them."""


class _Unanswered:
    """The requests of one stdio connection that wait for their response (ids as the client sent
    them). Used from the transport's tasks on one event loop."""

    __slots__ = ("_changed", "ids")

    def __init__(self) -> None:
        self.ids: set[Any] = set()
        self._changed = anyio.Event()

    def settle(self, request_id: Any) -> None:
        self.ids.discard(request_id)
        self._changed.set()

    async def wait_all(self) -> None:
        """Return once no request waits for its response."""
        while self.ids:
            changed = self._changed = anyio.Event()
            await changed.wait()


def _error_line(code: int, message: str, request_id: Any = None) -> SessionMessage:
    return SessionMessage(
        types.JSONRPCError(jsonrpc="2.0", id=request_id, error=types.ErrorData(code=code, message=message))
    )


def _answer_unreadable(line: bytes, exc: pydantic.ValidationError) -> SessionMessage:
    """The error response to a line that is not a JSON-RPC message (the input is never echoed)."""
    errors = exc.errors(include_input=False, include_url=False)
    parse = next((e for e in errors if e["type"] == "json_invalid"), None)
    request_id: Any = None
    try:
        # Python's parser reads deeper than pydantic-core's (200 levels), so the id of a request
        # refused only for its nesting can usually be named.
        parsed = json.loads(line)
    except RecursionError:
        # JSON, but nested past what any parser here reads: no id can be named.
        return _error_line(types.INVALID_REQUEST, "Invalid request: nested too deep")
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("id"), str | int) and not isinstance(parsed["id"], bool):
        request_id = parsed["id"]
    if parse is not None and parsed is None:
        why = (parse.get("ctx") or {}).get("error", "not JSON")
        return _error_line(types.PARSE_ERROR, f"Parse error: {why}")
    if parse is not None:
        why = (parse.get("ctx") or {}).get("error", "")
        return _error_line(types.INVALID_REQUEST, f"Invalid request: {why}", request_id)
    return _error_line(types.INVALID_REQUEST, "Invalid request: not a JSON-RPC 2.0 message", request_id)


_UNREADABLE = "unreadable-request"
"""The events' `tool` for a refused request whose method cannot be read."""

_BAD_ID = "Invalid request: id must be a string or an integer"


def _has_id(line: bytes) -> bool:
    """Whether a line that validated as a notification carries an `id` member after all."""
    if b'"id"' not in line:
        return False
    try:
        parsed = json.loads(line)
    except (ValueError, RecursionError):
        return False
    return isinstance(parsed, dict) and "id" in parsed


def nesting_depth(data: bytes) -> int:
    """How deep the arrays and objects of JSON text nest (brackets inside strings not counted);
    for text that is not JSON, the depth its brackets reach."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in data:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):  # ] }
            depth -= 1
    return deepest


def _refusal_record(line: bytes, answer: SessionMessage) -> tuple[str, str]:
    """What the audit keeps of a refused line: the tool (or method) it named, if readable, and
    the answer with the line's size and nesting depth; never its content."""
    tool = _UNREADABLE
    try:
        parsed = json.loads(line)
    except (ValueError, RecursionError):
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("method"), str):
        params = parsed.get("params")
        named = params.get("name") if isinstance(params, dict) and parsed["method"] == "tools/call" else None
        tool = named if isinstance(named, str) else parsed["method"]
        tool = tool if len(tool) <= _SHOWN_NAME_CHARS else tool[:_SHOWN_NAME_CHARS] + "…"
    error = answer.message
    said = error.error.message if isinstance(error, types.JSONRPCError) else "refused"
    return tool, f"{said} ({len(line)} bytes, nested {nesting_depth(line)} levels)"


def _read_lines(fd: int, max_line_bytes: int, deliver: Callable[[object], bool]) -> None:
    """A daemon thread's loop: each line of `fd` (bytes), `_TooLong` for a line over the limit
    (skipped to its end), then `_EOF`; stops when `deliver` returns False (nobody listens)."""
    with os.fdopen(fd, "rb", closefd=False) as stream:
        while True:
            line = stream.readline(max_line_bytes + 1)
            if not line:
                deliver(_EOF)
                return
            if len(line) > max_line_bytes:
                size = len(line)
                while line and not line.endswith(b"\n"):
                    line = stream.readline(65536)
                    size += len(line)
                if not deliver(_TooLong(size)):
                    return
                continue
            if not deliver(line):
                return


def _settled_by(unanswered: _Unanswered, request_id: Any) -> ServerMessageMetadata:
    """Metadata that takes a request off `unanswered` when the server settles it without a
    response (the client cancelled it)."""

    async def settled() -> None:
        unanswered.settle(request_id)

    return ServerMessageMetadata(on_request_unanswered=settled)


@contextlib.asynccontextmanager
async def _stdio_transport(
    max_line_bytes: int,
    stop: anyio.Event | None,
    grace_s: float,
    draining: Callable[[int], object] | None,
    handshake_only: bool = False,
    refused: Callable[[str, str], object] | None = None,
) -> AsyncIterator[tuple[Any, Any]]:
    """MCP over fds 0 and 1, read and written by daemon threads of its own: a read blocked on
    stdin never holds up the process's exit (the SDK's transport reads in a worker thread that a
    stop must wait for). Lines that are not messages are answered here (see `serve_stdio`).

    At the end of stdin or when `stop` is set, no further line reaches the server; the read side
    stays open until every request forwarded has its response written (or `grace_s` is over),
    because the SDK's dispatcher cancels the handlers in flight when its read side ends."""
    wire_in, wire_out = os.dup(0), os.dup(1)
    quiet = os.open(os.devnull, os.O_RDONLY)
    os.dup2(quiet, 0)
    os.close(quiet)
    os.dup2(2, 1)
    token = anyio.lowlevel.current_token()
    lines_in, lines = anyio.create_memory_object_stream[object](0)
    read_writer, read_stream = create_context_streams[SessionMessage | Exception](0)
    write_stream, write_reader = create_context_streams[SessionMessage](0)
    outgoing: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
    drained = threading.Event()

    def deliver(item: object) -> bool:
        try:
            anyio.from_thread.run(lines_in.send, item, token=token)
        except Exception:  # the loop is gone or the transport closed: nobody listens any more
            return False
        return True

    def write_lines() -> None:
        with os.fdopen(wire_out, "wb", closefd=False) as stream:
            while (data := outgoing.get()) is not None:
                try:
                    stream.write(data)
                    stream.flush()
                except OSError:
                    break  # the client closed its end; what it would have read is lost with it
        drained.set()

    unanswered = _Unanswered()

    async def route_lines() -> None:
        async with read_writer, lines:
            async for item in lines:
                if item is _EOF or item is _STOP:
                    break
                if isinstance(item, _TooLong):
                    too_long = f"Invalid request: longer than {max_line_bytes} bytes"
                    await write_stream.send(_error_line(types.INVALID_REQUEST, too_long))
                    if refused is not None:
                        refused(_UNREADABLE, f"request of {item.size} bytes refused: at most {max_line_bytes} bytes")
                    continue
                if not isinstance(item, bytes) or not item.strip():
                    continue
                try:
                    message = types.jsonrpc_message_adapter.validate_json(item, by_name=False)
                except pydantic.ValidationError as exc:
                    answer = _answer_unreadable(item, exc)
                    await write_stream.send(answer)
                    if refused is not None:
                        refused(*_refusal_record(item, answer))
                    continue
                if isinstance(message, types.JSONRPCNotification) and _has_id(item):
                    # A request whose id is of no legal type validates as a notification: answered
                    # here, or it would get no answer at all.
                    answer = _error_line(types.INVALID_REQUEST, _BAD_ID)
                    await write_stream.send(answer)
                    if refused is not None:
                        refused(*_refusal_record(item, answer))
                    continue
                if handshake_only and isinstance(message, types.JSONRPCRequest) and message.method == _DISCOVER:
                    await write_stream.send(SessionMessage(_handshake_only_error(message.id)))
                    continue
                if isinstance(message, types.JSONRPCRequest) and message.method not in _LONG_LIVED:
                    unanswered.ids.add(message.id)
                    await read_writer.send(SessionMessage(message, metadata=_settled_by(unanswered, message.id)))
                else:
                    await read_writer.send(SessionMessage(message))
            # Stopped: nothing more is read; the requests in flight finish before the read side ends.
            if unanswered.ids and draining is not None:
                draining(len(unanswered.ids))
            with anyio.move_on_after(grace_s):
                await unanswered.wait_all()

    async def send_lines() -> None:
        async with write_reader:
            async for message in write_reader:
                sent = message.message
                text = sent.model_dump_json(by_alias=True, exclude_unset=True)
                outgoing.put((text + "\n").encode())
                if isinstance(sent, types.JSONRPCResponse | types.JSONRPCError) and sent.id in unanswered.ids:
                    unanswered.settle(sent.id)

    async def stop_reading(stop: anyio.Event) -> None:
        await stop.wait()
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            await lines_in.send(_STOP)

    threading.Thread(target=_read_lines, args=(wire_in, max_line_bytes, deliver), daemon=True).start()
    threading.Thread(target=write_lines, daemon=True).start()
    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(route_lines)
            tasks.start_soon(send_lines)
            if stop is not None:
                tasks.start_soon(stop_reading, stop)
            try:
                yield read_stream, write_stream
            finally:
                tasks.cancel_scope.cancel()
    finally:
        lines_in.close()
        outgoing.put(None)
        # What the server answered last reaches the client before the process goes on to exit.
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(drained.wait, 5.0, abandon_on_cancel=True)
        # The wire fds stay open: the reader thread may still be blocked on its own; closing
        # one under it could hand the number to another file.
        os.dup2(wire_in, 0)
        os.dup2(wire_out, 1)
