"""`callgate mcp-proxy` as a process: streamable HTTP with a real MCP client, and the messages of
a command line that cannot become a proxy."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError

from events import MemorySink, read_jsonl, verify_chain
from interceptor_core import Gate, RunContext
from interceptor_core.integrations.mcp import McpProxy, McpToolset

from .conftest import HERE, effects, upstream_command
from .files_policy import DENIAL, ProtectFiles
from .test_mcp import DEADLINE_S, proxy_params, read_events, text_of


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class HttpProxy:
    """`callgate mcp-proxy --http` in front of the test server, as a process of its own."""

    def __init__(
        self,
        root: Path,
        tmp_path: Path,
        events: Path | None = None,
        *extra: str,
        host: str = "127.0.0.1",
        slow_tool: bool = False,
        port: int | None = None,
    ) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.events = events or tmp_path / "events.jsonl"
        self.stderr = tmp_path / "proxy.stderr"
        params = proxy_params(root, self.events, "--http", f"{host}:{self.port}", *extra)
        env = {**(params.env or {}), "UPSTREAM_SLOW_TOOL": "1" if slow_tool else "0"}
        with self.stderr.open("wb") as err:
            self.process = subprocess.Popen(
                [params.command, *params.args], env=env, stdin=subprocess.DEVNULL, stdout=err, stderr=err
            )

    async def wait_until_listening(self) -> None:
        """Return once the proxy accepts connections; fail with its stderr if it exits first or
        the deadline passes."""
        deadline = time.monotonic() + DEADLINE_S
        while True:
            if self.process.poll() is not None:
                pytest.fail(f"the proxy exited with {self.process.returncode}:\n{self.stderr.read_text()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"the proxy did not listen within {DEADLINE_S} s:\n{self.stderr.read_text()}")
            await anyio.sleep(0.05)

    async def wait_until_not_listening(self) -> None:
        """Return once the proxy refuses connections (it has begun to stop); fail at the deadline."""
        deadline = time.monotonic() + DEADLINE_S
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    pass
            except OSError:
                return
            if time.monotonic() > deadline:
                pytest.fail(f"the proxy still listens after {DEADLINE_S} s:\n{self.stderr.read_text()}")
            await anyio.sleep(0.05)

    def stop(self) -> int:
        """SIGTERM, then its exit code (killed if it does not exit within the deadline)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=DEADLINE_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


@pytest.fixture
def http_proxy(root: Path, tmp_path: Path) -> Iterator[HttpProxy]:
    proxy = HttpProxy(root, tmp_path)
    try:
        yield proxy
    finally:
        proxy.stop()


class TestProxyOverHttp:
    async def test_allowed_and_denied_calls(self, http_proxy: HttpProxy, root: Path) -> None:
        """A real client over streamable HTTP: the allowed write reaches the upstream, the denied
        delete comes back as an error result with the denial and never reaches it; SIGTERM stops
        the proxy cleanly with every event written."""
        await http_proxy.wait_until_listening()
        async with Client(http_proxy.url) as client:
            listed = await client.list_tools()
            assert {t.name for t in listed.tools} == {"write_file", "delete_file", "enable_archive"}
            ok = await client.call_tool("write_file", {"path": "note.txt", "text": "hi"})
            assert (ok.is_error, text_of(ok)) == (False, "wrote 2 chars to note.txt")
            denied = await client.call_tool("delete_file", {"path": "precious.txt"})
            assert (denied.is_error, text_of(denied)) == (True, DENIAL)
        assert http_proxy.stop() == 0, http_proxy.stderr.read_text()
        assert "Traceback" not in http_proxy.stderr.read_text()  # the upstream was shut down, not cut off

        assert (root / "precious.txt").read_text() == "keep me"
        assert effects(root) == ["write note.txt"]
        found = read_jsonl(http_proxy.events)
        outcomes = [(e.type, e.tool, e.principal) for e in found if e.type != "ToolsRegistered"]
        assert outcomes == [("ToolUse", "write_file", "mcp-client"), ("ToolDenied", "delete_file", "mcp-client")]
        assert verify_chain(found).ok


ENOSPC = "write failed: [Errno 28] No space left on device"


class TestPagination:
    async def test_pages_and_cursors_pass_through(self, root: Path, tmp_path: Path, errlog: TextIO) -> None:
        """A server that lists one tool a page: through the proxy the client gets each page with
        the server's cursor (three pages, not one merged), and a cursor the server never gave gets
        the server's own error."""
        params = proxy_params(root, tmp_path / "events.jsonl")
        params.env = {**(params.env or {}), "UPSTREAM_PAGE_SIZE": "1"}
        async with Client(stdio_client(params, errlog=errlog)) as client:
            pages: list[list[str]] = []
            cursor = None
            while True:
                page = await client.list_tools(cursor=cursor, cache_mode="refresh")
                pages.append([tool.name for tool in page.tools])
                cursor = page.next_cursor
                if cursor is None:
                    break
            with pytest.raises(MCPError) as bogus:
                await client.list_tools(cursor="not-a-page", cache_mode="refresh")
            # Every tool was registered at start (the proxy walks the pages itself), so calls work.
            done = await client.call_tool("write_file", {"path": "paged.txt", "text": "hi"})
        assert pages == [["write_file"], ["delete_file"], ["enable_archive"]]
        assert (bogus.value.code, bogus.value.error.message) == (-32602, "no such page")
        assert not done.is_error


class TestProxyWithAnAuditThatCannotWrite:
    async def test_events_on_a_full_disk_refuse_every_call(self, root: Path, tmp_path: Path) -> None:
        """`callgate mcp-proxy --events /dev/full`: every tool call is refused with "audit
        unavailable" naming the sink and the error, the upstream does nothing, stderr has one
        line when the writes fail and one when the proxy stops, no traceback, and the proxy exits 1
        saying how many audit events were lost."""
        proxy = HttpProxy(root, tmp_path, events=Path("/dev/full"))
        code = None
        try:
            await proxy.wait_until_listening()
            async with Client(proxy.url) as client:
                for name, args in [
                    ("write_file", {"path": "note.txt", "text": "hi"}),
                    ("delete_file", {"path": "old.txt"}),
                ]:
                    with pytest.raises(MCPError) as refused:
                        await client.call_tool(name, args)
                    assert f"audit unavailable: JsonlSink(/dev/full): {ENOSPC}" in str(refused.value)
        finally:
            code = proxy.stop()
        assert code == 1
        assert effects(root) == []
        assert (root / "old.txt").read_text() == "old"
        stderr = proxy.stderr.read_text()
        assert "Traceback" not in stderr
        about_the_sink = [line for line in stderr.splitlines() if "JsonlSink" in line]
        assert about_the_sink == [
            f"JsonlSink(/dev/full): {ENOSPC}; holding 1 events and trying again",
            f"JsonlSink(/dev/full) closed with 3 events it could not store ({ENOSPC})",
            f"error: audit events were lost: 3 never stored by JsonlSink(/dev/full): {ENOSPC}",
        ]


class TestProxyRunContext:
    async def test_events_name_who_the_proxy_acts_for(self, root: Path, errlog: TextIO) -> None:
        """The proxy's RunContext (tenant, principal) is the one every call's event carries."""
        memory = MemorySink()
        gate = Gate("files", interceptors=[ProtectFiles()], sinks=[memory])
        command = upstream_command()
        params = StdioServerParameters(
            command=command[0], args=command[1:], env={**os.environ, "UPSTREAM_ROOT": str(root)}
        )
        ops = RunContext(tenant="acme", principal="ops-bot")
        async with McpToolset.connect(params, errlog=errlog, raw_results=True) as upstream:
            scope = await upstream.attach(gate.agent("mcp-proxy", tools=[]))
            async with Client(McpProxy(upstream, scope, run=ops).server) as client:
                await client.call_tool("write_file", {"path": "note.txt", "text": "hi"})
                await client.call_tool("delete_file", {"path": "precious.txt"})
        named = [(e.type, e.tenant, e.principal, e.run_id) for e in memory.events if e.type != "ToolsRegistered"]
        assert named == [("ToolUse", "acme", "ops-bot", ops.run_id), ("ToolDenied", "acme", "ops-bot", ops.run_id)]
        assert effects(root) == ["write note.txt"]


class TestProxyIdentityOptions:
    async def test_tenant_and_principal_options_reach_the_events(
        self, root: Path, tmp_path: Path, errlog: TextIO
    ) -> None:
        """`callgate mcp-proxy --tenant acme --principal ops-bot` makes every call for them, and its
        ToolsRegistered event names them too."""
        events = tmp_path / "events.jsonl"
        params = proxy_params(root, events, "--tenant", "acme", "--principal", "ops-bot")
        async with Client(stdio_client(params, errlog=errlog)) as client:
            await client.call_tool("write_file", {"path": "note.txt", "text": "hi"})
        found = read_events(events, lambda evs: any(e.type == "ToolUse" for e in evs))
        (use,) = [e for e in found if e.type == "ToolUse"]
        assert (use.tenant, use.principal) == ("acme", "ops-bot")
        (registered,) = [e for e in found if e.type == "ToolsRegistered"]
        assert (registered.tenant, registered.principal, registered.run_id) == ("acme", "ops-bot", use.run_id)


BAD_FACTORIES = """
from interceptor_core import Gate

NOT_A_GATE = 42


def build_nothing():
    return {"name": "files"}
"""


class TestProxyConfiguration:
    """A command line that cannot become a proxy exits with 2 and a message naming the culprit."""

    def run_proxy_command(self, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
        (tmp_path / "bad_factories.py").write_text(BAD_FACTORIES)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(HERE)]), "COLUMNS": "200"}
        return subprocess.run(
            [sys.executable, "-m", "callgate.cli", "mcp-proxy", *args, "--", *upstream_command()],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=DEADLINE_S,
            check=False,
        )

    @pytest.mark.parametrize(
        ("args", "culprit"),
        [
            (["--gate", "no_such_policy:build_gate"], "cannot import module 'no_such_policy'"),
            (["--gate", "files_policy:no_such_factory"], "module 'files_policy' has no attribute 'no_such_factory'"),
            (
                ["--gate", "bad_factories:NOT_A_GATE"],
                "bad_factories:NOT_A_GATE is not a Gate or a function returning one: it is of type int",
            ),
            (
                ["--gate", "bad_factories:build_nothing"],
                "bad_factories:build_nothing() returned a value of type dict, not a Gate",
            ),
            (["--gate", "files_policy:build_gate", "--tennant", "acme"], "unknown option '--tennant'"),
        ],
        ids=["no-module", "no-attribute", "not-a-gate", "factory-returns-no-gate", "typo"],
    )
    def test_names_the_culprit(self, tmp_path: Path, args: list[str], culprit: str) -> None:
        """One line names the spec or option at fault; nothing is written to stdout or the audit."""
        done = self.run_proxy_command(tmp_path, *args)
        assert done.returncode == 2, done.stderr
        (line,) = done.stderr.splitlines()
        assert line.startswith("error: ")
        assert culprit in line
        assert done.stdout == ""
        assert not (tmp_path / "audit.jsonl").exists()

    @pytest.mark.parametrize(
        ("options", "events", "line"),
        [
            (["--gate", "files_policy:build_gate"], "notes.txt/audit.jsonl", "notes.txt is not a directory"),
            (["--gate", "files_policy:build_gate"], "logs/audit.jsonl", "the directory logs does not exist"),
            (["--policy", "files.policy.yaml"], "notes.txt/audit.jsonl", "notes.txt is not a directory"),
        ],
        ids=["parent-is-a-file", "missing-directory", "policy-only"],
    )
    def test_an_events_file_that_cannot_be_written_exits_2_with_one_line(
        self, tmp_path: Path, options: list[str], events: str, line: str
    ) -> None:
        """`--events` naming a path that cannot be written stops the proxy before it starts:
        exit 2, one line naming the sink, the path and what is wrong, nothing on stdout."""
        (tmp_path / "notes.txt").write_text("a file, not a directory")
        (tmp_path / "files.policy.yaml").write_text(FILES_POLICY)
        done = self.run_proxy_command(tmp_path, *options, "--events", events)
        assert done.returncode == 2, done.stderr
        assert done.stderr.splitlines() == [f"error: JsonlSink({events}) cannot start: {line}"]
        assert done.stdout == ""
        assert not (tmp_path / "logs").exists()


FILES_POLICY = """\
version: 1
name: files-policy
mandatory: true
rules:
  - id: no-deletes-for-trial
    tools: [delete_file]
    when: "run.tenant == 'trial'"
    decision: deny
    message: "Trial tenants cannot delete files."
  - id: workspace-only
    tools: [write_file]
    when: "args.path.startsWith('/') || args.path.contains('..')"
    decision: deny
    message: "Write inside the workspace ({args.path} is not)."
"""


class TestProxyWithPolicyFile:
    """`callgate mcp-proxy --policy FILE`: a policy file alone fronts a real MCP server."""

    def params(self, root: Path, tmp_path: Path, tenant: str) -> StdioServerParameters:
        policy = tmp_path / "files.policy.yaml"
        policy.write_text(FILES_POLICY)
        return StdioServerParameters(
            command=sys.executable,
            args=[
                *("-m", "callgate.cli", "mcp-proxy", "--policy", str(policy), "--tenant", tenant),
                *("--events", str(tmp_path / "events.jsonl"), "--", *upstream_command()),
            ],
            env={**os.environ, "UPSTREAM_ROOT": str(root)},
        )

    async def test_tools_list_hides_what_the_policy_refuses_outright(
        self, root: Path, tmp_path: Path, errlog: TextIO
    ) -> None:
        """For a trial tenant tools/list leaves delete_file out; asked for anyway, it is denied, not run."""
        async with Client(stdio_client(self.params(root, tmp_path, "trial"), errlog=errlog)) as client:
            listed = await client.list_tools()
            assert {t.name for t in listed.tools} == {"write_file", "enable_archive"}
            denied = await client.call_tool("delete_file", {"path": "precious.txt"})
            assert (denied.is_error, text_of(denied)) == (True, "Trial tenants cannot delete files.")
            escaped = await client.call_tool("write_file", {"path": "../outside.txt", "text": "x"})
            assert escaped.is_error
            assert "../outside.txt is not" in text_of(escaped)
        assert (root / "precious.txt").read_text() == "keep me"
        assert effects(root) == []
        found = read_events(tmp_path / "events.jsonl", lambda es: sum(e.type == "ToolDenied" for e in es) == 2)
        denials = [e for e in found if e.type == "ToolDenied"]
        assert [step.rules[0].id for e in denials for step in e.decisions] == ["no-deletes-for-trial", "workspace-only"]

    async def test_other_tenants_see_every_tool(self, root: Path, tmp_path: Path, errlog: TextIO) -> None:
        """The hiding is per run: a paying tenant's tools/list has delete_file."""
        async with Client(stdio_client(self.params(root, tmp_path, "acme"), errlog=errlog)) as client:
            listed = await client.list_tools()
            assert {t.name for t in listed.tools} == {"write_file", "delete_file", "enable_archive"}

    def test_a_policy_file_with_problems_exits_2_naming_them(self, tmp_path: Path) -> None:
        """A broken policy file stops the proxy before it starts, naming file, line and rule."""
        policy = tmp_path / "bad.yaml"
        policy.write_text(
            FILES_POLICY.replace('decision: deny\n    message: "Trial', 'decision: nope\n    message: "Trial')
        )
        done = subprocess.run(
            [sys.executable, "-m", "callgate.cli", "mcp-proxy", "--policy", str(policy), "--", *upstream_command()],
            capture_output=True,
            text=True,
            timeout=DEADLINE_S,
            check=False,
        )
        assert done.returncode == 2
        assert f"{policy}:8 no-deletes-for-trial: decision must be one of" in done.stderr
