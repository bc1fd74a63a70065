"""The command line: describe, the demo tour and the materializer's read API binding."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from click.testing import Result
from typer.testing import CliRunner

from callgate.broker import EmbeddedBroker
from callgate.cli import app

runner = CliRunner()


class TestDescribe:
    def test_describe_prints_scopes_tools_and_chains(self) -> None:
        """describe MODULE:FACTORY shows each scope, each tool's inputs and its effective chain."""
        result = runner.invoke(app, ["describe", "callgate.demo:build_gate"], env={"COLUMNS": "200"})
        assert result.exit_code == 0, result.output
        assert "agent shop/support/desk" in result.output
        assert "refund(order_id: string, amount_cents: integer)" in result.output
        assert (
            "normalize-order-id (application) -> desk-policy (application, mandatory) -> internal-notes"
            in result.output
        )
        # A policy's rules are listed under its place in each chain, those of that tool only.
        assert "big-refunds: require_approval when args.amount_cents > 20000" in result.output
        assert "support_desk.policy.yaml" in result.output

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


def test_tour_shows_every_decision_and_the_bypass() -> None:
    """The tour runs every kind of decision and coverage catches its deliberate bypass."""
    result = runner.invoke(app, ["tour"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for outcome in ("ok", "denied", "substituted", "error", "blocked"):
        assert f"│ {outcome}" in result.output
    assert "1 unmediated accesses" in result.output


@pytest.mark.parametrize("limit", ["abc", ""])
def test_a_memory_limit_duckdb_cannot_read_exits_2_naming_it(tmp_path: Path, limit: str) -> None:
    """`CALLGATE_DUCKDB_MEMORY_LIMIT` that is no size: one line naming the variable and its value, exit
    2, before any broker is contacted (nothing listens at the bootstrap given). A fresh process: the
    store reads the variable when it is imported."""
    db = tmp_path / "audit.duckdb"
    result = subprocess.run(
        [sys.executable, "-c", "from callgate.cli import main; main()", "materialize", "--bootstrap", "127.0.0.1:1",
         "--topic", "t", "--db", str(db), "--drain"],
        env={**os.environ, "CALLGATE_DUCKDB_MEMORY_LIMIT": limit},
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        f"error: CALLGATE_DUCKDB_MEMORY_LIMIT={limit!r} is not a memory size DuckDB reads (such as 256MB or 1GB)"
    ]


class TestMaterializeApiBinding:
    """`callgate materialize --api`: loopback by default, anything else only with authentication or
    --insecure-no-auth."""

    def test_non_loopback_api_is_refused_before_anything_starts(self, tmp_path: Path) -> None:
        """0.0.0.0 without --auth, --jwt-* or --insecure-no-auth exits 2 naming the host and the flags; no
        store file is created and no broker is contacted (nothing listens at the bootstrap given)."""
        db = tmp_path / "audit.duckdb"
        result = runner.invoke(
            app,
            ["materialize", "--bootstrap", "127.0.0.1:1", "--db", str(db), "--api", "0.0.0.0:8765"],
            env={"COLUMNS": "200"},
        )
        assert result.exit_code == 2, result.output
        assert "--api 0.0.0.0:8765 binds 0.0.0.0" in result.stderr
        assert "--auth FILE" in result.stderr
        assert "--insecure-no-auth" in result.stderr
        assert not db.exists()

    def test_a_service_name_is_not_loopback_either(self, tmp_path: Path) -> None:
        """A host name other than localhost (a container's name, say) is refused the same way."""
        result = runner.invoke(
            app,
            ["materialize", "--bootstrap", "127.0.0.1:1", "--db", str(tmp_path / "a.duckdb"), "--api", "store:8765"],
        )
        assert result.exit_code == 2, result.output
        assert "binds store, which is not a loopback address" in result.stderr

    @staticmethod
    def drain_serving(broker: EmbeddedBroker, tmp_path: Path, api: str, *extra: str) -> Result:
        """`callgate materialize --drain` of a topic nobody wrote to, serving the read API on `api`."""
        topic = f"never-published-{uuid.uuid4().hex[:8]}"
        db = str(tmp_path / "audit.duckdb")
        args = ["materialize", "--bootstrap", broker.bootstrap, "--topic", topic, "--db", db, "--api", api]
        return runner.invoke(app, [*args, *extra, "--drain"])

    def test_insecure_no_auth_binds_every_interface_and_warns(
        self, kafka_broker: EmbeddedBroker, tmp_path: Path
    ) -> None:
        """With --insecure-no-auth the API serves on 0.0.0.0 and stderr warns that it has no authentication."""
        result = self.drain_serving(kafka_broker, tmp_path, "0.0.0.0:0", "--insecure-no-auth")
        assert result.exit_code == 0, result.output
        assert "read API at http://0.0.0.0:" in result.stdout
        assert "warning: serving the read API on 0.0.0.0" in result.stderr
        assert "without authentication (--insecure-no-auth)" in result.stderr
        assert "materialized 0 records" in result.stdout

    def test_allow_remote_is_the_old_name_of_insecure_no_auth(
        self, kafka_broker: EmbeddedBroker, tmp_path: Path
    ) -> None:
        """--allow-remote still serves without authentication, saying it is the old name."""
        result = self.drain_serving(kafka_broker, tmp_path, "0.0.0.0:0", "--allow-remote")
        assert result.exit_code == 0, result.output
        assert "--allow-remote is the old name of --insecure-no-auth" in result.stderr
        assert "without authentication (--insecure-no-auth)" in result.stderr

    def test_auth_binds_every_interface_and_warns_without_tls(
        self, kafka_broker: EmbeddedBroker, tmp_path: Path
    ) -> None:
        """With --auth the API serves on 0.0.0.0; without TLS stderr warns that tokens cross in clear."""
        tokens = tmp_path / "tokens.yaml"
        tokens.write_text("tokens: []\n")
        result = self.drain_serving(kafka_broker, tmp_path, "0.0.0.0:0", "--auth", str(tokens))
        assert result.exit_code == 0, result.output
        assert "without TLS: bearer tokens cross the network in clear" in result.stderr

    def test_loopback_api_needs_no_flag_and_gets_no_warning(self, kafka_broker: EmbeddedBroker, tmp_path: Path) -> None:
        """The default, loopback, runs as before: no flag, nothing on stderr about remote access."""
        result = self.drain_serving(kafka_broker, tmp_path, "127.0.0.1:0")
        assert result.exit_code == 0, result.output
        assert "read API at http://127.0.0.1:" in result.stdout
        assert "warning" not in result.stderr
