"""The store's Merkle tree index and the inclusion proofs it answers.

Per producer with at least one `Checkpoint`, the store folds its stored chain, in seq order and
as far as it is contiguous, into the RFC 6962 tree over its event hashes (`fold`, inside every
ingest's transaction). `checkpoint_state` keeps the fold's frontier (`leaves`, `frontier`) and
`merkle_nodes` every complete, aligned subtree root of `INDEX_LEVEL` and above: the subtree of
level L and index j holds leaves j * 2**L .. (j + 1) * 2**L - 1. That is about one row per 128
events.

Every element of an audit path is a leaf range (`events.merkle.audit_ranges`) made of complete,
aligned subtrees (`aligned_chunks`): those of `INDEX_LEVEL` and above are read from `merkle_nodes`,
the smaller ones are hashed from at most two blocks of 2**INDEX_LEVEL stored hashes (the event's
own block and the tree's last, partial one). So a proof reads O(log n) nodes and at most 512
hashes whatever the size: milliseconds over a million events (bench/proofs.py). The named query
`inclusion_material` gives exactly those rows; `build_proof` makes the proof document
(`events.proofs`) from them, through `--db`, the read API and the dashboard alike.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import duckdb

from events.merkle import EMPTY_ROOT, aligned_chunks, audit_ranges, leaf_hash, node_hash
from events.proofs import PROOF_VERSION, Verdict, fail

__all__ = ["INDEX_LEVEL", "MATERIAL_QUERY", "build_proof", "fold", "fold_all", "root_at"]

INDEX_LEVEL: Final = 8
"""The smallest subtrees `merkle_nodes` keeps: 2**8 = 256 leaves."""

MATERIAL_QUERY: Final = "inclusion_material"
"""The named query whose rows `build_proof` reads."""

_BLOCK: Final = 1 << INDEX_LEVEL

_STATE = "SELECT leaves, frontier FROM checkpoint_state WHERE producer_id = $producer_id"

# An update, then an insert for a producer without a row: SQL both homes of the store run (a lake
# has no keys for ON CONFLICT).
_SAVE_STATE = (
    """
    UPDATE checkpoint_state SET leaves = $leaves, frontier = CAST($frontier AS VARCHAR[]), updated_at = now()
    WHERE producer_id = $producer_id
    """,
    """
    INSERT INTO checkpoint_state (producer_id, leaves, frontier, updated_at)
    SELECT $producer_id, $leaves, CAST($frontier AS VARCHAR[]), now()
    WHERE NOT EXISTS (SELECT 1 FROM checkpoint_state WHERE producer_id = $producer_id)
    """,
)

_NEW_HASHES = """
SELECT seq, hash FROM events WHERE producer_id = $producer_id AND seq > $leaves ORDER BY seq
"""

# Blocks of 2**INDEX_LEVEL leaves past the fold, every seq of them stored, not indexed yet.
_COMPLETE_BLOCKS = f"""
SELECT (seq - 1) >> {INDEX_LEVEL} AS block FROM events
WHERE producer_id = $producer_id AND seq > $leaves
GROUP BY block HAVING count(DISTINCT seq) = {1 << INDEX_LEVEL}
EXCEPT
SELECT idx FROM merkle_nodes WHERE producer_id = $producer_id AND level = {INDEX_LEVEL}
ORDER BY block
"""  # noqa: S608 (module constants only; values are bound parameters)

_NODE = "SELECT hash FROM merkle_nodes WHERE producer_id = $producer_id AND level = $level AND idx = $idx"

_SAVE_NODES = """
INSERT INTO merkle_nodes
SELECT * FROM (
    SELECT $producer_id AS producer_id, unnest($levels) AS level, unnest($idxs) AS idx, unnest($hashes) AS hash
) n
WHERE NOT EXISTS (
    SELECT 1 FROM merkle_nodes m WHERE m.producer_id = n.producer_id AND m.level = n.level AND m.idx = n.idx
)
"""

# Producers to index after a migration that added the index: every one with a checkpoint.
_SIGNED_PRODUCERS = """
SELECT producer_id FROM checkpoint_state
UNION
SELECT DISTINCT producer_id FROM events WHERE type = 'Checkpoint'
ORDER BY 1
"""

_NODES = """
SELECT level, idx, hash FROM merkle_nodes
WHERE producer_id = $producer_id AND list_contains($keys, level * 4294967296 + idx)
"""

_RANGE_HASHES = """
SELECT seq, hash FROM events WHERE producer_id = $producer_id AND seq > $lo AND seq <= $hi ORDER BY seq
"""


@dataclass(slots=True)
class _Fold:
    leaves: int
    frontier: list[bytes]


def fold(con: duckdb.DuckDBPyConnection, producer_ids: Iterable[str]) -> None:
    """Extend each producer's tree with its stored events after `leaves`, up to the first missing
    seq, recording the new `merkle_nodes`; then, when events lie past a hole, index their stored
    blocks (`_fold_blocks`).
    Runs inside the caller's transaction; about two SHA-256 per new event."""
    for producer_id in producer_ids:
        if _fold_one(con, producer_id):
            _fold_blocks(con, producer_id)


def _save_state(con: duckdb.DuckDBPyConnection, params: dict[str, object]) -> None:
    for statement in _SAVE_STATE:
        con.execute(statement, params)


def _fold_one(con: duckdb.DuckDBPyConnection, producer_id: str) -> bool:
    """Extend the producer's fold; whether stored events lie past a hole after it."""
    row = con.execute(_STATE, {"producer_id": producer_id}).fetchone()
    state = _Fold(0, []) if row is None else _Fold(int(row[0]), [bytes.fromhex(h) for h in row[1]])
    result = con.execute(_NEW_HASHES, {"producer_id": producer_id, "leaves": state.leaves})
    first = result.fetchone()
    if first is None or first[0] != state.leaves + 1:
        # A hole right after the fold (a shard holding a later segment of the chain has one at seq 1):
        # nothing to extend, and no reason to read what lies past it into Python.
        if row is None:
            _save_state(con, {"producer_id": producer_id, "leaves": 0, "frontier": []})
        return first is not None
    rows = [first, *result.fetchall()]
    levels: list[int] = []
    idxs: list[int] = []
    hashes: list[str] = []
    frontier, size = state.frontier, state.leaves
    past = False
    for seq, text in rows:
        if seq != size + 1:
            past = True  # a hole: the fold waits for it
            break
        node, n, level = leaf_hash(bytes.fromhex(text)), size, 0
        while n & 1:
            node = node_hash(frontier.pop(), node)
            n >>= 1
            level += 1
            if level >= INDEX_LEVEL:
                levels.append(level)
                idxs.append(size >> level)
                hashes.append(node.hex())
        frontier.append(node)
        size += 1
    if size == state.leaves and row is not None:
        return past
    if levels:
        con.execute(_SAVE_NODES, {"producer_id": producer_id, "levels": levels, "idxs": idxs, "hashes": hashes})
    _save_state(con, {"producer_id": producer_id, "leaves": size, "frontier": [h.hex() for h in frontier]})
    return past


def _fold_blocks(con: duckdb.DuckDBPyConnection, producer_id: str) -> None:
    """Index every complete aligned subtree of `INDEX_LEVEL` and above whose leaves are all stored,
    past the fold too, so a store that holds only a later part of a producer's chain still indexes
    what it has. Each new block's root, then its parents while their other half is indexed. The fold
    records the same nodes when it reaches them."""
    row = con.execute(_STATE, {"producer_id": producer_id}).fetchone()
    leaves = 0 if row is None else int(row[0])
    blocks = [
        int(b) for (b,) in con.execute(_COMPLETE_BLOCKS, {"producer_id": producer_id, "leaves": leaves}).fetchall()
    ]
    if not blocks:
        return
    made: dict[tuple[int, int], bytes] = {}

    def node(level: int, idx: int) -> bytes | None:
        if (level, idx) in made:
            return made[(level, idx)]
        found = con.execute(_NODE, {"producer_id": producer_id, "level": level, "idx": idx}).fetchone()
        return None if found is None else bytes.fromhex(str(found[0]))

    for block in blocks:
        lo, hi = block * _BLOCK, (block + 1) * _BLOCK
        rows = con.execute(_RANGE_HASHES, {"producer_id": producer_id, "lo": lo, "hi": hi}).fetchall()
        hashes = [leaf_hash(bytes.fromhex(text)) for _, text in rows]
        if len(hashes) != _BLOCK:  # a seq stored twice cannot be (the store keeps one event per slot)
            continue
        while len(hashes) > 1:
            hashes = [node_hash(hashes[j], hashes[j + 1]) for j in range(0, len(hashes), 2)]
        level, idx, root = INDEX_LEVEL, block, hashes[0]
        made[(level, idx)] = root
        while (sibling := node(level, idx ^ 1)) is not None:
            root = node_hash(sibling, root) if idx & 1 else node_hash(root, sibling)
            level, idx = level + 1, idx >> 1
            made[(level, idx)] = root
    keys = sorted(made)
    con.execute(
        _SAVE_NODES,
        {
            "producer_id": producer_id,
            "levels": [level for level, _ in keys],
            "idxs": [idx for _, idx in keys],
            "hashes": [made[k].hex() for k in keys],
        },
    )


def fold_all(con: duckdb.DuckDBPyConnection) -> None:
    """`fold` every producer with a checkpoint (after the migration that added the index)."""
    fold(con, [str(p) for (p,) in con.execute(_SIGNED_PRODUCERS).fetchall()])


def _key(level: int, idx: int) -> int:
    return level * 4294967296 + idx


def _needs(ranges: Sequence[tuple[int, int]]) -> tuple[set[tuple[int, int]], set[int]]:
    """The stored nodes (level, index) and the 0-based leaf blocks the ranges are made of."""
    nodes: set[tuple[int, int]] = set()
    blocks: set[int] = set()
    for start, end in ranges:
        for level, idx in aligned_chunks(start, end):
            if level >= INDEX_LEVEL:
                nodes.add((level, idx))
            else:
                blocks.add((idx << level) >> INDEX_LEVEL)
    return nodes, blocks


class _Material:
    """Stored nodes and leaf hashes (by 0-based leaf index) to hash ranges from."""

    def __init__(self, nodes: Mapping[tuple[int, int], bytes], leaves: Mapping[int, bytes]) -> None:
        self.nodes = nodes
        self.leaves = leaves

    def chunk(self, level: int, idx: int) -> bytes | str:
        """The root of one aligned subtree, or what is missing."""
        if level >= INDEX_LEVEL:
            node = self.nodes.get((level, idx))
            return node if node is not None else f"the tree index has no node at level {level}, index {idx}"
        start = idx << level
        hashes = []
        for i in range(start, start + (1 << level)):
            leaf = self.leaves.get(i)
            if leaf is None:
                return f"no stored event at seq {i + 1}"
            hashes.append(leaf)
        while len(hashes) > 1:
            hashes = [node_hash(hashes[j], hashes[j + 1]) for j in range(0, len(hashes), 2)]
        return hashes[0]

    def range_root(self, start: int, end: int) -> bytes | str:
        """MTH of leaves start..end-1 (a range RFC 9162's recursion visits), or what is missing."""
        roots = []
        for level, idx in aligned_chunks(start, end):
            root = self.chunk(level, idx)
            if isinstance(root, str):
                return root
            roots.append(root)
        acc = roots[-1]
        for left in reversed(roots[:-1]):
            acc = node_hash(left, acc)
        return acc


def root_at(con: duckdb.DuckDBPyConnection, producer_id: str, size: int) -> bytes | None:
    """The root of the producer's stored events 1..size from the index, or None when the fold has
    not reached `size` (events still missing). O(log n) nodes and at most 2**INDEX_LEVEL hashes."""
    if size == 0:
        return EMPTY_ROOT
    row = con.execute(_STATE, {"producer_id": producer_id}).fetchone()
    if row is None or int(row[0]) < size:
        return None
    leaves, frontier = int(row[0]), [bytes.fromhex(h) for h in row[1]]
    if leaves == size:
        acc = frontier[-1]
        for left in reversed(frontier[:-1]):
            acc = node_hash(left, acc)
        return acc
    nodes, blocks = _needs([(0, size)])
    material = _read_material(con, producer_id, nodes, blocks, size)
    root = material.range_root(0, size)
    if isinstance(root, str):
        raise RuntimeError(f"producer {producer_id}: {root} below the folded size {leaves}")
    return root


def _read_material(
    con: duckdb.DuckDBPyConnection, producer_id: str, nodes: set[tuple[int, int]], blocks: set[int], size: int
) -> _Material:
    found: dict[tuple[int, int], bytes] = {}
    if nodes:
        keys = [_key(level, idx) for level, idx in nodes]
        for level, idx, text in con.execute(_NODES, {"producer_id": producer_id, "keys": keys}).fetchall():
            found[(int(level), int(idx))] = bytes.fromhex(text)
    leaves: dict[int, bytes] = {}
    for block in blocks:
        lo, hi = block * _BLOCK, min((block + 1) * _BLOCK, size)
        for seq, text in con.execute(_RANGE_HASHES, {"producer_id": producer_id, "lo": lo, "hi": hi}).fetchall():
            leaves[int(seq) - 1] = leaf_hash(bytes.fromhex(text))
    return _Material(found, leaves)


def build_proof(rows: Sequence[Mapping[str, Any]], event_id: str) -> dict[str, Any] | Verdict:
    """The proof document of `event_id` (`events.proofs`) from the rows of `inclusion_material`, or
    the failed `Verdict` (not found, not covered, a stored event or index node missing). Pure: no
    I/O; O(log n) hashing plus at most two blocks of 2**INDEX_LEVEL leaves."""
    event = next((r for r in rows if r["part"] == "event"), None)
    if event is None:
        return fail("event", f"no event {event_id!r} in the store")
    checkpoint = next((r for r in rows if r["part"] == "checkpoint"), None)
    producer_id, seq = str(event["producer_id"]), int(event["seq"])
    if checkpoint is None:
        return fail(
            "checkpoint",
            f"event {event_id} (seq {seq} of producer {producer_id}) is not covered by any stored checkpoint",
        )
    fields = json.loads(checkpoint["text"])
    tree_size = int(fields["tree_size"])
    nodes = {(int(r["level"]), int(r["idx"])): bytes.fromhex(str(r["hash"])) for r in rows if r["part"] == "node"}
    leaves = {int(r["seq"]) - 1: leaf_hash(bytes.fromhex(str(r["hash"]))) for r in rows if r["part"] == "leaf"}
    material = _Material(nodes, leaves)
    path: list[str] = []
    for start, end in audit_ranges(seq - 1, tree_size):
        root = material.range_root(start, end)
        if isinstance(root, str):
            return fail("hashes", f"producer {producer_id} under checkpoint tree_size {tree_size}: {root}")
        path.append(root.hex())
    return {
        "version": PROOF_VERSION,
        "event": event["text"],
        "event_hash": event["hash"],
        "producer_id": producer_id,
        "seq": seq,
        "leaf_index": seq - 1,
        "tree_size": tree_size,
        "leaf_hash": leaf_hash(bytes.fromhex(str(event["hash"]))).hex(),
        "audit_path": path,
        "checkpoint": checkpoint["text"],
        "root": fields["root"],
        "note": fields["note"],
        "key_id": fields["key_id"],
    }
