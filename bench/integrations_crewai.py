"""CrewAI: a gated tool call against the same framework's ungated one, in one run.

    python bench/integrations_crewai.py [--calls N] [--rounds R] [--runs M]

Every path is called N times in a loop (M times for whole kickoffs); rounds of all paths
alternate, so machine noise hits them alike; medians of the per-round means are reported.

- tool call: CrewAI's own path for one action the model wrote, `execute_tool_and_check_finality`
  (ReAct parsing, the before/after tool hooks, `ToolUsage`: argument validation, the tool), of
  the CrewAI tool (ungated) and of its `GatedTool` with no interceptors and no sinks (the gate's
  own cost), for a sync tool and for an async one (which CrewAI runs with `asyncio.run`);
  audited: the gated call with one allowing interceptor and a `MemorySink`.
- kickoff: `Crew.kickoff` of one agent whose scripted `BaseLLM` makes one tool call, then answers
  (two model calls), ungated and gated.

Needs crewai (not in the dev extra). The last lines are the figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("CREWAI_TESTING", "true")  # no first-run prompt about traces
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")

from crewai import Agent, Crew, Task
from crewai.agents.parser import AgentAction, parse
from crewai.llms.base_llm import BaseLLM
from crewai.tools import BaseTool, tool
from crewai.utilities.i18n import get_i18n
from crewai.utilities.tool_utils import execute_tool_and_check_finality
from figures import report

from events import MemorySink
from interceptor_core import Allow, Gate, ToolCall
from interceptor_core.integrations.crewai import gate_tools

Path = Callable[[], Any]
ACTION = 'Thought: I need the order.\nAction: get_order\nAction Input: {"order_id": "o-1"}'
FINAL = "Thought: I now know the final answer\nFinal Answer: done"


@tool("get_order")
def get_order(order_id: str) -> str:
    """Loads an order record by ID."""
    return f'{{"order_id": "{order_id}", "amount_cents": 4200, "status": "shipped"}}'


@tool("get_order")
async def get_order_async(order_id: str) -> str:
    """Loads an order record by ID."""
    return f'{{"order_id": "{order_id}", "amount_cents": 4200, "status": "shipped"}}'


class AllowAll:
    """An allowing interceptor that reads the call, like a real policy would."""

    name = "allow-all"

    def before_tool_call(self, call: ToolCall) -> Allow:
        call.args.get("order_id")
        return Allow()


class Scripted(BaseLLM):
    """One tool call, then the final answer; again for every kickoff."""

    def __init__(self) -> None:
        super().__init__(model="scripted")
        self.turn = 0

    def call(self, messages: Any, *args: Any, **kwargs: Any) -> str:
        self.turn += 1
        return ACTION if self.turn % 2 else FINAL

    def supports_function_calling(self) -> bool:
        return False

    def get_context_window_size(self) -> int:
        return 8192


def measure(fn: Path, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def _call(crew_tool: BaseTool, after: Callable[[], None] | None = None) -> Path:
    """One model action calling `crew_tool` through CrewAI's tool path; then `after`."""
    structured = [crew_tool.to_structured_tool()]
    action = parse(ACTION)
    if not isinstance(action, AgentAction):
        raise SystemExit("bench setup is wrong: the action does not parse")
    i18n = get_i18n()

    def call() -> Any:
        result = execute_tool_and_check_finality(agent_action=action, tools=structured, i18n=i18n)
        if after is not None:
            after()
        return result

    return call


def _kickoff(tools: list[BaseTool]) -> Path:
    def run() -> Any:
        writer = Agent(role="clerk", goal="look up orders", backstory="knows orders", llm=Scripted(), tools=tools)
        task = Task(description="look up order o-1", expected_output="one line", agent=writer)
        return Crew(agents=[writer], tasks=[task]).kickoff()

    return run


def build_paths() -> tuple[dict[str, Path], dict[str, Path]]:
    """(per-call paths, whole-kickoff paths), each gated beside its ungated twin."""
    memory = MemorySink()  # emptied after each call, so the events kept do not weigh on the others
    audited = Gate("bench", interceptors=[AllowAll()], sinks=[memory])
    calls = {
        "call_sync": _call(get_order),
        "call_sync_gated": _call(gate_tools([get_order], gate=Gate("bench"))[0]),
        "call_sync_audited": _call(gate_tools([get_order], gate=audited)[0], memory.clear),
        "call_async": _call(get_order_async),
        "call_async_gated": _call(gate_tools([get_order_async], gate=Gate("bench"))[0]),
    }
    runs = {
        "kickoff": _kickoff([get_order]),
        "kickoff_gated": _kickoff(list(gate_tools([get_order], gate=Gate("bench")))),
    }
    return calls, runs


def _check(calls: dict[str, Path], runs: dict[str, Path]) -> None:
    for key, fn in calls.items():
        if '"order_id": "o-1"' not in fn().result:
            raise SystemExit(f"bench setup is wrong: {key}")
    for key, fn in runs.items():
        if fn().raw != "done":
            raise SystemExit(f"bench setup is wrong: {key}")


def bench_crewai(calls: int = 1000, rounds: int = 11, runs: int = 50) -> dict[str, float]:
    """Median seconds per call (per kickoff for the kickoff paths), measured in interleaved rounds."""
    call_paths, run_paths = build_paths()
    _check(call_paths, run_paths)
    for fn in call_paths.values():
        measure(fn, calls // 5 or 1)  # warm-up
    for fn in run_paths.values():
        measure(fn, runs // 5 or 1)
    samples: dict[str, list[float]] = {key: [] for key in (*call_paths, *run_paths)}
    for _ in range(rounds):
        for key, fn in call_paths.items():
            samples[key].append(measure(fn, calls))
        for key, fn in run_paths.items():
            samples[key].append(measure(fn, runs))
    return {key: statistics.median(values) for key, values in samples.items()}


ROWS = {
    "call_sync": ("tool call, sync tool, ungated", "call_sync"),
    "call_sync_gated": ("tool call, sync tool, GatedTool", "call_sync"),
    "call_sync_audited": ("tool call, sync tool, GatedTool + interceptor + MemorySink", "call_sync"),
    "call_async": ("tool call, async tool (asyncio.run), ungated", "call_async"),
    "call_async_gated": ("tool call, async tool, GatedTool", "call_async"),
    "kickoff": ("Crew.kickoff, scripted BaseLLM, 1 tool call, ungated", "kickoff"),
    "kickoff_gated": ("Crew.kickoff, scripted BaseLLM, 1 tool call, GatedTool", "kickoff"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--runs", type=int, default=50, help="kickoffs per round and path")
    opts = parser.parse_args()
    med = bench_crewai(opts.calls, opts.rounds, opts.runs)
    print(f"{'path':<66} {'median µs':>11} {'ratio':>7}  to")
    for key, (label, base) in ROWS.items():
        print(f"{label:<66} {med[key] * 1e6:>11.2f} {med[key] / med[base]:>7.2f}  {base}")
    added = (med["call_sync_gated"] - med["call_sync"]) * 1e6
    print(f"\nthe gate adds {added:.1f} µs to a CrewAI tool call")
    print(f"tool call, sync tool: gated / ungated = {med['call_sync_gated'] / med['call_sync']:.2f} (target <= 1.3)")
    print(f"tool call, async tool: gated / ungated = {med['call_async_gated'] / med['call_async']:.2f} (target <= 1.3)")
    print(f"Crew.kickoff: gated / ungated = {med['kickoff_gated'] / med['kickoff']:.3f} (target <= 1.3)")

    us = 1e6
    report(
        "CrewAI tool call (sync tool), GatedTool",
        med["call_sync_gated"] * us,
        "µs/call",
        floor=med["call_sync"] * us,
        target="<= 1.3 (to ungated)",
    )
    report(
        "CrewAI tool call (sync tool), GatedTool, audited (1 interceptor + MemorySink)",
        med["call_sync_audited"] * us,
        "µs/call",
        floor=med["call_sync"] * us,
        target="report (the event's own cost, see docs/performance.md)",
    )
    report(
        "CrewAI tool call (async tool), GatedTool",
        med["call_async_gated"] * us,
        "µs/call",
        floor=med["call_async"] * us,
        target="<= 1.3 (to ungated)",
    )
    report(
        "CrewAI Crew.kickoff (1 tool call), GatedTool",
        med["kickoff_gated"] * us,
        "µs/kickoff",
        floor=med["kickoff"] * us,
        target="<= 1.3 (to ungated)",
    )


if __name__ == "__main__":
    main()
