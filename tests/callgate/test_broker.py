"""The embedded broker: start, metadata, produce/consume, stop, crash and restart, and `callgate broker`."""

from __future__ import annotations

import os
import selectors
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.client import AIOKafkaClient
from aiokafka.structs import TopicPartition

from callgate.broker import BrokerError, EmbeddedBroker, free_port, is_port_free, kafka_brokers

REPO = Path(__file__).resolve().parents[2]


def unique_topic(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


async def create_topic(bootstrap: str, topic: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
    finally:
        await admin.close()


async def list_topics(bootstrap: str) -> list[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return list(await admin.list_topics())
    finally:
        await admin.close()


async def produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    """Plain producer: not idempotent, not transactional, every write acknowledged by all replicas."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=False)
    await producer.start()
    try:
        for value in values:
            await producer.send_and_wait(topic, value, partition=0)
    finally:
        await producer.stop()


async def read_partition(bootstrap: str, topic: str, count: int, deadline_s: float = 15.0) -> list[bytes]:
    """The first `count` values of partition 0, read without a consumer group; fails at the deadline."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    await consumer.start()
    try:
        partition = TopicPartition(topic, 0)
        consumer.assign([partition])
        await consumer.seek_to_beginning(partition)
        values: list[bytes] = []
        deadline = time.monotonic() + deadline_s
        while len(values) < count and time.monotonic() < deadline:
            batches = await consumer.getmany(partition, timeout_ms=500)
            values.extend(record.value for record in batches.get(partition, []) if record.value is not None)
        return values
    finally:
        await consumer.stop()


def fake_binary(tmp_path: Path, script: str) -> Path:
    """A stand-in executable for the broker binary (to make a start fail in a known way)."""
    path = tmp_path / "fake-broker"
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(0o755)
    return path


class TestStart:
    async def test_answers_metadata_after_start(self, kafka_broker: EmbeddedBroker) -> None:
        """Once start() returns, a Kafka client gets metadata naming the broker at its bootstrap address."""
        assert kafka_broker.running
        client = AIOKafkaClient(bootstrap_servers=kafka_broker.bootstrap)
        await client.bootstrap()
        try:
            metadata = await client.fetch_all_metadata()
        finally:
            await client.close()
        assert {f"{b.host}:{b.port}" for b in metadata.brokers()} == {kafka_broker.bootstrap}

    def test_raw_probe_sees_the_advertised_address(self, kafka_broker: EmbeddedBroker) -> None:
        """The readiness probe's own metadata request reports the host and port the broker was given."""
        brokers = kafka_brokers(kafka_broker.host, kafka_broker.port)
        assert [(host, port) for _, host, port in brokers] == [(kafka_broker.host, kafka_broker.port)]

    def test_missing_binary_is_named(self) -> None:
        """A binary that does not exist raises BrokerError naming it, and nothing is left running."""
        broker = EmbeddedBroker(binary="/nonexistent")
        with pytest.raises(BrokerError, match="/nonexistent"):
            broker.start()
        assert not broker.running

    def test_exit_before_ready_reports_code_and_log(self, tmp_path: Path) -> None:
        """A binary that exits at once raises BrokerError with its exit code, its address and its output."""
        binary = fake_binary(tmp_path, 'echo "cannot start: $*"\nexit 3')
        broker = EmbeddedBroker(binary=binary)
        with pytest.raises(BrokerError) as raised:
            broker.start()
        message = str(raised.value)
        assert str(binary) in message
        assert f"127.0.0.1:{broker.port}" in message
        assert "code 3" in message
        assert f"cannot start: broker --listener-url tcp://127.0.0.1:{broker.port}" in message
        assert broker.log_path is None  # the temporary log went with the failed start

    def test_silence_times_out_and_kills_the_process(self, tmp_path: Path) -> None:
        """A binary that never answers raises BrokerError at the timeout and is not left running."""
        pid_file = tmp_path / "pid"
        broker = EmbeddedBroker(binary=fake_binary(tmp_path, f"echo $$ > {pid_file}\nexec sleep 60"))
        with pytest.raises(BrokerError, match=r"did not answer a Kafka metadata request within 0\.5s"):
            broker.start(timeout=0.5)
        assert not broker.running
        with pytest.raises(ProcessLookupError):
            os.kill(int(pid_file.read_text()), 0)

    def test_taken_port_is_refused(self) -> None:
        """Starting on a port another socket listens on raises BrokerError saying the address is in use."""
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            broker = EmbeddedBroker(port=port)
            with pytest.raises(BrokerError, match=f"127.0.0.1:{port}: the address is already in use"):
                broker.start()
        assert not broker.running

    def test_bootstrap_needs_a_port(self) -> None:
        """An unstarted broker asked for any free port has no bootstrap address yet."""
        with pytest.raises(BrokerError, match="start"):
            _ = EmbeddedBroker().bootstrap


class TestProduceConsume:
    async def test_plain_producer_round_trip(self, kafka_broker: EmbeddedBroker) -> None:
        """Records written by a non-idempotent acks=all producer are read back in order by an assigned consumer."""
        topic = unique_topic("round-trip")
        await create_topic(kafka_broker.bootstrap, topic)
        sent = [f"record-{i}".encode() for i in range(5)]
        await produce(kafka_broker.bootstrap, topic, sent)
        assert await read_partition(kafka_broker.bootstrap, topic, len(sent)) == sent


class TestStop:
    def test_stop_frees_the_port_and_is_idempotent(self, fresh_broker: EmbeddedBroker) -> None:
        """stop() ends the process, releases its port and removes its temporary log; a second stop() is a no-op."""
        log = fresh_broker.log_path
        assert log is not None
        assert log.exists()
        fresh_broker.stop()
        assert not fresh_broker.running
        assert fresh_broker.pid is None
        assert is_port_free(fresh_broker.host, fresh_broker.port)
        assert not log.exists()
        fresh_broker.stop()
        assert not fresh_broker.running

    def test_context_manager_stops_on_exit(self) -> None:
        """Leaving a `with EmbeddedBroker()` block stops the broker and frees its port."""
        with EmbeddedBroker() as broker:
            assert broker.running
        assert not broker.running
        assert is_port_free(broker.host, broker.port)

    def test_given_log_path_is_kept(self, tmp_path: Path) -> None:
        """A log path chosen by the caller receives the broker's output and survives stop()."""
        log = tmp_path / "broker.log"
        with EmbeddedBroker(log_path=log) as broker:
            assert broker.log_path == log
        assert log.read_text().strip()


class TestKillRestart:
    async def test_kill_then_restart_on_the_same_port_starts_empty(self, fresh_broker: EmbeddedBroker) -> None:
        """After a SIGKILL the port is free; restart() serves the same address again, with no topics left."""
        bootstrap = fresh_broker.bootstrap
        topic = unique_topic("crash")
        await create_topic(bootstrap, topic)
        await produce(bootstrap, topic, [b"before the crash"])

        fresh_broker.kill()
        assert not fresh_broker.running
        assert is_port_free(fresh_broker.host, fresh_broker.port)

        fresh_broker.restart()
        assert fresh_broker.running
        assert fresh_broker.bootstrap == bootstrap
        assert topic not in await list_topics(bootstrap)
        await create_topic(bootstrap, topic)
        await produce(bootstrap, topic, [b"after the restart"])
        assert await read_partition(bootstrap, topic, 1) == [b"after the restart"]

    def test_restart_of_a_running_broker(self, fresh_broker: EmbeddedBroker) -> None:
        """restart() on a live broker stops it and brings a new process up on the same port."""
        before = fresh_broker.pid
        fresh_broker.restart()
        assert fresh_broker.running
        assert fresh_broker.pid != before
        assert kafka_brokers(fresh_broker.host, fresh_broker.port)


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "callgate.cli", *args]


@pytest.fixture
def cli_process() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Holds the `callgate broker` processes a test starts, and ends any it left running."""
    processes: list[subprocess.Popen[bytes]] = []
    yield processes
    for process in processes:
        if process.poll() is None:
            process.terminate()
            try:
                process.communicate(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.communicate()


def read_until(process: subprocess.Popen[bytes], marker: bytes, deadline_s: float) -> bytes:
    """The process's stdout up to and including the line with `marker`; fails at the deadline."""
    assert process.stdout is not None
    seen = b""
    deadline = time.monotonic() + deadline_s
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while marker not in seen:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no {marker!r} within {deadline_s}s; stdout so far: {seen!r}"
            if selector.select(timeout=remaining):
                chunk = os.read(process.stdout.fileno(), 4096)
                assert chunk, f"stdout closed before {marker!r} (exit code {process.wait()}): {seen!r}"
                seen += chunk
    return seen


class TestCli:
    async def test_runs_until_sigint(self, cli_process: list[subprocess.Popen[bytes]]) -> None:
        """`callgate broker` prints its address when ready, serves clients, and on SIGINT stops cleanly with 0."""
        port = free_port("127.0.0.1")
        process = subprocess.Popen(
            cli("broker", "--port", str(port)), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        cli_process.append(process)
        assert f"broker ready at 127.0.0.1:{port}".encode() in read_until(process, b"broker ready at", 30)

        client = AIOKafkaClient(bootstrap_servers=f"127.0.0.1:{port}")
        await client.bootstrap()
        try:
            metadata = await client.fetch_all_metadata()
        finally:
            await client.close()
        assert [b.port for b in metadata.brokers()] == [port]

        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=15)
        assert process.returncode == 0, err
        assert b"broker stopped" in out
        assert is_port_free("127.0.0.1", port)

    def test_taken_port_exits_2_with_one_line(self) -> None:
        """With the port taken, `callgate broker` prints one error line naming the address and exits 2."""
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            result = subprocess.run(cli("broker", "--port", str(port)), cwd=REPO, capture_output=True, timeout=60)
        assert result.returncode == 2
        lines = result.stderr.decode().strip().splitlines()
        assert len(lines) == 1
        assert f"127.0.0.1:{port}" in lines[0]
        assert "already in use" in lines[0]

    def test_missing_binary_exits_2_with_one_line(self) -> None:
        """With CALF_TANSU_BIN pointing nowhere, `callgate broker` names the path in one error line and exits 2."""
        env = {**os.environ, "CALF_TANSU_BIN": "/nonexistent/tansu"}
        result = subprocess.run(
            cli("broker", "--port", str(free_port("127.0.0.1"))), cwd=REPO, env=env, capture_output=True, timeout=60
        )
        assert result.returncode == 2
        lines = result.stderr.decode().strip().splitlines()
        assert len(lines) == 1
        assert "/nonexistent/tansu" in lines[0]

    async def test_sigkill_takes_the_broker_with_it(self, cli_process: list[subprocess.Popen[bytes]]) -> None:
        """SIGKILL of `callgate broker` ends its Tansu child: the port is free at once and a new one starts on it."""
        port = free_port("127.0.0.1")
        first = subprocess.Popen(
            cli("broker", "--port", str(port)), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        cli_process.append(first)
        read_until(first, b"broker ready at", 30)
        assert not is_port_free("127.0.0.1", port)
        first.kill()
        first.communicate(timeout=15)
        deadline = time.monotonic() + 5
        while not is_port_free("127.0.0.1", port):
            assert time.monotonic() < deadline, f"port {port} still taken 5 s after the command was killed"
        second = subprocess.Popen(
            cli("broker", "--port", str(port)), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        cli_process.append(second)
        assert f"broker ready at 127.0.0.1:{port}".encode() in read_until(second, b"broker ready at", 30)

    async def test_creates_the_events_topic_with_the_known_count(
        self, cli_process: list[subprocess.Popen[bytes]]
    ) -> None:
        """Before it says ready, `callgate broker` has created the events topic with --partitions partitions."""
        port = free_port("127.0.0.1")
        process = subprocess.Popen(
            cli("broker", "--port", str(port), "--topic", "t-known", "--partitions", "5"),
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        cli_process.append(process)
        assert b"topic t-known: 5 partitions" in read_until(process, b"broker ready at", 30)
        admin = AIOKafkaAdminClient(bootstrap_servers=f"127.0.0.1:{port}")
        await admin.start()
        try:
            described = await admin.describe_topics(["t-known"])
        finally:
            await admin.close()
        assert len(described[0]["partitions"]) == 5


class TestDieWithParent:
    def test_broker_dies_with_the_process_that_started_it(self, tmp_path: Path) -> None:
        """An `EmbeddedBroker(die_with_parent=True)` in a process that is SIGKILLed does not outlive it."""
        script = (
            "import sys\n"
            "from callgate.broker import EmbeddedBroker\n"
            "broker = EmbeddedBroker(die_with_parent=True).start()\n"
            "print(broker.pid, broker.port, flush=True)\n"
            "sys.stdin.readline()\n"
        )
        with subprocess.Popen(
            [sys.executable, "-c", script], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        ) as parent:
            assert parent.stdout is not None
            pid, port = (int(word) for word in parent.stdout.readline().split())
            os.kill(parent.pid, signal.SIGKILL)
            parent.wait()
        deadline = time.monotonic() + 5
        while _alive(pid) or not is_port_free("127.0.0.1", port):
            assert time.monotonic() < deadline, f"broker {pid} outlived its parent by 5 s"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (dead, not yet reaped by init) still answers kill(0); its state says it is gone.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
