"""callgate's pytest plugin (registered through the `pytest11` entry point as `callgate`).

- `--callgate-coverage[=REPORT.json]`: every `Gate` built during the session is watched; at the end
  each one's runtime coverage is asserted (`gate.assert_coverage()` semantics: no guarded client was
  used outside a mediated call of its tools; with `--callgate-require-exercised`, every registered
  tool was also called through the gate). A violation fails the session (exit code 1) and the
  terminal summary lists it; the report is written as JSON (default `callgate-coverage.json`).
- Fixture `callgate_deny_all`: `callgate_deny_all(gate)` starts the deny-all drill on a gate for the
  rest of the test; at teardown the drill stops and fails the test on an effect or an attempt that
  left no denial event (`interceptor_core.testing.deny_all`).

The plugin imports nothing of callgate until the option or the fixture is used.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

DEFAULT_REPORT = "callgate-coverage.json"

_GATES = pytest.StashKey[list[Any]]()
_STOP = pytest.StashKey[Callable[[], None]]()
_VERDICT = pytest.StashKey[dict[str, Any]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("callgate", "callgate runtime coverage")
    group.addoption(
        "--callgate-coverage",
        dest="callgate_coverage",
        nargs="?",
        const=DEFAULT_REPORT,
        default=None,
        metavar="REPORT.json",
        help="Fail the session when a gate built during it saw an unmediated access; write the report "
        f"(default {DEFAULT_REPORT}).",
    )
    group.addoption(
        "--callgate-require-exercised",
        dest="callgate_require_exercised",
        action="store_true",
        default=False,
        help="With --callgate-coverage: also fail when a registered tool was never called through its gate.",
    )


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("callgate_coverage") is None:
        return
    from interceptor_core.gate import observe_gates

    gates: list[Any] = []
    config.stash[_GATES] = gates
    config.stash[_STOP] = observe_gates(gates.append)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if _GATES not in config.stash:
        return
    config.stash[_STOP]()
    require_exercised = bool(config.getoption("callgate_require_exercised"))
    gates = config.stash[_GATES]
    verdict = _verdict(gates, require_exercised)
    config.stash[_VERDICT] = verdict
    path = Path(config.getoption("callgate_coverage"))
    path.write_text(json.dumps(verdict, indent=2) + "\n", encoding="utf-8")
    if not verdict["ok"] and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    verdict = config.stash.get(_VERDICT, None)
    if verdict is None:
        return
    failed = [gate for gate in verdict["gates"] if not gate["ok"]]
    title = "callgate coverage: " + ("FAILED" if failed else "clean")
    terminalreporter.section(title, sep="=", red=bool(failed), green=not failed)
    terminalreporter.line(
        f"{len(verdict['gates'])} gate(s) watched, {verdict['unmediated']} unmediated access(es); "
        f"report: {config.getoption('callgate_coverage')}"
    )
    for gate in failed:
        terminalreporter.line(f"gate {gate['gate']!r}:", red=True)
        for line in gate["summary"].splitlines():
            terminalreporter.line(f"  {line}")


def _verdict(gates: list[Any], require_exercised: bool) -> dict[str, Any]:
    entries = []
    for gate in gates:
        report = gate.coverage(require_exercised=require_exercised)
        entries.append(
            {
                "gate": gate.name,
                "ok": report.ok,
                "registered": sorted(report.registered),
                "exercised": sorted(report.exercised),
                "never_exercised": sorted(report.never_exercised),
                "unmediated": [
                    {
                        "resource": u.resource,
                        "attribute": u.attribute,
                        "bound_tools": list(u.tools),
                        "site": u.site,
                        "active_tool": u.active_tool,
                        "thread": u.thread,
                    }
                    for u in report.unmediated
                ],
                "summary": report.summary(),
            }
        )
    return {
        "ok": all(entry["ok"] for entry in entries),
        "require_exercised": require_exercised,
        "unmediated": sum(len(entry["unmediated"]) for entry in entries),
        "gates": entries,
    }


@pytest.fixture
def callgate_deny_all() -> Iterator[Callable[..., Any]]:
    """`callgate_deny_all(gate, mode="deny")` starts the deny-all drill on `gate` and returns it; the
    drill stops at teardown and fails the test (`DrillFailedError`) if it saw an effect or an
    attempt without a denial event."""
    from interceptor_core.testing import DrillFailedError, deny_all

    drills: list[Any] = []

    def start(gate: Any, *, mode: str = "deny") -> Any:
        drill = deny_all(gate, mode=mode, check=False)
        drill.start()
        drills.append(drill)
        return drill

    yield start
    failed = [drill.stop() for drill in reversed(drills)]
    bad = [report for report in failed if not report.ok]
    if bad:
        raise DrillFailedError(bad[0])
