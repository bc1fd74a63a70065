"""Throughput of KafkaSink into the embedded broker, and what the sink adds to a gate call.

    python bench/pipeline.py [--events N] [--rounds R] [--calls C]

Starts the embedded broker, then, in alternating rounds:

- raw: aiokafka sending the same records (same key, value and CloudEvents headers; acks="all",
  gzip, 5 ms linger), awaiting every acknowledgement: events per second;
- sink: `KafkaSink.emit` of the same events, then `flush()` until the broker acknowledged all of
  them (through the spool: written, fsynced, read back, sent, acknowledged): events per second;
- call cost: `desk.call` with a MemorySink, against the same call with a MemorySink and a KafkaSink
  (emit only enqueues; its sender thread works beside the calls, as it would in production).

Medians over the rounds; the last lines are the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from figures import report

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gate_overhead import ARGS, RUN, build_desk

from callgate.broker import EmbeddedBroker
from events import MemorySink, Producer, ToolUseEvent, encode_event
from events.chain import new_event_id
from events.kafka import KafkaSink, _headers, _spool_key
from events.models import EventBase


def make_events(n: int, schema_version: int = 2) -> list[EventBase]:
    producer = Producer(schema_version=schema_version)
    return [
        producer.seal(
            ToolUseEvent,
            {
                "event_id": new_event_id(),  # UUIDv7, as a gate's ids
                "time": datetime.now(UTC),
                "gate": "bench",
                "workflow": "support",
                "agent": "desk",
                "tool": "get_order",
                "call_id": uuid.uuid4().hex,
                "run_id": RUN.run_id,
                "tenant": "acme",
                "principal": "u-1",
                "decisions": [
                    {"interceptor": n, "scope": "application", "kind": "allow", "duration_ms": 0.01} for n in "abc"
                ],
                "args": {"order_id": f"ACME-{i}", "include_items": False},
                "outcome": "ok",
                "duration_ms": 0.05,
                "output_digest": "d" * 64,
            },
        )
        for i in range(n)
    ]


async def create_topic(bootstrap: str, topic: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=3, replication_factor=1)])
    finally:
        await admin.close()


async def raw_rate(bootstrap: str, events: list[EventBase]) -> float:
    topic = f"raw-{uuid.uuid4().hex[:8]}"
    await create_topic(bootstrap, topic)
    payloads = [(_headers(_spool_key(e), 0), encode_event(e)) for e in events]
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", enable_idempotence=False, linger_ms=5, compression_type="gzip"
    )
    await producer.start()
    try:
        start = time.perf_counter()
        futures = [
            await producer.send(topic, value=value, key=key, headers=headers) for (key, headers), value in payloads
        ]
        await asyncio.gather(*futures)
        return len(events) / (time.perf_counter() - start)
    finally:
        await producer.stop()


async def sink_rate(bootstrap: str, events: list[EventBase], spool: Path) -> float:
    topic = f"sink-{uuid.uuid4().hex[:8]}"
    await create_topic(bootstrap, topic)
    sink = KafkaSink(bootstrap, topic, spool / topic)
    try:
        start = time.perf_counter()
        for event in events:
            sink.emit(event)
        if not await sink.flush(timeout=300):
            raise SystemExit("KafkaSink did not deliver everything within 300 s")
        return len(events) / (time.perf_counter() - start)
    finally:
        await sink.close()


async def call_cost(bootstrap: str, calls: int, rounds: int, spool: Path) -> tuple[float, float]:
    memory_only, with_kafka = MemorySink(), MemorySink()
    kafka = KafkaSink(bootstrap, f"calls-{uuid.uuid4().hex[:8]}", spool / "calls")
    desks = {
        "memory": (build_desk(sinks=[memory_only]), memory_only),
        "kafka": (build_desk(sinks=[with_kafka, kafka]), with_kafka),
    }
    samples: dict[str, list[float]] = {key: [] for key in desks}
    for round_no in range(rounds + 1):
        for key, (desk, memory) in desks.items():
            start = time.perf_counter()
            for _ in range(calls):
                await desk.call("get_order", ARGS, run=RUN)
            elapsed = (time.perf_counter() - start) / calls
            memory.clear()
            # The sender thread catches up between rounds, so the MemorySink-only round is not
            # slowed by the previous round's sending; inside its own round it works beside the calls.
            await kafka.flush(timeout=120)
            if round_no:  # the first round warms up
                samples[key].append(elapsed)
    await kafka.close()
    return statistics.median(samples["memory"]), statistics.median(samples["kafka"])


async def main_async(n: int, rounds: int, calls: int) -> None:
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory() as tmp:
        spool = Path(tmp)
        events = make_events(n)
        raw: list[float] = []
        sink: list[float] = []
        await raw_rate(broker.bootstrap, events[: n // 10])  # warm-up
        for _ in range(rounds):
            raw.append(await raw_rate(broker.bootstrap, events))
            sink.append(await sink_rate(broker.bootstrap, events, spool))
        memory_s, kafka_s = await call_cost(broker.bootstrap, calls, rounds, spool)
    raw_med, sink_med = statistics.median(raw), statistics.median(sink)
    print(f"{'path':<52} {'median':>14}")
    print(f"{'raw aiokafka, same bytes (events/s)':<52} {raw_med:>14,.0f}")
    print(f"{'KafkaSink emit + flush through the spool (events/s)':<52} {sink_med:>14,.0f}")
    print(f"{'desk.call + MemorySink (µs/call)':<52} {memory_s * 1e6:>14.1f}")
    print(f"{'desk.call + MemorySink + KafkaSink (µs/call)':<52} {kafka_s * 1e6:>14.1f}")
    print(f"throughput: KafkaSink / raw aiokafka = {sink_med / raw_med:.2f} (target >= 0.7)")
    print(f"call cost: with KafkaSink / MemorySink only = {kafka_s / memory_s:.2f} (target <= 1.2)")
    report("KafkaSink throughput", sink_med, "events/s", floor=raw_med, target=">= 0.7", higher_is_better=True)
    report("desk.call + MemorySink + KafkaSink", kafka_s * 1e6, "µs/call", floor=memory_s * 1e6, target="<= 1.2")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=3_000)
    opts = parser.parse_args()
    asyncio.run(main_async(opts.events, opts.rounds, opts.calls))


if __name__ == "__main__":
    main()
