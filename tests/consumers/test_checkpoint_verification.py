"""Signed checkpoints verified by the store: signature, key, root, consistency, and what is missing."""

from __future__ import annotations

import asyncio
import base64
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from callgate.broker import EmbeddedBroker
from consumers.materializer import Materializer
from consumers.store import AuditStore, RawRecord
from events import EventBase, MemorySink, encode_event
from events.chain import Producer
from events.checkpoints import ORIGIN_PREFIX, checkpoint_extensions
from events.kafka import KafkaSink
from events.merkle import MerkleTree
from events.models import CheckpointEvent, ToolUseEvent
from events.signing import SIGNATURE_PREFIX, SigningKey, checkpoint_body, signed_note
from interceptor_core import Gate, RunContext, tool

TOPIC = "callgate.audit"
RUN = RunContext(tenant="acme", principal="u-1")
KEY = SigningKey.generate("gate-a")
OTHER = SigningKey.generate("gate-b")


@tool
def refund(order_id: str) -> str:
    """Refunds an order."""
    return f"refunded {order_id}"


def records(events: list[EventBase], start: int = 0) -> list[RawRecord]:
    return [
        RawRecord(TOPIC, 0, start + i, e.producer_id.encode(), encode_event(e), 1_700_000_000_000)
        for i, e in enumerate(events)
    ]


def ingest(store: AuditStore, events: list[EventBase], start: int = 0) -> dict[str, int]:
    result = store.ingest(records(events, start), {(TOPIC, 0): start + len(events)})
    return dict(result.chain_breaks_by_kind)


def breaks(store: AuditStore) -> list[tuple[int, str]]:
    con = store.cursor()
    try:
        return [
            (int(s), str(k)) for s, k in con.execute("select seq, kind from chain_breaks order by seq, kind").fetchall()
        ]
    finally:
        con.close()


def gate_events(key: SigningKey, calls: int, checkpoint_events: int = 4) -> list[EventBase]:
    """A real gate's events with its checkpoints (every `checkpoint_events` events, and on close).

    The gate's checkpoint thread runs beside the calls: after the k-th `checkpoint_events` calls this
    waits until k checkpoints are out (each new event is covered by one emitted after it, within the
    gate's `checkpoint_s`), so a loaded machine cannot leave a run with only the closing one."""
    sink = MemorySink()
    gate = Gate("shop", sinks=[sink], signing_key=key, checkpoint_events=checkpoint_events)
    desk = gate.agent("desk", tools=[refund])

    def checkpoints() -> int:
        return sum(isinstance(e, CheckpointEvent) for e in list(sink.events))

    async def run() -> None:
        for n in range(calls):
            await desk.call("refund", {"order_id": f"A-{n}"}, run=RUN)
            if (n + 1) % checkpoint_events == 0:
                wanted, deadline = (n + 1) // checkpoint_events, time.monotonic() + 30
                while checkpoints() < wanted:
                    assert time.monotonic() < deadline, "no checkpoint within 30 s"
                    await asyncio.sleep(0.01)  # sleep-ok: polling with a deadline
        await gate.close()

    asyncio.run(run())
    return sorted(sink.events, key=lambda e: e.seq)


class Forger:
    """A hand-made producer: plain events and checkpoints whose every part a test may change."""

    def __init__(self) -> None:
        self.producer = Producer()
        self.tree = MerkleTree()
        self.events: list[EventBase] = []

    def add(self, n: int, at: datetime | None = None) -> Forger:
        for i in range(n):
            self._seal(
                ToolUseEvent,
                {
                    "event_id": uuid.uuid4().hex,
                    "time": at or datetime.now(UTC),
                    "gate": "g",
                    "outcome": "ok",
                    "duration_ms": 1,
                    "args": {"n": i},
                },
            )
        return self

    def checkpoint(
        self,
        key: SigningKey = KEY,
        *,
        root: bytes | None = None,
        size: int | None = None,
        closing: bool = False,
        heartbeat_s: float = 60.0,
        at: datetime | None = None,
        flip_signature: bool = False,
    ) -> Forger:
        size = self.tree.size if size is None else size
        root = self.tree.root() if root is None else root
        at = at or datetime.now(UTC)
        body = checkpoint_body(
            ORIGIN_PREFIX + self.producer.producer_id, size, root, checkpoint_extensions(at, heartbeat_s, closing)
        )
        note = signed_note(body, key)
        if flip_signature:
            head, _, line = note[:-1].rpartition(b"\n")
            name, _, encoded = line[len(SIGNATURE_PREFIX) :].partition(b" ")
            blob = bytearray(base64.b64decode(encoded))
            blob[-1] ^= 1
            note = head + b"\n" + SIGNATURE_PREFIX + name + b" " + base64.b64encode(bytes(blob)) + b"\n"
        self._seal(
            CheckpointEvent,
            {
                "event_id": uuid.uuid4().hex,
                "time": at,
                "gate": "g",
                "tree_size": size,
                "root": root.hex(),
                "closing": closing,
                "heartbeat_s": heartbeat_s,
                "key_id": key.key_id,
                "note": note.decode(),
            },
        )
        return self

    def _seal(self, cls: Any, fields: dict[str, Any]) -> None:
        event = self.producer.seal(cls, fields)
        self.tree.append(bytes.fromhex(event.hash))
        self.events.append(event)


@pytest.fixture
def store(tmp_path: Path) -> Any:
    with AuditStore(tmp_path / "audit.duckdb", trusted_keys={KEY.key_id: KEY.public()}) as store:
        yield store


def strict_store(path: Path) -> AuditStore:
    return AuditStore(path, trusted_keys={KEY.key_id: KEY.public()}, require_signed=True)


class TestVerification:
    def test_a_real_gates_checkpoints_verify(self, store: AuditStore) -> None:
        """Every checkpoint of a real gate with a trusted key verifies: no chain break."""
        events = gate_events(KEY, 10)
        assert sum(e.type == "Checkpoint" for e in events) >= 2  # type: ignore[attr-defined]
        assert ingest(store, events) == {}
        assert breaks(store) == []
        assert store.close_checkpoints() == {}
        con = store.cursor()
        row = con.execute("select tree_size, leaves from checkpoint_state").fetchone()
        con.close()
        last = max(e.tree_size for e in events if isinstance(e, CheckpointEvent))
        # The last valid checkpoint's size; the tree index folds every stored event.
        assert row == (last, len(events))

    def test_checkpoints_verify_across_batches_in_any_order(self, store: AuditStore) -> None:
        """Delivered one by one, newest first, the checkpoints wait for their events and then verify."""
        events = gate_events(KEY, 10, checkpoint_events=3)
        for i, event in enumerate(reversed(events)):
            assert ingest(store, [event], start=i) == {}
        assert breaks(store) == []
        assert store.close_checkpoints() == {}

    def test_a_checkpoint_of_an_untrusted_key_is_unknown_key(self, store: AuditStore) -> None:
        """A gate signing with a key the store does not trust: each of its checkpoints is unknown_key."""
        events = gate_events(OTHER, 5)
        checkpoints = [e for e in events if isinstance(e, CheckpointEvent)]
        assert ingest(store, events) == {"unknown_key": len(checkpoints)}
        assert breaks(store) == [(c.seq, "unknown_key") for c in checkpoints]
        con = store.cursor()
        detail, event_id = con.execute("select detail, event_id from chain_breaks").fetchall()[0]
        con.close()
        assert checkpoints[0].event_id == event_id
        assert f"tree_size {checkpoints[0].tree_size}" in detail
        assert OTHER.key_id in detail

    def test_a_flipped_signature_byte_is_bad_signature(self, store: AuditStore) -> None:
        """A trusted key's signature that does not verify is bad_signature; the chain itself is intact."""
        forged = Forger().add(3).checkpoint(flip_signature=True)
        assert ingest(store, forged.events) == {"bad_signature": 1}
        assert breaks(store) == [(4, "bad_signature")]

    def test_a_note_that_disagrees_with_its_event_is_bad_signature(self, store: AuditStore) -> None:
        """The event's tree_size replaced after signing: the note no longer says what the event says."""
        forged = Forger().add(3).checkpoint()
        checkpoint = forged.events[-1]
        producer = Producer(checkpoint.producer_id)
        resealed = [
            producer.seal(
                ToolUseEvent, e.model_dump(include={"event_id", "time", "gate", "outcome", "duration_ms", "args"})
            )
            for e in forged.events[:-1]
        ]
        fields = checkpoint.model_dump(
            include={"event_id", "time", "gate", "root", "closing", "heartbeat_s", "key_id", "note"}
        )
        resealed.append(producer.seal(CheckpointEvent, {**fields, "tree_size": 2}))
        assert ingest(store, resealed) == {"bad_signature": 1}
        con = store.cursor()
        (detail,) = con.execute("select detail from chain_breaks").fetchone()  # type: ignore[misc]
        con.close()
        assert "the note's size is 3, the event's tree_size 2" in detail

    def test_a_signed_forged_root_is_root_mismatch(self, store: AuditStore) -> None:
        """A validly signed root that is not the stored chain's: root_mismatch, and inconsistent with the
        valid checkpoint before it."""
        forged = Forger().add(3).checkpoint().add(2).checkpoint(root=bytes(32))
        assert ingest(store, forged.events) == {"root_mismatch": 1, "inconsistent": 1}
        assert breaks(store) == [(7, "inconsistent"), (7, "root_mismatch")]

    def test_a_forged_root_without_an_earlier_checkpoint_is_only_root_mismatch(self, store: AuditStore) -> None:
        """Nothing to be inconsistent with: the first checkpoint's wrong root is root_mismatch alone."""
        forged = Forger().add(3).checkpoint(root=bytes(32))
        assert ingest(store, forged.events) == {"root_mismatch": 1}

    def test_a_checkpoint_going_backwards_with_a_true_root_is_consistent(self, store: AuditStore) -> None:
        """A later checkpoint of an earlier, true prefix proves consistent (RFC 9162): no break."""
        forged = Forger().add(3)
        early_root = forged.tree.root()
        forged.add(2).checkpoint().checkpoint(size=3, root=early_root)
        assert ingest(store, forged.events) == {}

    def test_a_checkpoint_missing_its_events_is_truncated_at_the_end(self, store: AuditStore) -> None:
        """A checkpoint covering events the store never gets waits, then is truncated when the drain ends."""
        forged = Forger().add(4).checkpoint()
        assert ingest(store, [forged.events[0], forged.events[2], forged.events[4]]) == {}
        assert store.close_checkpoints() == {"truncated": 1}
        con = store.cursor()
        (detail,) = con.execute("select detail from chain_breaks where kind = 'truncated'").fetchone()  # type: ignore[misc]
        con.close()
        assert "covers seqs 1..4; the store holds 2 of them" in detail
        assert store.close_checkpoints() == {}

    def test_a_store_without_keys_queues_checkpoints_for_a_later_run(self, tmp_path: Path) -> None:
        """Checkpoints stored without trusted keys are verified when the store is next opened with them."""
        path = tmp_path / "audit.duckdb"
        forged = Forger().add(3).checkpoint(flip_signature=True)
        with AuditStore(path) as plain:
            ingest(plain, forged.events)
            assert plain.close_checkpoints() == {}
        with AuditStore(path, trusted_keys={KEY.key_id: KEY.public()}) as keyed:
            assert keyed.close_checkpoints() == {"bad_signature": 1}

    def test_require_signed_needs_keys(self, tmp_path: Path) -> None:
        """require_signed without trusted keys is the caller's mistake."""
        with pytest.raises(ValueError, match="require_signed needs trusted_keys"):
            AuditStore(tmp_path / "a.duckdb", require_signed=True)


class TestRequireSigned:
    def test_a_producer_without_a_valid_checkpoint_is_unsigned(self, tmp_path: Path) -> None:
        """A producer with no key at all is unsigned at the end of the drain; a signed one is not."""
        with strict_store(tmp_path / "a.duckdb") as store:
            ingest(store, Forger().add(3).events)
            ingest(store, gate_events(KEY, 3), start=3)
            assert store.close_checkpoints() == {"unsigned": 1}
            assert breaks(store) == [(1, "unsigned")]

    def test_events_never_covered_and_a_silent_producer(self, tmp_path: Path) -> None:
        """After its last checkpoint a producer wrote events and fell silent without closing: the events
        are uncovered and the producer silent once heartbeat_s × 3 has passed."""
        old = datetime.now(UTC) - timedelta(seconds=10)
        forged = Forger().add(2, old).checkpoint(heartbeat_s=1, at=old).add(2, old)
        with strict_store(tmp_path / "a.duckdb") as store:
            ingest(store, forged.events)
            assert store.close_checkpoints() == {"uncovered": 1, "silent": 1}
            assert breaks(store) == [(3, "silent"), (4, "uncovered")]

    def test_a_closed_gate_is_neither_silent_nor_uncovered(self, tmp_path: Path) -> None:
        """A closing checkpoint covers everything before it and ends the producer's duty to speak."""
        old = datetime.now(UTC) - timedelta(seconds=10)
        forged = Forger().add(2).checkpoint(heartbeat_s=1, at=old, closing=True)
        with strict_store(tmp_path / "a.duckdb") as store:
            ingest(store, forged.events)
            assert store.close_checkpoints() == {}

    def test_a_recent_checkpoint_is_not_silent_yet(self, tmp_path: Path) -> None:
        """Within heartbeat_s × 3 of the last checkpoint and of the events after it, nothing is late."""
        forged = Forger().add(2).checkpoint(heartbeat_s=60).add(1)
        with strict_store(tmp_path / "a.duckdb") as store:
            ingest(store, forged.events)
            assert store.close_checkpoints() == {}


def callgate(*args: str) -> subprocess.CompletedProcess[str]:
    """The real `callgate` command as a child process."""
    return subprocess.run(
        [sys.executable, "-c", "from callgate.cli import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


async def publish(bootstrap: str, topic: str, spool: Path, key: SigningKey | None, calls: int) -> None:
    """Run `calls` calls through a gate with a KafkaSink (signing with `key` when given), then close it."""
    signing: dict[str, Any] = {} if key is None else {"signing_key": key, "checkpoint_events": 3}
    gate = Gate("shop", sinks=[KafkaSink(bootstrap, topic, spool, partitions=2)], **signing)
    desk = gate.agent("desk", tools=[refund])
    for n in range(calls):
        await desk.call("refund", {"order_id": f"A-{n}"}, run=RUN)
    await gate.close()


class TestMaterializeCommand:
    def test_a_trusted_keys_path_that_holds_no_key_is_a_startup_error(self, tmp_path: Path) -> None:
        """A missing trusted-keys path stops the command before Kafka or the store: exit 2, one line."""
        done = callgate(
            "materialize", "--bootstrap", "127.0.0.1:1", "--db", str(tmp_path / "a.duckdb"),
            "--trusted-keys", str(tmp_path / "nowhere"), "--drain",
        )  # fmt: skip
        assert done.returncode == 2
        assert done.stderr.count("\n") == 1
        assert "no such trusted keys file or directory" in done.stderr
        assert not (tmp_path / "a.duckdb").exists()

    def test_require_signed_without_keys_is_a_startup_error(self, tmp_path: Path) -> None:
        """--require-signed alone is refused: exit 2."""
        done = callgate("materialize", "--bootstrap", "127.0.0.1:1", "--db", str(tmp_path / "a.duckdb"),
                        "--require-signed", "--drain")  # fmt: skip
        assert done.returncode == 2
        assert "--require-signed needs --trusted-keys" in done.stderr

    @pytest.mark.integration
    async def test_drain_verifies_the_checkpoints_of_real_gates(
        self, kafka_broker: EmbeddedBroker, topic: str, tmp_path: Path
    ) -> None:
        """keygen's key signs a gate's checkpoints, which the drain verifies; a gate with an untrusted key
        is unknown_key and one without a key unsigned."""
        keys = tmp_path / "keys"
        assert callgate("keygen", "--out", str(keys)).returncode == 0
        trusted = SigningKey.load(keys / "callgate.key")
        await publish(kafka_broker.bootstrap, topic, tmp_path / "s1", trusted, 7)
        await publish(kafka_broker.bootstrap, topic, tmp_path / "s2", OTHER, 2)
        await publish(kafka_broker.bootstrap, topic, tmp_path / "s3", None, 2)
        db = tmp_path / "audit.duckdb"
        done = callgate(
            "materialize", "--bootstrap", kafka_broker.bootstrap, "--topic", topic, "--db", str(db),
            "--group", f"g-{uuid.uuid4().hex[:8]}", "--drain", "--trusted-keys", str(keys), "--require-signed",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        # After each batch: the untrusted gate's checkpoints; at the end: both gates without a valid one.
        assert "2 checkpoint breaks recorded" in done.stdout
        with AuditStore(db, read_only=True) as store:
            con = store.cursor()
            kinds = dict(con.execute("select kind, count(*) from chain_breaks group by kind").fetchall())
            clean = con.execute(
                "select count(*) from checkpoint_state s where tree_size is not null "
                "and not exists (select 1 from chain_breaks b where b.producer_id = s.producer_id)"
            ).fetchone()
            con.close()
        assert set(kinds) == {"unknown_key", "unsigned"}
        assert kinds["unsigned"] == 2
        assert clean == (1,)

    @pytest.mark.integration
    async def test_a_sigkilled_producer_is_silent(
        self, kafka_broker: EmbeddedBroker, topic: str, tmp_path: Path
    ) -> None:
        """A gate process killed with SIGKILL never writes its closing checkpoint: once heartbeat_s × 3
        has passed since its last one, the drain records it silent (and not unsigned)."""
        keys = tmp_path / "keys"
        assert callgate("keygen", "--out", str(keys)).returncode == 0
        script = textwrap.dedent(
            f"""
            import asyncio, sys, time
            from events.kafka import KafkaSink
            from interceptor_core import Gate, RunContext, tool

            @tool
            def refund(order_id: str) -> str:
                '''Refunds an order.'''
                return order_id

            async def main():
                sink = KafkaSink({kafka_broker.bootstrap!r}, {topic!r}, {str(tmp_path / "spool")!r}, partitions=2)
                gate = Gate("shop", sinks=[sink], signing_key={str(keys / "callgate.key")!r},
                            checkpoint_events=2, heartbeat_s=0.5)
                desk = gate.agent("desk", tools=[refund])
                for n in range(3):
                    await desk.call("refund", {{"order_id": str(n)}}, run=RunContext(tenant="acme"))
                deadline = time.monotonic() + 30
                while gate._audit.checkpointer.emitted < 1 and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)  # sleep-ok: polling with a deadline for the first checkpoint
                await sink.flush()
                print("ready", flush=True)
                await asyncio.sleep(3600)  # sleep-ok: held alive until the test SIGKILLs it

            asyncio.run(main())
            """
        )
        with subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True) as child:
            try:
                assert child.stdout is not None
                assert child.stdout.readline().strip() == "ready"
            finally:
                child.send_signal(signal.SIGKILL)
                child.wait(timeout=30)
        db = tmp_path / "audit.duckdb"
        deadline = time.monotonic() + 60
        kinds: dict[str, int] = {}
        # Polled with a deadline: the silence becomes provable 1.5 s after the last checkpoint.
        while "silent" not in kinds and time.monotonic() < deadline:
            done = callgate(
                "materialize", "--bootstrap", kafka_broker.bootstrap, "--topic", topic, "--db", str(db),
                "--group", f"g-{uuid.uuid4().hex[:8]}", "--drain", "--trusted-keys", str(keys), "--require-signed",
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            with AuditStore(db, read_only=True) as store:
                con = store.cursor()
                kinds = dict(con.execute("select kind, count(*) from chain_breaks group by kind").fetchall())
                con.close()
        assert kinds.get("silent") == 1
        assert "unsigned" not in kinds
        assert set(kinds) <= {"silent", "uncovered"}

    @pytest.mark.integration
    async def test_a_truncated_stream_is_truncated_at_the_end_of_a_drain(
        self, kafka_broker: EmbeddedBroker, topic: str, tmp_path: Path
    ) -> None:
        """A topic missing events a signed checkpoint covers: the drain records truncated (and the gap)."""
        forged = Forger().add(4).checkpoint(closing=True)
        producer = AIOKafkaProducer(bootstrap_servers=kafka_broker.bootstrap, acks="all", enable_idempotence=False)
        await producer.start()
        try:
            for event in [forged.events[0], *forged.events[3:]]:
                await producer.send_and_wait(topic, encode_event(event), key=event.producer_id.encode(), partition=0)
        finally:
            await producer.stop()
        materializer = Materializer(
            kafka_broker.bootstrap,
            topic,
            str(tmp_path / "audit.duckdb"),
            group=f"g-{uuid.uuid4().hex[:8]}",
            trusted_keys={KEY.key_id: KEY.public()},
            require_signed=True,
        )
        try:
            summary = await materializer.run(drain=True)
            assert summary.checkpoint_breaks == 2  # truncated, and unsigned: its only checkpoint never verified
            assert breaks(materializer.store) == [(1, "unsigned"), (2, "gap"), (3, "gap"), (5, "truncated")]
        finally:
            materializer.close()


class TestContinuousRuns:
    def test_a_truncated_checkpoint_is_forgiven_when_its_events_arrive(self, store: AuditStore) -> None:
        """truncated is a gap's twin: the row goes once the missing events arrive and the root verifies."""
        forged = Forger().add(3).checkpoint()
        ingest(store, [forged.events[0], forged.events[3]])
        assert store.close_checkpoints() == {"truncated": 1}
        assert ingest(store, forged.events[1:3], start=2) == {}
        assert breaks(store) == []

    def test_with_a_grace_time_only_old_findings_are_recorded(self, tmp_path: Path) -> None:
        """A periodic check records nothing stored after its `older_than`, everything stored before it."""
        forged = Forger().add(3).checkpoint()
        with strict_store(tmp_path / "a.duckdb") as store:
            ingest(store, [forged.events[0], forged.events[3]])
            ingest(store, Forger().add(2).events, start=2)
            before = datetime.now(UTC) - timedelta(seconds=60)
            assert store.close_checkpoints(older_than=before) == {}
            after = datetime.now(UTC) + timedelta(seconds=1)
            assert store.close_checkpoints(older_than=after) == {"truncated": 1, "unsigned": 2}
