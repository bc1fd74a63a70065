"""Every page through Streamlit's AppTest against the seeded store: the numbers shown are the store's,
hostile event text is never markup, and an empty or unreachable store is a message, not a traceback."""

from __future__ import annotations

import csv
import io
import json
import uuid
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from streamlit.testing.v1 import AppTest

from callgate.broker import free_port
from consumers.api import ApiServer, HealthStatus, build_app
from consumers.metrics import MaterializerMetrics
from consumers.queries import UnknownQueryError
from consumers.reader import FileReader
from consumers.runner import StoreQueryRunner
from consumers.store import AuditStore
from dashboard.data import BlockedFilters, blocked_csv

APP = str(Path(__file__).resolve().parents[2] / "dashboard" / "app.py")


def open_app(source: dict[str, str], monkeypatch: pytest.MonkeyPatch, page: str | None = None, **state: Any) -> AppTest:
    """The app reading `source` (CALLGATE_DB or CALLGATE_API), run once, then on `page` if given."""
    for name in (
        "CALLGATE_API",
        "CALLGATE_DB",
        "CALLGATE_TRUSTED_KEYS",
        "CALLGATE_REQUIRE_SIGNED",
        "CALLGATE_TIMEZONE",
    ):
        monkeypatch.delenv(name, raising=False)
    for name, value in source.items():
        monkeypatch.setenv(name, value)
    at = AppTest.from_file(APP, default_timeout=60)
    for key, value in state.items():
        at.session_state[key] = value
    at.run()
    if page is not None:
        at.switch_page(f"views/{page}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def shown_text(at: AppTest) -> str:
    """Everything rendered as markup (markdown, captions, alerts, titles, metric labels)."""
    parts = [e.value for e in (*at.markdown, *at.caption, *at.title, *at.subheader, *at.error, *at.info)]
    parts += [e.value for e in (*at.warning, *at.success)]
    parts += [m.label for m in at.metric]
    return "\n".join(str(p) for p in parts)


def all_text(at: AppTest) -> str:
    """Everything rendered as plain text, code, JSON or table cells."""
    parts = [e.value for e in (*at.text, *at.code, *at.json)]
    parts += [df.value.to_csv() for df in at.dataframe]
    return "\n".join(str(p) for p in parts)


@pytest.fixture
def store_env(seeded_store: Any) -> dict[str, str]:
    return {"CALLGATE_DB": str(seeded_store.path)}


@pytest.fixture(autouse=True)
def _no_stale_readers() -> Iterator[None]:
    """The app keeps one read-only FileReader per file for its life; close them after each test so
    the store files are free again."""
    yield
    from dashboard import ui

    ui._file_reader.clear()


class TestOverview:
    def test_metrics_equal_the_store_and_compare_with_the_hour_before(
        self, seeded_store: Any, store_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """For the last hour each metric is the store's count, and the delta subtracts the hour before."""
        at = open_app(store_env, monkeypatch, window="Last hour")
        shown = {m.label: m for m in at.metric}

        def count(*types: str, outcome: str | None = None) -> int:
            return int(
                seeded_store.scalar(
                    "select count(*) from events where list_contains(?, type) and (? is null or outcome = ?) "
                    "and time >= now() - interval 1 hour",
                    list(types),
                    outcome,
                    outcome,
                )
            )

        expected = {
            "Calls": count("ToolUse", "ToolDenied", "Substitute", "Blocked"),
            "Allowed": count("ToolUse"),
            "Denied": count("ToolDenied"),
            "Substituted": count("Substitute"),
            "Blocked": count("Blocked"),
            "Approvals asked": count("ApprovalRequested"),
            "Approvals refused": count("ApprovalResolved", outcome="refused"),
            "Unmediated accesses": count("Unmediated"),
            "Chain breaks": int(seeded_store.scalar("select count(*) from chain_breaks")),
        }
        assert {label: int(m.value.replace(",", "")) for label, m in shown.items()} == expected
        # The seed's known counts: 4 + 1 refused denials now, 3 denials in the hour before.
        assert (expected["Denied"], expected["Blocked"], expected["Unmediated accesses"]) == (5, 2, 1)
        assert int(shown["Denied"].delta) == 5 - seeded_store.old_denials
        assert int(shown["Blocked"].delta) == 2

    def test_top_denied_lists_count_per_tool_tenant_principal_interceptor(
        self, seeded_store: Any, store_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The four top-denied tables hold the store's counts of denied and blocked calls."""
        at = open_app(store_env, monkeypatch, window="Last 24 hours")
        tables = [df.value for df in at.dataframe]
        by_key = [dict(zip(t["key"], t["denied"] + t["blocked"], strict=True)) for t in tables]
        tools, tenants, principals, interceptors = by_key
        count = seeded_store.scalar
        assert tools["get_order"] == count("select count(*) from blocked_attempts where tool = 'get_order'") == 7
        assert (tools["run_sql"], tools["refund"]) == (2, 1)
        assert tenants == {"acme": 8, "globex": 2}
        assert principals["u-9"] == seeded_store.old_denials
        assert interceptors["tenant-orders"] == 7
        assert interceptors["policy"] == 2

    def test_decisions_chart_is_drawn(self, store_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
        """The stacked decisions-over-time chart is on the page."""
        at = open_app(store_env, monkeypatch)
        assert at.get("vega_lite_chart")


class TestBlockedAttempts:
    def test_count_and_rows_equal_the_store(
        self, seeded_store: Any, store_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The count metrics and the table hold every denied and blocked call, newest first."""
        at = open_app(store_env, monkeypatch, "blocked")
        total = seeded_store.scalar("select count(*) from blocked_attempts")
        assert metrics(at)["Matching attempts"] == f"{total:,}"
        assert metrics(at)["Blocked"] == "2"
        (table,) = [df.value for df in at.dataframe]
        assert len(table) == total
        assert list(table["time"]) == sorted(table["time"], reverse=True)

    def test_blank_text_cells_are_blank(
        self, seeded_store: Any, store_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A text column's missing values (a call made outside a run has no run id) are empty cells, not "None"."""
        assert seeded_store.scalar("select count(*) from blocked_attempts where call_id = 'c-old-0' and run_id is null")
        at = open_app(store_env, monkeypatch, "call", call_id="c-old-0")
        events = at.dataframe[-1].value
        assert set(events["run_id"]) == {""}
        assert not any(
            value is None for table in at.dataframe for column in table.value for value in table.value[column]
        )

    def test_filters_narrow_through_query_parameters(
        self, store_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Tenant, decision type and reason text filter the table; SQL typed into a filter is only text."""
        at = open_app(store_env, monkeypatch, "blocked")
        at.text_input(key="f_tenant").input("globex").run()
        assert metrics(at)["Matching attempts"] == "2"
        at.text_input(key="f_tenant").input("").run()
        at.selectbox(key="f_type").set_value("ToolDenied").run()
        at.text_input(key="f_text").input("DOES NOT BELONG").run()
        assert metrics(at)["Matching attempts"] == "7"
        at.text_input(key="f_text").input("' OR 1=1 --").run()
        assert metrics(at)["Matching attempts"] == "0"
        assert not at.exception

    def test_a_bad_time_is_named(self, store_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
        """A From time that is not ISO 8601 is refused with a message naming the parameter."""
        at = open_app(store_env, monkeypatch, "blocked")
        at.text_input(key="f_since").input("yesterday").run()
        assert not at.exception
        assert "A filter was not accepted." in [e.value for e in at.error]
        assert any("'since'" in t.value for t in at.text)

    def test_pages_server_side(self, store_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
        """With 50 rows a page the table holds one page; the CSV of the filter holds every row, with
        formula-like cells defused."""
        at = open_app(store_env, monkeypatch, "blocked")
        at.selectbox(key="page_size").set_value(50).run()
        assert len(at.dataframe[0].value) == 10
        with FileReader(store_env["CALLGATE_DB"]) as reader:
            text = blocked_csv(lambda name, params: reader.query(name, params).rows, BlockedFilters())
        rows = list(csv.DictReader(io.StringIO(text)))
        assert len(rows) == 10
        assert {r["type"] for r in rows} == {"ToolDenied", "Blocked"}

    def test_opening_a_call_goes_to_its_detail(
        self, store_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Picking a call of the page and opening it shows that call's detail."""
        at = open_app(store_env, monkeypatch, "blocked")
        at.selectbox(key="blocked_call").set_value("c-blocked-0").run()
        at.button[0].click().run()
        assert at.text_input(key="call_id").value == "c-blocked-0"
        assert "DROP statements are never allowed" in all_text(at)


class TestCallDetail:
    def test_trail_args_redaction_and_trace(self, store_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
        """An approved refund shows its trail in order, its args, and its outcome."""
        at = open_app(store_env, monkeypatch, "call", call_id="c-approved")
        trail = at.dataframe[1].value
        assert list(trail["interceptor"])[:2] == ["tenant-orders", "policy"]
        assert "approval" in list(trail["interceptor"])
        assert at.json[0].value.replace(" ", "").replace("\n", "") == '{"order_id":"ACME-1","amount_cents":500}'
        outcome = at.dataframe[0].value
        assert (outcome["type"][0], outcome["outcome"][0]) == ("ToolUse", "ok")

    def test_unknown_call(self, store_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
        """A call id no event has says so."""
        at = open_app(store_env, monkeypatch, "call", call_id="c-nope")
        assert [w.value for w in at.warning] == ["No stored event has this call id."]

    def test_hostile_text_is_shown_as_text_only(
        self, seeded_store: Any, store_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A denial quoting injected HTML and markdown shows it verbatim as text, never as markup or a link."""
        at = open_app(store_env, monkeypatch, "call", call_id="c-deny-3")
        assert "<img src=https://evil.example/x.png onerror=alert(1)>" in all_text(at)
        assert not any(marker in shown_text(at) for marker in seeded_store.hostile_markers)
        assert not at.get("link_button")  # the gate gave this call no trace id

    def test_trace_link_only_for_a_well_formed_trace_id(
        self, seeded_store: Any, store_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A hex trace id links to the configured trace viewer; a trace id shaped as a script link is text only."""
        monkeypatch.setenv("CALLGATE_TRACE_URL", "https://traces.example/trace/{trace_id}?from=callgate")
        at = open_app(store_env, monkeypatch, "call", call_id="c-old-0")
        (link,) = at.get("link_button")
        assert link.proto.url == f"https://traces.example/trace/{seeded_store.trace_ids[0]}?from=callgate"
        hostile = open_app(store_env, monkeypatch, "call", call_id="c-old-1")
        assert not hostile.get("link_button")
        assert seeded_store.trace_ids[1] in all_text(hostile)


class TestRun:
    @pytest.fixture
    def runs_env(self, run_store: Any) -> dict[str, str]:
        return {"CALLGATE_DB": str(run_store.path)}

    def test_the_story_in_order_with_nested_agents_indented(
        self, runs_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A run's story lists its turns and calls in order, the research and helper agents' turns and
        calls indented under the call that ran them, the approval with who decided, and the block last."""
        at = open_app(runs_env, monkeypatch, "run", run_id="run-desk")
        (story,) = [c.value for c in at.code if "ask_research" in c.value]
        lines = story.splitlines()
        assert lines[0] == "turn 1 (1 message): allow"
        assert "approval: approved [by lead]" in [line.strip() for line in lines]
        at_research = lines.index("ask_research: allowed (ok)")
        assert lines[at_research + 1].startswith("    turn 1")
        assert lines[at_research + 2] == "    get_order: allowed (ok)"
        at_delegate = lines.index("delegate: allowed (ok)")
        assert lines[at_delegate + 2] == "    get_order: denied (deny) [desk-rules]"
        assert lines[-1] == "run_sql: blocked (block) [desk-rules]"
        assert any("a call was blocked" in e.value for e in at.error)
        assert metrics(at) == {
            "Turns": "9",
            "Calls": "7",
            "Approvals": "1",
            "Nested runs": "1",
            "Events": metrics(at)["Events"],
        }
        assert "run-helper" in all_text(at)

    def test_events_equal_the_store(
        self, run_store: Any, runs_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The Events figure is the store's count of the run's events and its nested run's."""
        at = open_app(runs_env, monkeypatch, "run", run_id="run-desk")
        expected = run_store.scalar("select count(*) from events where run_id in ('run-desk', 'run-helper')")
        assert metrics(at)["Events"] == str(expected)

    def test_search_by_principal_and_open(self, runs_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
        """The search lists every run of the window; a principal narrows it to that principal's runs."""
        at = open_app(runs_env, monkeypatch, "run")
        (table,) = [df.value for df in at.dataframe]
        assert set(table["run_id"]) == {"run-desk", "run-helper", "run-globex"}
        at.text_input(key="r_principal").input("u-2").run()
        (table,) = [df.value for df in at.dataframe]
        assert list(table["run_id"]) == ["run-globex"]
        assert list(table["outcome"]) == ["had denials"]  # words, not the query's code

    def test_reached_from_a_call(
        self, run_store: Any, runs_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The Call detail page's "Open its run" opens the run the call was made in."""
        call_id = next(e.call_id for e in run_store.events if getattr(e, "tool", None) == "run_sql")
        at = open_app(runs_env, monkeypatch, "call", call_id=call_id)
        next(b for b in at.button if b.label == "Open its run").click().run()
        assert at.text_input(key="run_id").value == "run-desk"
        assert any("a call was blocked" in e.value for e in at.error)

    def test_a_blocked_attempt_opens_its_run(self, runs_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
        """A blocked attempt picked on its page opens its run."""
        at = open_app(runs_env, monkeypatch, "blocked")
        (table,) = [df.value for df in at.dataframe]
        call_id = table[table["tool"] == "run_sql"]["call_id"].iloc[0]
        at.selectbox(key="blocked_call").set_value(call_id).run()
        next(b for b in at.button if b.label == "Open its run").click().run()
        assert at.text_input(key="run_id").value == "run-desk"

    def test_unknown_run(self, runs_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
        """A run id nothing carries says so."""
        at = open_app(runs_env, monkeypatch, "run", run_id="run-nope")
        assert any("No stored event has this run id" in w.value for w in at.warning)


class TestTrends:
    def test_rates_and_new_reasons(self, store_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
        """Per-tool totals are the store's calls and denials; the hostile reason is listed as text."""
        at = open_app(store_env, monkeypatch, "trends", window="Last 24 hours")
        tools = at.dataframe[0].value
        per_tool = {k: (c, d) for k, c, d in zip(tools["key"], tools["calls"], tools["denied"], strict=True)}
        assert per_tool["get_order"] == (12, 7)
        assert per_tool["run_sql"] == (2, 2)
        interceptors = dict(zip(at.dataframe[1].value["key"], at.dataframe[1].value["denied"], strict=True))
        assert interceptors == {"tenant-orders": 7, "policy": 2, "approval": 1}
        reasons = at.dataframe[3].value
        assert "DROP statements are never allowed" in set(reasons["reason"])
        assert "evil.example" not in shown_text(at)

    def test_every_interceptor_shares_one_denominator(
        self, store_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Each interceptor's share is of all calls of the range: the same calls for each, the tools' sum."""
        at = open_app(store_env, monkeypatch, "trends", window="Last 24 hours")
        all_calls = int(at.dataframe[0].value["calls"].sum())
        interceptors = at.dataframe[1].value
        assert list(interceptors.columns) == ["key", "denied", "all calls", "share of all calls"]
        assert set(interceptors["all calls"]) == {all_calls}
        for denied, share in zip(interceptors["denied"], interceptors["share of all calls"], strict=True):
            assert share == round(denied / all_calls, 4)

    def test_a_series_per_tenant_and_per_rule(
        self, store_env: dict[str, str], seeded_store: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Per tenant: each tenant's calls and denials equal the store's; per rule: the denying rules."""
        at = open_app(store_env, monkeypatch, "trends", window="Last 24 hours")
        assert at.selectbox(key="trends_by").value == "Tenant"
        tenants = at.dataframe[2].value
        shown = {
            k: (int(c), int(d)) for k, c, d in zip(tenants["key"], tenants["calls"], tenants["denied"], strict=True)
        }
        since = datetime.now(UTC) - timedelta(hours=24)
        for tenant, (_, denied) in shown.items():
            sql = "select count(*) from blocked_attempts where tenant = ? and time >= ?"
            assert denied == seeded_store.scalar(sql, tenant, since), tenant
        assert sum(d for _, d in shown.values()) == int(at.dataframe[0].value["denied"].sum())
        assert sum(c for c, _ in shown.values()) == int(at.dataframe[0].value["calls"].sum())
        at.selectbox(key="trends_by").select("Policy rule").run()
        assert not at.exception, [e.value for e in at.exception]
        assert at.subheader[2].value == "Denial rate per policy rule"

    def test_the_rule_series_names_the_denying_rule(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """Per policy rule: a denial counts for the matched rule that denied, not one that allowed."""
        from consumers.store import RawRecord
        from events import Producer, ToolDeniedEvent, encode_event

        steps = [
            {
                "interceptor": "policy",
                "scope": "application",
                "kind": "deny",
                "duration_ms": 0.1,
                "rules": [{"id": "reads-ok", "decision": "allow"}, {"id": "no-drops", "decision": "deny"}],
            },
        ]
        denied = [
            Producer().seal(
                ToolDeniedEvent,
                {
                    "event_id": uuid.uuid4().hex,
                    "time": datetime.now(UTC),
                    "gate": "shop",
                    "workflow": "support",
                    "agent": "desk",
                    "tool": "run_sql",
                    "call_id": f"c-{n}",
                    "tenant": "acme",
                    "principal": "u-1",
                    "args": {},
                    "decisions": steps,
                    "message": "no",
                    "decided_by": "policy",
                    "cause": "deny",
                },
            )
            for n in range(3)
        ]
        path = tmp_path / "rules.duckdb"
        with AuditStore(path) as store:
            batch = [
                RawRecord("callgate.audit", 0, i, e.producer_id.encode(), encode_event(e)) for i, e in enumerate(denied)
            ]
            store.ingest(batch, {("callgate.audit", 0): len(denied)})
        at = open_app({"CALLGATE_DB": str(path)}, monkeypatch, "trends", window="Last 24 hours")
        at.selectbox(key="trends_by").select("Policy rule").run()
        assert not at.exception, [e.value for e in at.exception]
        rules = at.dataframe[2].value
        assert dict(zip(rules["key"], rules["denied"], strict=True)) == {"no-drops": 3}

    def test_a_custom_range(self, store_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
        """A custom range before any event shows no calls; a start after the end is refused by name."""
        at = open_app(store_env, monkeypatch, "trends", window="Last 24 hours")
        at.radio(key="trends_range").set_value("Custom range").run()
        at.date_input(key="trends_start_day").set_value(date(2020, 1, 1))
        at.date_input(key="trends_end_day").set_value(date(2020, 1, 2)).run()
        assert not at.exception, [e.value for e in at.exception]
        assert "2020-01-01" in shown_text(at)
        assert "No calls in this window." in shown_text(at)
        at.date_input(key="trends_start_day").set_value(date(2020, 1, 3)).run()
        assert "The range's start must come before its end." in shown_text(at)


class TestCoverage:
    def test_checks_show_red_where_the_store_breaks_them(
        self, store_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The seed has an unmediated use and a broken chain: those checks are red, the exercised check green."""
        at = open_app(store_env, monkeypatch, "coverage")
        errors = [e.value for e in at.error]
        assert "FAIL: unmediated" in errors
        assert "FAIL: chains" in errors
        assert "PASS: exercised" in [s.value for s in at.success]
        assert errors[0].endswith("coverage checks fail.")


class TestSignedCoverage:
    def test_the_signed_check_fails_for_the_unsigned_producer(
        self, signed_store: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A store where one gate signs lists the signed check, red, with the unsigned gate's break kind
        and detail in its violations; a store nobody signs does not list it."""
        at = open_app({"CALLGATE_DB": str(signed_store.path)}, monkeypatch, "coverage")
        assert "FAIL: signed" in [e.value for e in at.error]
        assert any("producers in this window sign checkpoints" in c.value for c in at.caption)
        (violations,) = [df.value for df in at.dataframe if "reasons" in df.value.columns]
        assert list(violations["producer_id"]) == [signed_store.unsigned_producer]
        assert list(violations["reasons"]) == ["unsigned"]
        assert violations["detail"][0].startswith("unsigned: producer")

    def test_a_store_nobody_signs_lists_it_only_when_required(
        self, store_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Without signing in the store the check is left out, and listed (red) with CALLGATE_REQUIRE_SIGNED."""
        at = open_app(store_env, monkeypatch, "coverage")
        assert not [e for e in (*at.error, *at.success) if e.value.endswith(": signed")]
        assert any("--require-signed" in c.value for c in at.caption)
        at = open_app({**store_env, "CALLGATE_REQUIRE_SIGNED": "1"}, monkeypatch, "coverage")
        assert "FAIL: signed" in [e.value for e in at.error]


class _OlderRunner(StoreQueryRunner):
    """A read API older than signed checkpoints: it knows neither signature nor proof queries."""

    UNKNOWN = ("producer_signatures", "inclusion_material")

    def names(self) -> list[dict[str, Any]]:
        return [query for query in super().names() if query["name"] not in self.UNKNOWN]

    def run(self, name: str, params: Any) -> dict[str, Any]:
        if name in self.UNKNOWN:
            raise UnknownQueryError(f"unknown query {name!r}", query=name)
        return super().run(name, params)


@pytest.fixture
def older_api(signed_store: Any) -> Iterator[str]:
    """An older read API over a copy of the signed store."""
    copy = signed_store.path.with_name("older.duckdb")
    copy.write_bytes(signed_store.path.read_bytes())
    store = AuditStore(copy)
    server = ApiServer(build_app(_OlderRunner(store), MaterializerMetrics(), lambda: HealthStatus(True)), port=0)
    try:
        with server:
            yield server.url
    finally:
        store.close()
        copy.unlink()


def ask_proof(source: dict[str, str], monkeypatch: pytest.MonkeyPatch, call_id: str) -> AppTest:
    """The Call detail page of `call_id` after pressing "Proof"."""
    at = open_app(source, monkeypatch, "call", call_id=call_id)
    at.button(key="proof_button").click().run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def proof_steps(at: AppTest) -> dict[str, str]:
    (steps,) = [df.value for df in at.dataframe if "checks" in df.value.columns]
    return dict(zip(steps["step"], steps["result"], strict=True))


class TestProof:
    def test_a_covered_call_shows_its_proof_and_the_offline_command(
        self, signed_store: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Without trusted keys every step passes but the signature, which the page says was not
        checked, giving the offline command with the download's file name; the document is shown."""
        at = ask_proof({"CALLGATE_DB": str(signed_store.path)}, monkeypatch, "s-3")
        assert any("signature was not checked" in w.value for w in at.warning)
        assert proof_steps(at) == {
            "event hash": "pass",
            "leaf": "pass",
            "inclusion": "pass",
            "checkpoint note": "pass",
            "signature": "not checked",
        }
        event_id = next(e.event_id for e in signed_store.events if getattr(e, "call_id", None) == "s-3")
        codes = [c.value for c in at.code]
        assert f"callgate verify --proof proof-{event_id}.json --key <key.pub>" in codes
        assert any('"event_hash"' in c and event_id in c for c in codes)

    @pytest.mark.parametrize(("keys", "signature"), [("keys", "pass"), ("wrong_keys", "FAIL")])
    def test_trusted_keys_check_the_signature(
        self, signed_store: Any, monkeypatch: pytest.MonkeyPatch, keys: str, signature: str
    ) -> None:
        """With the gate's key the signature step passes and the proof verifies; with another key of
        the same name it fails and the page says the proof does not verify."""
        source = {"CALLGATE_DB": str(signed_store.path), "CALLGATE_TRUSTED_KEYS": str(getattr(signed_store, keys))}
        at = ask_proof(source, monkeypatch, "s-3")
        steps = proof_steps(at)
        assert steps["signature"] == signature
        assert steps["inclusion"] == "pass"
        if signature == "pass":
            assert any("signed by a trusted key" in s.value for s in at.success)
        else:
            assert "The proof does not verify." in [e.value for e in at.error]

    def test_an_uncovered_call_shows_the_reason(self, signed_store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        """A call of the unsigned gate has no proof: the page says so with the verdict's reason, no error."""
        at = ask_proof({"CALLGATE_DB": str(signed_store.path)}, monkeypatch, "u-0")
        assert any("has no inclusion proof" in i.value for i in at.info)
        assert any("is not covered by any stored checkpoint" in t.value for t in at.text)
        assert not at.error

    def test_an_older_read_api_is_no_error(self, older_api: str, monkeypatch: pytest.MonkeyPatch) -> None:
        """A read API without the signature and proof queries: Coverage leaves the signed check out and
        says why; the Proof button says the store cannot build proofs."""
        at = open_app({"CALLGATE_API": older_api}, monkeypatch, "coverage")
        assert any("predates signed checkpoints" in c.value for c in at.caption)
        assert not [e for e in at.error if e.value.endswith(": signed")]
        at = ask_proof({"CALLGATE_API": older_api}, monkeypatch, "s-3")
        assert any("cannot build proofs" in w.value for w in at.warning)


class TestPipeline:
    def test_partitions_dead_letters_and_totals(
        self, seeded_store: Any, store_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Stored events, dead letters and chain breaks equal the store's; each partition and the dead
        letter's text are listed, the letter's markup only as text."""
        at = open_app(store_env, monkeypatch, "pipeline")
        shown = metrics(at)
        assert shown["Events stored"] == str(seeded_store.scalar("select count(*) from events"))
        assert (shown["Dead letters"], shown["Chain breaks"]) == ("1", "1")
        partitions = at.dataframe[0].value
        assert list(partitions["partition"]) == [0, 1]
        shop = [e for e in seeded_store.events if e.gate == "shop"]
        assert list(partitions["next_offset"]) == [len(shop), 51]
        assert "{not json <b>bold</b>" in all_text(at)

    def test_the_minute_chart_ends_at_now(
        self, seeded_store: Any, store_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The events-per-minute chart's time axis runs from an hour ago to now, not past it."""
        before = datetime.now(UTC).replace(tzinfo=None, microsecond=0)
        at = open_app(store_env, monkeypatch, "pipeline")
        after = datetime.now(UTC).replace(tzinfo=None)
        (chart,) = at.get("vega_lite_chart")
        spec = json.loads(chart.proto.spec)
        layer = spec.get("encoding") or spec["layer"][0]["encoding"]
        first, last = (datetime.fromisoformat(edge.rstrip("Z")) for edge in layer["x"]["scale"]["domain"])
        assert before <= last <= after
        assert abs((last - first) - timedelta(hours=1)) < timedelta(seconds=1)


@pytest.fixture
def shadow_env(shadow_store: Any) -> dict[str, str]:
    return {"CALLGATE_DB": str(shadow_store.path)}


@pytest.fixture
def shadow_api(shadow_store: Any) -> Iterator[str]:
    """The read API over a copy of the shadow store (a writer holds its file, as a materializer does)."""
    copy = shadow_store.path.with_name("served.duckdb")
    copy.write_bytes(shadow_store.path.read_bytes())
    store = AuditStore(copy)
    server = ApiServer(build_app(StoreQueryRunner(store), MaterializerMetrics(), lambda: HealthStatus(True)), port=0)
    try:
        with server:
            yield server.url
    finally:
        store.close()
        copy.unlink()


class TestPolicyImpact:
    def test_figures_equal_the_store(
        self, shadow_store: Any, shadow_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Calls with a shadow outcome, divergent calls and what they would have become are the store's counts."""
        at = open_app(shadow_env, monkeypatch, "impact")
        shown = metrics(at)

        def count(outcome: str | None = None, *, divergent: bool = False) -> str:
            sql = (
                "select count(*) from events where shadow_outcome is not null and (? is null or shadow_outcome = ?) "
                "and (not ? or divergent)"
            )
            return f"{int(shadow_store.scalar(sql, outcome, outcome, divergent)):,}"

        assert shown["Calls with a shadow outcome"] == count() == "6"
        assert shown["Divergent"] == count(divergent=True) == "5"
        assert shown["Would deny"] == count("denied") == "4"
        assert shown["Would block"] == count("blocked") == "1"
        assert (shown["Would substitute"], shown["Would ask a human"]) == ("0", "0")
        assert at.get("vega_lite_chart")

    def test_the_table_lists_the_most_divergent_rule_first(
        self, shadow_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The impact table puts the policy rule with three divergent refunds first, the enforced path last."""
        at = open_app(shadow_env, monkeypatch, "impact")
        table = next(df.value for df in at.dataframe if "would_deny" in df.value.columns)
        first = table.iloc[0]
        assert (first["decider"], first["shadow_rule"], first["calls"], first["divergent"], first["would_deny"]) == (
            "refunds",
            "stricter-refunds",
            3,
            3,
            3,
        )
        last = table.iloc[-1]
        assert (last["decider"], last["calls"], last["divergent"]) == ("(the enforced chain)", 1, 0)

    def test_replay_commands_name_the_source_and_the_window(
        self, shadow_store: Any, shadow_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """One command per policy file and per interceptor, over the sidebar's window, reading the dashboard's file."""
        at = open_app(shadow_env, monkeypatch, "impact", window="Last 7 days")
        commands = [c.value for c in at.code]
        assert f"callgate replay --policy POLICY_FILE --db {shadow_store.path} --since 7d" in commands
        assert f"callgate replay --interceptor MODULE:ATTR --db {shadow_store.path} --since 7d" in commands
        assert not any(shadow_store.hostile_decider in c or "refunds" in c for c in commands)
        assert any("Policy file 'refunds', rules stricter-refunds" in t.value for t in at.text)

    def test_through_the_read_api_the_command_names_its_url(
        self, shadow_api: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Read through the API, the page shows the same figures and the replay reads the same API."""
        at = open_app({"CALLGATE_API": shadow_api}, monkeypatch, "impact", window="All time")
        assert metrics(at)["Divergent"] == "5"
        assert f"callgate replay --policy POLICY_FILE --api {shadow_api} --since all" in [c.value for c in at.code]

    def test_the_calls_behind_a_rule_open_their_detail(
        self, shadow_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The most divergent rule's calls are listed; opening one shows its detail with the shadow outcome."""
        at = open_app(shadow_env, monkeypatch, "impact")
        calls = at.dataframe[-1].value
        assert sorted(calls["call_id"]) == ["c-refund-1", "c-refund-2", "c-refund-3"]
        assert set(calls["shadow_rule"]) == {"stricter-refunds"}
        assert "Page 1 of 1, 3 calls, newest first. Select a row to open it." in [c.value for c in at.caption]
        at.toggle(key="impact_divergent_only").set_value(False).run()
        at.selectbox(key="impact_decider").set_value("__all__").run()
        assert sorted(at.dataframe[-1].value["call_id"]) == [
            "c-frozen",
            "c-hostile",
            "c-refund-0",
            "c-refund-1",
            "c-refund-2",
            "c-refund-3",
        ]
        at.selectbox(key="impact_call").set_value("c-refund-2").run()
        at.button(key="impact_open").click().run()
        assert at.text_input(key="call_id").value == "c-refund-2"
        shadow = next(df.value for df in at.dataframe if "shadow_rule" in df.value.columns)
        assert (shadow["shadow_outcome"][0], shadow["shadow_rule"][0]) == ("denied", "stricter-refunds")
        trail = next(df.value for df in at.dataframe if "mode" in df.value.columns)
        assert list(zip(trail["interceptor"], trail["mode"], strict=True))[:4] == [
            ("tenant-orders", "enforced"),
            ("refunds", "enforced"),
            ("refunds", "shadow"),
            ("frozen-tenants", "shadow"),
        ]

    def test_a_hostile_decider_name_is_text_only(
        self, shadow_store: Any, shadow_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A decider name carrying markup is shown verbatim as text, never as markup or a link."""
        at = open_app(shadow_env, monkeypatch, "impact")
        assert shadow_store.hostile_decider in all_text(at)
        assert not any(marker in shown_text(at) for marker in shadow_store.hostile_markers)

    def test_no_shadow_decisions_says_how_to_add_one(
        self, store_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A store without shadow decisions says how to add a shadow rule and where it is documented."""
        at = open_app(store_env, monkeypatch, "impact")
        (info,) = [i.value for i in at.info]
        assert "mode: shadow" in info
        assert "interceptor_core.shadow" in info
        assert "docs/policies.md" in info
        assert not at.metric


class TestStates:
    @pytest.mark.parametrize("page", ["overview", "blocked", "run", "trends", "impact", "coverage"])
    def test_empty_store_says_so(self, empty_store: Path, monkeypatch: pytest.MonkeyPatch, page: str) -> None:
        """A store without events shows a message on every page, no traceback."""
        at = open_app({"CALLGATE_DB": str(empty_store)}, monkeypatch, page)
        assert any("holds no events yet" in i.value for i in at.info)

    @pytest.mark.parametrize("page", ["overview", "blocked", "call", "run", "trends", "impact", "coverage", "pipeline"])
    def test_api_down_says_so(self, monkeypatch: pytest.MonkeyPatch, page: str) -> None:
        """A read API nobody serves shows that the store cannot be read, naming the URL, no traceback."""
        url = f"http://127.0.0.1:{free_port('127.0.0.1')}"
        at = open_app({"CALLGATE_API": url}, monkeypatch, page, call_id="c-ok-0")
        assert any("cannot be read right now" in e.value for e in at.error)
        assert any(url in t.value for t in at.text)

    def test_missing_file_says_so(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """A --db file that does not exist is named in the message."""
        missing = tmp_path / "nowhere.duckdb"
        at = open_app({"CALLGATE_DB": str(missing)}, monkeypatch)
        assert any(str(missing) in t.value for t in at.text)

    def test_no_source_configured(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Neither variable set: the app names both, no traceback."""
        at = open_app({}, monkeypatch)
        assert [e.value for e in at.error] == ["The dashboard is not configured."]
        assert "CALLGATE_API" in at.text[0].value


def chart_frames(at: AppTest) -> list[Any]:
    """The data of each chart on the page, as DataFrames, in page order."""
    import pyarrow as pa

    return [pa.ipc.open_stream(c.proto.datasets[0].data.data).read_all().to_pandas() for c in at.get("vega_lite_chart")]


class TestChartsAndTimes:
    def test_tool_decisions_apart_from_model_turns(self, run_store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        """The Overview's first chart counts tool decisions only (the store's outcome events, by
        label); the model turns are a chart of their own."""
        at = open_app({"CALLGATE_DB": str(run_store.path)}, monkeypatch)
        decisions, turns = chart_frames(at)[:2]
        assert set(decisions["decision"]) <= {"allowed", "denied", "substituted", "blocked"}
        outcomes = run_store.scalar(
            "select count(*) from events where type in ('ToolUse', 'ToolDenied', 'Substitute', 'Blocked')"
        )
        assert int(decisions["events"].sum()) == outcomes
        assert int(turns["events"].sum()) == run_store.scalar("select count(*) from events where type = 'TurnDecision'")
        assert set(turns["checked"]) == {"before-turn decisions"}

    def test_a_short_burst_is_drawn_in_seconds(self, run_store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        """Events of one second in a 30-day window are drawn in one-second buckets, and the caption says so."""
        at = open_app({"CALLGATE_DB": str(run_store.path)}, monkeypatch, window="Last 30 days")
        assert any("per 1-second bucket" in c.value for c in at.caption)

    def test_trend_rates_are_points(self, store_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
        """The denial rates are drawn as points joined by lines, so one bucket is still a mark."""
        at = open_app(store_env, monkeypatch, "trends")
        specs = [json.loads(c.proto.spec) for c in at.get("vega_lite_chart")]
        assert specs
        assert all([layer["mark"]["type"] for layer in spec["layer"]] == ["line", "point"] for spec in specs)

    def test_times_in_the_configured_zone_with_utc_in_tooltips(
        self, seeded_store: Any, store_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """With CALLGATE_TIMEZONE, table times read YYYY-MM-DD HH:MM:SS in that zone, its header
        names the zone, and chart tooltips carry the bucket's start in the zone and in UTC."""
        at = open_app({**store_env, "CALLGATE_TIMEZONE": "Asia/Tokyo"}, monkeypatch, "blocked")
        (table,) = [df.value for df in at.dataframe]
        newest = seeded_store.scalar("select max(time) from blocked_attempts")
        assert table["time"].iloc[0] == newest.astimezone(ZoneInfo("Asia/Tokyo")).strftime("%Y-%m-%d %H:%M:%S")
        home = open_app({**store_env, "CALLGATE_TIMEZONE": "Asia/Tokyo"}, monkeypatch)
        frame = chart_frames(home)[0]
        assert {"from (Asia/Tokyo)", "from (UTC)"} <= set(frame.columns)
        tokyo = datetime.strptime(frame["from (Asia/Tokyo)"].iloc[0], "%Y-%m-%d %H:%M:%S")
        utc = datetime.strptime(frame["from (UTC)"].iloc[0], "%Y-%m-%d %H:%M:%S")
        assert tokyo - utc == timedelta(hours=9)
        spec = json.loads(home.get("vega_lite_chart")[0].proto.spec)
        assert spec["encoding"]["x"]["title"] == "time (Asia/Tokyo)"


class TestLinks:
    def test_filters_page_and_call_are_written_to_the_url(
        self, store_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Changing the window, a filter, the page size and the call writes each to the query string;
        back to its default, it leaves the query string."""
        at = open_app(store_env, monkeypatch, "blocked")
        at.selectbox(key="window").set_value("Last 7 days").run()
        at.text_input(key="f_tenant").input("acme").run()
        at.selectbox(key="page_size").set_value(50).run()
        at.selectbox(key="blocked_call").set_value("c-deny-0").run()
        params = {key: at.query_params[key] for key in at.query_params}
        assert {k: params[k] for k in ("window", "f_tenant", "page_size", "call")} == {
            "window": "7d",
            "f_tenant": "acme",
            "page_size": "50",
            "call": "c-deny-0",
        }
        at.text_input(key="f_tenant").input("").run()
        assert "f_tenant" not in at.query_params

    def test_a_link_restores_what_its_sender_saw(
        self, store_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Opening the page with the query string of a link restores the window, the filters and the call."""
        for name in ("CALLGATE_API", "CALLGATE_TIMEZONE"):
            monkeypatch.delenv(name, raising=False)
        for name, value in store_env.items():
            monkeypatch.setenv(name, value)
        at = AppTest.from_file(APP, default_timeout=60)
        at.query_params.update({"window": "30d", "f_tenant": "globex", "f_type": "Blocked", "call": "c-blocked-1"})
        at.switch_page("views/blocked.py").run()
        assert not at.exception, [e.value for e in at.exception]
        assert at.selectbox(key="window").value == "Last 30 days"
        assert at.text_input(key="f_tenant").value == "globex"
        assert metrics(at)["Matching attempts"] == "2"
        assert at.selectbox(key="blocked_call").value == "c-blocked-1"

    def test_a_link_with_values_the_page_cannot_take_is_no_error(
        self, store_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A window, page, page size or decision a link makes up is left at its default."""
        for name in ("CALLGATE_API", "CALLGATE_TIMEZONE"):
            monkeypatch.delenv(name, raising=False)
        for name, value in store_env.items():
            monkeypatch.setenv(name, value)
        at = AppTest.from_file(APP, default_timeout=60)
        at.query_params.update({"window": "1y", "page": "0", "page_size": "7", "f_type": "Everything", "r_page": "-3"})
        at.switch_page("views/blocked.py").run()
        assert not at.exception, [e.value for e in at.exception]
        assert (at.selectbox(key="window").value, at.number_input(key="page").value) == ("Last 24 hours", 1)
        assert (at.selectbox(key="page_size").value, at.selectbox(key="f_type").value) == (100, "Denied and blocked")
        at.switch_page("views/run.py").run()
        assert not at.exception, [e.value for e in at.exception]


class TestLogin:
    @pytest.fixture
    def login_env(self, seeded_store: Any, token_file: Path) -> dict[str, str]:
        return {"CALLGATE_DB": str(seeded_store.path), "CALLGATE_DASHBOARD_AUTH": str(token_file)}

    @staticmethod
    def log_in(at: AppTest, token: str) -> AppTest:
        at.text_input(key="login_token").input(token)
        next(b for b in at.button if b.label == "Log in").click().run()
        assert not at.exception, [e.value for e in at.exception]
        return at

    def test_a_login_is_asked_first_and_a_wrong_token_refused(
        self, login_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """With a token file nothing of the store shows before a login; a token it lacks is refused."""
        at = open_app(login_env, monkeypatch)
        assert not at.metric
        assert not at.dataframe
        self.log_in(at, "tok-nobody")
        assert [e.value for e in at.error] == ["This token was refused."]
        assert not at.metric

    def test_a_tenant_administrator_sees_only_its_tenant(
        self, seeded_store: Any, login_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, tokens: dict[str, str]
    ) -> None:
        """Logged in with globex's token, the Overview's figures are globex's plain SQL counts, the
        top-denied tenants are globex alone, and the blocked attempts are globex's."""
        at = self.log_in(open_app(login_env, monkeypatch, window="Last 24 hours"), tokens["globex-admin"])
        count = seeded_store.scalar
        shown = {label: int(value.replace(",", "")) for label, value in metrics(at).items()}
        calls = count(
            "select count(*) from events where tenant = 'globex' and time >= now() - interval 1 day "
            "and type in ('ToolUse', 'ToolDenied', 'Substitute', 'Blocked')"
        )
        blocked = count("select count(*) from events where tenant = 'globex' and type = 'Blocked'")
        assert (shown["Calls"], shown["Blocked"]) == (calls, blocked)
        tenants = at.dataframe[1].value
        assert list(tenants["key"]) == ["globex"]
        at.switch_page("views/blocked.py").run()
        (table,) = [df.value for df in at.dataframe]
        assert set(table["tenant"]) == {"globex"}
        assert len(table) == count("select count(*) from blocked_attempts where tenant = 'globex'")

    def test_a_tenant_administrator_may_not_ask_for_another_tenant(
        self, login_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, tokens: dict[str, str]
    ) -> None:
        """A globex login typing acme in the tenant filter is refused, and shown nothing of acme."""
        at = self.log_in(open_app(login_env, monkeypatch), tokens["globex-admin"])
        at.switch_page("views/blocked.py").run()
        at.text_input(key="f_tenant").input("acme").run()
        assert "Your login's roles do not allow this." in [w.value for w in at.warning]
        assert not at.dataframe

    def test_the_pages_that_read_every_tenant_are_not_offered(
        self, login_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, tokens: dict[str, str]
    ) -> None:
        """A tenant login is not offered Coverage or Pipeline health; an auditor is; the tenant is
        fixed in the sidebar."""
        tenant = self.log_in(open_app(login_env, monkeypatch), tokens["globex-admin"])
        assert "globex" in [t.value for t in tenant.sidebar.text]
        assert not [t for t in tenant.sidebar.text_input if t.key == "tenant"]
        for page in ("coverage", "pipeline"):
            with pytest.raises(ValueError, match="Could not find a navigation page"):
                tenant.switch_page(f"views/{page}.py")
        auditor = self.log_in(open_app(login_env, monkeypatch), tokens["auditor"])
        auditor.switch_page("views/coverage.py").run()
        assert not auditor.exception
        assert any("coverage checks" in e.value for e in (*auditor.error, *auditor.success))


@pytest.fixture(scope="module")
def guarded_api(seeded_store: Any, token_file: Path) -> Iterator[str]:
    """The read API over a copy of the seeded store, checking tokens against the token file."""
    from consumers.auth import TokenFile

    copy = seeded_store.path.with_name("guarded.duckdb")
    copy.write_bytes(seeded_store.path.read_bytes())
    store = AuditStore(copy)
    app = build_app(
        StoreQueryRunner(store), MaterializerMetrics(), lambda: HealthStatus(True), auth=TokenFile(token_file)
    )
    server = ApiServer(app, port=0)
    try:
        with server:
            yield server.url
    finally:
        store.close()
        copy.unlink()


class TestSeveralTenants:
    def test_a_login_for_two_tenants_picks_one_at_a_time(
        self, seeded_store: Any, token_file: Path, monkeypatch: pytest.MonkeyPatch, tokens: dict[str, str]
    ) -> None:
        """A token for acme and globex offers those two in the sidebar and reads the one picked."""
        env = {"CALLGATE_DB": str(seeded_store.path), "CALLGATE_DASHBOARD_AUTH": str(token_file)}
        at = TestLogin.log_in(open_app(env, monkeypatch), tokens["pair-admin"])
        picker = at.sidebar.selectbox(key="tenant")
        assert (picker.options, picker.value) == (["acme", "globex"], "acme")
        picker.set_value("globex").run()
        at.switch_page("views/blocked.py").run()
        (table,) = [df.value for df in at.dataframe]
        assert set(table["tenant"]) == {"globex"}


class TestLoginThroughTheApi:
    def test_a_typed_token_is_forwarded_and_the_api_scopes_it(
        self, seeded_store: Any, guarded_api: str, monkeypatch: pytest.MonkeyPatch, tokens: dict[str, str]
    ) -> None:
        """With --login token, a globex token typed in the browser reads globex's blocked attempts
        only (the read API binds the tenant), and the pages that read every tenant are not offered."""
        at = open_app({"CALLGATE_API": guarded_api, "CALLGATE_DASHBOARD_LOGIN": "token"}, monkeypatch)
        assert not at.metric
        TestLogin.log_in(at, "tok-nobody")
        assert [e.value for e in at.error] == ["This token was refused."]
        TestLogin.log_in(at, tokens["globex-admin"])
        at.switch_page("views/blocked.py").run()
        (table,) = [df.value for df in at.dataframe]
        assert set(table["tenant"]) == {"globex"}
        assert len(table) == seeded_store.scalar("select count(*) from blocked_attempts where tenant = 'globex'")
        for page in ("coverage", "pipeline"):
            with pytest.raises(ValueError, match="Could not find a navigation page"):
                at.switch_page(f"views/{page}.py")

    def test_the_deployment_token_reads_for_everyone(
        self, seeded_store: Any, guarded_api: str, monkeypatch: pytest.MonkeyPatch, tokens: dict[str, str]
    ) -> None:
        """With --token (CALLGATE_TOKEN) there is no login: every session reads as that token."""
        at = open_app({"CALLGATE_API": guarded_api, "CALLGATE_TOKEN": tokens["acme-admin"]}, monkeypatch, "blocked")
        (table,) = [df.value for df in at.dataframe]
        assert set(table["tenant"]) == {"acme"}

    def test_no_token_for_an_api_that_needs_one_says_so(
        self, guarded_api: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A read API that checks tokens, and a dashboard without one: every page says which options give one."""
        at = open_app({"CALLGATE_API": guarded_api}, monkeypatch)
        assert [e.value for e in at.error] == [
            "The read API needs a token: start the dashboard with --token, or --login token."
        ]

    def test_a_refused_deployment_token_says_so(self, guarded_api: str, monkeypatch: pytest.MonkeyPatch) -> None:
        """A deployment token the read API refuses stops every page with a message naming the option."""
        at = open_app({"CALLGATE_API": guarded_api, "CALLGATE_TOKEN": "tok-wrong"}, monkeypatch)
        assert [e.value for e in at.error] == ["The read API refuses the dashboard's token (--token / CALLGATE_TOKEN)."]


class TestOidcLogin:
    def test_the_page_offers_the_identity_providers_login(
        self, store_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """With --login oidc and nobody logged in, the page shows only the login button (st.login)."""
        at = open_app({**store_env, "CALLGATE_DASHBOARD_LOGIN": "oidc"}, monkeypatch)
        assert [b.label for b in at.button] == ["Log in"]
        assert not at.metric
        assert not at.dataframe


class TestImpactLinks:
    def test_the_choice_toggle_and_call_live_in_the_url(
        self, shadow_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A link with a decider and the toggle off restores both; changing them writes them back."""
        for name in ("CALLGATE_API", "CALLGATE_TIMEZONE"):
            monkeypatch.delenv(name, raising=False)
        for name, value in shadow_env.items():
            monkeypatch.setenv(name, value)
        frozen = json.dumps(["frozen-tenants", None])
        at = AppTest.from_file(APP, default_timeout=60)
        at.query_params.update({"decider": frozen, "divergent": "0", "call": "c-frozen"})
        at.switch_page("views/impact.py").run()
        assert not at.exception, [e.value for e in at.exception]
        assert at.selectbox(key="impact_decider").value == frozen
        assert at.toggle(key="impact_divergent_only").value is False
        assert at.selectbox(key="impact_call").value == "c-frozen"
        at.toggle(key="impact_divergent_only").set_value(True).run()
        assert "divergent" not in at.query_params
        assert at.query_params["decider"] == frozen
