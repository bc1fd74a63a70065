"""Pydantic AI: a gated tool call against the same framework's ungated one, in one run.

    python bench/integrations_pydantic_ai.py [--calls N] [--rounds R] [--runs M] [--parallel K]

Every path is a coroutine awaited N times in a loop (M times for whole agent runs); rounds of all
paths alternate, so machine noise hits them alike; medians of the per-round means are reported.

- tool call: Pydantic AI's own path for one call the model made, `ToolManager.handle_call`
  (argument validation, capability hooks, the toolset's call), of a `FunctionToolset` tool
  (ungated) and of the same tool behind `GatedToolset` with no interceptors and no sinks (the
  gate's own cost), for an async tool and for a sync one (which Pydantic AI runs in a worker
  thread); audited: the gated call with one allowing interceptor and a `MemorySink`.
- agent run: `Agent.run` of a `FunctionModel` that makes K parallel calls of the tool, then
  answers (two model steps), ungated and gated.
- the gate alone: `scope.call` of a tool described by JSON Schema (`schema_tool`, what
  `GatedToolset` registers) against the same tool written with `@tool`.

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
from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai import RunContext as AiRunContext
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel
from pydantic_ai.tool_manager import ToolManager
from pydantic_ai.toolsets import FunctionToolset
from pydantic_ai.usage import RunUsage

from events import MemorySink
from interceptor_core import Allow, Gate, ToolCall, ToolContext, tool
from interceptor_core.integrations import schema_tool
from interceptor_core.integrations.pydantic_ai import GatedToolset

Path = Callable[[], Awaitable[Any]]


async def get_order(order_id: str, include_items: bool = False) -> dict[str, Any]:
    """Loads an order record by ID."""
    return {"order_id": order_id, "amount_cents": 4200, "status": "shipped"}


def get_order_sync(order_id: str, include_items: bool = False) -> dict[str, Any]:
    """Loads an order record by ID."""
    return {"order_id": order_id, "amount_cents": 4200, "status": "shipped"}


class OrderQuery(BaseModel):
    order_id: str
    include_items: bool = False


async def _get_order_tool(args: OrderQuery) -> dict[str, Any]:
    return {"order_id": args.order_id, "amount_cents": 4200, "status": "shipped"}


class AllowAll:
    """An allowing interceptor that reads the call, like a real policy would."""

    name = "allow-all"

    def before_tool_call(self, call: ToolCall) -> Allow:
        call.args.get("order_id")
        return Allow()


async def measure(fn: Path, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        await fn()
    return (time.perf_counter() - start) / calls


async def _handle(toolset: Any, name: str, after: Callable[[], None] | None = None) -> Path:
    """One model call of `name` through Pydantic AI's ToolManager, over `toolset`; then `after`."""
    ctx = AiRunContext(deps=None, model=TestModel(), usage=RunUsage())
    manager = await ToolManager(toolset).for_run_step(ctx)
    call = ToolCallPart(name, {"order_id": "o-1"}, tool_call_id="call-1")

    async def handle() -> Any:
        result = await manager.handle_call(call)
        if after is not None:
            after()
        return result

    return handle


def _agent(toolset: Any, name: str, parallel: int) -> Path:
    async def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            calls = [ToolCallPart(name, {"order_id": f"o-{i}"}, tool_call_id=f"call-{i}") for i in range(parallel)]
            return ModelResponse(parts=calls)
        return ModelResponse(parts=[TextPart("done")])

    agent = Agent(FunctionModel(respond), toolsets=[toolset])

    async def run() -> Any:
        return await agent.run("look up the orders")

    return run


async def build_paths(parallel: int) -> tuple[dict[str, Path], dict[str, Path]]:
    """(per-call paths, whole-run paths), each gated beside its ungated twin."""
    memory = MemorySink()  # emptied after each call, so the events kept do not weigh on the others
    audited = GatedToolset(FunctionToolset([get_order]), gate=Gate("bench", interceptors=[AllowAll()], sinks=[memory]))
    calls = {
        "call_async": await _handle(FunctionToolset([get_order]), "get_order"),
        "call_async_gated": await _handle(GatedToolset(FunctionToolset([get_order]), gate=Gate("bench")), "get_order"),
        "call_async_audited": await _handle(audited, "get_order", memory.clear),
        "call_sync": await _handle(FunctionToolset([get_order_sync]), "get_order_sync"),
        "call_sync_gated": await _handle(
            GatedToolset(FunctionToolset([get_order_sync]), gate=Gate("bench")), "get_order_sync"
        ),
    }

    async def schema_body(args: dict[str, Any], ctx: ToolContext) -> Any:
        return {"order_id": args["order_id"], "amount_cents": 4200, "status": "shipped"}

    described = FunctionToolset([get_order]).tools["get_order"].function_schema.json_schema
    scope = Gate("bench").agent(
        "desk",
        tools=[
            schema_tool("get_order", "Loads an order record by ID.", described, schema_body),
            tool(_get_order_tool, name="get_order_typed", description="Loads an order record by ID."),
        ],
    )

    async def gate_schema() -> Any:
        return await scope.call("get_order", {"order_id": "o-1"}, call_id="call-1")

    async def gate_typed() -> Any:
        return await scope.call("get_order_typed", {"order_id": "o-1"}, call_id="call-1")

    calls["gate_schema"] = gate_schema
    calls["gate_typed"] = gate_typed
    runs = {
        "run": _agent(FunctionToolset([get_order]), "get_order", parallel),
        "run_gated": _agent(GatedToolset(FunctionToolset([get_order]), gate=Gate("bench")), "get_order", parallel),
    }
    return calls, runs


async def _check(calls: dict[str, Path], runs: dict[str, Path]) -> None:
    for key, fn in calls.items():
        result = await fn()
        value = getattr(result, "value", result)
        if not isinstance(value, dict) or value.get("order_id") != "o-1":
            raise SystemExit(f"bench setup is wrong: {key}: {result!r}")
    for key, fn in runs.items():
        if (await fn()).output != "done":
            raise SystemExit(f"bench setup is wrong: {key}")


async def bench_pydantic_ai(calls: int = 2000, rounds: int = 15, runs: int = 20, parallel: int = 1) -> dict[str, float]:
    """Median seconds per call (per run for "run" and "run_gated") of every path, measured in
    interleaved rounds in this process."""
    call_paths, run_paths = await build_paths(parallel)
    await _check(call_paths, run_paths)
    for fn in call_paths.values():
        await measure(fn, calls // 5 or 1)  # warm-up
    for fn in run_paths.values():
        await measure(fn, runs // 5 or 1)
    samples: dict[str, list[float]] = {key: [] for key in (*call_paths, *run_paths)}
    for _ in range(rounds):
        for key, fn in call_paths.items():
            samples[key].append(await measure(fn, calls))
        for key, fn in run_paths.items():
            samples[key].append(await measure(fn, runs))
    return {key: statistics.median(values) for key, values in samples.items()}


ROWS = {
    "call_async": ("tool call, async tool, ungated", "call_async"),
    "call_async_gated": ("tool call, async tool, GatedToolset", "call_async"),
    "call_async_audited": ("tool call, async tool, GatedToolset + interceptor + MemorySink", "call_async"),
    "call_sync": ("tool call, sync tool (worker thread), ungated", "call_sync"),
    "call_sync_gated": ("tool call, sync tool (worker thread), GatedToolset", "call_sync"),
    "run": ("Agent.run, FunctionModel, ungated", "run"),
    "run_gated": ("Agent.run, FunctionModel, GatedToolset", "run"),
    "gate_typed": ("gate alone: scope.call of a @tool tool", "gate_typed"),
    "gate_schema": ("gate alone: scope.call of the same tool by JSON Schema", "gate_typed"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--runs", type=int, default=20, help="agent runs per round and path")
    parser.add_argument("--parallel", type=int, default=1, help="tool calls the model makes in one step")
    opts = parser.parse_args()
    med = asyncio.run(bench_pydantic_ai(opts.calls, opts.rounds, opts.runs, opts.parallel))
    print(f"{'path':<66} {'median µs':>11} {'ratio':>7}  to")
    for key, (label, base) in ROWS.items():
        print(f"{label:<66} {med[key] * 1e6:>11.2f} {med[key] / med[base]:>7.2f}  {base}")

    added = (med["call_async_gated"] - med["call_async"]) * 1e6
    per_call_in_run = (med["run_gated"] - med["run"]) / opts.parallel * 1e6
    print(f"\nthe gate adds {added:.1f} µs to a tool call; {per_call_in_run:.1f} µs per call in a whole run")
    print(f"tool call, async tool: gated / ungated = {med['call_async_gated'] / med['call_async']:.2f} (target <= 1.3)")
    print(f"tool call, sync tool: gated / ungated = {med['call_sync_gated'] / med['call_sync']:.2f} (target <= 1.3)")
    print(f"Agent.run ({opts.parallel} call(s)): gated / ungated = {med['run_gated'] / med['run']:.3f} (target <= 1.3)")
    print(f"gate alone: JSON Schema tool / @tool tool = {med['gate_schema'] / med['gate_typed']:.2f}")

    us = 1e6
    report(
        "Pydantic AI tool call (async tool), GatedToolset",
        med["call_async_gated"] * us,
        "µs/call",
        floor=med["call_async"] * us,
        target="<= 1.3 (to ungated)",
    )
    report(
        "Pydantic AI tool call (async tool), GatedToolset, audited (1 interceptor + MemorySink)",
        med["call_async_audited"] * us,
        "µs/call",
        floor=med["call_async"] * us,
        target="report (the event's own cost, see docs/performance.md)",
    )
    report(
        "Pydantic AI tool call (sync tool), GatedToolset",
        med["call_sync_gated"] * us,
        "µs/call",
        floor=med["call_sync"] * us,
        target="<= 1.3 (to ungated)",
    )
    report(
        f"Pydantic AI Agent.run ({opts.parallel} tool call), GatedToolset",
        med["run_gated"] * us,
        "µs/run",
        floor=med["run"] * us,
        target="<= 1.3 (to ungated)",
    )
    report(
        "gate: JSON-Schema tool call",
        med["gate_schema"] * us,
        "µs/call",
        floor=med["gate_typed"] * us,
        target="the @tool tool's cost",
    )


if __name__ == "__main__":
    main()
