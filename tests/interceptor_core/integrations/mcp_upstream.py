"""A real MCP server for the integration tests, run as its own process over stdio.

Its tools act on files under $UPSTREAM_ROOT and record every effect in effects.log there, so a
test can prove that a refused call never reached it. `enable_archive` adds the `archive_file`
tool at run time and announces the change (on both protocol eras).
"""

import os
from pathlib import Path

from mcp.server.mcpserver import Context, MCPServer

root = Path(os.environ["UPSTREAM_ROOT"])
server = MCPServer("files")


def record(effect: str) -> None:
    with (root / "effects.log").open("a") as log:
        log.write(effect + "\n")


@server.tool(description="Writes text to a file under the root")
def write_file(path: str, text: str) -> str:
    (root / path).write_text(text)
    record(f"write {path}")
    return f"wrote {len(text)} chars to {path}"


@server.tool(description="Deletes a file under the root")
def delete_file(path: str) -> str:
    (root / path).unlink()
    record(f"delete {path}")
    return f"deleted {path}"


def archive_file(path: str) -> str:
    """Renames a file to PATH.archived"""
    (root / path).rename(root / f"{path}.archived")
    record(f"archive {path}")
    return f"archived {path}"


@server.tool(description="Makes the archive_file tool available")
async def enable_archive(ctx: Context) -> str:
    if "archive_file" not in {t.name for t in await server.list_tools()}:
        server.add_tool(archive_file)
    await ctx.notify_tools_changed()  # subscriptions/listen streams (2026-07-28)
    if ctx.protocol_version != "2026-07-28":
        await ctx.session.send_tool_list_changed()  # older clients hear it on the session
    record("enable_archive")
    return "archive_file is available"


if __name__ == "__main__":
    server.run()
