"""A streamable HTTP MCP server for the gateway's tests, run as its own process on 127.0.0.1.

It reports the HTTP headers it receives: the tool `request_headers` answers (as JSON) the headers
of the HTTP request that carried the call (`this`) and those of every HTTP request made to it so
far (`every`). Its resource template `headers://{name}` completes `name` with `helper:` and the
value typed, so a test can tell which server answered a completion. It binds a free port (or
$HEADERS_PORT, which it may take again right after a killed server held it) and writes it as the
first line on stdout.
"""

import json
import os
import socket
import sys
from typing import Any

import anyio
import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import Completion, ResourceTemplateReference

server = MCPServer("headers")
every: list[dict[str, str]] = []


@server.tool()
def request_headers(ctx: Context) -> str:
    """The headers of this call's HTTP request and of every HTTP request made to this server."""
    request = ctx.request_context.request
    this = {key.lower(): value for key, value in request.headers.items()} if request is not None else {}
    return json.dumps({"this": this, "every": every})


@server.resource("headers://{name}")
def header(name: str) -> str:
    """A header by name (a template whose argument completes)."""
    return name


@server.completion()
async def complete(ref: Any, argument: Any, context: Any) -> Completion | None:
    if isinstance(ref, ResourceTemplateReference) and ref.uri == "headers://{name}":
        return Completion(values=[f"helper:{argument.value}"])
    return None


def recording(app: Any) -> Any:
    """`app`, noting the headers of every HTTP request before it serves it."""

    async def serve(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            every.append({key.decode("latin-1").lower(): value.decode("latin-1") for key, value in scope["headers"]})
        await app(scope, receive, send)

    return serve


async def main() -> None:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", int(os.environ.get("HEADERS_PORT", "0"))))
    sock.listen(128)
    print(sock.getsockname()[1], flush=True)
    config = uvicorn.Config(recording(server.streamable_http_app()), log_level="warning")
    await uvicorn.Server(config).serve(sockets=[sock])


if __name__ == "__main__":
    sys.exit(anyio.run(main))
