"""`callgate policy check|test|explain`: exit codes, messages and reports, with no tool run."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from typer.testing import CliRunner

from callgate.cli import app
from callgate.demo import POLICY_FILE

runner = CliRunner()
CASES_FILE = POLICY_FILE.with_name("support_desk.cases.yaml")
WIDE = {"COLUMNS": "200"}

GOOD = """\
version: 1
name: refunds
rules:
  - id: tenant-orders
    tools: [refund]
    when: "!args.order_id.startsWith(run.tenant.upperAscii() + '-')"
    decision: deny
    message: "Order {args.order_id} is not {run.tenant}'s."
  - id: upper
    tools: [refund]
    decision: rewrite
    when: "args.order_id != args.order_id.upperAscii()"
    set: {order_id: "args.order_id.upperAscii()"}
"""

SCHEMA = "    schema: {type: object, properties: {order_id: {type: string}, amount_cents: {type: integer}}}\n"


class TestCheck:
    """`policy check FILE...` lints policy files."""

    def test_a_good_file_prints_one_line_with_rules_and_version(self, tmp_path: Path) -> None:
        """Exit 0 and one line naming the file, its rule count and its version."""
        (tmp_path / "p.yaml").write_text(GOOD)
        result = runner.invoke(app, ["policy", "check", str(tmp_path / "p.yaml"), str(POLICY_FILE)], env=WIDE)
        assert result.exit_code == 0, result.output
        lines = result.output.strip().splitlines()
        assert len(lines) == 2
        assert "2 rules" in lines[0]
        assert "5 rules" in lines[1]

    def test_problems_exit_2_with_file_line_and_rule(self, tmp_path: Path) -> None:
        """Exit 2 with `FILE:LINE rule-id: what is wrong` for each problem, on stderr."""
        bad = tmp_path / "bad.yaml"
        bad.write_text(
            GOOD.replace("decision: deny", "decision: refuse").replace("run.tenant.upper", "run.tenat.upper")
        )
        result = runner.invoke(app, ["policy", "check", str(bad)], env=WIDE)
        assert result.exit_code == 2
        assert f"{bad}:7 tenant-orders: decision must be one of" in result.stderr
        assert f"{bad}:6 tenant-orders: run has no field 'tenat'" in result.stderr

    def test_tools_are_checked_when_given(self) -> None:
        """With --tools, a rule reading an argument the real tool lacks is a problem."""
        result = runner.invoke(app, ["policy", "check", str(POLICY_FILE), "--tools", "callgate.demo:build_gate"])
        assert result.exit_code == 0, result.output


MANIFEST = """\
tools:
  - name: read_file
    inputSchema: {type: object, properties: {path: {type: string}}}
  - name: refund
    inputSchema: {type: object, properties: {order_id: {type: string}, amount_cents: {type: integer}}}
"""


def check_with_manifest(tmp_path: Path, rules: str) -> tuple[int, str]:
    """`policy check` of a file with these rules against MANIFEST's tools: exit code and stderr."""
    (tmp_path / "tools.yaml").write_text(MANIFEST)
    (tmp_path / "p.yaml").write_text("version: 1\nname: p\nrules:\n" + rules)
    result = runner.invoke(
        app, ["policy", "check", str(tmp_path / "p.yaml"), "--tools", str(tmp_path / "tools.yaml")], env=WIDE
    )
    return result.exit_code, result.stderr


class TestCheckMistakes:
    """`policy check` reports, with file and line, every mistake it can know before a call runs."""

    def test_a_misspelt_field_behind_has_is_reported(self, tmp_path: Path) -> None:
        """`has(args.pth) && ...` never fires when no tool of the rule has `pth`."""
        code, errors = check_with_manifest(
            tmp_path,
            "  - id: etc\n    tools: [read_file]\n    when: \"has(args.pth) && args.pth.startsWith('/etc')\"\n"
            "    decision: deny\n",
        )
        assert code == 2
        assert "p.yaml:4 etc: args.pth: no tool of this rule has such an argument" in errors

    def test_a_field_some_tool_of_the_rule_has_may_be_guarded(self, tmp_path: Path) -> None:
        """A rule over both tools may guard `path`, which read_file has: no problem."""
        code, errors = check_with_manifest(
            tmp_path, "  - id: etc\n    when: \"has(args.path) && args.path.startsWith('/etc')\"\n    decision: deny\n"
        )
        assert code == 0, errors

    def test_tool_globs_matching_no_tool_are_reported(self, tmp_path: Path) -> None:
        """A rule's tool glob and a count_calls glob that match no tool are both named."""
        code, errors = check_with_manifest(
            tmp_path,
            "  - id: rate\n    tools: [refnd, refund]\n"
            "    when: \"count_calls('refnd*', 'tenant', duration('1h')) > 5\"\n    decision: deny\n",
        )
        assert code == 2
        assert "rate: tool glob 'refnd' matches no tool" in errors
        assert "rate: count_calls tool glob 'refnd*' matches no tool" in errors

    def test_a_number_compared_with_text_is_reported(self, tmp_path: Path) -> None:
        """`args.amount_cents > '10000'` compares an integer argument with text."""
        code, errors = check_with_manifest(
            tmp_path,
            "  - id: big\n    tools: [refund]\n    when: \"args.amount_cents > '10000'\"\n    decision: deny\n",
        )
        assert code == 2
        assert "big: args.amount_cents is a number in tool refund, compared with the text '10000'" in errors

    def test_a_field_no_tool_has_is_reported_without_suggesting_has(self, tmp_path: Path) -> None:
        """An unguarded field missing from the only tool of the rule: no advice to guard it with has()."""
        code, errors = check_with_manifest(
            tmp_path, "  - id: p\n    tools: [read_file]\n    when: \"args.pth == ''\"\n    decision: deny\n"
        )
        assert code == 2
        assert "args.pth: tool read_file has no such argument (it has: path)" in errors
        assert "has(" not in errors

    @pytest.mark.parametrize(
        ("when", "expected"),
        [
            ("count_calls('refund', 'tenantt', duration('1h')) > 5", "count_calls key 'tenantt' does not exist"),
            ("count_calls('refund', 'tenant', '48h') > 5", "count_calls window '48h' is text: write duration('48h')"),
            ("count_calls('refund', 'tenant') > 5", "count_calls takes 3 arguments"),
            ("sql_writes(args.q, 'postgress')", "sql_writes: dialect 'postgress'"),
            ("!host_in(args.url, ['https://example.com'])", "host_in entry 'https://example.com' is not a host"),
            ("!within(args.path)", "within takes 2 arguments"),
            ("has_secrets(args, args)", "has_secrets takes 1 argument (the value to look in), got 2"),
        ],
    )
    def test_built_in_arguments_that_cannot_be_right_are_named(self, tmp_path: Path, when: str, expected: str) -> None:
        """A wrong key, a window as text, an unknown dialect, a host with a scheme, a wrong argument count."""
        (tmp_path / "p.yaml").write_text(
            f'version: 1\nname: p\nrules:\n  - id: r\n    when: "{when}"\n    decision: deny\n'
        )
        result = runner.invoke(app, ["policy", "check", str(tmp_path / "p.yaml")], env=WIDE)
        assert result.exit_code == 2
        assert f"p.yaml:5 r: {expected}" in result.stderr


class TestTest:
    """`policy test POLICY CASES...` runs cases without running any tool."""

    def test_the_demo_policys_cases_pass_in_a_real_process(self, tmp_path: Path) -> None:
        """The shipped cases pass through the console entry point, and the JUnit file lists each."""
        junit = tmp_path / "junit.xml"
        completed = subprocess.run(
            [
                *(sys.executable, "-c", "from callgate.cli import main; main()", "policy", "test"),
                *(str(POLICY_FILE), str(CASES_FILE), "--tools", "callgate.demo:build_gate", "--junit", str(junit)),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert completed.returncode == 0, completed.stdout + completed.stderr
        suite = ET.parse(junit).getroot().find("testsuite")  # noqa: S314 (our own output)
        assert suite is not None
        assert suite.get("failures") == "0"
        assert int(suite.get("tests") or 0) == CASES_FILE.read_text().count("- name:")

    def test_a_failing_case_exits_1_with_expected_got_and_rules(self, tmp_path: Path) -> None:
        """A wrong expectation exits 1 naming expected against got and the rules that matched."""
        (tmp_path / "p.yaml").write_text(GOOD)
        (tmp_path / "cases.yaml").write_text(
            "cases:\n"
            "  - name: globex refund\n    tool: refund\n    args: {order_id: globex-1, amount_cents: 5}\n"
            "    run: {tenant: acme}\n    expect: allow\n" + SCHEMA
        )
        junit = tmp_path / "j.xml"
        result = runner.invoke(
            app,
            ["policy", "test", str(tmp_path / "p.yaml"), str(tmp_path / "cases.yaml"), "--junit", str(junit)],
            env=WIDE,
        )
        assert result.exit_code == 1, result.output
        assert "expected allow, got deny" in result.output
        assert "rules matched: upper (rewrite), tenant-orders (deny)" in result.output
        failure = ET.parse(junit).getroot().find("testsuite/testcase/failure")  # noqa: S314 (our own output)
        assert failure is not None
        assert "expected allow, got deny" in (failure.get("message") or "")

    def test_rewrites_are_checked_against_the_cases_schema(self, tmp_path: Path) -> None:
        """args_after sees the rewritten arguments; a set on a field the schema lacks fails the case."""
        (tmp_path / "p.yaml").write_text(GOOD)
        (tmp_path / "cases.yaml").write_text(
            "cases:\n"
            "  - name: ids are upper-cased\n    tool: refund\n    args: {order_id: acme-1, amount_cents: 5}\n"
            "    run: {tenant: acme}\n    expect: allow\n    args_after: {order_id: ACME-1, amount_cents: 5}\n"
            + SCHEMA
            + "  - name: a schema without order_id\n    tool: refund\n    args: {amount_cents: 5}\n"
            "    run: {tenant: acme}\n    expect: allow\n    schema: {type: object, properties: {amount_cents: {}}}\n"
        )
        result = runner.invoke(
            app, ["policy", "test", str(tmp_path / "p.yaml"), str(tmp_path / "cases.yaml")], env=WIDE
        )
        assert result.exit_code == 1
        assert "pass ids are upper-cased" in result.output
        assert "set 'order_id': tool refund has no such argument" in result.output

    def test_it_cannot_run_without_cases_or_with_a_bad_cases_file(self, tmp_path: Path) -> None:
        """Exit 2 for a cases file with problems, and for no cases at all."""
        (tmp_path / "p.yaml").write_text(GOOD)
        (tmp_path / "bad.yaml").write_text("cases:\n  - name: x\n    tool: refund\n    expect: maybe\n")
        (tmp_path / "empty.yaml").write_text("cases: []\n")
        bad = runner.invoke(app, ["policy", "test", str(tmp_path / "p.yaml"), str(tmp_path / "bad.yaml")], env=WIDE)
        assert bad.exit_code == 2
        assert "bad.yaml:4 x: expect must be one of" in bad.stderr
        empty = runner.invoke(app, ["policy", "test", str(tmp_path / "p.yaml"), str(tmp_path / "empty.yaml")])
        assert empty.exit_code == 2
        assert "proves nothing" in empty.stderr

    def test_calls_in_a_case_answer_count_calls(self, tmp_path: Path) -> None:
        """A case's `calls:` is what count_calls answers, so a rate limit is testable without traffic."""
        (tmp_path / "p.yaml").write_text(
            "version: 1\nname: rate\nrules:\n  - id: hourly\n    tools: [refund]\n"
            "    when: \"count_calls('refund', 'tenant', duration('1h')) > 10\"\n    decision: deny\n"
        )
        (tmp_path / "c.yaml").write_text(
            "cases:\n  - name: tenth\n    tool: refund\n    calls: 10\n    expect: allow\n"
            "  - name: eleventh\n    tool: refund\n    calls: 11\n    expect: deny\n    rule: hourly\n"
        )
        result = runner.invoke(app, ["policy", "test", str(tmp_path / "p.yaml"), str(tmp_path / "c.yaml")], env=WIDE)
        assert result.exit_code == 0, result.output


class TestExplain:
    """`policy explain` shows every rule, matched or not, and the decision."""

    def test_every_rule_and_the_decision_are_shown(self) -> None:
        """For a cross-tenant refund: the tenant rule matched, the others did not or are for other tools."""
        result = runner.invoke(
            app,
            [
                *("policy", "explain", str(POLICY_FILE), "--tool", "refund"),
                *("--args", '{"order_id": "GLOBEX-9", "amount_cents": 90000}', "--tenant", "acme"),
            ],
            env=WIDE,
        )
        assert result.exit_code == 0, result.output
        rows = {line.split("│")[1].strip(): line for line in result.output.splitlines() if line.count("│") > 4}
        assert "matched" in rows["tenant-orders"]
        assert "matched" in rows["big-refunds"]
        assert "other tool" in rows["sql-writes"]
        assert "decision: deny by tenant-orders: Order GLOBEX-9 does not belong to tenant acme." in result.output

    def test_bad_args_exit_2(self) -> None:
        """--args that are not a JSON object cannot be explained."""
        result = runner.invoke(app, ["policy", "explain", str(POLICY_FILE), "--tool", "refund", "--args", "[1]"])
        assert result.exit_code == 2
