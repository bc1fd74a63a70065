"""`callgate dashboard`'s checks before it starts anything, the configuration, and the pure helpers."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from callgate.cli import app
from callgate.dashboard import is_loopback, streamlit_command
from dashboard.config import ConfigurationError, DashboardConfig
from dashboard.data import BlockedFilters, Window, blocked_csv


class TestCommand:
    def test_needs_exactly_one_source(self, tmp_path: Path) -> None:
        """Neither --api nor --db, or both: exit 2 naming the two options."""
        runner = CliRunner()
        for args in ([], ["--api", "http://127.0.0.1:1", "--db", str(tmp_path / "a.duckdb")]):
            result = runner.invoke(app, ["dashboard", *args])
            assert result.exit_code == 2
            assert "--api URL or --db FILE" in result.output

    def test_refuses_a_public_address_without_the_flag(self, tmp_path: Path) -> None:
        """--host 0.0.0.0 without --allow-remote is refused with a message naming the flag."""
        result = CliRunner().invoke(app, ["dashboard", "--db", str(tmp_path / "a.duckdb"), "--host", "0.0.0.0"])  # noqa: S104 (refused)
        assert result.exit_code == 2
        assert "--allow-remote" in result.output

    def test_trusted_keys_that_hold_no_key_are_refused_before_starting(self, tmp_path: Path) -> None:
        """--trusted-keys naming a missing path, or a directory without a .pub file: exit 2 naming the option."""
        (tmp_path / "empty").mkdir()
        for keys in (tmp_path / "missing", tmp_path / "empty"):
            result = CliRunner().invoke(
                app, ["dashboard", "--db", str(tmp_path / "a.duckdb"), "--trusted-keys", str(keys)]
            )
            assert result.exit_code == 2
            assert "--trusted-keys" in result.output

    def test_an_unknown_timezone_is_refused_before_starting(self, tmp_path: Path) -> None:
        """--timezone naming no IANA zone: exit 2 naming the option."""
        result = CliRunner().invoke(app, ["dashboard", "--db", str(tmp_path / "a.duckdb"), "--timezone", "Mars/Base"])
        assert result.exit_code == 2
        assert "--timezone" in result.output

    def test_streamlit_runs_headless_on_loopback_without_usage_statistics(self) -> None:
        """The child command is headless, bound where asked, statistics off."""
        command = streamlit_command("127.0.0.1", 8600)
        assert command[1:4] == ["-m", "streamlit", "run"]
        assert command[4].endswith("dashboard/serve.py")
        for option in ("--server.headless=true", "--server.address=127.0.0.1", "--server.port=8600"):
            assert option in command
        assert "--browser.gatherUsageStats=false" in command

    @pytest.mark.parametrize(
        ("host", "loopback"),
        [("127.0.0.1", True), ("localhost", True), ("::1", True), ("0.0.0.0", False), ("10.1.2.3", False)],  # noqa: S104
    )
    def test_is_loopback(self, host: str, loopback: bool) -> None:
        """Only loopback addresses count as loopback."""
        assert is_loopback(host) is loopback


class TestConfig:
    @pytest.mark.parametrize(
        ("env", "culprit"),
        [
            ({"CALLGATE_API": "127.0.0.1:8765"}, "CALLGATE_API"),
            ({"CALLGATE_DB": "a.duckdb", "CALLGATE_DASHBOARD_REFRESH_S": "soon"}, "CALLGATE_DASHBOARD_REFRESH_S"),
            ({"CALLGATE_DB": "a.duckdb", "CALLGATE_DASHBOARD_REFRESH_S": "0"}, "CALLGATE_DASHBOARD_REFRESH_S"),
            ({"CALLGATE_DB": "a.duckdb", "CALLGATE_TRACE_URL": "javascript:{trace_id}"}, "CALLGATE_TRACE_URL"),
            ({"CALLGATE_DB": "a.duckdb", "CALLGATE_TRACE_URL": "https://jaeger/trace/"}, "CALLGATE_TRACE_URL"),
            ({"CALLGATE_DB": "a.duckdb", "CALLGATE_REQUIRE_SIGNED": "maybe"}, "CALLGATE_REQUIRE_SIGNED"),
            ({"CALLGATE_DB": "a.duckdb", "CALLGATE_TIMEZONE": "../../etc/passwd"}, "CALLGATE_TIMEZONE"),
        ],
    )
    def test_bad_settings_name_the_variable(self, env: dict[str, str], culprit: str) -> None:
        """Each bad setting raises ConfigurationError naming its variable."""
        with pytest.raises(ConfigurationError) as caught:
            DashboardConfig.from_env(env)
        assert caught.value.variable == culprit
        assert culprit in str(caught.value)

    def test_signing_settings(self) -> None:
        """The trusted keys' path is kept as given; CALLGATE_REQUIRE_SIGNED is off unless set to 1."""
        plain = DashboardConfig.from_env({"CALLGATE_DB": "a.duckdb"})
        assert (plain.trusted_keys, plain.require_signed) == (None, False)
        signed = DashboardConfig.from_env(
            {"CALLGATE_DB": "a.duckdb", "CALLGATE_TRUSTED_KEYS": "/keys", "CALLGATE_REQUIRE_SIGNED": "1"}
        )
        assert (signed.trusted_keys, signed.require_signed) == ("/keys", True)

    def test_trace_link_only_from_hex_ids(self) -> None:
        """A 32-hex trace id fills the template; anything else makes no link."""
        cfg = DashboardConfig(db="a.duckdb")
        assert cfg.trace_link("0af7651916cd43dd8448eb211c80319c") == (
            "http://localhost:16686/trace/0af7651916cd43dd8448eb211c80319c"
        )
        for bad in (None, "", "0AF7", "javascript:alert(1)", "0af7651916cd43dd8448eb211c80319c/../x"):
            assert cfg.trace_link(bad) is None


class TestData:
    def test_window_rounds_its_start_and_picks_round_buckets(self) -> None:
        """A named window starts a whole refresh period back; buckets are round widths; all time has no start."""
        now = datetime(2024, 5, 1, 12, 0, 7, tzinfo=UTC)
        hour = Window.named("Last hour", now=now, step_s=5)
        assert hour.since == datetime(2024, 5, 1, 11, 0, 5, tzinfo=UTC)
        assert hour.bucket_minutes() == 1
        assert Window.named("Last 7 days", now=now).bucket_minutes() == 180
        everything = Window.named("All time")
        assert (everything.since, everything.params(), everything.compares) == (None, {}, False)
        with pytest.raises(ValueError, match="'Last year'"):
            Window.named("Last year")

    def test_csv_defuses_formulas_and_pages_through_everything(self) -> None:
        """Cells a spreadsheet would run as formulas get a leading apostrophe; every page is fetched."""
        rows = [{"message": '=HYPERLINK("https://evil.example")', "tool": "t", "call_id": f"c{i}"} for i in range(2500)]
        asked: list[dict[str, Any]] = []

        def query(name: str, params: Any) -> list[dict[str, Any]]:
            asked.append(dict(params))
            return rows[params["offset"] : params["offset"] + params["limit"]]

        parsed = list(csv.DictReader(io.StringIO(blocked_csv(query, BlockedFilters(tenant=" acme ")))))
        assert len(parsed) == 2500
        assert parsed[0]["message"].startswith("'=HYPERLINK")
        assert [a["offset"] for a in asked] == [0, 1000, 2000]
        assert asked[0]["tenant"] == "acme"
