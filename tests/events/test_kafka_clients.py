"""The events topic read by stock Kafka clients of other languages, each in a real process: kafkajs under
Node.js (with a pure-JavaScript zstd codec), Apache kafka-clients under Java, Sarama under Go. Two gates
write through `KafkaSink` (zstd record batches) to the session's embedded broker; each reader decodes
every record, recomputes each event's hash from its bytes as docs/events.md says, and must find exactly
the events the gates made, their hashes, their order and where each partition ends (from the fetch
responses' high watermarks)."""

from __future__ import annotations

import asyncio
import json
import runpy
import shutil
import subprocess
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from callgate.broker import EmbeddedBroker
from events import MemorySink
from events.kafka import KafkaSink
from interceptor_core import Deny, Gate, RunContext, Substitute, before_tool_call, tool

pytestmark = pytest.mark.integration

CLIENTS = Path(__file__).resolve().parents[1] / "kafka_clients"
NODE_READER = CLIENTS / "node" / "consume.mjs"
JAVA_READER = CLIENTS / "java" / "Consume.java"
GO_READER = CLIENTS / "go"
READER_TIMEOUT_S = 90  # the reader gives up after 30 s of its own; the rest is start-up on a loaded machine


@tool
def refund(order_id: str, amount_cents: int, note: str = "") -> str:
    """Refunds an order."""
    return f"refunded {amount_cents} on {order_id}"


@before_tool_call(name="limits")
def limits(call: Any) -> Any:
    n = call.args["amount_cents"]
    return [None, Deny("over the limit"), Substitute("already refunded"), None][n % 4]


async def _write(bootstrap: str, topic: str, spool: Path) -> list[Any]:
    """Two gates (two producers: their keys pick the partitions, one or two of the topic's three) write
    allowed, denied and substituted calls with non-ASCII text; returns what each sealed, in order."""
    sealed: list[Any] = []
    for name in ("billing desk ü", "support"):
        sink, memory = KafkaSink(bootstrap, topic, spool / name), MemorySink()
        gate = Gate(name, interceptors=[limits], sinks=[sink, memory])
        desk = gate.agent("desk", tools=[refund])
        run = RunContext(tenant="acme", principal="ann@acme.example")
        for i in range(24):
            await desk.call("refund", {"order_id": f"A-{i}", "amount_cents": i, "note": "héllo ✓ 中文"}, run=run)
        assert await sink.flush(), f"{name}: the sink did not deliver every event"
        await gate.close()
        sealed.extend(memory.sealed)
    return sealed


@pytest.fixture(scope="module")
def written(kafka_broker: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[Any]]:
    """The topic and the events the gates sealed into it, written once for every reader."""
    topic = f"events-{uuid.uuid4().hex[:8]}"
    return topic, asyncio.run(_write(kafka_broker.bootstrap, topic, tmp_path_factory.mktemp("spool")))


def _read(command: list[str], env: dict[str, str] | None = None) -> tuple[list[dict[str, Any]], dict[str, int]]:
    done = subprocess.run(command, capture_output=True, timeout=READER_TIMEOUT_S, check=False, env=env)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    *records, last = lines
    return records, {int(p): end for p, end in last["high_watermarks"].items()}


def _assert_read_whole(written: tuple[str, list[Any]], records: list[dict[str, Any]], ends: dict[int, int]) -> None:
    """The reader found every event the gates sealed and nothing else, each hash it recomputed from the
    record's bytes is the one the event carries and the one the gate sealed, each producer's events are
    in seq order in one partition under its key, and each partition ends where its records end."""
    _, sealed = written
    expected = {(s.producer_id, s.seq): s for s in sealed}
    got = {(r["producer_id"], r["seq"]): r for r in records}
    assert len(records) == len(got) == len(expected)
    assert got.keys() == expected.keys()
    for key, record in got.items():
        event = expected[key]
        assert record["recomputed"] == record["hash"] == event.hash, key
        assert (record["event_id"], record["type"]) == (event.event_id, event.type), key
        assert (record["key"], record["ce_type"]) == (event.producer_id, f"dev.callgate.{event.type}"), key
    for producer in {s.producer_id for s in sealed}:
        mine = sorted((r for r in records if r["producer_id"] == producer), key=lambda r: r["offset"])
        assert len({r["partition"] for r in mine}) == 1, producer
        assert [r["seq"] for r in mine] == list(range(1, len(mine) + 1)), producer
    held = Counter(r["partition"] for r in records)
    assert {p: end for p, end in ends.items() if p in held} == dict(held)


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is missing: `make venv` installs it (as root, from Debian's packages)")
    return found


def test_kafkajs_under_node_reads_the_topic(written: tuple[str, list[Any]], kafka_broker: EmbeddedBroker) -> None:
    """kafkajs, with a zstd codec registered, in a consumer group started from the beginning."""
    if not (CLIENTS / "node" / "node_modules" / "kafkajs").is_dir():
        subprocess.run([_tool("npm"), "ci", "--no-audit", "--no-fund", "--silent"], cwd=CLIENTS / "node", check=True)
    topic, sealed = written
    group = f"reader-{uuid.uuid4().hex[:8]}"
    records, ends = _read([_tool("node"), str(NODE_READER), kafka_broker.bootstrap, topic, group, str(len(sealed))])
    _assert_read_whole(written, records, ends)


def test_kafka_clients_under_java_reads_the_topic(written: tuple[str, list[Any]], kafka_broker: EmbeddedBroker) -> None:
    """Apache kafka-clients 4.3 with zstd-jni, every partition assigned and started at offset 0; the
    reader is compiled from source by the JVM that runs it."""
    fetch_jars = runpy.run_path(str(CLIENTS / "java" / "fetch_jars.py"))  # beside the reader, in no package
    if not fetch_jars["present"]():
        fetch_jars["fetch"]()
    topic, sealed = written
    java = _tool("java")
    # The client-only JIT tier: the reader runs for a second or two, so the JVM starts faster without C2.
    command = [java, "-XX:TieredStopAtLevel=1", "-cp", fetch_jars["class_path"](), str(JAVA_READER)]
    records, ends = _read([*command, kafka_broker.bootstrap, topic, str(len(sealed))])
    _assert_read_whole(written, records, ends)


def test_sarama_under_go_reads_the_topic(
    written: tuple[str, list[Any]], kafka_broker: EmbeddedBroker, tmp_path: Path
) -> None:
    """Sarama (Debian's Go package, built in GOPATH mode: nothing downloaded), every partition started
    at offset 0. `make venv` built it once, so Go's build cache makes this build take about a second
    (20 s without that cache)."""
    go_build = runpy.run_path(str(GO_READER / "build.py"))  # beside the reader, in no package
    binary = tmp_path / "consume"
    built = go_build["build"](binary)
    assert built.returncode == 0, built.stderr.decode(errors="replace")[-3000:]
    topic, sealed = written
    records, ends = _read([str(binary), kafka_broker.bootstrap, topic, str(len(sealed))])
    _assert_read_whole(written, records, ends)
