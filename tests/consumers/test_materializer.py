"""The materializer against the embedded broker: exactly once, dead letters, chain breaks, faults."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from callgate.broker import EmbeddedBroker, free_port
from consumers.materializer import _MALLOC_TRIM, Materializer, _ingest_and_release
from consumers.store import AuditStore, RawRecord, StoreLockedError
from events import MemorySink, Producer, ToolUseEvent, encode_event, event_hash
from events.kafka import KafkaSink, _headers, _spool_key
from interceptor_core import Deny, Gate, RunContext, Substitute, before_tool_call, tool

pytestmark = pytest.mark.integration

FAST_GROUP = {"session_timeout_ms": 6000, "heartbeat_interval_ms": 500}


@tool
def refund(order_id: str, amount_cents: int) -> str:
    """Refunds an order."""
    return f"refunded {amount_cents} on {order_id}"


@before_tool_call(name="mix")
def mix(call: Any) -> Any:
    return [None, Deny("not yours"), Substitute("cached")][call.args["amount_cents"] % 3]


async def publish_calls(bootstrap: str, topic: str, spool: Path, n: int, start: int = 0) -> list[str]:
    """Run n mixed calls through a gate with a KafkaSink; the event ids that reached the broker."""
    sink, memory = KafkaSink(bootstrap, topic, spool, partitions=2), MemorySink()
    agent = Gate("shop", interceptors=[mix], sinks=[sink, memory]).agent("desk", tools=[refund])
    run = RunContext(tenant="acme", principal="u-1")
    for i in range(start, start + n):
        await agent.call("refund", {"order_id": f"A-{i}", "amount_cents": i}, run=run)
    assert await sink.close(timeout=60)
    return [e.event_id for e in memory.events]


def _producer_key(value: bytes) -> bytes:
    """The key a sink gives the record: the event's producer (b"raw" for what is no event)."""
    try:
        return str(json.loads(value)["producer_id"]).encode()
    except (ValueError, TypeError, KeyError, RecursionError):
        return b"raw"


async def produce_raw(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=False)
    await producer.start()
    try:
        for value in values:
            await producer.send_and_wait(topic, value=value, key=_producer_key(value), partition=0)
    finally:
        await producer.stop()


async def drain(bootstrap: str, topic: str, db: Path, group: str | None = None, assignment: Any = "all") -> Any:
    group = group or f"g-{uuid.uuid4().hex[:8]}"
    materializer = Materializer(bootstrap, topic, str(db), group=group, assignment=assignment, **FAST_GROUP)
    try:
        return await materializer.run(drain=True)
    finally:
        materializer.close()


def sealed_events(n: int) -> list[Any]:
    """n ToolUse events of one producer, sealed into its chain, args {"n": i}."""
    producer = Producer()
    return [
        producer.seal(
            ToolUseEvent,
            {
                "event_id": uuid.uuid4().hex,
                "time": datetime.now(UTC),
                "gate": "g",
                "outcome": "ok",
                "duration_ms": 1,
                "args": {"n": i},
            },
        )
        for i in range(n)
    ]


def materialize_cmd(bootstrap: str, topic: str, db: Path, port: int, *extra: str) -> list[str]:
    """`callgate materialize` as a child process with its read API on `port` and a group of its own
    (unless `extra` names one)."""
    return [
        sys.executable,
        "-c",
        "from callgate.cli import main; main()",
        "materialize",
        "--bootstrap",
        bootstrap,
        "--topic",
        topic,
        "--db",
        str(db),
        *([] if "--group" in extra else ["--group", f"g-{uuid.uuid4().hex[:8]}"]),
        "--api",
        f"127.0.0.1:{port}",
        *extra,
    ]


def stored_ids(db: Path) -> list[str]:
    with AuditStore(db, read_only=True) as store:
        con = store.cursor()
        try:
            return [row[0] for row in con.execute("select event_id from events").fetchall()]
        finally:
            con.close()


def scalar(db: Path, sql: str) -> Any:
    with AuditStore(db, read_only=True) as store:
        con = store.cursor()
        try:
            return con.execute(sql).fetchone()[0]  # type: ignore[index]
        finally:
            con.close()


class TestExactlyOnce:
    async def test_drain_stores_every_event_once_and_replays_change_nothing(
        self, kafka_broker: EmbeddedBroker, topic: str, tmp_path: Path
    ) -> None:
        """A drain stores every event once; draining again, or the same messages produced twice, adds nothing."""
        ids = await publish_calls(kafka_broker.bootstrap, topic, tmp_path / "spool", 30)
        db = tmp_path / "audit.duckdb"
        summary = await drain(kafka_broker.bootstrap, topic, db)
        assert summary.stored == len(ids)
        assert sorted(stored_ids(db)) == sorted(ids)
        # What the ingest cost beside how long it took: the process's CPU over the same span, which all
        # its cores together bound (plus the kernel's accounting tick).
        assert 0 < summary.ingest_cpu_seconds <= summary.ingest_seconds * (os.cpu_count() or 1) + 0.02
        again = await drain(kafka_broker.bootstrap, topic, db)
        assert again.stored == 0
        # The same messages a second time (a producer that retried, a topic replayed by hand).
        consumer = AIOKafkaConsumer(bootstrap_servers=kafka_broker.bootstrap)
        await consumer.start()
        try:
            await consumer.topics()
            tps = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            values: list[bytes] = []
            while len(values) < len(ids):
                for rows in (await consumer.getmany(timeout_ms=500)).values():
                    values.extend(r.value for r in rows)
        finally:
            await consumer.stop()
        await produce_raw(kafka_broker.bootstrap, topic, values)
        replay = await drain(kafka_broker.bootstrap, topic, db)
        assert replay.duplicates >= len(ids)
        assert replay.stored == 0
        assert sorted(stored_ids(db)) == sorted(ids)
        assert scalar(db, "select count(*) from chain_breaks") == 0


class TestCommits:
    async def test_a_stored_batch_is_committed_before_the_loop_waits_for_more(
        self, kafka_broker: EmbeddedBroker, topic: str, tmp_path: Path
    ) -> None:
        """A sink with `confirm_group` frees its spool as soon as the store holds its events, however
        long the materializer would wait for the next records: the batch written is committed first.
        The commit waited for the next fetch (`poll_ms`), which paced a sink with a small spool to one
        spoolful per poll."""
        from events.kafka import ensure_topic

        await ensure_topic(kafka_broker.bootstrap, topic, 3)
        group = f"g-{uuid.uuid4().hex[:8]}"
        # A poll far longer than the flush's deadline: only a commit that does not wait for it frees the
        # sink. (Stopping waits out the poll in hand, so it is no longer than that needs.)
        materializer = Materializer(
            kafka_broker.bootstrap, topic, str(tmp_path / "audit.duckdb"), group=group, partitions=3, poll_ms=8_000
        )
        sink, memory = KafkaSink(kafka_broker.bootstrap, topic, tmp_path / "spool", confirm_group=group), MemorySink()
        agent = Gate("shop", sinks=[sink, memory]).agent("desk", tools=[refund])
        async with running(materializer):
            await _until(lambda: materializer.health().ok, 30)
            for round_ in range(3):
                for i in range(5):
                    await agent.call("refund", {"order_id": f"A-{round_}-{i}", "amount_cents": i})
                assert await sink.flush(timeout=4), f"round {round_}: {sink.pending} events still unconfirmed"
            assert sink.confirmed == len(memory.events)
            await sink.close()
        assert sorted(stored_ids(tmp_path / "audit.duckdb")) == sorted(e.event_id for e in memory.events)


class TestIncrementalDrain:
    @pytest.mark.parametrize("assignment", ["all", "group"])
    async def test_a_second_drain_reads_each_new_record_once(
        self, kafka_broker: EmbeddedBroker, topic: str, tmp_path: Path, assignment: str
    ) -> None:
        """Records on every partition, a drain, as many again, a second drain: the second one reads exactly
        the new records, stores each and counts no duplicate (in group mode nothing fetched from the
        group's committed offsets before the seek to the store's offsets is used)."""
        from events.kafka import ensure_topic

        await ensure_topic(kafka_broker.bootstrap, topic, 3)
        db, group = tmp_path / "audit.duckdb", f"g-{uuid.uuid4().hex[:8]}"
        events = sealed_events(24)
        first, second = events[:12], events[12:]
        # Every partition gets records, so each has a stored offset to check before the seek.
        await produce_to(kafka_broker.bootstrap, topic, first, 3)
        # The first drain fills the store and commits the group without joining it, so the second one's
        # join waits for no earlier member.
        filled = await drain(kafka_broker.bootstrap, topic, db, group)
        assert (filled.records, filled.stored, filled.duplicates) == (12, 12, 0)
        await produce_to(kafka_broker.bootstrap, topic, second, 3)
        summary = await drain(kafka_broker.bootstrap, topic, db, group, assignment)
        assert (summary.records, summary.stored, summary.duplicates) == (12, 12, 0)
        assert sorted(stored_ids(db)) == sorted(e.event_id for e in events)


def sink_envelope(event: Any, **changes: bytes) -> tuple[bytes, list[tuple[str, bytes]]]:
    """The key and headers a KafkaSink sends with the event (made by its own functions), with the key
    and the headers named in `changes` replaced."""
    key, headers = _headers(_spool_key(event), 0)
    return changes.pop("key", key), [(name, changes.get(name, value)) for name, value in headers]


class TestEnvelope:
    async def test_an_event_whose_envelope_disagrees_is_a_dead_letter(
        self, kafka_broker: EmbeddedBroker, topic: str, tmp_path: Path
    ) -> None:
        """Valid events produced with a foreign key, `ce_id` or `ce_type` (or a foreign key and `ce_id`) are
        `envelope_mismatch` dead letters naming the field and both values, and leave gaps; the events sent as
        a sink sends them are stored."""
        events = sealed_events(6)
        sends = [
            (events[0], {}),
            (events[1], {"key": b"intruder"}),
            (events[2], {"ce_id": b"forged-id"}),
            (events[3], {"ce_type": b"dev.callgate.Blocked"}),
            (events[4], {"key": b"intruder", "ce_id": b"forged-id"}),
            (events[5], {}),
        ]
        producer = AIOKafkaProducer(bootstrap_servers=kafka_broker.bootstrap, acks="all", enable_idempotence=False)
        await producer.start()
        try:
            for event, changes in sends:
                key, headers = sink_envelope(event, **changes)
                await producer.send_and_wait(topic, encode_event(event), key=key, headers=headers, partition=0)
        finally:
            await producer.stop()
        db = tmp_path / "audit.duckdb"
        summary = await drain(kafka_broker.bootstrap, topic, db)
        assert (summary.stored, summary.dead_letters, summary.gaps_recorded) == (2, 4, 4)
        assert sorted(stored_ids(db)) == sorted([events[0].event_id, events[5].event_id])
        with AuditStore(db, read_only=True) as store:
            con = store.cursor()
            rows = con.execute('select "offset", reason, error from dead_letters order by 1').fetchall()
            con.close()
        pid = events[0].producer_id
        key_error = f"key 'intruder' is not the event's producer_id {pid!r}"
        assert rows == [
            (1, "envelope_mismatch", key_error),
            (2, "envelope_mismatch", f"header ce_id 'forged-id' is not the event's event_id {events[2].event_id!r}"),
            (
                3,
                "envelope_mismatch",
                "header ce_type 'dev.callgate.Blocked' is not 'dev.callgate.ToolUse' (the event's type 'ToolUse')",
            ),
            (
                4,
                "envelope_mismatch",
                f"{key_error}; header ce_id 'forged-id' is not the event's event_id {events[4].event_id!r}",
            ),
        ]


class TestDrain:
    async def test_drain_of_a_topic_nobody_published_is_empty(
        self, kafka_broker: EmbeddedBroker, topic: str, tmp_path: Path
    ) -> None:
        """Draining a topic that does not exist returns at once with nothing stored (and creates no topic)."""
        summary = await drain(kafka_broker.bootstrap, topic, tmp_path / "audit.duckdb")
        assert (summary.records, summary.stored) == (0, 0)
        assert stored_ids(tmp_path / "audit.duckdb") == []


class TestBadInput:
    async def test_malformed_messages_are_dead_lettered_and_good_ones_stored(
        self, kafka_broker: EmbeddedBroker, topic: str, tmp_path: Path
    ) -> None:
        """Invalid JSON, unknown types and newer schemas between good events become dead letters."""
        good = sealed_events(3)
        newer = json.loads(encode_event(good[0]))
        newer.update(schema_version=99, event_id="newer")
        values = [
            encode_event(good[0]),
            b"{not json",
            encode_event(good[1]),
            b'{"type": "ToolExploded"}',
            json.dumps(newer).encode(),
            encode_event(good[2]),
        ]
        await produce_raw(kafka_broker.bootstrap, topic, values)
        db = tmp_path / "audit.duckdb"
        summary = await drain(kafka_broker.bootstrap, topic, db)
        assert (summary.stored, summary.dead_letters) == (3, 3)
        assert sorted(stored_ids(db)) == sorted(e.event_id for e in good)
        assert scalar(db, "select count(distinct reason) from dead_letters") == 3


class TestChainBreaks:
    async def test_tampered_and_missing_events_are_recorded(
        self, kafka_broker: EmbeddedBroker, topic: str, tmp_path: Path
    ) -> None:
        """A changed event is a tamper record; a missing seq is a gap once the drain ends."""
        events = sealed_events(5)
        tampered = events[1].model_copy(update={"args": {"n": 999}})
        assert event_hash(tampered) != tampered.hash
        values = [
            encode_event(events[0]),
            encode_event(tampered),
            encode_event(events[2]),
            encode_event(events[4]),
        ]
        await produce_raw(kafka_broker.bootstrap, topic, values)
        db = tmp_path / "audit.duckdb"
        await drain(kafka_broker.bootstrap, topic, db)
        with AuditStore(db, read_only=True) as store:
            con = store.cursor()
            breaks = con.execute("select seq, kind from chain_breaks order by seq, kind").fetchall()
            con.close()
        assert (2, "tamper") in breaks
        assert (4, "gap") in breaks


class TestFaults:
    async def test_materializer_killed_mid_run_loses_and_doubles_nothing(
        self, kafka_broker: EmbeddedBroker, topic: str, tmp_path: Path
    ) -> None:
        """SIGKILL of a running materializer (seen through its read API), then a drain: every event once."""
        ids = await publish_calls(kafka_broker.bootstrap, topic, tmp_path / "spool", 600)
        db = tmp_path / "audit.duckdb"
        port = free_port("127.0.0.1")
        cmd = materialize_cmd(kafka_broker.bootstrap, topic, db, port)
        with subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as proc:
            try:
                deadline = time.monotonic() + 60
                seen = 0
                while time.monotonic() < deadline and seen == 0:
                    seen = _stored_via_api(port)
                    await asyncio.sleep(0.02)  # sleep-ok: polling the read API with a deadline
                assert seen > 0
            finally:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
        await drain(kafka_broker.bootstrap, topic, db)
        stored = stored_ids(db)
        assert len(stored) == len(set(stored)) == len(ids)
        assert set(stored) == set(ids)

    # The embedded broker forgets its consumer groups on a restart, so the consumer has to rejoin;
    # the materializer runs as its own process, as in production, and is watched through its API.
    async def test_broker_restarted_empty_mid_run(
        self, fresh_broker: EmbeddedBroker, topic: str, tmp_path: Path
    ) -> None:
        """After the broker comes back empty, ingestion resumes from its earliest offsets and nothing doubles."""
        db = tmp_path / "audit.duckdb"
        port = free_port("127.0.0.1")
        first = await publish_calls(fresh_broker.bootstrap, topic, tmp_path / "spool1", 20)
        cmd = materialize_cmd(fresh_broker.bootstrap, topic, db, port)
        with subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as proc:
            try:
                await _until(lambda: _stored_via_api(port) >= len(first), 60)
                fresh_broker.restart()
                second = await publish_calls(fresh_broker.bootstrap, topic, tmp_path / "spool2", 20, start=100)
                await _until(lambda: _stored_via_api(port) >= len(first) + len(second), 100)
            finally:
                proc.send_signal(signal.SIGINT)
                proc.wait(60)
        stored = stored_ids(db)
        assert len(stored) == len(set(stored))
        assert set(stored) == set(first) | set(second)

    async def test_a_materializer_started_while_its_broker_is_down_waits_for_it(
        self, fresh_broker: EmbeddedBroker, topic: str, tmp_path: Path
    ) -> None:
        """`callgate materialize` started with nothing listening at its bootstrap keeps trying (it logs
        why), and stores what is published once the broker is up; before, it exited 1 at once."""
        db, port, log = tmp_path / "audit.duckdb", free_port("127.0.0.1"), tmp_path / "materializer.log"
        fresh_broker.kill()
        cmd = materialize_cmd(fresh_broker.bootstrap, topic, db, port)
        with log.open("wb") as out, subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT) as proc:
            try:
                await _until(lambda: "cannot reach the broker" in log.read_text() or proc.poll() is not None, 60)
                assert proc.poll() is None, log.read_text()
                fresh_broker.start()
                ids = await publish_calls(fresh_broker.bootstrap, topic, tmp_path / "spool", 10)
                await _until(lambda: _stored_via_api(port) >= len(ids), 60)
            finally:
                proc.send_signal(signal.SIGINT)
                code = proc.wait(60)
        assert code == 0, log.read_text()
        assert sorted(stored_ids(db)) == sorted(ids)

    async def test_a_killed_materializer_restarted_stores_again(
        self, kafka_broker: EmbeddedBroker, topic: str, tmp_path: Path
    ) -> None:
        """SIGKILL of `callgate materialize`, then the same command again: the records produced
        meanwhile are stored, each once. (How soon is a figure of the fault drill's
        materializer-kill row, `make drill`, not of a test on a shared machine.)"""
        from events.kafka import ensure_topic

        await ensure_topic(kafka_broker.bootstrap, topic, 3)
        db, port = tmp_path / "audit.duckdb", free_port("127.0.0.1")
        cmd = materialize_cmd(kafka_broker.bootstrap, topic, db, port, "--group", f"g-{uuid.uuid4().hex[:8]}")
        first, second = sealed_events(3), sealed_events(3)
        await produce_to(kafka_broker.bootstrap, topic, first, 3)
        with subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as proc:
            try:
                await _until(lambda: _stored_via_api(port) == len(first), 60)
            finally:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
        await produce_to(kafka_broker.bootstrap, topic, second, 3)
        with subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as proc:
            try:
                await _until(lambda: _stored_via_api(port) == len(first) + len(second), 60)
            finally:
                proc.send_signal(signal.SIGINT)
                proc.wait(60)
        assert sorted(stored_ids(db)) == sorted(e.event_id for e in first + second)

    async def test_store_held_by_another_process(
        self, kafka_broker: EmbeddedBroker, topic: str, tmp_path: Path
    ) -> None:
        """A store file another process holds: exit 2 naming file and holder, and no offsets committed."""
        await publish_calls(kafka_broker.bootstrap, topic, tmp_path / "spool", 3)
        db = tmp_path / "audit.duckdb"
        holder = textwrap.dedent(
            f"""
            import sys
            from consumers.store import AuditStore
            store = AuditStore({str(db)!r})
            print("holding", flush=True)
            sys.stdin.readline()
            """
        )
        group = f"g-{uuid.uuid4().hex[:8]}"
        with subprocess.Popen(
            [sys.executable, "-c", holder], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        ) as proc:
            assert proc.stdout is not None
            assert proc.stdin is not None
            assert proc.stdout.readline().strip() == "holding"
            with pytest.raises(StoreLockedError, match=str(proc.pid)):
                Materializer(kafka_broker.bootstrap, topic, str(db), group=group)
            result = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    "from callgate.cli import main; main()",
                    "materialize",
                    "--bootstrap",
                    kafka_broker.bootstrap,
                    "--topic",
                    topic,
                    "--db",
                    str(db),
                    "--group",
                    group,
                    "--drain",
                ],
                capture_output=True,
                text=True,
                timeout=60,
            )
            proc.stdin.write("\n")
            proc.stdin.flush()
        assert result.returncode == 2
        assert str(db) in result.stderr
        consumer = AIOKafkaConsumer(bootstrap_servers=kafka_broker.bootstrap, group_id=group)
        await consumer.start()
        try:
            assert await consumer.committed(TopicPartition(topic, 0)) is None
        finally:
            await consumer.stop()


def _stored_via_api(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/queries/event_counts", timeout=2) as response:
            body = json.loads(response.read())
    except OSError:
        return 0
    return sum(int(row.get("events") or 0) for row in body["rows"])


def _count(materializer: Materializer) -> int:
    con = materializer.store.cursor()
    try:
        return int(con.execute("select count(*) from events").fetchone()[0])  # type: ignore[index]
    finally:
        con.close()


async def _until(condition: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met before the deadline")
        await asyncio.sleep(0.05)  # sleep-ok: polling with a deadline


def health_via_api(port: int) -> tuple[int, dict[str, Any]]:
    """(status code, body) of the read API's /healthz; (0, {}) while nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())
    except OSError:
        return 0, {}


def metrics_via_api(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return str(response.read().decode())


async def topic_partitions(bootstrap: str) -> dict[str, int]:
    """Every topic on the broker with its partition count (asked without creating anything)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        names = list(await admin.list_topics())
        described = await admin.describe_topics(names) if names else []
    finally:
        await admin.close()
    return {entry["topic"]: len(entry["partitions"]) for entry in described}


async def produce_to(bootstrap: str, topic: str, events: list[Any], partitions: int) -> None:
    """Each event to partition (index % partitions), keyed by its producer."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=False)
    await producer.start()
    try:
        for i, event in enumerate(events):
            await producer.send_and_wait(
                topic, encode_event(event), key=event.producer_id.encode(), partition=i % partitions
            )
    finally:
        await producer.stop()


@asynccontextmanager
async def running(materializer: Materializer) -> AsyncIterator[asyncio.Task[Any]]:
    """The materializer's continuous run as a task, stopped (and its store closed) on exit."""
    task = asyncio.create_task(materializer.run())
    try:
        yield task
    finally:
        materializer.stop()
        try:
            await asyncio.wait_for(task, 30)
        finally:
            materializer.close()


async def until_async(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        await asyncio.sleep(0.05)  # sleep-ok: polling with a deadline


class TestEmptyStore:
    # With group assignment a store is a shard: an empty one starts at the group's committed offset
    # instead, where the previous owner stopped (tests/consumers/test_shards.py).
    @pytest.mark.parametrize("assignment", ["all"])
    async def test_a_new_store_on_a_committed_group_reads_everything(
        self, kafka_broker: EmbeddedBroker, topic: str, tmp_path: Path, assignment: str
    ) -> None:
        """A second, empty store on a group that committed to the end still stores every record (read by
        the materializer assigning itself every partition)."""
        events = sealed_events(12)
        await produce_to(kafka_broker.bootstrap, topic, events, 1)
        group = f"g-{uuid.uuid4().hex[:8]}"
        # The first store commits the group without joining it, so the second one's join waits for no one.
        for name, mode in (("a.duckdb", "all"), ("b.duckdb", assignment)):
            materializer = Materializer(
                kafka_broker.bootstrap, topic, str(tmp_path / name), group=group, assignment=mode, **FAST_GROUP
            )
            try:
                summary = await materializer.run(drain=True)
            finally:
                materializer.close()
            assert summary.stored == len(events), name
        consumer = AIOKafkaConsumer(bootstrap_servers=kafka_broker.bootstrap, group_id=group)
        await consumer.start()
        try:
            assert await consumer.committed(TopicPartition(topic, 0)) == len(events)  # the group did commit
        finally:
            await consumer.stop()
        assert sorted(stored_ids(tmp_path / "b.duckdb")) == sorted(e.event_id for e in events)


class TestTopicLifecycle:
    @pytest.mark.parametrize("assignment", ["all", "group"])
    # Its own deadlines (a rejoin of the group the restart forgot takes 10 to 50 s on the embedded broker,
    # more on a loaded machine) add up past the suite's 120 s per test.
    @pytest.mark.timeout(300)
    async def test_no_ghost_topic_after_an_empty_restart(
        self, fresh_broker: EmbeddedBroker, topic: str, tmp_path: Path, assignment: str
    ) -> None:
        """The materializer creates the topic with the known count at its start, never re-creates it by
        asking for it after the broker restarted empty, and reads it from the start once a producer has."""
        db = tmp_path / "audit.duckdb"
        materializer = Materializer(
            fresh_broker.bootstrap,
            topic,
            str(db),
            assignment=assignment,
            partitions=3,
            unread_grace_s=0.5,
            metadata_interval_s=0.2,
            **FAST_GROUP,
            metadata_max_age_ms=500,
        )
        before, after = sealed_events(6), sealed_events(6)
        async with running(materializer):
            await until_async(
                # Group mode also keeps the topic's handoff log (consumers.shards) beside it.
                lambda: _true(_only(topic_partitions(fresh_broker.bootstrap), topic), {topic: 3}),
                30,
                "the topic created",
            )
            await produce_to(fresh_broker.bootstrap, topic, before, 3)
            await _until(lambda: _count(materializer) == len(before), 60)
            fresh_broker.restart()
            # Long enough for the unread grace to pass, so its consumers asked about the topic many times.
            await _until(lambda: "is not on the broker" in materializer.health().detail, 30)
            assert not materializer.health().ok
            assert topic not in await topic_partitions(fresh_broker.bootstrap)
            from events.kafka import ensure_topic

            assert await ensure_topic(fresh_broker.bootstrap, topic, 3) == 3  # what a sink does
            await produce_to(fresh_broker.bootstrap, topic, after, 3)
            # With group assignment the consumers first rejoin the group the restart forgot (the
            # embedded broker takes 10 to 50 s for a rejoin): the deadline leaves room for the slow end.
            await _until(lambda: _count(materializer) == len(before) + len(after), 120)
            await _until(
                lambda: materializer.health().ok and all(p.lag == 0 for p in materializer.health().partitions), 30
            )
            health = materializer.health()
            assert [(p.partition, p.owned, p.lag) for p in health.partitions] == [
                (0, True, 0),
                (1, True, 0),
                (2, True, 0),
            ]
        assert sorted(stored_ids(db)) == sorted(e.event_id for e in before + after)

    async def test_an_assignment_changed_while_the_coordinator_is_looked_up_keeps_the_run(
        self, fresh_broker: EmbeddedBroker, topic: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The topic vanishes (an empty restart) and comes back while aiokafka's coordination routine is
        still looking up the group coordinator for the assignment it had: the run goes on and reads the
        recreated topic. Assigning on that consumer made the routine fail its assertion that the
        assignment it held was active, and the run ended with "Unexpected error during coordination"."""
        from aiokafka.consumer.group_coordinator import GroupCoordinator

        from events.kafka import ensure_topic

        # The window, made wide: once `hold` is set, the routine's lookup waits for `release`.
        hold, release = asyncio.Event(), asyncio.Event()
        coordinators: list[GroupCoordinator] = []
        held: list[GroupCoordinator] = []
        lookup = GroupCoordinator.ensure_coordinator_known

        async def held_lookup(self: GroupCoordinator) -> None:
            coordinators.append(self)
            if asyncio.current_task() is self._coordination_task and hold.is_set() and not release.is_set():
                held.append(self)
                # Like aiokafka's own lookup, which gives up when the consumer closes.
                released = asyncio.ensure_future(release.wait())
                await asyncio.wait([released, self._closing], return_when=asyncio.FIRST_COMPLETED)
                released.cancel()
            await lookup(self)

        monkeypatch.setattr(GroupCoordinator, "ensure_coordinator_known", held_lookup)
        await ensure_topic(fresh_broker.bootstrap, topic, 3)
        materializer = Materializer(
            fresh_broker.bootstrap, topic, str(tmp_path / "audit.duckdb"), partitions=3, metadata_interval_s=0.2
        )
        before, after = sealed_events(6), sealed_events(6)
        async with running(materializer) as task:
            await produce_to(fresh_broker.bootstrap, topic, before, 3)
            await _until(lambda: _count(materializer) == len(before), 60)
            hold.set()
            fresh_broker.restart()
            # What a coordinator request failing on the restarted broker does; the routine looks again.
            coordinators[0].coordinator_dead()
            await _until(lambda: bool(held), 30)
            await _until(lambda: "is not on the broker" in materializer.health().detail, 30)
            assert await ensure_topic(fresh_broker.bootstrap, topic, 3) == 3  # what a sink does
            await produce_to(fresh_broker.bootstrap, topic, after, 3)
            await _until(lambda: materializer.health().ok, 30)
            release.set()
            await _until(lambda: _count(materializer) == len(before) + len(after) or task.done(), 60)
            assert not task.done(), task.exception()
        assert sorted(stored_ids(tmp_path / "audit.duckdb")) == sorted(e.event_id for e in before + after)

    async def test_a_consumer_stopped_while_its_fetch_waits_out_a_retry_backoff_keeps_the_run(
        self, fresh_broker: EmbeddedBroker, topic: str, tmp_path: Path
    ) -> None:
        """The broker comes back empty while a fetch request sleeps in its retry backoff: the consumer
        replaced for the recreated topic is stopped, aiokafka's fetcher raises that request's
        CancelledError from `stop()`, and the run goes on and reads the recreated topic. Taken for
        a cancellation of the run, it ended the materializer (a drill row lost its live store)."""
        from events.kafka import ensure_topic

        await ensure_topic(fresh_broker.bootstrap, topic, 3)
        # A backoff far longer than the metadata interval: a failed fetch is asleep when the
        # refresh finds the topic gone and stops the consumer.
        materializer = Materializer(
            fresh_broker.bootstrap, topic, str(tmp_path / "audit.duckdb"), partitions=3, metadata_interval_s=0.2,
            retry_backoff_ms=4000,
        )  # fmt: skip
        before, after = sealed_events(6), sealed_events(6)
        async with running(materializer) as task:
            await produce_to(fresh_broker.bootstrap, topic, before, 3)
            await _until(lambda: _count(materializer) == len(before), 60)
            fresh_broker.restart()
            await _until(lambda: "is not on the broker" in materializer.health().detail or task.done(), 30)
            assert not task.done(), task.exception()
            assert await ensure_topic(fresh_broker.bootstrap, topic, 3) == 3  # what a sink does
            await produce_to(fresh_broker.bootstrap, topic, after, 3)
            await _until(lambda: _count(materializer) == len(before) + len(after) or task.done(), 60)
            assert not task.done(), task.exception()
        assert sorted(stored_ids(tmp_path / "audit.duckdb")) == sorted(e.event_id for e in before + after)


async def _true(awaitable: Any, expected: Any) -> bool:
    return (await awaitable) == expected


async def _only(listing: Any, topic: str) -> dict[str, int]:
    return {name: n for name, n in (await listing).items() if name == topic}


def _healthy_and_read(materializer: Materializer) -> bool:
    health = materializer.health()
    return health.ok and all(p.lag == 0 for p in health.partitions)


class TestHealth:
    async def test_healthz_and_metrics_report_every_listed_partition(
        self, kafka_broker: EmbeddedBroker, topic: str, tmp_path: Path
    ) -> None:
        """/healthz lists each partition the broker has: owned, position at the high watermark, lag 0; /metrics too."""
        from events.kafka import ensure_topic

        await ensure_topic(kafka_broker.bootstrap, topic, 3)
        await produce_to(kafka_broker.bootstrap, topic, sealed_events(6), 3)
        port = free_port("127.0.0.1")
        materializer = Materializer(
            kafka_broker.bootstrap, topic, str(tmp_path / "audit.duckdb"), api=("127.0.0.1", port), **FAST_GROUP
        )
        expected = [
            {"partition": n, "owned": True, "position": 2, "high_watermark": 2, "lag": 0, "unread_s": 0.0}
            for n in range(3)
        ]
        async with running(materializer):
            await _until(lambda: health_via_api(port)[1].get("partitions") == expected, 30)
            status, body = health_via_api(port)
            assert (status, body["status"], body["lag_total"], body["topic"]) == (200, "ok", 0, topic)
            text = metrics_via_api(port)
        for n in range(3):
            assert f'callgate_partition_owned{{partition="{n}",topic="{topic}"}} 1.0' in text
            assert f'callgate_partition_high_watermark{{partition="{n}",topic="{topic}"}} 2.0' in text

    async def test_a_partition_nobody_reads_is_not_ok(
        self, kafka_broker: EmbeddedBroker, topic: str, tmp_path: Path
    ) -> None:
        """A listed partition whose records nobody in the group reads makes /healthz answer 503 naming it, once
        the grace has passed; it is ok again when the materializer reads it."""
        from events.kafka import ensure_topic

        await ensure_topic(kafka_broker.bootstrap, topic, 2)
        group = f"g-{uuid.uuid4().hex[:8]}"
        port = free_port("127.0.0.1")
        materializer = Materializer(
            kafka_broker.bootstrap,
            topic,
            str(tmp_path / "audit.duckdb"),
            group=group,
            assignment="group",
            api=("127.0.0.1", port),
            unread_grace_s=1.0,
            metadata_interval_s=0.2,
            **FAST_GROUP,
        )
        # Another member of the group that takes a partition and never reads or commits it.
        idle = AIOKafkaConsumer(
            bootstrap_servers=kafka_broker.bootstrap, group_id=group, enable_auto_commit=False, **FAST_GROUP
        )
        async with running(materializer):
            await _until(lambda: len(materializer.health().partitions) == 2 and materializer.health().ok, 30)
            idle.subscribe([topic])
            await idle.start()
            try:
                await _until(lambda: bool(idle.assignment()), 30)
                (taken,) = [tp.partition for tp in idle.assignment()]
                await produce_to(kafka_broker.bootstrap, topic, sealed_events(4), 2)
                await _until(lambda: health_via_api(port)[0] == 503, 30)
                body = health_via_api(port)[1]
                assert f"partition {taken} of {topic} is read by nobody in group {group}" in body["detail"]
                entry = body["partitions"][taken]
                assert (entry["owned"], entry["lag"]) == (False, 2)
                assert entry["unread_s"] > 1.0
            finally:
                await idle.stop()
            # The idle member gone, the group gives the partition back to the materializer.
            await _until(lambda: health_via_api(port)[0] == 200 and _count(materializer) == 4, 60)

    async def test_a_member_assigned_nothing_while_partitions_wait_asks_the_group_again(
        self, kafka_broker: EmbeddedBroker, topic: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The group's first assignment reaches the materializer empty (after an empty restart the embedded
        broker answered a sync with the member's assignment from before the topic was recreated): once the
        topic's partitions have waited unread past the grace, it asks the group to assign again and
        stores their records. Nothing else would ever rejoin: the topic's metadata no longer changes."""
        from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
        from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment

        from events.kafka import ensure_topic

        assign = RoundRobinPartitionAssignor.assign.__func__  # type: ignore[attr-defined]
        assignments: list[int] = []

        def first_one_lost(cls: Any, cluster: Any, members: Any) -> Any:
            assignments.append(len(assignments))
            if len(assignments) == 1:
                return {member: ConsumerProtocolMemberAssignment(cls.version, [], b"") for member in members}
            return assign(cls, cluster, members)

        monkeypatch.setattr(RoundRobinPartitionAssignor, "assign", classmethod(first_one_lost))
        await ensure_topic(kafka_broker.bootstrap, topic, 2)
        materializer = Materializer(
            kafka_broker.bootstrap,
            topic,
            str(tmp_path / "audit.duckdb"),
            group=f"g-{uuid.uuid4().hex[:8]}",
            assignment="group",
            unread_grace_s=0.5,
            metadata_interval_s=0.2,
            **FAST_GROUP,
        )
        async with running(materializer):
            await produce_to(kafka_broker.bootstrap, topic, sealed_events(4), 2)
            await _until(lambda: _count(materializer) == 4, 60)
            await _until(lambda: materializer.health().ok, 30)
            assert [p.owned for p in materializer.health().partitions] == [True, True]
        assert len(assignments) >= 2


def _rss_bytes() -> int:
    """This process's resident set now (Linux)."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class TestMemory:
    @pytest.mark.skipif(_MALLOC_TRIM is None, reason="this C library has no malloc_trim")
    def test_a_written_batch_gives_the_freed_c_heap_back_to_the_system(self, tmp_path: Path) -> None:
        # Record values are C-heap blocks; a batch frees most of them while others stay (the next
        # batch's), so the freed pages lie between live blocks, where glibc keeps them unless trimmed.
        events = sealed_events(50)
        records = [
            RawRecord("t", 0, i, event.producer_id.encode(), encode_event(event)) for i, event in enumerate(events)
        ]
        store = AuditStore(tmp_path / "s.duckdb")
        try:
            staged = store.stage(records)
            values = [bytes(1200) for _ in range(80_000)]  # some 96 MiB
            kept = values[::10]
            del values
            before = _rss_bytes()
            result = _ingest_and_release(store, staged, {("t", 0): len(records)})
            released = before - _rss_bytes()
            assert result.stored == 50
            assert len(kept) == 8_000
            # About 86 MiB were freed; whole pages of it (most) go back.
            assert released > 40 * 2**20, f"only {released / 2**20:.1f} MiB of the freed heap went back"
        finally:
            store.close()
