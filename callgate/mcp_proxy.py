"""`callgate mcp-proxy`: a gated MCP server in front of one upstream MCP server started as a
command (the single form), or of the several servers of a `--config` file.

The wiring only: the gate comes from the user's `MODULE:FACTORY` (or policy files), the upstreams
are started over stdio (or reached over streamable HTTP), each one's tools are registered in its
agent scope, and `interceptor_core.integrations.mcp_gateway.McpGateway` serves them over stdio (or
streamable HTTP): both forms run the one serving loop of `_serve`, the single form as a gateway of
one server without prefixes. Nothing is written to stdout but MCP messages.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import inspect
import ipaddress
import logging
import math
import os
import re
import shlex
import signal
import socket
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from interceptor_core import ConfigurationError, Gate, RunContext

log = logging.getLogger("callgate.mcp_proxy")

DEFAULT_PRINCIPAL = "mcp-client"
"""Who the proxy's events say it acts for when the command line does not name a principal."""

STARTUP_TIMEOUT_S = 30.0
"""How long the upstream has to answer initialize and tools/list before the proxy gives up."""

MIN_TOKEN_CHARS = 16
"""The shortest bearer token a tokens file may hold (a guessable token is no authentication)."""

RECONNECT_FIRST_S = 0.5
"""Under `--config`, how long after losing a server reached over HTTP the gateway first tries to
reach it again; the wait doubles after each failed try, up to `RECONNECT_MAX_S`."""

RECONNECT_MAX_S = 30.0
"""The longest wait between two tries to reach again a server lost over HTTP."""

STDIO_GRACE_S = 30.0
"""Over stdio, how long requests in flight at SIGINT/SIGTERM (or the end of stdin) have to finish
before they are cancelled; a second signal cancels them at once."""


class ProxyConfigError(Exception):
    """The command line cannot be turned into a running proxy; the message says why."""


def build_sinks(
    events: Path | None, kafka: str | None, topic: str, spool_dir: Path | None, confirm_group: str | None = None
) -> list[Any]:
    """The sinks `--events` and `--kafka` (with `--confirm-group`) ask for (none when neither is given).
    The JSONL file is opened when the gate is built (a path that cannot be written is refused
    then); a Kafka spool directory that cannot be made is a `ProxyConfigError` here."""
    sinks: list[Any] = []
    if events is not None:
        from events import JsonlSink

        sinks.append(JsonlSink(events))
    if kafka is not None:
        from events.kafka import KafkaSink, SpoolLocked

        try:
            sinks.append(KafkaSink(kafka, topic, spool_dir, confirm_group=confirm_group))
        except SpoolLocked as exc:
            raise ProxyConfigError(str(exc)) from None
        except OSError as exc:
            raise ProxyConfigError(f"the Kafka spool cannot be used: {exc}") from None
    return sinks


def _takes_sinks(factory: Any) -> bool:
    try:
        inspect.signature(factory).bind(sinks=[])
    except (TypeError, ValueError):
        return False
    return True


def gate_from_factory(spec: str, sinks: Sequence[Any]) -> Gate:
    """The `Gate` that `MODULE:FACTORY` names: a `Gate` built already, or a function returning
    one. The sinks `--events`/`--kafka` ask for are the proxy's to add: a function taking a
    `sinks=` keyword is called with them; any other function is called with no arguments and
    the sinks are added to the gate it returns (`Gate.add_sink`), as they are to a ready gate.
    `ProxyConfigError` when the gate cannot take them (it emitted events or mediated calls
    already, or a sink cannot start)."""
    import typer

    from callgate.loading import load_object

    try:
        obj = load_object(spec)
    except typer.BadParameter as exc:
        raise ProxyConfigError(f"--gate {exc.message}") from None
    given = False
    if isinstance(obj, Gate):
        gate = obj
    elif not callable(obj):
        raise ProxyConfigError(f"{spec} is not a Gate or a function returning one: it is of type {type(obj).__name__}")
    elif sinks and _takes_sinks(obj):
        gate, given = obj(sinks=list(sinks)), True
    else:
        gate = obj()
    if not isinstance(gate, Gate):
        raise ProxyConfigError(f"{spec}() returned a value of type {type(gate).__name__}, not a Gate")
    if not given:
        for sink in sinks:
            try:
                gate.add_sink(sink)
            except ConfigurationError as exc:
                raise ProxyConfigError(f"{spec}: the gate cannot take the --events/--kafka sinks: {exc}") from None
    return gate


@dataclass(frozen=True)
class ProxyClient:
    """One line of a tokens file: who a bearer token stands for. `run` is the `RunContext` every
    call made with the token carries (one per client for the life of the process)."""

    principal: str
    tenant: str | None
    line: int
    run: RunContext


class TokenTable:
    """The bearer tokens of `--tokens FILE`, each standing for a principal and a tenant.

    Holds only SHA-256 digests of the tokens. `client(token)` compares the digest of the token
    given with every entry's in constant time (`hmac.compare_digest`, no early exit), so neither
    the time taken nor an error says how much of a token was right. Safe from several threads.
    """

    def __init__(self, entries: Mapping[str, ProxyClient]) -> None:
        self._entries = [(hashlib.sha256(token.encode()).digest(), client) for token, client in entries.items()]

    def __len__(self) -> int:
        return len(self._entries)

    def client(self, token: str | None) -> ProxyClient | None:
        """The client `token` stands for, or None (no token, or one not in the file)."""
        given = hashlib.sha256((token or "").encode()).digest()
        found = None
        for digest, client in self._entries:
            if hmac.compare_digest(digest, given) and token:
                found = client
        return found

    @classmethod
    def load(cls, path: Path) -> TokenTable:
        """Read a tokens file: one client per line, `TOKEN PRINCIPAL [TENANT]` separated by
        whitespace; blank lines and lines starting with `#` are skipped. `ProxyConfigError`
        naming FILE:LINE (never the token) for a line without a principal or with more than three
        fields, a token shorter than `MIN_TOKEN_CHARS`, a token given twice, or a file with no
        token; or naming the file when it cannot be read."""
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ProxyConfigError(f"tokens file {path} cannot be read: {exc}") from None
        entries: dict[str, ProxyClient] = {}
        for number, raw in enumerate(text.splitlines(), start=1):
            fields = raw.split()
            if not fields or fields[0].startswith("#"):
                continue
            where = f"tokens file {path}:{number}"
            if len(fields) not in (2, 3):
                raise ProxyConfigError(f"{where}: expected TOKEN PRINCIPAL [TENANT], got {len(fields)} fields")
            token, principal = fields[0], fields[1]
            tenant = fields[2] if len(fields) == 3 else None
            if len(token) < MIN_TOKEN_CHARS:
                raise ProxyConfigError(f"{where}: the token is shorter than {MIN_TOKEN_CHARS} characters")
            if token in entries:
                raise ProxyConfigError(f"{where}: the same token as line {entries[token].line}")
            entries[token] = ProxyClient(principal, tenant, number, RunContext(tenant=tenant, principal=principal))
        if not entries:
            raise ProxyConfigError(f"tokens file {path} holds no token")
        return cls(entries)


class OAuthClients:
    """OAuth 2.1 bearer tokens (JWTs) of an issuer, checked against its JWKS (`jwks`: a file or an
    https URL) with `consumers.auth.JwtAuthenticator`: signature by a public-key algorithm, `exp`,
    `iss` equal to `issuer`, `aud` containing `audience` (the MCP server's URL, as the MCP
    authorization specification asks), `sub`. The subject becomes the events' `principal`; a role
    `tenant:<id>` (in `roles_claim`), when the token carries exactly one, the `tenant`.

    `metadata` is the OAuth protected-resource metadata (RFC 9728) of `resource`. `client(token)`
    may block on a JWKS fetch (a URL's keys are cached). `ProxyConfigError` for an unusable JWKS
    file or setting."""

    def __init__(self, jwks: str, *, issuer: str, audience: str, resource: str, roles_claim: str = "roles") -> None:
        from consumers.auth import ConfigError, JwtAuthenticator

        try:
            self._checker = JwtAuthenticator(jwks, audience=audience, issuer=issuer, roles_claim=roles_claim)
        except ConfigError as exc:
            raise ProxyConfigError(str(exc)) from None
        self.issuer = issuer
        self.resource = resource
        self._runs: dict[tuple[str, str | None], ProxyClient] = {}

    @property
    def metadata(self) -> dict[str, Any]:
        return {
            "resource": self.resource,
            "authorization_servers": [self.issuer],
            "bearer_methods_supported": ["header"],
        }

    def client(self, token: str | None) -> ProxyClient | None:
        """The client a valid token stands for (one `RunContext` per subject and tenant for the
        life of the process), or None."""
        from consumers.auth import AuthError

        if not token:
            return None
        try:
            identity = self._checker.authenticate(token)
        except AuthError as exc:
            log.info("bearer token refused: %s", exc)
            return None
        tenants = sorted(role.removeprefix("tenant:") for role in identity.roles if role.startswith("tenant:"))
        tenant = tenants[0] if len(tenants) == 1 else None
        key = (identity.subject, tenant)
        known = self._runs.get(key)
        if known is None:
            if len(self._runs) >= 10_000:
                self._runs.clear()  # a bound on what many subjects can hold; runs begin anew
            known = self._runs[key] = ProxyClient(
                identity.subject, tenant, 0, RunContext(tenant=tenant, principal=identity.subject)
            )
        return known


class ProxyAuth:
    """Who an HTTP request is from: a token of the tokens file first, then an OAuth bearer token."""

    def __init__(self, tokens: TokenTable | None, oauth: OAuthClients | None) -> None:
        self.tokens = tokens
        self.oauth = oauth

    def client(self, token: str | None) -> ProxyClient | None:
        found = self.tokens.client(token) if self.tokens is not None else None
        if found is None and self.oauth is not None:
            found = self.oauth.client(token)
        return found


def parse_listen(spec: str) -> tuple[str, int]:
    """`HOST:PORT` of `--http` (an IPv6 host in brackets); `ProxyConfigError` for anything else,
    a port out of 1-65535 included."""
    host, _, port = spec.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not host or not port.isdigit():
        raise ProxyConfigError(f"--http expects HOST:PORT, got {spec!r}")
    if not 1 <= int(port) <= 65535:
        raise ProxyConfigError(f"--http {spec}: port {int(port)} is out of range (1-65535)")
    return host, int(port)


def listen_socket(host: str, port: int) -> tuple[socket.socket, bool]:
    """A socket bound to `host:port` and listening, and whether every address of `host` is a
    loopback one. `ProxyConfigError` naming the address for a host that does not resolve or an
    address that cannot be bound (in use, not this machine's, privileged)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:
        raise ProxyConfigError(f"--http {host}:{port}: the host does not resolve ({exc})") from None
    loopback = all(ipaddress.ip_address(str(info[4][0]).split("%")[0]).is_loopback for info in infos)
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise ProxyConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock, loopback


def build_proxy_gate(spec: str | None, policies: Sequence[Path], sinks: Sequence[Any]) -> Gate:
    """The proxy's gate: `MODULE:FACTORY`'s (see `gate_from_factory`), with the policy files added
    as application interceptors, or a gate of the policy files alone. The policies reload when
    their files change. `ProxyConfigError` for neither, for a policy file that fails its checks
    (every problem, one per line), or for a gate that cannot be built (a `ConfigurationError`,
    such as an events file that cannot be written: its message as it is)."""
    from interceptor_core.policy import PolicyError, load_policy

    if spec is None and not policies:
        raise ProxyConfigError("nothing to enforce: give --gate MODULE:FACTORY or --policy FILE")
    loaded = []
    for path in policies:
        try:
            loaded.append(load_policy(path, watch=True))
        except PolicyError as exc:
            raise ProxyConfigError(f"policy file refused:\n{exc}") from None
    try:
        if spec is None:
            return Gate("mcp-proxy", interceptors=loaded, sinks=sinks)
        gate = gate_from_factory(spec, sinks)
    except ConfigurationError as exc:
        raise ProxyConfigError(str(exc)) from None
    for policy in loaded:
        gate.add_interceptor(policy)
    return gate


async def run_proxy(
    gate: Gate,
    upstream: Sequence[str],
    *,
    http: tuple[str, int] | None = None,
    agent: str = "mcp-proxy",
    prefix: str = "",
    tenant: str | None = None,
    principal: str = DEFAULT_PRINCIPAL,
    tokens: TokenTable | None = None,
    startup_timeout_s: float = STARTUP_TIMEOUT_S,
    grace_s: float = STDIO_GRACE_S,
    oauth: OAuthClients | None = None,
) -> int:
    """Start `upstream` (a command and its arguments, speaking MCP on stdio), register its tools
    in `gate.agent(agent)` and serve them through the gate until the client side closes (stdio)
    or SIGINT/SIGTERM (either mode): an `McpGateway` of this one server without prefixes, which
    serves it as it is (its names, identity, instructions, capabilities and protocol era).
    Stopping is graceful in both modes: no new request is taken, requests in flight finish and
    are answered (over stdio for up to `grace_s` seconds, then they are cancelled, as they are at
    a second signal), then the upstream is stopped. Calls are made for `tenant` and `principal`
    (one `RunContext` for the life of the process, also on the scope's `ToolsRegistered` events),
    or, over HTTP with `tokens`, for the client whose bearer token the request carries. An
    upstream that stops serving ends the proxy as a signal does, then exit 1 with one line.

    `ProxyConfigError` (nothing served, the upstream stopped) for: an HTTP address that does not
    parse, cannot be bound or is not loopback while there are no `tokens`; an upstream command
    that is missing or cannot be run; an upstream that does not answer as an MCP server within
    `startup_timeout_s`. Closes the gate's sinks on the way out (also after a signal). Returns
    the exit status: 0, or 1 when the upstream stopped serving or an audit sink lost events
    (never stored or dropped), said in one line on stderr."""
    try:
        if not upstream:
            raise ProxyConfigError("no upstream command: put it after --, e.g. -- python my_server.py")
        if upstream[0].startswith("-"):
            # Options the command line did not know land here; none is a command.
            raise ProxyConfigError(f"unknown option {upstream[0]!r}: the upstream command goes after --")
    except ProxyConfigError:
        # A sink's thread (Kafka's) must not outlive the refusal.
        await gate.close()
        raise
    form = _Form(agent, prefix, tenant, principal, startup_timeout_s, grace_s)
    return await _run(gate, [UpstreamSpec(agent, tuple(upstream), {})], form, http, tokens, oauth)


class _UpstreamNoise(logging.Filter):
    """The SDK's complaint about an upstream line that is not JSON-RPC: counted and kept quiet
    while the proxy starts (the one-line startup error says so), one line without its traceback
    after."""

    def __init__(self) -> None:
        super().__init__()
        self.unparsed = 0
        self.starting = True

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info is not None:
            self.unparsed += 1
            record.exc_info = None
            record.exc_text = None
        return not self.starting


class _HttpNoise(logging.Filter):
    """The SDK's complaints about the requests of a session with a server reached over HTTP, left
    out while a server is being reached again (`reconnecting` names those servers), and its
    complaint that a session closed with a server that restarted could not be ended there (the
    server no longer knows it)."""

    def __init__(self, reconnecting: set[str]) -> None:
        super().__init__()
        self.reconnecting = reconnecting

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.reconnecting and not record.getMessage().startswith("Session termination failed")


_RECONNECTING = "reconnecting ("


def _reconnecting(why: str | None) -> str:
    """What a server lost over HTTP is, as its refused calls say it ("... is unavailable: ...")."""
    return f"{_RECONNECTING}{_lost_reason(why)})"


def _lost_reason(down: str | None) -> str:
    """Why a server was lost, from what marked it down."""
    said = down or "stopped serving"
    if said.startswith(_RECONNECTING) and said.endswith(")"):
        said = said[len(_RECONNECTING) : -1]
    return said


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def _upstream_lost(exc: BaseException) -> str | None:
    """What says the upstream went away while serving (its stream ended or broke), or None for any
    other error (a fault of the proxy itself, which keeps its traceback)."""
    from mcp.client.subscriptions import SubscriptionLost

    gone = (SubscriptionLost, anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError)
    leaves = [e for e in _leaves(exc) if not isinstance(e, anyio.get_cancelled_exc_class())]
    if not leaves or not all(isinstance(e, gone) for e in leaves):
        return None
    leaf = leaves[0]
    said = f": {leaf}" if str(leaf) else ""
    return f"its stream ended ({type(leaf).__name__}{said})"


def _startup_failure(command: str, program: str, exc: BaseException, unparsed: int) -> str:
    """One line saying why the upstream could not become the proxy's server."""
    leaf = next((e for e in _leaves(exc) if not isinstance(e, anyio.get_cancelled_exc_class())), exc)
    if isinstance(leaf, FileNotFoundError):
        return f"upstream command {program!r} not found"
    if isinstance(leaf, PermissionError):
        return f"upstream command {program!r} cannot be run: permission denied"
    if isinstance(leaf, OSError):
        return f"upstream command {program!r} cannot be started: {leaf.strerror or leaf}"
    said = "it wrote lines that are not JSON-RPC, then " if unparsed else ""
    return f"upstream {command} is not an MCP server: {said}{type(leaf).__name__}: {leaf}"


def audit_loss_status(gate: Gate) -> int:
    """1, with one line on stderr, when an audit sink of the closed `gate` lost events; else 0."""
    lost = [
        f"{stats.failed + stats.dropped} never stored by {stats.error or name}"
        for name, stats in gate.sink_stats().items()
        if stats.role == "audit" and stats.failed + stats.dropped
    ]
    if not lost:
        return 0
    print(f"error: audit events were lost: {'; '.join(lost)}", file=sys.stderr)
    return 1


@dataclass(frozen=True)
class UpstreamSpec:
    """One server of a `--config` file: its name (the prefix of its tools and prompts, and its
    agent scope), and either its command and the variables added to the proxy's environment for
    it, or the URL of a streamable HTTP server and the headers sent with every request to it."""

    name: str
    command: tuple[str, ...]
    env: Mapping[str, str]
    url: str | None = None
    headers: Mapping[str, str] | None = None

    @property
    def shown(self) -> str:
        """The server as a line names it: its command, or its URL."""
        return self.url if self.url is not None else shlex.join(self.command)


_SERVER_KEYS = {"name", "command", "env", "url", "headers"}


def _strings(value: object) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())


_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_HEADER_VALUE = re.compile(r"(?:[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?)?")


def _header_problem(headers: Mapping[str, str]) -> str | None:
    """What is wrong with a `url` entry's headers (naming the header, never its value, which may
    be a credential), or None: a name that is not an HTTP token, a name given twice (names are
    case-insensitive), a value that is not printable ASCII or has spaces around it."""
    seen: set[str] = set()
    for name, value in headers.items():
        if _HEADER_NAME.fullmatch(name) is None:
            return f"the header name {name[:64]!r} is not an HTTP header name"
        if name.lower() in seen:
            return f"the header {name!r} is given twice (header names are case-insensitive)"
        seen.add(name.lower())
        if _HEADER_VALUE.fullmatch(value) is None:
            return (
                f"the value of header {name!r} must be printable ASCII without spaces around it "
                "(no line breaks or control characters)"
            )
    return None


def load_gateway_config(path: Path) -> list[UpstreamSpec]:
    """Read a `--config` file: a YAML mapping with `servers`, a list of `{name, command, env?}`
    (`command` a list of strings, `env` a mapping of strings) or `{name, url, headers?}` (an
    http or https URL of a streamable HTTP server, `headers` a mapping of HTTP header names to
    printable ASCII values).
    `ProxyConfigError` naming the file and the entry for anything else: an unknown key, a name
    that is not a valid server name (see `SERVER_NAME`) or is given twice, neither or both of
    command and url, an empty command, a URL that is not http(s), a header that could not be sent
    as given (see `_header_problem`; its value is never shown), a file that cannot be read or
    parsed."""
    import yaml

    from interceptor_core.integrations.mcp_gateway import MAX_SERVER_NAME_CHARS, SERVER_NAME

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ProxyConfigError(f"config {path} cannot be read: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ProxyConfigError(f"config {path} is not valid YAML{where}") from None
    if not isinstance(data, dict) or set(data) != {"servers"}:
        raise ProxyConfigError(f"config {path}: expected a mapping with the one key 'servers'")
    servers = data["servers"]
    if not isinstance(servers, list) or not servers:
        raise ProxyConfigError(f"config {path}: 'servers' must be a non-empty list")
    specs: list[UpstreamSpec] = []
    for index, entry in enumerate(servers):
        where = f"config {path}: servers[{index}]"
        if not isinstance(entry, dict):
            raise ProxyConfigError(f"{where} must be a mapping with name and command")
        unknown = sorted(str(key) for key in set(entry) - _SERVER_KEYS)
        if unknown:
            raise ProxyConfigError(f"{where}: unknown key {unknown[0]!r} (known: command, env, headers, name, url)")
        name = entry.get("name")
        if not isinstance(name, str) or len(name) > MAX_SERVER_NAME_CHARS or SERVER_NAME.fullmatch(name) is None:
            raise ProxyConfigError(
                f"{where}: name must be letters and digits with single - or _ between them, at most "
                f"{MAX_SERVER_NAME_CHARS} characters"
            )
        if any(spec.name == name for spec in specs):
            raise ProxyConfigError(f"{where}: the server name {name!r} is given twice")
        if ("command" in entry) == ("url" in entry):
            raise ProxyConfigError(f"{where}: give either command (a server to start) or url (one to reach)")
        if "url" in entry:
            url, headers = entry["url"], entry.get("headers", {})
            if "env" in entry:
                raise ProxyConfigError(f"{where}: env applies to a command, not to a url")
            if not isinstance(url, str) or not url.startswith(("http://", "https://")) or url.strip() != url:
                raise ProxyConfigError(f"{where}: url must be an http:// or https:// URL")
            if not _strings(headers):
                raise ProxyConfigError(f"{where}: headers must be a mapping of strings to strings")
            if (problem := _header_problem(headers)) is not None:
                raise ProxyConfigError(f"{where}: {problem}")
            specs.append(UpstreamSpec(name, (), {}, url, dict(headers)))
            continue
        if "headers" in entry:
            raise ProxyConfigError(f"{where}: headers apply to a url, not to a command")
        command = entry.get("command")
        if not isinstance(command, list) or not command or not all(isinstance(part, str) and part for part in command):
            raise ProxyConfigError(f"{where}: command must be a non-empty list of strings")
        env = entry.get("env", {})
        if not _strings(env):
            raise ProxyConfigError(f"{where}: env must be a mapping of strings to strings")
        specs.append(UpstreamSpec(name, tuple(command), dict(env)))
    return specs


async def run_gateway(
    gate: Gate,
    servers: Sequence[UpstreamSpec],
    *,
    agent: str = "mcp-proxy",
    tenant: str | None = None,
    principal: str = DEFAULT_PRINCIPAL,
    startup_timeout_s: float = STARTUP_TIMEOUT_S,
    grace_s: float = STDIO_GRACE_S,
    http: tuple[str, int] | None = None,
    tokens: TokenTable | None = None,
    oauth: OAuthClients | None = None,
) -> int:
    """Start every server of `servers`, register each one's tools in an agent scope named after
    it, and serve them all through `McpGateway` over stdio (until the client side closes) or
    streamable HTTP on `http` (authenticated as `run_proxy` does it, with `tokens` and `oauth`),
    until SIGINT/SIGTERM, stopping as `run_proxy` does. A server that cannot start (within
    `startup_timeout_s`) or stops later is reported on stderr (one line) and its tools answer an
    error; the others serve on. A server reached over HTTP (`url`) that stops later is tried
    again (after `RECONNECT_FIRST_S`, doubling up to `RECONNECT_MAX_S`) and served again once it
    answers (one line on stderr when it is lost, one when it is back). `ProxyConfigError` when
    no server starts, or for an HTTP address `run_proxy` refuses. Closes the gate's sinks on the
    way out; returns 0, or 1 when an audit sink lost events."""
    if any(spec.name == agent for spec in servers):
        await gate.close()
        raise ProxyConfigError(f"the server name {agent!r} is the gateway's own agent scope: rename the server")
    form = _Form(agent, None, tenant, principal, startup_timeout_s, grace_s)
    return await _run(gate, servers, form, http, tokens, oauth)


@dataclass(frozen=True)
class _Form:
    """How the servers are served: `prefix` None for the gateway of a config (names prefixed per
    server, each in its own agent scope, a server that stops marked down), else the single form
    (its one server's names prefixed with `prefix`, in the scope `agent`, served as it is; a
    server that stops ends the proxy)."""

    agent: str
    prefix: str | None
    tenant: str | None
    principal: str
    startup_timeout_s: float
    grace_s: float


@dataclass(frozen=True)
class _Served:
    """Where a gateway serves: stdio (no `http`), or HTTP on a bound socket, with its clients'
    authentication."""

    http: tuple[str, int] | None
    sock: socket.socket | None
    auth: ProxyAuth | None


async def _run(
    gate: Gate,
    servers: Sequence[UpstreamSpec],
    form: _Form,
    http: tuple[str, int] | None,
    tokens: TokenTable | None,
    oauth: OAuthClients | None,
) -> int:
    sock = None
    try:
        if http is not None:
            sock, loopback = listen_socket(*http)
            if not loopback and tokens is None and oauth is None:
                raise ProxyConfigError(
                    f"--http {http[0]}:{http[1]} is not a loopback address: give --tokens FILE or --jwt-jwks so "
                    "every client authenticates (or listen on 127.0.0.1)"
                )
        auth = ProxyAuth(tokens, oauth) if tokens is not None or oauth is not None else None
        return await _serve(gate, servers, form, _Served(http, sock, auth))
    finally:
        if sock is not None:
            sock.close()
        # Also when nothing was served: a sink's thread (Kafka's) must not outlive the refusal.
        await gate.close()


async def _serve(gate: Gate, servers: Sequence[UpstreamSpec], form: _Form, served: _Served) -> int:
    """The one serving loop of both forms: the servers started side by side, then served through
    one `McpGateway` until the client side closes (stdio) or SIGINT/SIGTERM.

    SIGINT or SIGTERM end serving the way a closed stdin ends stdio: no new request is read,
    requests in flight finish (over stdio within `grace_s`), the upstreams are shut down and the
    gate's sinks are flushed before exit 0. Over stdio a second signal cancels what still runs;
    over HTTP, where uvicorn's graceful shutdown has no such step, only the first signal is
    handled. A signal before serving began stops the startup at once."""
    from mcp import StdioServerParameters
    from mcp.client.stdio import stdio_client

    from interceptor_core.integrations.mcp import McpRelay, McpToolset, client_of, crossing_tools, upstream_client
    from interceptor_core.integrations.mcp_gateway import SEPARATOR, McpGateway, Member

    single = form.prefix is not None
    run = RunContext(tenant=form.tenant, principal=form.principal)

    def run_for(ctx: Any) -> RunContext:
        client = client_of(ctx)
        return client.run if isinstance(client, ProxyClient) else run

    def prefix_of(spec: UpstreamSpec) -> str:
        return form.prefix if form.prefix is not None else spec.name + SEPARATOR

    members = [Member(spec.name, McpToolset(raw_results=True, prefix=prefix_of(spec))) for spec in servers]
    gateway: McpGateway | None = None
    stop = anyio.Event()
    serving = signalled = False
    lost: str | None = None
    """Why the single form's server stopped serving (the proxy then exits 1)."""
    noise = _UpstreamNoise()
    stdio_log = logging.getLogger("mcp.client.stdio")
    stdio_log.addFilter(noise)
    # A server reached over HTTP that is lost is tried again (see `keep`); meanwhile the SDK's
    # complaints about its failing requests are left out (one line says it is lost, one it is back).
    reconnecting: set[str] = set()
    http_log = logging.getLogger("mcp.client.streamable_http")
    http_noise = _HttpNoise(reconnecting)
    http_log.addFilter(http_noise)
    gone: dict[str, anyio.Event] = {}
    """Per server reached over HTTP under `--config` and serving: set when it is marked down."""

    def said_down(member: Member) -> None:
        print(f"callgate mcp-proxy: server {member.name} {member.down}", file=sys.stderr, flush=True)

    def on_down(member: Member) -> None:
        event = gone.get(member.name)
        if event is None:
            said_down(member)
            return
        # `keep` reaches the server again; its calls are refused until then.
        reconnecting.add(member.name)
        member.down = _reconnecting(member.down)
        event.set()

    starting = True

    def report(member: Member, reason: str) -> None:
        # The single form says why its server did not start in its one `error:` line.
        if member.down is None:
            member.down = reason
            if not single and not starting:  # at startup, said once it is known whether any serves
                said_down(member)

    def link_lost(member: Member, exc: BaseException) -> None:
        # Over stdio the one client's own session with a server is that server for it: its loss
        # ends the single form, or marks the server down. Over HTTP only that client loses it.
        nonlocal lost
        said = _upstream_lost(exc) or (type(exc).__name__ if single or not str(exc) else f"{type(exc).__name__}: {exc}")
        if served.http is None:
            if single:
                lost = said
                stop.set()
            elif gateway is not None:
                gateway.mark_down(member, f"stopped serving: {said}")
            return
        if member.down is not None:
            return  # the server itself is lost: one line said so
        whose = "" if single else f" with server {member.name}"
        print(f"callgate mcp-proxy: a client's upstream session{whose} stopped serving: {said}", file=sys.stderr)

    def draining(count: int) -> None:
        requests, them = ("request", "it") if count == 1 else ("requests", "them")
        print(
            f"callgate mcp-proxy: stopping; waiting up to {form.grace_s:g} s for {count} {requests} in flight "
            f"(a second signal cancels {them})",
            file=sys.stderr,
            flush=True,
        )

    async def keep(member: Member, spec: UpstreamSpec, ready: anyio.Event, followed: anyio.Event) -> None:
        # One server's whole life: started, its tools registered, followed until it goes away or
        # serving stops. Whatever ends it marks the server down; nothing ends the others.
        nonlocal lost
        command = spec.shown
        # A proxy stands in for the command, so the command sees the environment it would have seen.
        params = (
            StdioServerParameters(command=spec.command[0], args=list(spec.command[1:]), env={**os.environ, **spec.env})
            if spec.command
            else None
        )

        def transport() -> Any:
            if params is None:
                return _http_upstream(spec.url or "", spec.headers or {})
            return stdio_client(params, errlog=sys.stderr)

        def connect(capabilities: Any, options: dict[str, Any]) -> Any:
            # Each client connection gets its own session with the server (over stdio, its own
            # process), declaring what the client declared.
            return upstream_client(transport(), capabilities, **options)

        relay = member.relay = McpRelay(member.toolset)
        member.connect = connect
        started = False
        lost_as: str | None = None
        """Why a server reached over HTTP under `--config` stopped serving (it is then reached again)."""
        reconnects = spec.url is not None and not single
        try:
            # The deadline covers the handshake and the first listing, and is lifted once served.
            with anyio.CancelScope(deadline=anyio.current_time() + form.startup_timeout_s) as startup:
                # The gateway's own session with the server (its tools for the gate, list changes,
                # clients of the newest protocol) declares no client capability: a client's own
                # session declares its own.
                async with (
                    upstream_client(transport(), None, **relay.client_options()) as client,
                    anyio.create_task_group() as following,
                ):
                    member.toolset.bind(client)
                    await member.toolset.load()
                    member.capabilities = client.server_capabilities
                    tools = [*member.toolset.tools, *crossing_tools(member.toolset)]
                    member.scope = await member.toolset.attach(gate.agent(spec.name, tools=tools, identity=run))
                    started = True
                    startup.deadline = math.inf
                    ready.set()
                    # Every list change is followed before the first client is served.
                    await following.start(member.toolset.follow)
                    await built.wait()
                    if member.proxy is not None:
                        await following.start(member.proxy.follow_lists)
                    if reconnects and member.proxy is not None and member.down is None:
                        ended = gone[spec.name] = anyio.Event()
                    else:
                        ended = anyio.Event()  # never set: serving ends by cancellation
                    followed.set()
                    await ended.wait()
                    following.cancel_scope.cancel()
                    lost_as = member.down
            if startup.cancelled_caught and not started:
                said = f"did not answer as an MCP server within {form.startup_timeout_s:g} s"
                if single:
                    more = "; it wrote lines that are not JSON-RPC" if noise.unparsed else ""
                    said = f"upstream {command} {said}{more}"
                report(member, said)
        except Exception as exc:
            if not started:
                program = spec.command[0] if spec.command else command
                report(member, _startup_failure(command, program, exc, noise.unparsed))
            elif spec.name in gone:
                lost_as = member.down or f"stopped serving: {_upstream_lost(exc) or type(exc).__name__}"
            elif single:
                # The single form's server went away: serving stops as at a signal, then exit 1;
                # any other error is a fault of the proxy itself, which keeps its traceback.
                said = _upstream_lost(exc)
                if said is None:
                    raise
                member.down = f"stopped serving: {said}"
                lost = said
                stop.set()
            else:
                report(member, f"stopped serving: {_upstream_lost(exc) or type(exc).__name__}")
        finally:
            if not started and not single and member.scope is None:
                member.scope = gate.agent(spec.name, tools=[], identity=run)
            ready.set()
            followed.set()
        if lost_as is not None:
            await reach_again(member, spec, lost_as, transport)

    async def reach_again(member: Member, spec: UpstreamSpec, why: str, transport: Any) -> None:
        # A server reached over HTTP under `--config` was lost: its calls are refused (it is down,
        # "reconnecting") while it is tried again, waiting RECONNECT_FIRST_S, doubling up to
        # RECONNECT_MAX_S. Once it answers, the gateway's new session with it lists its tools
        # again, every client's next request opens a new session of its own, and the clients hear
        # that the lists changed. Lost again, it is tried again the same way.
        from interceptor_core.integrations.mcp import upstream_client

        proxy, relay = member.proxy, member.relay
        assert proxy is not None
        assert relay is not None
        delay = RECONNECT_FIRST_S
        why = _lost_reason(why)
        while True:
            reconnecting.add(member.name)
            member.down = _reconnecting(why)
            said = why.removeprefix("stopped serving: ")
            print(f"callgate mcp-proxy: server {member.name} lost ({said}): reconnecting", file=sys.stderr, flush=True)
            while True:
                await anyio.sleep(delay)
                delay = min(delay * 2, RECONNECT_MAX_S)
                ended = gone[spec.name] = anyio.Event()
                serving_again = False
                try:
                    with anyio.CancelScope(deadline=anyio.current_time() + form.startup_timeout_s) as attempt:
                        async with (
                            upstream_client(transport(), None, **relay.client_options()) as client,
                            anyio.create_task_group() as following,
                        ):
                            member.toolset.bind(client)
                            await member.toolset.refresh()
                            await following.start(member.toolset.follow)
                            await following.start(proxy.follow_lists)
                            attempt.deadline = math.inf
                            serving_again = True
                            member.down = None
                            reconnecting.discard(member.name)
                            await proxy.reopened()
                            count = len(member.toolset.tools)
                            tools = "tool" if count == 1 else "tools"
                            print(
                                f"callgate mcp-proxy: server {member.name} is back ({count} {tools})",
                                file=sys.stderr,
                                flush=True,
                            )
                            delay = RECONNECT_FIRST_S
                            await ended.wait()
                            following.cancel_scope.cancel()
                except Exception as exc:
                    if serving_again and member.down is None:
                        assert gateway is not None
                        gateway.mark_down(member, f"stopped serving: {_upstream_lost(exc) or type(exc).__name__}")
                if serving_again:
                    why = _lost_reason(member.down)
                    break

    async def stop_on_signals() -> None:
        nonlocal signalled
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for _ in signals:
                if not serving:
                    signalled = True
                    stop.set()
                    tasks.cancel_scope.cancel()
                    return
                if served.http is not None:
                    stop.set()  # uvicorn's graceful shutdown has no second step
                    return
                if stop.is_set():
                    tasks.cancel_scope.cancel()
                    return
                stop.set()

    built = anyio.Event()
    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(stop_on_signals)
            async with anyio.create_task_group() as upstreams:
                # Started side by side: the slowest server, not their sum, bounds the startup.
                readies = [anyio.Event() for _ in members]
                follows = [anyio.Event() for _ in members]
                for member, spec, ready, followed in zip(members, servers, readies, follows, strict=True):
                    upstreams.start_soon(keep, member, spec, ready, followed)
                for ready in readies:
                    await ready.wait()
                noise.starting = starting = False
                if all(member.down is not None for member in members):
                    upstreams.cancel_scope.cancel()  # one line says why: the ProxyConfigError below
                    tasks.cancel_scope.cancel()
                else:
                    for member in members:
                        if member.down is not None:
                            said_down(member)
                    own = members[0].scope if single else None
                    gateway = McpGateway(
                        members,
                        own if own is not None else gate.agent(form.agent, tools=[], identity=run),
                        name=f"callgate:{gate.name}",
                        run=run_for if served.auth else run,
                        on_down=None if single else on_down,
                        on_link_lost=link_lost,
                        prefixed=not single,
                    )
                    built.set()
                    for followed in follows:
                        await followed.wait()
                    serving = True
                    if served.http is not None:
                        host, port = served.http
                        shown = f"[{host}]" if ":" in host else host

                        def say_listening() -> None:
                            print(
                                f"callgate mcp-proxy: listening on http://{shown}:{port}/mcp",
                                file=sys.stderr,
                                flush=True,
                            )

                        auth = served.auth
                        await gateway.serve_http(
                            host,
                            port,
                            stop=stop,
                            sock=served.sock,
                            authenticate=auth.client if auth else None,
                            resource_metadata=auth.oauth.metadata if auth and auth.oauth else None,
                            ready=say_listening,
                        )
                    else:
                        await gateway.serve_stdio(stop=stop, grace_s=form.grace_s, draining=draining)
                    upstreams.cancel_scope.cancel()
            tasks.cancel_scope.cancel()
    except Exception as exc:
        # The single form's server going away under the serving is its loss too.
        said = _upstream_lost(exc) if single and gateway is not None else None
        if said is None:
            raise
        lost = said
    finally:
        stdio_log.removeFilter(noise)
        http_log.removeFilter(http_noise)
        await gate.close()
    if lost is not None:
        # The gate is closed and its sinks flushed: every call made so far is recorded.
        print(f"error: upstream {servers[0].shown} stopped serving: {lost}", file=sys.stderr)
        audit_loss_status(gate)
        return 1
    if gateway is None and not signalled:
        if single:
            raise ProxyConfigError(members[0].down or "the upstream did not start")
        raise ProxyConfigError("no server of the config started: " + "; ".join(f"{m.name} {m.down}" for m in members))
    return audit_loss_status(gate)


@contextlib.asynccontextmanager
async def _http_upstream(url: str, headers: Mapping[str, str]) -> AsyncIterator[Any]:
    """The streamable HTTP transport to the server at `url`, sending `headers` with every request."""
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    async with (
        create_mcp_http_client(headers=dict(headers)) as http,
        streamable_http_client(url, http_client=http) as streams,
    ):
        yield streams
