"""A sharded store with real processes: three `callgate materialize --assignment group` in one consumer
group on the embedded broker, each with its own store file and read API. One of them SIGKILLs itself
between a store commit and its Kafka commit (the fault injection point), its partitions move to the
two others, which read again what it had stored; it is restarted with the same --db, rejoins (no
--instance-id: the embedded broker never moves a dead static member's partitions), and gives up its
copies of what they read again. The scenario runs once for the module; each test checks one promise
on its record."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import httpx
import pytest
from aiokafka import AIOKafkaProducer

from callgate.broker import EmbeddedBroker, free_port
from consumers import QUERIES, run_query, shards
from consumers.api import ApiServer, build_app
from consumers.coverage import run_checks
from consumers.federation import FederatedRunner
from consumers.federation import Shard as FederatedShard
from consumers.materializer import FAULT_KILL_BETWEEN_COMMITS, Materializer
from consumers.metrics import MaterializerMetrics
from consumers.reader import ApiReader, FileReader
from consumers.store import AuditStore, RawRecord
from events import MemorySink, encode_event
from events.kafka import ensure_topic
from interceptor_core import Gate, RunContext, tool

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

PARTITIONS = 6
PRODUCERS = 6
WAVE = 8
"""Events per producer and wave (three waves)."""


@tool
async def quote(order_id: str) -> str:
    """Quotes an order."""
    return f"quote for {order_id}"


def chains() -> list[list[Any]]:
    """Per producer (a gate of its own), its chain of 3 * WAVE events: its ToolsRegistered, then its calls.
    The gates run in a thread of their own, so that async tests may ask too."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(_chains).result()


def _chains() -> list[list[Any]]:
    out = []
    for n in range(PRODUCERS):
        sink = MemorySink()
        gate = Gate(f"g-{n}", sinks=[sink])
        desk = gate.agent("desk", tools=[quote])

        async def run() -> None:
            for i in range(3 * WAVE - 1):
                await desk.call("quote", {"order_id": f"ACME-{i}"}, run=RunContext(tenant="acme"))  # noqa: B023
            await gate.close()  # noqa: B023

        asyncio.run(run())
        chain = sorted(sink.events, key=lambda e: e.seq)
        assert len(chain) == 3 * WAVE, len(chain)
        out.append(chain)
    return out


async def publish(bootstrap: str, topic: str, events: list[tuple[int, Any]]) -> None:
    """Each (partition, event) keyed by its producer, as a KafkaSink would."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=False)
    await producer.start()
    try:
        for partition, event in events:
            await producer.send(topic, encode_event(event), key=event.producer_id.encode(), partition=partition)
        await producer.flush()
    finally:
        await producer.stop()


def wave(all_chains: list[list[Any]], n: int) -> list[tuple[int, Any]]:
    return [(i % PARTITIONS, e) for i, chain in enumerate(all_chains) for e in chain[n * WAVE : (n + 1) * WAVE]]


@dataclass
class Shard:
    """One `callgate materialize` process of the group, restartable on the same store and port."""

    name: str
    db: Path
    port: int
    command: list[str]
    logs: Path
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    def start(self, env: dict[str, str] | None = None) -> None:
        self.starts += 1
        log = (self.logs / f"{self.name}-{self.starts}.log").open("wb")
        self.proc = subprocess.Popen(
            self.command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
        log.close()

    def health(self) -> dict[str, Any]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=2) as response:
                return dict(json.loads(response.read()))
        except urllib.error.HTTPError as error:
            return dict(json.loads(error.read()))
        except OSError:
            return {}

    def stored(self) -> int:
        """Events in its store, through its read API (0 while it does not answer)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/v1/queries/event_counts", timeout=2) as response:
                body = json.loads(response.read())
        except OSError:
            return 0
        return sum(int(row.get("events") or 0) for row in body["rows"])

    def breaks(self) -> int | None:
        """Chain break rows in its store, through its read API (None while it does not answer)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/v1/queries/pipeline_health", timeout=2) as r:
                body = json.loads(r.read())
        except OSError:
            return None
        return int(body["rows"][0]["chain_breaks"]) if body["rows"] else 0

    def owned(self) -> set[int]:
        return {p["partition"] for p in self.health().get("partitions", []) if p.get("owned")}

    def caught_up(self) -> bool:
        parts = [p for p in self.health().get("partitions", []) if p.get("owned")]
        return bool(parts) and all(p.get("lag") == 0 for p in parts)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


FLEET: list[Shard] = []
"""The shards of the running scenario, whose health a failed wait shows."""


def until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            seen = "; ".join(f"{s.name}: {s.health().get('detail')}" for s in FLEET)
            raise AssertionError(f"{what}: not within {timeout} s ({seen})")
        time.sleep(0.1)  # sleep-ok: polling real processes with a deadline


@dataclass
class Scenario:
    produced: list[list[Any]]
    shards: list[Shard]
    killed_code: int | None = None
    unresolved_seen: str = ""
    seconds: float = 0.0
    settled_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    """When every event was stored once with no overlap unresolved (before the shards were stopped)."""
    rows: dict[str, Any] = field(default_factory=dict)
    federated: dict[str, tuple[dict[str, Any], dict[str, Any]]] = field(default_factory=dict)
    """Every named query's parameters and answer through serve over the three shards, once settled."""
    coverage: list[tuple[str, str, str]] = field(default_factory=list)
    """The coverage checks through serve then: (name, status, summary)."""
    coverage_exit: int | None = None


SEGMENTS = (
    f"SELECT producer_id, first_seq, first_prev_hash, last_seq, last_hash, holes FROM ({shards.CHAIN_SEGMENTS_SQL})"  # noqa: S608
)


def rows(db: Path, sql: str, params: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
    with AuditStore(db, read_only=True) as store:
        con = store.cursor()
        try:
            return con.execute(sql, params or {}).fetchall()
        finally:
            con.close()


@pytest.fixture(scope="module")
def scenario(kafka_broker: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory) -> Scenario:
    started = time.monotonic()
    work = tmp_path_factory.mktemp("shards")
    topic, group = f"events-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    asyncio.run(ensure_topic(kafka_broker.bootstrap, topic, PARTITIONS))
    fleet = []
    for n in range(3):
        db, port = work / f"shard-{n}.duckdb", free_port("127.0.0.1")
        command = [
            sys.executable, "-c", "from callgate.cli import main; main()", "materialize",
            "--bootstrap", kafka_broker.bootstrap, "--topic", topic, "--db", str(db), "--group", group,
            "--assignment", "group", "--api", f"127.0.0.1:{port}",
            "--unread-grace", "2", "--gap-grace", "1",
        ]  # fmt: skip
        fleet.append(Shard(f"shard-{n}", db, port, command, work))
    FLEET[:] = fleet
    victim, others = fleet[0], fleet[1:]
    produced = chains()
    result = Scenario(produced, fleet)
    try:
        # The victim SIGKILLs itself right after its store commits its second batch.
        victim.start({FAULT_KILL_BETWEEN_COMMITS: "2"})
        for shard in others:
            shard.start()
        until(lambda: all(s.owned() for s in fleet), 120, "every shard owns a partition")
        asyncio.run(publish(kafka_broker.bootstrap, topic, wave(produced, 0)))
        first = PRODUCERS * WAVE
        until(lambda: sum(s.stored() for s in fleet) >= first or victim.proc.poll() is not None, 60, "wave 1 stored")  # type: ignore[union-attr]
        asyncio.run(publish(kafka_broker.bootstrap, topic, wave(produced, 1)))
        until(lambda: victim.proc.poll() is not None, 60, "the victim killed itself between its commits")  # type: ignore[union-attr]
        result.killed_code = victim.proc.returncode  # type: ignore[union-attr]
        # Its partitions move to the two others, which read again from the group's committed offsets.
        until(lambda: len(others[0].owned() | others[1].owned()) == PARTITIONS, 120, "the partitions moved")
        until(lambda: all(s.caught_up() for s in others), 60, "the others caught up")

        def unresolved() -> bool:
            result.unresolved_seen = " ".join(s.health().get("detail", "") for s in others)
            return "has not resolved its copies" in result.unresolved_seen

        until(unresolved, 30, "the unresolved overlap shows in /healthz")
        victim.start()
        until(lambda: bool(victim.owned()), 120, "the restarted victim rejoined")

        def resolved(total: int) -> Callable[[], bool]:
            def check() -> bool:
                details = " ".join(s.health().get("detail", "") for s in fleet)
                return "has not resolved" not in details and sum(s.stored() for s in fleet) == total

            return check

        # Each event once across the stores again: the victim gave up its copies of what was read again.
        until(resolved(2 * PRODUCERS * WAVE), 90, "the overlap resolved")
        asyncio.run(publish(kafka_broker.bootstrap, topic, wave(produced, 2)))
        until(resolved(3 * PRODUCERS * WAVE), 60, "wave 3 stored")
        result.settled_at = datetime.now(UTC)
        # A shard's next gap check (every second here) drops the gaps a handoff left at seqs another shard
        # holds; what serve is compared on is the store at rest.
        until(lambda: all(s.breaks() == 0 for s in fleet), 30, "no shard holds a chain break")
        ask_serve(result)
    finally:
        for shard in fleet:
            shard.stop()
    result.seconds = time.monotonic() - started
    return result


def ask_serve(result: Scenario) -> None:
    """Every named query (a page of 1,000 where it pages) and the coverage checks through serve's read API
    over the three running shards."""
    runner = FederatedRunner([FederatedShard(f"http://127.0.0.1:{s.port}") for s in result.shards], timeout_s=30)
    server = ApiServer(build_app(runner, MaterializerMetrics(), runner.health))
    server.start()
    try:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            for name, query in QUERIES.items():
                params = {"limit": 1000} if "limit" in query.params else {}
                if query.params.get("call_id") is not None and query.params["call_id"].required:
                    params["call_id"] = "no-such-call"
                response = client.get(f"/v1/queries/{name}", params=params)
                assert response.status_code == 200, (name, response.text)
                result.federated[name] = (params, response.json())
        report = run_checks(ApiReader(server.url))
        result.coverage = [(c.name, c.status, c.summary) for c in report.checks]
        result.coverage_exit = report.exit_code
    finally:
        server.stop()
        runner.close()


def one_store(path: Path, produced: list[list[Any]]) -> AuditStore:
    """One store of every produced event, at the partitions and offsets the broker gave them."""
    store = AuditStore(path)
    offsets: Counter[int] = Counter()
    records = []
    for n in range(3):
        for partition, event in wave(produced, n):
            records.append(RawRecord(TOPIC_OF_ONE, partition, offsets[partition], event.producer_id.encode(),
                                     encode_event(event)))  # fmt: skip
            offsets[partition] += 1
    store.ingest(records, {(TOPIC_OF_ONE, p): o for p, o in offsets.items()})
    store.close_open_gaps()
    store.close_checkpoints()
    return store


TOPIC_OF_ONE = "events"
# What differs between one store and the shards without being an answer: when each store read the
# events, and the windows a federation pins to its own clock.
_VOLATILE: Final = {"offset_updated_at", "last_ingested_at", "seconds_since_last_ingest", "seconds_since_commit",
                    "median_delay_s", "p95_delay_s", "max_delay_s", "received_at", "first_received",
                    "last_received", "since", "until", "previous_since", "kafka_topic", "topic"}  # fmt: skip


def _kept(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k not in _VOLATILE} for r in rows]


class TestShardedGroup:
    def test_every_named_query_through_serve_equals_one_store(self, scenario: Scenario, tmp_path: Path) -> None:
        """After the SIGKILL, the handoffs and the restart, every named query through serve over the three
        shards answers what one store of the same events does, and the coverage checks are green as there."""
        with one_store(tmp_path / "one.duckdb", scenario.produced) as store:
            con = store.cursor()
            try:
                for name, (params, got) in scenario.federated.items():
                    if name in ("chain_segments", "access_log"):
                        continue  # what each shard holds and was asked: one store has one segment, no reads
                    want = run_query(con, name, params).to_dict()
                    assert got["columns"] == want["columns"], name
                    assert _kept(got["rows"]) == _kept(json.loads(json.dumps(want["rows"], default=str))), name
            finally:
                con.close()
        with FileReader(tmp_path / "one.duckdb") as reader:
            report = run_checks(reader)
        assert scenario.coverage == [(c.name, c.status, c.summary) for c in report.checks]
        assert scenario.coverage_exit == report.exit_code == 0, scenario.coverage

    def test_the_fault_point_killed_the_victim_between_its_commits(self, scenario: Scenario) -> None:
        """The victim died of SIGKILL, and its store holds records a peer read again and it then ceded."""
        assert scenario.killed_code == -signal.SIGKILL
        victim = scenario.shards[0].db
        ceded = rows(victim, "SELECT coalesce(sum(removed), 0) FROM offsets_elsewhere WHERE reason = 'ceded'")
        assert ceded[0][0] > 0

    def test_the_overlap_was_visible_until_resolved(self, scenario: Scenario) -> None:
        """While the victim was down, the shards that took its partitions said so at /healthz."""
        assert "which has not resolved its copies of the records read again" in scenario.unresolved_seen

    def test_every_event_is_stored_exactly_once_across_the_shards(self, scenario: Scenario) -> None:
        """The union of the three stores' event ids is what was produced, and no id is in two stores."""
        ids: Counter[str] = Counter()
        for shard in scenario.shards:
            ids.update(str(i) for (i,) in rows(shard.db, "SELECT event_id FROM events"))
        produced = {e.event_id for chain in scenario.produced for e in chain}
        assert set(ids) == produced
        assert [i for i, n in ids.items() if n > 1] == []

    def test_no_shard_records_a_false_gap(self, scenario: Scenario) -> None:
        """Every producer's chain is whole overall, and no store recorded a gap."""
        for shard in scenario.shards:
            with AuditStore(shard.db) as store:  # a last gap check, as the end of a drain does
                store.close_open_gaps()
            assert rows(shard.db, "SELECT producer_id, seq, detail FROM chain_breaks") == []

    def test_chain_segments_stitch_per_producer(self, scenario: Scenario) -> None:
        """Per producer, the segments of all shards sorted by first seq link from seq 1 to the last, each
        first_prev_hash the previous last_hash, with no holes inside."""
        segments: dict[str, list[tuple[Any, ...]]] = {}
        for shard in scenario.shards:
            for row in rows(shard.db, SEGMENTS, {"producer_id": None, "limit": 10**6, "offset": 0}):
                segments.setdefault(str(row[0]), []).append(row[1:])
        by_producer = {chain[0].producer_id: chain for chain in scenario.produced}
        assert set(segments) == set(by_producer)
        for producer, parts in segments.items():
            parts.sort()
            chain = by_producer[producer]
            expected_first, expected_prev = 1, chain[0].prev_hash
            for first, prev_hash, last, last_hash, holes in parts:
                assert (first, prev_hash, holes) == (expected_first, expected_prev, [])
                expected_first, expected_prev = last + 1, last_hash
            assert expected_first == len(chain) + 1
            assert expected_prev == chain[-1].hash

    def test_every_handoff_is_recorded_and_confirmed(self, scenario: Scenario) -> None:
        """Each store lists its tenures (partition, first offset read, when); every one started before the
        shards settled is confirmed (those of the rebalances while they were being stopped may not be)."""
        for shard in scenario.shards:
            tenures = rows(shard.db, "SELECT partition, start_offset, started_at, confirmed_by FROM partition_tenures "
                           "WHERE own")  # fmt: skip
            assert tenures
            assert [t for t in tenures if t[3] is None and t[2] < scenario.settled_at] == []

    def test_the_scenario_took_under_three_minutes(self, scenario: Scenario) -> None:
        """The whole drill (joins, a kill, two rebalances, a restart) stays inside CI's budget."""
        assert scenario.seconds < 180, f"{scenario.seconds:.0f} s"

    def test_a_shard_taking_a_partition_starts_at_the_groups_committed_offset(self, scenario: Scenario) -> None:
        """A store's first tenure of a partition that others read before starts at the committed offset
        (above 0) and holds nothing below it; those offsets are recorded as held elsewhere."""
        takeovers = 0
        for shard in scenario.shards:
            firsts = rows(
                shard.db,
                "SELECT partition, arg_min(start_offset, started_at), arg_min(tenure_id, started_at) "
                "FROM partition_tenures WHERE own GROUP BY partition",
            )
            for partition, start, tenure in firsts:
                if start == 0:
                    continue
                takeovers += 1
                below = rows(
                    shard.db,
                    "SELECT count(*) FROM events WHERE kafka_partition = $p AND kafka_offset < $start",
                    {"p": partition, "start": start},
                )
                assert below == [(0,)]
                elsewhere = rows(
                    shard.db,
                    "SELECT from_offset, to_offset FROM offsets_elsewhere WHERE tenure_id = $t AND reason = 'handoff'",
                    {"t": tenure},
                )
                assert elsewhere == [(0, start)]
        assert takeovers > 0


class TestHandoffStart:
    async def test_an_empty_shard_on_a_committed_group_starts_where_the_group_stopped(
        self, kafka_broker: EmbeddedBroker, tmp_path: Path
    ) -> None:
        """A group that committed to offset 12 (another store read them): a new, empty shard joining it
        stores none of those 12, and records its tenure at 12 with offsets 0..12 held elsewhere."""
        topic, group = f"events-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
        chain = chains()[0][:12]
        await ensure_topic(kafka_broker.bootstrap, topic, 1)
        await publish(kafka_broker.bootstrap, topic, [(0, e) for e in chain])
        for name, mode in (("a.duckdb", "all"), ("b.duckdb", "group")):
            materializer = Materializer(
                kafka_broker.bootstrap, topic, str(tmp_path / name), group=group, assignment=mode, partitions=1
            )
            try:
                summary = await materializer.run(drain=True)
            finally:
                materializer.close()
            assert summary.stored == (len(chain) if mode == "all" else 0), name
        b = tmp_path / "b.duckdb"
        assert rows(b, "SELECT partition, start_offset, stored_before FROM partition_tenures WHERE own") == [
            (0, 12, None)
        ]
        assert rows(b, "SELECT from_offset, to_offset, reason FROM offsets_elsewhere") == [(0, 12, "handoff")]
