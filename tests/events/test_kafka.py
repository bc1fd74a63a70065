"""KafkaSink against the real embedded broker: delivery, outages, crashes, a full spool, oversize."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from callgate.broker import EmbeddedBroker, free_port
from events import MemorySink, parse_event, verify_chain
from events.kafka import DROPPED_HEADER, KafkaSink, SpoolLocked, decode_headers
from events.spool import Spool
from interceptor_core import Deny, Gate, RunContext, Substitute, ToolBlockedError, before_tool_call, tool

pytestmark = pytest.mark.integration


@tool
def refund(order_id: str, amount_cents: int, note: str = "") -> str:
    """Refunds an order."""
    return f"refunded {amount_cents} on {order_id}"


@before_tool_call(name="mix")
def mix(call: Any) -> Any:
    n = call.args["amount_cents"]
    return [None, Deny("not yours"), Substitute("cached"), None][n % 4]


def gate_with(*sinks: object) -> Any:
    return Gate("shop", interceptors=[mix], sinks=list(sinks)).agent("desk", tools=[refund])


async def calls(agent: Any, n: int, start: int = 0, note: str = "") -> None:
    run = RunContext(tenant="acme", principal="u-1")
    for i in range(start, start + n):
        await agent.call("refund", {"order_id": f"A-{i}", "amount_cents": i, "note": note}, run=run)


async def read_topic(bootstrap: str, topic: str, expect: int, timeout: float = 30.0) -> list[Any]:
    """Every record of `topic` (all partitions, from the beginning) once at least `expect` arrived."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        deadline = time.monotonic() + timeout
        while True:
            if topic in await consumer.topics():
                parts = sorted(consumer.partitions_for_topic(topic) or ())
                if parts:
                    break
            if time.monotonic() > deadline:
                raise AssertionError(f"topic {topic} never appeared")
            await asyncio.sleep(0.05)  # sleep-ok: polling with a deadline for the topic to appear
        tps = [TopicPartition(topic, p) for p in parts]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        records: list[Any] = []
        while len(records) < expect and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=200)
            for rows in batch.values():
                records.extend(rows)
        return records
    finally:
        await consumer.stop()


async def spooled(sink: KafkaSink, timeout: float = 10.0, *, until_unavailable: bool = False) -> None:
    """Wait (polling, with a deadline) until the sender thread has taken every queued event, or, with
    `until_unavailable`, until the sink refuses new events (a full spool keeps the queue waiting)."""
    deadline = time.monotonic() + timeout
    while sink._queue and not (until_unavailable and not sink.available) and time.monotonic() < deadline:
        await asyncio.sleep(0.002)  # sleep-ok: polling with a deadline


def ids(records: list[Any]) -> set[str]:
    return {parse_event(r.value).event_id for r in records}


class TestDelivery:
    async def test_every_event_of_mixed_calls_arrives(
        self, kafka_broker: EmbeddedBroker, topic: str, tmp_path: Path
    ) -> None:
        """All events of 120 mixed calls reach the topic, parseable, keyed by producer, with CloudEvents headers."""
        sink, memory = KafkaSink(kafka_broker.bootstrap, topic, tmp_path / "spool"), MemorySink()
        agent = gate_with(sink, memory)
        await calls(agent, 120)
        assert await sink.flush(timeout=30)
        records = await read_topic(kafka_broker.bootstrap, topic, len(memory.events))
        assert ids(records) == {e.event_id for e in memory.events}
        assert verify_chain([parse_event(r.value) for r in records]).ok
        first = records[0]
        event = parse_event(first.value)
        headers = decode_headers(first.headers)
        assert first.key == event.producer_id.encode()
        assert headers["ce_specversion"] == "1.0"
        assert headers["ce_id"] == event.event_id
        assert headers["ce_type"] == f"dev.callgate.{event.type}"  # type: ignore[attr-defined]
        assert headers["content-type"] == "application/json"
        assert sink.pending == 0
        await sink.close()

    async def test_one_spool_directory_one_sink(self, kafka_broker: EmbeddedBroker, tmp_path: Path) -> None:
        """A second sink over a spool directory in use is refused by name."""
        first = KafkaSink(kafka_broker.bootstrap, "t", tmp_path)
        with pytest.raises(SpoolLocked, match=str(tmp_path)):
            KafkaSink(kafka_broker.bootstrap, "t", tmp_path)
        await first.close()


class TestOutages:
    async def test_broker_down_at_start_then_up(self, topic: str, tmp_path: Path) -> None:
        """With no broker the calls return at once and spool; when the broker comes up all is delivered."""
        port = free_port("127.0.0.1")
        sink, memory = KafkaSink(f"127.0.0.1:{port}", topic, tmp_path, connect_timeout_s=1), MemorySink()
        agent = gate_with(sink, memory)
        await calls(agent, 40)
        assert not sink.connected
        assert sink.pending == len(memory.events)
        with EmbeddedBroker(port=port) as broker:
            assert await sink.flush(timeout=60)
            records = await read_topic(broker.bootstrap, topic, len(memory.events))
            assert ids(records) == {e.event_id for e in memory.events}
            await sink.close()

    async def test_broker_killed_and_restarted_loses_nothing(
        self, fresh_broker: EmbeddedBroker, topic: str, tmp_path: Path
    ) -> None:
        """Events before a SIGKILL of the broker and during its absence are all delivered once it is back."""
        sink, memory = KafkaSink(fresh_broker.bootstrap, topic, tmp_path, connect_timeout_s=1), MemorySink()
        agent = gate_with(sink, memory)
        await calls(agent, 30)
        assert await sink.flush(timeout=30)
        before = await read_topic(fresh_broker.bootstrap, topic, len(memory.events))
        assert len(ids(before)) == len(memory.events)
        fresh_broker.kill()
        await calls(agent, 30, start=30)
        assert sink.pending > 0
        fresh_broker.restart()  # same port, empty memory storage
        assert await sink.flush(timeout=60)
        after = await read_topic(fresh_broker.bootstrap, topic, len(memory.events) - len(before))
        assert ids(before) | ids(after) == {e.event_id for e in memory.events}
        await sink.close()

    async def test_process_killed_with_events_spooled(
        self, kafka_broker: EmbeddedBroker, topic: str, tmp_path: Path
    ) -> None:
        """Events a killed process left in its spool are sent by the next sink over that directory."""
        port = free_port("127.0.0.1")
        child = textwrap.dedent(
            f"""
            import asyncio, sys, time
            sys.path.insert(0, {str(Path(__file__).parent)!r})
            from test_kafka import gate_with, calls
            from events import MemorySink
            from events.kafka import KafkaSink
            sink = KafkaSink("127.0.0.1:{port}", {topic!r}, {str(tmp_path)!r}, connect_timeout_s=1)
            memory = MemorySink()
            asyncio.run(calls(gate_with(sink, memory), 25))
            deadline = time.monotonic() + 20
            while sink._queue and time.monotonic() < deadline:
                time.sleep(0.01)  # sleep-ok: the child waits for its own sender thread to spool
            print(len(memory.events), flush=True)
            time.sleep(60)  # sleep-ok: stays alive until the parent kills it
            """
        )
        with subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True) as proc:
            try:
                assert proc.stdout is not None
                emitted = int(proc.stdout.readline())
            finally:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
        assert emitted > 0
        with Spool(tmp_path / "segments") as left:  # what the killed process left, before a sink sends it
            assert left.pending == emitted
        sink = KafkaSink(kafka_broker.bootstrap, topic, tmp_path)
        assert await sink.flush(timeout=30)
        records = await read_topic(kafka_broker.bootstrap, topic, emitted)
        events = [parse_event(r.value) for r in records]
        assert len(ids(records)) == emitted
        assert verify_chain(events).ok
        await sink.close()


class TestSpoolFull:
    async def test_full_spool_fails_closed(self, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
        """With the broker away and the spool full, new calls end Blocked: audit unavailable, the
        reason naming the sink and its spool; the change is logged once."""
        caplog.set_level("WARNING", logger="callgate.events.kafka")
        port = free_port("127.0.0.1")
        sink = KafkaSink(f"127.0.0.1:{port}", "t", tmp_path, spool_max_bytes=16_000, connect_timeout_s=1)
        agent = gate_with(sink)
        deadline = time.monotonic() + 30
        blocked: ToolBlockedError | None = None
        n = 0
        while blocked is None and time.monotonic() < deadline:
            try:
                await calls(agent, 1, start=n * 4, note="x" * 200)
            except ToolBlockedError as exc:
                blocked = exc
            n += 1
            await spooled(sink, until_unavailable=True)
        assert blocked is not None
        named = f"audit unavailable: KafkaSink(t on 127.0.0.1:{port}): spool full ("
        assert blocked.reason.startswith(named), blocked.reason
        assert f" bytes in {tmp_path}); nothing delivered for " in blocked.reason
        assert not sink.available
        full = [r for r in caplog.records if r.name == "callgate.events.kafka" and "spool full" in r.getMessage()]
        assert len(full) == 1  # once, however many calls were refused
        await sink.close(timeout=0.5)

    async def test_drop_oldest_counts_and_reports(self, tmp_path: Path, topic: str) -> None:
        """With drop_oldest, calls go on, the oldest events are dropped, and the count rides on the next batch."""
        port = free_port("127.0.0.1")
        sink = KafkaSink(
            f"127.0.0.1:{port}", topic, tmp_path, spool_max_bytes=16_000, when_full="drop_oldest", connect_timeout_s=1
        )
        agent = gate_with(sink)
        for n in range(60):
            await calls(agent, 1, start=n * 4, note="x" * 200)
            await spooled(sink)
        assert sink.available
        assert sink.dropped > 0
        with EmbeddedBroker(port=port) as broker:
            assert await sink.flush(timeout=60)
            records = await read_topic(broker.bootstrap, topic, 1)
            reported = [int(decode_headers(r.headers).get(DROPPED_HEADER, "0")) for r in records]
            assert sum(reported) == sink.dropped
            await sink.close()


SPOOL_WRITE_FAILS = """
import asyncio, json, logging, resource, time
from pathlib import Path
from events.kafka import KafkaSink
from events.spool import Spool
from interceptor_core import Gate, RunContext, ToolBlockedError, tool

logged = []
handler = logging.Handler()
handler.emit = lambda record: logged.append(record.getMessage())
logging.getLogger("callgate.events.kafka").addHandler(handler)
logging.getLogger("callgate.events.kafka").setLevel(logging.WARNING)

@tool
def refund(order_id: str, note: str = "") -> str:
    \"\"\"Refunds an order.\"\"\"
    return "ok"

async def main():
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    # Segment files may not grow past 20 kB: a disk that fills up (Python ignores SIGXFSZ).
    resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, hard))
    sink = KafkaSink({bootstrap!r}, "t", {spool!r}, connect_timeout_s=1)
    agent = Gate("shop", sinks=[sink]).agent("desk", tools=[refund])
    ran, reason, deadline = 0, None, time.monotonic() + 30
    while reason is None and time.monotonic() < deadline:
        try:
            await agent.call("refund", {{"order_id": f"A-{{ran}}", "note": "x" * 1000}}, run=RunContext())
            ran += 1
        except ToolBlockedError as exc:
            reason = exc.reason
        await asyncio.sleep(0.005)  # sleep-ok: the sender thread spools between calls
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    deadline = time.monotonic() + 30
    while not sink.available and time.monotonic() < deadline:
        await asyncio.sleep(0.005)  # sleep-ok: polling with a deadline for the next spool write
    available, pending = sink.available, sink.pending
    await sink.close(timeout=1)
    with Spool(Path({spool!r}) / "segments") as spool:
        kept = spool.pending
    print(json.dumps(dict(reason=reason, ran=ran, available=available, pending=pending, kept=kept, logged=logged)))

asyncio.run(main())
"""


class TestSpoolWriteFailure:
    def test_a_spool_that_cannot_be_written_blocks_calls_until_it_can(self, tmp_path: Path) -> None:
        """A spool whose files cannot grow (RLIMIT_FSIZE, in a process of its own: a full disk)
        makes the sink unavailable: calls end Blocked naming the spool and the error, logged
        once; once writes work again the held events are spooled, nothing lost."""
        bootstrap = f"127.0.0.1:{free_port('127.0.0.1')}"  # no broker: everything stays spooled
        script = SPOOL_WRITE_FAILS.format(bootstrap=bootstrap, spool=str(tmp_path))
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=90, check=False)
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        down = f"KafkaSink(t on {bootstrap}): spool write failed in {tmp_path}: [Errno 27] File too large"
        assert report["reason"] == f"audit unavailable: {down}"
        assert report["ran"] > 0
        assert report["available"]
        # Every event the gate emitted is in the spool: the calls that ran, the refused one, the
        # ToolsRegistered event.
        assert report["kept"] == report["pending"] == report["ran"] + 2
        changes = [line for line in report["logged"] if line.startswith(f"KafkaSink(t on {bootstrap})")]
        assert len(changes) == 2, report["logged"]  # once down, once up: not once per attempt
        assert changes[0] == down
        assert changes[1].startswith(f"KafkaSink(t on {bootstrap}) takes events again after ")


class TestOversize:
    async def test_large_args_are_cut_to_fit_and_flagged(
        self, kafka_broker: EmbeddedBroker, topic: str, tmp_path: Path
    ) -> None:
        """An event whose args exceed the record limit is delivered with its args cut and flagged."""
        sink, memory = KafkaSink(kafka_broker.bootstrap, topic, tmp_path, max_event_bytes=8_000), MemorySink()
        agent = gate_with(sink, memory)
        await calls(agent, 1, note="y" * 12_000)
        await calls(agent, 1, start=4)
        assert await sink.flush(timeout=30)
        records = await read_topic(kafka_broker.bootstrap, topic, len(memory.events))
        big = next(parse_event(r.value) for r in records if b"yyyy" in r.value)
        assert big.args_truncated  # type: ignore[attr-defined]
        assert ids(records) == {e.event_id for e in memory.events}
        await sink.close()

    async def test_record_still_too_large_is_kept_aside_and_does_not_block(
        self, kafka_broker: EmbeddedBroker, topic: str, tmp_path: Path
    ) -> None:
        """A record larger than max_event_bytes after every cut goes to oversize.jsonl; later events flow."""
        sink, memory = KafkaSink(kafka_broker.bootstrap, topic, tmp_path, max_event_bytes=3_000), MemorySink()
        deny_long = before_tool_call(name="verbose")(lambda call: Deny("z" * 6_000))
        agent = Gate("shop", interceptors=[deny_long], sinks=[sink, memory]).agent("desk", tools=[refund])
        await calls(agent, 1)
        agent_ok = gate_with(sink, memory)
        await calls(agent_ok, 2, start=4)
        assert await sink.flush(timeout=30)
        assert sink.oversize >= 1
        kept = (tmp_path / "oversize.jsonl").read_bytes().splitlines()
        assert any(b"zzzz" in line for line in kept)
        records = await read_topic(kafka_broker.bootstrap, topic, 2)
        assert len(records) >= 2
        await sink.close()
