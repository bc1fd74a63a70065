"""The pytest plugin: --callgate-coverage fails a session that let a tool run unmediated; the
callgate_deny_all fixture runs the drill for one test."""

from __future__ import annotations

import json

import pytest

GATE_TESTS = '''
import asyncio
from events import MemorySink
from interceptor_core import Gate, RunContext, UnmediatedAccessError, tool

class Mailer:
    def send(self, to):
        return "sent"

def build():
    gate = Gate("shop", sinks=[MemorySink()])
    mailer = gate.guard(Mailer(), name="mailer", tools=["send_email"])

    @tool
    def send_email(to: str) -> str:
        """Sends an e-mail."""
        return mailer.send(to)

    @tool
    def refund(order_id: str) -> str:
        """Refunds an order."""
        return "refunded"

    desk = gate.agent("desk", tools=[send_email, refund])
    return gate, desk, mailer

def test_mediated():
    gate, desk, mailer = build()
    assert asyncio.run(desk.call("send_email", {"to": "a@example.com"}, run=RunContext())).kind == "ok"
'''

BYPASS_TEST = """
def test_bypass():
    gate, desk, mailer = build()
    try:
        mailer.send("b@example.com")
    except UnmediatedAccessError:
        pass
"""


@pytest.fixture(autouse=True)
def ini(pytester: pytest.Pytester) -> None:
    # The inner sessions' own configuration: pytest-asyncio warns when its loop scope is unset.
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")


class TestCoverageOption:
    """--callgate-coverage asserts every gate's runtime coverage at the end of the session."""

    def test_clean_session_passes_and_writes_the_report(self, pytester: pytest.Pytester) -> None:
        """Only mediated uses: the session passes and the report lists the gate, clean."""
        pytester.makepyfile(test_gates=GATE_TESTS)
        result = pytester.runpytest("-p", "no:cacheprovider", "--callgate-coverage=cov.json")
        result.assert_outcomes(passed=1)
        assert result.ret == 0
        report = json.loads((pytester.path / "cov.json").read_text())
        assert report["ok"] is True
        assert [g["gate"] for g in report["gates"]] == ["shop"]
        assert report["gates"][0]["exercised"] == ["send_email"]
        result.stdout.fnmatch_lines(["*callgate coverage: clean*"])

    def test_an_unmediated_use_fails_the_session(self, pytester: pytest.Pytester) -> None:
        """A test that swallows UnmediatedAccessError still fails the session, and the site is named."""
        pytester.makepyfile(test_gates=GATE_TESTS + BYPASS_TEST)
        result = pytester.runpytest("-p", "no:cacheprovider", "--callgate-coverage")
        result.assert_outcomes(passed=2)
        assert result.ret == pytest.ExitCode.TESTS_FAILED
        report = json.loads((pytester.path / "callgate-coverage.json").read_text())
        assert report["ok"] is False
        assert report["unmediated"] == 1
        (access,) = [u for g in report["gates"] for u in g["unmediated"]]
        assert (access["resource"], access["attribute"]) == ("mailer", "send")
        assert "test_gates.py" in access["site"]
        result.stdout.fnmatch_lines(["*callgate coverage: FAILED*", "*unmediated: mailer.send*"])

    def test_require_exercised(self, pytester: pytest.Pytester) -> None:
        """With --callgate-require-exercised, a registered tool never called fails the session."""
        pytester.makepyfile(test_gates=GATE_TESTS)
        result = pytester.runpytest(
            "-p", "no:cacheprovider", "--callgate-coverage=cov.json", "--callgate-require-exercised"
        )
        assert result.ret == pytest.ExitCode.TESTS_FAILED
        report = json.loads((pytester.path / "cov.json").read_text())
        assert report["gates"][0]["never_exercised"] == ["refund"]

    def test_without_the_option_nothing_is_asserted(self, pytester: pytest.Pytester) -> None:
        """The plugin stays out of the way unless asked: no report, exit code untouched."""
        pytester.makepyfile(test_gates=GATE_TESTS + BYPASS_TEST)
        result = pytester.runpytest("-p", "no:cacheprovider")
        assert result.ret == 0
        assert not (pytester.path / "callgate-coverage.json").exists()


class TestDenyAllFixture:
    """The callgate_deny_all fixture runs the drill around one test."""

    def test_fixture_passes_and_fails(self, pytester: pytest.Pytester) -> None:
        """A test whose calls are all refused passes; one that runs a body around the gate errors."""
        pytester.makepyfile(
            test_drill=GATE_TESTS
            + """
def test_refused(callgate_deny_all):
    gate, desk, mailer = build()
    drill = callgate_deny_all(gate)
    assert asyncio.run(desk.call("refund", {"order_id": "A-1"}, run=RunContext())).kind == "denied"
    assert drill.report.tool("refund").denials == 1

def test_effect(callgate_deny_all):
    gate, desk, mailer = build()
    callgate_deny_all(gate)
    desk.tools["refund"].fn("A-1")
"""
        )
        result = pytester.runpytest("-p", "no:cacheprovider", "-k", "refused or effect")
        result.assert_outcomes(passed=2, errors=1)
        result.stdout.fnmatch_lines(["*DrillFailedError*", "*refund*1*"])
