"""`callgate replay`: exit codes 0 / 1 / 2, the tables, --json and --junit, over real stores and a live
read API."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from callgate.broker import free_port
from callgate.cli import app
from callgate.replay import parse_share, parse_time, run_replay
from consumers import AuditStore, RawRecord
from consumers.api import ApiServer, HealthStatus, build_app
from consumers.metrics import MaterializerMetrics
from consumers.runner import StoreQueryRunner
from events import MemorySink, encode_event
from interceptor_core import Gate, RunContext, tool
from interceptor_core.policy import Policy

runner = CliRunner()
WIDE = {"COLUMNS": "200"}
ACME = RunContext(tenant="acme", principal="u-1")

DESK = """version: 1
name: desk
rules:
  - id: tenant-orders
    tools: [refund]
    when: "!args.order_id.startsWith(run.tenant.upperAscii() + '-')"
    decision: deny
"""
STRICTER = (
    DESK + '  - id: small-refunds\n    tools: [refund]\n    when: "args.amount_cents > 5000"\n    decision: deny\n'
)
LOOSER = "version: 1\nname: desk\nrules: []\n"


@tool
def refund(order_id: str, amount_cents: int) -> str:
    """Refunds an order."""
    return "refunded"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Ten refunds recorded through desk: eight allowed (two of them over 5000), two cross-tenant denied."""
    sink = MemorySink()
    desk = Gate("shop", interceptors=[Policy.from_text(DESK)], sinks=[sink]).agent("desk", tools=[refund])

    async def work() -> None:
        for i in range(8):
            await desk.call("refund", {"order_id": f"ACME-{i}", "amount_cents": 9000 if i < 2 else 100}, run=ACME)
        for i in range(2):
            await desk.call("refund", {"order_id": f"GLOBEX-{i}", "amount_cents": 100}, run=ACME)

    asyncio.run(work())
    path = tmp_path_factory.mktemp("replay") / "audit.duckdb"
    records = [
        RawRecord("callgate.events", 0, i, e.producer_id.encode(), encode_event(e)) for i, e in enumerate(sink.events)
    ]
    with AuditStore(path) as audit:
        audit.ingest(records, {("callgate.events", 0): len(records)})
    return path


def policy_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / f"candidate-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(text)
    return path


def cli(*args: str) -> Any:
    return runner.invoke(app, ["replay", *args], env=WIDE)


class TestExitCodes:
    """0 within the limits, 1 past them, 2 when it cannot check."""

    def test_the_policy_that_decided_passes(self, store: Path, tmp_path: Path) -> None:
        """The recorded version replayed over its own calls: exit 0, all unchanged."""
        result = cli("--policy", str(policy_file(tmp_path, DESK)), "--db", str(store))
        assert result.exit_code == 0, result.output
        assert "replay passes: 10 calls checked, 10 unchanged" in result.output

    def test_a_policy_that_breaks_traffic_fails(self, store: Path, tmp_path: Path) -> None:
        """Two of ten newly denied: exit 1, the rule named; within --max-new-blocks 20% it passes."""
        candidate = str(policy_file(tmp_path, STRICTER))
        result = cli("--policy", candidate, "--db", str(store))
        assert result.exit_code == 1, result.output
        assert "small-refunds" in result.output
        assert "newly_denied" in result.output
        assert "replay FAILS" in result.output
        assert cli("--policy", candidate, "--db", str(store), "--max-new-blocks", "20%").exit_code == 0
        assert cli("--policy", candidate, "--db", str(store), "--max-new-blocks", "0.19").exit_code == 1

    def test_new_allows_fail_only_when_asked(self, store: Path, tmp_path: Path) -> None:
        """A policy without the tenant rule lets two denied calls through: exit 0, or 1 with --fail-on-new-allows."""
        candidate = str(policy_file(tmp_path, LOOSER))
        assert cli("--policy", candidate, "--db", str(store)).exit_code == 0
        result = cli("--policy", candidate, "--db", str(store), "--fail-on-new-allows")
        assert result.exit_code == 1
        assert "newly_allowed" in result.output

    def test_an_empty_window_cannot_tell(self, store: Path, tmp_path: Path) -> None:
        """No stored call matches the filters: exit 2, nothing to replay."""
        result = cli("--policy", str(policy_file(tmp_path, DESK)), "--db", str(store), "--tool", "nothing")
        assert result.exit_code == 2
        assert "nothing to replay" in result.output

    def test_a_policy_with_problems(self, store: Path, tmp_path: Path) -> None:
        """An unreadable policy: exit 2 with FILE:LINE rule-id: what is wrong; a missing one likewise."""
        bad = policy_file(tmp_path, DESK.replace("decision: deny", "decision: refuse"))
        result = cli("--policy", str(bad), "--db", str(store))
        assert result.exit_code == 2
        assert f"{bad}:7 tenant-orders: decision must be one of" in result.output
        missing = cli("--policy", str(tmp_path / "none.yaml"), "--db", str(store))
        assert missing.exit_code == 2
        assert "cannot read" in missing.output

    def test_bad_options(self, store: Path, tmp_path: Path) -> None:
        """A share outside [0, 1], an unreadable time, both or neither candidate or source: exit 2, one line."""
        candidate = str(policy_file(tmp_path, DESK))
        for args, text in (
            (["--policy", candidate, "--db", str(store), "--max-new-blocks", "lots"], "--max-new-blocks 'lots'"),
            (["--policy", candidate, "--db", str(store), "--max-new-blocks", "2"], "in [0, 1]"),
            (["--policy", candidate, "--db", str(store), "--since", "yesterday"], "--since 'yesterday'"),
            (["--policy", candidate, "--db", str(store), "--until", "soon"], "--until 'soon'"),
            (["--db", str(store)], "exactly one of --policy"),
            (["--policy", candidate, "--interceptor", "m:a", "--db", str(store)], "exactly one of --policy"),
            (["--policy", candidate], "exactly one of --api"),
        ):
            result = cli(*args)
            assert result.exit_code == 2, args
            assert text in result.output
            assert len(result.output.strip().splitlines()) == 1

    def test_a_missing_store(self, tmp_path: Path) -> None:
        """No file at --db: exit 2 saying so."""
        result = cli("--policy", str(policy_file(tmp_path, DESK)), "--db", str(tmp_path / "none.duckdb"))
        assert result.exit_code == 2
        assert "does not exist" in result.output

    def test_a_store_held_by_a_materializer(self, store: Path, tmp_path: Path) -> None:
        """A store another process holds for writing: exit 2, and the message says to use --api."""
        held = tmp_path / "held.duckdb"
        held.write_bytes(store.read_bytes())
        holder = subprocess.Popen(
            [sys.executable, "-c", f"from consumers import AuditStore; s = AuditStore({str(held)!r}); print('ready', "
             "flush=True); input()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )  # fmt: skip
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline().strip() == b"ready"
            result = cli("--policy", str(policy_file(tmp_path, DESK)), "--db", str(held))
        finally:
            holder.communicate(b"\n", timeout=30)
        assert result.exit_code == 2
        assert "--api" in result.output

    def test_an_api_that_is_down(self, tmp_path: Path) -> None:
        """Nothing listening at --api: exit 2 naming the URL."""
        url = f"http://127.0.0.1:{free_port()}"
        result = cli("--policy", str(policy_file(tmp_path, DESK)), "--api", url)
        assert result.exit_code == 2
        assert url in result.output


class TestReports:
    """--json writes the whole report, --junit one case per rule."""

    def test_json_and_junit(self, store: Path, tmp_path: Path) -> None:
        """Both files are written; their verdict is the exit code's."""
        json_path, junit_path = tmp_path / "replay.json", tmp_path / "replay.xml"
        result = cli(
            "--policy", str(policy_file(tmp_path, STRICTER)), "--db", str(store),
            "--json", str(json_path), "--junit", str(junit_path), "--since", "all",
        )  # fmt: skip
        assert result.exit_code == 1
        data = json.loads(json_path.read_text())
        assert data["exit_code"] == 1
        assert data["checked"] == 10
        assert data["changes"]["newly_denied"]["count"] == 2
        assert data["changes"]["newly_denied"]["by_rule"] == {"small-refunds": 2}
        assert len(data["changes"]["newly_denied"]["sample_call_ids"]) == 2
        assert data["candidate"]["name"] == "desk"
        assert data["window"]["since"] is None
        suite = ET.fromstring(junit_path.read_text()).find("testsuite")  # noqa: S314 (our own output)
        assert suite is not None
        verdicts = {c.get("name"): c.find("failure") is not None for c in suite.findall("testcase")}
        assert verdicts == {"tenant-orders": False, "small-refunds": True, "(default)": False, "(all rules)": True}

    def test_the_default_window_is_a_week(self, store: Path, tmp_path: Path) -> None:
        """Without --since the report's window starts seven days back."""
        json_path = tmp_path / "replay.json"
        cli("--policy", str(policy_file(tmp_path, DESK)), "--db", str(store), "--json", str(json_path))
        assert parse_time("7d", "--since") is not None
        since = json.loads(json_path.read_text())["window"]["since"]
        assert since is not None
        assert since < (parse_time("6d", "--since") or since).isoformat()


class TestInterceptorCandidates:
    """--interceptor MODULE:ATTR imports an interceptor (or a factory of one)."""

    def test_a_python_interceptor(self, store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """A module's interceptor denying big refunds: exit 1, the interceptor named as the rule."""
        module = f"candidates_{uuid.uuid4().hex[:8]}"
        (tmp_path / f"{module}.py").write_text(
            "from interceptor_core import Deny\n\n"
            "class BigRefunds:\n"
            "    name = 'big-refunds'\n\n"
            "    def before_tool_call(self, call):\n"
            "        return Deny('too big') if call.args['amount_cents'] > 5000 else None\n"
        )
        monkeypatch.syspath_prepend(str(tmp_path))
        json_path = tmp_path / "replay.json"
        result = cli("--interceptor", f"{module}:BigRefunds", "--db", str(store), "--json", str(json_path))
        assert result.exit_code == 1, result.output
        data = json.loads(json_path.read_text())
        assert data["candidate"] == {
            "kind": "interceptor",
            "name": "big-refunds",
            "version": None,
            "source": f"{module}:BigRefunds",
            "rules": ["big-refunds"],
        }
        assert data["changes"]["newly_denied"]["count"] == 2

    def test_a_module_that_fails_to_import(self, store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """A module raising while it is imported cannot be checked: exit 2, not a failed replay."""
        module = f"broken_{uuid.uuid4().hex[:8]}"
        (tmp_path / f"{module}.py").write_text("raise RuntimeError('no config')\n")
        monkeypatch.syspath_prepend(str(tmp_path))
        result = cli("--interceptor", f"{module}:Guard", "--db", str(store))
        assert result.exit_code == 2
        assert "RuntimeError: no config" in result.output

    def test_what_cannot_be_imported(self, store: Path) -> None:
        """A missing module, something that is not an interceptor, a factory that fails: exit 2, one line."""
        for spec, text in (
            ("no_such_module_here:X", "cannot import"),
            ("json:__name__", "neither before_tool_call"),
            ("json:dumps", "building the interceptor (calling it with no arguments) failed: TypeError"),
        ):
            result = cli("--interceptor", spec, "--db", str(store))
            assert result.exit_code == 2, spec
            assert text in result.output
            assert len(result.output.strip().splitlines()) == 1


class OlderRunner(StoreQueryRunner):
    """A read API of a materializer from before replay: every query but replay_calls."""

    def names(self) -> list[dict[str, Any]]:
        return [query for query in super().names() if query["name"] != "replay_calls"]

    def run(self, name: str, params: Any) -> dict[str, Any]:
        if name == "replay_calls":
            raise KeyError(name)
        return super().run(name, params)


@pytest.fixture
def served(store: Path, tmp_path: Path) -> Iterator[tuple[str, str, Path]]:
    """A copy of the store held for writing, served by a current read API and by an older one."""
    held = tmp_path / "served.duckdb"
    held.write_bytes(store.read_bytes())
    audit = AuditStore(held)
    metrics, health = MaterializerMetrics(), (lambda: HealthStatus(True))
    current = ApiServer(build_app(StoreQueryRunner(audit), metrics, health), port=0)
    older = ApiServer(build_app(OlderRunner(audit), MaterializerMetrics(), health), port=0)
    try:
        with current, older:
            yield current.url, older.url, held
    finally:
        audit.close()


class TestThroughTheApi:
    """--api replays through a running materializer's read API."""

    def test_the_api_answers_as_the_file(self, served: tuple[str, str, Path], tmp_path: Path) -> None:
        """Exit 1 for the stricter policy through the API; --db on the held file is exit 2."""
        url, _, held = served
        candidate = str(policy_file(tmp_path, STRICTER))
        result = cli("--policy", candidate, "--api", url)
        assert result.exit_code == 1, result.output
        assert "10 calls checked" in result.output
        assert cli("--policy", candidate, "--db", str(held)).exit_code == 2

    def test_an_api_without_the_replay_query(self, served: tuple[str, str, Path], tmp_path: Path) -> None:
        """A materializer older than replay: exit 2, saying it lacks replay_calls."""
        _, older, _ = served
        result = cli("--policy", str(policy_file(tmp_path, DESK)), "--api", older)
        assert result.exit_code == 2
        assert "no replay_calls query" in result.output


class TestOptions:
    """The option parsers and the progress bar."""

    def test_shares(self) -> None:
        """A share or a percentage, in [0, 1]."""
        assert parse_share("0") == 0.0
        assert parse_share("0.01") == 0.01
        assert parse_share("1%") == 0.01
        assert parse_share(" 100% ") == 1.0
        for text in ("-0.1", "1.5", "150%", "abc", ""):
            with pytest.raises(ValueError, match="--max-new-blocks"):
                parse_share(text)

    def test_times(self) -> None:
        """Durations, ISO times, and all."""
        assert parse_time("all", "--since") is None
        assert parse_time(None, "--until") is None
        found = parse_time("2026-11-30T09:00:00", "--until")
        assert found is not None
        assert found.isoformat() == "2026-11-30T09:00:00+00:00"

    def test_a_progress_bar_on_a_terminal(self, store: Path, tmp_path: Path) -> None:
        """With the bar forced on a terminal console the replay reports as usual."""
        out = StringIO()
        console = Console(file=out, force_terminal=True, width=200)
        code = run_replay(
            policy=policy_file(tmp_path, STRICTER), interceptor=None, db=store, api=None, since="all", until=None,
            gate=None, workflow=None, agent=None, tool=None, tenant=None, max_new_blocks="0",
            fail_on_new_allows=False, json_path=None, junit=None, console=console,
            err=Console(file=StringIO()), progress=True,
        )  # fmt: skip
        assert code == 1
        assert "replay FAILS" in out.getvalue()
