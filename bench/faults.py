"""The fault drill: does every decision the gate made reach the audit store, or is someone told?

    python bench/faults.py [--store file|lake|both] [--only ROW ...] [--quick] [--rate R] [--json FILE]
        [--strict] [--keep]
    make drill [DRILL_ARGS="--quick"]

Real processes only, as an operator runs them: `callgate broker --port P` (the embedded broker,
memory storage), `callgate materialize ... --api` writing the audit store, and a producer
(`bench/_fault_producer.py`: real `Gate`s with a `KafkaSink`, `confirm_group` set to the
materializers' group when the sink has it, one gate per partition of the topic) making tool calls at
`--rate` (750 calls/s). The producer's tap records every event id the gates made: that is the ground
truth. Every row runs against each home of the store (`--store`, default both):

- file: one DuckDB file, one materializer;
- lake: a DuckLake whose catalog is a database of a PostgreSQL the drill starts on loopback (Debian's
  server, `callgate.postgres`) and whose data is a local directory, written by three materializers
  of one consumer group (`--assignment group`), one partition each.

Each row injects one kind of fault while the producer runs, then:

1. the producer stops calling and closes its sink (`close(timeout)`), while the materializers run;
2. the materializers are stopped (SIGINT), then `callgate materialize --drain` runs until the store
   holds what was made or a deadline passes;
3. the store (a file opened only now, when nobody writes it) is compared with the ground truth:
   events made, stored, lost, duplicated (rows beyond one per event id, plus stored ids that no
   producer made: both must be 0), and `callgate coverage` is run (its chain check verifies every
   producer's chain).

A lost event is *reported* when coverage fails its chain check and the event is a hole in its
producer's chain (a seq below the highest stored one) or in a range a sink reported lost (a
`LossReport`: the next sink over a dead process's spool found events it had been handed and never
spooled); a lost tail nobody reported, or a producer lost whole, is invisible to that check: an
*unreported* loss. The drill exits 1 when any row has an
unreported loss, duplicates, a materializer that exited with nobody stopping it, or a coverage check
that could not run (`--strict`: on any loss too).

Rows (`--only` picks them; `--quick` halves every window):

- baseline: no faults.
- materializer-kill: the materializer SIGKILLed and restarted at once, twice (on a lake: one member,
  then another).
- broker-kill: the broker SIGKILLed and restarted empty on the same port, twice.
- broker-materializer-kill: both at the same moments, twice.
- materializer-pause: a materializer stopped (SIGSTOP) and resumed (SIGCONT). On a lake it is stopped
  while its catalog connection is inside a transaction (a batch being written: PostgreSQL's
  `pg_stat_activity` shows it, by the `application_name` each member's catalog connection carries),
  past its 6 s group session, until another member was given its partition and stored past it; then
  resumed, its transaction commits late, and the lake must refuse it (`StoreFencedError`, counted
  from its log: "late commits refused"). The row fails when the stop missed a transaction or nothing
  was refused. On the file it is stopped for as long (10 s) and nothing may be lost.
- producer-kill: the broker paused (SIGSTOP) so events pile up in the producer, then the producer
  SIGKILLed; the broker resumes and a new producer process over the same spool directory sends
  what the first left there. What the first had only in memory is lost by design; the drill reads
  the spool before the second starts and reports that share separately ("memory only"): it must
  show as a chain gap like any other loss.
- tiny-spool: `spool_max_bytes` 64 KiB; the broker SIGKILLed (calls then block, "audit
  unavailable"), restarted empty a few seconds later; the sink must recover and close in time.
- load-4000: 4,000 calls/s for 20 s, healthy broker and materializer: lag from decision (`time`)
  to visible in the store (`ingested_at`), p50 and p99 (target p99 <= 2 s), and calls Blocked.
- full-speed: calls as fast as the gate can make them (the sink paces them to what the store
  takes): the sustained maximum, its lag, and calls Blocked.

Every row starts its producer once the materializer reads the topic, as agents start after the
pipeline in production: the lag figures are the pipeline's, not a first group join.

The last lines are a Markdown table, one row per fault and home (docs/operating.md, "Fault drill",
quotes it). It takes some minutes and is not part of `make bench`: it kills
processes and its figures are pass/fail, not ratios. Every process it starts runs in its own
process group and is killed, with its descendants, when its row ends or the drill exits.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import platform
import selectors
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CLI = [sys.executable, "-c", "from callgate.cli import main; main()"]
PRODUCER = [sys.executable, str(HERE / "_fault_producer.py")]
HOST = "127.0.0.1"
TOPIC = "callgate.events"
GROUP = "callgate-materializer"
OUTCOMES = frozenset({"ToolUse", "ToolDenied", "Substitute", "Blocked"})
TINY_SPOOL = 64 * 1024
LAKE_MEMBERS = 3  # materializers of one group on a lake; the topic has as many partitions
SESSION_S = 6.0  # the group session of `--assignment group` (consumers.materializer)
REFUSED = "another writer stored"  # how a materializer logs a batch the lake refused (StoreFencedError)


# -- processes ----------------------------------------------------------------------------------


def _stat(pid: int) -> tuple[int, int, str] | None:
    """(parent pid, start time in clock ticks, state) of a live process, or None."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[1]), int(fields[19]), fields[0]


def _alive(pid: int, started: int) -> bool:
    found = _stat(pid)
    return found is not None and found[1] == started and found[2] != "Z"


def descendants(pid: int) -> set[tuple[int, int]]:
    """Every live descendant of `pid` as (pid, start time): a pid alone could be reused later."""
    children: dict[int, list[tuple[int, int]]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (found := _stat(int(entry))) is not None:
            children.setdefault(found[0], []).append((int(entry), found[1]))
    out: set[tuple[int, int]] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.add(child)
                todo.append(child[0])
    return out


class Children:
    """The processes one row started, each in its own session, and every descendant seen of them."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.procs: list[subprocess.Popen[bytes]] = []
        self.known: set[tuple[int, int]] = set()
        _ALL.append(self)

    def spawn(self, args: list[str], log_name: str, *, stdout_pipe: bool = False) -> subprocess.Popen[bytes]:
        log = (self.logs / log_name).open("ab")
        with log:
            proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE if stdout_pipe else log,
                stderr=log,
                start_new_session=True,
                cwd=HERE.parent,
            )
        self.procs.append(proc)
        return proc

    def remember_tree(self, proc: subprocess.Popen[bytes]) -> set[tuple[int, int]]:
        tree = descendants(proc.pid)
        self.known |= tree
        return tree

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        """SIGKILL `proc`, its process group and every descendant seen; reap it."""
        tree = self.remember_tree(proc) if proc.poll() is None else set()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        for pid, started in tree:
            if _alive(pid, started):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()

    def kill_all(self) -> None:
        for proc in self.procs:
            self.kill(proc)
        for pid, started in self.known:
            if _alive(pid, started):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self.known.clear()


_ALL: list[Children] = []
"""Every row's children, for the last-resort cleanup at exit."""


def _kill_everything() -> None:
    for children in _ALL:
        children.kill_all()


def wait_for(check: Callable[[], bool], timeout: float, step: float = 0.05) -> bool:
    """Poll `check` until it is true or `timeout` passes; whether it became true."""
    deadline = time.monotonic() + timeout
    while True:
        if check():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(step)


class Broker:
    """`callgate broker --port P` as its own process; restarts reuse the port (memory storage: empty)."""

    def __init__(self, children: Children, port: int, notes: list[str]) -> None:
        self.children = children
        self.port = port
        self.notes = notes
        self.proc: subprocess.Popen[bytes] | None = None
        self.tree: set[tuple[int, int]] = set()
        self.starts = 0

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    def start(self, timeout: float = 30.0) -> None:
        from callgate.broker import is_port_free, kafka_brokers

        if not wait_for(lambda: is_port_free(HOST, self.port), 10):
            raise RuntimeError(f"port {self.port} is still taken; the broker cannot restart on it")
        self.starts += 1
        proc = self.children.spawn([*CLI, "broker", "--host", HOST, "--port", str(self.port)], "broker.log")

        def answers() -> bool:
            if proc.poll() is not None:
                return True
            try:
                return bool(kafka_brokers(HOST, self.port, timeout=1.0))
            except (OSError, ValueError):
                return False

        if not wait_for(answers, timeout) or proc.poll() is not None:
            tail = (self.children.logs / "broker.log").read_text(errors="replace").strip().splitlines()[-3:]
            raise RuntimeError(f"callgate broker did not answer on {self.bootstrap} (exit {proc.poll()}): {tail}")
        self.proc = proc
        self.tree = self.children.remember_tree(proc)

    def kill(self) -> None:
        """SIGKILL `callgate broker` alone, as a crash would; its broker child must die with it."""
        proc = self.proc
        if proc is None:
            return
        tree = self.tree | self.children.remember_tree(proc)
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        self.proc = None
        if not wait_for(lambda: not any(_alive(p, s) for p, s in tree), 2.0):
            self.notes.append("the broker's child survived a SIGKILL of `callgate broker` (the drill killed it)")
            for pid, started in tree:
                if _alive(pid, started):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)

    def signal_tree(self, sig: signal.Signals) -> None:
        """`sig` to `callgate broker` and to every descendant of it (its broker runs in a session of its own)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.kill(self.proc.pid, sig)
        for pid, started in self.tree:
            if _alive(pid, started):
                os.kill(pid, sig)

    def stop(self) -> None:
        if self.proc is not None:
            self.signal_tree(signal.SIGCONT)
            self.children.kill(self.proc)
            self.proc = None


@dataclass(frozen=True)
class Home:
    """Where a row's store lives: one DuckDB file written by one materializer, or a lake (its catalog a
    database of the drill's PostgreSQL, its data a directory) written by `LAKE_MEMBERS` materializers
    of one group."""

    kind: str  # "file" | "lake"
    db: Path | None = None
    lake: Any = None  # consumers.lake.Lake
    postgres_dsn: str | None = None  # the server's own database, for pg_stat_activity

    @property
    def members(self) -> int:
        return 1 if self.lake is None else LAKE_MEMBERS

    def store_args(self, application_name: str = "callgate-drill-reader") -> list[str]:
        if self.lake is None:
            return ["--db", str(self.db)]
        return ["--lake", f"{self.lake.catalog} application_name={application_name}", "--data", self.lake.data]


class MaterializerProc:
    """`callgate materialize --api` as its own process; a restart opens the same store and API port.
    On a lake it is one member (`name`) of the group (`--assignment group`); its catalog connections
    carry `application_name=callgate-drill-NAME`, so the drill can see its open lake transactions."""

    def __init__(
        self, children: Children, bootstrap: str, home: Home, api_port: int, notes: list[str], name: str = ""
    ) -> None:
        self.children = children
        self.bootstrap = bootstrap
        self.home = home
        self.api_port = api_port
        self.notes = notes
        self.name = name
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.exits = 0  # runs that ended by themselves, with nobody stopping or killing them
        self.interrupted = False  # SIGINT sent to this run: it is leaving
        self.summaries: list[str] = []

    @property
    def application_name(self) -> str:
        return f"callgate-drill-{self.name or 'drain'}"

    def args(self, *, drain: bool = False) -> list[str]:
        """The command line; a drain reads every partition itself (`--assignment all`), on either home."""
        store = self.home.store_args(self.application_name)
        group = ["--assignment", "group"] if self.home.lake is not None and not drain else []
        return [*CLI, "materialize", "--bootstrap", self.bootstrap, "--topic", TOPIC, *store, "--group", GROUP,
                *group]  # fmt: skip

    def log(self, run: int | None = None, suffix: str = "") -> Path:
        label = f"materializer{'-' + self.name if self.name else ''}-{self.starts if run is None else run}"
        return self.children.logs / f"{label}{suffix}.log"

    @property
    def who(self) -> str:
        return f"materializer {self.name + ' ' if self.name else ''}run {self.starts}"

    def start(self, timeout: float = 30.0) -> None:
        self.starts += 1
        proc = self.children.spawn([*self.args(), "--api", f"{HOST}:{self.api_port}"], self.log().name)
        self.proc = proc
        if not wait_for(lambda: proc.poll() is not None or self.health() is not None, timeout, 0.1):
            self.notes.append(f"{self.who}: its read API did not answer within {timeout:g} s")
        if proc.poll() is not None:
            self.notes.append(f"{self.who} exited with code {proc.returncode}")
            self.proc = None

    def healthz(self) -> dict[str, Any] | None:
        """The body of /healthz (200 or 503), or None when nothing answers."""
        try:
            with urllib.request.urlopen(f"http://{HOST}:{self.api_port}/healthz", timeout=2) as response:
                body: dict[str, Any] = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            try:
                body = json.loads(exc.read())
            except ValueError:
                return {"status": f"HTTP {exc.code}"}
        except (OSError, ValueError):
            return None
        return body

    def health(self) -> str | None:
        """`status: detail, lag_total N` of /healthz, or None when nothing answers."""
        body = self.healthz()
        if body is None:
            return None
        return f"{body.get('status')}: {body.get('detail')}, lag_total {body.get('lag_total')}"

    def await_consuming(self, timeout: float) -> bool:
        """Wait until this run of the materializer reads the topic (its partitions are assigned)."""
        return wait_for(lambda: "consuming" in str((self.healthz() or {}).get("detail")), timeout, 0.1)

    def await_batch(self, timeout: float) -> bool:
        """Wait until this run of the materializer has stored a batch, so a kill hits it mid-stream."""
        return wait_for(lambda: bool((self.healthz() or {}).get("last_batch_at")), timeout, 0.1)

    def _exited_by_itself(self) -> None:
        # A materializer that ended on its own, with nobody stopping it, fails the row: an operator's
        # supervisor would restart it, but what it stored live in the meantime is the drill's figure.
        if self.proc is not None and self.proc.poll() is not None and not self.interrupted:
            self.exits += 1
            self.notes.append(f"{self.who} exited by itself with code {self.proc.returncode} (see {self.log()})")

    def kill(self) -> None:
        self._exited_by_itself()
        if self.proc is not None:
            self.children.kill(self.proc)
            self.proc = None

    def signal(self, sig: signal.Signals) -> None:
        """`sig` to the running materializer's process group (SIGSTOP, SIGCONT, SIGINT)."""
        if self.proc is not None and self.proc.poll() is None:
            self.interrupted = self.interrupted or sig == signal.SIGINT
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)

    def owned(self) -> list[int]:
        """The partitions this member reads now, as its /healthz says."""
        return [p["partition"] for p in (self.healthz() or {}).get("partitions", []) if p.get("owned")]

    def stop(self, timeout: float = 30.0) -> None:
        """SIGINT (a clean leave of the group, a last commit; once), SIGKILL after `timeout`."""
        self._exited_by_itself()
        proc = self.proc
        if proc is None:
            return
        if not self.interrupted:
            self.signal(signal.SIGINT)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.notes.append(f"the materializer did not stop within {timeout:g} s of SIGINT (killed)")
        self.children.kill(proc)
        self.proc = None
        self.interrupted = False
        self.summaries.append(_summary_line(self.log()))

    def drain(self, timeout: float) -> tuple[int | None, str]:
        """One `--drain` run: its exit code (None: killed at `timeout`) and its summary line."""
        self.starts += 1
        log = self.log(suffix="-drain")
        proc = self.children.spawn([*self.args(drain=True), "--drain"], log.name)
        try:
            code: int | None = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            code = None
        self.children.kill(proc)
        return code, _summary_line(log)


def _summary_line(log: Path) -> str:
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    for line in reversed(lines):
        if line.startswith(("materialized ", "error:")):
            return line.split(" -> ")[0]
    return lines[-1][:200] if lines else ""


@dataclass
class ProducerRun:
    """A producer process: its ground-truth file, its report, its window and when it was ready."""

    proc: subprocess.Popen[bytes]
    ids: Path
    report: Path
    seconds: float
    ready_at: float
    killed_after: float | None = None


def start_producer(
    children: Children, bootstrap: str, tmp: Path, index: int, *, rate: float, seconds: float,
    spool_max_bytes: int, close_timeout: float, partitions: int,
) -> ProducerRun:  # fmt: skip
    ids, report = tmp / f"ids-{index}.txt", tmp / f"producer-{index}.json"
    proc = children.spawn(
        [*PRODUCER, "--bootstrap", bootstrap, "--topic", TOPIC, "--spool", str(tmp / "spool"), "--ids", str(ids),
         "--report", str(report), "--group", GROUP, "--rate", str(rate), "--seconds", str(seconds),
         "--spool-max-bytes", str(spool_max_bytes), "--close-timeout", str(close_timeout),
         "--partitions", str(partitions)],
        f"producer-{index}.log",
        stdout_pipe=True,
    )  # fmt: skip
    assert proc.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        if not selector.select(timeout=30) or proc.stdout.readline().strip() != b"ready":
            children.kill(proc)
            raise RuntimeError(f"producer {index} did not start (see {children.logs / f'producer-{index}.log'})")
    return ProducerRun(proc, ids, report, seconds, time.monotonic())


def spooled_event_ids(spool_dir: Path) -> set[str] | None:
    """The event ids a dead producer left in its spool (None when it cannot be read)."""
    from events.spool import Spool

    try:
        spool = Spool(spool_dir / "segments", max_bytes=2**40)
    except Exception:
        return None
    try:
        records = spool.peek(max(spool.pending, 1), max_bytes=2**40)
        return {json.loads(record.value)["event_id"] for record in records}
    except Exception:
        return None
    finally:
        spool.close()


# -- the rows -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    """One row of the matrix: the producer's window (seconds from its first call) and the faults
    injected at given seconds into it (scaled by `--quick`)."""

    name: str
    what: str
    seconds: float
    schedule: tuple[tuple[float, str], ...] = ()
    rate: float | None = None  # None: --rate; 0: as fast as the gate can
    spool_max_bytes: int = 256 * 2**20
    second_producer_s: float = 0.0


FAULTS = [
    Fault("baseline", "no faults", 10),
    Fault("materializer-kill", "materializer SIGKILLed and restarted, twice", 16,
          ((4, "kill-materializer"), (10, "kill-materializer"))),
    Fault("broker-kill", "broker SIGKILLed and restarted empty, twice", 16,
          ((4, "kill-broker"), (10, "kill-broker"))),
    Fault("broker-materializer-kill", "broker and materializer SIGKILLed together, twice", 16,
          ((4, "kill-both"), (10, "kill-both"))),
    Fault("materializer-pause", "a materializer paused (SIGSTOP) past its group session, then resumed", 24,
          ((4, "pause-materializer"),)),
    Fault("producer-kill", "broker paused, producer SIGKILLed, a new producer sends its spool", 6,
          ((3, "pause-broker"), (6, "kill-producer")), second_producer_s=5),
    Fault("tiny-spool", "64 KiB spool, broker down 5 s, then up (empty)", 16,
          ((3, "broker-down"), (8, "broker-up")), spool_max_bytes=TINY_SPOOL),
    Fault("load-4000", "4,000 calls/s, healthy pipeline", 20, rate=4000),
    Fault("full-speed", "calls as fast as the gate can, healthy pipeline", 20, rate=0),
]  # fmt: skip


@dataclass
class RowResult:
    """What one row measured (`--json` writes these); `failed` decides the drill's exit code."""

    name: str
    what: str
    home: str = "file"
    calls: int = 0
    blocked: int = 0
    made: int = 0
    stored: int = 0
    lost: int = 0
    lost_reported: int = 0
    lost_unreported: int = 0
    memory_only: int | None = None
    duplicated: int = 0
    foreign: int = 0
    materializer_exits: int = 0
    refused_late: int | None = None  # lake: batches the lake refused a member that committed late
    pause_caught_commit: bool | None = None  # lake pause row: SIGSTOP landed inside a lake transaction
    coverage_exit: int | None = None
    coverage: str = ""
    gaps_recorded: int = 0
    lag_p50_s: float | None = None
    lag_p99_s: float | None = None
    calls_per_s: float = 0.0
    verdict: str = ""
    failed: bool = False
    seconds: float = 0.0
    health_at_end: str | None = None
    producers: list[dict[str, Any]] = field(default_factory=list)
    materializer: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class Scenario:
    """One row: the processes, the schedule of faults, the end (close, stop, drain) and the count."""

    def __init__(self, fault: Fault, options: argparse.Namespace, port: int, tmp: Path, home: Home) -> None:
        self.fault = fault
        self.options = options
        self.scale = 0.5 if options.quick else 1.0
        self.tmp = tmp
        self.home = home
        self.result = RowResult(fault.name, fault.what, home.kind)
        self.children = Children(tmp)
        self.broker = Broker(self.children, port, self.result.notes)
        from callgate.broker import free_port

        self.materializers = [
            MaterializerProc(
                self.children, self.broker.bootstrap, home, free_port(HOST), self.result.notes,
                f"m{i + 1}" if home.lake is not None else "",
            )
            for i in range(home.members)
        ]  # fmt: skip
        self.kills = 0  # materializer kills so far: each hits the next member in turn
        self.producers: list[ProducerRun] = []
        self.spooled_at_kill: set[str] | None = None
        self.unspooled_at_kill: set[str] = set()
        self.close_timeout = 20.0 * self.scale

    def rate(self) -> float:
        return self.options.rate if self.fault.rate is None else self.fault.rate

    def producer(self, seconds: float) -> ProducerRun:
        run = start_producer(
            self.children, self.broker.bootstrap, self.tmp, len(self.producers) + 1, rate=self.rate(),
            seconds=seconds, spool_max_bytes=self.fault.spool_max_bytes, close_timeout=self.close_timeout,
            partitions=LAKE_MEMBERS,
        )  # fmt: skip
        self.producers.append(run)
        return run

    # -- faults

    def _next_victim(self) -> MaterializerProc:
        victim = self.materializers[self.kills % len(self.materializers)]
        self.kills += 1
        return victim

    def _materializer_working(self, victim: MaterializerProc) -> None:
        # Killing a materializer that is still joining its group tests little; give it a bounded
        # while to store something first, and say so when it did not.
        bound = 10 * self.scale
        if not victim.await_batch(bound):
            self.result.notes.append(
                f"{victim.who} had stored nothing {bound:g} s after its turn to be stopped came (stopped anyway)"
            )

    def act(self, action: str) -> None:
        match action:
            case "kill-materializer":
                victim = self._next_victim()
                self._materializer_working(victim)
                victim.kill()
                victim.start()
            case "kill-broker":
                self.broker.kill()
                self.broker.start()
            case "kill-both":
                victim = self._next_victim()
                self._materializer_working(victim)
                self.broker.kill()
                victim.kill()
                self.broker.start()
                victim.start()
            case "pause-materializer":
                self._pause(self._next_victim())
            case "broker-down":
                self.broker.kill()
            case "broker-up":
                self.broker.start()
            case "pause-broker":
                self.broker.signal_tree(signal.SIGSTOP)
            case "kill-producer":
                first = self.producers[-1]
                self.children.kill(first.proc)
                first.killed_after = time.monotonic() - first.ready_at
                made = set(_read_ids(first.ids))
                spooled = spooled_event_ids(self.tmp / "spool")
                if spooled is None:
                    self.result.notes.append("the dead producer's spool could not be read: no memory-only split")
                else:
                    # Not in the spool: delivered before the kill, or only in memory. The lost ones
                    # among them (not in the store at the end) were only in memory.
                    self.spooled_at_kill = spooled
                    self.unspooled_at_kill = made - spooled
                self.broker.signal_tree(signal.SIGCONT)
                self.producer(self.fault.second_producer_s * self.scale)
            case _:
                raise ValueError(f"unknown action {action!r}")

    def _pause(self, victim: MaterializerProc) -> None:
        """SIGSTOP `victim` past its group session, then SIGCONT. On a lake, stopped inside a lake
        transaction, and resumed only once another member stored its partitions: its transaction then
        commits late, and the lake must refuse it (counted from its log)."""
        self._materializer_working(victim)
        if self.home.lake is None:
            # One materializer, no group: stopped as long as a lake member is, so both homes see the same.
            victim.signal(signal.SIGSTOP)
            self._window(time.monotonic() + SESSION_S + 4)
            victim.signal(signal.SIGCONT)
            return
        from consumers.store import AuditStore

        partitions = victim.owned()
        before = _count_lines(self.children.logs.glob(f"materializer-{victim.name}-*.log"), REFUSED)
        self.result.pause_caught_commit = self._stop_in_transaction(victim)
        with AuditStore(self.home.lake, read_only=True) as lake:
            at_pause = lake.offsets(TOPIC, expect=())
            others = [m for m in self.materializers if m is not victim]

            def moved() -> bool:
                # The group gave the victim's partitions to the others, and one of them stored past it.
                owned = {p for m in others for p in m.owned()}
                now = lake.offsets(TOPIC, expect=())
                return set(partitions) <= owned and all(now.get(p, 0) > at_pause.get(p, 0) for p in partitions)

            if not wait_for(moved, SESSION_S + 30, 0.2):
                self.result.notes.append(
                    f"{victim.who}: its partitions {partitions} were not stored by another member within "
                    f"{SESSION_S + 30:g} s of its pause"
                )
        victim.signal(signal.SIGCONT)
        refused = wait_for(
            lambda: _count_lines(self.children.logs.glob(f"materializer-{victim.name}-*.log"), REFUSED) > before,
            30,
            0.1,
        )
        if not refused:
            self.result.notes.append(f"{victim.who} resumed, and nothing of it was refused by the lake within 30 s")

    def _stop_in_transaction(self, victim: MaterializerProc, timeout: float = 10.0) -> bool:
        """SIGSTOP `victim` while its catalog connection is inside a transaction that has lasted 250 ms (a
        batch being written into the lake: a look at the lake's offsets, which a member makes every
        second, takes 30 to 200 ms; a batch's write 0.5 to 1.5 s); whether that was seen before and after
        the stop. Stopped either way."""
        import psycopg

        # Or, at any age, while it holds its writer's turn (an advisory lock on a connection named
        # after its own, held from before a write's BEGIN to after its COMMIT): on a quiet machine a
        # batch's write can take less than 250 ms.
        query = (
            "SELECT state, left(query, 60) FROM pg_stat_activity WHERE application_name = %s"
            " AND xact_start IS NOT NULL AND pid <> pg_backend_pid()"
            " AND (clock_timestamp() - xact_start > interval '250 milliseconds' OR EXISTS ("
            "   SELECT 1 FROM pg_locks l JOIN pg_stat_activity t ON t.pid = l.pid"
            "   WHERE l.locktype = 'advisory' AND l.granted AND t.application_name = %s))"
        )
        with psycopg.connect(self.home.postgres_dsn, autocommit=True) as con:

            def in_transaction() -> list[Any]:
                name = victim.application_name
                return con.execute(query, (name, f"{name} lake turns")).fetchall()

            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if in_transaction():
                    victim.signal(signal.SIGSTOP)
                    if found := in_transaction():
                        self.result.notes.append(f"{victim.who} stopped inside a lake transaction: {found}")
                        return True
                    victim.signal(signal.SIGCONT)
                time.sleep(0.002)  # a poll interval inside the deadline loop
        victim.signal(signal.SIGSTOP)
        self.result.notes.append(f"{victim.who} was stopped outside a lake transaction (none seen in {timeout:g} s)")
        return False

    # -- the row

    def _await_consuming(self, timeout: float) -> None:
        # As in production, the store reads before the agents start: the lag figures are the
        # pipeline's, not the materializers' first group join.
        deadline = time.monotonic() + timeout
        for m in self.materializers:
            if not m.await_consuming(max(0.0, deadline - time.monotonic())):
                self.result.notes.append(f"{m.who} was not consuming {timeout:g} s after the start")

    def run(self) -> RowResult:
        started = time.monotonic()
        try:
            self.broker.start()
            for m in self.materializers:
                m.start()
            self._await_consuming(60)
            first = self.producer(self.fault.seconds * self.scale)
            for at, action in self.fault.schedule:
                self._window(first.ready_at + at * self.scale)
                self.act(action)
            self._finish_producer(self.producers[-1])
            self._restart_if_undelivered(self.producers[-1])
            self.result.health_at_end = "; ".join(str(m.health()) for m in self.materializers)
            for m in self.materializers:
                m.signal(signal.SIGINT)
            for m in self.materializers:
                m.stop()
            if self.broker.proc is None:
                self.broker.start()
            self._drain()
            self.broker.stop()
            self.result.materializer_exits = sum(m.exits for m in self.materializers)
            self._count()
            if self.result.failed:
                self._sink_log_lines()
        except Exception as exc:
            self.result.verdict = f"DRILL ERROR: {type(exc).__name__}: {exc}"
            self.result.failed = True
        finally:
            self.children.kill_all()
            self.result.materializer = [
                f"{m.name + ': ' if m.name else ''}{line}" for m in self.materializers for line in m.summaries if line
            ]
            self.result.seconds = time.monotonic() - started
        return self.result

    def _sink_log_lines(self, last: int = 4) -> None:
        """The producers' last KafkaSink log lines, for a row that failed."""
        for i in range(1, len(self.producers) + 1):
            with contextlib.suppress(OSError):
                lines = (self.tmp / f"producer-{i}.log").read_text(errors="replace").splitlines()
                said = [line.strip() for line in lines if "KafkaSink" in line][-last:]
                self.result.notes.extend(f"producer {i} log: {line[:200]}" for line in said)

    def _window(self, until: float) -> None:
        # A timed pause is the workload here ("run 4 s, then kill"), not a wait for something.
        while (left := until - time.monotonic()) > 0:
            time.sleep(min(left, 0.1))

    def _finish_producer(self, run: ProducerRun) -> None:
        limit = run.ready_at + run.seconds + self.close_timeout + 20
        try:
            run.proc.wait(max(1.0, limit - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.result.notes.append("the producer did not exit in time (killed)")
        self.children.kill(run.proc)
        if run.proc.returncode == 3:
            self.result.notes.append(f"KafkaSink.close(timeout={self.close_timeout:g}) did not return in time")

    def _restart_if_undelivered(self, run: ProducerRun) -> None:
        """A producer whose close left events in its spool is restarted, as its service would be:
        a new sink over the same directory (no calls) must deliver every one of them."""
        try:
            report = json.loads(run.report.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return
        if report.get("close_delivered", True):
            return
        self.result.notes.append(
            f"producer {len(self.producers)} closed with {report.get('pending')} events spooled: restarted"
            " (a new sink over the spool, no calls) to deliver them"
        )
        self._finish_producer(self.producer(0))

    def _drain(self) -> None:
        expected = self._expected()
        deadline = time.monotonic() + 90 * self.scale
        drainer = self.materializers[0]
        for attempt in range(1, 4):
            code, line = drainer.drain(max(10.0, deadline - time.monotonic()))
            drainer.summaries.append(f"drain {attempt}: {line} (exit {code})")
            if expected <= set(read_store(self.home).events) or time.monotonic() >= deadline:
                return

    def _expected(self) -> set[str]:
        made: set[str] = set()
        for run in self.producers:
            made.update(_read_ids(run.ids))
        # What was not spooled at the kill was delivered before it (stored by the time the spooled
        # events are, being earlier in the same partition) or only in memory (never coming).
        return made - self.unspooled_at_kill

    def _count(self) -> None:
        r = self.result
        truth: dict[str, tuple[str, int, str]] = {}
        for run in self.producers:
            truth.update(_read_ids(run.ids))
            if run.report.exists():
                r.producers.append(json.loads(run.report.read_text()))
            else:
                r.producers.append({"killed_after_s": run.killed_after, "calls_seconds": run.killed_after or 0.0})
        store = read_store(self.home)
        if self.home.lake is not None:
            r.refused_late = _count_lines(self.children.logs.glob("materializer-m*.log"), REFUSED)
        types = Counter(kind for _, _, kind in truth.values())
        r.calls = sum(types[kind] for kind in OUTCOMES)
        r.blocked = types["Blocked"]
        r.made = len(truth)
        stored_ids = set(store.events) & truth.keys()
        r.stored = len(stored_ids)
        r.foreign = len(store.events.keys() - truth.keys())
        r.duplicated = store.duplicate_rows + r.foreign
        r.gaps_recorded = store.gaps
        lost = truth.keys() - stored_ids
        r.lost = len(lost)
        if self.spooled_at_kill is not None:
            r.memory_only = len(self.unspooled_at_kill & lost)
        r.coverage_exit, r.coverage, chains_failed = run_coverage(self.home, self.tmp / "coverage.json")
        top: dict[str, int] = {}
        for event_id in stored_ids:
            producer, seq, _ = truth[event_id]
            top[producer] = max(top.get(producer, 0), seq)

        def seen(producer: str, seq: int) -> bool:
            # A hole below the highest stored seq, or inside a range a sink reported lost.
            return seq < top.get(producer, 0) or any(a <= seq <= b for a, b in store.reported.get(producer, ()))

        holes = sum(1 for event_id in lost if seen(truth[event_id][0], truth[event_id][1]))
        r.lost_reported = holes if r.coverage_exit == 1 and chains_failed else 0
        r.lost_unreported = r.lost - r.lost_reported
        lags = [store.events[event_id] for event_id in stored_ids]
        if len(lags) >= 2:
            r.lag_p50_s = statistics.median(lags)
            r.lag_p99_s = statistics.quantiles(lags, n=100)[98]
        seconds = sum(p.get("calls_seconds", 0.0) for p in r.producers)
        r.calls_per_s = r.calls / seconds if seconds else 0.0
        r.verdict, r.failed = verdict(r, strict=self.options.strict)
        if not r.failed and self.home.lake is not None and self.fault.name == "materializer-pause":
            if not r.pause_caught_commit:
                r.verdict, r.failed = "PAUSE MISSED A LAKE TRANSACTION", True
            elif not r.refused_late:
                r.verdict, r.failed = "LATE COMMIT NOT REFUSED", True


def verdict(r: RowResult, *, strict: bool) -> tuple[str, bool]:
    """The row's verdict and whether it fails the drill."""
    if r.duplicated:
        return f"DUPLICATES ({r.duplicated})", True
    if r.materializer_exits:
        return f"MATERIALIZER EXITED BY ITSELF ({r.materializer_exits}x)", True
    if r.coverage_exit not in (0, 1):
        return "COVERAGE COULD NOT CHECK", True
    if r.lost == 0:
        if r.coverage_exit == 1:
            return "no loss; coverage failed anyway", strict
        return "ok", False
    if r.lost_unreported == 0:
        return "loss, reported", strict
    if r.coverage_exit == 0:
        return "UNREPORTED LOSS, coverage clean", True
    return f"LOSS PARTLY UNREPORTED ({r.lost_unreported:,})", True


def _read_ids(path: Path) -> dict[str, tuple[str, int, str]]:
    out: dict[str, tuple[str, int, str]] = {}
    with contextlib.suppress(FileNotFoundError), path.open() as handle:
        for line in handle:
            parts = line.split()
            if len(parts) == 4:  # a line cut by SIGKILL mid-write cannot happen (one write), but be sure
                out[parts[0]] = (parts[1], int(parts[2]), parts[3])
    return out


@dataclass
class StoreView:
    """The store's event ids with their lag, duplicate rows and recorded chain gaps."""

    events: dict[str, float]  # event_id -> seconds from decision to visible in the store
    duplicate_rows: int
    gaps: int
    reported: dict[str, list[tuple[int, int]]] = field(default_factory=dict)  # producer -> loss report ranges


def _count_lines(logs: Any, text: str) -> int:
    """Lines holding `text` in the files `logs`."""
    count = 0
    for log in logs:
        with contextlib.suppress(OSError):
            count += sum(text in line for line in log.read_text(errors="replace").splitlines())
    return count


def read_store(home: Home) -> StoreView:
    """What the store holds (a file opened read-only: call it only when no materializer runs)."""
    from consumers.store import AuditStore, connect

    store = None
    if home.lake is not None:
        store = AuditStore(home.lake, read_only=True)
        con = store.cursor()
    elif home.db is None or not home.db.exists():
        return StoreView({}, 0, 0)
    else:
        con = connect(home.db, read_only=True)
    try:
        rows = con.execute("SELECT event_id, epoch(ingested_at) - epoch(time) FROM events").fetchall()
        (total, distinct) = con.execute("SELECT count(*), count(DISTINCT event_id) FROM events").fetchone() or (0, 0)
        (gaps,) = con.execute("SELECT count(*) FROM chain_breaks WHERE kind = 'gap'").fetchone() or (0,)
        # Gaps a sink reported (events.loss): the seqs a dead process took with it.
        ranges = con.execute(
            "SELECT producer_id, evidence->>'first_seq', evidence->>'last_seq' FROM chain_breaks"
            " WHERE kind = 'gap' AND (evidence->>'type') = 'LossReport'"
        ).fetchall()
    finally:
        con.close()
        if store is not None:
            store.close()
    reported: dict[str, list[tuple[int, int]]] = {}
    for producer, first, last in ranges:
        reported.setdefault(str(producer), []).append((int(first), int(last)))
    return StoreView({event_id: float(lag) for event_id, lag in rows}, int(total) - int(distinct), int(gaps), reported)


def run_coverage(home: Home, report: Path) -> tuple[int | None, str, bool]:
    """`callgate coverage --db | --lake --data`: exit code, a short reason, whether its chain check failed."""
    try:
        proc = subprocess.run(
            [*CLI, "coverage", *home.store_args(), "--json", str(report)], capture_output=True, text=True, timeout=120
        )
    except subprocess.TimeoutExpired:
        return None, "timed out", False
    if not report.exists():
        last = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
        return proc.returncode, (last[-1] if last else "no report")[:90], False
    checks = json.loads(report.read_text())["checks"]
    failed = [check for check in checks if check["status"] == "fail"]
    reason = "; ".join(f"{check['name']}: {check['summary']}" for check in failed) or "clean"
    short = reason if len(reason) <= 90 else reason[:87] + "..."
    return proc.returncode, short, any(check["name"] == "chains" for check in failed)


# -- output -------------------------------------------------------------------------------------


def _lag(r: RowResult) -> str:
    if r.lag_p50_s is None or r.lag_p99_s is None:
        return ""
    return f"{r.lag_p50_s:.2f} / {r.lag_p99_s:.2f}"


def markdown(rows: list[RowResult], header: str) -> str:
    lines = [
        header,
        "",
        "| store | fault | calls (blocked) | events made | stored | lost (unreported) | duplicated "
        "| late commits refused | `callgate coverage` | lag p50 / p99 s | verdict |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | --- |",
    ]
    for r in rows:
        lost = f"{r.lost:,} ({r.lost_unreported:,})" if r.lost else "0"
        if r.memory_only:
            lost += f", {r.memory_only:,} memory only"
        coverage = "" if r.coverage_exit is None and not r.coverage else f"exit {r.coverage_exit}: {r.coverage}"
        store = "file" if r.home == "file" else f"lake, {LAKE_MEMBERS} materializers"
        refused = "" if r.refused_late is None else f"{r.refused_late:,}"
        lines.append(
            f"| {store} | {r.name} | {r.calls:,} ({r.blocked:,}) | {r.made:,} | {r.stored:,} | {lost} "
            f"| {r.duplicated:,} | {refused} | {coverage.replace('|', '/')} | {_lag(r)} | {r.verdict} |"
        )
    return "\n".join(lines) + "\n"


def details(r: RowResult) -> str:
    out = [f"{r.home} {r.name} ({r.what}): {r.verdict}, {r.seconds:.0f} s, {r.calls_per_s:,.0f} calls/s"]
    for i, p in enumerate(r.producers, 1):
        if "sent" in p:
            out.append(
                f"  producer {i}: {p['calls']:,} calls {p['outcomes']}, sent {p['sent']:,}, dropped {p['dropped']:,}, "
                f"pending {p['pending']:,}, close {'delivered' if p['close_delivered'] else 'NOT delivered'} in "
                f"{p['close_seconds']:.1f} s{' (hung)' if p['close_hung'] else ''}, confirm_group "
                f"{'on' if p['confirm_group'] else 'unsupported'}, last error {p['last_error']}"
            )
        else:
            out.append(f"  producer {i}: SIGKILLed after {p['calls_seconds']:.1f} s (no report)")
    out.extend(f"  materializer: {line}" for line in r.materializer)
    if r.memory_only is not None:
        out.append(f"  lost and not in the spool when the producer was killed (only in memory): {r.memory_only:,}")
    out.append(f"  /healthz at the end: {r.health_at_end}; gap rows recorded: {r.gaps_recorded:,}")
    if r.refused_late is not None:
        caught = "" if r.pause_caught_commit is None else f"; the pause caught a transaction: {r.pause_caught_commit}"
        out.append(f"  batches the lake refused a member that committed late: {r.refused_late:,}{caught}")
    out.extend(f"  note: {note}" for note in r.notes)
    return "\n".join(out)


def _home(kind: str, tmp: Path, postgres: Any) -> Home:
    if kind == "file":
        return Home("file", db=tmp / "audit.duckdb")
    from consumers.lake import lake_from_options

    lake = lake_from_options(f"postgres:{postgres.new_database()}", str(tmp / "lake-data"))
    return Home("lake", lake=lake, postgres_dsn=postgres.dsn)


def main() -> None:
    names = [fault.name for fault in FAULTS]
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", choices=names, metavar="ROW", help=f"run only these: {', '.join(names)}")
    parser.add_argument("--quick", action="store_true", help="half of every window")
    parser.add_argument("--rate", type=float, default=750.0, help="calls per second of the producer (default 750)")
    parser.add_argument("--json", type=Path, help="also write every row, with its details, as JSON here")
    parser.add_argument("--strict", action="store_true", help="fail on any loss, reported or not")
    parser.add_argument("--keep", action="store_true", help="keep every row's directory (failed rows' are kept)")
    parser.add_argument(
        "--store", choices=["file", "lake", "both"], default="both",
        help=f"every row against one DuckDB file, a lake with {LAKE_MEMBERS} materializers, or both (default)",
    )  # fmt: skip
    options = parser.parse_args()

    from callgate.broker import free_port
    from callgate.postgres import LocalPostgres

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    atexit.register(_kill_everything)
    port = free_port(HOST)
    rows: list[RowResult] = []
    started = time.monotonic()
    kinds = ["file", "lake"] if options.store == "both" else [options.store]
    postgres = LocalPostgres(prefix="callgate-drill-postgres-")
    try:
        if "lake" in kinds:
            postgres.start()
        for kind, fault in [(k, f) for k in kinds for f in FAULTS if not options.only or f.name in options.only]:
            tmp = Path(tempfile.mkdtemp(prefix=f"callgate-drill-{kind}-{fault.name}-"))
            print(f"{kind} {fault.name}: {fault.what} ...", flush=True)
            row = None
            try:
                row = Scenario(fault, options, port, tmp, _home(kind, tmp, postgres)).run()
            finally:
                # A failed row keeps its directory: the logs say what happened.
                if options.keep or row is None or row.failed:
                    print(f"  kept {tmp} (logs, store, event ids)")
                else:
                    shutil.rmtree(tmp, ignore_errors=True)
            rows.append(row)
            print(details(row), flush=True)
    finally:
        _kill_everything()
        postgres.stop()
    elapsed = time.monotonic() - started
    confirm = any(p.get("confirm_group") for r in rows for p in r.producers)
    header = (
        f"Fault drill, {time.strftime('%Y-%m-%d')}, {platform.machine()}, {os.cpu_count()} CPUs, "
        f"{options.rate:,.0f} calls/s{', --quick' if options.quick else ''}, confirm_group "
        f"{'on' if confirm else 'not supported by KafkaSink'}, {elapsed:.0f} s."
    )
    table = markdown(rows, header)
    print()
    print(table, end="")
    if options.json:
        options.json.write_text(
            json.dumps({"header": header, "seconds": elapsed, "rows": [asdict(r) for r in rows]}, indent=2) + "\n",
            encoding="utf-8",
        )
        print(f"JSON: {options.json}")
    failed = [r.name for r in rows if r.failed]
    if failed:
        print(f"drill FAILED: {', '.join(failed)}")
        raise SystemExit(1)
    print("drill passed: every loss was reported")


if __name__ == "__main__":
    main()
