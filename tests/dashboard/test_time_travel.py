"""The sidebar's As of through Streamlit's AppTest: on a lake every page answers as the store was at
that time under a banner saying so, and keeps it across pages; on a DuckDB file the control is
disabled with the reason."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from consumers.lake import Lake, lake_from_options
from consumers.store import AuditStore, RawRecord
from events import EventBase, encode_event

from .conftest import BLOCKED_QUERIES, TOPIC, shop_events
from .test_app import metrics, open_app, shown_text


@dataclass(frozen=True)
class PastLake:
    """A lake whose denied calls were stored before `between` and its blocked ones after."""

    lake: Lake
    between: datetime
    before: list[EventBase]
    after: list[EventBase]

    def env(self) -> dict[str, str]:
        return {"CALLGATE_LAKE": self.lake.catalog, "CALLGATE_DATA": self.lake.data, "CALLGATE_TIMEZONE": "UTC"}


@pytest.fixture(scope="module")
def past_lake(tmp_path_factory: pytest.TempPathFactory, postgres_dsn: str) -> PastLake:
    database = f"lake_{uuid.uuid4().hex}"
    with psycopg.connect(postgres_dsn, autocommit=True) as con:
        con.execute(f'CREATE DATABASE "{database}"')
    catalog = "postgres:" + postgres_dsn.replace("dbname=postgres", f"dbname={database}")
    lake = lake_from_options(catalog, str(tmp_path_factory.mktemp("time_travel") / "data"))
    events = shop_events()
    cut = next(i for i, e in enumerate(events) if e.type == "Blocked")
    wire = [RawRecord(TOPIC, 0, i, e.producer_id.encode(), encode_event(e)) for i, e in enumerate(events)]
    with AuditStore(lake) as store:
        store.ingest(wire[:cut], {(TOPIC, 0): cut})
        between = datetime.now(UTC)
        store.ingest(wire[cut:], {(TOPIC, 0): len(wire)})
    return PastLake(lake, between, events[:cut], events[cut:])


@pytest.fixture(autouse=True)
def _no_stale_readers() -> Iterator[None]:
    """The app keeps one reader per store for its life: closed after each test."""
    yield
    from dashboard import ui

    ui._file_reader.clear()
    ui._lake_reader.clear()


def blocked_shown(past_lake: PastLake, monkeypatch: pytest.MonkeyPatch, **state: Any) -> Any:
    return open_app(past_lake.env(), monkeypatch, "blocked", window="Last 24 hours", **state)


class TestAsOf:
    # About 25 s on two busy cores: the page runs twice (now, then as of the time), each of its queries
    # reading the lake's catalog in PostgreSQL; the "now" run is what shows the hidden rows exist.
    def test_a_call_stored_after_the_time_is_hidden_under_a_banner(
        self, past_lake: PastLake, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """As of the time between the two batches, Blocked attempts lists the denials alone (the blocked
        calls came after) under the past-view banner; blank As of shows them all and no banner."""
        denied = sum(1 for e in past_lake.before if e.type == "ToolDenied")
        now = blocked_shown(past_lake, monkeypatch)
        assert metrics(now)["Blocked"] == str(len(BLOCKED_QUERIES))
        assert "Past view" not in shown_text(now)

        then = blocked_shown(past_lake, monkeypatch, as_of=past_lake.between.isoformat())
        assert metrics(then)["Blocked"] == "0"
        assert metrics(then)["Matching attempts"] == str(denied)
        (table,) = [df.value for df in then.dataframe]
        assert set(table["type"]) == {"denied"}  # the table names decisions in words
        assert len(table) == denied
        banner = " ".join(w.value for w in then.warning)
        assert f"as it was at {past_lake.between.strftime('%Y-%m-%d %H:%M:%S')} (UTC)" in banner
        assert then.query_params["as_of"] == past_lake.between.isoformat()

    def test_the_past_view_holds_across_pages(self, past_lake: PastLake, monkeypatch: pytest.MonkeyPatch) -> None:
        """Switched to Overview, the page still answers as of the time (no blocked call counted) and
        shows the banner; the sidebar still holds the time."""
        at = blocked_shown(past_lake, monkeypatch, as_of=past_lake.between.isoformat())
        at.switch_page("views/overview.py").run()
        assert not at.exception, [e.value for e in at.exception]
        assert metrics(at)["Blocked"] == "0"
        assert "Past view" in shown_text(at)
        assert at.sidebar.text_input(key="as_of").value == past_lake.between.isoformat()

    def test_a_time_that_is_no_time_stops_the_page_saying_so(
        self, past_lake: PastLake, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Text that is not a time is named in an error instead of answering as now."""
        at = blocked_shown(past_lake, monkeypatch, as_of="last tuesday")
        assert "As of is not a time" in shown_text(at)
        assert not at.dataframe

    def test_a_file_store_offers_no_as_of_and_says_why(
        self, seeded_store: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """On a DuckDB file the As of input is disabled, its caption says a file keeps no snapshots,
        and a time given anyway (an old link) is not applied."""
        at = open_app({"CALLGATE_DB": str(seeded_store.path)}, monkeypatch, as_of="2026-01-01T00:00:00Z")
        (control,) = [w for w in at.sidebar.text_input if w.label == "As of"]
        assert control.disabled
        assert "keeps no past snapshots" in " ".join(c.value for c in at.sidebar.caption)
        assert "Past view" not in shown_text(at)
