"""`callgate verify`: inclusion proofs of stored events built from a real store, checked offline by the
real CLI and by docs/verify_proof.mjs in Node.js."""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from consumers import AuditStore, RawRecord
from consumers.api import ApiServer, HealthStatus, build_app
from consumers.metrics import MaterializerMetrics
from consumers.runner import StoreQueryRunner
from events import CheckpointEvent, MemorySink, encode_event
from events.chain import SUFFIX_BYTES
from events.signing import SigningKey
from interceptor_core import Gate, RunContext, tool

ROOT = Path(__file__).resolve().parents[2]
NODE_VERIFIER = ROOT / "docs" / "verify_proof.mjs"
CALLGATE = [sys.executable, "-c", "from callgate.cli import app; app()"]
NODE = shutil.which("node")
needs_node = pytest.mark.skipif(NODE is None, reason="Node.js is not installed")


@tool
async def ping(n: int) -> int:
    return n


@dataclass
class Store:
    path: Path
    key_file: Path
    other_key_file: Path
    events: list[Any]
    build_s: float

    def covered(self) -> Any:
        """An event in the middle of the chain, covered by a checkpoint."""
        return next(e for e in self.events if e.seq == 7)


async def _run_gate(key: SigningKey) -> MemorySink:
    sink = MemorySink()
    gate = Gate("shop", signing_key=key, sinks=[sink], checkpoint_events=5, checkpoint_s=60, heartbeat_s=60)
    desk = gate.agent("desk", tools=[ping])
    for n in range(12):
        await desk.call("ping", {"n": n}, run=RunContext(tenant="acme"))
    await gate.close()
    return sink


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    base = tmp_path_factory.mktemp("verify")
    key, other = SigningKey.generate("shop"), SigningKey.generate("shop")
    _, key_file = key.write(base / "keys")
    _, other_key_file = other.write(base / "other")
    sink = asyncio.run(_run_gate(key))
    records = [
        RawRecord("callgate.audit", 0, i, s.producer_id.encode(), encode_event(s), 1_700_000_000_000)
        for i, s in enumerate(sink.sealed)
    ]
    path = base / "audit.duckdb"
    started = time.perf_counter()
    with AuditStore(path) as audit:
        audit.ingest(records, {("callgate.audit", 0): len(records)})
    events = sink.events
    assert isinstance(events[-1], CheckpointEvent)
    assert events[-1].closing
    return Store(path, key_file, other_key_file, events, time.perf_counter() - started)


def cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CALLGATE, "verify", *map(str, args)], capture_output=True, text=True, timeout=120, check=False
    )


def node(proof: Path, key: Path) -> subprocess.CompletedProcess[str]:
    assert NODE is not None
    return subprocess.run(
        [NODE, str(NODE_VERIFIER), str(proof), str(key)], capture_output=True, text=True, timeout=60, check=False
    )


@pytest.fixture(scope="module")
def proof_file(store: Store, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("proof") / "proof.json"
    result = cli("--db", store.path, "--event", store.covered().event_id, "--out", out)
    assert result.returncode == 0, result.stderr
    return out


def tampered(proof_file: Path, tmp_path: Path, change: Any) -> Path:
    doc = json.loads(proof_file.read_text())
    change(doc)
    path = tmp_path / "tampered.json"
    path.write_text(json.dumps(doc))
    return path


def _flip_hex(text: str) -> str:
    return ("0" if text[0] != "0" else "1") + text[1:]


def _change_event(doc: dict[str, Any]) -> None:
    doc["event"] = doc["event"].replace('"seq":', '"seq": ', 1)


def _change_path(doc: dict[str, Any]) -> None:
    doc["audit_path"][0] = _flip_hex(doc["audit_path"][0])


def _change_root(doc: dict[str, Any]) -> None:
    doc["root"] = _flip_hex(doc["root"])


def _forge_signature(doc: dict[str, Any]) -> None:
    # A forger who rewrites the checkpoint event too (and its hash): only the signature stops it.
    encoded = doc["note"].rstrip("\n").rsplit(" ", 1)[1]
    forged = encoded[:20] + ("A" if encoded[20] != "A" else "B") + encoded[21:]
    doc["note"] = doc["note"].replace(encoded, forged)
    body = doc["checkpoint"][:-SUFFIX_BYTES].replace(encoded, forged) + "}"
    doc["checkpoint"] = body[:-1] + f',"hash":"{hashlib.sha256(body.encode()).hexdigest()}"}}'


TAMPERINGS = [
    pytest.param(_change_event, "event_hash", id="event-byte"),
    pytest.param(_change_path, "inclusion", id="audit-path"),
    pytest.param(_change_root, "inclusion", id="root"),
    pytest.param(_forge_signature, "signature", id="signature"),
]


class TestBuild:
    def test_builds_a_proof_that_verifies(self, store: Store, tmp_path: Path) -> None:
        """--db --event prints the proof document, the event's stored bytes exactly, and exits 0."""
        event = store.covered()
        started = time.perf_counter()
        result = cli("--db", store.path, "--event", event.event_id)
        elapsed = time.perf_counter() - started
        assert result.returncode == 0, result.stderr
        doc = json.loads(result.stdout)
        assert doc["event"].encode() == encode_event(event)
        assert (doc["version"], doc["seq"], doc["leaf_index"], doc["event_hash"]) == (1, 7, 6, event.hash)
        assert doc["tree_size"] >= 7
        assert doc["audit_path"]
        assert "verifies" in result.stderr
        print(f"proof over {len(store.events)} events: {elapsed * 1000:.0f} ms with the CLI's start")

    def test_the_closing_checkpoint_is_not_covered(self, store: Store) -> None:
        """The closing checkpoint itself is covered by no checkpoint: exit 1 saying so."""
        result = cli("--db", store.path, "--event", store.events[-1].event_id)
        assert result.returncode == 1
        assert "not covered by any stored checkpoint" in result.stderr

    def test_unknown_event_and_missing_store(self, store: Store, tmp_path: Path) -> None:
        """An unknown id exits 1 naming it; a store that does not exist exits 2."""
        result = cli("--db", store.path, "--event", "no-such-event")
        assert result.returncode == 1
        assert "no-such-event" in result.stderr
        result = cli("--db", tmp_path / "missing.duckdb", "--event", "x")
        assert result.returncode == 2
        assert "does not exist" in result.stderr

    def test_a_gap_in_the_stored_seqs_is_named(self, store: Store, tmp_path: Path) -> None:
        """A store missing one covered event cannot prove anything: exit 1 naming the seq."""
        records = [
            RawRecord("t", 0, i, e.producer_id.encode(), encode_event(e), 1_700_000_000_000)
            for i, e in enumerate(store.events)
            if e.seq != 3
        ]
        path = tmp_path / "gap.duckdb"
        with AuditStore(path) as audit:
            audit.ingest(records, {("t", 0): len(records)})
        result = cli("--db", path, "--event", store.covered().event_id)
        assert result.returncode == 1
        assert "seq 3" in result.stderr

    def test_through_the_read_api(self, store: Store, tmp_path: Path) -> None:
        """--api on a served store (held for writing) builds the same proof as --db on the file."""
        via_file = cli("--db", store.path, "--event", store.covered().event_id)
        copy = tmp_path / "served.duckdb"
        shutil.copy(store.path, copy)
        audit = AuditStore(copy)
        runner = StoreQueryRunner(audit)
        server = ApiServer(build_app(runner, MaterializerMetrics(), lambda: HealthStatus(True)), port=0)
        try:
            with server:
                via_api = cli("--api", server.url, "--event", store.covered().event_id)
        finally:
            audit.close()
        assert via_api.returncode == 0, via_api.stderr
        assert json.loads(via_api.stdout) == json.loads(via_file.stdout)

    def test_unreachable_api(self) -> None:
        """A read API that does not answer exits 2."""
        result = cli("--api", "http://127.0.0.1:9", "--event", "x")
        assert result.returncode == 2
        assert "cannot reach" in result.stderr


class TestCheckPython:
    def test_accepts_the_proof(self, store: Store, proof_file: Path) -> None:
        """--proof --key with the gate's key exits 0."""
        result = cli("--proof", proof_file, "--key", store.key_file)
        assert result.returncode == 0, result.stderr
        assert "valid" in result.stdout

    @pytest.mark.parametrize(("change", "step"), TAMPERINGS)
    def test_rejects_a_tampered_proof(
        self, store: Store, proof_file: Path, tmp_path: Path, change: Any, step: str
    ) -> None:
        """A changed byte of the event, audit path or root exits 1 naming the failed step."""
        result = cli("--proof", tampered(proof_file, tmp_path, change), "--key", store.key_file)
        assert result.returncode == 1
        assert f"INVALID at {step}" in result.stderr

    def test_rejects_another_key(self, store: Store, proof_file: Path) -> None:
        """Another key of the same name exits 1 at the key step."""
        result = cli("--proof", proof_file, "--key", store.other_key_file)
        assert result.returncode == 1
        assert "INVALID at key" in result.stderr

    def test_unreadable_proof_or_key(self, store: Store, proof_file: Path, tmp_path: Path) -> None:
        """A proof that is not JSON, or a missing key file, exits 2 in one line."""
        bad = tmp_path / "bad.json"
        bad.write_text("{not json")
        result = cli("--proof", bad, "--key", store.key_file)
        assert result.returncode == 2
        assert len(result.stderr.strip().splitlines()) == 1
        result = cli("--proof", proof_file, "--key", tmp_path / "none.pub")
        assert result.returncode == 2


@needs_node
class TestCheckNode:
    def test_accepts_the_proof(self, store: Store, proof_file: Path) -> None:
        """docs/verify_proof.mjs accepts the proof the CLI built: exit 0."""
        result = node(proof_file, store.key_file)
        assert result.returncode == 0, result.stderr

    @pytest.mark.parametrize(("change", "step"), TAMPERINGS)
    def test_rejects_a_tampered_proof(
        self, store: Store, proof_file: Path, tmp_path: Path, change: Any, step: str
    ) -> None:
        """The same tamperings exit 1 in Node, naming the same step."""
        result = node(tampered(proof_file, tmp_path, change), store.key_file)
        assert result.returncode == 1
        assert f"INVALID at {step}" in result.stderr

    def test_rejects_another_key(self, store: Store, proof_file: Path) -> None:
        """Another key exits 1 at the key step."""
        result = node(proof_file, store.other_key_file)
        assert result.returncode == 1
        assert "INVALID at key" in result.stderr

    def test_unreadable_proof(self, store: Store, tmp_path: Path) -> None:
        """A proof that is not JSON exits 2."""
        bad = tmp_path / "bad.json"
        bad.write_text("{not json")
        assert node(bad, store.key_file).returncode == 2
