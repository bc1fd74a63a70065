"""The readers on a lake that three materializers are writing: the dashboard's page, `callgate coverage`
and `callgate replay` read it directly while it grows (real processes: the embedded broker, three
`callgate materialize --assignment group --lake` members, a producer making gated calls)."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import httpx
import psycopg
import pytest

from callgate.broker import EmbeddedBroker, free_port
from consumers.lake import Lake, lake_from_options
from consumers.store import AuditStore

from .test_app import metrics, open_app

CLI = [sys.executable, "-c", "from callgate.cli import main; main()"]
PARTITIONS = 3

# A producer process: one gate per partition (their producer ids chosen so that the sink's key
# partitioner puts each on another one), gated calls at some 100 a second until it is killed.
_PRODUCER = """
import asyncio, sys
from aiokafka.partitioner import murmur2
from events.kafka import KafkaSink
from interceptor_core import Gate, RunContext, tool

@tool(description="Loads an order record by ID")
def get_order(order_id: str) -> str:
    return f"order {order_id}"

async def main() -> None:
    bootstrap, topic, spool, partitions = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    sink = KafkaSink(bootstrap, topic, spool)
    desks = {}
    while len(desks) < partitions:
        gate = Gate("shop", sinks=[sink])
        partition = (murmur2(gate.producer_id.encode()) & 0x7FFFFFFF) % partitions
        desks.setdefault(partition, gate.agent("desk", tools=[get_order]))
    print("ready", flush=True)
    run = RunContext(tenant="acme", principal="u-1")
    n = 0
    while True:
        await desks[n % partitions].call("get_order", {"order_id": f"ACME-{n}"}, run=run)
        n += 1
        await asyncio.sleep(0.01)  # sleep-ok: paces the producer (about 100 calls a second), waits for nothing

asyncio.run(main())
"""


def _until(check: Callable[[], bool], what: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what} within {timeout:g} s"
        time.sleep(0.2)  # sleep-ok: a poll interval inside the deadline loop (other processes)


def _events(lake: Lake) -> int:
    with AuditStore(lake, read_only=True) as reader:
        return reader.counts().total_events


def _healthz(port: int) -> dict[str, Any]:
    try:
        body: dict[str, Any] = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).json()
    except (httpx.HTTPError, ValueError):
        return {}
    return body


class LiveLake:
    """A lake while three materializers write the events a producer makes into it."""

    def __init__(self, lake: Lake, members: list[subprocess.Popen[bytes]], tmp: Path) -> None:
        self.lake = lake
        self.members = members
        self.tmp = tmp

    @property
    def options(self) -> list[str]:
        return ["--lake", self.lake.catalog, "--data", self.lake.data]

    def grown_past(self, count: int) -> None:
        """Wait until the lake holds more than `count` events, every member still writing."""

        def grown() -> bool:
            assert all(m.poll() is None for m in self.members), "a materializer exited"
            return _events(self.lake) > count

        _until(grown, f"the lake did not grow past {count} events")


@pytest.fixture(scope="module")
def live_lake(
    postgres_dsn: str, kafka_broker: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveLake]:
    """Three `callgate materialize --assignment group --lake` members of one group, one partition each,
    and a producer making gated calls; yielded once every member has stored a batch. Some 20 s of
    starting (three group joins, each member's first lake commits), shared by the module's tests."""
    tmp = tmp_path_factory.mktemp("live-lake")
    database = f"lake_{uuid.uuid4().hex}"
    with psycopg.connect(postgres_dsn, autocommit=True) as con:
        con.execute(f'CREATE DATABASE "{database}"')
    lake = lake_from_options(
        f"postgres:{postgres_dsn.replace('dbname=postgres', f'dbname={database}')}", str(tmp / "data")
    )
    AuditStore(lake).close()  # the schema, before the members start
    topic, group = f"events-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    from events.kafka import ensure_topic

    asyncio.run(ensure_topic(kafka_broker.bootstrap, topic, PARTITIONS))
    command = [*CLI, "materialize", "--bootstrap", kafka_broker.bootstrap, "--topic", topic, "--group", group]
    command += ["--assignment", "group", "--lake", lake.catalog, "--data", lake.data]
    ports = [free_port("127.0.0.1") for _ in range(PARTITIONS)]
    logs: list[IO[bytes]] = [(tmp / f"m{n}.log").open("wb") for n in range(PARTITIONS)]
    logs.append((tmp / "producer.log").open("wb"))
    processes = [
        subprocess.Popen([*command, "--api", f"127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
        for port, log in zip(ports, logs, strict=False)
    ]
    producer = subprocess.Popen(
        [sys.executable, "-c", _PRODUCER, kafka_broker.bootstrap, topic, str(tmp / "spool"), str(PARTITIONS)],
        stdout=subprocess.PIPE,
        stderr=logs[-1],
    )
    processes.append(producer)
    try:
        assert producer.stdout is not None
        assert producer.stdout.readline().strip() == b"ready", (tmp / "producer.log").read_text()
        members = processes[:PARTITIONS]
        _until(
            lambda: all(m.poll() is None for m in members) and all(_healthz(p).get("last_batch_at") for p in ports),
            "every member did not store a batch",
        )
        yield LiveLake(lake, members, tmp)
    finally:
        for process in processes:
            process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for log in logs:
            log.close()
        if producer.stdout is not None:
            producer.stdout.close()


class TestReadersWhileThreeMaterializersWrite:
    def test_the_dashboard_shows_the_calls_of_a_growing_lake(
        self, live_lake: LiveLake, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The console's overview loads from the lake without an error, and a later run of it shows more calls."""
        from dashboard import ui

        source = {"CALLGATE_LAKE": live_lake.lake.catalog, "CALLGATE_DATA": live_lake.lake.data}
        try:
            at = open_app(source, monkeypatch, window="Last hour")
            first = int(metrics(at)["Calls"].replace(",", ""))
            assert first > 0
            live_lake.grown_past(_events(live_lake.lake))

            def shows_more() -> bool:
                # The console caches a query's answer for a few seconds: run it again until it is fresh.
                at.run()
                assert not at.exception, [e.value for e in at.exception]
                return int(metrics(at)["Calls"].replace(",", "")) > first

            _until(shows_more, f"the overview did not show more than {first} calls")
        finally:
            ui._file_reader.clear()

    def test_coverage_and_replay_read_the_lake_as_it_grows(self, live_lake: LiveLake) -> None:
        """`callgate coverage` exits 0 (every chain whole) and `callgate replay` 0 under an allowing
        policy, both run at once while the members write, and each counts events the lake took after
        an earlier look at it."""
        policy = live_lake.tmp / "allow.policy.yaml"
        policy.write_text("version: 1\nname: allow\ndefault: allow\nrules: []\n")
        with AuditStore(live_lake.lake, read_only=True) as reader:
            ((events, tool_uses),) = (
                reader.cursor().execute("SELECT count(*), count(*) FILTER (type = 'ToolUse') FROM events").fetchall()
            )
        live_lake.grown_past(events)
        reports = {name: live_lake.tmp / f"{name}.json" for name in ("coverage", "replay")}
        commands = {
            "coverage": [*CLI, "coverage", *live_lake.options, "--json", str(reports["coverage"])],
            "replay": [*CLI, "replay", "--policy", str(policy), *live_lake.options, "--since", "all",
                       "--json", str(reports["replay"])],
        }  # fmt: skip
        running = {
            name: subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            for name, command in commands.items()
        }
        said = {name: process.communicate(timeout=120)[0].decode() for name, process in running.items()}
        assert {name: process.returncode for name, process in running.items()} == {"coverage": 0, "replay": 0}, said
        assert json.loads(reports["coverage"].read_text())["facts"]["events"] > events
        assert json.loads(reports["replay"].read_text())["checked"] > tool_uses
