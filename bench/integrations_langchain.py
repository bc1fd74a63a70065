"""LangChain through the gate: a gated tool call against the same framework's ungated one, in one run.

    python bench/integrations_langchain.py [--calls N] [--rounds R]

Each path is called N times in a loop; rounds of all paths alternate, so machine noise hits them
alike; medians of the per-round means are reported, each as a ratio to its ungated twin (target
<= 1.3). The gate has one allowing interceptor and a `MemorySink` (every call's events built,
serialized, hashed and chained), the audited setup a deployment runs; one row without sinks shows
the adapter's own share (the sync path's loop turn, the wrapping) apart from the audit's.

- invoke / ainvoke: a `@tool` invoked with a model's `ToolCall` (what a ToolNode does), against
  the `GatedTool` of `gate_tools`; sync `invoke` of a sync tool, `ainvoke` of an async one, and
  `ainvoke` of a sync tool (LangChain runs it on a worker thread, gated or not).
- ToolNode: a one-node LangGraph graph running a `ToolNode` on a model turn with one tool call
  (`invoke` with the sync tool, `ainvoke` with the async one), ungated against
  `CallgateMiddleware`'s `wrap_tool_call` / `awrap_tool_call` on the same node (what `create_agent`
  builds), and against a ToolNode of `gate_tools` tools.

The last lines are the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from figures import report
from gate_overhead import AllowTenantSync  # the same allowing interceptor as the gate bench
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import BaseTool, tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode

from events import MemorySink
from interceptor_core import Gate, RunContext
from interceptor_core.integrations.langchain import RUN_CONFIG_KEY, CallgateMiddleware, gate_tools

RUN = RunContext(tenant="acme", principal="u-1")
CONFIG: Any = {"configurable": {RUN_CONFIG_KEY: RUN}}


@tool
def get_order(order_id: str, include_items: bool = False) -> str:
    """Loads an order record by ID."""
    return f"order {order_id}: 4200 cents, shipped"


@tool
async def get_order_async(order_id: str, include_items: bool = False) -> str:
    """Loads an order record by ID."""
    return f"order {order_id}: 4200 cents, shipped"


def tool_call(name: str) -> dict[str, Any]:
    return {"type": "tool_call", "id": "call-1", "name": name, "args": {"order_id": "ACME-42"}}


def audited_gate() -> tuple[Gate, MemorySink]:
    memory = MemorySink()
    return Gate("bench", interceptors=[AllowTenantSync("allow-tenant")], sinks=[memory]), memory


def graph(node: ToolNode) -> Any:
    builder = StateGraph(MessagesState)
    builder.add_node("tools", node)
    builder.add_edge(START, "tools")
    builder.add_edge("tools", END)
    return builder.compile()


def build_paths() -> tuple[dict[str, Callable[[], Any]], dict[str, Callable[[], Awaitable[Any]]]]:
    """Sync and async paths by name; each gated one clears its sink after the call."""
    sync: dict[str, Callable[[], Any]] = {}
    async_: dict[str, Callable[[], Awaitable[Any]]] = {}

    def gated(original: BaseTool) -> tuple[BaseTool, MemorySink]:
        gate, memory = audited_gate()
        (wrapped,) = gate_tools([original], gate=gate, agent="desk")
        return wrapped, memory

    call, acall = tool_call("get_order"), tool_call("get_order_async")
    sync["invoke"] = lambda: get_order.invoke(call, CONFIG)
    wrapped, memory = gated(get_order)
    sync["invoke_gated"] = lambda: (wrapped.invoke(call, CONFIG), memory.clear())
    bare = Gate("bench", interceptors=[AllowTenantSync("allow-tenant")])
    (unaudited,) = gate_tools([get_order], gate=bare, agent="desk")
    sync["invoke_gated_no_sinks"] = lambda: unaudited.invoke(call, CONFIG)

    async def ainvoke() -> Any:
        return await get_order_async.ainvoke(acall, CONFIG)

    awrapped, amemory = gated(get_order_async)

    async def ainvoke_gated() -> Any:
        out = await awrapped.ainvoke(acall, CONFIG)
        amemory.clear()
        return out

    async def ainvoke_sync_tool() -> Any:
        return await get_order.ainvoke(call, CONFIG)

    async def ainvoke_sync_tool_gated() -> Any:
        out = await wrapped.ainvoke(call, CONFIG)
        memory.clear()
        return out

    async_.update(
        ainvoke=ainvoke,
        ainvoke_gated=ainvoke_gated,
        ainvoke_sync_tool=ainvoke_sync_tool,
        ainvoke_sync_tool_gated=ainvoke_sync_tool_gated,
    )

    def node_graphs(original: BaseTool) -> tuple[Any, Any, Any, MemorySink, MemorySink]:
        """Graphs of a ToolNode of `original`: ungated, with the middleware, of gate_tools tools."""
        mw_gate, mw_memory = audited_gate()
        middleware = CallgateMiddleware([original], gate=mw_gate, agent="desk")
        with_middleware = graph(
            ToolNode([original], wrap_tool_call=middleware.wrap_tool_call, awrap_tool_call=middleware.awrap_tool_call)
        )
        tools_gate, tools_memory = audited_gate()
        with_gated_tools = graph(ToolNode(gate_tools([original], gate=tools_gate, agent="desk")))
        return graph(ToolNode([original])), with_middleware, with_gated_tools, mw_memory, tools_memory

    # The sync graph runs its calls on worker threads; the async one awaits an async tool's coroutine.
    turn = {"messages": [AIMessage("", tool_calls=[call])]}
    plain, with_middleware, with_gated_tools, mw_memory, tools_memory = node_graphs(get_order)
    sync["toolnode"] = lambda: plain.invoke(turn, CONFIG)
    sync["toolnode_middleware"] = lambda: (with_middleware.invoke(turn, CONFIG), mw_memory.clear())
    sync["toolnode_gate_tools"] = lambda: (with_gated_tools.invoke(turn, CONFIG), tools_memory.clear())

    aturn = {"messages": [AIMessage("", tool_calls=[acall])]}
    aplain, awith_middleware, awith_gated_tools, amw_memory, atools_memory = node_graphs(get_order_async)

    async def atoolnode() -> Any:
        return await aplain.ainvoke(aturn, CONFIG)

    async def atoolnode_middleware() -> Any:
        out = await awith_middleware.ainvoke(aturn, CONFIG)
        amw_memory.clear()
        return out

    async def atoolnode_gate_tools() -> Any:
        out = await awith_gated_tools.ainvoke(aturn, CONFIG)
        atools_memory.clear()
        return out

    async_.update(
        atoolnode=atoolnode, atoolnode_middleware=atoolnode_middleware, atoolnode_gate_tools=atoolnode_gate_tools
    )
    return sync, async_


ROWS = {
    "invoke": ("@tool invoke(ToolCall), sync tool", "invoke"),
    "invoke_gated": ("gate_tools invoke(ToolCall), sync tool", "invoke"),
    "invoke_gated_no_sinks": ("the same, a gate without sinks (no events)", "invoke"),
    "ainvoke": ("@tool ainvoke(ToolCall), async tool", "ainvoke"),
    "ainvoke_gated": ("gate_tools ainvoke(ToolCall), async tool", "ainvoke"),
    "ainvoke_sync_tool": ("@tool ainvoke(ToolCall), sync tool (thread)", "ainvoke_sync_tool"),
    "ainvoke_sync_tool_gated": ("gate_tools ainvoke(ToolCall), sync tool (thread)", "ainvoke_sync_tool"),
    "toolnode": ("ToolNode graph, invoke, sync tool", "toolnode"),
    "toolnode_middleware": ("ToolNode graph + CallgateMiddleware, invoke", "toolnode"),
    "toolnode_gate_tools": ("ToolNode graph of gate_tools tools, invoke", "toolnode"),
    "atoolnode": ("ToolNode graph, ainvoke, async tool", "atoolnode"),
    "atoolnode_middleware": ("ToolNode graph + CallgateMiddleware, ainvoke", "atoolnode"),
    "atoolnode_gate_tools": ("ToolNode graph of gate_tools tools, ainvoke", "atoolnode"),
}


def measure(fn: Callable[[], Any], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


async def ameasure(fn: Callable[[], Awaitable[Any]], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        await fn()
    return (time.perf_counter() - start) / calls


def check(sync: dict[str, Callable[[], Any]], async_: dict[str, Callable[[], Awaitable[Any]]], loop: Any) -> None:
    """Every gated path must answer what its ungated twin answers, or the figures mean nothing."""
    first = sync["invoke_gated"]()[0]
    if not isinstance(first, ToolMessage) or first.status != "success" or first.content != sync["invoke"]().content:
        raise SystemExit(f"bench setup is wrong: the gated invoke answered {first!r}")
    if (
        loop.run_until_complete(async_["ainvoke_gated"]()).content
        != loop.run_until_complete(async_["ainvoke"]()).content
    ):
        raise SystemExit("bench setup is wrong: the gated ainvoke answered differently")
    for key in ("toolnode_middleware", "toolnode_gate_tools"):
        (reply,) = sync[key]()[0]["messages"][1:]
        if not isinstance(reply, ToolMessage) or reply.status != "success":
            raise SystemExit(f"bench setup is wrong: {key} answered {reply!r}")
    for key in ("atoolnode_middleware", "atoolnode_gate_tools"):
        (reply,) = loop.run_until_complete(async_[key]())["messages"][1:]
        if not isinstance(reply, ToolMessage) or reply.status != "success":
            raise SystemExit(f"bench setup is wrong: {key} answered {reply!r}")


def run(calls: int, rounds: int) -> dict[str, list[float]]:
    sync, async_ = build_paths()
    loop = asyncio.new_event_loop()
    try:
        check(sync, async_, loop)
        graph_calls = max(calls // 4, 1)  # a graph step costs about ten tool calls; more of them, less noise
        count = {key: graph_calls if "toolnode" in key else calls for key in ROWS}
        for key, fn in sync.items():
            measure(fn, count[key] // 5 or 1)  # warm-up
        for key, afn in async_.items():
            loop.run_until_complete(ameasure(afn, count[key] // 5 or 1))
        samples: dict[str, list[float]] = {key: [] for key in ROWS}
        for _ in range(rounds):
            for key, fn in sync.items():
                samples[key].append(measure(fn, count[key]))
            for key, afn in async_.items():
                samples[key].append(loop.run_until_complete(ameasure(afn, count[key])))
        return samples
    finally:
        loop.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=15)
    opts = parser.parse_args()
    samples = run(opts.calls, opts.rounds)
    med = {key: statistics.median(values) for key, values in samples.items()}
    print(f"{'path':<52} {'median µs/call':>15} {'ratio':>8}  to")
    for key, (label, base) in ROWS.items():
        print(f"{label:<52} {med[key] * 1e6:>15.2f} {med[key] / med[base]:>8.2f}  {base}")
    print()
    for key, (label, base) in ROWS.items():
        if key != base:
            print(f"{label}: {med[key] / med[base]:.2f} x ungated (target <= 1.3)")
    for key, (label, base) in ROWS.items():
        if key != base:
            report(f"LangChain: {label}", med[key] * 1e6, "µs/call", floor=med[base] * 1e6, target="<= 1.3")


if __name__ == "__main__":
    main()
