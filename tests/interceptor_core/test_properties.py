"""Rules that hold for every chain: hypothesis builds the scopes and decisions."""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from interceptor_core import (
    Block,
    Decision,
    Deny,
    Gate,
    RequireApproval,
    Rewrite,
    Substitute,
    ToolBlockedError,
    ToolCall,
    tool,
)
from interceptor_core.testing import RecordingInterceptor, SeenCall

LEVELS = ("application", "workflow", "agent", "tool")


def build(per_level: list[list[object]], **gate_options: Any) -> tuple[Any, list[str]]:
    """A gate with the given interceptors at each level and one tool recording its runs."""
    ran: list[str] = []

    @tool(interceptors=per_level[3])
    def act(value: str = "original") -> str:
        ran.append(value)
        return value

    gate = Gate("g", interceptors=per_level[0], **gate_options)
    agent = gate.workflow("w", interceptors=per_level[1]).agent("a", tools=[act], interceptors=per_level[2])
    return agent, ran


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=3), min_size=4, max_size=4))
def test_after_order_is_the_reverse_of_before_order(counts: list[int]) -> None:
    """For any number of interceptors per scope, after-handlers run in exactly the reverse order."""
    log: list[SeenCall] = []
    per_level = [
        [RecordingInterceptor(f"{level}-{i}", log=log) for i in range(count)]
        for level, count in zip(LEVELS, counts, strict=True)
    ]
    agent, _ = build(per_level)
    result = asyncio.run(agent.call("act", {}))
    assert result.ok
    expected = [r.name for level in per_level for r in level]  # type: ignore[attr-defined]
    before = [s.interceptor for s in log if s.phase == "before"]
    after = [s.interceptor for s in log if s.phase == "after"]
    assert before == expected
    assert after == expected[::-1]


DECISIONS: dict[str, Decision | None] = {
    "none": None,
    "deny": Deny("denied"),
    "substitute": Substitute("synthetic"),
    "block": Block("blocked"),
    "approval": RequireApproval("ask"),
}
TERMINAL = {"deny", "substitute", "block"}


@settings(max_examples=120, deadline=None)
@given(st.lists(st.sampled_from(sorted(DECISIONS)), min_size=1, max_size=8), st.booleans())
def test_the_first_terminal_decision_stops_the_chain(kinds: list[str], approve: bool) -> None:
    """Interceptors after the first Deny/Substitute/Block never run, and that decision is the outcome."""
    log: list[SeenCall] = []
    interceptors = [
        RecordingInterceptor(f"i{n}", decision=DECISIONS[kind], log=log, after=False) for n, kind in enumerate(kinds)
    ]
    asked: list[str] = []

    async def handler(request: Any) -> bool:
        asked.append(request.call_id)
        return approve

    agent, ran = build([interceptors, [], [], []], approval_handler=handler)
    first = next((n for n, kind in enumerate(kinds) if kind in TERMINAL), None)
    blocked_by: str | None = None
    try:
        outcome = asyncio.run(agent.call("act", {})).kind
    except ToolBlockedError as exc:
        outcome, blocked_by = "block", exc.interceptor
    if outcome == "block":
        assert first is not None
        assert blocked_by == f"i{first}"
    called = [s.interceptor for s in log]
    if first is None:
        assert called == [f"i{n}" for n in range(len(kinds))]
        wants_approval = "approval" in kinds
        assert len(asked) == (1 if wants_approval else 0)
        assert outcome == ("denied" if wants_approval and not approve else "ok")
        assert ran == ([] if outcome == "denied" else ["original"])
    else:
        assert called == [f"i{n}" for n in range(first + 1)]
        assert asked == []
        assert ran == []
        assert outcome == {"deny": "denied", "substitute": "substituted", "block": "block"}[kinds[first]]


@settings(max_examples=80, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=10))
def test_a_rewrite_is_seen_by_every_later_interceptor(rewrites: list[bool]) -> None:
    """Every interceptor sees the value of the latest rewrite before it, and so does the tool."""
    seen: list[tuple[int, str]] = []

    def make(n: int, rewrites_here: bool) -> Any:
        class Step:
            name = f"step-{n}"

            def before_tool_call(self, call: ToolCall) -> Rewrite | None:
                seen.append((n, call.args["value"]))
                return Rewrite({"value": f"v{n}"}) if rewrites_here else None

        return Step()

    agent, ran = build([[make(n, r) for n, r in enumerate(rewrites)], [], [], []])
    asyncio.run(agent.call("act", {}))
    current = "original"
    for n, rewrites_here in enumerate(rewrites):
        assert seen[n] == (n, current)
        if rewrites_here:
            current = f"v{n}"
    assert ran == [current]
