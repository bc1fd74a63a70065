"""`callgate mcp-proxy`: a gated MCP server in front of an upstream MCP server started as a command.

The wiring only: the gate comes from the user's `MODULE:FACTORY`, the upstream is started over
stdio, its tools are registered in one agent scope, and `interceptor_core.integrations.mcp.McpProxy`
serves them over stdio (or streamable HTTP). Nothing is written to stdout but MCP messages.
"""

from __future__ import annotations

import inspect
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio

from interceptor_core import ConfigurationError, Gate, RunContext

DEFAULT_PRINCIPAL = "mcp-client"
"""Who the proxy's events say it acts for when the command line does not name a principal."""


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


def gate_from_factory(spec: str, sinks: Sequence[Any]) -> Gate:
    """The `Gate` that `MODULE:FACTORY` names: a `Gate`, or a function returning one. With sinks,
    the function is called with `sinks=[...]`, so it must take that keyword."""
    from callgate.cli import load_object

    obj = load_object(spec)
    if isinstance(obj, Gate):
        if sinks:
            raise ProxyConfigError(
                f"{spec} is a Gate built already; --events/--kafka need a function taking sinks=... that builds it"
            )
        return obj
    if not callable(obj):
        raise ProxyConfigError(f"{spec} is not a Gate or a function returning one: it is of type {type(obj).__name__}")
    if sinks:
        try:
            inspect.signature(obj).bind(sinks=list(sinks))
        except TypeError:
            raise ProxyConfigError(
                f"{spec} takes no sinks= keyword; --events/--kafka hand the event sinks to the gate's factory"
            ) from None
        gate = obj(sinks=list(sinks))
    else:
        gate = obj()
    if not isinstance(gate, Gate):
        raise ProxyConfigError(f"{spec}() returned a value of type {type(gate).__name__}, not a Gate")
    return gate


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
) -> int:
    """Start `upstream` (a command and its arguments, speaking MCP on stdio), register its tools
    in `gate.agent(agent)` and serve them through the gate until the client side closes (stdio)
    or the process is stopped (HTTP). Every call is made for `tenant` and `principal` (one
    `RunContext` for the life of the process), so events name who the proxy acts for. Closes the
    gate's sinks on the way out. Returns the exit status: 0, or 1 when an audit sink lost events
    (never stored or dropped), said in one line on stderr."""
    if not upstream:
        raise ProxyConfigError("no upstream command: put it after --, e.g. -- python my_server.py")
    if upstream[0].startswith("-"):
        # Options the command line did not know land here; none is a command.
        raise ProxyConfigError(f"unknown option {upstream[0]!r}: the upstream command goes after --")

    from mcp import Client, StdioServerParameters
    from mcp.client.stdio import stdio_client

    from interceptor_core.integrations.mcp import McpProxy, McpToolset

    run = RunContext(tenant=tenant, principal=principal)
    # A proxy stands in for the command, so the command sees the environment it would have seen.
    params = StdioServerParameters(command=upstream[0], args=list(upstream[1:]), env=dict(os.environ))
    toolset = McpToolset(raw_results=True, prefix=prefix)
    try:
        async with Client(stdio_client(params, errlog=sys.stderr), message_handler=toolset.on_message) as client:
            toolset.bind(client)
            await toolset.load()
            scope = await toolset.attach(gate.agent(agent, tools=toolset.tools))
            proxy = McpProxy(toolset, scope, name=f"callgate:{gate.name}", run=run)
            async with anyio.create_task_group() as tasks:
                await tasks.start(toolset.follow)
                if http is not None:
                    stop = anyio.Event()
                    tasks.start_soon(_stop_on_signals, stop)
                    await proxy.serve_http(*http, stop=stop)
                else:
                    await proxy.serve_stdio()
                tasks.cancel_scope.cancel()
    finally:
        await gate.close()
    return audit_loss_status(gate)


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


async def _stop_on_signals(stop: anyio.Event) -> None:
    # SIGINT or SIGTERM end an HTTP proxy the way a closed stdin ends a stdio one: requests in
    # flight finish, the upstream is shut down and the gate's sinks are flushed before exit 0.
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            stop.set()
            return
