"""OpenAI Agents SDK through the gate: a gated tool call against the same SDK's ungated one, in one run.

    python bench/integrations_openai_agents.py [--calls N] [--rounds R]

Each path is called N times in a loop; rounds of all paths alternate, so machine noise hits them
alike; medians of the per-round means are reported, each as a ratio to its ungated twin (target
<= 1.3). The gate has one allowing interceptor and a `MemorySink` (every call's events built,
serialized, hashed and chained), the audited setup a deployment runs; the tools are
`gate_function_tools` copies with the defaults (the SDK's approvals on, so the chain is also asked
at the SDK's approval step).

- invoke: the SDK's own invocation of one call (`agents.tool.invoke_function_tool`, what the runner
  awaits after the approval step, guardrails and hooks), of an async `@function_tool` and of a sync
  one (the SDK runs it on a worker thread, gated or not).
  Beside them: the async tool gated with no sinks (the gate's decisions, no events), and the
  audited `desk.call` of a no-op tool alone, which is what the gated invocation adds to the SDK's.
- run: a whole `Runner.run` of an agent driven by the SDK's `ScriptedModel`: one turn calling the
  tool, one answering; the tool call is a small part of it, so its ratio is the one a user sees.

The last lines are the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from agents import Agent, FunctionTool, RunConfig, Runner, function_tool
from agents.testing import ScriptedModel, assistant_message, function_call
from agents.tool import invoke_function_tool
from agents.tool_context import ToolContext
from figures import report
from gate_overhead import AllowTenantSync  # the same allowing interceptor as the gate bench

from events import MemorySink
from interceptor_core import Gate, RunContext
from interceptor_core.integrations import schema_tool
from interceptor_core.integrations.openai_agents import gate_function_tools

RUN = RunContext(tenant="acme", principal="u-1")
ARGUMENTS = '{"order_id": "ACME-42", "include_items": false}'
OFFLINE = RunConfig(tracing_disabled=True)
ANSWER = "order ACME-42: 4200 cents, shipped"


@function_tool
async def get_order(order_id: str, include_items: bool) -> str:
    """Loads an order record by ID."""
    return f"order {order_id}: 4200 cents, shipped"


@function_tool(name_override="get_order")
def get_order_sync(order_id: str, include_items: bool) -> str:
    """Loads an order record by ID."""
    return f"order {order_id}: 4200 cents, shipped"


def gated(original: FunctionTool, audited: bool = True) -> tuple[FunctionTool, MemorySink]:
    memory = MemorySink()
    gate = Gate("bench", interceptors=[AllowTenantSync("allow-tenant")], sinks=[memory] if audited else [])
    (wrapped,) = gate_function_tools([original], gate=gate, agent="desk")
    return wrapped, memory


def desk_call() -> Callable[[], Awaitable[Any]]:
    """The audited gate's own call of a no-op tool with the same arguments."""

    async def noop(args: dict[str, Any], ctx: Any) -> str:
        return ANSWER

    memory = MemorySink()
    gate = Gate("bench", interceptors=[AllowTenantSync("allow-tenant")], sinks=[memory])
    desk = gate.agent("desk", tools=[schema_tool("get_order", "", get_order.params_json_schema, noop)])

    async def call() -> Any:
        out = await desk.call("get_order", ARGUMENTS, run=RUN, call_id="call-1")
        memory.clear()
        return out.value

    return call


def invocation(tool: FunctionTool, memory: MemorySink | None) -> Callable[[], Awaitable[Any]]:
    async def call() -> Any:
        ctx = ToolContext(RUN, tool_name=tool.name, tool_call_id="call-1", tool_arguments=ARGUMENTS)
        out = await invoke_function_tool(function_tool=tool, context=ctx, arguments=ARGUMENTS)
        if memory is not None:
            memory.clear()
        return out

    return call


def agent_run(tool: FunctionTool, memory: MemorySink | None) -> Callable[[], Awaitable[Any]]:
    async def call() -> Any:
        model = ScriptedModel([[function_call("get_order", ARGUMENTS, call_id="call-1")], [assistant_message("done")]])
        result = await Runner.run(
            Agent(name="desk", tools=[tool], model=model), "find it", context=RUN, run_config=OFFLINE
        )
        if memory is not None:
            memory.clear()
        return result

    return call


def build_paths() -> dict[str, Callable[[], Awaitable[Any]]]:
    """Paths by name, each ungated one beside its gated twin (which clears its sink after the call)."""
    paths: dict[str, Callable[[], Awaitable[Any]]] = {}
    for suffix, original in (("", get_order), ("_sync", get_order_sync)):
        wrapped, memory = gated(original)
        paths[f"invoke{suffix}"] = invocation(original, None)
        paths[f"invoke{suffix}_gated"] = invocation(wrapped, memory)
        if not suffix:
            bare, _ = gated(original, audited=False)
            paths["invoke_gated_bare"] = invocation(bare, None)
            paths["desk_call"] = desk_call()
    wrapped, memory = gated(get_order)
    paths["run"] = agent_run(get_order, None)
    paths["run_gated"] = agent_run(wrapped, memory)
    return paths


ROWS = {
    "invoke": ("invoke_function_tool, async tool", "invoke"),
    "invoke_gated": ("gate_function_tools, async tool", "invoke"),
    "invoke_gated_bare": ("gate_function_tools, async tool, no sinks", "invoke"),
    "desk_call": ("the audited desk.call alone (what is added)", "invoke"),
    "invoke_sync": ("invoke_function_tool, sync tool (thread)", "invoke_sync"),
    "invoke_sync_gated": ("gate_function_tools, sync tool (thread)", "invoke_sync"),
    "run": ("Runner.run, one tool call + answer", "run"),
    "run_gated": ("Runner.run of gate_function_tools tools", "run"),
}


async def measure(fn: Callable[[], Awaitable[Any]], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        await fn()
    return (time.perf_counter() - start) / calls


async def check(paths: dict[str, Callable[[], Awaitable[Any]]]) -> None:
    """Every gated path must answer what its ungated twin answers, or the figures mean nothing."""
    if await paths["desk_call"]() != ANSWER or await paths["invoke_gated_bare"]() != ANSWER:
        raise SystemExit("bench setup is wrong: the bare gate or desk.call answered differently")
    for key in ("invoke", "invoke_sync"):
        plain, through = await paths[key](), await paths[f"{key}_gated"]()
        if plain != ANSWER or through != ANSWER:
            raise SystemExit(f"bench setup is wrong: {key} answered {plain!r}, gated {through!r}")
    result = await paths["run_gated"]()
    outputs = [item.output for item in result.new_items if item.type == "tool_call_output_item"]
    if outputs != [ANSWER] or result.final_output != "done":
        raise SystemExit(f"bench setup is wrong: the gated run's tool said {outputs!r}")


async def run(calls: int, rounds: int) -> dict[str, list[float]]:
    paths = build_paths()
    await check(paths)
    run_calls = max(calls // 20, 1)  # a whole run costs about twenty tool invocations
    count = {key: run_calls if key.startswith("run") else calls for key in ROWS}
    for key, fn in paths.items():
        await measure(fn, count[key] // 5 or 1)  # warm-up
    samples: dict[str, list[float]] = {key: [] for key in ROWS}
    for _ in range(rounds):
        for key, fn in paths.items():
            samples[key].append(await measure(fn, count[key]))
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=11)
    opts = parser.parse_args()
    samples = asyncio.run(run(opts.calls, opts.rounds))
    med = {key: statistics.median(values) for key, values in samples.items()}
    print(f"{'path':<52} {'median µs/call':>15} {'ratio':>8}  to")
    for key, (label, base) in ROWS.items():
        print(f"{label:<52} {med[key] * 1e6:>15.2f} {med[key] / med[base]:>8.2f}  {base}")
    print()
    for key, (label, base) in ROWS.items():
        if key not in (base, "desk_call"):
            print(f"{label}: {med[key] / med[base]:.2f} x ungated (target <= 1.3)")
    added = (med["invoke_gated"] - med["invoke"]) * 1e6
    print(
        f"the gated invocation adds {added:.1f} µs; the audited desk.call alone costs {med['desk_call'] * 1e6:.1f} µs"
    )
    for key, (label, base) in ROWS.items():
        if key not in (base, "desk_call"):
            report(f"OpenAI Agents: {label}", med[key] * 1e6, "µs/call", floor=med[base] * 1e6, target="<= 1.3")


if __name__ == "__main__":
    main()
