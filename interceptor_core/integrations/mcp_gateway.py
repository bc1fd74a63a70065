"""One gated MCP server in front of several upstream MCP servers (`callgate mcp-proxy --config`).

`McpGateway` serves the tools, resources and prompts of several upstreams as one MCP server:

- Tool names are `<server>__<tool>` (`SEPARATOR`): both parts stay within the characters the MCP
  specification allows in tool names (letters, digits, `_`, `-`, `.`), and a server name may not
  hold `__`, so the first `__` of a name always says which server it goes to.
- Prompt names are prefixed the same way. Resource URIs are kept as they are and routed to the
  server that listed them (a URI no server listed is refused; one listed by two servers goes to
  the first in the configuration).
- Each server's tools (and its `mcp.resources.read` and `mcp.prompts.get` crossings) are in an
  agent scope named after the server, so a policy can target a server with `scope.agent`.
- A server that fails to start or stops serving is marked down: calls of its tools answer a tool
  error naming the server and its trouble, with one `ToolDenied` event in its scope; the other
  servers keep serving.

Not relayed through several servers (the single-upstream `McpProxy` relays them): requests from a
server to the client (sampling, elicitation, roots; the gateway declares no such capability
upstream), resource subscriptions, completion, logging, progress notifications other than a tool
call's, and list-changed notifications to the client. Lists are answered in one page.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Sequence
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
from mcp.shared.exceptions import MCPError

from interceptor_core.context import RunContext
from interceptor_core.exceptions import ToolApprovalRequiredError, ToolBlockedError
from interceptor_core.gate import AgentScope
from interceptor_core.integrations.mcp import (
    CROSSING_TOOLS,
    DENIED,
    MAX_ARGS_BYTES,
    MAX_LINE_BYTES,
    MAX_NAME_CHARS,
    STDIO_GRACE_S,
    McpToolset,
    _bounded,
    _downstream,
    _params_problem,
    _prompt_result,
    _ProxyServer,
    _read_result,
    _stdio_transport,
    _upstream_failure,
    result_from_gate,
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
    next_refresh: float = 0.0

    @property
    def prefix(self) -> str:
        return self.name + SEPARATOR

    def upstream(self) -> Any:
        session = self.toolset.session
        return session.session if isinstance(session, Client) else session


def _cut(name: str) -> str:
    return name if len(name) <= _SHOWN_NAME_CHARS else name[:_SHOWN_NAME_CHARS] + "…"


class McpGateway:
    """A gated MCP server over several upstreams (see the module's description).

    `members` are the upstreams in configuration order, each started already (`scope` set) or
    down; `scope` is the gateway's own agent scope, where refusals that name no server (an unknown
    prefix, an unreadable request) are recorded. Calls carry `run`. Serve with `serve_stdio`."""

    def __init__(
        self,
        members: Sequence[Member],
        scope: AgentScope,
        *,
        name: str = "callgate-mcp-gateway",
        run: RunContext | None = None,
        max_name_chars: int = MAX_NAME_CHARS,
        max_args_bytes: int = MAX_ARGS_BYTES,
        refresh_interval_s: float = 1.0,
        on_down: Callable[[Member], object] | None = None,
    ) -> None:
        self.on_down = on_down
        self.members = {member.name: member for member in members}
        self.scope = scope
        self.run = run if run is not None else RunContext(principal="mcp-client")
        self.max_name_chars = max_name_chars
        self.max_args_bytes = max_args_bytes
        self.refresh_interval_s = refresh_interval_s
        self._resource_owner: dict[str, str] = {}
        served = [m.name for m in members]
        self.server: Server[Any] = _ProxyServer(
            name,
            version="",
            description=f"served through callgate: {', '.join(served)}",
            instructions=f"Tools and prompts are named <server>{SEPARATOR}<name>; servers: {', '.join(served)}.",
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
        )
        self.server.notification_options = NotificationOptions()
        add = self.server.add_request_handler
        paginated = types.PaginatedRequestParams
        if any(m.capabilities.resources is not None for m in members):
            add("resources/list", paginated, self._list_resources)
            add("resources/templates/list", paginated, self._list_resource_templates)
            add("resources/read", types.ReadResourceRequestParams, self._read_resource)
        if any(m.capabilities.prompts is not None for m in members):
            add("prompts/list", paginated, self._list_prompts)
            add("prompts/get", types.GetPromptRequestParams, self._get_prompt)
        self.server.middleware.append(self._screen_params)
        # Clients use the handshake every SDK speaks; discovery would promise features not relayed.
        self.server._request_handlers.pop("server/discover", None)

    # -- members ----------------------------------------------------------------------------------

    def mark_down(self, member: Member, reason: str) -> None:
        """Record that `member` stopped serving (its tools answer an error from now on) and tell
        `on_down`."""
        if member.down is None:
            member.down = reason
            if self.on_down is not None:
                self.on_down(member)

    async def _still_up(self, member: Member) -> bool:
        """After a failure: ask the server for a ping; a closed connection marks it down. Whether
        it is still up."""
        if member.down is not None:
            return False
        with anyio.move_on_after(_PING_TIMEOUT_S):
            try:
                await member.upstream().send_ping()
            except MCPError as exc:
                if exc.error.code == types.CONNECTION_CLOSED:
                    self.mark_down(member, "stopped serving: its connection closed")
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream) as exc:
                self.mark_down(member, f"stopped serving: its connection closed ({type(exc).__name__})")
        return member.down is None

    def _serving(self) -> list[Member]:
        return [m for m in self.members.values() if m.down is None and m.scope is not None]

    def _member_of(self, name: str) -> tuple[Member | None, str]:
        server, sep, rest = name.partition(SEPARATOR)
        if not sep or not rest:
            return None, name
        return self.members.get(server), rest

    def _refuse_unread(self, tool: str, message: str, run: RunContext | None = None) -> None:
        self.scope.refuse(tool, message, run=run if run is not None else self.run)

    async def _screen_params(self, ctx: ServerRequestContext[Any], call_next: Callable[..., Any]) -> Any:
        problem = _params_problem(ctx.method, ctx.params) if ctx.request_id is not None else None
        if problem is not None:
            tool, message = problem
            self.scope.refuse(tool, message, run=self.run, crossing=CROSSING_TOOLS.get(tool))
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
        tools: list[types.Tool] = []
        for member in self._serving():
            assert member.scope is not None
            shown = member.scope.shown_tools(self.run)
            for name in shown:
                definition = member.toolset.definition(name)
                if definition is not None and name not in CROSSING_TOOLS:
                    tools.append(definition.model_copy(update={"name": name}))
        return types.ListToolsResult(tools=tools)

    async def _refresh(self, member: Member) -> None:
        if time.monotonic() < member.next_refresh:
            return
        member.next_refresh = time.monotonic() + self.refresh_interval_s
        try:
            await member.toolset.refresh()
        except Exception as exc:
            # The call is then answered as unknown, unless the ping finds the server gone.
            log.warning("listing the tools of MCP server %r failed: %s", member.name, type(exc).__name__)
            await self._still_up(member)

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
            self.scope.refuse(_cut(name), refusal, run=self.run)
            raise MCPError(types.INVALID_PARAMS, refusal)
        member, _tool = self._member_of(name)
        if member is None or name in CROSSING_TOOLS:
            self.scope.refuse(_cut(name), f"unknown tool {_cut(name)}", run=self.run)
            raise MCPError(types.INVALID_PARAMS, f"Unknown tool: {_cut(name)}")
        if member.down is None and member.scope is not None and name not in member.scope.tools:
            await self._refresh(member)
        if member.down is not None or member.scope is None:
            return self._refuse_down(member, name)
        token = _downstream.set(ctx)
        try:
            result = await member.scope.call(name, args, run=self.run)
        except (ToolBlockedError, ToolApprovalRequiredError) as exc:
            raise MCPError(types.INTERNAL_ERROR, str(exc)) from exc
        finally:
            _downstream.reset(token)
        if result.kind == "error" and not await self._still_up(member):
            # The server went away during the call: the gate recorded the failed call already.
            return types.CallToolResult(content=[_text(self._down_message(member))], is_error=True)
        definition = member.toolset.definition(name)
        return result_from_gate(result, definition.output_schema if definition is not None else None)

    def _down_message(self, member: Member) -> str:
        return f"MCP server {member.name!r} is unavailable: {member.down}"

    def _refuse_down(self, member: Member, name: str) -> types.CallToolResult:
        message = self._down_message(member)
        scope = member.scope if member.scope is not None else self.scope
        scope.refuse(_cut(name), message, run=self.run)
        return types.CallToolResult(content=[_text(message)], is_error=True)

    # -- resources and prompts ----------------------------------------------------------------------

    async def _walk(self, member: Member, request: Callable[[str | None], Any], result_type: Any) -> list[Any]:
        pages = []
        cursor: str | None = None
        for _ in range(1000):
            page = await member.upstream().send_request(request(cursor), result_type)
            pages.append(page)
            cursor = page.next_cursor
            if cursor is None:
                break
        return pages

    async def _each(
        self, kind: str, request: Callable[[str | None], Any], result_type: Any
    ) -> list[tuple[Member, Any]]:
        found = []
        for member in self._serving():
            offered = member.capabilities.resources if kind == "resources" else member.capabilities.prompts
            if offered is None:
                continue
            try:
                for page in await self._walk(member, request, result_type):
                    found.append((member, page))
            except MCPError as exc:
                # One server's error leaves its entries out of the list, not the others'.
                if exc.error.code == types.CONNECTION_CLOSED:
                    self.mark_down(member, "stopped serving: its connection closed")
                else:
                    log.warning("MCP server %r could not list its %s: %s", member.name, kind, _bounded(str(exc)))
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream) as exc:
                self.mark_down(member, f"stopped serving: its connection closed ({type(exc).__name__})")
            except Exception as exc:
                log.warning("MCP server %r answered its %s list wrongly: %s", member.name, kind, type(exc).__name__)
        return found

    async def _list_resources(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        def request(cursor: str | None) -> Any:
            return types.ListResourcesRequest(params=types.PaginatedRequestParams(cursor=cursor))

        resources: list[types.Resource] = []
        for member, page in await self._each("resources", request, types.ListResourcesResult):
            for resource in page.resources:
                self._resource_owner.setdefault(resource.uri, member.name)
                resources.append(resource)
        return types.ListResourcesResult(resources=resources)

    async def _list_resource_templates(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        def request(cursor: str | None) -> Any:
            return types.ListResourceTemplatesRequest(params=types.PaginatedRequestParams(cursor=cursor))

        templates: list[types.ResourceTemplate] = []
        for _member, page in await self._each("resources", request, types.ListResourceTemplatesResult):
            templates.extend(page.resource_templates)
        return types.ListResourceTemplatesResult(resource_templates=templates)

    async def _list_prompts(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListPromptsResult:
        def request(cursor: str | None) -> Any:
            return types.ListPromptsRequest(params=types.PaginatedRequestParams(cursor=cursor))

        prompts: list[types.Prompt] = []
        for member, page in await self._each("prompts", request, types.ListPromptsResult):
            prompts.extend(p.model_copy(update={"name": member.prefix + p.name}) for p in page.prompts)
        return types.ListPromptsResult(prompts=prompts)

    async def _gated(self, ctx: ServerRequestContext[Any], member: Member, crossing: str, args: dict[str, Any]) -> Any:
        """Put a read or a get through the gate in `member`'s scope; the upstream's result, or an
        `MCPError` (the gate's denial, the upstream's own error, or the server being down)."""
        if member.down is not None or member.scope is None:
            message = self._down_message(member)
            scope = member.scope if member.scope is not None else self.scope
            scope.refuse(crossing, message, run=self.run, crossing=CROSSING_TOOLS[crossing])
            raise MCPError(types.INTERNAL_ERROR, message)
        failures: list[MCPError] = []
        token_d = _downstream.set(ctx)
        token_f = _upstream_failure.set(failures)
        try:
            result = await member.scope.call(crossing, args, run=self.run)
        except (ToolBlockedError, ToolApprovalRequiredError) as exc:
            raise MCPError(types.INTERNAL_ERROR, _bounded(str(exc))) from exc
        finally:
            _downstream.reset(token_d)
            _upstream_failure.reset(token_f)
        if (failures or result.kind == "error") and not await self._still_up(member):
            raise MCPError(types.INTERNAL_ERROR, self._down_message(member))
        if failures:
            raise failures[0]
        match result.kind:
            case "ok" | "substituted":
                return result.value
            case "denied":
                raise MCPError(DENIED, _bounded(result.to_model_text()))
        raise MCPError(types.INTERNAL_ERROR, _bounded(result.to_model_text()))

    async def _read_resource(
        self, ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        owner = self._resource_owner.get(params.uri)
        if owner is None:
            await self._list_resources(ctx, None)
            owner = self._resource_owner.get(params.uri)
        if owner is None:
            message = "no server listed this resource URI: list resources first, or ask for a URI one of them lists"
            self.scope.refuse(
                "mcp.resources.read", message, run=self.run, crossing=CROSSING_TOOLS["mcp.resources.read"]
            )
            raise MCPError(types.INVALID_PARAMS, message)
        value = await self._gated(ctx, self.members[owner], "mcp.resources.read", {"uri": params.uri})
        return _read_result(params.uri, value)

    async def _get_prompt(
        self, ctx: ServerRequestContext[Any], params: types.GetPromptRequestParams
    ) -> types.GetPromptResult:
        member, prompt = self._member_of(params.name)
        if member is None:
            message = f"unknown prompt {_cut(params.name)}: prompt names are <server>{SEPARATOR}<prompt>"
            self.scope.refuse("mcp.prompts.get", message, run=self.run, crossing=CROSSING_TOOLS["mcp.prompts.get"])
            raise MCPError(types.INVALID_PARAMS, message)
        args: dict[str, Any] = {"name": prompt}
        if params.arguments is not None:
            args["arguments"] = dict(params.arguments)
        value = await self._gated(ctx, member, "mcp.prompts.get", args)
        return _prompt_result(value)

    # -- serving ------------------------------------------------------------------------------------

    async def serve_stdio(
        self,
        *,
        stop: anyio.Event | None = None,
        max_line_bytes: int = MAX_LINE_BYTES,
        grace_s: float = STDIO_GRACE_S,
        draining: Callable[[int], object] | None = None,
    ) -> None:
        """Serve one MCP client on stdin/stdout until stdin closes or `stop` is set, as
        `McpProxy.serve_stdio` does (the same transport, the same answers to unreadable lines)."""
        async with (
            _stdio_transport(max_line_bytes, stop, grace_s, draining, True, self._refuse_unread) as (read, write),
            anyio.create_task_group() as tasks,
        ):
            if stop is not None:

                async def give_up_after_grace(stop: anyio.Event) -> None:
                    await stop.wait()
                    await anyio.sleep(grace_s + 5.0)
                    tasks.cancel_scope.cancel()

                tasks.start_soon(give_up_after_grace, stop)
            await self.server.run(read, write, self.server.create_initialization_options())
            tasks.cancel_scope.cancel()


def _text(text: str) -> types.TextContent:
    return types.TextContent(type="text", text=text)
