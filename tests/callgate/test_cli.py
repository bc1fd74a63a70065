"""The command line: describe and the demo tour."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from callgate.cli import app

runner = CliRunner()


class TestDescribe:
    def test_describe_prints_scopes_tools_and_chains(self) -> None:
        """describe MODULE:FACTORY shows each scope, each tool's inputs and its effective chain."""
        result = runner.invoke(app, ["describe", "callgate.demo:build_gate"], env={"COLUMNS": "200"})
        assert result.exit_code == 0, result.output
        assert "agent shop/support/desk" in result.output
        assert "refund(order_id: string, amount_cents: integer)" in result.output
        assert "normalize-order-id (application) -> tenant-orders (application, mandatory) -> refund-limit" in (
            result.output
        )

    def test_describe_shows_excludes(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """An exclude that applied is listed under the tool with the scope that made it."""
        (tmp_path / "my_gate.py").write_text(
            "from interceptor_core import Gate, tool, before_tool_call\n"
            "noisy = before_tool_call(name='noisy')(lambda call: None)\n"
            "@tool\n"
            "def ping() -> str:\n"
            "    return 'pong'\n"
            "gate = Gate('g', interceptors=[noisy])\n"
            "gate.agent('quiet', tools=[ping], exclude=['noisy'])\n"
        )
        monkeypatch.chdir(tmp_path)
        result = runner.invoke(app, ["describe", "my_gate:gate"], env={"COLUMNS": "200"})
        assert result.exit_code == 0, result.output
        assert "excluded noisy (application) by quiet" in result.output

    def test_describe_names_what_is_wrong(self) -> None:
        """A target that is not a gate is refused with its name."""
        result = runner.invoke(app, ["describe", "callgate.demo:ORDERS"])
        assert result.exit_code == 2
        assert "not a Gate" in result.output


def test_demo_shows_every_decision_and_the_bypass() -> None:
    """The tour runs every kind of decision and coverage catches its deliberate bypass."""
    result = runner.invoke(app, ["demo"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for outcome in ("ok", "denied", "substituted", "error", "blocked"):
        assert f"│ {outcome}" in result.output
    assert "1 unmediated accesses" in result.output
