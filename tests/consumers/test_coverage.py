"""The coverage check over real stores: each check passes on a clean stream and fails on its own
violation; `callgate coverage` exit codes 0 / 1 / 2, JUnit and JSON reports, file and read API."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from callgate.broker import free_port
from callgate.cli import app
from callgate.coverage import parse_since
from consumers import AuditStore, RawRecord
from consumers.api import ApiServer, HealthStatus, build_app
from consumers.coverage import CoverageReport, run_checks
from consumers.metrics import MaterializerMetrics
from consumers.reader import ApiReader, FileReader, SourceUnavailableError, open_reader
from consumers.runner import StoreQueryRunner
from events import EventBase, MemorySink, ToolsRegisteredEvent, ToolUseEvent, encode_event
from events.chain import Producer
from events.models import RegisteredTool
from interceptor_core import Deny, Gate, RunContext, ToolCall, UnmediatedAccessError, tool

TOPIC = "callgate.events"
ACME = RunContext(tenant="acme", principal="u-1")
runner = CliRunner()


class Policy:
    name = "policy"

    def before_tool_call(self, call: ToolCall) -> Any:
        return Deny("no deletes") if call.tool_name == "delete_file" else None


@tool
def read_file(path: str) -> str:
    """Reads a file."""
    return "contents"


@tool
def delete_file(path: str) -> str:
    """Deletes a file."""
    return "deleted"


@tool
def archive(path: str) -> str:
    """Archives a file."""
    return "archived"


class Disk:
    def remove(self, path: str) -> None:
        pass


def gate_events(*, calls: Sequence[str] = ("read_file", "delete_file"), bypass: bool = False) -> list[EventBase]:
    """A real gate's events: its registration, a call of each tool in `calls`, and (with `bypass`) a
    guarded client used around the gate."""
    sink = MemorySink()
    gate = Gate("files", interceptors=[Policy()], sinks=[sink])
    desk = gate.agent("desk", tools=[read_file, delete_file, archive])
    disk = gate.guard(Disk(), name="disk", tools=["delete_file"])

    async def work() -> None:
        for name in calls:
            await desk.call(name, {"path": "/tmp/a"}, run=ACME)

    asyncio.run(work())
    if bypass:
        with pytest.raises(UnmediatedAccessError):
            disk.remove("/tmp/a")
    return list(sink.events)


def _key(event: EventBase | bytes) -> bytes:
    # Keyed by the producer, as a sink sends it (the store checks the key against the event).
    return str(json.loads(event)["producer_id"] if isinstance(event, bytes) else event.producer_id).encode()


def store_of(path: Path, events: Sequence[EventBase | bytes]) -> Path:
    records = [
        RawRecord(TOPIC, 0, i, _key(e), e if isinstance(e, bytes) else encode_event(e)) for i, e in enumerate(events)
    ]
    with AuditStore(path) as store:
        store.ingest(records, {(TOPIC, 0): len(records)})
        store.close_open_gaps()
    return path


def check(path: Path, **options: Any) -> CoverageReport:
    with FileReader(path) as reader:
        return run_checks(reader, **options)


def statuses(report: CoverageReport) -> dict[str, str]:
    return {c.name: c.status for c in report.checks}


class TestChecks:
    """Each check holds on a clean stream and fails on exactly its own violation."""

    def test_a_clean_stream_passes(self, tmp_path: Path) -> None:
        """A real gate's registration, an allowed and a denied call: every check passes."""
        report = check(store_of(tmp_path / "a.duckdb", gate_events()))
        assert report.ok
        assert report.exit_code == 0
        assert statuses(report) == {"unmediated": "pass", "chains": "pass", "tool_uses": "pass", "exercised": "skip"}
        assert report.facts["tool_uses"] == 1
        assert report.facts["producers"] == 1

    def test_unmediated_use_is_listed_with_its_site(self, tmp_path: Path) -> None:
        """A guarded client used around the gate fails check 1 with resource, attribute, tools and site."""
        report = check(store_of(tmp_path / "a.duckdb", gate_events(bypass=True)))
        assert statuses(report)["unmediated"] == "fail"
        assert statuses(report)["chains"] == "pass"
        (row,) = report.check("unmediated").violations
        assert (row["resource"], row["attribute"], row["bound_tools"]) == ("disk", "remove", ["delete_file"])
        assert "test_coverage.py" in row["site"]
        assert row["tenant"] is None  # used outside any run
        assert report.exit_code == 1

    def test_a_missing_event_breaks_the_chain(self, tmp_path: Path) -> None:
        """A hole in a producer's seqs fails check 2 with the producer and the count missing."""
        events = gate_events(calls=("read_file", "delete_file", "read_file"))
        kept = [e for e in events if e.seq != 3]  # the denial between the two runs
        report = check(store_of(tmp_path / "a.duckdb", kept))
        chains = report.check("chains")
        assert chains.status == "fail"
        (row,) = chains.violations
        assert row["producer_id"] == events[0].producer_id
        assert row["missing"] == 1
        # Its tool runs are no longer from a verified chain.
        uses = report.check("tool_uses").violations
        assert [u["problem"] for u in uses] == ["chain_not_verified"] * 2

    def test_a_tampered_event_fails_chains_and_its_tool_use(self, tmp_path: Path) -> None:
        """A ToolUse edited after sealing is tamper in check 2 and unverified in check 3."""
        events = gate_events()
        wire = [encode_event(e) for e in events]
        index = next(i for i, e in enumerate(events) if e.type == "ToolUse")
        wire[index] = wire[index].replace(b'"tenant":"acme"', b'"tenant":"evil"')
        report = check(store_of(tmp_path / "a.duckdb", wire))
        assert report.check("chains").violations[0]["tampered"] >= 1
        (use,) = report.check("tool_uses").violations
        assert use["problem"] == "chain_not_verified"

    def test_an_empty_store_proves_nothing(self, tmp_path: Path) -> None:
        """No events at all is a failure, not a clean bill."""
        report = check(store_of(tmp_path / "a.duckdb", []))
        assert statuses(report)["chains"] == "fail"
        assert "proves nothing" in report.check("chains").summary

    def test_since_limits_the_window(self, tmp_path: Path) -> None:
        """An unmediated use before --since is outside the window; the chain check then has no events."""
        db = store_of(tmp_path / "a.duckdb", gate_events(bypass=True))
        later = check(db, since=datetime.now(UTC) + timedelta(minutes=1))
        assert statuses(later)["unmediated"] == "pass"
        assert later.facts["events"] == 0
        assert statuses(check(db, since=datetime.now(UTC) - timedelta(hours=1)))["unmediated"] == "fail"


def forged(*, registered: Sequence[str], trail: Sequence[str], register: bool = True) -> list[EventBase]:
    """A whole chain written by a producer that is not a gate: a registration of `delete_file` with
    the chain `registered`, then a ToolUse whose trail names `trail`."""
    producer = Producer()
    now = datetime.now(UTC)
    envelope = {"gate": "files", "agent": "desk", "time": now}
    events: list[EventBase] = []
    if register:
        tools = (RegisteredTool(name="delete_file", input_schema_sha256="0" * 64, interceptors=tuple(registered)),)
        events.append(producer.seal(ToolsRegisteredEvent, {**envelope, "event_id": "r1", "tools": tools}))
    steps = [{"interceptor": name, "scope": "application", "kind": "allow", "duration_ms": 0.01} for name in trail]
    events.append(
        producer.seal(
            ToolUseEvent,
            {
                **envelope,
                "event_id": "u1",
                "tool": "delete_file",
                "call_id": "c-forged",
                "outcome": "ok",
                "duration_ms": 1.0,
                "decisions": steps,
            },
        )
    )
    return events


class TestToolUseVerification:
    """Check 3: a tool run must carry the trail of a chain its scope registered."""

    def test_a_trail_missing_an_interceptor_fails(self, tmp_path: Path) -> None:
        """A ToolUse whose trail skips a registered interceptor is listed with the one it skipped."""
        report = check(store_of(tmp_path / "a.duckdb", forged(registered=["policy", "audit-log"], trail=["policy"])))
        (row,) = report.check("tool_uses").violations
        assert (row["problem"], row["missing_interceptors"], row["call_id"]) == (
            "incomplete_trail",
            ["audit-log"],
            "c-forged",
        )
        assert statuses(report)["chains"] == "pass"

    def test_a_tool_never_registered_fails(self, tmp_path: Path) -> None:
        """A ToolUse from a scope with no registration of its tool is 'not_registered'."""
        report = check(store_of(tmp_path / "a.duckdb", forged(registered=[], trail=[], register=False)))
        assert report.check("tool_uses").violations[0]["problem"] == "not_registered"

    def test_extra_interceptors_in_the_trail_are_fine(self, tmp_path: Path) -> None:
        """A trail with more than the registered chain (an interceptor added later) verifies."""
        report = check(store_of(tmp_path / "a.duckdb", forged(registered=["policy"], trail=["drill", "policy"])))
        assert statuses(report)["tool_uses"] == "pass"

    def test_a_chain_changed_by_remove_interceptor_still_verifies(self, tmp_path: Path) -> None:
        """Removing an application interceptor announces the new chains, so later runs verify."""
        sink = MemorySink()
        audit_log = Policy()
        gate = Gate("files", interceptors=[audit_log], sinks=[sink])
        desk = gate.agent("desk", tools=[read_file])
        gate.remove_interceptor(audit_log)
        assert asyncio.run(desk.call("read_file", {"path": "/a"}, run=ACME)).kind == "ok"
        report = check(store_of(tmp_path / "a.duckdb", sink.events))
        assert statuses(report)["tool_uses"] == "pass", report.check("tool_uses").violations


class TestExercised:
    """Check 4, with require_exercised: every registered tool called through the gate."""

    def test_unexercised_tools_are_listed_and_each_is_a_junit_case(self, tmp_path: Path) -> None:
        """archive was registered and never called: the check fails naming it; JUnit has a case per tool."""
        report = check(store_of(tmp_path / "a.duckdb", gate_events()), require_exercised=True)
        exercised = report.check("exercised")
        assert exercised.status == "fail"
        assert [row["tool"] for row in exercised.violations] == ["archive"]
        suite = ET.fromstring(report.to_junit()).find("testsuite")  # noqa: S314 (our own output)
        assert suite is not None
        cases = {c.get("name"): c.find("failure") is not None for c in suite.iter("testcase")}
        assert {k: v for k, v in cases.items() if "/" in k} == {
            "files/archive": True,
            "files/delete_file": False,
            "files/read_file": False,
        }
        assert suite.get("failures") == "1"

    def test_denied_calls_count_as_exercised(self, tmp_path: Path) -> None:
        """A tool only ever denied was still called through the gate."""
        events = gate_events(calls=("read_file", "delete_file", "archive"))
        assert check(store_of(tmp_path / "a.duckdb", events), require_exercised=True).ok


# -- the command line ---------------------------------------------------------------------------


def cli(*args: str) -> Any:
    return runner.invoke(app, ["coverage", *args], env={"COLUMNS": "200"})


class TestCommand:
    """`callgate coverage`: exit codes, the table, the reports."""

    def test_clean_store_exits_0_and_writes_reports(self, tmp_path: Path) -> None:
        """Exit 0, a table of the checks, and JUnit and JSON reports that agree."""
        db = store_of(tmp_path / "a.duckdb", gate_events(calls=("read_file", "delete_file", "archive")))
        result = cli("--db", str(db), "--require-exercised", "--junit", str(tmp_path / "j.xml"), "--json", str(
            tmp_path / "r.json"
        ))  # fmt: skip
        assert result.exit_code == 0, result.output
        assert "coverage clean" in result.output
        assert result.output.count("PASS") == 4
        report = json.loads((tmp_path / "r.json").read_text())
        assert report["ok"] is True
        assert [c["status"] for c in report["checks"]] == ["pass"] * 4
        suite = ET.parse(tmp_path / "j.xml").getroot().find("testsuite")  # noqa: S314 (our own output)
        assert suite is not None
        assert suite.get("failures") == "0"

    def test_violation_exits_1_and_shows_where(self, tmp_path: Path) -> None:
        """An unmediated use: exit 1 and the violation row with its resource and site."""
        db = store_of(tmp_path / "a.duckdb", gate_events(bypass=True))
        result = cli("--db", str(db))
        assert result.exit_code == 1, result.output
        assert "FAIL" in result.output
        assert "disk" in result.output
        assert "test_coverage.py" in result.output

    def test_missing_file_exits_2(self, tmp_path: Path) -> None:
        """A store that is not there cannot be checked: exit 2, never 0."""
        result = cli("--db", str(tmp_path / "nope.duckdb"))
        assert result.exit_code == 2
        assert "does not exist" in result.output

    def test_newer_schema_exits_2(self, tmp_path: Path) -> None:
        """A store written by a newer callgate cannot be checked by this one."""
        db = store_of(tmp_path / "a.duckdb", gate_events())
        import duckdb

        with duckdb.connect(str(db)) as con:
            con.execute("INSERT INTO schema_migrations VALUES (999, 'future', now())")
        result = cli("--db", str(db))
        assert result.exit_code == 2
        assert "newer" in result.output

    def test_locked_file_exits_2_and_points_to_the_api(self, tmp_path: Path) -> None:
        """A store held for writing by another process: exit 2, and the message says to use --api."""
        db = store_of(tmp_path / "a.duckdb", gate_events())
        holder = subprocess.Popen(
            [sys.executable, "-c", f"from consumers import AuditStore; s = AuditStore({str(db)!r}); print('ready', "
             "flush=True); input()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )  # fmt: skip
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline().strip() == b"ready"
            result = cli("--db", str(db))
        finally:
            holder.communicate(b"\n", timeout=30)
        assert result.exit_code == 2
        assert "--api" in result.output

    def test_api_down_exits_2(self) -> None:
        """Nothing listening at the URL: exit 2 with the URL named."""
        url = f"http://127.0.0.1:{free_port()}"
        result = cli("--api", url)
        assert result.exit_code == 2
        assert url in result.output

    def test_both_or_neither_source_exits_2(self, tmp_path: Path) -> None:
        """Exactly one of --db and --api."""
        for result in (cli(), cli("--db", "x", "--api", "http://127.0.0.1:1")):
            assert result.exit_code == 2
            assert "exactly one of --api" in result.output

    def test_bad_since_exits_2(self) -> None:
        """An unreadable --since names itself."""
        result = cli("--db", "x", "--since", "yesterday")
        assert result.exit_code == 2
        assert "yesterday" in result.output


@pytest.fixture
def served_store(tmp_path: Path) -> Iterator[tuple[str, Path, list[EventBase]]]:
    """A store held for writing, served by the read API as the materializer serves it."""
    events = gate_events(bypass=True)
    db = store_of(tmp_path / "a.duckdb", events)
    store = AuditStore(db)
    server = ApiServer(build_app(StoreQueryRunner(store), MaterializerMetrics(), lambda: HealthStatus(True)), port=0)
    try:
        with server:
            yield server.url, db, events
    finally:
        store.close()


class TestThroughTheApi:
    """The same checks through a live read API while the store is held for writing."""

    def test_api_and_file_agree(self, served_store: tuple[str, Path, list[EventBase]], tmp_path: Path) -> None:
        """The report through the API equals the report on another file of the same events."""
        url, _, events = served_store
        with ApiReader(url) as reader:
            via_api = run_checks(reader, require_exercised=True)
        via_file = check(store_of(tmp_path / "copy.duckdb", events), require_exercised=True)
        assert via_api.facts == via_file.facts
        assert statuses(via_api) == statuses(via_file)
        assert via_api.check("unmediated").total == via_file.check("unmediated").total == 1
        assert via_api.source == url

    def test_cli_through_the_api(self, served_store: tuple[str, Path, list[EventBase]]) -> None:
        """`callgate coverage --api URL` exits 1 for the unmediated use, and --db on the held file exits 2."""
        url, db, _ = served_store
        assert cli("--api", url).exit_code == 1
        assert cli("--db", str(db)).exit_code == 2


class TestReader:
    """open_reader and its errors."""

    def test_open_reader_needs_exactly_one(self) -> None:
        """Both or neither is a ValueError."""
        with pytest.raises(ValueError, match="exactly one"):
            open_reader()
        with pytest.raises(ValueError, match="exactly one"):
            open_reader(api="http://127.0.0.1:1", db="x")

    def test_api_reader_rejects_other_schemes(self) -> None:
        """Only http(s) URLs."""
        with pytest.raises(ValueError, match="file:///etc/passwd"):
            ApiReader("file:///etc/passwd")

    def test_source_unavailable_names_the_source(self, tmp_path: Path) -> None:
        """The error carries the file it could not read."""
        with pytest.raises(SourceUnavailableError) as failed, FileReader(tmp_path / "none.duckdb") as reader:
            reader.query("coverage_summary")
        assert failed.value.source == str(tmp_path / "none.duckdb")


class TestParseSince:
    def test_durations_and_times(self) -> None:
        """Durations count back from now; ISO times without a zone are UTC."""
        now = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
        assert parse_since("30m", now=now) == now - timedelta(minutes=30)
        assert parse_since("7d", now=now) == now - timedelta(days=7)
        assert parse_since("2026-11-30T09:00:00") == datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
        with pytest.raises(ValueError, match="'soon'"):
            parse_since("soon")
