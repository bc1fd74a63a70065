"""`callgate coverage --require-signed`: every producer signed by a trusted key, covered, not silent."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from consumers import AuditStore, RawRecord
from consumers.api import ApiServer, HealthStatus, build_app
from consumers.coverage import SignaturesUnavailableError, run_checks
from consumers.metrics import MaterializerMetrics
from consumers.queries import QueryResult, UnknownQueryError
from consumers.reader import ApiReader
from consumers.runner import StoreQueryRunner
from events import EventBase, MemorySink, encode_event
from events.signing import SigningKey
from interceptor_core import Gate, RunContext, tool

TOPIC = "callgate.events"
RUN = RunContext(tenant="acme", principal="u-1")
KEY = SigningKey.generate("shop")


@tool
def refund(order_id: str) -> str:
    """Refunds an order."""
    return f"refunded {order_id}"


def gate_events(name: str, key: SigningKey | None, calls: int = 7) -> list[EventBase]:
    """A real gate's events: `calls` calls, checkpoints every 5 events when signing, then close()."""
    sink = MemorySink()
    gate = Gate(name, sinks=[sink], signing_key=key, checkpoint_events=5) if key else Gate(name, sinks=[sink])
    desk = gate.agent("desk", tools=[refund])

    async def run() -> None:
        for n in range(calls):
            await desk.call("refund", {"order_id": f"A-{n}"}, run=RUN)
        await gate.close()

    asyncio.run(run())
    return sorted(sink.events, key=lambda e: e.seq)


def signed_store(path: Path, *streams: list[EventBase], require_signed: bool = True) -> Path:
    """A real store trusting KEY (recording unsigned, uncovered and silent producers too with
    `require_signed`), with `streams` ingested and the drain closed."""
    events = [e for stream in streams for e in stream]
    raw = [
        RawRecord(TOPIC, 0, i, e.producer_id.encode(), encode_event(e), 1_700_000_000_000) for i, e in enumerate(events)
    ]
    with AuditStore(path, trusted_keys={KEY.key_id: KEY.public()}, require_signed=require_signed) as store:
        store.ingest(raw, {(TOPIC, 0): len(raw)})
        store.close_checkpoints()
    return path


def callgate(*args: str) -> subprocess.CompletedProcess[str]:
    """The real `callgate` command as a child process."""
    return subprocess.run(
        [sys.executable, "-c", "from callgate.cli import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def shop() -> list[EventBase]:
    return gate_events("shop", KEY)


@pytest.fixture(scope="module")
def legacy() -> list[EventBase]:
    return gate_events("legacy", None)


class TestRequireSigned:
    """The real command over a real store built from real gates' events."""

    def test_a_signed_producer_passes(self, shop: list[EventBase], tmp_path: Path) -> None:
        """One signing gate, closed, its checkpoints verified: exit 0 with `signed` passing."""
        db = signed_store(tmp_path / "a.duckdb", shop)
        report = tmp_path / "report.json"
        done = callgate("coverage", "--db", str(db), "--require-signed", "--json", str(report))
        assert done.returncode == 0, done.stdout + done.stderr
        signed = next(c for c in json.loads(report.read_text())["checks"] if c["name"] == "signed")
        assert signed["status"] == "pass"
        assert "1 producer(s) signed" in signed["summary"]

    def test_a_producer_without_a_key_fails_as_unsigned(
        self, shop: list[EventBase], legacy: list[EventBase], tmp_path: Path
    ) -> None:
        """A second gate without a signing key: exit 1, the report names it and says unsigned."""
        db = signed_store(tmp_path / "a.duckdb", shop, legacy)
        report, junit = tmp_path / "report.json", tmp_path / "junit.xml"
        done = callgate(
            "coverage", "--db", str(db), "--require-signed", "--json", str(report), "--junit", str(junit)
        )  # fmt: skip
        assert done.returncode == 1, done.stdout + done.stderr
        assert "legacy" in done.stdout
        signed = next(c for c in json.loads(report.read_text())["checks"] if c["name"] == "signed")
        assert signed["status"] == "fail"
        assert signed["total"] == 1
        (row,) = signed["violations"]
        assert row["gate"] == "legacy"
        assert row["producer_id"] == legacy[0].producer_id
        assert row["reasons"] == ["unsigned"]
        assert "has no valid signed checkpoint" in row["detail"]
        root = ET.parse(junit).getroot()  # noqa: S314 (our own output)
        cases = root.findall(".//testcase[@classname='callgate.coverage.signed']")
        failing = [case for case in cases if case.find("failure") is not None]
        assert [case.get("name") for case in failing] == [f"legacy/{legacy[0].producer_id}"]
        assert "unsigned" in (failing[0].find("failure").get("message") or "")  # type: ignore[union-attr]

    def test_a_truncated_stream_fails_with_the_break_and_its_detail(
        self, shop: list[EventBase], tmp_path: Path
    ) -> None:
        """A stored checkpoint whose events are not all stored: exit 1, reasons name `truncated` with its detail."""
        kept = [e for e in shop if e.seq != 2]
        db = signed_store(tmp_path / "a.duckdb", kept)
        report = tmp_path / "report.json"
        done = callgate("coverage", "--db", str(db), "--require-signed", "--json", str(report))
        assert done.returncode == 1, done.stdout + done.stderr
        (signed,) = (c for c in json.loads(report.read_text())["checks"] if c["name"] == "signed")
        (row,) = signed["violations"]
        assert row["gate"] == "shop"
        assert "truncated" in row["reasons"]
        assert "truncated at seq" in row["detail"]
        assert "covers seqs 1.." in row["detail"]

    def test_without_the_option_the_same_store_passes(
        self, shop: list[EventBase], legacy: list[EventBase], tmp_path: Path
    ) -> None:
        """Without --require-signed the unsigned producer is no violation and `signed` is not listed,
        whether or not the store recorded its `unsigned` break (a signing state, not a chain whose
        content is in doubt: `tool_uses` does not count it); with the option it fails."""
        signed_store(tmp_path / "recorded.duckdb", shop, legacy, require_signed=True)
        done = callgate("coverage", "--db", str(tmp_path / "recorded.duckdb"))
        assert done.returncode == 0, done.stdout + done.stderr
        db = signed_store(tmp_path / "a.duckdb", shop, legacy, require_signed=False)
        report = tmp_path / "report.json"
        done = callgate("coverage", "--db", str(db), "--json", str(report))
        assert done.returncode == 0, done.stdout + done.stderr
        assert "signed" not in {c["name"] for c in json.loads(report.read_text())["checks"]}
        done = callgate("coverage", "--db", str(db), "--require-signed", "--json", str(report))
        assert done.returncode == 1, done.stdout + done.stderr
        (signed,) = (c for c in json.loads(report.read_text())["checks"] if c["name"] == "signed")
        assert [(row["gate"], row["reasons"]) for row in signed["violations"]] == [("legacy", ["unsigned"])]


@pytest.fixture
def served(shop: list[EventBase], legacy: list[EventBase], tmp_path: Path) -> Iterator[str]:
    """The two-gate store held for writing and served by the read API as the materializer serves it."""
    db = signed_store(tmp_path / "a.duckdb", shop, legacy)
    store = AuditStore(db)
    server = ApiServer(build_app(StoreQueryRunner(store), MaterializerMetrics(), lambda: HealthStatus(True)), port=0)
    try:
        with server:
            yield server.url
    finally:
        store.close()


class TestThroughTheApi:
    """The check reads through the named query, so the read API answers it too."""

    def test_run_checks_through_the_api(self, served: str, legacy: list[EventBase]) -> None:
        """Through a live read API the unsigned producer fails `signed`."""
        with ApiReader(served) as reader:
            report = run_checks(reader, require_signed=True)
        signed = report.check("signed")
        assert not signed.ok
        assert [row["gate"] for row in signed.violations] == ["legacy"]
        assert report.exit_code == 1

    def test_cli_through_the_api(self, served: str) -> None:
        """`callgate coverage --api URL --require-signed` exits 1 naming the unsigned gate."""
        done = callgate("coverage", "--api", served, "--require-signed")
        assert done.returncode == 1, done.stdout + done.stderr
        assert "legacy" in done.stdout


class _OlderApi:
    """A reader in front of a store older than signed checkpoints: it knows no `producer_signatures`."""

    def __init__(self, inner: ApiReader) -> None:
        self.inner = inner
        self.source = inner.source

    def query(self, name: str, params: Mapping[str, Any] | None = None) -> QueryResult:
        if name == "producer_signatures":
            raise UnknownQueryError(f"unknown query {name!r}", query=name)
        return self.inner.query(name, params)

    def close(self) -> None:
        self.inner.close()


class TestOlderStores:
    """Asking for signatures of a store that cannot have them is "cannot check", never clean."""

    def test_a_reader_without_the_query_cannot_check(self, served: str) -> None:
        """`SignaturesUnavailableError`, naming the source, says the store is older than signed checkpoints."""
        with (
            ApiReader(served) as inner,
            pytest.raises(SignaturesUnavailableError, match="no signed checkpoint tables") as raised,
        ):
            run_checks(_OlderApi(inner), require_signed=True)
        assert raised.value.source == served

    def test_a_file_before_signed_checkpoints_is_exit_2(self, tmp_path: Path, older_store: Any) -> None:
        """A store file of schema 4 (no checkpoint tables) with --require-signed: exit 2, said in one line."""
        db = tmp_path / "old.duckdb"
        older_store(db, 4)
        done = callgate("coverage", "--db", str(db), "--require-signed")
        assert done.returncode == 2, done.stdout + done.stderr
        assert done.stderr.strip().count("\n") == 0
        assert "has no signed checkpoint tables" in done.stderr


def test_the_chain_breaks_query_takes_every_kind_the_store_records() -> None:
    """The named query's `kind` choices are the kinds the metrics (and the store) know."""
    from consumers.metrics import CHAIN_BREAK_KINDS
    from consumers.queries import QUERIES

    assert set(QUERIES["chain_breaks"].params["kind"].choices or ()) == set(CHAIN_BREAK_KINDS)
