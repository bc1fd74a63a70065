"""The producer process of the fault drill (`bench/faults.py` starts it; not meant to be run by hand).

    python bench/_fault_producer.py --bootstrap HOST:PORT --topic T --spool DIR --ids FILE --report FILE
        [--group G] [--rate R] [--seconds S] [--spool-max-bytes N] [--close-timeout S] [--partitions N]

A real `Gate` (the benchmarks' support desk: three allowing interceptors) with two sinks: a tap that
appends one line per event to `--ids` (`event_id producer_id seq type`, one `write` system call per
event, so a SIGKILL of this process loses none of the lines already written: they are in the
kernel's page cache), and a `KafkaSink` spooling in `--spool`. The tap is the ground truth of what
the gate made. It makes tool calls at `--rate` calls per second (0: as fast as it can) for
`--seconds`, then closes the sink with `--close-timeout`, and writes a JSON report: calls by
outcome, events made, the sink's counters, whether `close` delivered everything and how long it took.

`--partitions N` (default 1): as many gates as it takes for the producers' chains to cover the topic's N
partitions (the sink keys each event by its gate's producer id), all sharing the two sinks, the calls
dealt among them in turn, so that every member of a consumer group of up to N has a partition to
write.

`--group` becomes `KafkaSink(confirm_group=...)` when the sink accepts it (the report says whether it
did). "ready" is printed on stdout once the gate is built, so the drill times its faults from the
first call.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gate_overhead import ARGS, RUN, build_desk

from events.kafka import KafkaSink
from interceptor_core import ToolBlockedError

AUDIT_UNAVAILABLE = "audit unavailable"


class IdTap:
    """A sink writing `event_id producer_id seq type` per event with one `os.write` (atomic for a
    short line on an O_APPEND file, so safe from any thread). Not a gating sink: no `available`."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.count = 0

    def emit(self, event: Any) -> None:
        os.write(self._fd, f"{event.event_id} {event.producer_id} {event.seq} {event.type}\n".encode())
        self.count += 1


def build_sink(options: argparse.Namespace) -> tuple[KafkaSink, bool]:
    kwargs: dict[str, Any] = {"spool_max_bytes": options.spool_max_bytes}
    confirm = options.group is not None and "confirm_group" in inspect.signature(KafkaSink).parameters
    if confirm:
        kwargs["confirm_group"] = options.group
    return KafkaSink(options.bootstrap, options.topic, options.spool, **kwargs), confirm


def build_desks(sinks: list[Any], partitions: int) -> list[Any]:
    """Desks of gates of their own until their producer ids cover `partitions` partitions (as
    `KafkaSink` picks them: murmur2 of the key over the listed partitions), one desk per partition."""
    from aiokafka.partitioner import murmur2

    desks: dict[int, Any] = {}
    for _ in range(1000):
        desk = build_desk(sinks=sinks)
        key = str(desk.gate.producer_id).encode()
        desks.setdefault((murmur2(key) & 0x7FFFFFFF) % partitions, desk)
        if len(desks) == partitions:
            return [desks[p] for p in sorted(desks)]
    raise RuntimeError(f"no gates cover {partitions} partitions after 1000 tries")


async def make_calls(desks: list[Any], rate: float, seconds: float, outcomes: dict[str, int]) -> None:
    start = time.perf_counter()
    end = start + seconds
    i = 0
    while True:
        now = time.perf_counter()
        if now >= end:
            return
        if rate > 0:
            ahead = start + i / rate - now
            if ahead > 0:
                await asyncio.sleep(ahead)
        i += 1
        try:
            result = await desks[i % len(desks)].call("get_order", ARGS, run=RUN)
        except ToolBlockedError as exc:
            key = "blocked_audit" if exc.reason.startswith(AUDIT_UNAVAILABLE) else "blocked_other"
            outcomes[key] += 1
        else:
            outcomes["ok" if result.ok else "error"] += 1


async def main_async(options: argparse.Namespace) -> int:
    tap = IdTap(options.ids)
    sink, confirm = build_sink(options)
    desks = build_desks([tap, sink], options.partitions)
    print("ready", flush=True)
    outcomes = {"ok": 0, "error": 0, "blocked_audit": 0, "blocked_other": 0}
    started = time.perf_counter()
    await make_calls(desks, options.rate, options.seconds, outcomes)
    calls_seconds = time.perf_counter() - started
    at_end = {"pending": sink.pending, "available": sink.available, "connected": sink.connected}
    closing = time.perf_counter()
    hung = False
    try:
        # close(timeout) must return within its timeout; a margin on top catches one that does not.
        delivered = await asyncio.wait_for(sink.close(timeout=options.close_timeout), options.close_timeout + 5)
    except TimeoutError:
        delivered, hung = False, True
    report = {
        "calls": sum(outcomes.values()),
        "outcomes": outcomes,
        "calls_seconds": calls_seconds,
        "events_made": tap.count,
        "confirm_group": confirm,
        "at_end_of_calls": at_end,
        "close_delivered": delivered,
        "close_hung": hung,
        "close_seconds": time.perf_counter() - closing,
        "sent": sink.sent,
        "dropped": sink.dropped,
        "pending": sink.pending if not hung else at_end["pending"],
        "send_failures": sink.send_failures,
        "oversize": sink.oversize,
        "last_error": sink.last_error,
    }
    tmp = options.report.with_suffix(".tmp")
    tmp.write_text(json.dumps(report, indent=2), encoding="utf-8")
    tmp.replace(options.report)
    if hung:
        # A close that hung leaves the sender and an executor thread behind, which asyncio.run and
        # the interpreter would wait for at exit: leave at once, as an operator's kill would.
        sys.stdout.flush()
        os._exit(3)
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--spool", type=Path, required=True)
    parser.add_argument("--ids", type=Path, required=True)
    parser.add_argument("--report", type=Path, required=True)
    parser.add_argument("--group")
    parser.add_argument("--rate", type=float, default=750.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--spool-max-bytes", type=int, default=256 * 2**20)
    parser.add_argument("--close-timeout", type=float, default=20.0)
    parser.add_argument("--partitions", type=int, default=1)
    options = parser.parse_args()
    raise SystemExit(asyncio.run(main_async(options)))


if __name__ == "__main__":
    main()
