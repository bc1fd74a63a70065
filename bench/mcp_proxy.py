"""`callgate mcp-proxy`'s added latency: a tool call and a resource read through the proxy against
the same request sent to the server directly, in one run.

    python bench/mcp_proxy.py [--calls N] [--rounds R]

The server is the reference `@modelcontextprotocol/server-everything` from npm (pinned in
tests/mcp_servers; installed there when missing), over stdio, reached by the official `mcp`
client twice: directly, and through `callgate mcp-proxy` (stdio too) with a policy file that
allows everything and a JSONL events file, so every call is decided, recorded, hashed and chained
as in a deployment. Rounds of the paths alternate, so machine noise hits them alike; each path
makes N calls in all. Reported: median and p99 latency per path, and the ratio of the proxied
median to the direct one (target <= 1.5 over stdio).

A third path is the several-servers form: `callgate mcp-proxy --config` in front of two instances
of the same server (`alpha`, `beta`), calling `alpha__echo` and reading the same document (the
column `gateway`, and its own figures).

Two more rows split the proxy's share (not figures): `gate only` is the direct connection's call
made through `scope.call` (the gate with the same policy, no proxy), and `in-process proxy` an
`McpProxy` reached by an in-memory client (the gate and both SDK sides, no second process hop).

The last lines are the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
from figures import report
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from interceptor_core import Gate
from interceptor_core.integrations.mcp import McpProxy, McpToolset, crossing_tools
from interceptor_core.policy import load_policy

SERVERS = Path(__file__).resolve().parent.parent / "tests" / "mcp_servers"
EVERYTHING = SERVERS / "node_modules" / "@modelcontextprotocol" / "server-everything" / "dist" / "index.js"
DOCUMENT = "demo://resource/static/document/architecture.md"

ALLOW_ALL = """\
version: 1
name: allow-all
default: allow
rules:
  - id: everything-allowed
    tools: ["*"]
    decision: allow
"""


def server_path() -> Path:
    if not EVERYTHING.exists():
        npm = shutil.which("npm")
        if npm is None:
            sys.exit("bench/mcp_proxy.py needs npm to install the reference MCP server")
        subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--silent"], cwd=SERVERS, check=True)
    return EVERYTHING


async def timed(op: Callable[[], Awaitable[Any]], count: int) -> list[float]:
    """Latencies of `count` sequential calls of `op`, in seconds."""
    out = []
    for _ in range(count):
        began = time.perf_counter()
        await op()
        out.append(time.perf_counter() - began)
    return out


def p99(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=100)[98]


async def main(calls: int, rounds: int) -> None:
    server = server_path()
    quiet = open(os.devnull, "w")  # noqa: ASYNC230, SIM115 - the servers' stderr, for the whole run
    with tempfile.TemporaryDirectory() as work, quiet:
        policy = Path(work) / "allow.policy.yaml"
        policy.write_text(ALLOW_ALL)
        direct = StdioServerParameters(command="node", args=[str(server), "stdio"])
        proxied = StdioServerParameters(
            command=sys.executable,
            args=[
                *("-m", "callgate.cli", "mcp-proxy", "--policy", str(policy)),
                *("--events", str(Path(work) / "events.jsonl"), "--", "node", str(server), "stdio"),
            ],
            env=dict(os.environ),
        )
        config = Path(work) / "servers.yaml"
        node = f"[node, {json.dumps(str(server))}, stdio]"
        config.write_text(f"servers:\n  - {{name: alpha, command: {node}}}\n  - {{name: beta, command: {node}}}\n")
        several = StdioServerParameters(
            command=sys.executable,
            args=[
                *("-m", "callgate.cli", "mcp-proxy", "--policy", str(policy)),
                *("--events", str(Path(work) / "gateway.jsonl"), "--config", str(config)),
            ],
            env=dict(os.environ),
        )
        async with (
            Client(stdio_client(direct, errlog=quiet)) as plain,
            Client(stdio_client(proxied, errlog=quiet)) as gated,
            Client(stdio_client(several, errlog=quiet)) as gateway,
        ):
            toolset = McpToolset(raw_results=True)
            toolset.bind(plain)
            await toolset.load()
            gate = Gate("bench", interceptors=[load_policy(policy)])
            scope = gate.agent("mcp", tools=[*toolset.tools, *crossing_tools(toolset)])
            inproc = Client(McpProxy(toolset, scope).server, mode="legacy")
            await inproc.__aenter__()
            clients = {"direct": plain, "proxy": gated, "gateway": gateway}
            echo = {"direct": "echo", "proxy": "echo", "gateway": "alpha__echo"}
            extra: dict[str, Callable[[], Awaitable[Any]]] = {
                "gate only": lambda: scope.call("echo", {"message": "hello"}),
                "in-process proxy": lambda: inproc.call_tool("echo", {"message": "hello"}),
            }
            ops: dict[str, Callable[[Client, str], Callable[[], Awaitable[Any]]]] = {
                "tool call": lambda c, path: lambda: c.call_tool(echo[path], {"message": "hello"}),
                "resource read": lambda c, path: lambda: c.read_resource(DOCUMENT, cache_mode="refresh"),
            }
            samples: dict[tuple[str, str], list[float]] = {(o, p): [] for o in ops for p in clients}
            for make in ops.values():  # warm-up: imports, first listings, JIT of the server
                for path, client in clients.items():
                    await timed(make(client, path), 20)
            parts: dict[str, list[float]] = {name: [] for name in extra}
            per_round = max(1, calls // rounds)
            for _ in range(rounds):
                for op, make in ops.items():
                    for path, client in clients.items():
                        samples[(op, path)] += await timed(make(client, path), per_round)
                for name, call in extra.items():
                    parts[name] += await timed(call, per_round)
            await inproc.__aexit__(None, None, None)
    print(f"{'':24}{'direct median':>15}{'median':>15}{'ratio':>8}{'direct p99':>13}{'p99':>13}")
    for op in ops:
        for path in ("proxy", "gateway"):
            direct_s, proxy_s = samples[(op, "direct")], samples[(op, path)]
            d_med, p_med = statistics.median(direct_s), statistics.median(proxy_s)
            print(
                f"{op + ' ' + path:24}{d_med * 1e6:>12.0f} us{p_med * 1e6:>12.0f} us{p_med / d_med:>8.2f}"
                f"{p99(direct_s) * 1e6:>10.0f} us{p99(proxy_s) * 1e6:>10.0f} us"
            )
    for name, values in parts.items():
        print(f"{name:16}{'':15}{statistics.median(values) * 1e6:>12.0f} us   (tool call)")
    for op in ops:
        direct_s, proxy_s = samples[(op, "direct")], samples[(op, "proxy")]
        key = op.replace(" ", "_")
        report(
            f"mcp_proxy {key} median",
            statistics.median(proxy_s) * 1e6,
            "us",
            floor=statistics.median(direct_s) * 1e6,
            target="<= 1.5x direct",
        )
        report(f"mcp_proxy {key} p99", p99(proxy_s) * 1e6, "us", floor=p99(direct_s) * 1e6)
        several_s = samples[(op, "gateway")]
        report(
            f"mcp_proxy gateway {key} median",
            statistics.median(several_s) * 1e6,
            "us",
            floor=statistics.median(direct_s) * 1e6,
            target="<= 1.5x direct",
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000, help="calls per path and operation (default 1000)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    options = parser.parse_args()
    anyio.run(main, options.calls, options.rounds)
