"""`callgate mcp-proxy --config` over streamable HTTP with client authentication, in front of two
real servers: `@modelcontextprotocol/server-everything` (started by the gateway over stdio) and
the Python server of `mcp_headers_server.py`, reached as a `url:` entry with `headers:`. One
gateway process (with `--tokens` and `--jwt-jwks` both) and one HTTP server process serve the
whole module: completions of resource templates reach the server that owns the template, the
configured headers reach the HTTP server (and the client's own bearer token does not), and only
authenticated clients are served, each as the principal its token names; the HTTP server killed
and started again on its port is served again by itself. Last, headers HTTP could not carry as
written are refused when the file is read, without showing their values."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import jwt
import mcp_types as types
import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric import rsa
from mcp import Client
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

from events import verify_chain

from .conftest import HERE
from .test_mcp import DEADLINE_S, read_events, text_of
from .test_mcp_gateway import direct_params, everything, wait_for_line
from .test_mcp_proxy import free_port
from .test_mcp_proxy_hostile import bearer, post_status
from .test_mcp_proxy_servers import stderr_says

__all__ = ["everything"]  # the session fixture that installs server-everything

ALICE = "A" * 32
"""A token of the tokens file: alice, tenant acme."""

TOKENS = f"{ALICE} alice acme\n"

ISSUER = "https://idp.example"

UPSTREAM_SECRET = "Bearer upstream-secret-0123456789"  # noqa: S105 - a test value
"""The credential the config gives the HTTP server (not the clients' own)."""

HEADERS = {"X-Callgate-Test": "configured value", "Authorization": UPSTREAM_SECRET}

POLICY = "version: 1\nname: allow-all\nrules: []\n"

EVERYTHING_TEMPLATE = "demo://resource/dynamic/text/{resourceId}"
HELPER_TEMPLATE = "headers://{name}"


@dataclass
class Stack:
    """The module's gateway (its URL, events file and stderr) and the issuer's signing key."""

    url: str
    events: Path
    stderr: Path
    key: rsa.RSAPrivateKey
    process: subprocess.Popen[bytes]

    def jwt(self, signer: rsa.RSAPrivateKey | None = None, **claims: Any) -> str:
        now = int(time.time())
        body = {"sub": "carol", "iss": ISSUER, "aud": self.url, "exp": now + 300, "roles": ["tenant:globex"]}
        return jwt.encode({**body, **claims}, signer or self.key, algorithm="RS256", headers={"kid": "k1"})

    @asynccontextmanager
    async def client(self, token: str) -> AsyncIterator[Client]:
        http = create_mcp_http_client(headers=bearer(token))
        async with http, Client(streamable_http_client(self.url, http_client=http)) as client:
            yield client

    def events_until(self, until: Any) -> list[Any]:
        found = read_events(self.events, until)
        assert verify_chain(found).ok
        return [e for e in found if e.type != "ToolsRegistered"]


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=DEADLINE_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@dataclass
class HttpServer:
    """The headers server of the module, on a port it keeps when it is started again."""

    port: int
    log: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self) -> None:
        """Start it, and return once it listens (it says its port on a line of its own)."""
        line = f"{self.port}\n"
        before = self.log.read_text().count(line)
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, str(HERE / "mcp_headers_server.py")],
                env={**os.environ, "HEADERS_PORT": str(self.port)},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
            )
        deadline = time.monotonic() + DEADLINE_S
        while self.log.read_text().count(line) == before:
            if self.process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the headers server did not start (exit {self.process.poll()}):\n{self.log.read_text()}")
            time.sleep(0.05)  # sleep-ok: polling a file another process writes, with a deadline


@pytest.fixture(scope="module")
def http_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpServer]:
    """The headers server, started for the module."""
    server = HttpServer(free_port(), tmp_path_factory.mktemp("http-server") / "server.log")
    server.log.touch()
    try:
        server.start()
        yield server
    finally:
        if server.process is not None:
            stop(server.process)


@pytest.fixture(scope="module")
def stack(everything: Path, http_server: HttpServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The gateway over HTTP on 127.0.0.1 with a tokens file and an issuer's JWKS, fronting the
    headers server (first in the config) and server-everything, for the module."""
    tmp = tmp_path_factory.mktemp("gateway")
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    (tmp / "jwks.json").write_text(json.dumps({"keys": [{**jwk, "kid": "k1", "alg": "RS256", "use": "sig"}]}))
    (tmp / "tokens.txt").write_text(TOKENS)
    (tmp / "policy.yaml").write_text(POLICY)
    servers = [
        {"name": "remote", "url": http_server.url, "headers": HEADERS},
        {"name": "everything", "command": ["node", str(everything), "stdio"]},
    ]
    (tmp / "servers.yaml").write_text(yaml.safe_dump({"servers": servers}))
    port = free_port()
    events, stderr = tmp / "events.jsonl", tmp / "gateway.stderr"
    args = [
        *("-m", "callgate.cli", "mcp-proxy", "--policy", str(tmp / "policy.yaml"), "--events", str(events)),
        *("--config", str(tmp / "servers.yaml"), "--http", f"127.0.0.1:{port}", "--tokens", str(tmp / "tokens.txt")),
        *("--jwt-jwks", str(tmp / "jwks.json"), "--jwt-issuer", ISSUER),
    ]
    with stderr.open("wb") as err:
        process = subprocess.Popen([sys.executable, *args], stdin=subprocess.DEVNULL, stdout=err, stderr=err)
    try:
        wait_for_line(stderr, "listening on", process)
        yield Stack(f"http://127.0.0.1:{port}/mcp", events, stderr, key, process)
    finally:
        stop(process)


def resource_ref(uri: str) -> types.ResourceTemplateReference:
    return types.ResourceTemplateReference(type="ref/resource", uri=uri)


async def test_a_templates_completion_is_answered_by_the_server_that_owns_it(stack: Stack, everything: Path) -> None:
    """Asked before any listing: a completion of server-everything's template (second in the
    config) is answered as that server answers it directly, one of the headers server's template
    by the headers server; a template no server lists is invalid params, not echoed."""
    argument = {"name": "resourceId", "value": "42"}
    async with Client(stdio_client(direct_params(everything), errlog=sys.stderr)) as direct:
        expected = [
            (await direct.complete(resource_ref(EVERYTHING_TEMPLATE), {**argument, "value": value})).completion
            for value in ("42", "forty-two")
        ]
    async with stack.client(ALICE) as client:
        seen = [
            (await client.complete(resource_ref(EVERYTHING_TEMPLATE), {**argument, "value": value})).completion
            for value in ("42", "forty-two")
        ]
        helper = await client.complete(resource_ref(HELPER_TEMPLATE), {"name": "name", "value": "X-"})
        with pytest.raises(MCPError) as unknown:
            await client.complete(resource_ref("nobody://owns/{this-template}"), argument)
    assert [c.values for c in expected] == [["42"], []]
    assert seen == expected
    assert helper.completion.values == ["helper:X-"]
    assert unknown.value.code == types.INVALID_PARAMS
    assert unknown.value.error.message == "Invalid params: the reference names no server of this gateway"
    assert "nobody" not in str(unknown.value)


async def test_the_configured_headers_reach_the_http_server_with_every_request(stack: Stack) -> None:
    """The `headers:` of the `url:` entry arrive with the call's HTTP request and with every other
    request the gateway made to the server (its own session and the client's); the client's
    bearer token for the gateway never reaches the server."""
    async with stack.client(ALICE) as client:
        result = await client.call_tool("remote__request_headers", {})
    assert not result.is_error, text_of(result)
    seen = json.loads(text_of(result))
    assert seen["this"]["x-callgate-test"] == "configured value"
    assert seen["this"]["authorization"] == UPSTREAM_SECRET
    assert len(seen["every"]) >= 4  # two sessions' initialize and initialized, at the least
    assert [(h.get("x-callgate-test"), h.get("authorization")) for h in seen["every"]] == [
        ("configured value", UPSTREAM_SECRET)
    ] * len(seen["every"])
    assert ALICE not in json.dumps(seen)


def authenticated_only(events: list[Any]) -> None:
    """Every event of a client's crossing names a principal the gateway authenticated."""
    assert {e.principal for e in events} <= {"alice", "carol"}


async def test_the_tokens_files_clients_are_served_as_their_principal(stack: Stack) -> None:
    """No token, a token not in the file and a prefix of one are 401 (before the MCP layer, so no
    event, as without --config); alice's token is served: the events of her call and read (in the
    scope of the server that served each) and of the gateway's own refusals (an unknown URI, an
    unknown tool) name her and her tenant."""
    status, challenge = post_status(stack.url, None)
    assert status == 401
    assert (challenge or "").startswith('Bearer realm="callgate"')
    assert post_status(stack.url, "C" * 32)[0] == 401
    assert post_status(stack.url, ALICE[:-1])[0] == 401
    async with stack.client(ALICE) as client:
        echoed = await client.call_tool("everything__echo", {"message": "from alice"})
        read = await client.read_resource("headers://x-alice")
        with pytest.raises(MCPError):
            await client.read_resource("nobody://lists/this")
        with pytest.raises(MCPError):
            await client.call_tool("nobody__tool", {})
    assert "from alice" in text_of(echoed)
    assert read.contents
    found = stack.events_until(lambda evs: sum(e.principal == "alice" for e in evs) >= 4)
    alices = {(e.type, e.tenant, e.tool, e.agent) for e in found if e.principal == "alice"}
    assert {
        ("ToolUse", "acme", "everything__echo", "everything"),
        ("ToolUse", "acme", "mcp.resources.read", "remote"),
        ("ToolDenied", "acme", "mcp.resources.read", "mcp-proxy"),
        ("ToolDenied", "acme", "nobody__tool", "mcp-proxy"),
    } <= alices
    authenticated_only(found)


async def test_the_issuers_tokens_are_served_as_their_subject(stack: Stack) -> None:
    """The protected-resource metadata is served without a token and named in the 401; an expired
    token, one for another audience and one signed by another key are 401; a good one is served
    as its subject (carol) and tenant role (globex), which its call's event names."""
    metadata_url = stack.url.removesuffix("/mcp") + "/.well-known/oauth-protected-resource"
    async with httpx.AsyncClient(timeout=DEADLINE_S) as web:
        metadata = (await web.get(metadata_url)).json()
    assert metadata["resource"] == stack.url
    assert metadata["authorization_servers"] == [ISSUER]
    status, challenge = post_status(stack.url, None)
    assert status == 401
    assert f'resource_metadata="{metadata_url}"' in (challenge or "")
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    assert post_status(stack.url, stack.jwt(exp=int(time.time()) - 600))[0] == 401
    assert post_status(stack.url, stack.jwt(aud="http://elsewhere.example/mcp"))[0] == 401
    assert post_status(stack.url, stack.jwt(other))[0] == 401
    async with stack.client(stack.jwt()) as client:
        echoed = await client.call_tool("everything__echo", {"message": "from carol"})
    assert "from carol" in text_of(echoed)
    found = stack.events_until(lambda evs: any(e.principal == "carol" and e.type == "ToolUse" for e in evs))
    uses = {(e.principal, e.tenant, e.tool, e.agent) for e in found if e.type == "ToolUse"}
    assert ("carol", "globex", "everything__echo", "everything") in uses
    authenticated_only(found)
    assert "Traceback" not in stack.stderr.read_text()


async def test_the_http_server_restarted_is_served_again(stack: Stack, http_server: HttpServer) -> None:
    """The HTTP server is killed and started again on its port while the gateway serves it beside
    server-everything: the gateway hears at once that its session with it ended (its listen stream
    ends) and says so on stderr; meanwhile its calls are refused with a `ToolDenied` in its scope
    and server-everything serves on; once it is back (one line on stderr) the gateway has a new
    session with it, the client hears that the tools list changed, and its calls are served, with
    the configured headers, and recorded."""
    changes: list[str] = []

    async def heard(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            changes.append("tools")

    http = create_mcp_http_client(headers=bearer(ALICE))
    async with http, Client(streamable_http_client(stack.url, http_client=http), message_handler=heard) as client:
        assert not (await client.call_tool("remote__request_headers", {})).is_error
        assert http_server.process is not None
        http_server.process.kill()
        http_server.process.wait()
        await stderr_says(stack.stderr, "server remote lost (")
        refused = await client.call_tool("remote__request_headers", {})
        echoed = await client.call_tool("everything__echo", {"message": "meanwhile"})
        http_server.start()
        await stderr_says(stack.stderr, "server remote is back")
        with anyio.fail_after(DEADLINE_S):
            while not changes:
                await anyio.sleep(0.05)  # sleep-ok: polling what the client heard, with a deadline
        again = await client.call_tool("remote__request_headers", {})
    assert refused.is_error
    assert "MCP server 'remote' is unavailable: reconnecting" in text_of(refused)
    assert "meanwhile" in text_of(echoed)
    assert not again.is_error, text_of(again)
    seen = json.loads(text_of(again))
    assert seen["this"]["x-callgate-test"] == "configured value"
    said = await anyio.Path(stack.stderr).read_text()
    assert said.count("server remote lost (") == 1
    assert said.count("server remote is back") == 1
    assert "server everything" not in said

    def served_again(evs: list[Any]) -> bool:
        kinds = [e.type for e in evs if e.tool == "remote__request_headers"]
        return "ToolDenied" in kinds and kinds[-1] == "ToolUse"

    found = stack.events_until(served_again)
    calls = [(e.type, getattr(e, "outcome", None), e.agent) for e in found if e.tool == "remote__request_headers"]
    assert calls[-3:] == [("ToolUse", "ok", "remote"), ("ToolDenied", None, "remote"), ("ToolUse", "ok", "remote")]
    assert ("ToolUse", "ok", "everything") in [
        (e.type, getattr(e, "outcome", None), e.agent) for e in found if e.tool == "everything__echo"
    ]


SECRET = "s3cret-value-0123456789"  # noqa: S105 - a test value

UNSENDABLE = (
    "the value of header 'X-Token' must be printable ASCII without spaces around it (no line breaks or control "
    "characters)"
)


@pytest.mark.parametrize(
    ("headers", "said"),
    [
        ({"X-Token": f"{SECRET}\r\nEvil: injected"}, UNSENDABLE),
        ({"X-Token": f"{SECRET}\n"}, UNSENDABLE),
        ({"X-Token": f"{SECRET}\x00"}, UNSENDABLE),
        ({"X-Token": f"{SECRET}é"}, UNSENDABLE),
        ({"X-Token": f" {SECRET}"}, UNSENDABLE),
        ({"Bad Name": SECRET}, "the header name 'Bad Name' is not an HTTP header name"),
        ({"": SECRET}, "the header name '' is not an HTTP header name"),
        (
            {"X-Token": SECRET, "x-token": SECRET},
            "the header 'x-token' is given twice (header names are case-insensitive)",
        ),
    ],
    ids=["crlf", "newline", "nul", "non-ascii", "space", "name-space", "name-empty", "twice"],
)
def test_a_header_that_cannot_be_sent_as_written_is_refused_without_its_value(
    tmp_path: Path, headers: dict[str, str], said: str
) -> None:
    """A `headers:` entry HTTP cannot carry as written (a line break would add a header of its
    own) is refused when the file is read, naming the entry and the header but never its value
    (often a credential)."""
    from callgate.mcp_proxy import ProxyConfigError, load_gateway_config

    config = tmp_path / "servers.yaml"
    config.write_text(
        yaml.safe_dump({"servers": [{"name": "remote", "url": "http://127.0.0.1:9/mcp", "headers": headers}]})
    )
    with pytest.raises(ProxyConfigError) as refused:
        load_gateway_config(config)
    assert str(refused.value) == f"config {config}: servers[0]: {said}"
    assert SECRET not in str(refused.value)


def test_the_proxy_exits_2_in_one_line_for_such_a_header(tmp_path: Path) -> None:
    """From the command line: exit 2 with the one line, before any server is reached."""
    (tmp_path / "policy.yaml").write_text(POLICY)
    servers = [{"name": "remote", "url": "http://127.0.0.1:9/mcp", "headers": {"Authorization": f"{SECRET}\n"}}]
    (tmp_path / "servers.yaml").write_text(yaml.safe_dump({"servers": servers}))
    done = subprocess.run(
        [sys.executable, "-m", "callgate.cli", "mcp-proxy", "--policy", "policy.yaml", "--config", "servers.yaml"],
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "error: config servers.yaml: servers[0]: " + UNSENDABLE.replace("X-Token", "Authorization")
    ]
