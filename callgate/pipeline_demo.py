"""`callgate demo`: the whole pipeline on this machine, in one command.

It starts the embedded broker, `callgate materialize` with its read API, and (unless told not to)
`callgate dashboard`, each as its own process on loopback; then it runs the support-desk workload
(`callgate.workload`) through a gate whose events go to Kafka (and to OpenTelemetry when
`OTEL_EXPORTER_OTLP_ENDPOINT` is set), with a live progress display. It stops after `duration_s`,
or at Ctrl-C: the workload finishes the conversations in flight, the gate flushes, the demo waits
until the store holds every event, runs the coverage check through the read API, prints a summary,
stops every process it started and says where the store is.

`workload_only` runs only the workload against an existing Kafka (the compose stack's `demo`
service).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from callgate.broker import BrokerError, EmbeddedBroker, free_port
from callgate.demo import POLICY_FILE
from callgate.processes import wait_until_serving
from callgate.workload import EventCounter, SupportDesk, WorkloadStats, build_support_desk, run_workload

DEFAULT_TOPIC = "callgate.events"
START_TIMEOUT_S = 90.0
INGEST_TIMEOUT_S = 60.0
# Every type the workload produces; Unmediated only with inject_bypass (and then coverage is red).
WORKLOAD_TYPES = (
    "ToolsRegistered",
    "TurnDecision",
    "ToolUse",
    "ToolDenied",
    "Substitute",
    "Blocked",
    "ApprovalRequested",
    "ApprovalResolved",
)


class DemoError(RuntimeError):
    """A part of the demo could not start or finish; the message names it and what it printed."""


@dataclass(frozen=True)
class DemoOptions:
    """What `callgate demo` was asked for."""

    duration_s: float | None = None
    rate: float = 50.0
    dashboard: bool = True
    dashboard_port: int = 8501
    db: Path = Path("callgate-demo.duckdb")
    seed: int = 7
    inject_bypass: bool = False
    workload_only: bool = False
    bootstrap: str | None = None
    topic: str = DEFAULT_TOPIC


def run_demo(options: DemoOptions, console: Console) -> int:
    """Run the demo; the exit code of its coverage check (0 green, 1 red, 2 could not check).
    Raises `DemoError` when a process does not start."""
    if options.rate <= 0:
        raise DemoError(f"--rate must be positive, got {options.rate}")
    if options.duration_s is not None and options.duration_s <= 0:
        raise DemoError(f"--duration must be positive, got {options.duration_s}")
    if options.workload_only:
        if not options.bootstrap:
            raise DemoError("--workload-only needs --bootstrap HOST:PORT (the Kafka to send the events to)")
        return asyncio.run(_workload_only(options, console))
    with tempfile.TemporaryDirectory(prefix="callgate-demo-") as scratch, contextlib.ExitStack() as stack:
        work = Path(scratch)
        db = options.db.resolve()
        parts = ["the materializer", *(["the dashboard"] if options.dashboard else [])]
        if not options.bootstrap:
            parts.insert(0, "the embedded broker")
        console.print(f"starting {', '.join(parts)}")
        if options.bootstrap:
            bootstrap = options.bootstrap
        else:
            try:
                bootstrap = stack.enter_context(EmbeddedBroker(log_path=work / "broker.log")).bootstrap
            except BrokerError as exc:
                raise DemoError(f"the embedded broker did not start: {exc}") from exc
        api_url = f"http://127.0.0.1:{free_port()}"
        group = f"callgate-demo-{uuid.uuid4().hex[:8]}"
        materializer = stack.enter_context(
            _child(
                "materializer",
                ["materialize", "--bootstrap", bootstrap, "--topic", options.topic, "--db", str(db),
                 "--group", group, "--api", api_url.removeprefix("http://")],
                work / "materializer.log",
            )
        )  # fmt: skip
        _wait_until_serving(f"{api_url}/healthz", materializer, work / "materializer.log", "materializer")
        dashboard_url = None
        if options.dashboard:
            dashboard_url = f"http://127.0.0.1:{options.dashboard_port}"
            dashboard = stack.enter_context(
                _child(
                    "dashboard",
                    ["dashboard", "--api", api_url, "--port", str(options.dashboard_port)],
                    work / "dashboard.log",
                )
            )
            _wait_until_serving(dashboard_url, dashboard, work / "dashboard.log", "dashboard")
            console.print(Text(f"dashboard at {dashboard_url}", style="bold green"))
        console.print(f"read API at {api_url}; audit store {db}")
        code = asyncio.run(_drive(options, console, bootstrap, api_url, work, group))
        console.print(f"stopping; the audit store stays at {db}")
        return code


# -- the run ------------------------------------------------------------------------------------


async def _drive(options: DemoOptions, console: Console, bootstrap: str, api_url: str, work: Path, group: str) -> int:
    from consumers.coverage import run_checks
    from consumers.reader import ApiReader, SourceUnavailableError
    from events.kafka import KafkaSink

    stop = _stop_on_signals()
    counter = EventCounter()
    # The check covers this run's events: a store reused from an earlier run (say, one with
    # --inject-bypass) keeps its history, which is not this run's verdict.
    started = datetime.now(UTC)
    # The embedded broker's memory storage can lose what it acknowledged: an event leaves the
    # spool only once the materializer's group has stored it.
    kafka = KafkaSink(bootstrap, options.topic, work / "spool", confirm_group=group)
    wired = build_support_desk([kafka, counter, *_otel_sinks()], seed=options.seed)
    console.print(f"the desk's policy file: {POLICY_FILE}", markup=False)
    stats = WorkloadStats()
    reader = ApiReader(api_url, timeout_s=10)
    producer_id = wired.gate.producer_id
    progress = _Progress(options, stats, counter)
    with Live(progress.render(None), console=console, refresh_per_second=4, transient=False) as live:
        workload = asyncio.create_task(
            run_workload(
                wired,
                rate=options.rate,
                duration_s=options.duration_s,
                stop=stop,
                stats=stats,
                seed=options.seed,
                inject_bypass=options.inject_bypass,
            )
        )
        while not workload.done():
            stored = await asyncio.to_thread(_stored, reader, producer_id)
            live.update(progress.render(stored))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(workload), timeout=0.5)
        await workload
        await wired.gate.flush()
        # Wait until the store holds every event the gate wrote (or give up after a deadline).
        deadline = time.monotonic() + INGEST_TIMEOUT_S
        stored = await asyncio.to_thread(_stored, reader, producer_id)
        while (stored or 0) < counter.total and time.monotonic() < deadline:
            live.update(progress.render(stored))
            await asyncio.sleep(0.25)  # polling the read API with a deadline
            stored = await asyncio.to_thread(_stored, reader, producer_id)
        live.update(progress.render(stored))
    console.print()
    await wired.gate.close()
    if (stored or 0) < counter.total:
        console.print(Text(f"the store holds {stored} of {counter.total} events after {INGEST_TIMEOUT_S:.0f} s", "red"))
    try:
        report = await asyncio.to_thread(run_checks, reader, require_exercised=True, since=started)
    except SourceUnavailableError as exc:
        console.print(Text(f"coverage: cannot check: {exc}", style="red"))
        return 2
    _summary(console, wired, stats, counter)
    table = Table(title=f"callgate coverage of this run (since {started:%H:%M:%S} UTC)", title_justify="left")
    for column in ("check", "result", "detail"):
        table.add_column(column, overflow="fold")
    for check in report.checks:
        style = "green" if check.status == "pass" else "red" if check.status == "fail" else "yellow"
        table.add_row(Text(check.title), Text(check.status.upper(), style=style), Text(check.summary))
    console.print(table)
    if options.inject_bypass:
        console.print("the deliberate bypass (--inject-bypass) should turn the first check red")
    return report.exit_code


async def _workload_only(options: DemoOptions, console: Console) -> int:
    from events.kafka import KafkaSink

    stop = _stop_on_signals()
    counter = EventCounter()
    with tempfile.TemporaryDirectory(prefix="callgate-workload-") as scratch:
        # The compose stack's single, unreplicated Kafka broker may lose what it acknowledged in a
        # crash: events wait in the spool until the materializer's group (its default) stored them.
        kafka = KafkaSink(
            options.bootstrap or "", options.topic, Path(scratch) / "spool", confirm_group="callgate-materializer"
        )
        wired = build_support_desk([kafka, counter, *_otel_sinks()], seed=options.seed)
        console.print(f"the desk's policy file: {POLICY_FILE}", markup=False)
        stats = WorkloadStats()
        console.print(f"sending the support-desk workload to {options.bootstrap} ({options.topic}) at {options.rate}/s")
        await run_workload(
            wired,
            rate=options.rate,
            duration_s=options.duration_s,
            stop=stop,
            stats=stats,
            seed=options.seed,
            inject_bypass=options.inject_bypass,
        )
        await wired.gate.close()
    _summary(console, wired, stats, counter)
    return 0


def _stop_on_signals() -> asyncio.Event:
    """An event set by Ctrl-C or SIGTERM: the workload then winds down instead of dying mid-call."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    return stop


def _otel_sinks() -> list[object]:
    if not os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") and not os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        return []
    from events.otel import OtelSink

    return [OtelSink()]


def _stored(reader: Any, producer_id: str | None) -> int | None:
    """How many of this run's events the store holds (None while the read API does not answer)."""
    try:
        rows = reader.query("chain_status", {"producer_id": producer_id, "limit": 1}).rows
    except Exception:
        return None
    return int(rows[0]["events"]) if rows else 0


class _Progress:
    """The live table: calls, decisions by type, what the store holds and how far behind it is."""

    def __init__(self, options: DemoOptions, stats: WorkloadStats, counter: EventCounter) -> None:
        self.options = options
        self.stats = stats
        self.counter = counter
        self.started = time.monotonic()

    def render(self, stored: int | None) -> Group:
        elapsed = time.monotonic() - self.started
        limit = f" of {self.options.duration_s:.0f}" if self.options.duration_s else " (Ctrl-C to stop)"
        head = Table.grid(padding=(0, 2))
        emitted = self.counter.total
        lag = "n/a" if stored is None else f"{max(emitted - stored, 0):,} events"
        head.add_row("elapsed", f"{elapsed:,.0f} s{limit}")
        head.add_row("conversations / tool calls", f"{self.stats.runs:,} / {self.stats.calls:,}")
        head.add_row("events written / stored", f"{emitted:,} / {'n/a' if stored is None else f'{stored:,}'}")
        head.add_row("ingest lag", lag)
        decisions = Table(title="events by type", title_justify="left")
        decisions.add_column("type")
        decisions.add_column("events", justify="right")
        for kind, n in sorted(self.counter.snapshot().items()):
            decisions.add_row(kind, f"{n:,}")
        return Group(head, decisions)


def _summary(console: Console, wired: SupportDesk, stats: WorkloadStats, counter: EventCounter) -> None:
    counts = counter.snapshot()
    console.print(
        f"{stats.runs:,} conversations, {stats.calls:,} tool calls, {sum(counts.values()):,} events "
        f"({', '.join(f'{k} {v:,}' for k, v in sorted(counts.items()))}); {stats.blocked_runs} runs blocked; "
        f"{len(wired.payments.refunds)} refunds paid, {len(wired.outbox)} e-mails sent"
    )


# -- child processes ----------------------------------------------------------------------------


@contextlib.contextmanager
def _child(name: str, args: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`callgate <args>` as a child process in its own session (Ctrl-C reaches only the demo, which
    stops it in order), its output in `log`; interrupted and reaped on exit."""
    with log.open("ab") as out:
        process = subprocess.Popen(  # noqa: S603 (our own interpreter and command line)
            [sys.executable, "-c", "from callgate.cli import main; main()", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _wait_until_serving(url: str, process: subprocess.Popen[bytes], log: Path, name: str) -> None:
    try:
        wait_until_serving(url, process, START_TIMEOUT_S)
    except ChildProcessError:
        raise DemoError(f"the {name} exited with {process.returncode} before serving:\n{_tail(log)}") from None
    except TimeoutError:
        raise DemoError(f"the {name} did not answer at {url} within {START_TIMEOUT_S:.0f} s:\n{_tail(log)}") from None


def _tail(log: Path, lines: int = 20) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no output)"
