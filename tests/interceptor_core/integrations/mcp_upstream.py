"""A real MCP server for the integration tests, run as its own process over stdio.

Its tools act on files under $UPSTREAM_ROOT and record every effect in effects.log there, so a
test can prove that a refused call never reached it. `enable_archive` adds the `archive_file`
tool at run time and announces the change (on both protocol eras). Every tools/list a client
makes is a line of lists.log, and the process writes its pid to upstream.pid when it starts.

With UPSTREAM_FILE_TOOLS=1 it also has the path-carrying tools of the official filesystem server
(`read_file`, `read_multiple_files`, `move_file`), which resolve paths as it does: relative to the
root, or absolute.

With UPSTREAM_SLOW_TOOL=1 it also has `slow_write`, which writes slow.started, then waits until
a writer opens the FIFO $UPSTREAM_ROOT/release.fifo (the test makes it) and writes one line,
before it writes its file: a call a test holds in flight for as long as it needs.

With UPSTREAM_RESOURCES=1 it also serves resources and prompts: `files://notes`; `files://slow/N`,
whose read reports N progress steps; `files://held`, whose read writes held.started and
waits for the release FIFO as `slow_write` does (a cancelled read records `read held
cancelled`); the prompt `greet`; and the tool `add_note`, which adds the resource `files://added`
and the prompt `added` and announces both lists changed (on both protocol eras).
"""

import os
from pathlib import Path
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, ListToolsResult

root = Path(os.environ["UPSTREAM_ROOT"])


PAGE_SIZE = int(os.environ.get("UPSTREAM_PAGE_SIZE", "0"))
"""With a size, tools/list answers pages of that many tools, the cursor being the next offset."""


class CountingServer(MCPServer):
    """Records each tools/list request (the proxy's rate limit on listing again is measured here),
    and pages the listing when UPSTREAM_PAGE_SIZE says so."""

    async def _handle_list_tools(self, ctx: Any, params: Any) -> Any:
        with (root / "lists.log").open("a") as log:
            log.write("list\n")
        listed = await super()._handle_list_tools(ctx, params)
        if not PAGE_SIZE:
            return listed
        cursor = params.cursor if params is not None else None
        if cursor is not None and not (cursor.isdigit() and int(cursor) < len(listed.tools)):
            raise MCPError(INVALID_PARAMS, "no such page")
        start = int(cursor or 0)
        end = start + PAGE_SIZE
        return ListToolsResult(tools=listed.tools[start:end], next_cursor=str(end) if end < len(listed.tools) else None)


server = CountingServer("files")


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


if os.environ.get("UPSTREAM_FILE_TOOLS") == "1":

    @server.tool(description="Reads a text file under the root (or an absolute path)")
    def read_file(path: str) -> str:
        text = (root / path).read_text()
        record(f"read {path}")
        return text

    @server.tool(description="Reads several text files")
    def read_multiple_files(paths: list[str]) -> str:
        texts = [(root / path).read_text() for path in paths]
        record(f"read {' '.join(paths)}")
        return "\n".join(texts)

    @server.tool(description="Moves or renames a file")
    def move_file(source: str, destination: str) -> str:
        (root / source).rename(root / destination)
        record(f"move {source} {destination}")
        return f"moved {source} to {destination}"


if os.environ.get("UPSTREAM_SLOW_TOOL") == "1":

    def wait_for_release() -> str:
        with (root / "release.fifo").open() as fifo:  # blocks until the test opens it to write
            return fifo.readline().strip()

    @server.tool(description="Writes text to a file under the root once the test releases it")
    async def slow_write(path: str, text: str) -> str:
        (root / "slow.started").write_text(path)
        said = await anyio.to_thread.run_sync(wait_for_release)
        (root / path).write_text(text)
        record(f"slow_write {path} {said}")
        return f"wrote {len(text)} chars to {path}"


if os.environ.get("UPSTREAM_RESOURCES") == "1":

    @server.resource("files://notes", name="notes", mime_type="text/plain")
    def notes() -> str:
        return "the notes"

    @server.resource("files://slow/{steps}", name="slow", mime_type="text/plain")
    async def slow(steps: str, ctx: Context) -> str:
        for step in range(1, int(steps) + 1):
            await ctx.report_progress(step, int(steps), f"step {step}")
        return "read slowly"

    def wait_for_read_release() -> str:
        with (root / "release.fifo").open() as fifo:  # blocks until the test opens it to write
            return fifo.readline().strip()

    @server.resource("files://held", name="held", mime_type="text/plain")
    async def held() -> str:
        (root / "held.started").write_text("held")
        try:
            return await anyio.to_thread.run_sync(wait_for_read_release, abandon_on_cancel=True)
        except anyio.get_cancelled_exc_class():
            record("read held cancelled")
            raise

    @server.prompt(name="greet", description="Says hello")
    def greet() -> str:
        return "hello"

    @server.tool(description="Adds a resource and a prompt")
    async def add_note(ctx: Context) -> str:
        server.resource("files://added", name="added", mime_type="text/plain")(lambda: "added")
        server.prompt(name="added", description="Added later")(lambda: "added")
        await ctx.notify_resources_changed()
        await ctx.notify_prompts_changed()
        if ctx.protocol_version != "2026-07-28":
            await ctx.session.send_resource_list_changed()
            await ctx.session.send_prompt_list_changed()
        record("add_note")
        return "added"


if __name__ == "__main__":
    (root / "upstream.pid").write_text(str(os.getpid()))
    with (root / "upstream.pids").open("a") as pids:  # every process started, one a line
        pids.write(f"{os.getpid()}\n")
    server.run()
