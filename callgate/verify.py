"""`callgate verify`: prove that one stored event is in its producer's signed chain, and check such a
proof offline.

`build_proof` reads the event, the latest `Checkpoint` of its producer that covers it and the hashes
of that producer's events 1..tree_size (the named query `inclusion_material`, so the same through
`--db` or `--api`), and builds the RFC 9162 audit path of the event's leaf. The proof document
(version 1, JSON) carries everything an offline verifier needs and nothing it must trust:

    {"version": 1, "event": <the event's stored bytes, as text>, "event_hash", "producer_id", "seq",
     "leaf_index": seq - 1, "tree_size", "leaf_hash", "audit_path": [hex, ...],
     "checkpoint": <the checkpoint event's stored text>, "root", "note", "key_id"}

`check_proof` (`--proof P --key K`, and docs/verify_proof.mjs in Node.js) recomputes the event's hash
from its bytes (version 2: SHA-256 of the body `split_wire` cuts out), its leaf hash, the root from
the audit path, and opens the checkpoint's signed note with the key: origin `callgate/<producer_id>`,
the same size and root. Each step that fails is named.

Exit codes: 0 valid, 1 invalid (or not covered by any checkpoint), 2 cannot read (store, proof or
key). Building is O(tree_size): the proof hashes the producer's whole tree until the store keeps
tree levels.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from events.chain import split_wire
from events.checkpoints import ORIGIN_PREFIX
from events.merkle import inclusion_proof, leaf_hash, verify_inclusion
from events.signing import SigningError, VerifyingKey, open_signed_note, parse_checkpoint_body, parse_signed_note

EXIT_VALID = 0
EXIT_INVALID = 1
EXIT_CANNOT_READ = 2

PROOF_VERSION = 1
MATERIAL_QUERY = "inclusion_material"

Echo = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class Verdict:
    """The outcome of checking a proof: `ok`, or the `step` that failed and why."""

    ok: bool
    step: str = ""
    detail: str = ""

    def line(self) -> str:
        """One line for people: `valid ...` or `INVALID at <step>: <detail>`."""
        return f"valid: {self.detail}" if self.ok else f"INVALID at {self.step}: {self.detail}"


def _fail(step: str, detail: str) -> Verdict:
    return Verdict(False, step, detail)


class UnreadableProofError(Exception):
    """The proof document is not JSON of the shape a version 1 proof has; the message names what."""


# -- building ----------------------------------------------------------------------------------


def build_proof(rows: Sequence[Mapping[str, Any]], event_id: str) -> dict[str, Any] | Verdict:
    """The proof document of `event_id` from the rows of `inclusion_material`, or the failed `Verdict`
    (not found, not covered, a gap in the stored seqs). Pure: no I/O; O(tree_size) hashing."""
    event = next((r for r in rows if r["part"] == "event"), None)
    if event is None:
        return _fail("event", f"no event {event_id!r} in the store")
    checkpoint = next((r for r in rows if r["part"] == "checkpoint"), None)
    producer_id, seq = str(event["producer_id"]), int(event["seq"])
    if checkpoint is None:
        return _fail(
            "checkpoint",
            f"event {event_id} (seq {seq} of producer {producer_id}) is not covered by any stored checkpoint",
        )
    fields = json.loads(checkpoint["text"])
    tree_size = int(fields["tree_size"])
    leaves = [r for r in rows if r["part"] == "leaf"]
    for expected, row in enumerate(leaves, start=1):
        if int(row["seq"]) != expected:
            return _fail(
                "hashes", f"producer {producer_id} has no stored event at seq {expected} (gap before seq {row['seq']})"
            )
    if len(leaves) != tree_size:
        return _fail(
            "hashes", f"producer {producer_id} has stored events 1..{len(leaves)}, the checkpoint covers 1..{tree_size}"
        )
    hashes = [leaf_hash(bytes.fromhex(str(r["hash"]))) for r in leaves]
    return {
        "version": PROOF_VERSION,
        "event": event["text"],
        "event_hash": event["hash"],
        "producer_id": producer_id,
        "seq": seq,
        "leaf_index": seq - 1,
        "tree_size": tree_size,
        "leaf_hash": hashes[seq - 1].hex(),
        "audit_path": [h.hex() for h in inclusion_proof(hashes, seq - 1, tree_size)],
        "checkpoint": checkpoint["text"],
        "root": fields["root"],
        "note": fields["note"],
        "key_id": fields["key_id"],
    }


# -- checking ----------------------------------------------------------------------------------

_FIELDS: dict[str, type | tuple[type, ...]] = {
    "version": int,
    "event": str,
    "event_hash": str,
    "producer_id": str,
    "seq": int,
    "leaf_index": int,
    "tree_size": int,
    "leaf_hash": str,
    "audit_path": list,
    "checkpoint": str,
    "root": str,
    "note": str,
    "key_id": str,
}


def load_proof(path: Path) -> dict[str, Any]:
    """The proof document in `path`; `UnreadableProofError` naming the path and what is wrong."""
    try:
        doc = json.loads(path.read_bytes())
    except OSError as exc:
        raise UnreadableProofError(f"{path}: cannot read the proof: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise UnreadableProofError(f"{path}: not a proof (not JSON: {exc})") from None
    if not isinstance(doc, dict):
        raise UnreadableProofError(f"{path}: not a proof (not a JSON object)")
    for name, kind in _FIELDS.items():
        if not isinstance(doc.get(name), kind) or isinstance(doc.get(name), bool):
            raise UnreadableProofError(f"{path}: not a version {PROOF_VERSION} proof (field {name!r} missing or wrong)")
    if doc["version"] != PROOF_VERSION:
        raise UnreadableProofError(f"{path}: proof version {doc['version']}, this verifier reads {PROOF_VERSION}")
    return doc


def _hex32(text: object) -> bytes | None:
    if not isinstance(text, str) or len(text) != 64:
        return None
    try:
        return bytes.fromhex(text)
    except ValueError:
        return None


def check_inclusion(doc: Mapping[str, Any]) -> Verdict:
    """Every step of `check_proof` that needs no key: the event's hash from its bytes, its leaf hash,
    the root from the audit path, and that the checkpoint event says the same as the document."""
    wire = split_wire(str(doc["event"]).encode("utf-8"))
    if wire is None:
        return _fail("event_hash", "the event's bytes do not end with a version 2 hash member")
    body, carried = wire
    computed = hashlib.sha256(body).hexdigest()
    if computed != carried or computed != doc["event_hash"]:
        return _fail("event_hash", f"the event's bytes hash to {computed}, the proof says {doc['event_hash']}")
    try:
        fields = json.loads(doc["event"])
    except ValueError:
        return _fail("event", "the event is not JSON")
    if fields.get("producer_id") != doc["producer_id"] or fields.get("seq") != doc["seq"]:
        return _fail("event", "the event's producer_id or seq is not the proof's")
    if doc["leaf_index"] != doc["seq"] - 1:
        return _fail("leaf_index", f"leaf_index {doc['leaf_index']} is not seq - 1 ({doc['seq'] - 1})")
    leaf = leaf_hash(bytes.fromhex(computed))
    if _hex32(doc["leaf_hash"]) != leaf:
        return _fail("leaf_hash", f"the leaf hash is {leaf.hex()}, the proof says {doc['leaf_hash']}")
    path = [_hex32(p) for p in doc["audit_path"]]
    root = _hex32(doc["root"])
    if None in path or root is None:
        return _fail("audit_path", "an audit path element or the root is not 64 hex digits")
    if not verify_inclusion(leaf, doc["leaf_index"], doc["tree_size"], path, root):  # type: ignore[arg-type]
        return _fail("inclusion", f"the audit path does not lead to root {doc['root']} at tree size {doc['tree_size']}")
    checkpoint_wire = split_wire(str(doc["checkpoint"]).encode("utf-8"))
    if checkpoint_wire is None or hashlib.sha256(checkpoint_wire[0]).hexdigest() != checkpoint_wire[1]:
        return _fail("checkpoint", "the checkpoint event's bytes do not match its hash")
    cp = json.loads(doc["checkpoint"])
    for name in ("producer_id", "tree_size", "root", "note", "key_id"):
        if cp.get(name) != doc[name]:
            return _fail("checkpoint", f"the checkpoint event's {name} is not the proof's")
    if cp.get("type") != "Checkpoint":
        return _fail("checkpoint", "the checkpoint is not a Checkpoint event")
    return Verdict(True, detail=f"event seq {doc['seq']} is leaf {doc['leaf_index']} of the tree of {doc['tree_size']}")


def check_note(doc: Mapping[str, Any], key: VerifyingKey | None) -> Verdict:
    """The checkpoint's signed note: signed by `key` (None: the signature is not checked) with the
    proof's key id, and its body's origin, size and root are the proof's."""
    note = str(doc["note"]).encode("utf-8")
    try:
        if key is None:
            body, _ = parse_signed_note(note)
        else:
            if key.key_id != doc["key_id"]:
                return _fail(
                    "key", f"the checkpoint was signed by key id {doc['key_id']}, the key given is {key.key_id}"
                )
            body, signers = open_signed_note(note, {key.key_id: key})
            if key.key_id not in signers:
                return _fail("signature", f"the note has no valid signature by {key.name} ({key.key_id})")
        parsed = parse_checkpoint_body(body)
    except SigningError as exc:
        return _fail("note", str(exc))
    origin = ORIGIN_PREFIX + str(doc["producer_id"])
    if parsed.origin != origin:
        return _fail("note", f"the note's origin is {parsed.origin!r}, expected {origin!r}")
    if parsed.size != doc["tree_size"]:
        return _fail("note", f"the note's size is {parsed.size}, the proof's tree_size {doc['tree_size']}")
    if parsed.root.hex() != doc["root"]:
        return _fail("root", f"the note's root is {parsed.root.hex()}, the proof's {doc['root']}")
    signed = f", signed by {key.name} ({key.key_id})" if key is not None else ""
    return Verdict(True, detail=f"checkpoint of {origin} at size {parsed.size}{signed}")


def check_proof(doc: Mapping[str, Any], key: VerifyingKey | None) -> Verdict:
    """Whether the proof document shows its event in the tree its checkpoint signs (see the module
    docstring); the first failed step otherwise. Never raises on a well-shaped document."""
    inclusion = check_inclusion(doc)
    if not inclusion.ok:
        return inclusion
    note = check_note(doc, key)
    if not note.ok:
        return note
    return Verdict(True, detail=f"{inclusion.detail}; {note.detail}")


# -- the commands ------------------------------------------------------------------------------


def run_build(*, db: Path | None, api: str | None, event_id: str, out: Path | None, echo: Echo, err: Echo) -> int:
    """`callgate verify --db F | --api U --event ID [--out P]`: build, check and print (or write) the
    proof; the exit code."""
    # Imported here: `callgate --help` must not load DuckDB.
    from consumers.queries import QueryError
    from consumers.reader import SourceUnavailableError, open_reader

    if (api is None) == (db is None):
        err("error: give exactly one of --api URL (a running materializer) or --db FILE (an audit store)")
        return EXIT_CANNOT_READ
    try:
        reader = open_reader(api=api, db=db)
    except ValueError as exc:
        err(f"error: {exc}")
        return EXIT_CANNOT_READ
    try:
        rows = reader.query(MATERIAL_QUERY, {"event_id": event_id}).rows
    except SourceUnavailableError as exc:
        err(f"cannot read: {exc}")
        return EXIT_CANNOT_READ
    except QueryError as exc:
        err(f"cannot read: {reader.source} cannot answer the query {MATERIAL_QUERY} ({exc})")
        return EXIT_CANNOT_READ
    finally:
        reader.close()
    built = build_proof(rows, event_id)
    if isinstance(built, Verdict):
        err(f"no proof: {built.line()}")
        return EXIT_INVALID
    verdict = check_proof(built, None)
    text = json.dumps(built, indent=2, ensure_ascii=False) + "\n"
    if out is not None:
        try:
            out.write_text(text, encoding="utf-8")
        except OSError as exc:
            err(f"cannot write the proof: {out}: {exc.strerror or exc}")
            return EXIT_CANNOT_READ
    else:
        echo(text.rstrip("\n"))
    where = f" to {out}" if out is not None else ""
    summary = (
        f"proof of {event_id}{where}: event seq {built['seq']} of {built['producer_id']} "
        f"in checkpoint tree {built['tree_size']}"
    )
    if not verdict.ok:
        err(f"{summary}: {verdict.line()}")
        return EXIT_INVALID
    err(f"{summary}, root {built['root'][:16]}..: verifies (check it offline with --proof and the gate's key)")
    return EXIT_VALID


def run_check(*, proof: Path, key: Path, echo: Echo, err: Echo) -> int:
    """`callgate verify --proof P --key K`: the offline check; the exit code."""
    try:
        doc = load_proof(proof)
        verifying = VerifyingKey.load(key)
    except (UnreadableProofError, SigningError) as exc:
        err(f"cannot read: {exc}")
        return EXIT_CANNOT_READ
    verdict = check_proof(doc, verifying)
    (echo if verdict.ok else err)(f"proof {proof}: {verdict.line()}")
    return EXIT_VALID if verdict.ok else EXIT_INVALID
