"""The lake home with many writers: every batch and its offsets in one lake transaction, a writer
whose partitions another stored first refused (by the fence and by DuckLake's own conflict check),
real processes writing one lake at once, and the lake's options checked."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import consumers.lake
from callgate.broker import EmbeddedBroker
from consumers import AuditStore, RawRecord
from consumers.lake import LakeError, lake_from_options
from consumers.store import StoreError, StoreFencedError
from events import encode_event

from .conftest import NewLake
from .test_store import TOPIC, breaks, gate_events, records

# A writer process: opens the lake, reads the topic's offsets, says "ready", and for each line it
# reads then ingests the records of the file that line names; it answers "stored N" or "fenced".
_WRITER = """
import base64, json, sys
from callgate.broker import EmbeddedBroker
from consumers import AuditStore, RawRecord
from consumers.lake import Lake
from consumers.store import StoreError, StoreFencedError
from events import encode_event

lake = Lake(sys.argv[1], sys.argv[2])
store = AuditStore(lake)
store.offsets(sys.argv[3])
print("ready", flush=True)
for line in sys.stdin:
    batches = json.loads(open(line.strip()).read())
    stored = 0
    try:
        for batch in batches:
            recs = [RawRecord(r["topic"], r["partition"], r["offset"], r["key"].encode(),
                              base64.b64decode(r["value"])) for r in batch]
            offsets = {}
            for r in recs:
                offsets[(r.topic, r.partition)] = max(offsets.get((r.topic, r.partition), 0), r.offset + 1)
            stored += store.ingest(recs, offsets).stored
    except StoreFencedError as exc:
        print("fenced", json.dumps(sorted(f"{t}/{p}" for t, p in exc.moved)), flush=True)
        continue
    print("stored", stored, store.commit_conflicts, flush=True)
store.close()
"""


def _batches_file(path: Path, batches: list[list[RawRecord]]) -> Path:
    path.write_text(
        json.dumps(
            [
                [
                    {
                        "topic": r.topic,
                        "partition": r.partition,
                        "offset": r.offset,
                        "key": (r.key or b"").decode(),
                        "value": base64.b64encode(r.value or b"").decode(),
                    }
                    for r in batch
                ]
                for batch in batches
            ]
        )
    )
    return path


class _Writer:
    """A writer process of `_WRITER` on one lake."""

    def __init__(self, lake: Any) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", _WRITER, lake.catalog, lake.data, TOPIC],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.answer() == "ready"

    def send(self, path: Path) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(f"{path}\n")
        self.process.stdin.flush()

    def answer(self) -> str:
        assert self.process.stdout is not None
        return self.process.stdout.readline().strip()

    def close(self) -> int:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.close()
        code = self.process.wait(timeout=60)
        self.process.stdout.close()
        return code


def _in_batches(recs: list[RawRecord], size: int) -> list[list[RawRecord]]:
    return [recs[i : i + size] for i in range(0, len(recs), size)]


class TestOneWriterAtATime:
    def test_a_writer_whose_partition_another_stored_since_it_read_is_refused(self, new_lake: NewLake) -> None:
        """A reads the offsets, B stores partition 0 past them, A's batch for partition 0 raises
        StoreFencedError naming it: nothing of A's batch is stored, B's events are there once."""
        lake = new_lake()
        events = gate_events(5)
        batch = records(events)
        with AuditStore(lake) as a, AuditStore(lake) as b:
            assert a.offsets(TOPIC) == b.offsets(TOPIC) == {}
            assert b.ingest(batch[:3], {(TOPIC, 0): 3}).stored == 3
            with pytest.raises(StoreFencedError, match=f"{TOPIC}/0") as refused:
                a.ingest(batch, {(TOPIC, 0): len(batch)})
            assert refused.value.moved == {(TOPIC, 0): (None, 3)}
            assert a.counts().total_events == 3
            # Sought again to what the lake holds, A goes on from there.
            assert a.offsets(TOPIC) == {0: 3}
            assert a.ingest(batch[3:], {(TOPIC, 0): len(batch)}).stored == len(batch) - 3
            assert b.offsets(TOPIC) == {0: len(batch)}
            assert breaks(b) == []

    def test_a_commit_after_another_writers_is_refused_by_the_lakes_conflict_check(
        self, new_lake: NewLake, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A's transaction holds the writers' turn and has read the offsets (a paused writer) when B, its
        wait for the turn run out, commits partition 0 without one: A's commit conflicts in the lake, its
        retry on a fresh snapshot finds the offsets moved and raises StoreFencedError; B's rows stay once."""
        monkeypatch.setattr(consumers.lake, "TURN_WAIT_S", 0.2)
        lake = new_lake()
        batch = records(gate_events(5))
        with AuditStore(lake) as a, AuditStore(lake) as b:
            a.offsets(TOPIC)
            b.offsets(TOPIC)
            fence = a._fence
            interleaved: list[int] = []

            def b_commits_in_the_middle(con: Any, offsets: Any) -> None:
                fence(con, offsets)  # passes: A's snapshot predates B's commit
                if not interleaved:
                    interleaved.append(b.ingest(batch[:3], {(TOPIC, 0): 3}).stored)

            monkeypatch.setattr(a, "_fence", b_commits_in_the_middle)
            with pytest.raises(StoreFencedError):
                a.ingest(batch, {(TOPIC, 0): len(batch)})
            assert interleaved == [3]
            assert b.turns is not None
            assert a.turns is not None
            assert (a.turns.missed, b.turns.missed) == (0, 1)
            assert a.commit_conflicts == 1
            ids = b.cursor().execute("SELECT count(*), count(DISTINCT event_id) FROM events").fetchall()
            assert ids == [(3, 3)]

    def test_a_look_at_the_offsets_does_not_move_the_fence_and_a_lost_partition_is_refused(
        self, new_lake: NewLake
    ) -> None:
        """`offsets(expect=())` (a health look) leaves what the fence expects; a partition forgotten on
        revocation is refused once another writer stored it, though this store wrote it before."""
        lake = new_lake()
        batch = records(gate_events(8))
        with AuditStore(lake) as a, AuditStore(lake) as b:
            a.ingest(batch[:3], {(TOPIC, 0): 3})
            b.offsets(TOPIC)
            b.ingest(batch[3:6], {(TOPIC, 0): 6})
            assert a.offsets(TOPIC, expect=()) == {0: 6}
            with pytest.raises(StoreFencedError):
                a.ingest(batch[3:6], {(TOPIC, 0): 6})
            a.offsets(TOPIC, expect=[0])
            a.forget_partitions(TOPIC, [0])
            b.ingest(batch[6:], {(TOPIC, 0): len(batch)})
            with pytest.raises(StoreFencedError):
                a.ingest(batch[6:], {(TOPIC, 0): len(batch)})
            assert a.counts().total_events == len(batch)

    def test_a_producer_whose_partition_moved_keeps_one_chain(self, new_lake: NewLake) -> None:
        """The chain fold reads each producer's head from the lake: seqs 1..3 stored by one writer and the
        rest by another leave no break and no gap."""
        lake = new_lake()
        batch = records(gate_events(6))
        with AuditStore(lake) as a, AuditStore(lake) as b:
            a.ingest(batch[:3], {(TOPIC, 0): 3})
            b.offsets(TOPIC)
            b.ingest(batch[3:], {(TOPIC, 0): len(batch)})
            assert b.close_open_gaps() == 0
            assert breaks(a) == []


class TestWriterProcesses:
    def test_three_processes_write_one_lake_each_event_once(self, new_lake: NewLake, tmp_path: Path) -> None:
        """Three writer processes, a partition each, store their batches at once: every event once, every
        partition's offset at its end, no chain break, and no commit conflicted (the writers took turns)."""
        lake = new_lake()
        writers = [_Writer(lake) for _ in range(3)]
        expected: set[str] = set()
        try:
            for n, writer in enumerate(writers):
                events = gate_events(40, name=f"gate-{n}")
                expected.update(e.event_id for e in events)
                writer.send(_batches_file(tmp_path / f"w{n}.json", _in_batches(records(events, partition=n), 5)))
            answers = [writer.answer().split() for writer in writers]
        finally:
            codes = [writer.close() for writer in writers]
        assert codes == [0, 0, 0]
        assert answers == [["stored", "41", "0"]] * 3
        with AuditStore(lake, read_only=True) as reader:
            rows = reader.cursor().execute("SELECT event_id FROM events").fetchall()
            assert sorted(i for (i,) in rows) == sorted(expected)
            assert reader.offsets(TOPIC) == {0: 41, 1: 41, 2: 41}
            assert breaks(reader) == []

    def test_a_late_process_is_refused_and_stores_nothing(self, new_lake: NewLake, tmp_path: Path) -> None:
        """Two processes read the same offsets; the one that writes partition 0 second is refused: its
        whole batch is left out, and the lake holds the first one's events once."""
        lake = new_lake()
        events = gate_events(9)
        first, late = _Writer(lake), _Writer(lake)
        try:
            first.send(_batches_file(tmp_path / "first.json", [records(events[:5])]))
            assert first.answer().split()[:2] == ["stored", "5"]
            late.send(_batches_file(tmp_path / "late.json", [records(events)]))
            assert late.answer() == f'fenced ["{TOPIC}/0"]'
        finally:
            assert (first.close(), late.close()) == (0, 0)
        with AuditStore(lake, read_only=True) as reader:
            assert reader.cursor().execute("SELECT count(*), count(DISTINCT event_id) FROM events").fetchall() == [
                (5, 5)
            ]
            assert reader.offsets(TOPIC) == {0: 5}


class TestLakeOptions:
    @pytest.mark.parametrize(
        ("catalog", "data", "culprit"),
        [
            ("mysql:host=db", "/tmp/x", "--lake must be postgres:"),
            ("postgres:", "/tmp/x", "--lake must be postgres:"),
            ("postgres:host=db password=secret", "gs://bucket/x", "--data must be a directory or s3://"),
            ("postgres:host=db", "s3://", "names no bucket"),
            ("postgres:host=db\nport=1", "/tmp/x", "one line of text"),
        ],
    )
    def test_a_catalog_or_data_path_of_another_kind_is_refused_by_name(
        self, catalog: str, data: str, culprit: str
    ) -> None:
        """An unknown catalog kind, a data path that is neither a directory nor s3://, text over several
        lines: LakeError naming the option; never the password."""
        with pytest.raises(LakeError, match=culprit) as refused:
            lake_from_options(catalog, data)
        assert "secret" not in str(refused.value)

    def test_a_description_never_shows_the_password(self, tmp_path: Path) -> None:
        """str(lake) (messages, logs) hides a libpq password and a URI's."""
        lake = lake_from_options("postgres:host=db password='s e' user=u", str(tmp_path))
        assert "s e" not in str(lake)
        assert "password=***" in str(lake)
        uri = lake_from_options("postgres:postgresql://u:hunter2@db/lake", str(tmp_path))
        assert "hunter2" not in str(uri)


class TestReadersOfALake:
    def test_coverage_replay_and_queries_read_the_lake_while_a_writer_holds_it(
        self, new_lake: NewLake, tmp_path: Path
    ) -> None:
        """With a materializer's store open for writing, `callgate coverage` and `callgate replay` read the
        lake directly (--lake/--data) and see its events; a file held this way would refuse them."""
        lake = new_lake()
        with AuditStore(lake) as writer:
            writer.ingest(batch := records(gate_events(6)), {(TOPIC, 0): len(batch)})
            where = ["--lake", lake.catalog, "--data", lake.data]
            coverage = subprocess.run(
                [sys.executable, "-m", "callgate.cli", "coverage", *where, "--json", str(tmp_path / "c.json")],
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert coverage.returncode == 0, coverage.stderr
            report = json.loads((tmp_path / "c.json").read_text())
            assert report["ok"] is True
            policy = tmp_path / "allow.policy.yaml"
            policy.write_text("version: 1\nname: allow\ndefault: allow\nrules: []\n")
            report_file = ["--since", "all", "--json", str(tmp_path / "r.json")]
            replay = subprocess.run(
                [sys.executable, "-m", "callgate.cli", "replay", "--policy", str(policy), *where, *report_file],
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert replay.returncode == 0, replay.stderr
            assert json.loads((tmp_path / "r.json").read_text())["checked"] == 6
            writer.ingest(more := records(gate_events(8))[len(batch) :], {(TOPIC, 0): len(batch) + len(more)})

    def test_a_lake_option_without_its_data_path_exits_2_naming_both(self, tmp_path: Path) -> None:
        """--lake without --data is refused at once, in one line."""
        done = subprocess.run(
            [sys.executable, "-m", "callgate.cli", "coverage", "--lake", f"sqlite:{tmp_path / 'c.sqlite'}"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2
        assert done.stderr.strip() == "error: --lake CATALOG and --data PATH go together"


class TestMigrate:
    def test_two_files_are_copied_into_a_lake_once_and_their_chains_verified(
        self, new_lake: NewLake, tmp_path: Path
    ) -> None:
        """Two store files holding overlapping events, a dead letter, a recorded gap and approval claims:
        `callgate migrate` copies each row once (a claim once per approval id, the first file's),
        takes the furthest offset per partition, and verifies the chains (exit 0)."""
        from consumers.approvals import StoreClaims

        events = gate_events(8)
        first, second = tmp_path / "a.duckdb", tmp_path / "b.duckdb"
        claimed, other = "a" * 32, "b" * 32
        claim = {"call_id": "c-1", "claimant": "gate-1", "subject": "svc-shop", "claimed_at": datetime.now(UTC)}
        with AuditStore(first) as a:
            a.ingest([*records(events[:5]), RawRecord(TOPIC, 0, 5, b"k", b"not json")], {(TOPIC, 0): 6})
            assert StoreClaims(a).claim(claimed, claim)[0]
        with AuditStore(second) as b:
            # Overlaps the first file by two events; seq 8 of the chain is missing: a recorded gap.
            kept = [e for e in events[3:] if e.seq != 8]
            b.ingest(records(kept, partition=1), {(TOPIC, 1): len(kept)})
            assert b.close_open_gaps() == 4  # seqs 1..3 are in the other file, 8 is lost
            assert StoreClaims(b).claim(claimed, {**claim, "claimant": "gate-2"})[0]
            assert StoreClaims(b).claim(other, {**claim, "call_id": "c-2"})[0]
        lake = new_lake()
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "callgate.cli",
                "migrate",
                "--from",
                str(first),
                "--from",
                str(second),
                "--lake",
                lake.catalog,
                "--data",
                lake.data,
            ],
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, done.stderr
        assert "events: 8 rows copied" in done.stdout
        assert "1 missing seqs" in done.stdout
        with AuditStore(lake, read_only=True) as reader:
            con = reader.cursor()
            assert con.execute("SELECT count(*), count(DISTINCT event_id) FROM events").fetchall() == [(8, 8)]
            assert reader.offsets(TOPIC) == {0: 6, 1: len(kept)}
            assert reader.counts().dead_letters == {"not_json": 1}
            claims = con.execute("SELECT approval_id, claimant, subject FROM approval_claims ORDER BY 1").fetchall()
            assert claims == [(claimed, "gate-1", "svc-shop"), (other, "gate-1", "svc-shop")]
        assert "approval_claims: 2 rows copied" in done.stdout


@pytest.fixture
def s3_endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An S3-compatible server on a loopback port (moto's server mode) with the bucket `audit`, and the
    environment a lake reads its credentials and endpoint from."""
    import boto3

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [str(Path(sys.executable).with_name("moto_server")), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{url}/moto-api/", timeout=2).close()  # noqa: S310 (our loopback URL)
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    pytest.fail(f"moto_server did not answer on {url}")
                time.sleep(0.05)  # sleep-ok: a poll interval inside the deadline loop (another process)
        for name, value in {
            "AWS_ACCESS_KEY_ID": "callgate",
            "AWS_SECRET_ACCESS_KEY": "callgate-secret",
            "AWS_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": url,
        }.items():
            monkeypatch.setenv(name, value)
        boto3.client("s3").create_bucket(Bucket="audit")
        yield url
    finally:
        server.terminate()
        server.wait(timeout=10)


class TestS3DataPath:
    def test_events_are_parquet_objects_in_the_bucket_and_read_back(self, s3_endpoint: str, tmp_path: Path) -> None:
        """A lake whose data path is s3://audit/lake/ on the loopback endpoint: a batch becomes Parquet
        objects under that prefix, and a reader opened apart sees every event."""
        import boto3

        lake = lake_from_options(f"sqlite:{tmp_path / 'catalog.sqlite'}", "s3://audit/lake/")
        events = gate_events(30)
        with AuditStore(lake) as store:
            assert store.ingest(records(events), {(TOPIC, 0): len(events)}).stored == len(events)
        keys = [o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket="audit").get("Contents", [])]
        assert any(key.startswith("lake/") and key.endswith(".parquet") for key in keys), keys
        with AuditStore(lake, read_only=True) as reader:
            assert reader.counts().total_events == len(events)


class TestMaterializersOnALake:
    async def test_two_materializers_of_one_group_store_every_event_once(
        self, new_lake: NewLake, kafka_broker: EmbeddedBroker, topic: str, tmp_path: Path
    ) -> None:
        """Two `callgate materialize --assignment group --lake` processes share a topic of three partitions
        and three producers: the lake ends with every event once, each producer's chain unbroken and the
        partitions' offsets at their ends."""
        from aiokafka import AIOKafkaProducer

        from events.kafka import ensure_topic

        from .test_materializer import sealed_events

        lake = new_lake()
        AuditStore(lake).close()  # the schema, before either starts
        await ensure_topic(kafka_broker.bootstrap, topic, 3)
        group = f"g-{uuid.uuid4().hex[:8]}"
        command = [sys.executable, "-c", "from callgate.cli import main; main()", "materialize"]
        command += ["--bootstrap", kafka_broker.bootstrap, "--topic", topic, "--group", group]
        command += ["--assignment", "group", "--lake", lake.catalog, "--data", lake.data]
        logs = [(tmp_path / f"m{n}.log").open("w") for n in range(2)]
        members = [subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT) for log in logs]
        events = [e for _ in range(3) for e in sealed_events(40)]
        try:
            producer = AIOKafkaProducer(bootstrap_servers=kafka_broker.bootstrap, acks="all", enable_idempotence=False)
            await producer.start()
            try:
                for event in events:
                    await producer.send_and_wait(topic, value=encode_event(event), key=event.producer_id.encode())
            finally:
                await producer.stop()
            with AuditStore(lake, read_only=True) as reader:
                deadline = time.monotonic() + 120
                while reader.counts().total_events < len(events):
                    assert time.monotonic() < deadline, "the lake did not get every event within 120 s"
                    assert all(m.poll() is None for m in members), "a materializer died"
                    await asyncio.sleep(0.2)  # sleep-ok: a poll interval inside the deadline loop (another process)
                con = reader.cursor()
                assert con.execute("SELECT count(*), count(DISTINCT event_id) FROM events").fetchall() == [
                    (len(events), len(events))
                ]
                assert breaks(reader) == []
                assert sum(reader.offsets(topic).values()) == len(events)
        finally:
            for member in members:
                member.send_signal(signal.SIGTERM)
            codes = [member.wait(timeout=60) for member in members]
            for log in logs:
                log.close()
        assert codes == [0, 0], [(tmp_path / f"m{n}.log").read_text()[-2000:] for n in range(2)]


class TestTimeTravel:
    def test_a_lake_as_of_a_time_holds_what_was_committed_then(self, new_lake: NewLake) -> None:
        """A store opened on the lake as of a time between two batches sees the first alone; such a
        store is read-only, and a writable open of it is refused."""
        lake = new_lake()
        batch = records(gate_events(6))
        with AuditStore(lake) as store:
            store.ingest(batch[:3], {(TOPIC, 0): 3})
            ((between,),) = store.cursor().execute("SELECT now()").fetchall()
            store.ingest(batch[3:], {(TOPIC, 0): len(batch)})
            past = lake_from_options(lake.catalog, lake.data, as_of=between)
            with AuditStore(past, read_only=True) as then:
                assert then.counts().total_events == 3
                assert then.offsets(TOPIC) == {0: 3}
            assert store.counts().total_events == len(batch)
            with pytest.raises(StoreError, match="read-only"):
                AuditStore(past)

    def test_coverage_as_of_needs_a_lake_and_a_zone(self, tmp_path: Path) -> None:
        """`callgate coverage --as-of` without a lake, or with a time that has no zone, and `callgate
        replay --as-of` a time after now, exit 2 in one line."""
        base = [sys.executable, "-m", "callgate.cli", "coverage"]
        alone = subprocess.run([*base, "--db", str(tmp_path / "a.duckdb"), "--as-of", "2026-12-01T00:00:00Z"],
                               capture_output=True, text=True, timeout=60)  # fmt: skip
        assert (alone.returncode, alone.stderr.strip()) == (
            2,
            "error: --as-of reads a lake's past snapshot: give --lake and --data (a DuckDB file keeps no snapshots)",
        )
        lake = ["--lake", f"sqlite:{tmp_path / 'c.sqlite'}", "--data", str(tmp_path / "d")]
        naive = subprocess.run(
            [*base, *lake, "--as-of", "2026-12-01T00:00:00"], capture_output=True, text=True, timeout=60
        )
        assert naive.returncode == 2
        assert "has no time zone" in naive.stderr
        replay = [sys.executable, "-m", "callgate.cli", "replay", "--policy", str(tmp_path / "p.yaml")]
        future = subprocess.run(
            [*replay, *lake, "--as-of", "2999-01-01T00:00:00Z"], capture_output=True, text=True, timeout=60
        )
        assert (future.returncode, future.stderr.count("\n")) == (2, 1)
        assert "is in the future" in future.stderr


@contextlib.contextmanager
def _api_process(lake: Any, log_path: Path) -> Iterator[str]:
    """`callgate api --lake --data` as a process of its own on a free loopback port, once its /healthz
    answered 200: its URL. Stopped with SIGTERM afterwards, which it must survive with exit 0."""
    import httpx

    from callgate.broker import free_port

    port = free_port("127.0.0.1")
    command = [sys.executable, "-m", "callgate.cli", "api", "--lake", lake.catalog, "--data", lake.data]
    with log_path.open("w") as log:
        server = subprocess.Popen([*command, "--api", f"127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert server.poll() is None, log_path.read_text()
                assert time.monotonic() < deadline, "callgate api did not answer within 60 s"
                time.sleep(0.1)  # sleep-ok: a poll interval inside the deadline loop (another process)
            yield url
        finally:
            server.send_signal(signal.SIGTERM)
            code = server.wait(timeout=60)
    assert code == 0, log_path.read_text()


class TestReadApiReplica:
    def test_callgate_api_serves_the_lake_and_refuses_unlogged_reads(self, new_lake: NewLake, tmp_path: Path) -> None:
        """`callgate api --lake --data` answers the named queries from the lake a writer holds open and sees
        the writer's next batch at once. When its access log cannot take a record (the writer's process
        renamed the table away), the read is refused with 500 and no rows and /healthz turns 503 naming
        the access log; once a record is written again, the read and /healthz are 200. (One process for
        both: each start of `callgate api` costs about 8 s on a loaded machine.)"""
        import httpx

        lake = new_lake()
        batch = records(gate_events(6))
        with AuditStore(lake) as writer:
            writer.ingest(batch[:4], {(TOPIC, 0): 4})
            with _api_process(lake, tmp_path / "api.log") as url:
                first = httpx.get(f"{url}/v1/queries/event_counts", timeout=30)
                writer.ingest(batch[4:], {(TOPIC, 0): len(batch)})
                second = httpx.get(f"{url}/v1/queries/event_counts", timeout=30)
                assert first.status_code == second.status_code == 200, first.text
                assert first.json() != second.json()

                writer.cursor().execute("ALTER TABLE access_log RENAME TO access_log_away")
                refused = httpx.get(f"{url}/v1/queries/event_counts", timeout=30)
                assert refused.status_code == 500, refused.text
                assert "access log" in refused.json()["error"]
                assert "rows" not in refused.json()
                health = httpx.get(f"{url}/healthz", timeout=30)
                assert health.status_code == 503, health.text
                assert "access log cannot be written" in health.json()["detail"]
                writer.cursor().execute("ALTER TABLE access_log_away RENAME TO access_log")
                assert httpx.get(f"{url}/v1/queries/event_counts", timeout=30).status_code == 200
                assert httpx.get(f"{url}/healthz", timeout=30).status_code == 200
