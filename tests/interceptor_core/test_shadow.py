"""Shadow mode: decisions evaluated and recorded on every call, never applied, never failing it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import BaseModel

from events import MemorySink
from interceptor_core import (
    Block,
    ConfigurationError,
    Deny,
    Gate,
    RequireApproval,
    Rewrite,
    RunContext,
    Substitute,
    ToolCall,
    shadow,
    tool,
)
from interceptor_core.policy import Policy, PolicyError

ACME = RunContext(tenant="acme", principal="u-1")


class Refund(BaseModel):
    order_id: str
    amount_cents: int


class Decides:
    """An interceptor that returns a fixed decision (or raises), to put in shadow."""

    def __init__(self, name: str, decision: Any = None, *, raises: bool = False, slow_s: float = 0.0) -> None:
        self.name = name
        self.decision = decision
        self.raises = raises
        self.slow_s = slow_s
        self.seen: list[dict[str, Any]] = []

    async def before_tool_call(self, call: ToolCall) -> Any:
        self.seen.append(dict(call.args))
        if self.slow_s:
            await asyncio.sleep(self.slow_s)  # sleep-ok: the slow interceptor under test
        if self.raises:
            raise RuntimeError("shadow check broke")
        return self.decision


def desk(*interceptors: object, approve: bool | None = None, **gate: Any) -> tuple[Any, MemorySink, list[str]]:
    sink = MemorySink()
    ran: list[str] = []

    @tool
    def refund(args: Refund) -> str:
        ran.append(args.order_id)
        return "refunded"

    handler = None if approve is None else (lambda request: approve)
    built = Gate("shop", interceptors=list(interceptors), sinks=[sink], approval_handler=handler, **gate)
    return built.agent("desk", tools=[refund]), sink, ran


def outcome_event(sink: MemorySink) -> Any:
    return next(e for e in sink.events if e.type in ("ToolUse", "ToolDenied", "Substitute", "Blocked"))


class TestShadowInterceptors:
    """`shadow(interceptor)` and `mode = "shadow"` on Python interceptors."""

    @pytest.mark.parametrize(
        ("decision", "would"),
        [
            (Deny("no"), "denied"),
            (Block("stop"), "blocked"),
            (Substitute("canned"), "substituted"),
            (RequireApproval("ask"), "approval"),
        ],
    )
    async def test_a_shadow_decision_is_recorded_and_not_applied(self, decision: Any, would: str) -> None:
        """The tool runs; the event says what the shadow decision would have done, and that it diverges."""
        scope, sink, ran = desk(shadow(Decides("strict", decision)))
        result = await scope.call("refund", {"order_id": "A-1", "amount_cents": 5}, run=ACME)
        assert result.ok
        assert ran == ["A-1"]
        event = outcome_event(sink)
        assert (event.type, event.shadow_outcome, event.divergent, event.shadow_decided_by) == (
            "ToolUse",
            would,
            True,
            "strict",
        )
        step = event.decisions[0]
        assert (step.interceptor, step.kind, step.enforced) == ("strict", decision.kind, False)

    async def test_a_shadow_rewrite_changes_nothing(self) -> None:
        """A shadow Rewrite is recorded; the tool and the later interceptors see the enforced arguments."""
        later = Decides("later")
        scope, sink, ran = desk(shadow(Decides("fix", Rewrite({"order_id": "X", "amount_cents": 1}))), later)
        await scope.call("refund", {"order_id": "A-1", "amount_cents": 5}, run=ACME)
        assert ran == ["A-1"]
        assert later.seen == [{"order_id": "A-1", "amount_cents": 5}]
        event = outcome_event(sink)
        assert (event.shadow_outcome, event.divergent, event.args_rewritten) == ("allowed", False, False)

    async def test_a_shadow_interceptor_that_raises_or_times_out_does_not_fail_the_call(self) -> None:
        """Errors and timeouts of a shadow interceptor are recorded as errors; the call goes on."""
        scope, sink, ran = desk(
            shadow(Decides("broken", raises=True)), shadow(Decides("slow", slow_s=0.2)), interceptor_timeout_s=0.05
        )
        result = await scope.call("refund", {"order_id": "A-1", "amount_cents": 5}, run=ACME)
        assert result.ok
        assert ran == ["A-1"]
        steps = outcome_event(sink).decisions
        assert [(s.interceptor, s.kind, s.enforced) for s in steps[:2]] == [
            ("broken", "error", False),
            ("slow", "error", False),
        ]
        assert "shadow check broke" in (steps[0].error or "")

    async def test_an_enforced_deny_before_a_shadow_allow_is_not_divergent(self) -> None:
        """Enforced deny ends the call; the shadow interceptor after it never runs; no shadow fields."""
        strict = Decides("strict", Deny("no"))
        scope, sink, _ = desk(Decides("enforced", Deny("refused")), shadow(strict))
        await scope.call("refund", {"order_id": "A-1", "amount_cents": 5}, run=ACME)
        event = outcome_event(sink)
        assert strict.seen == []
        assert (event.type, event.shadow_outcome, event.divergent) == ("ToolDenied", None, None)

    async def test_a_shadow_allow_before_an_enforced_deny_agrees(self) -> None:
        """A shadow decision that would not end the call, then an enforced deny: shadow says denied too."""
        scope, sink, _ = desk(shadow(Decides("loose")), Decides("enforced", Deny("refused")))
        await scope.call("refund", {"order_id": "A-1", "amount_cents": 5}, run=ACME)
        event = outcome_event(sink)
        assert (event.type, event.shadow_outcome, event.divergent, event.shadow_decided_by) == (
            "ToolDenied",
            "denied",
            False,
            None,
        )
        assert [s.enforced for s in event.decisions] == [False, True]

    async def test_a_call_with_no_shadow_decision_has_no_shadow_fields(self) -> None:
        """Without shadow interceptors the event's JSON has neither field, nor `enforced` on its steps."""
        scope, sink, _ = desk(Decides("plain"))
        await scope.call("refund", {"order_id": "A-1", "amount_cents": 5}, run=ACME)
        dumped = outcome_event(sink).model_dump(mode="json")
        assert "shadow_outcome" not in dumped
        assert "divergent" not in dumped
        assert "enforced" not in dumped["decisions"][0]

    def test_mode_on_the_class_puts_it_in_shadow_and_a_bad_mode_is_refused(self) -> None:
        """`mode = "shadow"` works like shadow(); any other mode than enforce/shadow is a ConfigurationError."""

        class Strict(Decides):
            mode = "shadow"

        scope, sink, ran = desk(Strict("strict", Deny("no")))
        asyncio.run(scope.call("refund", {"order_id": "A-1", "amount_cents": 5}, run=ACME))
        assert ran == ["A-1"]
        assert outcome_event(sink).shadow_outcome == "denied"

        class Odd(Decides):
            mode = "audit"

        with pytest.raises(ConfigurationError, match="mode 'audit'"):
            desk(Odd("odd"))

    def test_tools_registered_lists_shadow_interceptors_apart(self) -> None:
        """The registered chain leaves shadow interceptors out (coverage does not ask for them)."""
        _, sink, _ = desk(Decides("enforced"), shadow(Decides("strict")))
        tools = next(e for e in sink.events if e.type == "ToolsRegistered").tools
        assert (tools[0].interceptors, tools[0].shadow) == (("enforced",), ("strict",))


SHADOW_RULES = """\
version: 1
name: refunds
rules:
  - id: big-refunds
    tools: [refund]
    when: "args.amount_cents > 10000"
    decision: require_approval
    message: "over 100.00"
  - id: stricter-refunds
    mode: shadow
    tools: [refund]
    when: "args.amount_cents > 5000"
    decision: deny
    message: "over 50.00"
"""


class TestShadowRules:
    """`mode: shadow` on a rule, and on a whole policy file."""

    async def test_a_shadow_rule_records_what_it_would_do(self) -> None:
        """A 60.00 refund passes; the event says the stricter shadow rule would have denied it."""
        scope, sink, ran = desk(Policy.from_text(SHADOW_RULES))
        result = await scope.call("refund", {"order_id": "A-1", "amount_cents": 6000}, run=ACME)
        assert result.ok
        assert ran == ["A-1"]
        event = outcome_event(sink)
        assert (event.shadow_outcome, event.divergent, event.shadow_decided_by, event.shadow_rule) == (
            "denied",
            True,
            "refunds",
            "stricter-refunds",
        )
        enforced, shadowed = event.decisions[0], event.decisions[1]
        assert (enforced.kind, enforced.enforced, enforced.rules) == ("allow", True, ())
        assert (shadowed.kind, shadowed.enforced, [r.id for r in shadowed.rules]) == (
            "deny",
            False,
            ["stricter-refunds"],
        )

    async def test_a_small_refund_leaves_no_shadow_fields(self) -> None:
        """No shadow rule matched: the call has no shadow decision at all."""
        scope, sink, _ = desk(Policy.from_text(SHADOW_RULES))
        await scope.call("refund", {"order_id": "A-1", "amount_cents": 100}, run=ACME)
        assert outcome_event(sink).shadow_outcome is None

    async def test_an_enforced_rule_still_decides_beside_a_shadow_one(self) -> None:
        """A 200.00 refund asks the human (enforced); the shadow rule would have denied: divergent."""
        scope, sink, _ = desk(Policy.from_text(SHADOW_RULES), approve=True)
        result = await scope.call("refund", {"order_id": "A-1", "amount_cents": 20000}, run=ACME)
        assert result.ok
        event = outcome_event(sink)
        assert (event.shadow_outcome, event.divergent) == ("denied", True)

    async def test_a_shadow_policy_file_applies_nothing(self) -> None:
        """`mode: shadow` on the file: its deny is recorded, the tool runs."""
        text = SHADOW_RULES.replace("name: refunds\n", "name: refunds\nmode: shadow\n")
        scope, sink, ran = desk(Policy.from_text(text), approve=False)
        result = await scope.call("refund", {"order_id": "A-1", "amount_cents": 20000}, run=ACME)
        assert result.ok
        assert ran == ["A-1"]
        event = outcome_event(sink)
        assert (event.shadow_outcome, event.divergent, event.shadow_decided_by) == ("denied", True, "refunds")

    def test_an_enforcing_rule_in_a_shadow_file_is_refused(self) -> None:
        """A rule saying mode: enforce inside a shadow file is a contradiction, refused at load."""
        text = "version: 1\nname: p\nmode: shadow\nrules:\n  - id: a\n    mode: enforce\n    decision: deny\n"
        with pytest.raises(PolicyError, match="cannot enforce"):
            Policy.from_text(text)

    def test_a_shadow_rule_hides_no_tool(self) -> None:
        """definitions(run) ignores shadow rules: the model still sees the tool."""
        text = "version: 1\nname: p\nmandatory: true\nrules:\n  - id: a\n    mode: shadow\n    decision: deny\n"
        scope, _, _ = desk(Policy.from_text(text))
        assert [d["name"] for d in scope.definitions(ACME)] == ["refund"]
