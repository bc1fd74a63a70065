"""Verifying producers' signed checkpoints against the chains the store holds.

`CheckpointVerifier` runs inside `AuditStore.ingest`'s transaction, after the batch's events are
stored, so its findings commit with them (docs/operating.md, *Signed checkpoints*). Every stored
`Checkpoint` event is queued in `checkpoint_pending` (with or without a verifier: a later run with
trusted keys verifies the backlog) and leaves the queue once judged:

- `bad_signature`: the note is malformed, its body disagrees with its own event (origin
  `callgate/<producer_id>`, size = `tree_size`, root = `root`, the event's `key_id` among the note's
  signers), or a trusted key's signature does not verify;
- `unknown_key`: no signature line is from a trusted key (name and key id);
- `root_mismatch`: the root differs from the RFC 6962 root of the stored hashes of seqs 1..tree_size;
- `inconsistent`: an RFC 9162 consistency proof, built from the stored hashes, between the
  producer's last valid checkpoint and this one does not verify: two signed statements that cannot
  both be true. It is only built when this checkpoint's root differs from the stored chain or its
  size is below the last valid one's; otherwise both roots are of prefixes of one stored chain and
  consistency holds by construction.

A checkpoint whose events 1..tree_size are not all stored yet stays queued and is checked again
after later batches; `close` records the ones still waiting as `truncated` (they stay queued: the
row is removed if the missing events arrive and the checkpoint is judged after all). With `require_signed`,
`close` also records `unsigned`, `uncovered` and `silent` (see `close`).

Cost: the store folds every signed producer's stored hashes into its tree index as they arrive
(`consumers.proofs`, about two SHA-256 per event), so a checkpoint costs the root at its size from
the index (O(log n) stored nodes and at most 256 hashes) plus one Ed25519 verification; the
consistency proof of a bad checkpoint reads the producer's whole chain (O(n)).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

import duckdb

from consumers.proofs import root_at
from events.checkpoints import ORIGIN_PREFIX
from events.merkle import consistency_proof, leaf_hash, verify_consistency
from events.signing import SigningError, VerifyingKey, open_signed_note, parse_checkpoint_body, parse_signed_note

__all__ = ["CHECKPOINT_BREAK_KINDS", "CheckpointVerifier"]

CHECKPOINT_BREAK_KINDS: Final = (
    "bad_signature",
    "unknown_key",
    "root_mismatch",
    "inconsistent",
    "unsigned",
    "uncovered",
    "silent",
    "truncated",
)
"""The `chain_breaks.kind`s this module records (see the module docstring)."""

SILENCE_FACTOR: Final = 3
"""A producer is late once `heartbeat_s` × this has passed without a checkpoint."""

_INSERT_BREAK = """
INSERT INTO chain_breaks (producer_id, seq, kind, detail, event_id, evidence, recorded_at)
SELECT $producer_id, $seq, $kind, $detail, $event_id, $evidence::JSON, now()
WHERE NOT EXISTS (SELECT 1 FROM chain_breaks WHERE producer_id = $producer_id AND seq = $seq AND kind = $kind)
"""

_PENDING = """
SELECT p.producer_id, p.seq, p.event_id, e.event
FROM checkpoint_pending p JOIN events e USING (event_id)
ORDER BY p.producer_id, p.seq
"""

_LAST_VALID = "SELECT tree_size, root FROM checkpoint_state WHERE producer_id = $producer_id"

_SAVE_VALID = """
UPDATE checkpoint_state SET tree_size = $tree_size, root = $root, checkpoint_seq = $seq, event_id = $event_id,
    closing = $closing, heartbeat_s = $heartbeat_s, checkpoint_time = CAST($time AS TIMESTAMPTZ), updated_at = now()
WHERE producer_id = $producer_id
"""

_HASHES = """
SELECT seq, hash FROM events WHERE producer_id = $producer_id AND seq > $lo AND seq <= $hi ORDER BY seq
"""

_FORGET_UNSIGNED = "DELETE FROM chain_breaks WHERE producer_id = $producer_id AND kind = 'unsigned'"

# A checkpoint judged at last (its missing events arrived) is no longer truncated.
_FORGET_TRUNCATED = "DELETE FROM chain_breaks WHERE producer_id = $producer_id AND seq = $seq AND kind = 'truncated'"

# Queued checkpoints still waiting for their events, stored before `older_than` (every one: None).
_WAITING = """
SELECT p.producer_id, p.seq, p.event_id, e.event
FROM checkpoint_pending p JOIN events e USING (event_id)
WHERE $older_than IS NULL OR e.ingested_at < $older_than
ORDER BY p.producer_id, p.seq
"""

_DONE = "DELETE FROM checkpoint_pending WHERE event_id = $event_id"


@dataclass(frozen=True, slots=True)
class _Checkpoint:
    """The fields of one stored checkpoint event that verification reads."""

    producer_id: str
    seq: int
    event_id: str
    tree_size: int
    root: str
    key_id: str
    note: str
    closing: bool
    heartbeat_s: float
    time: str

    @classmethod
    def from_row(cls, producer_id: str, seq: int, event_id: str, event: str) -> _Checkpoint:
        data = json.loads(event)
        return cls(
            producer_id,
            int(seq),
            event_id,
            int(data["tree_size"]),
            str(data["root"]),
            str(data["key_id"]),
            str(data["note"]),
            bool(data.get("closing", False)),
            float(data["heartbeat_s"]),
            str(data["time"]),
        )

    def names(self) -> str:
        return f"checkpoint {self.event_id} (seq {self.seq}, tree_size {self.tree_size})"


class CheckpointVerifier:
    """Verifies the queued checkpoints with `trusted_keys` (key id -> key, as
    `events.signing.load_trusted_keys` gives them); see the module docstring.

    Its methods take the store's write connection inside the store's transaction and lock; they do
    not commit. Not safe from several threads (the store serializes its writes)."""

    def __init__(self, trusted_keys: Mapping[str, VerifyingKey], *, require_signed: bool = False) -> None:
        if not trusted_keys:
            raise ValueError("trusted_keys is empty: a verifier that trusts no key rejects every checkpoint")
        self.trusted_keys = dict(trusted_keys)
        self.require_signed = require_signed

    # -- after each batch ------------------------------------------------------------------------

    def verify_pending(self, con: duckdb.DuckDBPyConnection) -> Counter[str]:
        """Judge every queued checkpoint whose events are all stored, in seq order per producer;
        the new chain breaks by kind."""
        found: Counter[str] = Counter()
        rows = con.execute(_PENDING).fetchall()
        waiting: set[str] = set()
        for producer_id, seq, event_id, event in rows:
            if producer_id in waiting:
                continue  # an earlier checkpoint of this producer waits for its events
            try:
                checkpoint = _Checkpoint.from_row(producer_id, seq, event_id, event)
            except (ValueError, KeyError, TypeError) as exc:
                # The store validated the event; only a hand-edited row gets here.
                self._record(con, found, producer_id, seq, "bad_signature", f"checkpoint {event_id}: {exc}", event_id)
                con.execute(_DONE, {"event_id": event_id})
                continue
            problem = self._note_problem(checkpoint)
            if problem is not None:
                kind, detail = problem
                self._record(
                    con,
                    found,
                    producer_id,
                    seq,
                    kind,
                    f"{checkpoint.names()}: {detail}",
                    event_id,
                    _evidence(checkpoint),
                )
                con.execute(_DONE, {"event_id": event_id})
                continue
            if not self._judge_root(con, found, checkpoint):
                waiting.add(producer_id)
                continue
            con.execute(_DONE, {"event_id": event_id})
            con.execute(_FORGET_TRUNCATED, {"producer_id": producer_id, "seq": seq})
        return found

    def _note_problem(self, checkpoint: _Checkpoint) -> tuple[str, str] | None:
        """(kind, detail) of what is wrong with the note itself, or None."""
        note = checkpoint.note.encode("utf-8")
        try:
            body, signatures = parse_signed_note(note)
            parsed = parse_checkpoint_body(body)
        except SigningError as exc:
            return "bad_signature", f"malformed note: {exc}"
        origin = ORIGIN_PREFIX + checkpoint.producer_id
        if parsed.origin != origin:
            return "bad_signature", f"the note's origin is {parsed.origin!r}, not {origin!r}"
        if parsed.size != checkpoint.tree_size:
            return "bad_signature", f"the note's size is {parsed.size}, the event's tree_size {checkpoint.tree_size}"
        if parsed.root.hex() != checkpoint.root:
            return "bad_signature", f"the note's root is {parsed.root.hex()}, the event's {checkpoint.root}"
        if checkpoint.key_id not in {s.key_id for s in signatures}:
            return "bad_signature", f"the event's key_id {checkpoint.key_id} did not sign the note"
        trusted = [s for s in signatures if (key := self.trusted_keys.get(s.key_id)) is not None and key.name == s.name]
        if not trusted:
            seen = ", ".join(f"{s.name}+{s.key_id}" for s in signatures)
            return "unknown_key", f"signed by {seen}, none of them a trusted key"
        _, verified = open_signed_note(note, self.trusted_keys)
        if not verified:
            seen = ", ".join(f"{s.name}+{s.key_id}" for s in trusted)
            return "bad_signature", f"the signature of trusted key {seen} does not verify"
        return None

    def _judge_root(self, con: duckdb.DuckDBPyConnection, found: Counter[str], checkpoint: _Checkpoint) -> bool:
        """Compare the checkpoint's root with the stored chain's and the last valid checkpoint; False
        when events it covers are not stored yet (it stays queued)."""
        size, claimed = checkpoint.tree_size, bytes.fromhex(checkpoint.root)
        actual = root_at(con, checkpoint.producer_id, size)
        if actual is None:
            return False
        good = actual == claimed
        if not good:
            self._record(
                con,
                found,
                checkpoint.producer_id,
                checkpoint.seq,
                "root_mismatch",
                f"{checkpoint.names()}: root {checkpoint.root} is not {actual.hex()}, the root of the stored "
                f"events 1..{size}",
                checkpoint.event_id,
                _evidence(checkpoint, recomputed_root=actual.hex()),
            )
        row = con.execute(_LAST_VALID, {"producer_id": checkpoint.producer_id}).fetchone()
        old_size = None if row is None or row[0] is None else int(row[0])
        if old_size is not None and (not good or size < old_size):
            old_root = bytes.fromhex(str(row[1]))  # type: ignore[index]
            ok = self._consistent(con, checkpoint.producer_id, old_size, old_root, size, claimed)
            if not ok:
                self._record(
                    con,
                    found,
                    checkpoint.producer_id,
                    checkpoint.seq,
                    "inconsistent",
                    f"{checkpoint.names()}: no RFC 9162 consistency proof joins it to the last valid checkpoint "
                    f"(tree_size {old_size}, root {old_root.hex()})",
                    checkpoint.event_id,
                    _evidence(checkpoint, previous_tree_size=old_size, previous_root=old_root.hex()),
                )
                good = False
        if good and (old_size is None or size >= old_size):
            con.execute(_FORGET_UNSIGNED, {"producer_id": checkpoint.producer_id})
            con.execute(
                _SAVE_VALID,
                {
                    "producer_id": checkpoint.producer_id,
                    "tree_size": size,
                    "root": checkpoint.root,
                    "seq": checkpoint.seq,
                    "event_id": checkpoint.event_id,
                    "closing": checkpoint.closing,
                    "heartbeat_s": checkpoint.heartbeat_s,
                    "time": checkpoint.time,
                },
            )
        return True

    @staticmethod
    def _consistent(
        con: duckdb.DuckDBPyConnection, producer_id: str, old_size: int, old_root: bytes, size: int, root: bytes
    ) -> bool:
        first, second = sorted((old_size, size))
        first_root, second_root = (old_root, root) if old_size <= size else (root, old_root)
        hashes = _hashes(con, producer_id, 0, second) or []
        leaves = [leaf_hash(bytes.fromhex(h)) for h in hashes]
        if len(leaves) != second:
            return False
        proof = consistency_proof(leaves, first, second)
        return verify_consistency(first, second, first_root, second_root, proof)

    # -- at the end of a drain, and periodically ---------------------------------------------------

    def close(
        self, con: duckdb.DuckDBPyConnection, *, now: datetime, older_than: datetime | None = None
    ) -> Counter[str]:
        """Record what waiting cannot fix any more; the new chain breaks by kind.

        Every checkpoint still queued (with `older_than`, stored before it) covers events the store
        does not hold: `truncated` (it stays queued; see the module docstring). With
        `require_signed`, per producer with stored events: no valid checkpoint at all is `unsigned`
        (with `older_than`, once its first event was stored before it); events after its last valid
        checkpoint's tree_size (other than checkpoints) whose `time` is more than `heartbeat_s` ×
        `SILENCE_FACTOR` before `now` are `uncovered` (one row at the first such seq); a last valid
        checkpoint that is not `closing` and older than that is `silent`. Times are the producer's
        `time` fields against `now`.
        """
        found: Counter[str] = Counter()
        waiting = con.execute(_WAITING, {"older_than": older_than}).fetchall()
        for producer_id, seq, event_id, event in waiting:
            checkpoint = _Checkpoint.from_row(producer_id, seq, event_id, event)
            row = con.execute(
                "SELECT count(*) FROM events WHERE producer_id = $p AND seq <= $n",
                {"p": producer_id, "n": checkpoint.tree_size},
            ).fetchone()
            stored = int(row[0]) if row else 0
            self._record(
                con,
                found,
                producer_id,
                seq,
                "truncated",
                f"{checkpoint.names()} covers seqs 1..{checkpoint.tree_size}; the store holds {stored} of them",
                event_id,
                _evidence(checkpoint, stored=stored),
            )
        if not self.require_signed:
            return found
        producers = con.execute(_PRODUCERS).fetchall()
        for (
            producer_id,
            first_seq,
            first_stored,
            tree_size,
            checkpoint_seq,
            event_id,
            closing,
            heartbeat_s,
            at,
        ) in producers:
            if tree_size is None:
                if older_than is not None and first_stored >= older_than:
                    continue
                self._record(
                    con,
                    found,
                    producer_id,
                    int(first_seq),
                    "unsigned",
                    f"producer {producer_id} has no valid signed checkpoint",
                    None,
                )
                continue
            late = float(heartbeat_s) * SILENCE_FACTOR
            uncovered = con.execute(
                _FIRST_UNCOVERED, {"p": producer_id, "n": int(tree_size), "now": now, "late": late}
            ).fetchone()
            if uncovered is not None:
                useq, uid, count = uncovered
                self._record(
                    con,
                    found,
                    producer_id,
                    int(useq),
                    "uncovered",
                    f"{count} events after tree_size {tree_size} of checkpoint {event_id} were never covered by "
                    f"a checkpoint within {late:g} s",
                    uid,
                )
            if not closing and (now - at).total_seconds() > late:
                self._record(
                    con,
                    found,
                    producer_id,
                    int(checkpoint_seq),
                    "silent",
                    f"producer {producer_id}'s last checkpoint {event_id} (seq {checkpoint_seq}, {at.isoformat()}) "
                    f"is not closing and none followed within {late:g} s",
                    event_id,
                )
        return found

    @staticmethod
    def _record(
        con: duckdb.DuckDBPyConnection,
        found: Counter[str],
        producer_id: str,
        seq: int,
        kind: str,
        detail: str,
        event_id: str | None,
        evidence: Mapping[str, Any] | None = None,
    ) -> None:
        params = {
            "producer_id": producer_id,
            "seq": seq,
            "kind": kind,
            "detail": detail,
            "event_id": event_id,
            "evidence": None if evidence is None else json.dumps(evidence),
        }
        row = con.execute(_INSERT_BREAK, params).fetchone()
        if row is not None and int(row[0]):
            found[kind] += 1


_PRODUCERS = """
SELECT e.producer_id, min(e.seq), min(e.ingested_at), s.tree_size, s.checkpoint_seq, s.event_id, s.closing,
       s.heartbeat_s, s.checkpoint_time
FROM events e LEFT JOIN checkpoint_state s USING (producer_id)
GROUP BY e.producer_id, s.tree_size, s.checkpoint_seq, s.event_id, s.closing, s.heartbeat_s, s.checkpoint_time
ORDER BY e.producer_id
"""

_FIRST_UNCOVERED = """
SELECT min(seq), arg_min(event_id, seq), count(*) FROM events
WHERE producer_id = $p AND seq > $n AND type <> 'Checkpoint'
HAVING count(*) > 0 AND min(time) < $now - to_microseconds(CAST($late * 1000000 AS BIGINT))
"""


def _hashes(con: duckdb.DuckDBPyConnection, producer_id: str, lo: int, hi: int) -> list[str] | None:
    """The stored hashes of seqs lo+1..hi in order, or None when one of them is not stored."""
    rows = con.execute(_HASHES, {"producer_id": producer_id, "lo": lo, "hi": hi}).fetchall()
    if len(rows) != hi - lo:
        return None
    return [str(h) for _, h in rows]


def _evidence(checkpoint: _Checkpoint, **extra: Any) -> dict[str, Any]:
    return {
        "checkpoint": checkpoint.event_id,
        "tree_size": checkpoint.tree_size,
        "root": checkpoint.root,
        "key_id": checkpoint.key_id,
        "note": checkpoint.note,
        "time": checkpoint.time,
        **extra,
    }
