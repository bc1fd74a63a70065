"""The store's Merkle tree index: folded at ingest, proofs answered from it, kept across migrations."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import pytest

from consumers.proofs import INDEX_LEVEL, MATERIAL_QUERY, build_proof, root_at
from consumers.reader import open_reader
from consumers.store import MIGRATIONS, AuditStore, RawRecord
from events import EventBase, MemorySink, encode_event
from events.merkle import inclusion_proof, leaf_hash, root_from_leaf_hashes
from events.models import CheckpointEvent
from events.proofs import Verdict, check_proof
from events.signing import SigningKey
from interceptor_core import Gate, RunContext, tool

KEY = SigningKey.generate("gate-a")
RUN = RunContext(tenant="acme", principal="u-1")
SIZE = 1300  # five complete 256-leaf blocks and a partial one, nodes up to level 10


@tool(inline=True)
def ping(n: int) -> int:
    """Answers."""
    return n


def signed_events(calls: int, *, key: SigningKey | None = KEY, every: int = 500) -> list[EventBase]:
    sink = MemorySink()
    gate = Gate("shop", sinks=[sink], signing_key=key, checkpoint_events=every)
    desk = gate.agent("desk", tools=[ping])

    async def run() -> None:
        for n in range(calls):
            await desk.call("ping", {"n": n}, run=RUN)
        await gate.close()

    asyncio.run(run())
    return sorted(sink.events, key=lambda e: (e.producer_id, e.seq))


def ingest(store: AuditStore, events: list[EventBase], batch: int = 97) -> None:
    for lo in range(0, len(events), batch):
        part = events[lo : lo + batch]
        records = [
            RawRecord("t", 0, lo + i, e.producer_id.encode(), encode_event(e), 1_700_000_000_000)
            for i, e in enumerate(part)
        ]
        store.ingest(records, {("t", 0): lo + len(part)})


def table(store: AuditStore, sql: str) -> list[tuple[Any, ...]]:
    con = store.cursor()
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def proof_of(path: Path, event_id: str) -> dict[str, Any] | Verdict:
    reader = open_reader(api=None, db=path)
    try:
        rows = reader.query(MATERIAL_QUERY, {"event_id": event_id}).rows
    finally:
        reader.close()
    return build_proof(rows, event_id)


@pytest.fixture(scope="module")
def events() -> list[EventBase]:
    return signed_events(SIZE)


@pytest.fixture(scope="module")
def indexed(events: list[EventBase], tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("proofs") / "audit.duckdb"
    with AuditStore(path) as store:
        ingest(store, events)
    return path


def expected_nodes(n: int) -> int:
    return sum(n >> level for level in range(INDEX_LEVEL, n.bit_length()))


class TestIndex:
    def test_every_complete_subtree_of_256_and_up_is_stored(self, events: list[EventBase], indexed: Path) -> None:
        """Folded batch by batch, the index holds one node per complete aligned subtree of 256 leaves
        and up, each the root of its leaves, and the frontier of all stored events."""
        leaves = [leaf_hash(bytes.fromhex(e.hash)) for e in events]
        with AuditStore(indexed, read_only=True) as store:
            nodes = table(store, "select level, idx, hash from merkle_nodes")
            state = table(store, "select leaves from checkpoint_state")
        assert len(nodes) == expected_nodes(len(events))
        for level, idx, text in nodes:
            assert bytes.fromhex(text) == root_from_leaf_hashes(leaves[idx << level : (idx + 1) << level])
        assert state == [(len(events),)]

    def test_a_producer_without_checkpoints_costs_nothing(self, tmp_path: Path) -> None:
        """A gate without a key: no index rows at all."""
        with AuditStore(tmp_path / "a.duckdb") as store:
            ingest(store, signed_events(600, key=None))
            assert table(store, "select count(*) from merkle_nodes") == [(0,)]
            assert table(store, "select count(*) from checkpoint_state") == [(0,)]

    def test_the_fold_waits_at_a_hole_and_ends_the_same(self, events: list[EventBase], tmp_path: Path) -> None:
        """With seq 300 delivered last, the fold stops at 299 and, once it arrives, holds the same
        nodes as an in-order store. Meanwhile every subtree without seq 300 is indexed already, past
        the hole too (what a shard holding a later segment of the chain answers serve from)."""
        nodes = "select level, idx, hash from merkle_nodes order by level, idx"
        with AuditStore(tmp_path / "order.duckdb") as ordered:
            ingest(ordered, events)
            everything = table(ordered, nodes)
        hole = 299  # the leaf of seq 300
        without = [(level, idx, h) for level, idx, h in everything if not idx << level <= hole < (idx + 1) << level]
        late = [e for e in events if e.seq == 300]
        with AuditStore(tmp_path / "hole.duckdb") as store:
            ingest(store, [e for e in events if e.seq != 300])
            assert table(store, "select leaves from checkpoint_state") == [(299,)]
            assert table(store, nodes) == without
            assert any(idx << level > hole for level, idx, _ in without)  # past the hole
            ingest(store, late)
            assert table(store, nodes) == everything

    def test_a_later_segment_alone_indexes_its_subtrees(self, events: list[EventBase], tmp_path: Path) -> None:
        """A store holding seqs 600.. only (a shard after a handoff) never folds from seq 1, yet indexes
        every subtree of its segment as the store of the whole chain has it."""
        nodes = "select level, idx, hash from merkle_nodes order by level, idx"
        with AuditStore(tmp_path / "whole.duckdb") as whole:
            ingest(whole, events)
            everything = table(whole, nodes)
        first = 599  # the leaf of seq 600
        within = [(level, idx, h) for level, idx, h in everything if idx << level >= first]
        with AuditStore(tmp_path / "later.duckdb") as later:
            ingest(later, [e for e in events if e.seq >= 600])
            assert table(later, "select leaves from checkpoint_state") == [(0,)]
            assert within
            assert table(later, nodes) == within

    def test_roots_of_every_earlier_size(self, events: list[EventBase], indexed: Path) -> None:
        """root_at answers the root of any prefix from the index: the RFC root of those leaves."""
        leaves = [leaf_hash(bytes.fromhex(e.hash)) for e in events]
        con = duckdb.connect(str(indexed), read_only=True)
        try:
            for size in (0, 1, 255, 256, 257, 511, 512, 700, 1024, 1025, len(events)):
                assert root_at(con, events[0].producer_id, size) == root_from_leaf_hashes(leaves[:size])
            assert root_at(con, events[0].producer_id, len(events) + 1) is None
        finally:
            con.close()


class TestProofs:
    def test_every_shape_of_audit_path_matches_the_full_trees(self, events: list[EventBase], indexed: Path) -> None:
        """Proofs from the index are the RFC's proofs over all leaves, at block edges and anywhere,
        and verify with the gate's key."""
        leaves = [leaf_hash(bytes.fromhex(e.hash)) for e in events]
        checkpoints = [e for e in events if isinstance(e, CheckpointEvent)]
        last = max(c.tree_size for c in checkpoints)
        edges = {1, 2, 255, 256, 257, 512, 513, 1000, 1024, 1025, last}
        seqs = edges | set(random.Random(7).sample(range(1, last), 25))
        for seq in sorted(seqs):
            event = events[seq - 1]
            doc = proof_of(indexed, event.event_id)
            assert isinstance(doc, dict), doc
            covering = min(c.tree_size for c in checkpoints if c.tree_size >= seq)
            newest = max(c.tree_size for c in checkpoints if c.tree_size >= seq)
            assert doc["tree_size"] in (covering, newest)
            full = inclusion_proof(leaves, seq - 1, doc["tree_size"])
            assert doc["audit_path"] == [h.hex() for h in full], seq
            assert check_proof(doc, KEY.public()).ok, seq

    def test_the_material_is_logarithmic(self, events: list[EventBase], indexed: Path) -> None:
        """The named query reads at most two blocks of leaves and a few nodes, not the whole chain."""
        reader = open_reader(api=None, db=indexed)
        try:
            rows = reader.query(MATERIAL_QUERY, {"event_id": events[600].event_id}).rows
        finally:
            reader.close()
        parts = [r["part"] for r in rows]
        assert parts.count("leaf") <= 2 << INDEX_LEVEL
        assert 0 < parts.count("node") <= 2 * SIZE.bit_length()

    def test_a_tampered_node_gives_a_proof_that_fails(self, events: list[EventBase], tmp_path: Path) -> None:
        """A node edited in the index gives an audit path the offline check rejects at inclusion."""
        path = tmp_path / "edited.duckdb"
        with AuditStore(path) as store:
            ingest(store, events)
            con = store.cursor()
            con.execute("update merkle_nodes set hash = repeat('0', 64) where level = 9 and idx = 1")
            con.close()
        doc = proof_of(path, events[100].event_id)
        assert isinstance(doc, dict)
        verdict = check_proof(doc, KEY.public())
        assert not verdict.ok
        assert verdict.step == "inclusion"

    def test_a_missing_node_is_named(self, events: list[EventBase], tmp_path: Path) -> None:
        path = tmp_path / "missing.duckdb"
        with AuditStore(path) as store:
            ingest(store, events)
            con = store.cursor()
            con.execute("delete from merkle_nodes where level = 9 and idx = 1")
            con.close()
        verdict = proof_of(path, events[100].event_id)
        assert isinstance(verdict, Verdict)
        assert verdict.step == "hashes"
        assert "level 9, index 1" in verdict.detail


class TestMigration:
    def test_a_schema_5_store_gets_its_index(
        self, events: list[EventBase], tmp_path: Path, older_store: Callable[[Path, int], None]
    ) -> None:
        """A store written before the index (schema 5, checkpoints verified with the old frontier)
        is indexed when opened for writing, and proofs from it verify."""
        path = tmp_path / "old.duckdb"
        older_store(path, 5)
        # Rows as schema 5 stored them, written through today's store minus its index.
        with AuditStore(tmp_path / "new.duckdb") as fresh:
            ingest(fresh, events)
        src = duckdb.connect(str(path))
        try:
            src.execute(f"ATTACH '{tmp_path / 'new.duckdb'}' AS new (READ_ONLY)")
            src.execute("INSERT INTO events SELECT * EXCLUDE (event_uuid) FROM new.events")
            src.execute("INSERT INTO checkpoint_state SELECT * FROM new.checkpoint_state")
            src.execute("DETACH new")
        finally:
            src.close()
        with AuditStore(path) as store:
            assert table(store, "select max(version) from schema_migrations") == [(MIGRATIONS[-1].version,)]
            assert table(store, "select count(*) from merkle_nodes") == [(expected_nodes(len(events)),)]
        doc = proof_of(path, events[700].event_id)
        assert isinstance(doc, dict)
        assert check_proof(doc, KEY.public()).ok
