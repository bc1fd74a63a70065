"""`callgate mcp-proxy` in front of a server on the newest protocol (the Python server of
`mcp_upstream.py` with its resources and prompts): resources and prompts list changes reach the
client on either protocol era, a resource read's progress reaches the client as it does
directly, and a read in flight that the client cancels is cancelled at the server and recorded."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TextIO

import anyio
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.subscriptions import listen

from events import verify_chain

from .conftest import effects, upstream_command
from .test_mcp import DEADLINE_S, proxy_params, read_events
from .test_mcp_proxy_hostile import release


@pytest.fixture
def resources_root(root: Path) -> Iterator[Path]:
    os.mkfifo(root / "release.fifo")
    yield root
    release(root)  # a read a failed test left waiting must not hold its upstream forever


@asynccontextmanager
async def proxied(root: Path, events: Path, errlog: TextIO, **options: Any) -> AsyncIterator[Client]:
    params = proxy_params(root, events)
    params = params.model_copy(update={"env": {**(params.env or {}), "UPSTREAM_RESOURCES": "1"}})
    async with Client(stdio_client(params, errlog=errlog), **options) as client:
        yield client


async def wait_until(check: Any) -> None:
    with anyio.fail_after(DEADLINE_S):
        while not check():
            await anyio.sleep(0.02)  # sleep-ok: polling with a deadline


async def test_list_changes_reach_a_client_of_the_newest_protocol(
    resources_root: Path, tmp_path: Path, errlog: TextIO
) -> None:
    """On a listen stream: the resources and the prompts list changed, and the new entries list."""
    async with proxied(resources_root, tmp_path / "events.jsonl", errlog) as client:
        assert client.session.protocol_version == "2026-07-28"
        heard: list[object] = []
        async with anyio.create_task_group() as tasks:

            async def follow(*, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
                async with listen(client.session, resources_list_changed=True, prompts_list_changed=True) as changes:
                    task_status.started()
                    async for event in changes:
                        heard.append(type(event).__name__)

            await tasks.start(follow)
            await client.call_tool("add_note", {})
            await wait_until(lambda: {"ResourcesListChanged", "PromptsListChanged"} <= set(heard))
            tasks.cancel_scope.cancel()
        assert "files://added" in {r.uri for r in (await client.list_resources(cache_mode="refresh")).resources}
        assert "added" in {p.name for p in (await client.list_prompts(cache_mode="refresh")).prompts}


async def test_list_changes_reach_a_client_of_the_handshake_era(
    resources_root: Path, tmp_path: Path, errlog: TextIO
) -> None:
    """As notifications, to a client that initialized (it has an upstream session of its own)."""
    heard: list[object] = []

    async def message(item: object) -> None:
        heard.append(type(item).__name__)

    async with proxied(resources_root, tmp_path / "events.jsonl", errlog, mode="legacy", message_handler=message) as c:
        await c.call_tool("add_note", {})
        await wait_until(lambda: {"ResourceListChangedNotification", "PromptListChangedNotification"} <= set(heard))
        assert "files://added" in {r.uri for r in (await c.list_resources()).resources}


async def progress_steps(client: Client) -> list[tuple[float, float | None, str | None]]:
    heard: list[tuple[float, float | None, str | None]] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        heard.append((value, total, message))

    request = types.ReadResourceRequest(params=types.ReadResourceRequestParams(uri="files://slow/3"))
    result = await client.session.send_request(request, types.ReadResourceResult, progress_callback=progress)
    assert "read slowly" in str(result.contents)
    return heard


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_reads_progress_reaches_the_client_as_directly(
    resources_root: Path, tmp_path: Path, errlog: TextIO, mode: str
) -> None:
    """The three progress steps of a resource read arrive through the proxy as they do directly."""
    command = upstream_command()
    env = {**os.environ, "UPSTREAM_ROOT": str(resources_root), "UPSTREAM_RESOURCES": "1"}
    direct = StdioServerParameters(command=command[0], args=command[1:], env=env)
    async with Client(stdio_client(direct, errlog=errlog), mode=mode) as client:
        expected = await progress_steps(client)
    assert [step[0] for step in expected] == [1, 2, 3]
    async with proxied(resources_root, tmp_path / "events.jsonl", errlog, mode=mode) as client:
        assert await progress_steps(client) == expected


async def test_a_read_in_flight_cancelled_is_cancelled_at_the_server_and_recorded(
    resources_root: Path, tmp_path: Path, errlog: TextIO
) -> None:
    """The client gives up on a read the server holds: the server's read is cancelled, and the
    read's one outcome event says cancelled."""
    events = tmp_path / "events.jsonl"
    async with proxied(resources_root, events, errlog) as client:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(client.read_resource, "files://held")
            await wait_until((resources_root / "held.started").exists)
            tasks.cancel_scope.cancel()
        await wait_until(lambda: "read held cancelled" in effects(resources_root))
        found = read_events(events, lambda evs: any(e.tool == "mcp.resources.read" for e in evs))
    outcomes = [(e.type, e.tool, e.crossing, e.outcome) for e in found if e.type != "ToolsRegistered"]
    assert outcomes == [("ToolUse", "mcp.resources.read", "resource", "cancelled")]
    assert verify_chain(found).ok
