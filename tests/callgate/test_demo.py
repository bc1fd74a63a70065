"""The demo: the workload's decisions in-process, and `callgate demo` end to end with real processes."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from callgate.pipeline_demo import WORKLOAD_TYPES
from callgate.workload import TENANTS, TEST_CARD, WEIGHTS, WorkloadStats, build_support_desk, run_workload
from consumers import AuditStore
from events import MemorySink

CLI = [sys.executable, "-c", "from callgate.cli import main; main()"]


def run_briefly(*, inject_bypass: bool = False) -> tuple[MemorySink, object, WorkloadStats]:
    sink = MemorySink()
    wired = build_support_desk([sink], reviewer_delay_s=(0.0, 0.01))
    stats = WorkloadStats()
    # One full first round (every scenario for every tenant), as fast as the desk answers.
    rounds = len(TENANTS) * len(WEIGHTS)

    async def go() -> None:
        stop = asyncio.Event()

        async def stop_after_first_round() -> None:
            while stats.runs < rounds:
                await asyncio.sleep(0)
            stop.set()

        await asyncio.gather(
            run_workload(wired, rate=10_000, duration_s=None, stop=stop, stats=stats, inject_bypass=inject_bypass),
            stop_after_first_round(),
        )

    asyncio.run(go())
    return sink, wired, stats


class TestWorkload:
    """The support desk's conversations through the gate, without Kafka."""

    def test_every_decision_type_appears_in_the_first_round(self) -> None:
        """One round over every scenario and tenant leaves every event type but Unmediated, and the
        denials the demo is about: cross-tenant, approval refused, validation, unknown tool, host."""
        sink, wired, stats = run_briefly()
        types = Counter(e.type for e in sink.events)
        assert set(types) == set(WORKLOAD_TYPES)
        causes = {e.cause for e in sink.events if e.type == "ToolDenied"}
        assert {"deny", "approval_refused", "validation", "unknown_tool"} <= causes
        deciders = {e.decided_by for e in sink.events if e.type in ("ToolDenied", "Blocked")}
        assert {"desk-policy", "approval"} <= deciders
        # The policy file's rules decided them: its trail steps name the rule and the file's version.
        rules = {
            rule.id
            for e in sink.events
            if e.type in ("ToolDenied", "Blocked")
            for step in e.decisions
            if step.policy_version is not None
            for rule in step.rules
        }
        assert {"tenant-orders", "docs-hosts", "sql-writes"} <= rules
        assert stats.blocked_runs == stats.by_scenario["sql-destructive"] >= len(TENANTS)
        assert wired.gate.coverage().ok

    def test_the_shadow_rule_records_divergences_and_changes_nothing(self) -> None:
        """The desk's stricter-refunds shadow rule marks refunds between 100.00 and 200.00 divergent
        (they would ask a human) while they are still paid without one."""
        sink, _, _ = run_briefly()
        shadowed = [e for e in sink.events if getattr(e, "shadow_rule", None) == "stricter-refunds"]
        assert shadowed
        for event in shadowed:
            assert event.tool == "refund"
            assert event.shadow_outcome == "approval"
            assert int(event.args["amount_cents"]) > 10_000
        paid_without_review = [e for e in shadowed if e.type == "ToolUse" and e.divergent]
        assert paid_without_review
        assert all(int(e.args["amount_cents"]) <= 20_000 for e in paid_without_review)

    def test_injected_refunds_never_pay_another_tenant(self) -> None:
        """The poisoned page's instruction is quarantined before the next turn, and the refund the
        model still tries for another tenant's order is denied: every paid refund is the tenant's own."""
        sink, wired, _ = run_briefly()
        assert any(e.type == "TurnDecision" and e.decision == "rewrite" for e in sink.events)
        refunds = [e for e in sink.events if e.type == "ToolUse" and e.tool == "refund"]
        assert len(refunds) == len(wired.payments.refunds) > 0
        for event in refunds:
            assert str(event.args["order_id"]).startswith(str(event.tenant).upper() + "-")
        denied = [e for e in sink.events if e.type == "ToolDenied" and e.tool == "refund" and e.cause == "deny"]
        assert len(denied) >= len(TENANTS)  # the injected refund, once per tenant at least

    def test_cards_and_addresses_are_redacted(self) -> None:
        """send_email's recipient and the card number in its body never leave the gate."""
        sink, _, _ = run_briefly()
        emails = [e for e in sink.events if e.type == "ToolUse" and e.tool == "send_email"]
        assert emails
        for event in emails:
            assert TEST_CARD not in str(event.args)
            assert "@" not in str(event.args)
            assert set(event.redacted_paths) == {"/to", "/body"}

    def test_inject_bypass_leaves_one_unmediated_event(self) -> None:
        """--inject-bypass uses the payments client once around the gate: one Unmediated event."""
        sink, wired, stats = run_briefly(inject_bypass=True)
        assert stats.bypasses == 1
        assert [e.resource for e in sink.events if e.type == "Unmediated"] == ["payments"]
        assert not wired.gate.coverage().ok


@pytest.mark.integration
class TestCommand:
    """`callgate demo` with real processes: broker, materializer, workload, coverage."""

    def test_demo_finishes_with_every_type_stored_and_coverage_green(self, tmp_path: Path) -> None:
        """`callgate demo --duration 5 --no-dashboard` exits 0 on its own; its store holds every event
        type of the workload (its first round plays every scenario for every tenant, about 150 calls,
        under a second at 200 a second) and `callgate coverage --require-exercised` on it is green."""
        db = tmp_path / "demo.duckdb"
        done = subprocess.run(
            [*CLI, "demo", "--duration", "5", "--rate", "200", "--no-dashboard", "--db", str(db)],
            capture_output=True, text=True, timeout=240, cwd=tmp_path, env={"COLUMNS": "400", "PATH": "/usr/bin:/bin"},
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"the audit store stays at {db}" in done.stdout
        with AuditStore(db, read_only=True) as store:
            counts = store.counts()
        assert set(counts.events) == set(WORKLOAD_TYPES)
        assert counts.chain_breaks == {}
        check = subprocess.run(
            [*CLI, "coverage", "--db", str(db), "--require-exercised"], capture_output=True, text=True, timeout=120
        )
        assert check.returncode == 0, check.stdout + check.stderr

    def test_inject_bypass_turns_coverage_red(self, tmp_path: Path) -> None:
        """With --inject-bypass the demo's own coverage check fails (exit 1) on the unmediated use; a
        next run on the same store is green."""
        db = tmp_path / "demo.duckdb"
        done = subprocess.run(
            [*CLI, "demo", "--duration", "3", "--no-dashboard", "--inject-bypass", "--db", str(db)],
            capture_output=True, text=True, timeout=240, cwd=tmp_path, env={"COLUMNS": "400", "PATH": "/usr/bin:/bin"},
        )  # fmt: skip
        assert done.returncode == 1, done.stdout + done.stderr
        assert "guarded clients outside the gate (payments)" in done.stdout
        # A later run on the same store is judged on its own events, not on the bypass before it.
        again = subprocess.run(
            [*CLI, "demo", "--duration", "3", "--no-dashboard", "--db", str(db)],
            capture_output=True, text=True, timeout=240, cwd=tmp_path, env={"COLUMNS": "400", "PATH": "/usr/bin:/bin"},
        )  # fmt: skip
        assert again.returncode == 0, again.stdout + again.stderr
