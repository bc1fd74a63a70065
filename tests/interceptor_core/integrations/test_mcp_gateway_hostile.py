"""`callgate mcp-proxy --config` under hostile clients and operators: the cases of
test_mcp_proxy_hostile.py against a gateway in front of two real servers (`files` and `notes`,
each the Python test server of `mcp_upstream.py` on a root of its own, with its slow tool).

One gateway process over stdio and one over streamable HTTP serve the module, each ended by the
last test that uses it (a signal with a call in flight); the files run whole on one worker, in
order. Malformed lines and ids, oversized input, deep nesting and ill-typed arguments are each
answered as the specification says and leave one small `ToolDenied`; one server killed with a call
in flight is refused on its own tools while the other serves on; a config the gateway cannot serve
exits 2 with one line."""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import yaml
from mcp import Client

from events import read_jsonl, verify_chain

from .conftest import UPSTREAM, effects, upstream_command
from .test_mcp import DEADLINE_S, read_events, text_of
from .test_mcp_gateway import wait_for_line
from .test_mcp_proxy import free_port
from .test_mcp_proxy_hostile import BAD_ID, FIVE_MB, THREE_MB, StdioProxy, appears, gone, release, wait_for_file

POLICY = "version: 1\nname: allow-all\nrules: []\n"

SERVERS = ("files", "notes")

GATEWAY_SCOPE = "mcp-proxy"
"""The agent scope of refusals that name no server."""


def write_config(base: Path) -> dict[str, Path]:
    """The policy and servers.yaml under `base`, and each server's root (with its release FIFO)."""
    roots = {}
    for name in SERVERS:
        root = roots[name] = base / name
        root.mkdir()
        (root / "precious.txt").write_text("keep me")
        os.mkfifo(root / "release.fifo")
    servers = [
        {"name": name, "command": upstream_command(), "env": {"UPSTREAM_ROOT": str(root), "UPSTREAM_SLOW_TOOL": "1"}}
        for name, root in roots.items()
    ]
    (base / "servers.yaml").write_text(yaml.safe_dump({"servers": servers}))
    (base / "policy.yaml").write_text(POLICY)
    return roots


def gateway_command(base: Path, *extra: str) -> list[str]:
    return [
        *(sys.executable, "-m", "callgate.cli", "mcp-proxy", "--policy", str(base / "policy.yaml")),
        *("--events", str(base / "events.jsonl"), "--config", str(base / "servers.yaml"), *extra),
    ]


def pids(root: Path) -> list[int]:
    """Every process of the server on `root` (the gateway's own session and each client's)."""
    return [int(line) for line in (root / "upstream.pids").read_text().split()]


def kill_server(root: Path) -> None:
    """SIGKILL every process of the server on `root` still running (checked to be one, by its
    command line, before it is killed)."""
    for pid in pids(root):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue  # gone already
        if UPSTREAM.name.encode() in command:
            os.kill(pid, signal.SIGKILL)


def refusals(events: Path, count: int) -> list[Any]:
    """The `ToolDenied` events, once there are `count` of them; the chain verifies."""
    found = read_events(events, lambda evs: sum(e.type == "ToolDenied" for e in evs) >= count)
    assert verify_chain(found).ok
    return [e for e in found if e.type == "ToolDenied"]


def nested(depth: int) -> str:
    """An arguments object holding arrays `depth` deep."""
    return '{"a":' + "[" * depth + "]" * depth + "}"


def small_and_unechoed(denied: list[Any]) -> None:
    """Refusals before the gate: decided by validation, no arguments, a short message."""
    assert all(e.decided_by == "validation" and e.args == {} for e in denied)
    assert max(len(e.message) for e in denied) < 200


class StdioGateway(StdioProxy):
    """The gateway over stdio as a process, spoken to line by line."""

    def __init__(self, base: Path, roots: dict[str, Path]) -> None:
        self.root = roots["files"]
        self.roots = roots
        self.events = base / "events.jsonl"
        self.stderr_path = base / "gateway.stderr"
        with self.stderr_path.open("wb") as err:
            self.process = subprocess.Popen(
                gateway_command(base), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err
            )
        self._next_id = 100

    def denials_since(self, before: int, count: int) -> list[Any]:
        return refusals(self.events, before + count)[before:]

    def denials(self) -> int:
        return sum(e.type == "ToolDenied" for e in read_jsonl(self.events)) if self.events.exists() else 0


@pytest.fixture(scope="module")
def stdio_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StdioGateway]:
    base = tmp_path_factory.mktemp("stdio-gateway")
    roots = write_config(base)
    gateway = StdioGateway(base, roots)
    try:
        gateway.initialize()
        yield gateway
    finally:
        for root in roots.values():
            release(root)  # a slow call a failed test left waiting must not hold its server
        gateway.stop()


class TestHostileLinesOverStdio:
    def test_malformed_lines_and_ids_are_answered_and_recorded(self, stdio_gateway: StdioGateway) -> None:
        """Not JSON: -32700; JSON that is no message: -32600 with its id; ids of no legal type:
        -32600 with id null, legal ids of every type answered; arguments nested past the parser's
        limit, 10,000-deep nesting and a line past the size limit: -32600. The input is never
        echoed, each refusal is one small `ToolDenied` (in files' scope when the request named one
        of its tools, else in the gateway's), and both servers still serve."""
        gateway = stdio_gateway
        before = gateway.denials()
        gateway.send(b"this is not json")
        assert gateway.receive() == {
            "jsonrpc": "2.0",
            "id": None,
            "error": {"code": -32700, "message": "Parse error: expected ident at line 1 column 2"},
        }
        gateway.send(b'{"id": 7, "hello": "world"}')
        answer = gateway.receive()
        assert (answer["id"], answer["error"]["code"]) == (7, -32600)
        assert "world" not in json.dumps(answer)
        for bad_id in (b'{"a":1}', b"true", b"null"):
            gateway.send(b'{"jsonrpc":"2.0","id":%s,"method":"ping"}' % bad_id)
            assert gateway.receive() == {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": BAD_ID}}
        for good_id in ("text-id", 0, -5, 2**53):
            gateway.send(json.dumps({"jsonrpc": "2.0", "id": good_id, "method": "ping"}).encode())
            assert gateway.answer_to(good_id)["result"] == {}
        call = '{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"files__write_file","arguments":%s}}'
        gateway.send((call % nested(300)).encode())
        answer = gateway.receive()
        assert (answer["id"], answer["error"]["code"]) == (8, -32600)
        assert "recursion limit exceeded" in answer["error"]["message"]
        gateway.send((call % nested(10_000)).encode())
        assert gateway.receive()["error"]["code"] == -32600
        gateway.send(b'{"jsonrpc":"2.0","id":9,"method":"ping","params":{"pad":"' + b"z" * FIVE_MB + b'"}}')
        answer = gateway.receive()
        assert (answer["id"], answer["error"]["code"]) == (None, -32600)
        assert len(json.dumps(answer)) < 200
        for server in SERVERS:
            done = gateway.call(f"{server}__write_file", {"path": "after.txt", "text": "fine"})
            assert done["result"]["isError"] is False, done
        assert effects(gateway.roots["files"]) == effects(gateway.roots["notes"]) == ["write after.txt"]
        denied = gateway.denials_since(before, 8)
        assert [e.tool for e in denied] == [
            *("unreadable-request", "unreadable-request"),
            *("ping", "ping", "ping"),
            *("files__write_file", "unreadable-request", "unreadable-request"),
        ]
        scopes = [e.agent for e in denied]
        assert scopes == [GATEWAY_SCOPE] * 5 + ["files"] + [GATEWAY_SCOPE] * 2
        small_and_unechoed(denied)
        assert "nested 10003 levels" in denied[6].message
        assert "5242" in denied[7].message  # the size, in bytes

    def test_oversized_and_ill_typed_params_are_refused_small_and_recorded(self, stdio_gateway: StdioGateway) -> None:
        """Arguments that are not an object, a name that is not a string, a 3 MB tool name and 2 MB
        of arguments: invalid params stating sizes, never the input; none reaches a server (no
        effect, no extra listing), and each leaves one small `ToolDenied` in the scope of the server
        its name names (the gateway's for a name that is not a string), the long name cut."""
        gateway = stdio_gateway
        before, lists = gateway.denials(), gateway.lists()
        answer = gateway.request("tools/call", {"name": "notes__write_file", "arguments": [1, 2]})
        assert answer["error"] == {"code": -32602, "message": "tools/call arguments must be an object, got an array"}
        answer = gateway.request("tools/call", {"name": "files__write_file", "arguments": "rm -rf"})
        assert answer["error"]["code"] == -32602
        assert "rm -rf" not in json.dumps(answer)
        answer = gateway.request("tools/call", {"name": 5, "arguments": {}})
        assert answer["error"]["code"] == -32602
        answer = gateway.call("files__" + "x" * THREE_MB, {})
        assert answer["error"]["code"] == -32602
        assert f"tool name of {THREE_MB + 7} characters refused" in answer["error"]["message"]
        assert len(json.dumps(answer)) < 300
        answer = gateway.call("notes__write_file", {"path": "big.txt", "text": "y" * (2 * 1024 * 1024)})
        assert answer["error"]["code"] == -32602
        assert "arguments of 2097" in answer["error"]["message"]
        assert len(json.dumps(answer)) < 300
        assert gateway.lists() == lists
        assert not (gateway.roots["notes"] / "big.txt").exists()
        denied = gateway.denials_since(before, 5)
        assert [(e.tool, e.agent) for e in denied] == [
            ("notes__write_file", "notes"),
            ("files__write_file", "files"),
            ("unnamed-tool", GATEWAY_SCOPE),
            ("files__" + "x" * 57 + "…", "files"),
            ("notes__write_file", "notes"),
        ]
        small_and_unechoed(denied)

    def test_unknown_names_are_refused_and_list_a_server_at_most_once_a_second(
        self, stdio_gateway: StdioGateway
    ) -> None:
        """Thirty calls of tools the files server does not have: each answered unknown, the server
        listed again at most once per second of the run; a prefix no server has is refused without
        asking any server, with a `ToolDenied` in the gateway's scope."""
        gateway = stdio_gateway
        before, lists = gateway.denials(), gateway.lists()
        began = time.monotonic()
        for n in range(30):
            answer = gateway.call(f"files__no_such_tool_{n}", {})
            assert answer["result"]["isError"] is True, answer
            assert "Unknown tool" in answer["result"]["content"][0]["text"]
        elapsed = time.monotonic() - began
        assert 1 <= gateway.lists() - lists <= 1 + int(elapsed)
        answer = gateway.call("nobody__tool", {})
        assert answer["error"]["code"] == -32602
        listed = gateway.lists()
        (denied,) = [e for e in gateway.denials_since(before, 31) if e.tool == "nobody__tool"]
        assert denied.agent == GATEWAY_SCOPE
        assert gateway.lists() == listed

    # The last test of the module's stdio gateway: it ends the process.
    def test_sigterm_with_a_call_in_flight_answers_it_records_it_and_exits_0(self, stdio_gateway: StdioGateway) -> None:
        """SIGTERM while notes' slow call waits in the server: the gateway says it is draining,
        the call (released only then) completes and is answered, its `ToolUse` in notes' scope is
        written, every server process is stopped and the gateway exits 0."""
        gateway = stdio_gateway
        notes = gateway.roots["notes"]
        request_id = gateway.send_request(
            "tools/call", {"name": "notes__slow_write", "arguments": {"path": "late.txt", "text": "hi"}}
        )
        wait_for_file(notes / "slow.started")
        gateway.process.send_signal(signal.SIGTERM)
        gateway.wait_for_stderr("stopping; waiting up to 30 s for 1 request in flight")
        assert gateway.process.poll() is None
        assert release(notes)
        answer = gateway.answer_to(request_id)
        assert answer["result"]["isError"] is False, answer
        assert answer["result"]["content"][0]["text"] == "wrote 2 chars to late.txt"
        assert gateway.wait() == 0, gateway.stderr_path.read_text()
        assert "Traceback" not in gateway.stderr_path.read_text()
        assert effects(notes)[-1] == "slow_write late.txt released"
        found = read_jsonl(gateway.events)
        assert verify_chain(found).ok
        uses = [(e.tool, e.agent, e.outcome) for e in found if e.type == "ToolUse" and e.tool.endswith("slow_write")]
        assert uses == [("notes__slow_write", "notes", "ok")]
        assert all(gone(pid) for root in gateway.roots.values() for pid in pids(root))


@dataclass
class HttpGateway:
    url: str
    port: int
    events: Path
    stderr: Path
    roots: dict[str, Path]
    process: subprocess.Popen[bytes]

    async def wait_until_not_listening(self) -> None:
        """Return once the gateway refuses connections (it has begun to stop); fail at the deadline."""
        with anyio.fail_after(DEADLINE_S):
            while True:
                try:
                    with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                        pass
                except OSError:
                    return
                await anyio.sleep(0.05)


@pytest.fixture(scope="module")
def http_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpGateway]:
    base = tmp_path_factory.mktemp("http-gateway")
    roots = write_config(base)
    port = free_port()
    stderr = base / "gateway.stderr"
    with stderr.open("wb") as err:
        process = subprocess.Popen(
            gateway_command(base, "--http", f"127.0.0.1:{port}"), stdin=subprocess.DEVNULL, stdout=err, stderr=err
        )
    try:
        wait_for_line(stderr, "listening on", process)
        yield HttpGateway(f"http://127.0.0.1:{port}/mcp", port, base / "events.jsonl", stderr, roots, process)
    finally:
        for root in roots.values():
            release(root)
        if process.poll() is None:
            process.kill()
            process.wait()


class TestOverHttp:
    async def test_malformed_posts_are_answered_and_recorded(self, http_gateway: HttpGateway) -> None:
        """Ids of no legal type: 400 and -32600 with id null; valid JSON that is no JSON-RPC
        message: a short -32600 that does not repeat it; 10,000-deep nesting: -32600; a 5 MB body:
        413. Each leaves one small `ToolDenied` in the gateway's scope, stating depth and size."""
        async with httpx.AsyncClient(timeout=DEADLINE_S) as http:
            headers = {"accept": "application/json, text/event-stream", "content-type": "application/json"}

            async def post(body: bytes) -> httpx.Response:
                return await http.post(http_gateway.url, content=body, headers=headers)

            for bad_id in (b'{"a":1}', b"false", b"null"):
                answer = await post(b'{"jsonrpc":"2.0","id":%s,"method":"ping"}' % bad_id)
                assert (answer.status_code, answer.json()["error"]["code"]) == (400, -32600)
                assert answer.json()["id"] is None
            answer = await post(json.dumps({"hello": "x" * 2000}).encode())
            assert answer.json()["error"]["code"] == -32600
            assert len(answer.content) < 200
            answer = await post(b"[" * 10_000 + b"]" * 10_000)
            assert answer.json()["error"]["code"] == -32600
            big = b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"p":"' + b"z" * FIVE_MB + b'"}}'
            answer = await post(big)
            assert (answer.status_code, answer.json()["error"]["code"]) == (413, -32600)
        denied = refusals(http_gateway.events, 6)
        assert [e.tool for e in denied] == [
            *("ping", "ping", "ping"),
            *("unreadable-request", "unreadable-request", "unreadable-request"),
        ]
        assert {e.agent for e in denied} == {GATEWAY_SCOPE}
        small_and_unechoed(denied)
        assert "nested 10000 levels" in denied[4].message
        assert str(len(big)) in denied[5].message

    async def test_a_server_killed_with_a_call_in_flight_is_refused_while_the_other_serves(
        self, http_gateway: HttpGateway
    ) -> None:
        """Every process of the notes server SIGKILLed while its slow call waits: that call is
        answered with an error naming the server (recorded as a failed `ToolUse` in notes'
        scope), notes' next call is refused with a `ToolDenied` there, notes' tools leave the
        list, the files server still serves, stderr says it in one line, and the gateway runs on."""
        notes = http_gateway.roots["notes"]
        async with Client(http_gateway.url) as client, anyio.create_task_group() as tasks:
            await client.list_tools()
            results: list[Any] = []

            async def slow_call() -> None:
                results.append(await client.call_tool("notes__slow_write", {"path": "late.txt", "text": "hi"}))

            tasks.start_soon(slow_call)
            await appears(notes / "slow.started")
            kill_server(notes)
            with anyio.fail_after(DEADLINE_S):
                while not results:
                    await anyio.sleep(0.05)
            again = await client.call_tool("notes__write_file", {"path": "after.txt", "text": "x"})
            written = await client.call_tool("files__write_file", {"path": "after.txt", "text": "fine"})
            listed = {tool.name for tool in (await client.list_tools(cache_mode="refresh")).tools}
        (in_flight,) = results
        assert in_flight.is_error
        assert "MCP server 'notes' is unavailable: stopped serving" in text_of(in_flight)
        assert again.is_error
        assert "MCP server 'notes' is unavailable: stopped serving" in text_of(again)
        assert not written.is_error, text_of(written)
        assert "files__write_file" in listed
        assert not [name for name in listed if name.startswith("notes__")]
        assert http_gateway.process.poll() is None
        listening, said = http_gateway.stderr.read_text().splitlines()
        assert listening == f"callgate mcp-proxy: listening on {http_gateway.url}"
        assert said.startswith("callgate mcp-proxy: server notes stopped serving")
        assert effects(notes) == []
        assert not (notes / "after.txt").exists()
        found = read_events(http_gateway.events, lambda evs: any(e.tool == "notes__write_file" for e in evs))
        assert verify_chain(found).ok
        calls = [(e.type, e.tool, e.agent, getattr(e, "outcome", None)) for e in found if e.type != "ToolsRegistered"]
        assert ("ToolUse", "notes__slow_write", "notes", "error") in calls
        assert ("ToolDenied", "notes__write_file", "notes", None) in calls
        assert ("ToolUse", "files__write_file", "files", "ok") in calls

    # The last test of the module's HTTP gateway: it ends the process.
    async def test_sigint_with_a_client_connected_and_a_call_in_flight_exits_0_within_5_s(
        self, http_gateway: HttpGateway
    ) -> None:
        """An SDK client holds its stream open while files' slow call waits in the server: SIGINT
        stops the listening, the call (released only then) is answered and recorded, and the
        gateway exits 0 within 5 s of the signal with every server process stopped."""
        files = http_gateway.roots["files"]
        async with Client(http_gateway.url) as client:
            await client.list_tools()
            results: list[Any] = []

            async def slow_call() -> None:
                results.append(await client.call_tool("files__slow_write", {"path": "late.txt", "text": "hi"}))

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(slow_call)
                await appears(files / "slow.started")
                started = time.monotonic()
                http_gateway.process.send_signal(signal.SIGINT)
                await http_gateway.wait_until_not_listening()
                assert release(files)
            code = await anyio.to_thread.run_sync(lambda: http_gateway.process.wait(timeout=DEADLINE_S))
            took = time.monotonic() - started
        assert code == 0, http_gateway.stderr.read_text()
        assert took < 5.0
        (result,) = results
        assert (result.is_error, text_of(result)) == (False, "wrote 2 chars to late.txt")
        assert "Traceback" not in http_gateway.stderr.read_text()
        found = read_jsonl(http_gateway.events)
        assert verify_chain(found).ok
        uses = [(e.tool, e.agent, e.outcome) for e in found if e.type == "ToolUse"]
        assert ("files__slow_write", "files", "ok") in uses
        assert all(gone(pid) for root in http_gateway.roots.values() for pid in pids(root))


NOT_MCP = "print('hello, I am no server')"


def test_a_config_the_gateway_cannot_serve_exits_2_with_one_line(tmp_path: Path) -> None:
    """A missing file, YAML that does not parse, an unknown key, a server name given twice, and
    servers of which none is an MCP server: each exits 2 before anything is served, with one line
    on stderr naming the file (and the entry), nothing on stdout. Run side by side."""
    (tmp_path / "policy.yaml").write_text(POLICY)
    good = {"name": "files", "command": ["python", "server.py"]}
    chatty = [sys.executable, "-c", NOT_MCP]
    configs = {
        "bad-yaml": "servers:\n  - name: files\n    command: [python\n",
        "unknown-key": yaml.safe_dump({"servers": [{**good, "cwd": "/"}]}),
        "twice": yaml.safe_dump({"servers": [good, {**good, "command": ["node", "x.js"]}]}),
        "not-mcp": yaml.safe_dump(
            {
                "servers": [
                    {"name": "chatty", "command": chatty},
                    {"name": "gone", "command": [str(tmp_path / "no-such-server")]},
                ]
            }
        ),
    }
    for case, text in configs.items():
        (tmp_path / f"{case}.yaml").write_text(text)
    running = {
        case: subprocess.Popen(
            [
                *(sys.executable, "-m", "callgate.cli", "mcp-proxy", "--policy", "policy.yaml"),
                *("--config", f"{case}.yaml"),
            ],
            cwd=tmp_path,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for case in ("missing", *configs)
    }
    seen = {}
    for case, process in running.items():
        out, err = process.communicate(timeout=DEADLINE_S * 2)
        seen[case] = (process.returncode, err.splitlines(), out)
    assert seen == {
        "missing": (
            2,
            ["error: config missing.yaml cannot be read: [Errno 2] No such file or directory: 'missing.yaml'"],
            "",
        ),
        "bad-yaml": (2, ["error: config bad-yaml.yaml is not valid YAML at line 4"], ""),
        "unknown-key": (
            2,
            ["error: config unknown-key.yaml: servers[0]: unknown key 'cwd' (known: command, env, headers, name, url)"],
            "",
        ),
        "twice": (2, ["error: config twice.yaml: servers[1]: the server name 'files' is given twice"], ""),
        "not-mcp": (
            2,
            [
                f"error: no server of the config started: chatty upstream {shlex.join(chatty)} is not an MCP server: "
                "it wrote lines that are not JSON-RPC, then MCPError: Connection closed; "
                f"gone upstream command '{tmp_path / 'no-such-server'}' not found"
            ],
            "",
        ),
    }
