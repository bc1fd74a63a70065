"""Inclusion proofs anyone can check: the version 1 proof document and its offline verification.

A proof shows that one event is leaf `seq - 1` of its producer's RFC 6962 tree whose root a signed
`Checkpoint` states. The document (JSON) carries everything an offline verifier needs and nothing
it must trust:

    {"version": 1, "event": <the event's stored bytes, as text>, "event_hash", "producer_id", "seq",
     "leaf_index": seq - 1, "tree_size", "leaf_hash", "audit_path": [hex, ...],
     "checkpoint": <the checkpoint event's stored text>, "root", "note", "key_id"}

`check_proof` recomputes the event's hash from its bytes (version 2: SHA-256 of the body
`split_wire` cuts out), its leaf hash, the root from the audit path, and opens the checkpoint's
signed note with the key: origin `callgate/<producer_id>`, the same size and root. Each step that
fails is named. The store builds proofs (`consumers.proofs`); `callgate verify --proof` and
docs/verify_proof.mjs (Node.js) check them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from events.chain import split_wire
from events.checkpoints import ORIGIN_PREFIX
from events.merkle import leaf_hash, verify_inclusion
from events.signing import SigningError, VerifyingKey, open_signed_note, parse_checkpoint_body, parse_signed_note

__all__ = [
    "PROOF_VERSION",
    "UnreadableProofError",
    "Verdict",
    "check_inclusion",
    "check_note",
    "check_proof",
    "fail",
    "load_proof",
    "parse_proof",
]

PROOF_VERSION = 1


@dataclass(frozen=True, slots=True)
class Verdict:
    """The outcome of checking a proof: `ok`, or the `step` that failed and why."""

    ok: bool
    step: str = ""
    detail: str = ""

    def line(self) -> str:
        """One line for people: `valid ...` or `INVALID at <step>: <detail>`."""
        return f"valid: {self.detail}" if self.ok else f"INVALID at {self.step}: {self.detail}"


def fail(step: str, detail: str) -> Verdict:
    """A failed `Verdict` at `step`."""
    return Verdict(False, step, detail)


class UnreadableProofError(Exception):
    """The proof document is not JSON of the shape a version 1 proof has; the message names what."""


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
        data = path.read_bytes()
    except OSError as exc:
        raise UnreadableProofError(f"{path}: cannot read the proof: {exc.strerror or exc}") from None
    return parse_proof(data, source=str(path))


def parse_proof(data: bytes | str, *, source: str = "<proof>") -> dict[str, Any]:
    """The proof document in `data` (JSON); `UnreadableProofError` naming `source` and what is wrong."""
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise UnreadableProofError(f"{source}: not a proof (not JSON: {exc})") from None
    if not isinstance(doc, dict):
        raise UnreadableProofError(f"{source}: not a proof (not a JSON object)")
    for name, kind in _FIELDS.items():
        if not isinstance(doc.get(name), kind) or isinstance(doc.get(name), bool):
            raise UnreadableProofError(
                f"{source}: not a version {PROOF_VERSION} proof (field {name!r} missing or wrong)"
            )
    if doc["version"] != PROOF_VERSION:
        raise UnreadableProofError(f"{source}: proof version {doc['version']}, this verifier reads {PROOF_VERSION}")
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
        return fail("event_hash", "the event's bytes do not end with a version 2 hash member")
    body, carried = wire
    computed = hashlib.sha256(body).hexdigest()
    if computed != carried or computed != doc["event_hash"]:
        return fail("event_hash", f"the event's bytes hash to {computed}, the proof says {doc['event_hash']}")
    try:
        fields = json.loads(doc["event"])
    except ValueError:
        return fail("event", "the event is not JSON")
    if fields.get("producer_id") != doc["producer_id"] or fields.get("seq") != doc["seq"]:
        return fail("event", "the event's producer_id or seq is not the proof's")
    if doc["leaf_index"] != doc["seq"] - 1:
        return fail("leaf_index", f"leaf_index {doc['leaf_index']} is not seq - 1 ({doc['seq'] - 1})")
    leaf = leaf_hash(bytes.fromhex(computed))
    if _hex32(doc["leaf_hash"]) != leaf:
        return fail("leaf_hash", f"the leaf hash is {leaf.hex()}, the proof says {doc['leaf_hash']}")
    path = [_hex32(p) for p in doc["audit_path"]]
    root = _hex32(doc["root"])
    if None in path or root is None:
        return fail("audit_path", "an audit path element or the root is not 64 hex digits")
    if not verify_inclusion(leaf, doc["leaf_index"], doc["tree_size"], path, root):  # type: ignore[arg-type]
        return fail("inclusion", f"the audit path does not lead to root {doc['root']} at tree size {doc['tree_size']}")
    checkpoint_wire = split_wire(str(doc["checkpoint"]).encode("utf-8"))
    if checkpoint_wire is None or hashlib.sha256(checkpoint_wire[0]).hexdigest() != checkpoint_wire[1]:
        return fail("checkpoint", "the checkpoint event's bytes do not match its hash")
    cp = json.loads(doc["checkpoint"])
    for name in ("producer_id", "tree_size", "root", "note", "key_id"):
        if cp.get(name) != doc[name]:
            return fail("checkpoint", f"the checkpoint event's {name} is not the proof's")
    if cp.get("type") != "Checkpoint":
        return fail("checkpoint", "the checkpoint is not a Checkpoint event")
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
                return fail(
                    "key", f"the checkpoint was signed by key id {doc['key_id']}, the key given is {key.key_id}"
                )
            body, signers = open_signed_note(note, {key.key_id: key})
            if key.key_id not in signers:
                return fail("signature", f"the note has no valid signature by {key.name} ({key.key_id})")
        parsed = parse_checkpoint_body(body)
    except SigningError as exc:
        return fail("note", str(exc))
    origin = ORIGIN_PREFIX + str(doc["producer_id"])
    if parsed.origin != origin:
        return fail("note", f"the note's origin is {parsed.origin!r}, expected {origin!r}")
    if parsed.size != doc["tree_size"]:
        return fail("note", f"the note's size is {parsed.size}, the proof's tree_size {doc['tree_size']}")
    if parsed.root.hex() != doc["root"]:
        return fail("root", f"the note's root is {parsed.root.hex()}, the proof's {doc['root']}")
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
