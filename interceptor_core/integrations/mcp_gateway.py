"""One gated MCP server in front of one or several upstream MCP servers (`callgate mcp-proxy`).

`McpGateway` serves the tools, resources and prompts of its upstreams as one MCP server. Built with
`prefixed=False` it serves exactly one upstream as that upstream's own `McpProxy` does (its names,
`serverInfo`, instructions, capabilities, cursors and protocol era: the single form, `mcp-proxy --
COMMAND`). Otherwise (`mcp-proxy --config`):

- Tool names are `<server>__<tool>` (`SEPARATOR`): both parts stay within the characters the MCP
  specification allows in tool names (letters, digits, `_`, `-`, `.`), and a server name may not
  hold `__`, so the first `__` of a name always says which server it goes to.
- Prompt names are prefixed the same way. Resource URIs are kept as they are and routed to the
  server that listed them (a URI no server listed is refused; one listed by two servers goes to
  the first in the configuration).
- Each server is served by an `McpProxy` of its own (the single-server form's code), in an agent
  scope named after the server, so a policy can target a server with `scope.agent`: its tool
  calls, reads, gets, completions, subscriptions and setLevel go through it, and each client
  connection gets its own session with each server, declaring what the client declared (so the
  server's sampling, elicitation and roots requests, log messages, resource updates and list
  changes reach that client alone, through the gate in the server's scope).
- Lists are answered page by page: each page is one server's own, and the gateway's cursor names
  the server and that server's cursor; a cursor the gateway did not give is invalid params.
- The gateway's instructions say which server is what (its `serverInfo`) and carry each server's
  own instructions.
- The gateway speaks the newest protocol to clients that do when every serving server does (its
  clients then share the gateway's own session with each server, and hear list changes on their
  listen streams); else the initialize handshake, as the single form does for such a server.
- A server that fails to start or stops serving is marked down: calls of its tools answer a tool
  error naming the server and its trouble, with one `ToolDenied` event in its scope; the other
  servers keep serving. `on_down` hears of it; whoever serves the gateway may bring the server
  back (`callgate mcp-proxy` does for a server reached over HTTP): bind its toolset to a new
  session, call its proxy's `reopened()`, and clear `down`.
- Over HTTP, a client's own session with a server that fails (the server ended it, or its
  connection broke) is that client's trouble alone: its request is answered with an error saying
  so (a call leaves its outcome event, or a `ToolDenied` when the gate never saw it), `on_link_lost`
  hears of it, and its next request opens a new session; the other clients are not touched. Over
  stdio the one client's session is the server's, and its loss marks the server down.
"""

from __future__ import annotations

import base64
import contextvars
import functools
import json
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import mcp_types as types
import pydantic
import pydantic_core
from mcp import Client
from mcp.server import Server
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import NotificationOptions
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from interceptor_core.context import RunContext
from interceptor_core.exceptions import ConfigurationError
from interceptor_core.gate import AgentScope
from interceptor_core.integrations.mcp import (
    CROSSING_TOOLS,
    DENIED,
    MAX_ARGS_BYTES,
    MAX_NAME_CHARS,
    McpProxy,
    McpRelay,
    McpToolset,
    UpstreamConnect,
    _bounded,
    _GatedServer,
    _params_problem,
    _ProxyServer,
)

log = logging.getLogger("callgate.integrations.mcp_gateway")

__all__ = ["SEPARATOR", "SERVER_NAME", "McpGateway", "Member"]

SEPARATOR = "__"
"""Between a server's name and its tool's (or prompt's) name."""

SERVER_NAME = re.compile(r"[A-Za-z0-9]+(?:[-_][A-Za-z0-9]+)*")
"""What a server name may be: letters and digits, single `-` or `_` between them (never `__`)."""

MAX_SERVER_NAME_CHARS = 32
"""The longest server name (it prefixes every tool name, which the specification bounds at 128)."""

_SHOWN_NAME_CHARS = 64

_request_run: contextvars.ContextVar[RunContext | None] = contextvars.ContextVar("callgate_gateway_run", default=None)

_PING_TIMEOUT_S = 5.0
"""How long a server has to answer the ping that follows a failed call before it is left up."""


@dataclass
class Member:
    """One upstream server as the gateway holds it: its toolset (tool names prefixed), its agent
    scope, and `down` (why it does not serve, or None while it does)."""

    name: str
    toolset: McpToolset
    scope: AgentScope | None = None
    down: str | None = None
    capabilities: types.ServerCapabilities = field(default_factory=types.ServerCapabilities)
    relay: McpRelay | None = None
    """The callbacks of the gateway's own session with the server (bound to `proxy`)."""
    connect: UpstreamConnect | None = None
    """How a client connection gets its own session with the server."""
    proxy: McpProxy | None = None
    """What serves the server's crossings (built by the gateway for a server that started)."""

    @property
    def prefix(self) -> str:
        return self.name + SEPARATOR

    def upstream(self) -> Any:
        session = self.toolset.session
        return session.session if isinstance(session, Client) else session


def _cut(name: str) -> str:
    return name if len(name) <= _SHOWN_NAME_CHARS else name[:_SHOWN_NAME_CHARS] + "…"


class McpGateway(_GatedServer):
    """A gated MCP server over one or several upstreams (see the module's description).

    `members` are the upstreams in configuration order, each started already (`scope` set) or
    down; `scope` is the gateway's own agent scope, where refusals that name no server (an unknown
    prefix, an unreadable request) are recorded. Calls carry `run` (a `RunContext`, or a function
    of the request context returning one). `on_down(member)` hears of a server marked down;
    `on_link_lost(member, exc)` of a client's own session with a server that ended while the
    client was connected. With `prefixed=False` the one member (started, its scope the gateway's
    `scope`) is served as it is; `ConfigurationError` for any other number of members or for one
    that is down. Serve with `serve_stdio` or `serve_http`."""

    def __init__(
        self,
        members: Sequence[Member],
        scope: AgentScope,
        *,
        name: str = "callgate-mcp-gateway",
        run: RunContext | Callable[[ServerRequestContext[Any]], RunContext] | None = None,
        max_name_chars: int = MAX_NAME_CHARS,
        max_args_bytes: int = MAX_ARGS_BYTES,
        refresh_interval_s: float = 1.0,
        on_down: Callable[[Member], object] | None = None,
        on_link_lost: Callable[[Member, BaseException], object] | None = None,
        prefixed: bool = True,
    ) -> None:
        if not prefixed and (len(members) != 1 or members[0].down is not None or members[0].scope is None):
            raise ConfigurationError("a gateway without prefixes serves exactly one server, started already")
        self.on_down = on_down
        self.on_link_lost = on_link_lost
        self.members = {member.name: member for member in members}
        self.scope = scope
        self.run = run if isinstance(run, RunContext) else RunContext(principal="mcp-client")
        self._run_of = run if run is not None and not isinstance(run, RunContext) else None
        self.max_name_chars = max_name_chars
        self.max_args_bytes = max_args_bytes
        self.refresh_interval_s = refresh_interval_s
        self._resource_owner: dict[str, str] = {}
        self._template_owner: dict[str, str] = {}
        # The listen streams of clients of the newest protocol: every server's proxy publishes here.
        bus = InMemorySubscriptionBus()
        for member in members:
            if member.down is None and member.scope is not None:
                member.proxy = McpProxy(
                    member.toolset,
                    member.scope,
                    name=name,
                    run=run if run is not None else self.run,
                    max_name_chars=max_name_chars,
                    max_args_bytes=max_args_bytes,
                    refresh_interval_s=refresh_interval_s,
                    relay=member.relay,
                    connect=member.connect,
                    on_link_lost=functools.partial(self._link_ended, member),
                    bus=bus,
                )
        self._sole = members[0].proxy if not prefixed else None
        if self._sole is not None:
            # The single form: the server's own proxy answers everything, as the server would.
            self.server: Server[Any] = self._sole.server
            self._legacy = self._sole._legacy
            return
        serving = [m for m in members if m.proxy is not None]
        # Clients speak the newest protocol only when every server does: a server of the handshake
        # era gets each client's capabilities from that client's own session with it.
        self._legacy = not serving or any(_speaks_handshake(m) for m in serving)
        served = [m.name for m in members]
        self.server = _ProxyServer(
            name,
            version="",
            description=f"served through callgate: {', '.join(served)}",
            instructions=_instructions(members),
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
            on_subscriptions_listen=ListenHandler(bus),
        )
        caps = [m.capabilities for m in members]
        self.server.notification_options = NotificationOptions(
            tools_changed=True,
            resources_changed=any(c.resources is not None and bool(c.resources.list_changed) for c in caps),
            prompts_changed=any(c.prompts is not None and bool(c.prompts.list_changed) for c in caps),
        )
        add = self.server.add_request_handler
        paginated = types.PaginatedRequestParams
        if any(m.capabilities.resources is not None for m in members):
            add("resources/list", paginated, self._list_resources)
            add("resources/templates/list", paginated, self._list_resource_templates)
            add("resources/read", types.ReadResourceRequestParams, self._read_resource)
        if any(m.capabilities.prompts is not None for m in members):
            add("prompts/list", paginated, self._list_prompts)
            add("prompts/get", types.GetPromptRequestParams, self._get_prompt)
        if any(m.capabilities.completions is not None for m in members):
            add("completion/complete", types.CompleteRequestParams, self._complete)
        if any(c.resources is not None and c.resources.subscribe for c in caps):
            add("resources/subscribe", types.SubscribeRequestParams, self._subscribe)
            add("resources/unsubscribe", types.UnsubscribeRequestParams, self._unsubscribe)
        if any(c.logging is not None for c in caps):
            add("logging/setLevel", types.SetLevelRequestParams, self._set_level)
        self.server.middleware.append(self._screen_params)
        if self._legacy:
            # Without discovery, a client falls back to the handshake the servers speak.
            self.server._request_handlers.pop("server/discover", None)

    def _set_tasks(self, tasks: anyio.abc.TaskGroup | None) -> None:
        self._tasks = tasks
        for member in self.members.values():
            if member.proxy is not None:
                member.proxy._tasks = tasks

    # -- members ----------------------------------------------------------------------------------

    def mark_down(self, member: Member, reason: str) -> None:
        """Record that `member` stopped serving (its tools answer an error from now on) and tell
        `on_down`."""
        if member.down is None:
            member.down = reason
            if self.on_down is not None:
                self.on_down(member)

    def _link_ended(self, member: Member, exc: BaseException) -> None:
        if self.on_link_lost is not None:
            self.on_link_lost(member, exc)

    async def _ended(self, member: Member, ctx: ServerRequestContext[Any]) -> str | None:
        """Before a request: the answer for a client whose own session with `member` ended since
        its last request (see `_trouble`), or None."""
        link = member.proxy.link_of(ctx) if member.proxy is not None else None
        if link is None or not link.done.is_set():
            return None
        return await self._trouble(member, ctx)

    async def _trouble(self, member: Member, ctx: ServerRequestContext[Any] | None = None) -> str | None:
        """After a failure: what keeps `member` from serving the client of `ctx` (the answer to
        give it), or None when it still serves. A server marked down is down; else the client's
        own session with it (when it has one), or the gateway's, is asked for a ping.

        The gateway's session closed: the server is marked down. The client's own session ended
        or answers the ping with an error (a server answers every ping of a live session): over
        stdio the server is marked down (that session was the one client's); over HTTP the session
        is closed and forgotten, so the client's next request opens a new one."""
        if member.down is not None:
            return self._down_message(member)
        link = member.proxy.link_of(ctx) if ctx is not None and member.proxy is not None else None
        if link is not None and ctx is not None:
            problem = await _link_problem(link)
            if problem is None:
                return None
            if self._one_client:
                self.mark_down(member, f"stopped serving: its connection closed ({problem})")
                return self._down_message(member)
            assert member.proxy is not None
            if member.proxy.forget_link(ctx) and not link.done.is_set():
                self._link_ended(member, ConnectionError(problem))
            # The server itself may be gone (the gateway's own session says so): then it is down.
            if await self._own_session_lost(member):
                return self._down_message(member)
            return (
                f"MCP server {member.name!r} ended this client's session with it ({problem}): "
                "the next request opens a new session"
            )
        await self._own_session_lost(member)
        return self._down_message(member) if member.down is not None else None

    async def _own_session_lost(self, member: Member) -> bool:
        """Whether the gateway's own session with `member` is lost (the server is then marked
        down): a ping that finds its connection closed, or that the server answers with an error
        other than not knowing the method (a server answers every ping of a session it serves; a
        server reached over HTTP that restarted answers one of a session it no longer knows with
        404). A ping not answered within its timeout leaves the server up."""
        if member.down is not None:
            return True
        with anyio.move_on_after(_PING_TIMEOUT_S):
            try:
                await member.upstream().send_ping()
            except MCPError as exc:
                if exc.error.code == types.CONNECTION_CLOSED:
                    self.mark_down(member, "stopped serving: its connection closed")
                elif exc.error.code != types.METHOD_NOT_FOUND:
                    self.mark_down(member, f"stopped serving: its session ended ({_bounded(exc.error.message)})")
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream) as exc:
                self.mark_down(member, f"stopped serving: its connection closed ({type(exc).__name__})")
        return member.down is not None

    def _serving(self) -> list[Member]:
        return [m for m in self.members.values() if m.down is None and m.scope is not None]

    def _member_of(self, name: str) -> tuple[Member | None, str]:
        server, sep, rest = name.partition(SEPARATOR)
        if not sep or not rest:
            return None, name
        return self.members.get(server), rest

    def _scope_for(self, tool: str) -> AgentScope:
        """Where a refusal of `tool` is recorded: the scope of the server its prefix names, else
        the gateway's own."""
        member, _ = self._member_of(tool)
        return member.scope if member is not None and member.scope is not None else self.scope

    def _refuse_unread(self, tool: str, message: str, run: RunContext | None = None) -> None:
        if self._sole is not None:
            self._sole._refuse_unread(tool, message, run)
            return
        self._scope_for(tool).refuse(tool, message, run=run if run is not None else self.run)

    async def _screen_params(self, ctx: ServerRequestContext[Any], call_next: Callable[..., Any]) -> Any:
        token = _request_run.set(self._run_of(ctx) if self._run_of is not None else self.run)
        try:
            return await self._screened(ctx, call_next)
        finally:
            _request_run.reset(token)

    def _run(self) -> RunContext:
        """Whom the request being served is for (the gateway's `run`, or its function's answer)."""
        return _request_run.get() or self.run

    async def _screened(self, ctx: ServerRequestContext[Any], call_next: Callable[..., Any]) -> Any:
        if ctx.method == "notifications/initialized":
            # Each server gets its session with this client now, declaring what the client declared.
            result = await call_next(ctx)
            for member in self._serving():
                if member.proxy is not None:
                    await member.proxy._client_ready(ctx)
            return result
        problem = _params_problem(ctx.method, ctx.params) if ctx.request_id is not None else None
        if problem is not None:
            tool, message = problem
            self._scope_for(tool).refuse(tool, message, run=self._run(), crossing=CROSSING_TOOLS.get(tool))
            raise MCPError(types.INVALID_PARAMS, message)
        try:
            return await call_next(ctx)
        except pydantic.ValidationError as exc:
            where = sorted({".".join(str(part) for part in error["loc"]) or "params" for error in exc.errors()})
            shown = ", ".join(where[:5]) + (", …" if len(where) > 5 else "")
            raise MCPError(types.INVALID_PARAMS, _bounded(f"Invalid params: {shown}")) from None

    # -- tools --------------------------------------------------------------------------------------

    async def _list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        member, page, next_cursor = await self._page(ctx, "tools", params, lambda proxy, p: proxy._list_tools(ctx, p))
        tools = list(page.tools) if member is not None else []
        return types.ListToolsResult(tools=tools, next_cursor=next_cursor)

    async def _call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        name = params.name
        args = dict(params.arguments or {})
        refusal = None
        if len(name) > self.max_name_chars:
            refusal = f"tool name of {len(name)} characters refused: this proxy accepts at most {self.max_name_chars}"
        elif len(args) and (size := len(pydantic_core.to_json(args))) > self.max_args_bytes:
            refusal = f"arguments of {size} bytes refused: this proxy accepts at most {self.max_args_bytes}"
        if refusal is not None:
            self._scope_for(_cut(name)).refuse(_cut(name), refusal, run=self._run())
            raise MCPError(types.INVALID_PARAMS, refusal)
        member, _tool = self._member_of(name)
        if member is None or name in CROSSING_TOOLS:
            self.scope.refuse(_cut(name), f"unknown tool {_cut(name)}", run=self._run())
            raise MCPError(types.INVALID_PARAMS, f"Unknown tool: {_cut(name)}")
        if member.down is not None or member.proxy is None:
            return self._refuse_down(member, name, self._down_message(member))
        ended = await self._ended(member, ctx)
        if ended is not None:
            return self._refuse_down(member, name, ended)
        try:
            result = await member.proxy._call_tool(ctx, params)
        except MCPError as exc:
            if exc.error.code != types.CONNECTION_CLOSED and exc.error.code != types.INTERNAL_ERROR:
                raise
            trouble = await self._trouble(member, ctx)
            if trouble is None:
                raise
            # The client's session with the server was gone before the gate saw the call.
            return self._refuse_down(member, name, trouble)
        if result.is_error and (trouble := await self._trouble(member, ctx)) is not None:
            # The session went away during the call: the gate recorded the failed call already.
            return types.CallToolResult(content=[_text(trouble)], is_error=True)
        return result

    def _down_message(self, member: Member) -> str:
        return f"MCP server {member.name!r} is unavailable: {member.down}"

    def _refuse_down(self, member: Member, name: str, message: str) -> types.CallToolResult:
        scope = member.scope if member.scope is not None else self.scope
        scope.refuse(_cut(name), message, run=self._run())
        return types.CallToolResult(content=[_text(message)], is_error=True)

    # -- resources and prompts ----------------------------------------------------------------------

    async def _page(
        self,
        ctx: ServerRequestContext[Any],
        kind: str,
        params: types.PaginatedRequestParams | None,
        fetch: Callable[[McpProxy, types.PaginatedRequestParams], Any],
    ) -> tuple[Member | None, Any, str | None]:
        """One page of a list, page by page across the servers in configuration order: the
        server the page is from, its page, and the gateway's cursor of the next page (which names
        the server and that server's own cursor), or None after the last. A cursor the gateway did
        not give is invalid params (not echoed). A server that cannot list (other than for its own
        cursor) is left out of the list, not the others."""
        offering = [m for m in self._serving() if m.proxy is not None and (kind == "tools" or _offers(m, kind))]
        start, inner = 0, None
        if params is not None and params.cursor is not None:
            name, inner = _read_cursor(params.cursor, self.members)
            start = next((i for i, m in enumerate(offering) if m.name == name), len(offering))
        for index in range(start, len(offering)):
            member = offering[index]
            assert member.proxy is not None
            try:
                page = await fetch(member.proxy, types.PaginatedRequestParams(cursor=inner))
            except MCPError as exc:
                trouble = await self._trouble(member, ctx)
                if trouble is not None:
                    log.warning("MCP server %r left out of a %s list: %s", member.name, kind, trouble)
                elif inner is not None:
                    raise MCPError(exc.error.code, _bounded(exc.error.message)) from None
                else:
                    log.warning("MCP server %r could not list its %s: %s", member.name, kind, _bounded(str(exc)))
                inner = None
                continue
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream):
                # Marked down, or the client's own session forgotten, as the ping finds it.
                await self._trouble(member, ctx)
                inner = None
                continue
            if page.next_cursor is not None:
                return member, page, _give_cursor(member.name, page.next_cursor)
            following = offering[index + 1] if index + 1 < len(offering) else None
            return member, page, _give_cursor(following.name, None) if following is not None else None
        return None, None, None

    async def _list_resources(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        member, page, next_cursor = await self._page(
            ctx, "resources", params, lambda proxy, p: proxy._list_resources(ctx, p)
        )
        if member is None:
            return types.ListResourcesResult(resources=[], next_cursor=next_cursor)
        for resource in page.resources:
            self._resource_owner.setdefault(resource.uri, member.name)
        return types.ListResourcesResult(resources=list(page.resources), next_cursor=next_cursor)

    async def _list_resource_templates(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        member, page, next_cursor = await self._page(
            ctx, "resources", params, lambda proxy, p: proxy._list_resource_templates(ctx, p)
        )
        templates = list(page.resource_templates) if member is not None else []
        for template in templates:
            assert member is not None
            self._template_owner.setdefault(template.uri_template, member.name)
        return types.ListResourceTemplatesResult(resource_templates=templates, next_cursor=next_cursor)

    async def _list_prompts(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListPromptsResult:
        member, page, next_cursor = await self._page(
            ctx, "prompts", params, lambda proxy, p: proxy._list_prompts(ctx, p)
        )
        if member is None:
            return types.ListPromptsResult(prompts=[], next_cursor=next_cursor)
        prompts = [p.model_copy(update={"name": member.prefix + p.name}) for p in page.prompts]
        return types.ListPromptsResult(prompts=prompts, next_cursor=next_cursor)

    async def _complete(
        self, ctx: ServerRequestContext[Any], params: types.CompleteRequestParams
    ) -> types.CompleteResult:
        """A completion goes to the server of the prompt (by its prefix, which it loses) or of
        the resource template (the server that listed it)."""
        ref = params.ref
        member: Member | None
        if isinstance(ref, types.PromptReference):
            member, name = self._member_of(ref.name)
            ref = ref.model_copy(update={"name": name})
        else:
            owner = self._template_owner.get(ref.uri)
            listing: types.PaginatedRequestParams | None = None
            for _ in range(_LIST_PAGE_CAP):
                if owner is not None:
                    break
                page = await self._list_resource_templates(ctx, listing)
                owner = self._template_owner.get(ref.uri)
                if page.next_cursor is None:
                    break
                listing = types.PaginatedRequestParams(cursor=page.next_cursor)
            member = self.members.get(owner) if owner is not None else None
        if member is None:
            raise MCPError(types.INVALID_PARAMS, "Invalid params: the reference names no server of this gateway")
        if member.down is not None or member.proxy is None:
            raise MCPError(types.INTERNAL_ERROR, self._down_message(member))
        return await member.proxy._complete(ctx, params.model_copy(update={"ref": ref}))

    async def _owner_of(self, ctx: ServerRequestContext[Any], uri: str) -> Member | None:
        """The server that listed the resource `uri` (listing every server's resources first if
        no listing named it yet)."""
        owner = self._resource_owner.get(uri)
        listing: types.PaginatedRequestParams | None = None
        for _ in range(_LIST_PAGE_CAP):
            if owner is not None:
                break
            page = await self._list_resources(ctx, listing)
            owner = self._resource_owner.get(uri)
            if page.next_cursor is None:
                break
            listing = types.PaginatedRequestParams(cursor=page.next_cursor)
        if owner is None:
            owner = await self._template_owner_of(ctx, uri)
        return self.members.get(owner) if owner is not None else None

    async def _template_owner_of(self, ctx: ServerRequestContext[Any], uri: str) -> str | None:
        """The server that listed a resource template `uri` fills (the first, in the file's order)."""
        listing: types.PaginatedRequestParams | None = None
        for _ in range(_LIST_PAGE_CAP):
            page = await self._list_resource_templates(ctx, listing)
            for template in page.resource_templates:
                if _fills(template.uri_template, uri):
                    return self._template_owner.get(template.uri_template)
            if page.next_cursor is None:
                return None
            listing = types.PaginatedRequestParams(cursor=page.next_cursor)
        return None

    async def _serving_owner(self, ctx: ServerRequestContext[Any], uri: str) -> McpProxy:
        """The proxy of the serving server that listed `uri`; invalid params when none did."""
        member = await self._owner_of(ctx, uri)
        if member is None or member.proxy is None or member.down is not None:
            raise MCPError(types.INVALID_PARAMS, "Invalid params: no serving server listed this resource URI")
        return member.proxy

    async def _subscribe(
        self, ctx: ServerRequestContext[Any], params: types.SubscribeRequestParams
    ) -> types.EmptyResult:
        return await (await self._serving_owner(ctx, params.uri))._subscribe(ctx, params)

    async def _unsubscribe(
        self, ctx: ServerRequestContext[Any], params: types.UnsubscribeRequestParams
    ) -> types.EmptyResult:
        return await (await self._serving_owner(ctx, params.uri))._unsubscribe(ctx, params)

    async def _set_level(
        self, ctx: ServerRequestContext[Any], params: types.SetLevelRequestParams
    ) -> types.EmptyResult:
        """The level goes to every serving server that logs (on this client's sessions)."""
        for member in self._serving():
            if member.proxy is not None and member.capabilities.logging is not None:
                await member.proxy._set_level(ctx, params)
        return types.EmptyResult()

    async def _crossed(self, ctx: ServerRequestContext[Any], member: Member, crossing: str, cross: Any) -> Any:
        """A read or a get through `member`'s own crossing (gated in its scope); a server that
        went away during it answers the error that says so."""
        message = self._down_message(member) if member.down is not None else await self._ended(member, ctx)
        if message is not None or member.proxy is None:
            message = message or self._down_message(member)
            scope = member.scope if member.scope is not None else self.scope
            scope.refuse(crossing, message, run=self._run(), crossing=CROSSING_TOOLS[crossing])
            raise MCPError(types.INTERNAL_ERROR, message)
        try:
            return await cross(member.proxy)
        except MCPError as exc:
            if exc.error.code != DENIED and (trouble := await self._trouble(member, ctx)) is not None:
                raise MCPError(types.INTERNAL_ERROR, trouble) from None
            raise

    async def _read_resource(
        self, ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        member = await self._owner_of(ctx, params.uri)
        if member is None:
            message = "no server listed this resource URI: list resources first, or ask for a URI one of them lists"
            self.scope.refuse(
                "mcp.resources.read", message, run=self._run(), crossing=CROSSING_TOOLS["mcp.resources.read"]
            )
            raise MCPError(types.INVALID_PARAMS, message)
        result: types.ReadResourceResult = await self._crossed(
            ctx, member, "mcp.resources.read", lambda proxy: proxy._read_resource(ctx, params)
        )
        return result

    async def _get_prompt(
        self, ctx: ServerRequestContext[Any], params: types.GetPromptRequestParams
    ) -> types.GetPromptResult:
        member, prompt = self._member_of(params.name)
        if member is None:
            message = f"unknown prompt {_cut(params.name)}: prompt names are <server>{SEPARATOR}<prompt>"
            self.scope.refuse("mcp.prompts.get", message, run=self._run(), crossing=CROSSING_TOOLS["mcp.prompts.get"])
            raise MCPError(types.INVALID_PARAMS, message)
        own = params.model_copy(update={"name": prompt})
        result: types.GetPromptResult = await self._crossed(
            ctx, member, "mcp.prompts.get", lambda proxy: proxy._get_prompt(ctx, own)
        )
        return result


def _text(text: str) -> types.TextContent:
    return types.TextContent(type="text", text=text)


def _speaks_handshake(member: Member) -> bool:
    """Whether the gateway's own session with the server is of a handshake-era protocol."""
    return member.upstream().protocol_version not in MODERN_PROTOCOL_VERSIONS


async def _link_problem(link: Any) -> str | None:
    """What is wrong with a client's own session with a server (it ended, or answers a ping with
    an error: a server answers the ping of a session it serves, and over HTTP one it ended or
    forgot with 404 or 400), or None when it answers the ping, does not know the method (the
    newest protocol has none) or takes longer than the ping's timeout."""
    if link.done.is_set() or link.client is None:
        return str(link.error or "it ended")
    with anyio.move_on_after(_PING_TIMEOUT_S):
        try:
            await link.client.session.send_ping()
        except MCPError as exc:
            if exc.error.code == types.METHOD_NOT_FOUND:
                return None
            return _bounded(exc.error.message)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream) as exc:
            return type(exc).__name__
    return None


_LIST_PAGE_CAP = 1000
"""Pages of a resources/list walk (to find who listed a URI) before giving up."""

_MAX_CURSOR_CHARS = 4096
"""The longest cursor the gateway reads (its own are a server name and that server's cursor)."""

_BAD_CURSOR = "Invalid params: the cursor is not one this gateway gave"


def _offers(member: Member, kind: str) -> bool:
    caps = member.capabilities
    return (caps.resources if kind == "resources" else caps.prompts) is not None


def _give_cursor(server: str, cursor: str | None) -> str:
    """The gateway's cursor for a list's next page: the server and its own cursor (None: the
    server's first page)."""
    return base64.urlsafe_b64encode(json.dumps([server, cursor]).encode()).decode()


def _read_cursor(cursor: str, members: Mapping[str, Member]) -> tuple[str, str | None]:
    """The server and its own cursor a gateway's cursor names; invalid params (never echoing the
    cursor) for anything the gateway did not give."""
    try:
        if len(cursor) > _MAX_CURSOR_CHARS:
            raise ValueError
        server, inner = json.loads(base64.urlsafe_b64decode(cursor.encode("ascii")))
    except (ValueError, TypeError, UnicodeError):
        raise MCPError(types.INVALID_PARAMS, _BAD_CURSOR) from None
    if not isinstance(server, str) or server not in members or not (inner is None or isinstance(inner, str)):
        raise MCPError(types.INVALID_PARAMS, _BAD_CURSOR)
    return server, inner


def _instructions(members: Sequence[Member]) -> str:
    """The gateway's instructions: how names are made, then which server says what (its
    `serverInfo` and its own instructions), server by server."""
    lines = [
        f"Tools and prompts are named <server>{SEPARATOR}<name>; servers: {', '.join(m.name for m in members)}.",
    ]
    for member in members:
        client = member.toolset.session if member.down is None and member.scope is not None else None
        if not isinstance(client, Client):
            lines.append(f"\nServer {member.name}: unavailable ({member.down or 'not started'}).")
            continue
        info = client.server_info
        said = f"{info.name} {info.version}".strip() if info is not None else "no serverInfo"
        title = f" ({info.title})" if info is not None and info.title else ""
        lines.append(f"\nServer {member.name} is {said}{title}.")
        if client.instructions:
            lines.append(f"Instructions of server {member.name}:\n{client.instructions}")
    return "\n".join(lines)


def _fills(template: str, uri: str) -> bool:
    """Whether `uri` is `template` (a URI template) with each `{variable}` filled by a value
    without `/`."""
    parts = re.split(r"\{[^{}]*\}", template)
    pattern = "[^/]+".join(re.escape(part) for part in parts)
    return re.fullmatch(pattern, uri) is not None
