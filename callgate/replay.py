"""`callgate replay`: try a candidate policy (or Python interceptor) on the stored history, print
what would change, write the reports, choose the exit code.

Exit codes: 0 the share of checked calls newly denied or blocked is at most `--max-new-blocks`
(and, with `--fail-on-new-allows`, nothing is newly let through); 1 otherwise; 2 when it cannot
check: no store, a store held by a running materializer (use --api), an API that is down or lacks
the `replay_calls` query, an unreadable policy or interceptor, a bad option, or a window with no
stored call in it. The engine is `callgate.replay_engine`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from callgate.coverage import parse_since

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_CANNOT_CHECK = 2

DEFAULT_SINCE = "7d"
"""The window a replay reads by default: the last week of stored calls."""
PROGRESS_MIN_CALLS = 20_000
"""A replay of at least this many calls (about a second) shows a progress bar on a terminal."""

_SHARE = re.compile(r"^\s*(?P<n>\d+(?:\.\d*)?|\.\d+)\s*(?P<pct>%?)\s*$")
_TOP = 3
_SAMPLES_SHOWN = 3
_STYLE = {"ok": "bold green", "fail": "bold red", "cannot": "bold yellow"}


def parse_share(text: str) -> float:
    """`--max-new-blocks`: a share in [0, 1] ("0.01") or a percentage ("1%"). Raises `ValueError`
    naming the text otherwise."""
    found = _SHARE.match(text)
    value = float(found["n"]) / (100 if found["pct"] else 1) if found else -1.0
    if not 0.0 <= value <= 1.0:
        raise ValueError(
            f"--max-new-blocks {text!r} is not a share of the checked calls in [0, 1] (0.01) or a percentage (1%)"
        )
    return value


def parse_time(text: str | None, option: str) -> datetime | None:
    """An ISO 8601 time or a duration back from now ("7d") for `option`; "all" (or nothing) is no
    bound. Raises `ValueError` naming the option and the text."""
    if text is None or text.strip().lower() == "all":
        return None
    try:
        return parse_since(text)
    except ValueError:
        raise ValueError(
            f"{option} {text!r} is neither an ISO 8601 time (2026-11-30T09:00:00Z), a duration back from now "
            "(30m, 24h, 7d) nor 'all'"
        ) from None


def run_replay(
    *,
    policy: Path | None,
    interceptor: str | None,
    db: Path | None,
    api: str | None,
    since: str | None,
    until: str | None,
    gate: str | None,
    workflow: str | None,
    agent: str | None,
    tool: str | None,
    tenant: str | None,
    max_new_blocks: str,
    fail_on_new_allows: bool,
    json_path: Path | None,
    junit: Path | None,
    console: Console,
    err: Console,
    progress: bool | None = None,
    token: str | None = None,
) -> int:
    """Load the candidate, replay the window, print the tables, write the reports; the exit code.

    `progress` None shows a bar on a terminal for runs of `PROGRESS_MIN_CALLS` or more (or of
    unknown length, through the API); True or False force it. `token` is the read API's bearer token.
    """
    # Imported here: `callgate --help` must not load DuckDB or the policy engine.
    from callgate.replay_engine import Window, open_source, replay
    from consumers.queries import QueryError
    from consumers.reader import SourceUnavailableError

    def cannot(message: str) -> int:
        err.print(message, markup=False)
        return EXIT_CANNOT_CHECK

    if (policy is None) == (interceptor is None):
        return cannot("error: give exactly one of --policy FILE (a policy file) or --interceptor MODULE:ATTR")
    if (api is None) == (db is None):
        return cannot("error: give exactly one of --api URL (a running materializer) or --db FILE (an audit store)")
    try:
        share = parse_share(max_new_blocks)
        window = Window(
            since=parse_time(since, "--since"),
            until=parse_time(until, "--until"),
            gate=gate,
            workflow=workflow,
            agent=agent,
            tool=tool,
            tenant=tenant,
        )
    except ValueError as exc:
        return cannot(f"error: {exc}")
    if window.since is not None and window.until is not None and window.since >= window.until:
        return cannot(
            f"error: --since ({window.since.isoformat()}) must be before --until ({window.until.isoformat()})"
        )
    candidate = _candidate(policy, interceptor, err)
    if candidate is None:
        return EXIT_CANNOT_CHECK
    try:
        try:
            source = open_source(api=api, db=db, window=window, token=token)
        except (ValueError, SourceUnavailableError) as exc:
            return cannot(f"cannot check: {exc}")
        try:
            with _progress(console, source.total(), progress) as advance:
                report = replay(
                    source,
                    candidate,
                    max_new_blocks=share,
                    fail_on_new_allows=fail_on_new_allows,
                    on_progress=advance,
                )
        except SourceUnavailableError as exc:
            return cannot(f"cannot check: {exc}")
        except QueryError as exc:
            return cannot(f"cannot check: {source.source} cannot answer the replay queries ({exc})")
        except Exception as exc:
            return cannot(f"cannot check: {type(exc).__name__}: {exc}")
        finally:
            source.close()
    finally:
        candidate.close()

    _print(report, console)
    try:
        if junit is not None:
            junit.write_text(report.to_junit(), encoding="utf-8")
            console.print(f"JUnit report: {junit}", markup=False)
        if json_path is not None:
            json_path.write_text(report.to_json() + "\n", encoding="utf-8")
            console.print(f"JSON report: {json_path}", markup=False)
    except OSError as exc:
        return cannot(f"cannot write the report: {exc}")
    return report.exit_code


def _candidate(policy: Path | None, interceptor: str | None, err: Console) -> Any:
    """The candidate, or None after saying why it cannot be loaded."""
    from callgate.replay_engine import PolicyCandidate, candidate_from_object
    from interceptor_core.exceptions import ConfigurationError
    from interceptor_core.policy import PolicyError

    if policy is not None:
        try:
            return PolicyCandidate.load(policy)
        except PolicyError as exc:
            for problem in exc.problems:
                err.print(str(problem), markup=False)
            return None
    import typer

    from callgate.loading import load_object

    if interceptor is None:  # the caller checked that one of the two is given
        err.print("error: give --policy FILE or --interceptor MODULE:ATTR", markup=False)
        return None
    try:
        return candidate_from_object(load_object(interceptor), source=interceptor)
    except (typer.BadParameter, ConfigurationError) as exc:
        err.print(f"error: --interceptor {interceptor}: {exc}", markup=False)
    except Exception as exc:  # the module failed while importing: it still cannot be checked (2, not 1)
        err.print(f"error: --interceptor {interceptor}: {type(exc).__name__}: {exc}", markup=False)
    return None


@contextmanager
def _progress(console: Console, total: int | None, wanted: bool | None) -> Iterator[Callable[[int], None] | None]:
    show = wanted if wanted is not None else console.is_terminal and (total is None or total >= PROGRESS_MIN_CALLS)
    if not show:
        yield None
        return
    columns: list[Any] = [SpinnerColumn(), TextColumn("replaying stored calls")]
    if total is not None:
        columns.append(BarColumn())
    columns += [MofNCompleteColumn(), TimeElapsedColumn()]
    if total is not None:
        columns.append(TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("replay", total=total)
        yield lambda n: bar.advance(task, n)


def _print(report: Any, console: Console) -> None:
    candidate = report.candidate
    what = f"{candidate.kind} {candidate.name}"
    if candidate.version:
        what += f" (version {candidate.version[:12]})"
    window = report.window
    bounds = (
        f"since {window.since.isoformat()}" if window.since else "all time",
        *([f"until {window.until.isoformat()}"] if window.until else []),
        *(f"{key} {value}" for key, value in window.to_dict().items() if key not in ("since", "until") and value),
    )
    table = Table(
        title=f"callgate replay of {what} on {report.source} ({', '.join(bounds)})",
        title_justify="left",
    )
    for column in ("change", "calls", "share", "rules", "tools", "tenants", "principals"):
        table.add_column(column, justify="right" if column in ("calls", "share") else "left", overflow="fold")
    checked = report.checked or 1
    for name, summary in report.changes.items():
        if name != "unchanged" and summary.count == 0:
            continue
        table.add_row(
            Text(name, style=_change_style(name) if summary.count else ""),
            Text(f"{summary.count:,}"),
            Text(f"{summary.count / checked:.1%}"),
            # Event text may be attacker-controlled: Text() never interprets rich markup.
            Text(_top(summary.by_rule)),
            Text(_top(summary.by_tool)),
            Text(_top(summary.by_tenant)),
            Text(_top(summary.by_principal)),
        )
    skipped = sum(report.skipped.values())
    if skipped:
        causes = ", ".join(f"{cause} {count:,}" for cause, count in report.skipped.items())
        table.add_row(Text("skipped", style="dim"), Text(f"{skipped:,}"), Text(""), Text(causes, style="dim"))
    console.print(table)

    rules = Table(
        title=f"by rule of {candidate.name}: calls newly denied, blocked, allowed, asking a human, no longer asking",
        title_justify="left",
    )
    for column in ("rule", "decided", "denied", "blocked", "allowed", "asks", "no ask", "other", "unsure", "result"):
        rules.add_column(column, justify="left" if column in ("rule", "result") else "right", overflow="fold")
    shown = ("newly_denied", "newly_blocked", "newly_allowed", "newly_asking", "no_longer_asking")
    for rule in report.rules:
        why = report.rule_fails(rule)
        other = sum(n for c, n in rule.changes.items() if c not in (*shown, "uncertain"))
        rules.add_row(
            Text(rule.rule),
            Text(f"{rule.decided:,}"),
            *(Text(f"{rule.count(c):,}" if rule.count(c) else "", style=_change_style(c)) for c in shown),
            Text(f"{other:,}" if other else ""),
            Text(f"{rule.count('uncertain'):,}" if rule.count("uncertain") else ""),
            Text("FAIL", style=_STYLE["fail"]) if why else Text("pass", style="green"),
        )
    console.print(rules)

    changed = [(name, s) for name, s in report.changes.items() if name != "unchanged" and s.samples]
    if changed:
        samples = Table(
            title="sample calls that change (the JSON report has up to 10 per change)", title_justify="left"
        )
        for column in ("change", "call id", "time", "tool", "tenant", "principal", "recorded -> new", "rule"):
            samples.add_column(column, overflow="fold")
        for name, summary in changed:
            for sample in summary.samples[:_SAMPLES_SHOWN]:
                samples.add_row(
                    Text(name, style=_change_style(name)),
                    Text(sample["call_id"]),
                    Text(sample["time"][:19]),
                    Text(sample["tool"]),
                    Text(sample["tenant"] or ""),
                    Text(sample["principal"] or ""),
                    Text(f"{sample['recorded']} -> {sample['new']}"),
                    Text(sample["rule"] or ""),
                )
        console.print(samples)
    for note in report.notes:
        console.print(Text(note, style="dim"))
    code = report.exit_code
    verdict = {0: "passes", 1: "FAILS", 2: "cannot tell"}[code]
    # A pass over uncertain calls is a pass on what could be checked: shown apart, in yellow.
    style = _STYLE[{0: "cannot" if report.count("uncertain") else "ok", 1: "fail", 2: "cannot"}[code]]
    console.print(Text(f"replay {verdict}: {report.summary()} in {report.seconds:.1f} s", style=style))


def _change_style(change: str) -> str:
    if change in ("newly_denied", "newly_blocked"):
        return "red"
    if change in ("newly_allowed", "no_longer_asking"):
        return "magenta"
    if change == "uncertain":
        return "yellow"
    return ""


def _top(counts: dict[str, int]) -> str:
    items = list(counts.items())
    text = ", ".join(f"{name} ({count:,})" for name, count in items[:_TOP])
    if len(items) > _TOP:
        text += f", +{len(items) - _TOP} more"
    return text
