"""`callgate mcp-proxy` under hostile clients and operators, each case with a real proxy process in
front of a real MCP server process: signals, oversized and malformed input, unknown names in a
loop, startup failures, factories without `sinks=`, path spellings, bearer tokens over HTTP.

The upstream is the Python test server (`mcp_upstream.py`, with the filesystem server's
path-carrying tools under UPSTREAM_FILE_TOOLS=1), not the npm `@modelcontextprotocol/server-
filesystem` the issue measured with: the project's own files do not install Node packages, so CI
could not rely on it.
"""

from __future__ import annotations

import json
import os
import select
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import anyio
import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from events import read_jsonl, verify_chain

from .conftest import HERE, effects, upstream_command
from .files_policy import DENIAL, PROTECTED
from .test_mcp import DEADLINE_S, proxy_params, read_events, text_of
from .test_mcp_proxy import FILES_POLICY, HttpProxy, free_port

INITIALIZE = {
    "protocolVersion": "2025-06-18",
    "capabilities": {},
    "clientInfo": {"name": "raw-test-client", "version": "1"},
}


class StdioProxy:
    """`callgate mcp-proxy` over stdio as a process, spoken to line by line (a raw client can send
    what no SDK client would)."""

    def __init__(
        self,
        root: Path,
        tmp_path: Path,
        *extra: str,
        file_tools: bool = False,
        slow_tool: bool = False,
        grace_s: float | None = None,
    ) -> None:
        self.root = root
        self.events = tmp_path / "events.jsonl"
        self.stderr_path = tmp_path / "proxy.stderr"
        params = proxy_params(root, self.events, *extra)
        if grace_s is not None:  # the same proxy, started by run_proxy with its own grace
            params.args = [
                str(HERE / "short_grace_proxy.py"),
                str(self.events),
                str(grace_s),
                "--",
                *upstream_command(),
            ]
        env = {
            **(params.env or {}),
            "UPSTREAM_FILE_TOOLS": "1" if file_tools else "0",
            "UPSTREAM_SLOW_TOOL": "1" if slow_tool else "0",
            "PYTHONPATH": os.pathsep.join([str(HERE), str(tmp_path)]),
        }
        with self.stderr_path.open("wb") as err:
            self.process = subprocess.Popen(
                [params.command, *params.args], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err
            )
        self._next_id = 100

    def send(self, line: bytes) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line + b"\n")
        self.process.stdin.flush()

    def receive(self) -> dict[str, Any]:
        """The next message the proxy writes; fails at the deadline."""
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], DEADLINE_S)
        if not ready:
            pytest.fail(f"no answer within {DEADLINE_S} s:\n{self.stderr_path.read_text()}")
        line = self.process.stdout.readline()
        if not line:
            pytest.fail(f"the proxy closed stdout:\n{self.stderr_path.read_text()}")
        message: dict[str, Any] = json.loads(line)
        return message

    def answer_to(self, request_id: Any) -> dict[str, Any]:
        """The response with `request_id`, skipping notifications."""
        while True:
            message = self.receive()
            if "id" in message and message["id"] == request_id:
                return message

    def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        return self.answer_to(self.send_request(method, params))

    def send_request(self, method: str, params: dict[str, Any]) -> int:
        """Send a request without waiting for its answer; its id."""
        self._next_id += 1
        self.send(json.dumps({"jsonrpc": "2.0", "id": self._next_id, "method": method, "params": params}).encode())
        return self._next_id

    def wait_for_stderr(self, text: str) -> None:
        """Return once the proxy's stderr holds `text`; fail at the deadline or if it exits first."""
        deadline = time.monotonic() + DEADLINE_S
        while text not in self.stderr_path.read_text():
            if self.process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the proxy's stderr never said {text!r}:\n{self.stderr_path.read_text()}")
            time.sleep(0.02)  # sleep-ok: polling another process's output, with a deadline

    def initialize(self) -> None:
        assert "result" in self.request("initialize", INITIALIZE)
        self.send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')

    def call(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return self.request("tools/call", {"name": name, "arguments": arguments})

    def wait(self) -> int:
        try:
            return self.process.wait(timeout=DEADLINE_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            pytest.fail(f"the proxy did not exit within {DEADLINE_S} s:\n{self.stderr_path.read_text()}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()

    def lists(self) -> int:
        """How many tools/list requests the upstream has served."""
        log = self.root / "lists.log"
        return len(log.read_text().splitlines()) if log.exists() else 0


@pytest.fixture
def stdio_proxy(root: Path, tmp_path: Path) -> Any:
    proxies: list[StdioProxy] = []

    def start(
        *extra: str, file_tools: bool = False, slow_tool: bool = False, grace_s: float | None = None
    ) -> StdioProxy:
        proxy = StdioProxy(root, tmp_path, *extra, file_tools=file_tools, slow_tool=slow_tool, grace_s=grace_s)
        proxies.append(proxy)
        return proxy

    yield start
    release(root)  # a slow call a failed test left waiting must not hold its upstream forever
    for proxy in proxies:
        proxy.stop()


def wait_for_file(path: Path) -> None:
    """Return once `path` exists; fail at the deadline."""
    deadline = time.monotonic() + DEADLINE_S
    while not path.exists():
        if time.monotonic() > deadline:
            pytest.fail(f"{path} did not appear within {DEADLINE_S} s")
        time.sleep(0.02)  # sleep-ok: polling another process's effect, with a deadline


def release(root: Path, line: str = "released") -> bool:
    """Let the upstream's waiting `slow_write` go on (False when none waits)."""
    fifo = root / "release.fifo"
    if not fifo.exists():
        return False
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # ENXIO when no reader has it open
    except OSError:
        return False
    with os.fdopen(fd, "w") as writer:
        writer.write(line + "\n")
    return True


def gone(pid: int) -> bool:
    """Whether process `pid` has exited (polled until the deadline)."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)  # sleep-ok: polling another process's exit, with a deadline
    return False


class TestSignalsOverStdio:
    @pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
    def test_a_signal_flushes_stops_the_upstream_and_exits_0(self, stdio_proxy: Any, root: Path, signum: int) -> None:
        """With the client still connected and stdin open: exit 0 at once, every event of the calls
        made is in the file, the chain verifies, and the upstream process is gone."""
        proxy = stdio_proxy()
        proxy.initialize()
        assert proxy.call("write_file", {"path": "note.txt", "text": "hi"})["result"]["isError"] is False
        assert proxy.call("delete_file", {"path": "precious.txt"})["result"]["isError"] is True
        upstream_pid = int((root / "upstream.pid").read_text())
        proxy.process.send_signal(signum)
        assert proxy.wait() == 0, proxy.stderr_path.read_text()
        assert "Traceback" not in proxy.stderr_path.read_text()
        found = read_jsonl(proxy.events)
        assert [e.type for e in found if e.type != "ToolsRegistered"] == ["ToolUse", "ToolDenied"]
        assert verify_chain(found).ok
        assert gone(upstream_pid)


class TestSignalsWithACallInFlightOverStdio:
    """A signal stops a stdio proxy as it stops an HTTP one: requests in flight finish first."""

    def start_slow_call(self, stdio_proxy: Any, root: Path, grace_s: float | None = None) -> tuple[StdioProxy, int]:
        os.mkfifo(root / "release.fifo")
        proxy: StdioProxy = stdio_proxy(slow_tool=True, grace_s=grace_s)
        proxy.initialize()
        request_id = proxy.send_request(
            "tools/call", {"name": "slow_write", "arguments": {"path": "late.txt", "text": "hi"}}
        )
        wait_for_file(root / "slow.started")  # the call has reached the upstream and waits there
        return proxy, request_id

    @pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
    def test_the_call_in_flight_is_answered_recorded_and_the_proxy_exits_0(
        self, stdio_proxy: Any, root: Path, signum: int
    ) -> None:
        """A real signal while a tools/call waits in the upstream: the proxy says it is draining,
        the call (released only then) completes, its response reaches the client, its `ToolUse`
        is in the events file, the upstream is stopped and the proxy exits 0."""
        proxy, request_id = self.start_slow_call(stdio_proxy, root)
        upstream_pid = int((root / "upstream.pid").read_text())
        proxy.process.send_signal(signum)
        proxy.wait_for_stderr("stopping; waiting up to 30 s for 1 request in flight")
        assert proxy.process.poll() is None
        assert release(root)
        answer = proxy.answer_to(request_id)
        assert answer["result"]["isError"] is False
        assert answer["result"]["content"][0]["text"] == "wrote 2 chars to late.txt"
        assert proxy.wait() == 0, proxy.stderr_path.read_text()
        assert "Traceback" not in proxy.stderr_path.read_text()
        assert effects(root) == ["slow_write late.txt released"]
        found = read_jsonl(proxy.events)
        outcomes = [(e.type, e.tool, e.outcome) for e in found if e.type != "ToolsRegistered"]
        assert outcomes == [("ToolUse", "slow_write", "ok")]
        assert verify_chain(found).ok
        assert gone(upstream_pid)

    def test_no_request_is_read_after_the_signal(self, stdio_proxy: Any, root: Path) -> None:
        """A request sent while the proxy drains is never read: the upstream never sees it, no
        event records it, and the only answer on the wire is the call that was in flight."""
        proxy, request_id = self.start_slow_call(stdio_proxy, root)
        proxy.process.send_signal(signal.SIGTERM)
        proxy.wait_for_stderr("request in flight")
        late_id = proxy.send_request("tools/call", {"name": "write_file", "arguments": {"path": "n.txt", "text": "x"}})
        assert release(root)
        assert proxy.answer_to(request_id)["result"]["isError"] is False
        assert proxy.wait() == 0, proxy.stderr_path.read_text()
        assert proxy.process.stdout is not None
        rest = [json.loads(line) for line in proxy.process.stdout.read().splitlines()]
        assert [m for m in rest if m.get("id") == late_id] == []
        assert effects(root) == ["slow_write late.txt released"]
        assert not (root / "n.txt").exists()
        found = read_jsonl(proxy.events)
        assert [(e.type, e.tool) for e in found if e.type != "ToolsRegistered"] == [("ToolUse", "slow_write")]

    def test_a_second_signal_cancels_the_call_and_still_exits_0(self, stdio_proxy: Any, root: Path) -> None:
        """A second SIGTERM while draining cancels the call in flight: the proxy exits 0 at once,
        the call never completes, and it still leaves its one outcome event (a cancelled `ToolUse`)."""
        proxy, _ = self.start_slow_call(stdio_proxy, root)
        proxy.process.send_signal(signal.SIGTERM)
        proxy.wait_for_stderr("request in flight")
        proxy.process.send_signal(signal.SIGTERM)
        assert proxy.wait() == 0, proxy.stderr_path.read_text()
        assert "Traceback" not in proxy.stderr_path.read_text()
        found = read_jsonl(proxy.events)
        (outcome,) = [e for e in found if e.type != "ToolsRegistered"]
        assert (outcome.type, outcome.tool, outcome.outcome) == ("ToolUse", "slow_write", "cancelled")
        assert verify_chain(found).ok
        release(root)
        assert effects(root) == []

    def test_a_call_past_the_grace_is_cancelled_and_the_proxy_exits_0(self, stdio_proxy: Any, root: Path) -> None:
        """A call still running when the grace is over is cancelled: the client gets an error
        response for it, its one outcome event is a cancelled `ToolUse`, the sinks are flushed,
        the upstream is stopped and the proxy exits 0."""
        proxy, request_id = self.start_slow_call(stdio_proxy, root, grace_s=0.5)
        upstream_pid = int((root / "upstream.pid").read_text())
        proxy.process.send_signal(signal.SIGTERM)
        proxy.wait_for_stderr("stopping; waiting up to 0.5 s for 1 request in flight")
        answer = proxy.answer_to(request_id)
        assert "result" not in answer
        assert answer["error"]["message"] == "Connection closed"
        assert proxy.wait() == 0, proxy.stderr_path.read_text()
        assert "Traceback" not in proxy.stderr_path.read_text()
        found = read_jsonl(proxy.events)
        (outcome,) = [e for e in found if e.type != "ToolsRegistered"]
        assert (outcome.type, outcome.tool, outcome.outcome) == ("ToolUse", "slow_write", "cancelled")
        assert verify_chain(found).ok
        assert gone(upstream_pid)
        assert effects(root) == []


class TestSignalsOverHttp:
    async def test_sigint_stops_an_http_proxy_with_exit_0(self, root: Path, tmp_path: Path) -> None:
        """SIGINT (Ctrl-C) ends an HTTP proxy as SIGTERM does: exit 0, events written, upstream gone."""
        proxy = HttpProxy(root, tmp_path)
        try:
            await proxy.wait_until_listening()
            async with Client(proxy.url) as client:
                assert not (await client.call_tool("write_file", {"path": "note.txt", "text": "hi"})).is_error
            upstream_pid = int((root / "upstream.pid").read_text())
            proxy.process.send_signal(signal.SIGINT)
            proxy.process.wait(timeout=DEADLINE_S)
        finally:
            code = proxy.stop()
        assert code == 0, proxy.stderr.read_text()
        assert [e.type for e in read_jsonl(proxy.events)] == ["ToolsRegistered", "ToolUse"]
        assert gone(upstream_pid)

    @pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
    async def test_exits_0_within_5_s_with_a_client_still_connected(
        self, root: Path, tmp_path: Path, signum: int
    ) -> None:
        """An SDK client holds its notification stream open; the signal still ends the proxy with
        exit 0 within 5 s, the call it made recorded."""
        proxy = HttpProxy(root, tmp_path)
        try:
            await proxy.wait_until_listening()
            async with Client(proxy.url) as client:
                assert not (await client.call_tool("write_file", {"path": "note.txt", "text": "hi"})).is_error
                started = time.monotonic()
                proxy.process.send_signal(signum)
                code = await anyio.to_thread.run_sync(lambda: proxy.process.wait(timeout=DEADLINE_S))
                took = time.monotonic() - started
        finally:
            proxy.stop()
        assert code == 0, proxy.stderr.read_text()
        assert took < 5.0
        assert [e.type for e in read_jsonl(proxy.events)] == ["ToolsRegistered", "ToolUse"]

    async def test_a_call_in_flight_at_sigterm_finishes(self, root: Path, tmp_path: Path) -> None:
        """Over HTTP as over stdio: SIGTERM while a tools/call waits in the upstream; the proxy
        stops listening, the call (released only then) completes and its result reaches the
        client, its `ToolUse` is written, the upstream is stopped and the proxy exits 0."""
        os.mkfifo(root / "release.fifo")
        proxy = HttpProxy(root, tmp_path, slow_tool=True)
        try:
            await proxy.wait_until_listening()
            async with Client(proxy.url) as client, anyio.create_task_group() as tasks:
                # The client checks a result against the tool's output schema, which it lists first
                # unless it has: listed now, while the proxy still takes new requests.
                await client.list_tools()
                results: list[Any] = []

                async def slow_call() -> None:
                    results.append(await client.call_tool("slow_write", {"path": "late.txt", "text": "hi"}))

                tasks.start_soon(slow_call)
                await appears(root / "slow.started")
                upstream_pid = int(await anyio.Path(root / "upstream.pid").read_text())
                proxy.process.send_signal(signal.SIGTERM)
                await proxy.wait_until_not_listening()
                assert release(root)
            (result,) = results
            assert (result.is_error, text_of(result)) == (False, "wrote 2 chars to late.txt")
            proxy.process.wait(timeout=DEADLINE_S)
        finally:
            release(root)
            code = proxy.stop()
        assert code == 0, proxy.stderr.read_text()
        assert effects(root) == ["slow_write late.txt released"]
        found = read_jsonl(proxy.events)
        assert [(e.type, e.tool) for e in found if e.type != "ToolsRegistered"] == [("ToolUse", "slow_write")]
        assert gone(upstream_pid)


async def appears(path: Path) -> None:
    """Return once `path` exists, letting the event loop run meanwhile; fail at the deadline."""
    deadline = time.monotonic() + DEADLINE_S
    while not await anyio.Path(path).exists():
        if time.monotonic() > deadline:
            pytest.fail(f"{path} did not appear within {DEADLINE_S} s")
        await anyio.sleep(0.02)


FIVE_MB = 5 * 1024 * 1024
THREE_MB = 3 * 1024 * 1024  # under the 4 MiB a message line (or an HTTP body) may hold


class TestOversizedInput:
    def test_a_huge_tool_name_is_refused_small(self, stdio_proxy: Any) -> None:
        """A 3 MB tool name: a JSON-RPC invalid-params error stating sizes (not the name), one
        small ToolDenied event with the name cut, and no extra tools/list of the upstream. A 5 MB
        one (a line past the message limit) is refused unread, its event saying only its size. A
        3 MB resource URI and a 3 MB prompt name are refused the same way, before any server
        reads them."""
        proxy = stdio_proxy()
        proxy.initialize()
        before = proxy.lists()
        answer = proxy.call("x" * THREE_MB, {})
        assert answer["error"]["code"] == -32602
        assert len(json.dumps(answer)) < 300
        assert f"tool name of {THREE_MB} characters refused" in answer["error"]["message"]
        huge = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "x" * FIVE_MB}})
        proxy.send(huge.encode())
        answer = proxy.receive()
        assert (answer["id"], answer["error"]["code"], len(json.dumps(answer)) < 200) == (None, -32600, True)
        for method, params, said in [
            ("resources/read", {"uri": "files://" + "u" * THREE_MB}, "resources/read uri of"),
            ("prompts/get", {"name": "p" * THREE_MB}, "prompts/get name of"),
            (
                "prompts/get",
                {"name": "greet", "arguments": {"who": "w" * (2 * 1024 * 1024)}},
                "prompts/get arguments of",
            ),
        ]:
            answer = proxy.request(method, params)
            assert answer["error"]["code"] == -32602
            assert len(json.dumps(answer)) < 300
            assert said in answer["error"]["message"]
        assert proxy.lists() == before
        proxy.process.send_signal(signal.SIGTERM)
        assert proxy.wait() == 0
        assert proxy.events.stat().st_size < 10_000
        denied, unread, *crossings = [e for e in read_jsonl(proxy.events) if e.type == "ToolDenied"]
        assert (denied.tool, denied.cause, denied.args) == ("x" * 64 + "…", "validation", {})
        assert (unread.tool, unread.cause, unread.args) == ("unreadable-request", "validation", {})
        assert f"request of {len(huge) + 1} bytes refused" in unread.message  # with its newline
        assert [(e.tool, e.args) for e in crossings] == [
            ("mcp.resources.read", {}),
            ("mcp.prompts.get", {}),
            ("mcp.prompts.get", {}),
        ]

    def test_huge_arguments_are_refused_before_the_upstream(self, stdio_proxy: Any, root: Path) -> None:
        """2 MB of arguments to a real tool: refused with the sizes, the upstream never runs it,
        and the event holds no arguments."""
        proxy = stdio_proxy()
        proxy.initialize()
        answer = proxy.call("write_file", {"path": "big.txt", "text": "y" * (2 * 1024 * 1024)})
        assert answer["error"]["code"] == -32602
        assert "arguments of 2097" in answer["error"]["message"]
        assert "refused: this proxy accepts at most 1048576" in answer["error"]["message"]
        assert proxy.call("write_file", {"path": "small.txt", "text": "ok"})["result"]["isError"] is False
        proxy.process.send_signal(signal.SIGTERM)
        assert proxy.wait() == 0
        assert effects(root) == ["write small.txt"]
        denied = [e for e in read_jsonl(proxy.events) if e.type == "ToolDenied"]
        assert [(e.tool, e.args) for e in denied] == [("write_file", {})]


class TestUnknownNames:
    def test_listing_again_is_rate_limited(self, stdio_proxy: Any) -> None:
        """Thirty calls of names nobody has: each is answered unknown, and the upstream is listed
        again at most once per second of the run, not once per call."""
        proxy = stdio_proxy()
        proxy.initialize()
        before = proxy.lists()
        began = time.monotonic()
        for n in range(30):
            answer = proxy.call(f"no_such_tool_{n}", {})
            assert answer["result"]["isError"] is True
            assert "Unknown tool" in answer["result"]["content"][0]["text"]
        elapsed = time.monotonic() - began
        assert 1 <= proxy.lists() - before <= 1 + int(elapsed)


class TestMalformedLines:
    def test_every_unreadable_line_is_answered(self, stdio_proxy: Any) -> None:
        """Not JSON: -32700 with id null; JSON that is no message: -32600 (with its id); arguments
        nested past the parser's limit: -32600 naming the request; a line past the size limit:
        -32600. The input is never echoed, and the proxy goes on serving."""
        proxy = stdio_proxy()
        proxy.initialize()
        proxy.send(b"this is not json")
        assert proxy.receive() == {
            "jsonrpc": "2.0",
            "id": None,
            "error": {"code": -32700, "message": "Parse error: expected ident at line 1 column 2"},
        }
        proxy.send(b'{"id": 7, "hello": "world"}')
        answer = proxy.receive()
        assert (answer["id"], answer["error"]["code"]) == (7, -32600)
        nested = "[" * 300 + "]" * 300
        call = '{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"write_file","arguments":{"a":%s}}}'
        proxy.send((call % nested).encode())
        answer = proxy.receive()
        assert (answer["id"], answer["error"]["code"]) == (8, -32600)
        assert "recursion limit exceeded" in answer["error"]["message"]
        proxy.send(b'{"jsonrpc":"2.0","id":9,"method":"ping","params":{"pad":"' + b"z" * FIVE_MB + b'"}}')
        answer = proxy.receive()
        assert (answer["id"], answer["error"]["code"]) == (None, -32600)
        assert len(json.dumps(answer)) < 200
        assert proxy.call("write_file", {"path": "after.txt", "text": "fine"})["result"]["isError"] is False


NOT_MCP = "print('hello, I am no server')"
SILENT = "import time; time.sleep(60)"  # sleep-ok: an upstream that never answers, not a wait


class TestStartupFailures:
    """What an operator gets wrong before anything is served: exit 2, one line naming the culprit."""

    def run(self, root: Path, *args: str, upstream: list[str] | None = None) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "callgate.cli", "mcp-proxy", "--gate", "files_policy:build_gate", *args]
        return subprocess.run(
            [*command, "--", *(upstream if upstream is not None else upstream_command())],
            env={**os.environ, "UPSTREAM_ROOT": str(root), "PYTHONPATH": str(HERE)},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=DEADLINE_S * 2,
            check=False,
        )

    @pytest.mark.parametrize(
        ("args", "upstream", "line"),
        [
            ([], ["no-such-mcp-server"], "error: upstream command 'no-such-mcp-server' not found"),
            ([], ["/dev/null"], "error: upstream command '/dev/null' cannot be run: permission denied"),
            (
                [],
                [sys.executable, "-c", NOT_MCP],
                f"error: upstream {shlex.join([sys.executable, '-c', NOT_MCP])} is not an MCP server: "
                "it wrote lines that are not JSON-RPC, then MCPError: Connection closed",
            ),
            (
                ["--startup-timeout", "1"],
                [sys.executable, "-c", SILENT],
                f"error: upstream {shlex.join([sys.executable, '-c', SILENT])} did not answer as an MCP server "
                "within 1 s",
            ),
            (
                ["--http", "127.0.0.1:70000"],
                None,
                "error: --http 127.0.0.1:70000: port 70000 is out of range (1-65535)",
            ),
            (["--http", "8808"], None, "error: --http expects HOST:PORT, got '8808'"),
        ],
        ids=["not-found", "not-executable", "not-mcp", "silent", "port-out-of-range", "no-host"],
    )
    def test_one_line_exit_2(self, root: Path, args: list[str], upstream: list[str] | None, line: str) -> None:
        """The line names the command or the address; no traceback; nothing on stdout."""
        done = self.run(root, *args, upstream=upstream)
        assert (done.returncode, done.stderr.splitlines(), done.stdout) == (2, [line], "")

    def test_port_in_use(self, root: Path) -> None:
        """A port another process listens on: refused before the upstream is started."""
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            done = self.run(root, "--http", f"127.0.0.1:{port}")
        assert done.returncode == 2
        assert done.stderr.splitlines() == [f"error: cannot listen on 127.0.0.1:{port}: Address already in use"]
        assert not (root / "upstream.pid").exists()

    def test_non_loopback_without_tokens(self, root: Path) -> None:
        """`--http 0.0.0.0:PORT` without `--tokens`: refused, since nobody could tell the clients apart."""
        port = free_port()
        done = self.run(root, "--http", f"0.0.0.0:{port}")
        assert done.returncode == 2
        assert done.stderr.splitlines() == [
            f"error: --http 0.0.0.0:{port} is not a loopback address: give --tokens FILE or --jwt-jwks so every client "
            "authenticates (or listen on 127.0.0.1)"
        ]
        assert not (root / "upstream.pid").exists()

    @pytest.mark.parametrize(
        ("content", "line"),
        [
            ("short alice acme\n", "tokens.txt:1: the token is shorter than 16 characters"),
            ("# only a comment\n", "tokens file tokens.txt holds no token"),
            (f"{'a' * 20} alice\n{'a' * 20} bob\n", "tokens.txt:2: the same token as line 1"),
            (f"{'a' * 20}\n", "tokens.txt:1: expected TOKEN PRINCIPAL [TENANT], got 1 fields"),
        ],
        ids=["short", "empty", "duplicate", "no-principal"],
    )
    def test_a_bad_tokens_file(self, root: Path, tmp_path: Path, content: str, line: str) -> None:
        """A tokens file with a problem names file and line, never the token."""
        (tmp_path / "tokens.txt").write_text(content)
        port = free_port()
        done = subprocess.run(
            [
                *(sys.executable, "-m", "callgate.cli", "mcp-proxy", "--gate", "files_policy:build_gate"),
                *("--http", f"127.0.0.1:{port}", "--tokens", "tokens.txt", "--", *upstream_command()),
            ],
            env={**os.environ, "UPSTREAM_ROOT": str(root), "PYTHONPATH": str(HERE)},
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=DEADLINE_S,
            check=False,
        )
        assert done.returncode == 2
        (said,) = done.stderr.splitlines()
        assert line in said
        assert "a" * 20 not in said


READY_GATE = """
from interceptor_core import Gate
from files_policy import ProtectFiles

GATE = Gate("files", interceptors=[ProtectFiles()])
"""


class TestFactoriesWithoutSinks:
    @pytest.mark.parametrize(
        "spec",
        ["files_policy:build_plain_gate", "ready_gate:GATE", "{tmp}/gates/ready_gate_file.py:GATE"],
        ids=["plain", "ready", "file-path"],
    )
    def test_the_proxy_adds_its_sinks(self, stdio_proxy: Any, root: Path, tmp_path: Path, spec: str) -> None:
        """`def build(): return Gate(...)` and a module-level Gate both work with `--events`, named
        by module or by file path: the events file holds the registration and every call's outcome."""
        (tmp_path / "ready_gate.py").write_text(READY_GATE)
        (tmp_path / "gates").mkdir()
        (tmp_path / "gates" / "ready_gate_file.py").write_text(READY_GATE)
        proxy = stdio_proxy("--gate", spec.format(tmp=tmp_path))
        proxy.initialize()
        assert proxy.call("delete_file", {"path": "precious.txt"})["result"]["isError"] is True
        proxy.process.send_signal(signal.SIGTERM)
        assert proxy.wait() == 0, proxy.stderr_path.read_text()
        found = read_jsonl(proxy.events)
        assert [e.type for e in found] == ["ToolsRegistered", "ToolDenied"]
        assert verify_chain(found).ok


class TestPathSpellings:
    @pytest.mark.parametrize(
        ("tool", "arguments"),
        [
            ("read_file", {"path": "precious.txt"}),
            ("read_file", {"path": "./precious.txt"}),
            ("read_file", {"path": "sub/../precious.txt"}),
            ("read_file", {"path": "ABSOLUTE"}),
            ("read_file", {"path": ".//sub/./../precious.txt"}),
            ("read_multiple_files", {"paths": ["old.txt", "sub/../precious.txt"]}),
            ("move_file", {"source": "./precious.txt", "destination": "mine.txt"}),
            ("move_file", {"source": "old.txt", "destination": "ABSOLUTE"}),
            ("delete_file", {"path": "sub/../precious.txt"}),
        ],
        ids=["plain", "dot", "dotdot", "absolute", "slashes", "paths-list", "source", "destination", "delete"],
    )
    def test_every_spelling_of_the_protected_file_is_denied(
        self, stdio_proxy: Any, root: Path, tool: str, arguments: dict[str, Any]
    ) -> None:
        """Through the real proxy and the real server: each spelling, in each path-carrying
        argument, is denied and never reaches the upstream; precious.txt is untouched."""
        (root / "sub").mkdir()
        absolute = str(root / "precious.txt")
        arguments = {k: absolute if v == "ABSOLUTE" else v for k, v in arguments.items()}
        proxy = stdio_proxy(file_tools=True)
        proxy.initialize()
        result = proxy.call(tool, arguments)["result"]
        assert result["isError"] is True
        assert result["content"][0]["text"] == (DENIAL if tool == "delete_file" else PROTECTED)
        assert proxy.call("read_file", {"path": "old.txt"})["result"]["content"][0]["text"] == "old"
        assert effects(root) == ["read old.txt"]
        assert (root / "precious.txt").read_text() == "keep me"


TOKENS = f"""\
# token                principal  tenant
{"A" * 32} alice acme
{"B" * 32} bob trial
"""


def bearer(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token is not None else {}


def post_status(url: str, token: str | None) -> tuple[int, str | None]:
    """The HTTP status (and WWW-Authenticate) of an initialize POST with `token`."""
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INITIALIZE}).encode()
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream", **bearer(token)}
    # The URL is the test's own http://127.0.0.1 one.
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=DEADLINE_S) as response:  # noqa: S310
            return response.status, None
    except urllib.error.HTTPError as refused:
        return refused.code, refused.headers.get("WWW-Authenticate")


class TestBearerTokens:
    async def test_each_client_is_who_its_token_says(self, root: Path, tmp_path: Path) -> None:
        """On 0.0.0.0 with `--tokens`: no token or a wrong one is 401; alice (acme) and bob (trial)
        each call as themselves (their events say so), and bob's tools/list lacks the tool the
        policy denies trial tenants outright; ToolsRegistered names the proxy's own identity."""
        (tmp_path / "tokens.txt").write_text(TOKENS)
        (tmp_path / "files.policy.yaml").write_text(FILES_POLICY)
        proxy = HttpProxy(
            root,
            tmp_path,
            None,
            *("--tokens", str(tmp_path / "tokens.txt"), "--policy", str(tmp_path / "files.policy.yaml")),
            *("--tenant", "ops", "--principal", "gateway"),
            host="0.0.0.0",  # noqa: S104 - the non-loopback case is the point
        )
        try:
            await proxy.wait_until_listening()
            assert post_status(proxy.url, None) == (401, 'Bearer realm="callgate"')
            assert post_status(proxy.url, "C" * 32)[0] == 401
            assert post_status(proxy.url, "A" * 31)[0] == 401
            seen = {}
            for token in ("A" * 32, "B" * 32):
                http = create_mcp_http_client(headers=bearer(token))
                async with http, Client(streamable_http_client(proxy.url, http_client=http)) as client:
                    seen[token[0]] = {t.name for t in (await client.list_tools()).tools}
                    done = await client.call_tool("write_file", {"path": f"{token[0]}.txt", "text": "hi"})
                    assert not done.is_error, text_of(done)
            assert seen == {"A": {"write_file", "delete_file", "enable_archive"}, "B": {"write_file", "enable_archive"}}
        finally:
            code = proxy.stop()
        assert code == 0, proxy.stderr.read_text()
        found = read_jsonl(proxy.events)
        uses = [(e.principal, e.tenant, e.tool) for e in found if e.type == "ToolUse"]
        assert uses == [("alice", "acme", "write_file"), ("bob", "trial", "write_file")]
        registered = [(e.principal, e.tenant) for e in found if e.type == "ToolsRegistered"]
        assert set(registered) == {("gateway", "ops")}
        assert effects(root) == ["write A.txt", "write B.txt"]


class TestOAuthBearerTokens:
    async def test_tokens_of_the_issuer_name_the_principal(self, root: Path, tmp_path: Path) -> None:
        """On 0.0.0.0 with `--jwt-jwks`: the protected-resource metadata is served without a token
        and named in the 401; a token signed by the issuer's key for this resource is accepted and
        its subject and tenant role are the events' principal and tenant; an expired token, one for
        another audience and one signed by another key are 401."""
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
        (tmp_path / "jwks.json").write_text(json.dumps({"keys": [{**jwk, "kid": "k1", "alg": "RS256", "use": "sig"}]}))
        port = free_port()
        resource = f"http://mcp.example:{port}/mcp"
        issuer = "https://idp.example"

        def token(signer: Any = key, **claims: Any) -> str:
            now = int(time.time())
            body = {"sub": "alice", "iss": issuer, "aud": resource, "exp": now + 300, "roles": ["tenant:acme"]}
            return jwt.encode({**body, **claims}, signer, algorithm="RS256", headers={"kid": "k1"})

        proxy = HttpProxy(
            root,
            tmp_path,
            None,
            *("--jwt-jwks", str(tmp_path / "jwks.json"), "--jwt-issuer", issuer, "--resource-url", resource),
            host="0.0.0.0",  # noqa: S104 - the non-loopback case is the point
            port=port,
        )
        try:
            await proxy.wait_until_listening()
            metadata_url = f"http://127.0.0.1:{port}/.well-known/oauth-protected-resource"
            async with httpx.AsyncClient(timeout=DEADLINE_S) as web:
                metadata = (await web.get(metadata_url)).json()
            assert metadata["resource"] == resource
            assert metadata["authorization_servers"] == [issuer]
            status, challenge = post_status(proxy.url, None)
            assert status == 401
            assert f'resource_metadata="http://mcp.example:{port}/.well-known/oauth-protected-resource"' in (
                challenge or ""
            )
            assert post_status(proxy.url, token(exp=int(time.time()) - 600))[0] == 401
            assert post_status(proxy.url, token(aud="http://elsewhere.example/mcp"))[0] == 401
            assert post_status(proxy.url, token(other))[0] == 401
            http = create_mcp_http_client(headers=bearer(token()))
            async with http, Client(streamable_http_client(proxy.url, http_client=http)) as client:
                done = await client.call_tool("write_file", {"path": "a.txt", "text": "hi"})
                assert not done.is_error, text_of(done)
        finally:
            code = proxy.stop()
        assert code == 0, proxy.stderr.read_text()
        uses = [(e.principal, e.tenant, e.tool) for e in read_jsonl(proxy.events) if e.type == "ToolUse"]
        assert uses == [("alice", "acme", "write_file")]


class TestUpstreamDeath:
    def test_an_upstream_killed_while_serving_ends_the_proxy_in_one_line(self, stdio_proxy: Any, root: Path) -> None:
        """The upstream SIGKILLed after a call: the proxy exits 1 with one `error:` line naming the
        upstream (no traceback), and the events of the calls made are written and verify."""
        proxy = stdio_proxy()
        proxy.initialize()
        assert proxy.call("write_file", {"path": "note.txt", "text": "hi"})["result"]["isError"] is False
        upstream_pid = int((root / "upstream.pid").read_text())
        os.kill(upstream_pid, signal.SIGKILL)
        assert gone(upstream_pid)
        code = proxy.wait()
        stderr = proxy.stderr_path.read_text()
        assert code == 1, stderr
        assert "Traceback" not in stderr
        (line,) = [x for x in stderr.splitlines() if x.startswith("error:")]
        assert "stopped serving" in line
        assert "mcp_upstream.py" in line
        found = read_jsonl(proxy.events)
        assert [e.type for e in found if e.type != "ToolsRegistered"] == ["ToolUse"]
        assert verify_chain(found).ok

    async def test_over_http_too(self, root: Path, tmp_path: Path) -> None:
        """The same over streamable HTTP: the proxy stops listening and exits 1 in one line."""
        proxy = HttpProxy(root, tmp_path)
        try:
            await proxy.wait_until_listening()
            async with Client(proxy.url) as client:
                assert not (await client.call_tool("write_file", {"path": "note.txt", "text": "hi"})).is_error
            os.kill(int((root / "upstream.pid").read_text()), signal.SIGKILL)
            proxy.process.wait(timeout=DEADLINE_S)
        finally:
            code = proxy.stop()
        stderr = proxy.stderr.read_text()
        assert code == 1, stderr
        assert "Traceback" not in stderr
        assert len([x for x in stderr.splitlines() if x.startswith("error: upstream")]) == 1
        assert [e.type for e in read_jsonl(proxy.events)] == ["ToolsRegistered", "ToolUse"]


class TestEveryRefusalIsRecorded:
    """Each refusal gets its JSON-RPC error and leaves one small `ToolDenied` (size and depth,
    never the content)."""

    def refusals(self, proxy: Any, count: int) -> list[Any]:
        found = read_events(proxy.events, lambda evs: sum(e.type == "ToolDenied" for e in evs) >= count)
        assert verify_chain(found).ok
        return [e for e in found if e.type == "ToolDenied"]

    def test_over_stdio(self, stdio_proxy: Any, root: Path) -> None:
        """Arguments that are not an object, ids of no legal type, a line past the size limit and
        10,000-deep nesting: each answered as the specification says and recorded; legal ids of
        every type are answered."""
        proxy = stdio_proxy()
        proxy.initialize()
        not_object = proxy.request("tools/call", {"name": "write_file", "arguments": [1, 2]})
        assert not_object["error"] == {
            "code": -32602,
            "message": "tools/call arguments must be an object, got an array",
        }
        for bad_id in (b'{"a":1}', b"true", b"null"):
            proxy.send(b'{"jsonrpc":"2.0","id":%s,"method":"ping"}' % bad_id)
            assert proxy.receive() == {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": BAD_ID}}
        for good_id in ("text-id", 0, -5, 2**53):
            proxy.send(json.dumps({"jsonrpc": "2.0", "id": good_id, "method": "ping"}).encode())
            assert proxy.answer_to(good_id)["result"] == {}
        proxy.send(b'{"jsonrpc":"2.0","id":9,"method":"ping","params":{"pad":"' + b"z" * FIVE_MB + b'"}}')
        assert proxy.receive()["error"]["code"] == -32600
        deep = b'{"jsonrpc":"2.0","id":10,"method":"tools/call","params":{"name":"write_file","arguments":{"a":'
        proxy.send(deep + b"[" * 10_000 + b"]" * 10_000 + b"}}}")
        assert proxy.receive()["error"]["code"] == -32600
        assert effects(root) == []
        denied = self.refusals(proxy, 6)
        assert [e.tool for e in denied] == [
            "write_file",
            *("ping", "ping", "ping"),
            *("unreadable-request", "unreadable-request"),
        ]
        assert all(e.decided_by == "validation" and e.args == {} for e in denied)
        assert "5242" in denied[4].message  # the size, in bytes
        assert "nested 10003 levels" in denied[5].message
        assert max(len(e.message) for e in denied) < 200

    async def test_over_http(self, root: Path, tmp_path: Path) -> None:
        """The same over streamable HTTP, and valid JSON that is no JSON-RPC message gets a short
        error that does not repeat it."""
        proxy = HttpProxy(root, tmp_path)
        try:
            await proxy.wait_until_listening()
            async with httpx.AsyncClient(timeout=DEADLINE_S) as http:
                headers = {"accept": "application/json, text/event-stream", "content-type": "application/json"}

                async def post(body: bytes) -> httpx.Response:
                    return await http.post(proxy.url, content=body, headers=headers)

                for bad_id in (b'{"a":1}', b"false", b"null"):
                    answer = await post(b'{"jsonrpc":"2.0","id":%s,"method":"ping"}' % bad_id)
                    assert (answer.status_code, answer.json()["error"]["code"]) == (400, -32600)
                    assert answer.json()["id"] is None
                noise = json.dumps({"hello": "x" * 2000}).encode()
                answer = await post(noise)
                assert answer.json()["error"]["code"] == -32600
                assert len(answer.content) < 200
                answer = await post(b"[" * 10_000 + b"]" * 10_000)
                assert answer.json()["error"]["code"] == -32600
                answer = await post(
                    b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"p":"' + b"z" * FIVE_MB + b'"}}'
                )
                assert (answer.status_code, answer.json()["error"]["code"]) == (413, -32600)
        finally:
            assert proxy.stop() == 0
        denied = [e for e in read_jsonl(proxy.events) if e.type == "ToolDenied"]
        assert [e.tool for e in denied] == [
            *("ping", "ping", "ping"),
            *("unreadable-request", "unreadable-request", "unreadable-request"),
        ]
        assert "nested 10000 levels" in denied[4].message
        assert str(len(b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"p":""}}') + FIVE_MB) in denied[5].message


BAD_ID = "Invalid request: id must be a string or an integer"
