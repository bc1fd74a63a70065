"""Zero loss through KafkaSink: a broker that forgets what it acknowledged, a topic recreated with
another partition count, a spool of a few kilobytes, a burst. Real broker, real `callgate
materialize` processes, real DuckDB files; the store is compared with what the gate decided."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import duckdb
import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.partitioner import murmur2

from callgate.broker import EmbeddedBroker, free_port
from events import MemorySink, verify_chain
from events.kafka import KafkaSink
from events.spool import Spool
from interceptor_core import Gate, RunContext, ToolBlockedError, tool

pytestmark = pytest.mark.integration


@tool
def refund(order_id: str, amount_cents: int, note: str = "") -> str:
    """Refunds an order."""
    return f"refunded {amount_cents} on {order_id}"


def desk(*sinks: object) -> Any:
    return Gate("shop", sinks=list(sinks)).agent("desk", tools=[refund])


async def calls(agent: Any, n: int, start: int = 0, note: str = "") -> None:
    run = RunContext(tenant="acme", principal="u-1")
    for i in range(start, start + n):
        await agent.call("refund", {"order_id": f"A-{i}", "amount_cents": i, "note": note}, run=run)


async def until(predicate: Any, timeout: float, what: str) -> None:
    """Poll `predicate` until it is true or `timeout` passes (then fail naming `what`)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)  # sleep-ok: polling another thread's progress with a deadline


def drain(bootstrap: str, topic: str, db: Path, group: str) -> None:
    """`callgate materialize --drain` as a child process: reads the topic to its end, commits, exits."""
    command = [sys.executable, "-c", "from callgate.cli import main; main()", "materialize"]
    command += ["--bootstrap", bootstrap, "--topic", topic, "--db", str(db), "--group", group, "--drain"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr


def stored(db: Path) -> list[str]:
    with duckdb.connect(str(db), read_only=True) as con:
        return [row[0] for row in con.execute("select event_id from events").fetchall()]


def gaps(db: Path) -> int:
    with duckdb.connect(str(db), read_only=True) as con:
        row = con.execute("select count(*) from chain_breaks").fetchone()
        return int(row[0]) if row else 0


async def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    finally:
        await admin.close()


class TestConfirmGroup:
    async def test_records_a_restarted_broker_forgot_are_sent_again(
        self, fresh_broker: EmbeddedBroker, topic: str, tmp_path: Path
    ) -> None:
        """Events the broker acknowledged and lost in a restart reach the store; a sink without
        confirm_group loses the same events."""
        group = f"g-{uuid.uuid4().hex[:8]}"
        confirming, memory = KafkaSink(fresh_broker.bootstrap, topic, tmp_path / "a", confirm_group=group), MemorySink()
        trusting, control = KafkaSink(fresh_broker.bootstrap, topic, tmp_path / "b"), MemorySink()
        await calls(desk(confirming, memory), 30)
        await calls(desk(trusting, control), 30)
        made = len(memory.events)
        await until(lambda: confirming.sent >= made and trusting.sent >= made, 30, "both sinks' acknowledgements")
        assert confirming.pending == made  # acknowledged, but no group has stored them
        assert trusting.pending == 0

        fresh_broker.kill()
        fresh_broker.restart()  # same port, empty: everything acknowledged is gone
        await until(lambda: confirming.resent >= 1 and confirming.sent >= 2 * made, 60, "the resend to the new broker")
        db = tmp_path / "store.duckdb"
        drain(fresh_broker.bootstrap, topic, db, group)

        assert await confirming.flush(timeout=30)
        ids = stored(db)
        assert set(ids) == {e.event_id for e in memory.events}
        assert not {e.event_id for e in control.events} & set(ids)  # the control's events were lost
        assert len(ids) == len(set(ids))
        assert confirming.confirmed == made
        await confirming.close()
        await trusting.close(timeout=1)

    async def test_ghost_partition_after_a_recreate_with_fewer_partitions(
        self, fresh_broker: EmbeddedBroker, topic: str, tmp_path: Path
    ) -> None:
        """A producer on partition 3 of a 4-partition topic keeps its whole trail when the broker comes
        back empty and the topic is recreated with 3: nothing is counted delivered to a partition the
        broker does not list, and the store holds every event with its chain whole."""
        await create_topic(fresh_broker.bootstrap, topic, 4)
        group = f"g-{uuid.uuid4().hex[:8]}"
        sink, memory = KafkaSink(fresh_broker.bootstrap, topic, tmp_path / "spool", confirm_group=group), MemorySink()
        # A gate whose producer id hashes to partition 3 of 4: the one that would turn into a ghost.
        gate = Gate("shop", sinks=[sink, memory])
        while (murmur2(str(gate.producer_id).encode()) & 0x7FFFFFFF) % 4 != 3:
            gate = Gate("shop", sinks=[sink, memory])  # a gate emits nothing before its first scope
        agent = gate.agent("desk", tools=[refund])
        await calls(agent, 20)
        await until(lambda: sink.sent >= len(memory.events), 30, "the first acknowledgements")
        assert sink._pins == {agent.gate.producer_id.encode(): 3}

        fresh_broker.kill()
        fresh_broker.restart()
        await create_topic(fresh_broker.bootstrap, topic, 3)
        await calls(agent, 20, start=20)
        await until(lambda: sink.resent >= 1 and sink.awaiting_confirmation == len(memory.events), 60, "the resend")
        assert set(sink._awaiting) <= {0, 1, 2}

        db = tmp_path / "store.duckdb"
        drain(fresh_broker.bootstrap, topic, db, group)
        assert await sink.flush(timeout=30)
        ids = stored(db)
        assert sorted(ids) == sorted(e.event_id for e in memory.events if e.producer_id == agent.gate.producer_id)
        assert gaps(db) == 0
        assert verify_chain([e for e in memory.events if e.producer_id == agent.gate.producer_id]).ok
        await sink.close()


class TestTinySpool:
    async def test_a_few_kilobytes_of_spool_block_then_recover(self, topic: str, tmp_path: Path) -> None:
        """A 4 KiB spool with the broker down fails closed; once the broker is up every spooled and queued
        event is delivered, the full flag clears, and calls run again."""
        port = free_port("127.0.0.1")
        sink = KafkaSink(f"127.0.0.1:{port}", topic, tmp_path, spool_max_bytes=4096, connect_timeout_s=1)
        memory = MemorySink()
        agent = desk(sink, memory)
        reasons: list[str] = []
        for n in range(200):
            try:
                await calls(agent, 1, start=n, note="x" * 300)
            except ToolBlockedError as exc:
                reasons.append(exc.reason)
                if len(reasons) >= 3:
                    break
            await until(lambda: not sink._queue or not sink.available, 10, "the spool to take the event")
        assert len(reasons) == 3
        assert all("audit unavailable" in reason for reason in reasons)
        assert not sink.available
        with EmbeddedBroker(port=port) as broker:
            assert await sink.flush(timeout=60)
            assert sink.available
            await calls(agent, 5, start=1000, note="y" * 300)  # runs: no ToolBlockedError
            assert await sink.flush(timeout=30)
            db = tmp_path / "store.duckdb"
            drain(broker.bootstrap, topic, db, f"g-{uuid.uuid4().hex[:8]}")
            assert set(stored(db)) == {e.event_id for e in memory.events}
            assert sink.dropped == 0
            await sink.close()

    async def test_close_returns_in_time_and_keeps_what_memory_held(self, topic: str, tmp_path: Path) -> None:
        """close(timeout) returns in time with a full tiny spool and no broker; the events still in
        memory go to disk past the bound, and the next sink over the directory delivers every one."""
        port = free_port("127.0.0.1")
        sink = KafkaSink(f"127.0.0.1:{port}", topic, tmp_path, spool_max_bytes=2048, connect_timeout_s=1)
        memory = MemorySink()
        agent = desk(sink, memory)
        for n in range(30):
            try:
                await calls(agent, 1, start=n, note="z" * 300)
            except ToolBlockedError:
                break
        assert sink._queue  # the spool is full: some events wait in memory
        started = time.monotonic()
        assert not await sink.close(timeout=2)
        assert time.monotonic() - started < 2.5
        assert sink.dropped == 0
        with EmbeddedBroker(port=port) as broker:
            with Spool(tmp_path / "segments") as left:  # everything memory held went to disk
                assert left.pending == len(memory.events)
            again = KafkaSink(broker.bootstrap, topic, tmp_path, spool_max_bytes=2048)
            assert await again.flush(timeout=30)
            db = tmp_path / "store.duckdb"
            drain(broker.bootstrap, topic, db, f"g-{uuid.uuid4().hex[:8]}")
            assert set(stored(db)) == {e.event_id for e in memory.events}
            await again.close()

    async def test_close_returns_in_time_with_a_hung_broker(
        self, fresh_broker: EmbeddedBroker, topic: str, tmp_path: Path
    ) -> None:
        """A broker that stops answering (SIGSTOP) does not hold close(timeout) past its timeout; once
        it answers again, the next sink over the spool delivers every event."""
        group = f"g-{uuid.uuid4().hex[:8]}"
        sink = KafkaSink(fresh_broker.bootstrap, topic, tmp_path / "spool", confirm_group=group, connect_timeout_s=2)
        memory = MemorySink()
        await calls(desk(sink, memory), 20)
        await until(lambda: sink.sent >= len(memory.events), 30, "the first acknowledgements")
        assert fresh_broker.pid is not None
        os.kill(fresh_broker.pid, signal.SIGSTOP)
        try:
            await calls(desk(sink, memory), 20, start=20)
            started = time.monotonic()
            assert not await sink.close(timeout=3)
            assert time.monotonic() - started < 3.5
        finally:
            os.kill(fresh_broker.pid, signal.SIGCONT)
        # The sender finishes the step it was in (bounded by the client timeouts) and frees the spool.
        thread = sink._thread
        await until(lambda: thread is None or not thread.is_alive(), 30, "the old sender to stop")
        again = KafkaSink(fresh_broker.bootstrap, topic, tmp_path / "spool", confirm_group=group)
        # It sends what the first left without being asked (no emit, no flush).
        await until(lambda: again.sent >= len(memory.events), 60, "the resend after the broker woke up")
        db = tmp_path / "store.duckdb"
        drain(fresh_broker.bootstrap, topic, db, group)
        assert await again.flush(timeout=30)
        assert set(stored(db)) == {e.event_id for e in memory.events}
        await again.close()

    async def test_the_sender_outlives_an_unexpected_error(
        self, kafka_broker: EmbeddedBroker, topic: str, tmp_path: Path
    ) -> None:
        """An exception nobody foresaw in a send step is logged; the sender reconnects and delivers all."""
        sink, memory = KafkaSink(kafka_broker.bootstrap, topic, tmp_path), MemorySink()
        real = sink._send_batch
        failures = [RuntimeError("a bug in a send step")]

        async def flaky(link: Any) -> tuple[bool, int]:
            if failures:
                raise failures.pop()
            return await real(link)

        sink._send_batch = flaky  # type: ignore[method-assign]
        await calls(desk(sink, memory), 10)
        assert await sink.flush(timeout=30)
        assert failures == []
        assert sink.send_failures >= 1
        db = tmp_path / "store.duckdb"
        drain(kafka_broker.bootstrap, topic, db, f"g-{uuid.uuid4().hex[:8]}")
        assert set(stored(db)) == {e.event_id for e in memory.events}
        await sink.close()


class TestBurst:
    async def test_a_burst_at_full_speed_is_stored_whole(
        self, kafka_broker: EmbeddedBroker, topic: str, tmp_path: Path
    ) -> None:
        """10,000 calls as fast as the gate goes: none blocked for audit, none dropped, all stored once."""
        group = f"g-{uuid.uuid4().hex[:8]}"
        sink, memory = KafkaSink(kafka_broker.bootstrap, topic, tmp_path / "spool", confirm_group=group), MemorySink()
        await calls(desk(sink, memory), 10_000)
        assert sink.dropped == 0
        db = tmp_path / "store.duckdb"
        await until(lambda: sink.sent >= len(memory.events), 60, "the broker's acknowledgements")
        drain(kafka_broker.bootstrap, topic, db, group)
        assert await sink.flush(timeout=30)
        ids = stored(db)
        assert len(ids) == len(memory.events) == 10_001  # the calls and the scope's ToolsRegistered
        assert set(ids) == {e.event_id for e in memory.events}
        assert gaps(db) == 0
        await sink.close()


class TestCrashWindow:
    async def test_events_a_killed_process_held_in_memory_are_reported_as_a_gap(
        self, kafka_broker: EmbeddedBroker, topic: str, tmp_path: Path
    ) -> None:
        """Events handed to the sink but not yet spooled when the process is SIGKILLed cannot be sent;
        the next sink over the spool reports them, and the store and `callgate coverage` show the gap."""
        port = free_port("127.0.0.1")
        spool = tmp_path / "spool"
        child = textwrap.dedent(
            f"""
            import asyncio, json, sys, time
            sys.path.insert(0, {str(Path(__file__).parent)!r})
            from test_zero_loss import desk, calls
            from events import MemorySink
            from events.kafka import KafkaSink
            from interceptor_core import ToolBlockedError
            sink = KafkaSink("127.0.0.1:{port}", {topic!r}, {str(spool)!r}, spool_max_bytes=2048, connect_timeout_s=1)
            memory = MemorySink()
            agent = desk(sink, memory)
            async def main():
                n, deadline = 0, time.monotonic() + 30
                while len(sink._queue) < 5 and time.monotonic() < deadline:  # the spool is full: in memory
                    try:
                        await calls(agent, 1, start=n, note="m" * 300)
                    except ToolBlockedError:
                        pass
                    n += 1
                    await asyncio.sleep(0.01)  # sleep-ok: polling with a deadline; the sender thread spools
            asyncio.run(main())
            last = memory.events[-1]
            print(json.dumps({{"producer": last.producer_id, "last_seq": last.seq}}), flush=True)
            time.sleep(60)  # sleep-ok: stays alive until the parent kills it
            """
        )
        with subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True) as proc:
            try:
                assert proc.stdout is not None
                made = json.loads(proc.stdout.readline())
            finally:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
        sink = KafkaSink(kafka_broker.bootstrap, topic, spool)
        assert sink.lost_in_crash >= 5
        assert await sink.flush(timeout=30)
        await sink.close()
        db = tmp_path / "store.duckdb"
        drain(kafka_broker.bootstrap, topic, db, f"g-{uuid.uuid4().hex[:8]}")
        with duckdb.connect(str(db), read_only=True) as con:
            top = con.execute("select max(seq) from events where producer_id = ?", [made["producer"]]).fetchone()
            breaks = con.execute(
                "select seq, kind, detail, evidence from chain_breaks where producer_id = ?", [made["producer"]]
            ).fetchall()
        assert top is not None
        assert len(breaks) == 1
        seq, kind, detail, evidence = breaks[0]
        assert (seq, kind) == (top[0] + 1, "gap")
        assert "process died" in detail
        assert json.loads(evidence)["last_seq"] == made["last_seq"]
        coverage = subprocess.run(
            [sys.executable, "-c", "from callgate.cli import main; main()", "coverage", "--db", str(db)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert coverage.returncode == 1, coverage.stdout + coverage.stderr
