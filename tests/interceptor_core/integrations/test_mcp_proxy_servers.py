"""`callgate mcp-proxy --config`: one gateway in front of several real MCP servers over stdio (two
instances of `@modelcontextprotocol/server-everything`, the Python files server of
`mcp_upstream.py`, and a server whose command does not exist). Names are prefixed per server,
calls reach the server they name, each server has its own agent scope a policy can target, and a
server that fails or dies is refused on its own tools (with an event) while the others serve on;
one reached over HTTP that is killed and started again is served again by itself."""

from __future__ import annotations

import base64
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TextIO

import anyio
import httpx
import mcp_types as types
import pytest
import yaml
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.subscriptions import listen
from mcp.shared.exceptions import MCPError

from events import verify_chain
from interceptor_core.integrations.mcp import DENIED

from .conftest import HERE, UPSTREAM, effects
from .test_mcp import DEADLINE_S, read_events, text_of
from .test_mcp_gateway import EVERYTHING, SERVERS, Answers, direct_params, wait_for_line
from .test_mcp_proxy import free_port

POLICY = """\
version: 1
name: per-server
rules:
  - id: files-keep-files
    tools: ["*__delete_file"]
    when: "scope.agent == 'files'"
    decision: deny
    message: "The files server may not delete."
  - id: beta-no-prompts
    tools: [mcp.prompts.get]
    when: "scope.agent == 'beta'"
    decision: deny
    message: "No prompts from beta."
"""


class Setup:
    """A config of four servers (alpha and beta: server-everything; files: the Python server;
    broken: a command that does not exist), a policy, and where the events go."""

    def __init__(self, everything: Path, root: Path, tmp_path: Path, errlog: TextIO) -> None:
        self.everything = everything
        self.root = root
        self.events = tmp_path / "events.jsonl"
        self.errlog = errlog
        self.stderr = tmp_path / "stderr.log"
        self.policy = tmp_path / "servers.policy.yaml"
        self.policy.write_text(POLICY)
        self.config = tmp_path / "servers.yaml"
        node = ["node", str(everything), "stdio"]
        servers = [
            {"name": "alpha", "command": node},
            {"name": "beta", "command": node},
            {"name": "files", "command": [sys.executable, str(UPSTREAM)], "env": {"UPSTREAM_ROOT": str(root)}},
            {"name": "broken", "command": [str(tmp_path / "no-such-server")]},
        ]
        self.config.write_text(yaml.safe_dump({"servers": servers}))

    def args(self, *extra: str) -> list[str]:
        return [
            *("-m", "callgate.cli", "mcp-proxy", "--policy", str(self.policy), "--events", str(self.events)),
            *("--config", str(self.config), *extra),
        ]

    @asynccontextmanager
    async def proxied(self, **options: Any) -> AsyncIterator[Client]:
        env = {**os.environ, "PYTHONPATH": str(HERE)}
        params = StdioServerParameters(command=sys.executable, args=self.args(), env=env)
        async with Client(stdio_client(params, errlog=self.errlog), **options) as client:
            yield client

    def events_until(self, until: Any) -> list[Any]:
        found = read_events(self.events, until)
        assert verify_chain(found).ok
        return [e for e in found if e.type != "ToolsRegistered"]


@pytest.fixture(scope="session")
def everything() -> Path:
    """The server's entry point, installed from tests/mcp_servers/package-lock.json when missing."""
    if not EVERYTHING.exists():
        npm = shutil.which("npm")
        if npm is None:
            pytest.fail("npm is needed to install the reference MCP servers (make venv installs Node)")
        subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--silent"], cwd=SERVERS, check=True)
    return EVERYTHING


@pytest.fixture
def setup(everything: Path, root: Path, tmp_path: Path, errlog: TextIO) -> Setup:
    return Setup(everything, root, tmp_path, errlog)


async def pages(client: Client, kind: str, cursor: str | None = None) -> list[Any]:
    """Every page of a list (`tools`, `resources`, `prompts`), following the cursors from `cursor`."""
    found = []
    while True:
        page = await getattr(client, f"list_{kind}")(cursor=cursor, cache_mode="refresh")
        found.append(page)
        cursor = page.next_cursor
        if cursor is None:
            return found


async def direct_tools(everything: Path) -> list[types.Tool]:
    async with Client(stdio_client(direct_params(everything), errlog=sys.stderr)) as direct:
        return list((await direct.list_tools()).tools)


async def test_every_servers_tools_are_listed_under_its_prefix(setup: Setup) -> None:
    """alpha's and beta's tools (the same server twice) do not collide: each is listed once under
    its server's prefix, with the server's own definition; files' tools too; broken has none."""
    expected = await direct_tools(setup.everything)
    async with setup.proxied() as proxied:
        listed = {tool.name: tool for page in await pages(proxied, "tools") for tool in page.tools}
    for server in ("alpha", "beta"):
        for tool in expected:
            seen = listed[f"{server}__{tool.name}"]
            assert seen.input_schema == tool.input_schema
            assert seen.description == tool.description
    assert {"files__write_file", "files__delete_file"} <= set(listed)
    assert len(listed) == 2 * len(expected) + sum(name.startswith("files__") for name in listed)
    assert not [name for name in listed if name.startswith("broken__") or "__" not in name]


async def test_calls_reach_the_server_they_name_in_its_own_scope(setup: Setup) -> None:
    """alpha__echo is answered by an everything server, files__write_file by the files server
    (its effect is on disk); each call's event names the server as its agent scope."""
    async with setup.proxied() as proxied:
        echoed = await proxied.call_tool("beta__echo", {"message": "hello beta"})
        written = await proxied.call_tool("files__write_file", {"path": "new.txt", "text": "hi"})
    assert not echoed.is_error
    assert "hello beta" in text_of(echoed)
    assert not written.is_error
    assert (setup.root / "new.txt").read_text() == "hi"
    found = setup.events_until(lambda evs: sum(e.type == "ToolUse" for e in evs) >= 2)
    agents = {e.tool: e.agent for e in found if e.type == "ToolUse"}
    assert agents == {"beta__echo": "beta", "files__write_file": "files"}


async def test_a_policy_targets_one_server_by_its_scope(setup: Setup) -> None:
    """The policy denies deleting on the files server (by `scope.agent`): the file stays, the
    model reads the rule's message, the event names the rule; alpha's prompts pass and beta's
    are refused, though both servers offer the same prompt."""
    async with setup.proxied() as proxied:
        denied = await proxied.call_tool("files__delete_file", {"path": "precious.txt"})
        prompt = await proxied.get_prompt("alpha__simple-prompt")
        with pytest.raises(MCPError) as refused:
            await proxied.get_prompt("beta__simple-prompt")
        prompts = {p.name for page in await pages(proxied, "prompts") for p in page.prompts}
    assert denied.is_error
    assert "may not delete" in text_of(denied)
    assert (setup.root / "precious.txt").read_text() == "keep me"
    assert "delete" not in " ".join(effects(setup.root))
    assert prompt.messages
    assert refused.value.error.code == DENIED
    assert {"alpha__simple-prompt", "beta__simple-prompt"} <= prompts
    found = setup.events_until(lambda evs: sum(e.type == "ToolDenied" for e in evs) >= 2)
    denials = {(e.agent, e.tool): e for e in found if e.type == "ToolDenied"}
    assert "files-keep-files" in str(denials["files", "files__delete_file"].decisions)
    assert denials["beta", "mcp.prompts.get"].crossing == "prompt"


async def test_resources_are_read_from_the_server_that_listed_them(setup: Setup) -> None:
    """Resource URIs are kept as the servers list them; a read goes through the gate in the scope
    of the server that listed the URI; a URI no server listed is refused with an event."""
    async with setup.proxied() as proxied:
        listed = [r for page in await pages(proxied, "resources") for r in page.resources]
        uri = next(r.uri for r in listed if r.uri.startswith("demo://resource/static/"))
        read = await proxied.read_resource(uri)
        with pytest.raises(MCPError) as unknown:
            await proxied.read_resource("demo://nobody/lists/this")
    assert read.contents
    assert read.contents[0].uri == uri
    assert "list resources first" in unknown.value.error.message
    found = setup.events_until(lambda evs: sum(getattr(e, "crossing", None) == "resource" for e in evs) >= 2)
    reads = [e for e in found if getattr(e, "crossing", None) == "resource"]
    assert [(e.type, e.agent) for e in reads] == [("ToolUse", "alpha"), ("ToolDenied", "mcp-proxy")]


async def test_a_server_that_does_not_start_is_refused_on_its_own_tools(setup: Setup) -> None:
    """broken's command does not exist: the gateway says so on stderr and serves the others; a
    call of a broken__ tool answers a tool error naming the server, with a ToolDenied event in
    broken's scope."""
    async with setup.proxied() as proxied:
        refused = await proxied.call_tool("broken__anything", {})
        echoed = await proxied.call_tool("alpha__echo", {"message": "still here"})
    assert refused.is_error
    assert "'broken' is unavailable" in text_of(refused)
    assert "not found" in text_of(refused)
    assert "still here" in text_of(echoed)
    found = setup.events_until(lambda evs: any(e.type == "ToolDenied" for e in evs))
    denied = [e for e in found if e.type == "ToolDenied"]
    assert [(e.agent, e.tool) for e in denied] == [("broken", "broken__anything")]
    setup.errlog.flush()
    said = await anyio.Path(setup.errlog.name).read_text()
    assert "server broken upstream command" in said


async def test_a_server_that_dies_is_refused_while_the_others_serve_on(setup: Setup) -> None:
    """The files server is killed while the gateway serves: its tools answer an error naming it
    (each call leaves an event) and leave tools/list, the everything servers still answer, files'
    effects stop."""
    async with setup.proxied() as proxied:
        first = await proxied.call_tool("files__write_file", {"path": "a.txt", "text": "a"})
        assert not first.is_error
        pid = int((setup.root / "upstream.pid").read_text())
        os.kill(pid, signal.SIGKILL)
        answers = [await proxied.call_tool("files__write_file", {"path": "b.txt", "text": "b"}) for _ in range(2)]
        echoed = await proxied.call_tool("alpha__echo", {"message": "alive"})
        listed = [tool.name for page in await pages(proxied, "tools") for tool in page.tools]
    assert not [name for name in listed if name.startswith("files__")]
    assert "alpha__echo" in listed
    assert all(answer.is_error for answer in answers)
    assert "'files' is unavailable" in text_of(answers[-1])
    assert "alive" in text_of(echoed)
    assert not (setup.root / "b.txt").exists()
    found = setup.events_until(lambda evs: sum(e.tool == "files__write_file" for e in evs) >= 3)
    files_calls = [e for e in found if e.tool == "files__write_file"]
    assert [e.agent for e in files_calls] == ["files"] * 3
    assert (files_calls[0].type, files_calls[0].outcome) == ("ToolUse", "ok")
    assert all(e.type == "ToolDenied" or e.outcome == "error" for e in files_calls[1:])


@pytest.mark.parametrize(
    ("config", "said"),
    [
        ({"servers": [{"name": "a__b", "command": ["x"]}]}, "servers[0]: name must be"),
        ({"servers": [{"name": "a", "command": ["x"]}, {"name": "a", "command": ["y"]}]}, "given twice"),
        ({"servers": [{"name": "a", "command": []}]}, "command must be a non-empty list"),
        ({"servers": [{"name": "a", "command": ["x"], "cwd": "/"}]}, "unknown key 'cwd'"),
        ({"upstreams": []}, "the one key 'servers'"),
        ({"servers": [{"name": "mcp-proxy", "command": ["x"]}]}, "the gateway's own agent scope"),
        ({"servers": [{"name": "gone", "command": ["/no/such/program"]}]}, "no server of the config started"),
        ({"servers": [{"name": "a"}]}, "give either command (a server to start) or url"),
        ({"servers": [{"name": "a", "command": ["x"], "url": "http://h/mcp"}]}, "give either command"),
        ({"servers": [{"name": "a", "url": "ftp://h/mcp"}]}, "url must be an http:// or https:// URL"),
        ({"servers": [{"name": "a", "url": "http://h/mcp", "headers": {"X": 1}}]}, "headers must be a mapping"),
    ],
)
def test_config_errors_exit_2_with_one_line(setup: Setup, config: dict[str, Any], said: str) -> None:
    setup.config.write_text(yaml.safe_dump(config))
    done = subprocess.run(
        [sys.executable, *setup.args()], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, done.stderr
    assert said in lines[0]


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (("--", "node", "server.js"), "give no command after --"),
        (("--http", "0.0.0.0:8808"), "is not a loopback address: give --tokens FILE or --jwt-jwks"),
    ],
)
def test_config_refuses_what_it_cannot_serve(setup: Setup, extra: tuple[str, ...], said: str) -> None:
    """A command after -- does not go with --config, and HTTP off loopback needs authentication
    as without it: exit 2 with one line."""
    done = subprocess.run(
        [sys.executable, *setup.args(*extra)], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]
    assert said in done.stderr


def test_a_server_that_never_answers_is_given_up_on_after_the_startup_timeout(setup: Setup) -> None:
    """A server that starts but never answers the handshake is reported after --startup-timeout;
    with no other server, that is a startup error (exit 2, one line naming it)."""
    silent = [sys.executable, "-c", "import sys; sys.stdin.read()"]
    setup.config.write_text(yaml.safe_dump({"servers": [{"name": "silent", "command": silent}]}))
    done = subprocess.run(
        [sys.executable, *setup.args("--startup-timeout", "1")],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert lines == ["error: no server of the config started: silent did not answer as an MCP server within 1 s"]


async def test_several_servers_over_http(setup: Setup) -> None:
    """`--http` with `--config`: an SDK client over streamable HTTP lists every server's tools
    under its prefix and reaches each server, a failing server is refused on its own tools, and
    SIGTERM ends the proxy with exit 0 and every event written."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(HERE)}
    with setup.stderr.open("wb") as err:
        process = subprocess.Popen(
            [sys.executable, *setup.args("--http", f"127.0.0.1:{port}")],
            stdin=subprocess.DEVNULL,
            stdout=err,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        wait_for_line(setup.stderr, "listening on", process)
        async with Client(f"http://127.0.0.1:{port}/mcp") as client:
            names = {tool.name for page in await pages(client, "tools") for tool in page.tools}
            assert {"alpha__echo", "beta__echo", "files__write_file"} <= names
            echoed = await client.call_tool("alpha__echo", {"message": "over http"})
            written = await client.call_tool("files__write_file", {"path": "http.txt", "text": "hi"})
            broken = await client.call_tool("broken__anything", {})
        assert "over http" in text_of(echoed)
        assert not written.is_error
        assert (setup.root / "http.txt").read_text() == "hi"
        assert broken.is_error
        assert "MCP server 'broken' is unavailable" in text_of(broken)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=DEADLINE_S) == 0, setup.stderr.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    found = setup.events_until(lambda evs: sum(e.type != "ToolsRegistered" for e in evs) >= 3)
    assert sorted((e.type, e.tool, e.agent) for e in found) == [
        ("ToolDenied", "broken__anything", "broken"),
        ("ToolUse", "alpha__echo", "alpha"),
        ("ToolUse", "files__write_file", "files"),
    ]


async def test_lists_come_page_by_page_with_the_gateways_cursors(setup: Setup) -> None:
    """Each page is one server's own page: the files server pages its tools one by one, and the
    gateway's cursors walk every server's pages in order; a cursor it never gave is invalid
    params, not echoed."""
    config = yaml.safe_load(setup.config.read_text())
    config["servers"][2]["env"]["UPSTREAM_PAGE_SIZE"] = "1"
    setup.config.write_text(yaml.safe_dump(config))
    async with setup.proxied() as proxied:
        walked = await pages(proxied, "tools")
        bogus = "bogus-cursor-" + "x" * 40
        with pytest.raises(MCPError) as forged:
            await proxied.list_tools(cursor=bogus, cache_mode="refresh")
        with pytest.raises(MCPError) as unknown_server:
            await proxied.list_prompts(cursor=base64.urlsafe_b64encode(b'["nobody", null]').decode())
    servers = [{tool.name.split("__")[0] for tool in page.tools} for page in walked]
    assert servers == [{"alpha"}, {"beta"}, {"files"}, {"files"}, {"files"}]
    assert [len(page.tools) for page in walked[2:]] == [1, 1, 1]
    for error in (forged.value, unknown_server.value):
        assert error.code == -32602
        assert error.error.message == "Invalid params: the cursor is not one this gateway gave"
    assert "bogus" not in str(forged.value)


async def test_each_servers_identity_and_instructions_and_completion(setup: Setup) -> None:
    """The gateway's instructions say which server says what (each server's serverInfo and its
    own instructions, a server that did not start as unavailable), and a completion of a prompt
    goes to its server, answered as the server answers directly."""
    ref = types.PromptReference(type="ref/prompt", name="completable-prompt")
    async with Client(stdio_client(direct_params(setup.everything), errlog=setup.errlog)) as direct:
        info, instructions = direct.server_info, direct.instructions
        expected = await direct.complete(ref, {"name": "department", "value": "E"})
    assert info is not None
    assert instructions
    async with setup.proxied() as proxied:
        said = proxied.instructions or ""
        completed = await proxied.complete(
            ref.model_copy(update={"name": "beta__completable-prompt"}), {"name": "department", "value": "E"}
        )
        with pytest.raises(MCPError) as unknown:
            await proxied.complete(
                ref.model_copy(update={"name": "nobody__completable-prompt"}), {"name": "department", "value": "E"}
            )
    for server in ("alpha", "beta"):
        assert f"Server {server} is {info.name} {info.version}" in said
        assert f"Instructions of server {server}:\n{instructions}" in said
    assert "Server broken: unavailable (upstream command" in said
    assert completed == expected
    assert unknown.value.code == -32602


async def until(check: Any) -> None:
    with anyio.fail_after(DEADLINE_S):
        while not check():
            await anyio.sleep(0.05)  # sleep-ok: polling with a deadline


# Subscriptions and setLevel are deprecated in the newest protocol; server-everything speaks an older one.
# About 20 s on a loaded machine: server-everything sends a subscription's updates every 5 s, and two
# gateway processes start (with the client's own session of each server).
@pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")
async def test_each_server_reaches_the_client_as_it_would_directly(setup: Setup) -> None:
    """Per server, through the gate and in its scope: sampling, elicitation and roots requests
    reach the client (whose capabilities each server sees, so it lists the tools that need them);
    a resource subscription's updates, log messages after setLevel, tools, resources and prompts
    list changes (a tool added later is then called) and a read's progress reach it too. A client
    that declares nothing is not shown those tools."""
    files = {"UPSTREAM_ROOT": str(setup.root), "UPSTREAM_RESOURCES": "1"}
    servers = [
        {"name": "alpha", "command": ["node", str(setup.everything), "stdio"]},
        {"name": "files", "command": [sys.executable, str(UPSTREAM)], "env": files},
    ]
    setup.config.write_text(yaml.safe_dump({"servers": servers}))
    answers = Answers()
    uri = "demo://resource/static/document/architecture.md"
    async with setup.proxied(**answers.options()) as proxied:
        names = {tool.name for page in await pages(proxied, "tools") for tool in page.tools}
        assert {"alpha__trigger-sampling-request", "alpha__get-roots-list"} <= names
        sampled = await proxied.call_tool("alpha__trigger-sampling-request", {"prompt": "hi", "maxTokens": 9})
        elicited = await proxied.call_tool("alpha__trigger-elicitation-request", {})
        roots = await proxied.call_tool("alpha__get-roots-list", {})
        await proxied.subscribe_resource(uri)
        await proxied.call_tool("alpha__toggle-subscriber-updates", {})
        await proxied.set_logging_level("debug")
        await proxied.call_tool("alpha__toggle-simulated-logging", {})
        await proxied.call_tool("files__add_note", {})
        await proxied.call_tool("files__enable_archive", {})
        heard = {
            "ResourceUpdatedNotification",
            "ResourceListChangedNotification",
            "PromptListChangedNotification",
            "ToolListChangedNotification",
        }
        await until(lambda: answers.logs and {type(n).__name__ for n in answers.notifications} >= heard)
        steps: list[float] = []

        async def progress(value: float, total: float | None, message: str | None) -> None:
            steps.append(value)

        read = types.ReadResourceRequest(params=types.ReadResourceRequestParams(uri="files://slow/3"))
        await proxied.session.send_request(read, types.ReadResourceResult, progress_callback=progress)
        archived = await proxied.call_tool("files__archive_file", {"path": "old.txt"})
        await proxied.call_tool("alpha__toggle-subscriber-updates", {})
        await proxied.call_tool("alpha__toggle-simulated-logging", {})
        resources = {r.uri for page in await pages(proxied, "resources") for r in page.resources}
        prompts = {p.name for page in await pages(proxied, "prompts") for p in page.prompts}
    assert "sampled by the test" in text_of(sampled)
    assert len(answers.sampled) == len(answers.elicited) == 1
    assert "decline" in str(elicited.model_dump()).lower()
    assert "file:///srv/docs" in text_of(roots)
    updated = [n for n in answers.notifications if isinstance(n, types.ResourceUpdatedNotification)]
    assert updated[0].params.uri == uri
    assert {"files://added", uri} <= resources
    assert {"files__added", "alpha__simple-prompt"} <= prompts
    assert steps == [1, 2, 3]
    assert not archived.is_error
    found = setup.events_until(
        lambda evs: {"sampling", "elicitation", "roots"} <= {getattr(e, "crossing", None) for e in evs}
    )
    crossings = {(e.crossing, e.agent) for e in found if e.crossing is not None}
    assert {("sampling", "alpha"), ("elicitation", "alpha"), ("roots", "alpha")} <= crossings
    async with setup.proxied() as plain:
        names = {tool.name for page in await pages(plain, "tools") for tool in page.tools}
    assert "alpha__echo" in names
    assert not {"alpha__trigger-sampling-request", "alpha__get-roots-list"} & names


async def test_clients_of_the_newest_protocol_are_served_in_it(setup: Setup) -> None:
    """With every server on the newest protocol (the Python files server twice), the gateway
    speaks it to a client that does, as the single form does: each server's tools under its
    prefix, and the tools, resources and prompts list changes of one server reach the client on
    its listen stream; the tool added later is then called, in its server's scope."""
    more = setup.root.parent / "more"
    more.mkdir()
    (more / "old.txt").write_text("old")
    command = [sys.executable, str(UPSTREAM)]
    servers = [
        {"name": "files", "command": command, "env": {"UPSTREAM_ROOT": str(setup.root)}},
        {"name": "more", "command": command, "env": {"UPSTREAM_ROOT": str(more), "UPSTREAM_RESOURCES": "1"}},
    ]
    setup.config.write_text(yaml.safe_dump({"servers": servers}))
    heard: set[str] = set()
    async with setup.proxied() as proxied:
        assert proxied.session.protocol_version == "2026-07-28"
        names = {tool.name for page in await pages(proxied, "tools") for tool in page.tools}
        assert {"files__write_file", "more__write_file", "more__add_note"} <= names
        async with anyio.create_task_group() as tasks:

            async def follow(*, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
                async with listen(
                    proxied.session, tools_list_changed=True, resources_list_changed=True, prompts_list_changed=True
                ) as changes:
                    task_status.started()
                    async for event in changes:
                        heard.add(type(event).__name__)

            await tasks.start(follow)
            await proxied.call_tool("more__enable_archive", {})
            await proxied.call_tool("more__add_note", {})
            await until(lambda: {"ToolsListChanged", "ResourcesListChanged", "PromptsListChanged"} <= heard)
            tasks.cancel_scope.cancel()
        archived = await proxied.call_tool("more__archive_file", {"path": "old.txt"})
        written = await proxied.call_tool("files__write_file", {"path": "new.txt", "text": "hi"})
        resources = {r.uri for page in await pages(proxied, "resources") for r in page.resources}
    assert not archived.is_error, text_of(archived)
    assert (more / "old.txt.archived").exists()
    assert not written.is_error
    assert (setup.root / "new.txt").read_text() == "hi"
    assert "files://added" in resources
    found = setup.events_until(lambda evs: any(e.tool == "more__archive_file" for e in evs))
    assert {(e.tool, e.agent) for e in found if e.type == "ToolUse"} >= {
        ("more__archive_file", "more"),
        ("files__write_file", "files"),
    }


async def end_session(url: str, session: str) -> int:
    """DELETE the MCP session `session` at the server `url`, as a client ending it would; the status."""
    async with httpx.AsyncClient(timeout=DEADLINE_S) as http:
        return (await http.delete(url, headers={"mcp-session-id": session})).status_code


async def test_a_server_reached_over_http_ends_one_clients_session(setup: Setup, tmp_path: Path) -> None:
    """A `url:` entry: the gateway (itself over `--http`) reaches a streamable HTTP server
    (server-everything started in that mode), lists its tools under its prefix and calls them,
    beside a server it started. Each client has its own session with it; the server ends one
    client's session: that client's next call answers an error saying so (its outcome event
    recorded, one line on stderr), the other client's calls go on, and the first client's call
    after that opens a new session and works."""
    port, gateway_port = free_port(), free_port()
    log = tmp_path / "remote.log"
    remote = start_remote(setup, port, log)
    process = None
    try:
        wait_for_line(log, "listening on port", remote)
        remote_url = f"http://127.0.0.1:{port}/mcp"
        servers = [
            {"name": "remote", "url": remote_url, "headers": {"X-Callgate-Test": "1"}},
            {"name": "files", "command": [sys.executable, str(UPSTREAM)], "env": {"UPSTREAM_ROOT": str(setup.root)}},
        ]
        setup.config.write_text(yaml.safe_dump({"servers": servers}))
        with setup.stderr.open("wb") as err:
            process = subprocess.Popen(
                [sys.executable, *setup.args("--http", f"127.0.0.1:{gateway_port}")],
                stdin=subprocess.DEVNULL,
                stdout=err,
                stderr=subprocess.STDOUT,
            )
        wait_for_line(setup.stderr, "listening on", process)

        def sessions() -> list[str]:
            return re.findall(r"Session initialized with ID: (\S+)", log.read_text())

        url = f"http://127.0.0.1:{gateway_port}/mcp"
        async with Client(url) as first:
            names = {tool.name for page in await pages(first, "tools") for tool in page.tools}
            assert {"remote__echo", "files__write_file"} <= names
            echoed = await first.call_tool("remote__echo", {"message": "over the wire"})
            assert "over the wire" in text_of(echoed)
            # The gateway's own session, then the first client's.
            await until(lambda: len(sessions()) == 2)
            ended = sessions()[-1]
            async with Client(url) as second:
                assert not (await second.call_tool("remote__echo", {"message": "two"})).is_error
                assert await end_session(remote_url, ended) == 200
                lost = await first.call_tool("remote__echo", {"message": "after"})
                kept = await second.call_tool("remote__echo", {"message": "still"})
                again = await first.call_tool("remote__echo", {"message": "again"})
        assert lost.is_error
        assert "MCP server 'remote' ended this client's session" in text_of(lost)
        assert "the next request opens a new session" in text_of(lost)
        assert "still" in text_of(kept)
        assert not again.is_error
        assert "again" in text_of(again)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=DEADLINE_S) == 0, setup.stderr.read_text()
    finally:
        for started in (process, remote):
            if started is not None and started.poll() is None:
                started.kill()
                started.wait()
    assert "a client's upstream session with server remote stopped serving" in setup.stderr.read_text()
    found = setup.events_until(lambda evs: sum(e.tool == "remote__echo" for e in evs) >= 5)
    calls = [(e.type, getattr(e, "outcome", None)) for e in found if e.tool == "remote__echo"]
    assert {e.agent for e in found if e.tool == "remote__echo"} == {"remote"}
    assert calls.count(("ToolUse", "ok")) == 4
    # The lost call: failed through the gate, or refused before it when the session's end was
    # heard first.
    assert [c for c in calls if c != ("ToolUse", "ok")] in ([("ToolUse", "error")], [("ToolDenied", None)])


def start_remote(setup: Setup, port: int, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        remote = subprocess.Popen(
            ["node", str(setup.everything), "streamableHttp"],
            env={**os.environ, "PORT": str(port)},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return remote


async def stderr_says(path: Path, text: str, count: int = 1) -> None:
    """Return once `path` holds `text` `count` times (a deadline bounds the wait)."""
    with anyio.fail_after(DEADLINE_S):
        while (await anyio.Path(path).read_text()).count(text) < count:
            await anyio.sleep(0.05)  # sleep-ok: polling a file another process writes, with a deadline


async def test_a_server_reached_over_http_that_restarts_comes_back(setup: Setup, tmp_path: Path) -> None:
    """A `url:` entry of the handshake era (server-everything over streamable HTTP, on a fixed
    port) is killed while the gateway serves it beside the files server, with an SDK client over
    stdio (which has its own session with it): the call that finds it gone fails, the gateway says
    on stderr it is lost and refuses its calls with an event while the files server serves on;
    started again on the same port, it is reached again by itself (one stderr line), the client
    hears that the tools list changed, and its calls are served and recorded in its scope."""
    port = free_port()
    log = tmp_path / "remote.log"
    remote = start_remote(setup, port, log)
    try:
        wait_for_line(log, "listening on port", remote)
        servers = [
            {"name": "remote", "url": f"http://127.0.0.1:{port}/mcp"},
            {"name": "files", "command": [sys.executable, str(UPSTREAM)], "env": {"UPSTREAM_ROOT": str(setup.root)}},
        ]
        setup.config.write_text(yaml.safe_dump({"servers": servers}))
        changes: list[str] = []

        async def heard(message: Any) -> None:
            if isinstance(message, types.ToolListChangedNotification):
                changes.append("tools")

        env = {**os.environ, "PYTHONPATH": str(HERE)}
        params = StdioServerParameters(command=sys.executable, args=setup.args(), env=env)
        stderr = setup.stderr
        with stderr.open("w") as errlog:
            client_of = Client(stdio_client(params, errlog=errlog), message_handler=heard)
            async with client_of as client:
                assert not (await client.call_tool("remote__echo", {"message": "before"})).is_error
                remote.send_signal(signal.SIGKILL)
                remote.wait()
                # The call that finds the server gone fails; the gateway then knows it is away.
                failed = await client.call_tool("remote__echo", {"message": "lost"})
                await stderr_says(stderr, "server remote lost (")
                refused = await client.call_tool("remote__echo", {"message": "away"})
                written = await client.call_tool("files__write_file", {"path": "during.txt", "text": "on"})
                remote = start_remote(setup, port, log)
                await stderr_says(stderr, "server remote is back")
                again = await client.call_tool("remote__echo", {"message": "again"})
                with anyio.fail_after(DEADLINE_S):
                    while not changes:
                        await anyio.sleep(0.05)  # sleep-ok: polling what the client heard, with a deadline
    finally:
        if remote.poll() is None:
            remote.kill()
            remote.wait()
    assert failed.is_error
    assert refused.is_error
    assert "MCP server 'remote' is unavailable: reconnecting" in text_of(refused)
    assert not written.is_error
    assert (setup.root / "during.txt").read_text() == "on"
    assert "again" in text_of(again)
    assert not again.is_error
    lines = await anyio.Path(stderr).read_text()
    assert lines.count("server remote lost (") == 1
    assert lines.count("server remote is back") == 1
    assert "server files" not in lines
    found = setup.events_until(lambda evs: sum(e.tool == "remote__echo" for e in evs) >= 4)
    calls = [(e.type, getattr(e, "outcome", None)) for e in found if e.tool == "remote__echo"]
    assert {e.agent for e in found if e.tool == "remote__echo"} == {"remote"}
    assert calls[0] == ("ToolUse", "ok")
    assert calls[1] in (("ToolUse", "error"), ("ToolDenied", None))
    assert calls[2:] == [("ToolDenied", None), ("ToolUse", "ok")]
    assert [(e.type, e.outcome) for e in found if e.tool == "files__write_file"] == [("ToolUse", "ok")]
