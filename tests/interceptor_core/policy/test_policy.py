"""Policy files: load-time checks, the decision semantics, and a policy as an interceptor of a real gate."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, Field

from events import MemorySink
from interceptor_core import (
    ConfigurationError,
    Gate,
    RunContext,
    ToolApprovalRequiredError,
    ToolBlockedError,
    tool,
)
from interceptor_core.builtins import InProcessCounter
from interceptor_core.policy import Policy, PolicyError, load_policy

ACME = RunContext(tenant="acme", principal="u-1")

SUPPORT = """\
version: 1
name: support-desk
mandatory: true
default: allow
rules:
  - id: tenant-orders
    description: Orders belong to the caller's tenant
    tools: [get_order, "refund*"]
    when: "!args.order_id.startsWith(run.tenant.upperAscii() + '-')"
    decision: deny
    message: "Order {args.order_id} does not belong to tenant {run.tenant}."
  - id: big-refunds
    tools: [refund]
    when: "args.amount_cents > 10000"
    decision: require_approval
    message: "Refunds over 100.00 need a reviewer."
  - id: uppercase-ids
    tools: [get_order]
    decision: rewrite
    set: {order_id: "args.order_id.upperAscii()"}
  - id: cached-rates
    tools: [fx_rate]
    decision: substitute
    result: "{'rate': 1.0}"
"""


def policy_text(rules: str, *, head: str = "version: 1\nname: p\n") -> str:
    return head + "rules:\n" + textwrap.indent(textwrap.dedent(rules), "  ")


class Order(BaseModel):
    order_id: str = Field(description="an order id")


class Refund(BaseModel):
    order_id: str
    amount_cents: int


def desk(*interceptors: object, sinks: list[Any] | None = None, approve: bool | None = None) -> Any:
    ran: list[str] = []

    @tool
    def get_order(args: Order) -> str:
        ran.append(f"get_order {args.order_id}")
        return f"order {args.order_id}"

    @tool
    def refund(args: Refund) -> str:
        ran.append(f"refund {args.order_id}")
        return "refunded"

    @tool
    def fx_rate(currency: str) -> dict[str, float]:
        ran.append("fx_rate")
        return {"rate": 2.0}

    handler = None if approve is None else (lambda request: approve)
    gate = Gate("shop", interceptors=list(interceptors), sinks=sinks or [], approval_handler=handler)
    scope = gate.agent("desk", tools=[get_order, refund, fx_rate])
    return gate, scope, ran


class TestLoading:
    """What `load_policy` and `Policy.from_text` accept, and every problem they refuse."""

    def test_the_issues_example_loads_with_its_rules_and_version(self, tmp_path: Path) -> None:
        """The example file loads: its name, mandatory flag, rules in order and the SHA-256 of its bytes."""
        path = tmp_path / "support.yaml"
        path.write_text(SUPPORT)
        policy = load_policy(path)
        assert (policy.name, policy.mandatory, policy.default) == ("support-desk", True, "allow")
        assert [r.id for r in policy.rules] == ["tenant-orders", "big-refunds", "uppercase-ids", "cached-rates"]
        assert policy.version == hashlib.sha256(path.read_bytes()).hexdigest()
        assert policy.rules[0].tools == ("get_order", "refund*")

    @pytest.mark.parametrize(
        ("rules", "line", "rule", "needle"),
        [
            ("- id: a\n  decision: deny\n  colour: red\n", 6, "a", "unknown key 'colour'"),
            ("- id: a\n  decision: deny\n- id: a\n  decision: deny\n", 6, "a", "duplicate id 'a'"),
            ("- id: a\n  decision: maybe\n", 5, "a", "decision must be one of"),
            ("- id: Not_Kebab\n  decision: deny\n", 4, "Not_Kebab", "kebab-case"),
            ("- id: a\n  decision: deny\n  when: 'args.x >'\n", 6, "a", "CEL does not compile"),
            ("- id: a\n  decision: deny\n  when: 'nosuch(args.x)'\n", 6, "a", "undeclared reference to 'nosuch'"),
            ("- id: a\n  decision: deny\n  when: 'user.id == 1'\n", 6, "a", "undeclared reference to 'user"),
            ("- id: a\n  decision: deny\n  when: 'run.tenat == \"x\"'\n", 6, "a", "run has no field 'tenat'"),
            ("- id: a\n  decision: deny\n  when: '1 + 2'\n", 6, "a", "must give a bool"),
            ("- id: a\n  decision: deny\n  tools: ['ref[und']\n", 6, "a", "'[' without its ']'"),
            ("- id: a\n  decision: deny\n  message: 'hi {user.name}'\n", 6, "a", "no variable"),
            ("- id: a\n  decision: deny\n  message: 'hi {run.nobody}'\n", 6, "a", "run has no field 'nobody'"),
            ("- id: a\n  decision: deny\n  message: 'unbalanced { brace'\n", 6, "a", "unbalanced"),
            ("- id: a\n  decision: rewrite\n", 4, "a", "needs set"),
            ("- id: a\n  decision: substitute\n", 4, "a", "needs result"),
            ("- id: a\n  decision: allow\n  message: 'x'\n", 6, "a", "has no message"),
            ("- id: a\n  decision: deny\n  set: {x: '1'}\n", 6, "a", "only for a rewrite"),
        ],
    )
    def test_a_bad_rule_is_refused_naming_file_line_and_rule(
        self, rules: str, line: int, rule: str, needle: str
    ) -> None:
        """Each load-time check raises PolicyError with `FILE:LINE rule-id: what is wrong`."""
        with pytest.raises(PolicyError) as caught:
            Policy.from_text(policy_text(rules), source="p.yaml")
        problems = caught.value.problems
        assert any(p.line == line and p.rule == rule and needle in p.message for p in problems), problems
        assert f"p.yaml:{line} {rule}: " in str(caught.value)
        assert isinstance(caught.value, ConfigurationError)

    def test_every_problem_is_reported_at_once(self) -> None:
        """Two bad rules give two problems, so a reviewer fixes both in one pass."""
        text = policy_text("- id: a\n  decision: nope\n- id: b\n  decision: deny\n  when: 'x.'\n")
        with pytest.raises(PolicyError) as caught:
            Policy.from_text(text)
        assert sorted(p.rule or "" for p in caught.value.problems) == ["a", "b"]

    @pytest.mark.parametrize(
        ("text", "needle"),
        [
            ("version: 2\nname: p\nrules: []\n", "version must be 1"),
            ("version: 1\nrules: []\n", "name must be"),
            ("version: 1\nname: p\ndefault: maybe\nrules: []\n", "default must be allow or deny"),
            ("version: 1\nname: p\nrules: []\nextra: 1\n", "unknown key 'extra'"),
            ("version: 1\nname: p\nname: q\nrules: []\n", "given twice"),
            ("version: 1\nname: [p\n", "not valid YAML"),
            ("- just a list\n", "a policy file is a mapping"),
        ],
    )
    def test_a_bad_file_is_refused(self, text: str, needle: str) -> None:
        """Top-level mistakes (version, name, default, unknown or repeated keys, bad YAML) are refused."""
        with pytest.raises(PolicyError, match=needle):
            Policy.from_text(text)

    def test_a_missing_file_is_a_policy_error(self, tmp_path: Path) -> None:
        """A path that does not exist is a PolicyError naming it."""
        with pytest.raises(PolicyError, match=r"nope\.yaml"):
            load_policy(tmp_path / "nope.yaml")

    def test_a_set_on_an_argument_the_tool_lacks_is_refused_when_the_scope_is_built(self) -> None:
        """A rewrite of a field the tool does not have fails at registration, naming rule and field."""
        policy = Policy.from_text(
            policy_text("- id: fix\n  tools: [get_order]\n  decision: rewrite\n  set: {orderid: \"'X'\"}\n")
        )
        with pytest.raises(PolicyError, match="fix: set 'orderid': tool get_order has no such argument"):
            desk(policy)

    def test_a_message_naming_an_argument_the_tool_lacks_is_refused(self) -> None:
        """A message field `{args.x}` the tool does not have is refused when the scope is built."""
        policy = Policy.from_text(
            policy_text("- id: m\n  tools: [get_order]\n  decision: deny\n  message: '{args.amount}'\n")
        )
        with pytest.raises(PolicyError, match=r"args\.amount: tool get_order has no such argument"):
            desk(policy)

    def test_a_has_guard_lets_a_rule_cover_tools_without_the_field(self) -> None:
        """`has(args.x) && ...` on every tool is accepted although some tools lack x."""
        policy = Policy.from_text(
            policy_text("- id: big\n  decision: deny\n  when: 'has(args.amount_cents) && args.amount_cents > 5'\n")
        )
        desk(policy)


class TestSemantics:
    """Rewrites first, then block > deny > substitute > require_approval > allow/default; fail closed."""

    async def test_another_tenants_order_is_denied_with_the_rules_message(self) -> None:
        """The tenant rule denies GLOBEX-1 for acme with its rendered message; the tool does not run."""
        _, scope, ran = desk(Policy.from_text(SUPPORT))
        result = await scope.call("get_order", {"order_id": "GLOBEX-1"}, run=ACME)
        assert result.kind == "denied"
        assert result.message == "Order GLOBEX-1 does not belong to tenant acme."
        assert ran == []

    async def test_rewrites_apply_first_and_the_decision_sees_the_final_arguments(self) -> None:
        """acme-7 is upper-cased by the rewrite, then passes the tenant rule; the tool gets ACME-7."""
        _, scope, ran = desk(Policy.from_text(SUPPORT))
        result = await scope.call("get_order", {"order_id": "acme-7"}, run=ACME)
        assert result.ok
        assert ran == ["get_order ACME-7"]
        step = result.decisions[0]
        assert (step.kind, step.rules) == ("rewrite", (("uppercase-ids", "rewrite"),))

    async def test_a_substitute_rule_answers_without_the_tool(self) -> None:
        """fx_rate is answered by the rule's CEL result, and the body never runs."""
        _, scope, ran = desk(Policy.from_text(SUPPORT))
        result = await scope.call("fx_rate", {"currency": "EUR"}, run=ACME)
        assert (result.kind, result.value, ran) == ("substituted", {"rate": 1.0}, [])

    async def test_require_approval_asks_a_human_with_the_rules_reason(self) -> None:
        """A big refund of the tenant's own order goes to the approval handler; refused means denied."""
        _, scope, ran = desk(Policy.from_text(SUPPORT), approve=False)
        result = await scope.call("refund", {"order_id": "ACME-1", "amount_cents": 20000}, run=ACME)
        assert result.kind == "denied"
        assert "Refunds over 100.00 need a reviewer." in (result.message or "")
        assert ran == []
        _, scope, _ = desk(Policy.from_text(SUPPORT))
        with pytest.raises(ToolApprovalRequiredError, match="need a reviewer"):
            await scope.call("refund", {"order_id": "ACME-1", "amount_cents": 20000}, run=ACME)

    async def test_a_deny_later_in_the_file_beats_an_earlier_allow(self) -> None:
        """Place in the file never lets a deny be skipped: allow first, deny second, the deny wins."""
        text = policy_text(
            """\
            - id: ok-all
              decision: allow
            - id: no-globex
              tools: [get_order]
              when: "args.order_id.startsWith('GLOBEX')"
              decision: deny
              message: no
            """
        )
        _, scope, _ = desk(Policy.from_text(text))
        result = await scope.call("get_order", {"order_id": "GLOBEX-1"}, run=ACME)
        assert result.kind == "denied"
        assert result.decisions[0].rules == (("ok-all", "allow"), ("no-globex", "deny"))

    @pytest.mark.parametrize(
        ("kinds", "winner"),
        [
            (["allow", "require_approval", "substitute", "deny", "block"], "block"),
            (["allow", "require_approval", "substitute", "deny"], "deny"),
            (["allow", "require_approval", "substitute"], "substitute"),
            (["allow", "require_approval"], "require_approval"),
            (["allow"], "allow"),
        ],
    )
    def test_the_strongest_matching_kind_wins_whatever_the_order(self, kinds: list[str], winner: str) -> None:
        """block > deny > substitute > require_approval > allow, in both file orders."""
        for ordered in (kinds, list(reversed(kinds))):
            rules = "".join(
                f"- id: r-{k.replace('_', '-')}\n  decision: {k}\n" + ("  result: '1'\n" if k == "substitute" else "")
                for k in ordered
            )
            policy = Policy.from_text(policy_text(rules, head="version: 1\nname: p\ndefault: deny\n"))
            evaluation = policy.evaluate("t", {}, ACME)
            assert evaluation.decision.kind == winner
            assert evaluation.decided_by == f"r-{winner.replace('_', '-')}"

    def test_the_first_matching_rule_of_the_winning_kind_gives_the_message(self) -> None:
        """Two denies match: the message is the first one's, in file order."""
        policy = Policy.from_text(
            policy_text(
                "- id: one\n  decision: deny\n  message: first\n- id: two\n  decision: deny\n  message: second\n"
            )
        )
        assert policy.evaluate("t", {}, ACME).decision == __import__("interceptor_core").Deny("first")

    def test_default_deny_refuses_what_no_allow_rule_matched(self) -> None:
        """With default deny, an unmatched call is denied with default_message; an allowed one passes."""
        text = (
            "version: 1\nname: p\ndefault: deny\ndefault_message: 'Only reads; {tool} is not one.'\nrules:\n"
            "  - id: reads\n    tools: ['get_*']\n    decision: allow\n"
        )
        policy = Policy.from_text(text)
        assert policy.evaluate("get_order", {}, ACME).decision.kind == "allow"
        denied = policy.evaluate("refund", {}, ACME).decision
        assert denied.kind == "deny"
        assert denied.message == "Only reads; refund is not one."

    async def test_a_failing_condition_fails_closed_for_deny_and_open_for_allow(self) -> None:
        """A condition on a missing field counts as matched for a deny, and the trail records why."""
        text = policy_text(
            "- id: strict\n  tools: [get_order]\n  decision: deny\n  when: 'args.order_id > 5'\n  message: refused\n"
        )
        _, scope, ran = desk(Policy.from_text(text))
        result = await scope.call("get_order", {"order_id": "ACME-1"}, run=ACME)
        assert result.kind == "denied"
        assert ran == []
        step = result.decisions[0]
        assert step.rules == (("strict", "deny"),)
        assert step.error is not None
        assert "strict" in step.error
        assert "counted as matched" in step.error

    def test_a_failing_condition_does_not_match_an_allow_rewrite_or_substitute(self) -> None:
        """Errors never let an allow, rewrite or substitute take effect."""
        text = policy_text(
            """\
            - id: fix
              decision: rewrite
              when: "args.missing == 1"
              set: {order_id: "'X'"}
            - id: canned
              decision: substitute
              when: "args.missing == 1"
              result: "'canned'"
            - id: allow-it
              decision: allow
              when: "args.missing == 1"
            """,
            head="version: 1\nname: p\ndefault: deny\n",
        )
        evaluation = Policy.from_text(text).evaluate("get_order", {"order_id": "a"}, ACME)
        assert evaluation.decision.kind == "deny"
        assert evaluation.matched == ()
        assert evaluation.args == {"order_id": "a"}
        assert evaluation.error is not None
        assert evaluation.error.count("(not") == 3

    async def test_a_block_rule_stops_the_run(self) -> None:
        """A matching block raises ToolBlockedError carrying the rule's message."""
        text = policy_text("- id: stop\n  tools: [refund]\n  decision: block\n  message: 'stop {args.order_id}'\n")
        _, scope, ran = desk(Policy.from_text(text))
        with pytest.raises(ToolBlockedError, match="stop ACME-1"):
            await scope.call("refund", {"order_id": "ACME-1", "amount_cents": 1}, run=ACME)
        assert ran == []

    async def test_a_rewrite_the_tool_refuses_fails_closed(self) -> None:
        """A rewrite into invalid arguments denies the call (the gate's fail-closed path)."""
        text = policy_text("- id: bad\n  tools: [refund]\n  decision: rewrite\n  set: {amount_cents: \"'lots'\"}\n")
        _, scope, ran = desk(Policy.from_text(text))
        result = await scope.call("refund", {"order_id": "ACME-1", "amount_cents": 1}, run=ACME)
        assert result.kind == "denied"
        assert ran == []
        assert "bad" in (result.decisions[0].error or "")

    def test_variables_run_scope_tool_and_now_are_there(self) -> None:
        """Conditions see the run's fields, the scope path, the tool's name and a timestamp."""
        text = policy_text(
            "- id: all\n  decision: deny\n"
            "  when: \"run.principal == 'u-1' && run.metadata.team == 'a' && scope.agent == 'desk' "
            "&& tool == 'get_order' && now > timestamp('2020-01-01T00:00:00Z')\"\n"
        )
        _, scope, _ = desk(Policy.from_text(text))
        run = RunContext(tenant="acme", principal="u-1", metadata={"team": "a"})
        import asyncio

        result = asyncio.run(scope.call("get_order", {"order_id": "ACME-1"}, run=run))
        assert result.kind == "denied"
        assert result.decisions[0].error is None


class TestTrailAndEvents:
    """The decision record, the events, describe and ToolsRegistered name the policy's version and rules."""

    async def test_the_event_trail_carries_version_and_matched_rules(self) -> None:
        """The ToolDenied event's decision step has policy_version and the rule ids with decisions."""
        sink = MemorySink()
        policy = Policy.from_text(SUPPORT)
        _, scope, _ = desk(policy, sinks=[sink])
        await scope.call("get_order", {"order_id": "globex-1"}, run=ACME)
        event = next(e for e in sink.events if e.type == "ToolDenied")
        step = event.decisions[0]
        assert step.policy_version == policy.version
        assert [(r.id, r.decision) for r in step.rules] == [("uppercase-ids", "rewrite"), ("tenant-orders", "deny")]

    async def test_python_interceptor_steps_keep_their_old_canonical_form(self) -> None:
        """A step of a Python interceptor has no policy fields in its JSON, so old events hash the same."""
        sink = MemorySink()

        class Plain:
            name = "plain"

            def before_tool_call(self, call: Any) -> None:
                return None

        _, scope, _ = desk(Plain(), sinks=[sink])
        await scope.call("get_order", {"order_id": "ACME-1"}, run=ACME)
        dumped = next(e for e in sink.events if e.type == "ToolUse").model_dump(mode="json")
        assert "policy_version" not in dumped["decisions"][0]
        assert "rules" not in dumped["decisions"][0]

    def test_tools_registered_names_each_chains_policy_version(self) -> None:
        """ToolsRegistered lists the policy's version for every tool whose chain holds it."""
        sink = MemorySink()
        policy = Policy.from_text(SUPPORT)
        desk(policy, sinks=[sink])
        registered = next(e for e in sink.events if e.type == "ToolsRegistered")
        assert {t.name: t.policies for t in registered.tools} == {
            name: {"support-desk": policy.version} for name in ("get_order", "refund", "fx_rate")
        }

    def test_describe_lists_the_rules_under_the_policys_place_in_each_chain(self) -> None:
        """gate.describe() shows, per tool, the policy's link with the rules that apply to that tool."""
        gate, _, _ = desk(Policy.from_text(SUPPORT))
        agent = next(s for s in gate.describe() if s["scope"] == "agent")
        refund = next(t for t in agent["tools"] if t["tool"] == "refund")
        link = refund["chain"][0]
        assert link["interceptor"] == "support-desk"
        assert link["mandatory"] is True
        assert [r["id"] for r in link["policy"]["rules"]] == ["tenant-orders", "big-refunds"]


class TestReload:
    """A reload swaps the version whole, refuses a bad file and announces the new chains."""

    def write(self, path: Path, limit: int) -> None:
        path.write_text(
            policy_text(
                f"- id: cap\n  tools: [refund]\n  when: 'args.amount_cents > {limit}'\n"
                "  decision: deny\n  message: cap\n"
            )
        )

    async def test_a_reload_changes_the_decision_and_announces_the_new_version(self, tmp_path: Path) -> None:
        """After reload() the new limit decides, and a new ToolsRegistered names the new version."""
        path = tmp_path / "p.yaml"
        self.write(path, 100)
        policy = load_policy(path)
        sink = MemorySink()
        _, scope, _ = desk(policy, sinks=[sink])
        old = policy.version
        assert (await scope.call("refund", {"order_id": "A", "amount_cents": 500}, run=ACME)).kind == "denied"
        self.write(path, 1000)
        assert policy.reload() is True
        assert policy.version != old
        assert (await scope.call("refund", {"order_id": "A", "amount_cents": 500}, run=ACME)).kind == "ok"
        versions = [t.policies["p"] for e in sink.events if e.type == "ToolsRegistered" for t in e.tools]
        assert old in versions
        assert policy.version in versions
        assert policy.reload() is False

    def test_a_file_that_fails_its_checks_is_refused_and_the_old_policy_stays(self, tmp_path: Path) -> None:
        """A broken edit raises PolicyError on reload; the version in force is unchanged."""
        path = tmp_path / "p.yaml"
        self.write(path, 100)
        policy = load_policy(path)
        old = policy.version
        path.write_text("version: 1\nname: p\nrules:\n  - id: x\n    decision: nope\n")
        with pytest.raises(PolicyError, match="decision must be one of"):
            policy.reload()
        assert policy.version == old

    def test_a_reload_that_no_longer_fits_a_served_tool_is_refused(self, tmp_path: Path) -> None:
        """A new rule rewriting a field a registered tool lacks is refused on reload."""
        path = tmp_path / "p.yaml"
        self.write(path, 100)
        policy = load_policy(path)
        desk(policy)
        path.write_text(policy_text("- id: fix\n  tools: [refund]\n  decision: rewrite\n  set: {nope: '1'}\n"))
        with pytest.raises(PolicyError, match="set 'nope'"):
            policy.reload()

    def test_a_reload_cannot_change_the_name(self, tmp_path: Path) -> None:
        """The chains were built with the name: a renamed file is refused until restart."""
        path = tmp_path / "p.yaml"
        self.write(path, 100)
        policy = load_policy(path)
        path.write_text("version: 1\nname: other\nrules: []\n")
        with pytest.raises(PolicyError, match="cannot change name"):
            policy.reload()

    def test_watch_reloads_when_the_file_changes(self, tmp_path: Path) -> None:
        """load_policy(watch=True) picks an edit up by itself (polled with a deadline)."""
        import time

        path = tmp_path / "p.yaml"
        self.write(path, 100)
        policy = load_policy(path, watch=True, watch_interval_s=0.05)
        try:
            old = policy.version
            self.write(path, 12345)
            deadline = time.monotonic() + 10
            while policy.version == old and time.monotonic() < deadline:
                time.sleep(0.02)  # sleep-ok: a poll interval inside the deadline loop
            assert policy.version == hashlib.sha256(path.read_bytes()).hexdigest()
        finally:
            policy.close()


class TestDefinitions:
    """AgentScope.definitions(run) leaves out what a mandatory policy refuses whatever the arguments."""

    def test_a_tool_denied_outright_for_the_run_is_not_shown(self) -> None:
        """refund is hidden from tenant globex by an argument-free deny; others still see it."""
        text = (
            "version: 1\nname: p\nmandatory: true\nrules:\n"
            "  - id: no-refunds-for-globex\n    tools: [refund]\n    when: \"run.tenant == 'globex'\"\n"
            "    decision: deny\n    message: no\n"
            "  - id: arg-rule\n    tools: [get_order]\n    when: \"args.order_id == 'X'\"\n    decision: block\n"
        )
        _, scope, _ = desk(Policy.from_text(text))
        names = lambda run: [d["name"] for d in scope.definitions(run)]  # noqa: E731
        assert names(RunContext(tenant="globex")) == ["get_order", "fx_rate"]
        assert names(ACME) == ["get_order", "refund", "fx_rate"]

    def test_a_policy_that_is_not_mandatory_hides_nothing(self) -> None:
        """Hiding is only for mandatory policies (an inner scope could exclude the others)."""
        text = "version: 1\nname: p\nrules:\n  - id: never\n    tools: [refund]\n    decision: deny\n"
        _, scope, _ = desk(Policy.from_text(text))
        assert len(scope.definitions(ACME)) == 3

    async def test_a_hidden_tool_is_still_mediated(self) -> None:
        """Calling a hidden tool by name is refused by the gate, not run."""
        text = "version: 1\nname: p\nmandatory: true\nrules:\n  - id: never\n    tools: [refund]\n    decision: deny\n"
        _, scope, ran = desk(Policy.from_text(text))
        assert [d["name"] for d in scope.definitions(ACME)] == ["get_order", "fx_rate"]
        result = await scope.call("refund", {"order_id": "ACME-1", "amount_cents": 1}, run=ACME)
        assert result.kind == "denied"
        assert ran == []


class TestCountCalls:
    """count_calls in a condition: rate limits and quotas as policy."""

    async def test_the_fourth_refund_in_an_hour_is_denied_per_tenant(self) -> None:
        """Three refunds per tenant per hour pass, the fourth is denied; another tenant is not affected."""
        now = [1_000_000.0]
        text = policy_text(
            "- id: refund-rate\n  tools: ['refund*']\n"
            "  when: \"count_calls('refund*', 'tenant', duration('1h')) > 3\"\n"
            "  decision: deny\n  message: too many refunds\n"
        )
        policy = Policy.from_text(text, clock=lambda: now[0], counter=InProcessCounter(clock=lambda: now[0]))
        _, scope, _ = desk(policy)
        kinds = []
        for _ in range(4):
            kinds.append((await scope.call("refund", {"order_id": "ACME-1", "amount_cents": 1}, run=ACME)).kind)
        assert kinds == ["ok", "ok", "ok", "denied"]
        other = await scope.call("refund", {"order_id": "GLOBEX-1", "amount_cents": 1}, run=RunContext(tenant="globex"))
        assert other.kind == "ok"
        now[0] += 3601
        assert (await scope.call("refund", {"order_id": "ACME-1", "amount_cents": 1}, run=ACME)).kind == "ok"


class TestAgentLoop:
    """The agent loop shows the model only the tools `definitions(run)` lists."""

    async def test_the_model_is_not_shown_a_tool_the_policy_refuses_outright(self) -> None:
        """A trial tenant's model sees no refund tool; a paying tenant's does."""
        from interceptor_core import Agent, ModelTurn, ScriptedModel

        text = (
            "version: 1\nname: p\nmandatory: true\nrules:\n"
            "  - id: no-refunds-on-trial\n    tools: [refund]\n"
            "    when: \"run.tenant == 'trial'\"\n    decision: deny\n"
        )
        _, scope, _ = desk(Policy.from_text(text))
        for tenant, expected in (("trial", ["get_order", "fx_rate"]), ("acme", ["get_order", "refund", "fx_rate"])):
            model = ScriptedModel([ModelTurn(text="done")])
            await Agent(scope, model).run("hello", run=RunContext(tenant=tenant))
            assert [t["name"] for t in model.calls[0][1]] == expected


RATE_POLICY = """\
version: 1
name: rate
rules:
  - id: hourly-refunds
    tools: ["refund*"]
    when: "count_calls('refund*', 'tenant', duration('1h')) > 3"
    decision: deny
    message: "At most 3 refunds an hour."
"""


class TestCountCallsWithRedis:
    """count_calls on a RedisCounter: several gate processes share one limit."""

    async def test_two_gates_share_the_limit(self, redis_url: str) -> None:
        """Two gates with a policy each over one Redis: the fourth refund is denied wherever it is made."""
        from interceptor_core.builtins import RedisCounter

        prefix = f"test:{uuid.uuid4().hex}:"
        scopes = [desk(Policy.from_text(RATE_POLICY, counter=RedisCounter(redis_url, prefix=prefix)))[1] for _ in "ab"]
        kinds = [
            (await scopes[i % 2].call("refund", {"order_id": "ACME-1", "amount_cents": 1}, run=ACME)).kind
            for i in range(4)
        ]
        assert kinds == ["ok", "ok", "ok", "denied"]

    async def test_calls_of_another_process_count(self, redis_url: str, tmp_path: Path) -> None:
        """Three refunds decided by a policy in a second process use up this process's limit."""
        prefix = f"test:{uuid.uuid4().hex}:"
        (tmp_path / "rate.yaml").write_text(RATE_POLICY)
        script = (
            "import sys\n"
            "from interceptor_core import RunContext\n"
            "from interceptor_core.builtins import RedisCounter\n"
            "from interceptor_core.policy import load_policy\n"
            "policy = load_policy(sys.argv[1], counter=RedisCounter(sys.argv[2], prefix=sys.argv[3]))\n"
            "run = RunContext(tenant='acme')\n"
            "for n in range(3):\n"
            "    print(policy.evaluate('refund', {}, run, call_id=f'other-{n}').decision.kind)\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", script, str(tmp_path / "rate.yaml"), redis_url, prefix],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["allow", "allow", "allow"]
        from interceptor_core.builtins import RedisCounter

        _, scope, ran = desk(Policy.from_text(RATE_POLICY, counter=RedisCounter(redis_url, prefix=prefix)))
        result = await scope.call("refund", {"order_id": "ACME-1", "amount_cents": 1}, run=ACME)
        assert result.kind == "denied"
        assert ran == []

    async def test_a_redis_that_is_down_fails_the_call_closed(self, closed_redis_url: str) -> None:
        """No counter, no decision: the call is denied and the tool does not run."""
        from interceptor_core.builtins import RedisCounter

        policy = Policy.from_text(RATE_POLICY, counter=RedisCounter(closed_redis_url, prefix="down:"))
        _, scope, ran = desk(policy)
        result = await scope.call("refund", {"order_id": "ACME-1", "amount_cents": 1}, run=ACME)
        assert result.kind == "denied"
        assert ran == []
        assert "ConnectionError" in (result.decisions[0].error or "")


class TestSqlSafeFunctions:
    """`sql_writes(query, dialect, [names])`: functions a policy names as free of effects."""

    def test_a_named_function_reads_and_an_unknown_one_writes(self) -> None:
        """`my_total` is named safe by the policy; `other_fn` is unknown, so it counts as writing."""
        policy = Policy.from_text(
            policy_text(
                """
                - id: read-only
                  tools: [run_sql]
                  when: "sql_writes(args.query, 'postgres', ['reports.my_total'])"
                  decision: deny
                """
            )
        )
        assert policy.evaluate("run_sql", {"query": "SELECT reports.my_total(3)"}, ACME).decision.kind == "allow"
        assert policy.evaluate("run_sql", {"query": "SELECT other_fn(3)"}, ACME).decision.kind == "deny"

    def test_a_name_that_is_not_a_function_name_is_refused_at_load(self) -> None:
        """A malformed name in the list is a PolicyError naming it."""
        with pytest.raises(PolicyError, match="'bad name!' is not a function name"):
            Policy.from_text(
                policy_text(
                    """
                    - id: read-only
                      when: "sql_writes(args.query, 'postgres', ['bad name!'])"
                      decision: deny
                    """
                )
            )
