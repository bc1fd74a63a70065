"""Per-record cost of the Kafka consumer clients: aiokafka's getmany against confluent-kafka's consume().

    python bench/kafka_clients.py [--events N] [--rounds R]

N events (default 200,000) are published to a 3-partition topic of the embedded broker through
KafkaSink, as the gate writes them. Then, in alternating rounds (default 5), each variant reads all of
them, every round in a fresh child process so that its process CPU is that consumer's alone:

- aiokafka: `AIOKafkaConsumer.getmany` on the event loop, as the materializer reads;
- confluent-kafka: `Consumer.consume()` on the calling thread (it blocks that thread while it waits);
- confluent-kafka via `asyncio.to_thread`: the same `consume()` in a worker thread, awaited by the
  event loop, which then reads the records.

Each consumer is assigned partitions 0..2 from offset 0 (no group join), fetches batches of up to
10,240 records (the materializer's batch) with the clients' default fetch sizes, and hands the records
over as the store reads them (`consumers.store.KafkaRecord`): aiokafka's records as they come, as the
materializer does; confluent-kafka's messages read (topic, partition, offset, key, value, timestamp and
headers) into a `consumers.store.RawRecord` each, since they carry methods, not those attributes.
Figures are µs per record in the steady state, from the end of the first non-empty batch to the last
record (the connection and the first fetch excluded): wall time, process CPU (the client's own threads
included: librdkafka fetches and decompresses in threads of its own), CPU of the main thread (the event
loop for the asyncio variants), CPU of the thread that calls the client (the worker thread for
`to_thread`, inside `consume()`), and the main thread's CPU spent handing the records over. The wall
time and process CPU over all N records, setup included, follow.
Medians of the rounds; aiokafka is the floor of the confluent-kafka figures. The last lines are the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from figures import report

HERE = Path(__file__).resolve().parent
BATCH = 10_240  # consumers.store.ROW_GROUP_ROWS, the materializer's batch_max
PARTITIONS = 3
FETCH_MAX_BYTES = 52_428_800  # both clients' default; the materializer sets none of its own
PARTITION_FETCH_BYTES = 1_048_576  # both clients' default
VARIANTS = {
    "aiokafka": "aiokafka getmany",
    "confluent": "confluent-kafka consume()",
    "confluent-thread": "confluent-kafka consume() via to_thread",
}
STEADY = ("wall", "process", "main", "client", "read")


class Clock:
    """Wall time, process CPU and the main thread's CPU at one moment."""

    def __init__(self) -> None:
        self.wall = time.perf_counter()
        self.process = time.process_time()
        self.main = time.thread_time()


class Round:
    """What one round counts as it reads: records, the first batch, the CPU of reading and of the client."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.got = 0
        self.first = 0
        self.read_cpu = 0.0
        self.client_cpu = 0.0
        self.per_partition: dict[int, int] = {}
        self.setup = Clock()
        self.steady: Clock | None = None
        self.steady_read = 0.0
        self.steady_client = 0.0

    def batch(self, staged: list[Any], read_cpu: float) -> None:
        self.read_cpu += read_cpu
        self.got += len(staged)
        for record in staged:
            self.per_partition[record.partition] = self.per_partition.get(record.partition, 0) + 1
        if staged and self.steady is None:
            self.first = len(staged)
            self.steady = Clock()
            self.steady_read = self.read_cpu
            self.steady_client = self.client_cpu

    def result(self, *, client_is_main: bool) -> dict[str, Any]:
        end = Clock()
        if self.steady is None or self.got <= self.first:
            raise SystemExit(f"read {self.got} records in {self.first} batch(es): no steady state to measure")
        steady_n = self.got - self.first
        main = (end.main - self.steady.main) / steady_n * 1e6
        return {
            "records": self.got,
            "first_batch": self.first,
            "per_partition": self.per_partition,
            "steady": {
                "wall": (end.wall - self.steady.wall) / steady_n * 1e6,
                "process": (end.process - self.steady.process) / steady_n * 1e6,
                "main": main,
                "client": main if client_is_main else (self.client_cpu - self.steady_client) / steady_n * 1e6,
                "read": (self.read_cpu - self.steady_read) / steady_n * 1e6,
            },
            "all": {
                "wall": (end.wall - self.setup.wall) / self.got * 1e6,
                "process": (end.process - self.setup.process) / self.got * 1e6,
            },
        }


def read_aiokafka(batch: dict[Any, list[Any]]) -> tuple[list[Any], float]:
    started = time.thread_time()
    staged = [r for records in batch.values() for r in records]
    return staged, time.thread_time() - started


def read_confluent(messages: Iterable[Any]) -> tuple[list[Any], float]:
    from consumers.store import RawRecord

    started = time.thread_time()
    staged = []
    for m in messages:
        if m.error() is not None:
            raise SystemExit(f"consume() returned an error: {m.error()}")
        staged.append(
            RawRecord(
                m.topic(), m.partition(), m.offset(), m.key(), m.value(), m.timestamp()[1], tuple(m.headers() or ())
            )
        )
    return staged, time.thread_time() - started


async def round_aiokafka(bootstrap: str, topic: str, n: int) -> dict[str, Any]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    counts = Round(n)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_poll_records=BATCH,
        fetch_max_bytes=FETCH_MAX_BYTES,
        max_partition_fetch_bytes=PARTITION_FETCH_BYTES,
    )
    partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    consumer.assign(partitions)
    await consumer.start()
    try:
        for tp in partitions:
            consumer.seek(tp, 0)
        while counts.got < n:
            batch = await consumer.getmany(timeout_ms=500, max_records=min(BATCH, n - counts.got))
            counts.batch(*read_aiokafka(batch))
        return counts.result(client_is_main=True)
    finally:
        await consumer.stop()


def confluent_config(bootstrap: str, errors: list[str]) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap,
        "group.id": f"bench-{uuid.uuid4().hex[:8]}",  # required by the client; assign() joins no group
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "fetch.max.bytes": FETCH_MAX_BYTES,
        "max.partition.fetch.bytes": PARTITION_FETCH_BYTES,
        "error_cb": lambda error: errors.append(str(error)),
    }


def round_confluent(bootstrap: str, topic: str, n: int) -> dict[str, Any]:
    from confluent_kafka import Consumer, TopicPartition

    errors: list[str] = []
    counts = Round(n)
    consumer = Consumer(confluent_config(bootstrap, errors))
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    try:
        while counts.got < n:
            messages = consumer.consume(num_messages=min(BATCH, n - counts.got), timeout=1.0)
            counts.batch(*read_confluent(messages))
        out = counts.result(client_is_main=True)
    finally:
        consumer.close()
    if errors:
        raise SystemExit(f"confluent-kafka reported errors: {errors}")
    return out


async def round_confluent_thread(bootstrap: str, topic: str, n: int) -> dict[str, Any]:
    from confluent_kafka import Consumer, Message, TopicPartition

    errors: list[str] = []
    counts = Round(n)

    def consume(k: int) -> list[Message]:
        started = time.thread_time()
        messages = consumer.consume(num_messages=k, timeout=1.0)
        counts.client_cpu += time.thread_time() - started  # one call at a time: no race
        return messages

    consumer = Consumer(confluent_config(bootstrap, errors))
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    try:
        while counts.got < n:
            messages = await asyncio.to_thread(consume, min(BATCH, n - counts.got))
            counts.batch(*read_confluent(messages))
        out = counts.result(client_is_main=False)
    finally:
        await asyncio.to_thread(consumer.close)
    if errors:
        raise SystemExit(f"confluent-kafka reported errors: {errors}")
    return out


def child(variant: str, bootstrap: str, topic: str, n: int) -> None:
    """One round of one variant; its result as one JSON line."""
    if variant == "aiokafka":
        out = asyncio.run(round_aiokafka(bootstrap, topic, n))
    elif variant == "confluent":
        out = round_confluent(bootstrap, topic, n)
    else:
        out = asyncio.run(round_confluent_thread(bootstrap, topic, n))
    if out["records"] != n:
        raise SystemExit(f"{variant} read {out['records']} records of {n}")
    print(json.dumps(out), flush=True)


def run_round(variant: str, bootstrap: str, topic: str, n: int) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, __file__, "--child", variant, bootstrap, topic, str(n)],
        capture_output=True,
        text=True,
        cwd=HERE.parent,
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"the {variant} round exited {done.returncode}: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main_run(n: int, rounds: int) -> None:
    import aiokafka
    import confluent_kafka

    from callgate.broker import EmbeddedBroker

    print(
        f"aiokafka {aiokafka.__version__}, confluent-kafka {confluent_kafka.__version__} "
        f"(librdkafka {confluent_kafka.libversion()[0]}); {n:,} events, {rounds} rounds",
        flush=True,
    )
    topic = f"clients-{uuid.uuid4().hex[:8]}"
    samples: dict[str, list[dict[str, Any]]] = {variant: [] for variant in VARIANTS}
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        from materialize import publish  # the materializer bench's events, on 3 partitions

        asyncio.run(publish(broker.bootstrap, topic, n, Path(tmp)))
        print(f"published {n:,} events in {time.perf_counter() - started:.1f} s", flush=True)
        partitions: dict[str, int] | None = None
        for i in range(rounds):
            for variant in VARIANTS:
                result = run_round(variant, broker.bootstrap, topic, n)
                if partitions is None:
                    partitions = result["per_partition"]
                elif result["per_partition"] != partitions:
                    raise SystemExit(
                        f"{variant} read {result['per_partition']} records per partition, not {partitions}"
                    )
                samples[variant].append(result)
                s = result["steady"]
                print(
                    f"round {i + 1} {variant:<17} wall {s['wall']:6.2f}  process {s['process']:6.2f}  "
                    f"main {s['main']:6.2f}  client {s['client']:6.2f}  read {s['read']:6.2f} µs/record",
                    flush=True,
                )
    med = {
        variant: {
            **{key: statistics.median(r["steady"][key] for r in results) for key in STEADY},
            **{f"all_{key}": statistics.median(r["all"][key] for r in results) for key in ("wall", "process")},
        }
        for variant, results in samples.items()
    }
    print(f"\nrecords per partition: {partitions}; medians of {rounds} rounds, µs per record, steady state")
    print(
        f"{'variant':<42} {'wall':>7} {'process':>8} {'main':>7} {'client':>7} {'reading':>8}"
        f" {'all: wall':>10} {'process':>8}"
    )
    for variant, label in VARIANTS.items():
        m = med[variant]
        print(
            f"{label:<42} {m['wall']:>7.2f} {m['process']:>8.2f} {m['main']:>7.2f} {m['client']:>7.2f}"
            f" {m['read']:>8.2f} {m['all_wall']:>10.2f} {m['all_process']:>8.2f}"
        )
    print(
        "main: the main thread's CPU (the event loop's for the asyncio variants); client: the CPU of the thread"
        "\nthat calls the client (to_thread: the worker, inside consume()); reading: the main thread's CPU"
        "\nhanding the records over (aiokafka: as they come; confluent-kafka: a RawRecord each); all: over all"
        "\nrecords, the connection and first fetch included"
    )
    floor = med["aiokafka"]
    for variant in ("confluent", "confluent-thread"):
        m = med[variant]
        print(
            f"{VARIANTS[variant]} / aiokafka: wall {m['wall'] / floor['wall']:.2f}, process CPU"
            f" {m['process'] / floor['process']:.2f}, main thread CPU {m['main'] / floor['main']:.2f}"
        )
    target = "informational: < 1 would favour confluent-kafka"
    for variant in ("confluent", "confluent-thread"):
        m = med[variant]
        name = VARIANTS[variant]
        report(f"{name}, wall per record", m["wall"], "µs/record", floor=floor["wall"], target=target)
        report(f"{name}, process CPU per record", m["process"], "µs/record", floor=floor["process"], target=target)
    report(
        "confluent-kafka via to_thread, event loop's CPU per record",
        med["confluent-thread"]["main"],
        "µs/record",
        floor=floor["main"],
        target=target,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--child", nargs=4, metavar=("VARIANT", "BOOTSTRAP", "TOPIC", "N"), help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child:
        variant, bootstrap, topic, n = opts.child
        if variant not in VARIANTS:
            parser.error(f"unknown variant {variant}")
        child(variant, bootstrap, topic, int(n))
        return
    if opts.events <= BATCH:
        parser.error(f"--events must exceed one batch ({BATCH:,} records): the first batch is not measured")
    main_run(opts.events, opts.rounds)


if __name__ == "__main__":
    main()
