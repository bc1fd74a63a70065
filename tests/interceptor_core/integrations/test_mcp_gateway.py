"""`callgate mcp-proxy` as a gateway in front of the reference server from npm
(`@modelcontextprotocol/server-everything`): everything the server offers behaves the same
through the proxy as directly when the policy allows it, and is refused with an event when it
does not; sampling, elicitation and roots requests from the server reach the test's client
through the gate. Over stdio (one proxy process per client) and streamable HTTP (one proxy
process for the module)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TextIO

import anyio
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError

from consumers.reader import FileReader
from consumers.store import AuditStore, RawRecord
from dashboard.data import BlockedFilters, load_blocked
from events import verify_chain
from interceptor_core.integrations.mcp import DENIED

from .test_mcp import DEADLINE_S, read_events
from .test_mcp_proxy import free_port

SERVERS = Path(__file__).parents[2] / "mcp_servers"
EVERYTHING = SERVERS / "node_modules" / "@modelcontextprotocol" / "server-everything" / "dist" / "index.js"

POLICY = """\
version: 1
name: gateway-policy
rules:
  - id: static-docs-only
    tools: [mcp.resources.read]
    when: "!args.uri.startsWith('demo://resource/static/')"
    decision: deny
    message: "Only the static documents may be read."
  - id: no-resource-prompt
    tools: [mcp.prompts.get]
    when: "args.name == 'resource-prompt'"
    decision: deny
    message: "That prompt embeds resources."
  - id: small-sampling
    tools: [mcp.sampling.createMessage]
    when: "args.maxTokens > 1000"
    decision: deny
    message: "Sampling is capped at 1000 tokens."
"""


@pytest.fixture(scope="session")
def everything() -> Path:
    """The server's entry point, installed from tests/mcp_servers/package-lock.json when missing."""
    if not EVERYTHING.exists():
        npm = shutil.which("npm")
        if npm is None:
            pytest.fail("npm is needed to install the reference MCP servers (make venv installs Node)")
        subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--silent"], cwd=SERVERS, check=True)
    return EVERYTHING


def direct_params(server: Path) -> StdioServerParameters:
    return StdioServerParameters(command="node", args=[str(server), "stdio"])


def proxy_args(server: Path, policy: Path, events: Path, *extra: str) -> list[str]:
    return [
        *("-m", "callgate.cli", "mcp-proxy", "--policy", str(policy), "--events", str(events), *extra),
        *("--", "node", str(server), "stdio"),
    ]


class Answers:
    """The test's client side: what it answers to sampling, elicitation and roots, and what it
    heard (progress, log messages, notifications)."""

    def __init__(self) -> None:
        self.sampled: list[types.CreateMessageRequestParams] = []
        self.elicited: list[Any] = []
        self.logs: list[types.LoggingMessageNotificationParams] = []
        self.notifications: list[object] = []

    async def sampling(self, ctx: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        self.sampled.append(params)
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text="sampled by the test"), model="test-model"
        )

    async def elicitation(self, ctx: Any, params: Any) -> types.ElicitResult:
        self.elicited.append(params)
        return types.ElicitResult(action="decline")

    async def roots(self, ctx: Any) -> types.ListRootsResult:
        return types.ListRootsResult(roots=[types.Root(uri="file:///srv/docs", name="docs")])

    async def log(self, params: types.LoggingMessageNotificationParams) -> None:
        self.logs.append(params)

    async def message(self, message: object) -> None:
        self.notifications.append(message)

    def options(self) -> dict[str, Any]:
        return {
            "sampling_callback": self.sampling,
            "elicitation_callback": self.elicitation,
            "list_roots_callback": self.roots,
            "logging_callback": self.log,
            "message_handler": self.message,
        }


class Gateway:
    """Where a test's events go, and how it connects directly or through the proxy."""

    def __init__(self, server: Path, tmp_path: Path, errlog: TextIO) -> None:
        self.server = server
        self.events = tmp_path / "events.jsonl"
        self.policy = tmp_path / "gateway.policy.yaml"
        self.policy.write_text(POLICY)
        self.errlog = errlog

    @asynccontextmanager
    async def direct(self, answers: Answers | None = None) -> AsyncIterator[Client]:
        options = (answers or Answers()).options()
        async with Client(stdio_client(direct_params(self.server), errlog=self.errlog), **options) as client:
            yield client

    @asynccontextmanager
    async def proxied(self, answers: Answers | None = None) -> AsyncIterator[Client]:
        params = StdioServerParameters(
            command=sys.executable, args=proxy_args(self.server, self.policy, self.events), env=dict(os.environ)
        )
        options = (answers or Answers()).options()
        async with Client(stdio_client(params, errlog=self.errlog), **options) as client:
            yield client

    def outcomes(self, count: int, *, roots: bool = False) -> list[Any]:
        """The outcome events, once there are `count` of them (all events checked for their chain).
        This server asks every client that can answer for its roots as soon as it connects, at a
        moment of its choosing: those crossings are left out unless `roots`."""

        def counted(event: Any) -> bool:
            return event.type != "ToolsRegistered" and (roots or event.crossing != "roots")

        found = read_events(self.events, lambda evs: sum(map(counted, evs)) >= count)
        assert verify_chain(found).ok
        return [e for e in found if counted(e)]


@pytest.fixture
def gateway(everything: Path, tmp_path: Path, errlog: TextIO) -> Gateway:
    return Gateway(everything, tmp_path, errlog)


def dump(model: Any) -> Any:
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


class TestWhatTheServerOffers:
    async def test_identity_instructions_and_capabilities_are_the_servers(self, gateway: Gateway) -> None:
        """serverInfo's name, version and title, the instructions and the capabilities a client
        sees through the proxy are the server's; the description says callgate serves it."""
        async with gateway.direct() as direct:
            info, instructions, caps = direct.server_info, direct.instructions, direct.server_capabilities
            version = direct.protocol_version
        async with gateway.proxied() as proxied:
            assert proxied.server_info is not None
            assert info is not None
            assert (proxied.server_info.name, proxied.server_info.version) == (info.name, info.version)
            assert proxied.server_info.title == info.title
            assert "callgate" in (proxied.server_info.description or "")
            assert proxied.instructions == instructions
            assert len(instructions or "") > 1000
            seen = proxied.server_capabilities
            assert seen.resources == caps.resources
            assert seen.prompts == caps.prompts
            assert (seen.logging is None, seen.completions is None) == (False, False)
            assert proxied.protocol_version == version

    async def test_lists_are_the_same_page_by_page(self, gateway: Gateway) -> None:
        """tools, resources, resource templates and prompts list the same through the proxy."""
        async with gateway.direct() as direct:
            expected = [
                dump(await direct.list_tools()),
                dump(await direct.list_resources()),
                dump(await direct.list_resource_templates()),
                dump(await direct.list_prompts()),
            ]
        async with gateway.proxied() as proxied:
            seen = [
                dump(await proxied.list_tools()),
                dump(await proxied.list_resources()),
                dump(await proxied.list_resource_templates()),
                dump(await proxied.list_prompts()),
            ]
        assert seen == expected
        # The tools a server shows only to clients that can sample, elicit or give roots are there.
        names = {tool["name"] for tool in seen[0]["tools"]}
        assert {"trigger-sampling-request", "trigger-elicitation-request", "get-roots-list"} <= names

    async def test_a_cursor_the_server_never_gave_gets_the_servers_own_answer(self, gateway: Gateway) -> None:
        """A cursor passes through to the server, whose answer comes back as it is (this server
        ignores cursors on resources/list; through the proxy the answer is the same)."""
        async with gateway.direct() as direct:
            expected = dump(await direct.list_resources(cursor="not-a-cursor", cache_mode="refresh"))
        async with gateway.proxied() as proxied:
            assert dump(await proxied.list_resources(cursor="not-a-cursor", cache_mode="refresh")) == expected

    async def test_prompts_and_completions_are_the_same(self, gateway: Gateway) -> None:
        """An allowed prompts/get and a completion answer as the server does directly."""

        async def ask(client: Client) -> list[Any]:
            prompt = await client.get_prompt("args-prompt", {"city": "Paris", "state": "Texas"})
            completion = await client.complete(
                types.PromptReference(type="ref/prompt", name="completable-prompt"),
                {"name": "department", "value": "E"},
            )
            return [dump(prompt), dump(completion)]

        async with gateway.direct() as direct:
            expected = await ask(direct)
        async with gateway.proxied() as proxied:
            assert await ask(proxied) == expected
        outcomes = gateway.outcomes(1)
        assert [(e.type, e.tool, e.crossing) for e in outcomes] == [("ToolUse", "mcp.prompts.get", "prompt")]
        assert outcomes[0].args == {"name": "args-prompt", "arguments": {"city": "Paris", "state": "Texas"}}


class TestDecisions:
    async def test_a_read_the_policy_allows_is_byte_identical_and_recorded(self, gateway: Gateway) -> None:
        """An allowed resources/read returns what the server returns directly (text and blob),
        and leaves a ToolUse with crossing resource."""
        uris = ["demo://resource/static/document/architecture.md"]
        async with gateway.direct() as direct:
            expected = [dump(await direct.read_resource(uri)) for uri in uris]
        async with gateway.proxied() as proxied:
            assert [dump(await proxied.read_resource(uri)) for uri in uris] == expected
        outcomes = gateway.outcomes(1)
        assert [(e.type, e.tool, e.crossing, e.args) for e in outcomes] == [
            ("ToolUse", "mcp.resources.read", "resource", {"uri": uris[0]})
        ]

    async def test_a_denied_read_never_reaches_the_server_and_is_recorded(self, gateway: Gateway) -> None:
        """A read outside the allowed prefix is the JSON-RPC error DENIED with the policy's
        message, and one ToolDenied event with crossing resource naming the rule."""
        uri = "demo://resource/dynamic/text/1"
        async with gateway.direct() as direct:
            assert (await direct.read_resource(uri)).contents  # the server would have answered
        async with gateway.proxied() as proxied:
            with pytest.raises(MCPError) as denied:
                await proxied.read_resource(uri)
        assert (denied.value.code, denied.value.error.message) == (DENIED, "Only the static documents may be read.")
        (event,) = gateway.outcomes(1)
        assert (event.type, event.tool, event.crossing, event.cause) == (
            "ToolDenied",
            "mcp.resources.read",
            "resource",
            "deny",
        )
        assert [rule.id for step in event.decisions for rule in step.rules] == ["static-docs-only"]

    async def test_the_blocked_attempts_page_lists_a_denied_read(self, gateway: Gateway, tmp_path: Path) -> None:
        """The proxy's events, stored as the materializer stores them, put the denied read on the
        dashboard's Blocked attempts page (its tool names the crossing)."""
        async with gateway.proxied() as proxied:
            with pytest.raises(MCPError):
                await proxied.read_resource("demo://resource/dynamic/text/7")
        (denied,) = gateway.outcomes(1)
        lines = [line.encode() for line in gateway.events.read_text().splitlines() if line.strip()]
        key = denied.producer_id.encode()
        records = [RawRecord("callgate.events", 0, i, key, line) for i, line in enumerate(lines)]
        with AuditStore(tmp_path / "audit.duckdb") as store:
            store.ingest(records, {("callgate.events", 0): len(records)})
        with FileReader(tmp_path / "audit.duckdb") as reader:
            page = load_blocked(lambda name, params: reader.query(name, params).rows, BlockedFilters())
        # (The server's roots request at connection, before any client could answer, is listed too.)
        listed = [(row["type"], row["tool"], row["message"]) for row in page.rows]
        assert ("ToolDenied", "mcp.resources.read", "Only the static documents may be read.") in listed

    async def test_a_crossings_gate_tool_is_no_tool(self, gateway: Gateway) -> None:
        """tools/call naming `mcp.resources.read` is refused as an unknown tool (and recorded):
        a client cannot reach a resource around the read's own decision."""
        async with gateway.proxied() as proxied:
            assert "mcp.resources.read" not in {tool.name for tool in (await proxied.list_tools()).tools}
            with pytest.raises(MCPError) as refused:
                await proxied.call_tool("mcp.resources.read", {"uri": "demo://resource/dynamic/text/1"})
        assert (refused.value.code, refused.value.error.message) == (-32602, "Unknown tool: mcp.resources.read")
        (event,) = gateway.outcomes(1)
        assert (event.type, event.tool, event.args) == ("ToolDenied", "mcp.resources.read", {})

    async def test_a_denied_prompt_is_refused_with_an_event(self, gateway: Gateway) -> None:
        """prompts/get of a prompt the policy refuses: DENIED, and a ToolDenied with crossing prompt."""
        async with gateway.proxied() as proxied:
            with pytest.raises(MCPError) as denied:
                await proxied.get_prompt("resource-prompt", {"resourceType": "Text", "resourceId": "1"})
        assert (denied.value.code, denied.value.error.message) == (DENIED, "That prompt embeds resources.")
        (event,) = gateway.outcomes(1)
        assert (event.type, event.crossing) == ("ToolDenied", "prompt")

    async def test_sampling_reaches_the_client_through_the_gate(self, gateway: Gateway) -> None:
        """A sampling request the server makes during a tool call is answered by the test's
        client, through the gate: the tool's result carries the client's text, and the audit
        holds the sampling (ToolUse, crossing sampling) before the tool call's outcome."""
        answers = Answers()
        async with gateway.proxied(answers) as proxied:
            result = await proxied.call_tool("trigger-sampling-request", {"prompt": "hello", "maxTokens": 50})
        assert not result.is_error
        assert "sampled by the test" in str(dump(result))
        assert len(answers.sampled) == 1
        assert answers.sampled[0].max_tokens == 50
        outcomes = gateway.outcomes(2)
        assert [(e.type, e.tool, e.crossing) for e in outcomes] == [
            ("ToolUse", "mcp.sampling.createMessage", "sampling"),
            ("ToolUse", "trigger-sampling-request", None),
        ]
        assert "maxTokens" in (outcomes[0].args or {})

    async def test_sampling_the_policy_refuses_never_reaches_the_client(self, gateway: Gateway) -> None:
        """Over the token cap, the client is never asked; the server gets an error (which its
        tool reports) and the audit holds the denied sampling."""
        answers = Answers()
        async with gateway.proxied(answers) as proxied:
            result = await proxied.call_tool("trigger-sampling-request", {"prompt": "hello", "maxTokens": 5000})
        assert answers.sampled == []
        assert "Sampling is capped at 1000 tokens." in str(dump(result))
        outcomes = gateway.outcomes(2)
        assert next((e.type, e.crossing) for e in outcomes) == ("ToolDenied", "sampling")

    async def test_elicitation_and_roots_reach_the_client(self, gateway: Gateway) -> None:
        """elicitation/create and roots/list from the server are answered by the test's client."""
        answers = Answers()
        async with gateway.proxied(answers) as proxied:
            elicited = await proxied.call_tool("trigger-elicitation-request", {})
            roots = await proxied.call_tool("get-roots-list", {})
        assert len(answers.elicited) == 1
        assert "decline" in str(dump(elicited)).lower()
        assert "file:///srv/docs" in str(dump(roots))
        # When the server asks is its own affair (at its start, before any client, it is refused
        # and recorded); once this client is connected its answer goes through the gate.
        found = gateway.outcomes(4, roots=True)
        assert "ToolUse" in [e.type for e in found if e.crossing == "roots"]
        kinds = [e.crossing for e in found]
        assert "elicitation" in kinds
        assert "roots" in kinds


class TestWhatFlowsBack:
    async def test_progress_reaches_the_client_as_directly(self, gateway: Gateway) -> None:
        """A tool call with a progress callback hears the same progress steps through the proxy."""

        async def steps(client: Client) -> list[float]:
            heard: list[float] = []

            async def progress(value: float, total: float | None, message: str | None) -> None:
                heard.append(value)

            await client.call_tool(
                "trigger-long-running-operation", {"duration": 0.3, "steps": 3}, progress_callback=progress
            )
            return heard

        async with gateway.direct() as direct:
            expected = await steps(direct)
        async with gateway.proxied() as proxied:
            seen = await steps(proxied)
        assert len(expected) == 3
        assert seen == expected

    # The client's setLevel is deprecated in the newest protocol; this server speaks an older one.
    @pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")
    async def test_log_messages_reach_the_client(self, gateway: Gateway) -> None:
        """logging/setLevel is relayed, and the server's log messages reach the client."""
        answers = Answers()
        async with gateway.proxied(answers) as proxied:
            await proxied.set_logging_level("debug")
            await proxied.call_tool("toggle-simulated-logging", {})
            with anyio.fail_after(DEADLINE_S):
                while not answers.logs:
                    await anyio.sleep(0.05)
            await proxied.call_tool("toggle-simulated-logging", {})
        assert answers.logs[0].level in {
            "debug",
            "info",
            "notice",
            "warning",
            "error",
            "critical",
            "alert",
            "emergency",
        }

    # Subscriptions are deprecated in the newest protocol; this server speaks an older one.
    @pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")
    async def test_resource_updates_reach_the_subscribed_client(self, gateway: Gateway) -> None:
        """resources/subscribe is relayed, and the server's update of that URI reaches the client."""
        answers = Answers()
        uri = "demo://resource/static/document/architecture.md"
        async with gateway.proxied(answers) as proxied:
            await proxied.subscribe_resource(uri)
            await proxied.call_tool("toggle-subscriber-updates", {})
            with anyio.fail_after(DEADLINE_S):
                while not any(isinstance(n, types.ResourceUpdatedNotification) for n in answers.notifications):
                    await anyio.sleep(0.05)
            await proxied.call_tool("toggle-subscriber-updates", {})
        updates = [n for n in answers.notifications if isinstance(n, types.ResourceUpdatedNotification)]
        assert updates[0].params.uri == uri


@pytest.fixture(scope="module")
def http_gateway(everything: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, int]]:
    where = tmp_path_factory.mktemp("http-gateway")
    policy, events = where / "gateway.policy.yaml", where / "events.jsonl"
    policy.write_text(POLICY)
    port = free_port()
    with (where / "stderr.log").open("wb") as err:
        process = subprocess.Popen(
            [sys.executable, *proxy_args(everything, policy, events, "--http", f"127.0.0.1:{port}")],
            stdin=subprocess.DEVNULL,
            stdout=err,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for_line(where / "stderr.log", "listening on", process)
        yield f"http://127.0.0.1:{port}/mcp", events, process.pid
    finally:
        process.terminate()
        process.wait(timeout=DEADLINE_S)


class TestStreamableHttp:
    """One proxy process over HTTP for the module; each test its own client session."""

    async def test_reads_prompts_and_sampling_over_http(
        self, http_gateway: tuple[str, Path, int], gateway: Gateway
    ) -> None:
        """Over streamable HTTP: the lists, an allowed and a denied read, and a sampling round
        trip behave as over stdio."""
        url, _events, _pid = http_gateway
        async with gateway.direct() as direct:
            expected = dump(await direct.list_resources())
            doc = dump(await direct.read_resource("demo://resource/static/document/architecture.md"))
            caps = direct.server_capabilities
        answers = Answers()
        async with Client(url, **answers.options()) as client:
            # List changes are advertised over HTTP as over stdio, as the server advertises them.
            assert (client.server_capabilities.resources, client.server_capabilities.prompts) == (
                caps.resources,
                caps.prompts,
            )
            assert client.server_capabilities.tools == caps.tools
            assert dump(await client.list_resources()) == expected
            assert dump(await client.read_resource("demo://resource/static/document/architecture.md")) == doc
            with pytest.raises(MCPError) as denied:
                await client.read_resource("demo://resource/dynamic/text/1")
            assert denied.value.code == DENIED
            sampled = await client.call_tool("trigger-sampling-request", {"prompt": "hi", "maxTokens": 10})
        assert "sampled by the test" in str(dump(sampled))
        assert len(answers.sampled) == 1


LEVELS = ["debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"]


def upstreams_of(pid: int) -> set[int]:
    """The server-everything processes the process `pid` has started and not yet reaped."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue  # gone while read
        if int(fields[1]) == pid and fields[0] != "Z" and b"server-everything" in cmdline:
            found.add(int(stat.parent.name))
    return found


async def wait_for(check: Any) -> None:
    with anyio.fail_after(DEADLINE_S):
        while not check():
            await anyio.sleep(0.05)  # sleep-ok: polling with a deadline


class TestEachClientItsOwnSession:
    """Each HTTP client session gets its own upstream session, declaring exactly what the client
    declared: two concurrent SDK clients, one that can sample, elicit and give roots, one that
    cannot, and a third like the first."""

    # The client's setLevel is deprecated in the newest protocol; this server speaks an older one.
    @pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")
    async def test_capabilities_server_requests_and_log_levels_are_per_client(
        self, http_gateway: tuple[str, Path, int]
    ) -> None:
        url, _events, pid = http_gateway
        able, other = Answers(), Answers()
        plain = Answers()
        plain_options = {"logging_callback": plain.log, "message_handler": plain.message}
        before = upstreams_of(pid)
        async with (
            Client(url, **able.options()) as first,
            Client(url, **plain_options) as second,
            Client(url, **other.options()) as third,
        ):
            # One upstream process per client session.
            # (Counted as new processes: an earlier test's session may still be closing its own.)
            await wait_for(lambda: len(upstreams_of(pid) - before) == 3)
            ours = upstreams_of(pid) - before
            gated = {"trigger-sampling-request", "trigger-elicitation-request", "get-roots-list"}
            assert gated <= {tool.name for tool in (await first.list_tools()).tools}
            assert gated.isdisjoint({tool.name for tool in (await second.list_tools()).tools})
            # Two sampling requests at once: each reaches the client whose call triggered it.
            async with anyio.create_task_group() as tasks:
                for client, prompt in ((first, "from first"), (third, "from third")):
                    tasks.start_soon(client.call_tool, "trigger-sampling-request", {"prompt": prompt, "maxTokens": 9})
            assert ["from first" in str(dump(p)) for p in able.sampled] == [True]
            assert ["from third" in str(dump(p)) for p in other.sampled] == [True]
            # The last setLevel is the second client's, and holds for it alone.
            await first.set_logging_level("debug")
            await second.set_logging_level("emergency")
            await first.call_tool("toggle-simulated-logging", {})
            await second.call_tool("toggle-simulated-logging", {})
            # This server logs a level drawn at random every 5 s, filtered by the session's level.
            await wait_for(lambda: any(entry.level != "emergency" for entry in able.logs))
            assert {entry.level for entry in plain.logs} <= {"emergency"}
            await first.call_tool("toggle-simulated-logging", {})
            await second.call_tool("toggle-simulated-logging", {})
        # A session that ends closes its upstream process.
        await wait_for(lambda: not upstreams_of(pid) & ours)


def wait_for_line(path: Path, text: str, process: subprocess.Popen[bytes]) -> None:
    """Return once `path` holds `text`; fail with what it holds if the process exits first or the
    deadline passes."""
    import time

    deadline = time.monotonic() + DEADLINE_S
    while text not in path.read_text(errors="replace"):
        if process.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"no {text!r} (exit {process.poll()}):\n{path.read_text(errors='replace')}")
        time.sleep(0.05)  # sleep-ok: polling a file another process writes, with a deadline
