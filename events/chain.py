"""The integrity chain: sealing events in order, their hashes, and verifying a stream.

Each gate is a producer: its events carry `seq` 1, 2, 3 ... with no gaps and `prev_hash` linking
each to the one before. How `hash` is computed depends on the event's `schema_version`:

- **2** (what this code writes): the SHA-256 hex of the exact bytes the producer wrote, its
  *body*. The wire form is the body with its closing `}` replaced by `,"hash":"<64 hex>"}`: the
  hash is always the last member, so a verifier cuts the last 75 bytes, puts the `}` back and
  hashes what it has, in any language, without re-serializing anything (docs/events.md).
- **1** (older events, still read and verified): the SHA-256 hex of the canonical JSON of the event
  without `hash`: `model_dump(mode="json")`, keys sorted, separators `(",", ":")`, non-ASCII
  characters written as UTF-8 (not escaped).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel

from events.errors import EventParseError
from events.merkle import MerkleTree
from events.models import HASH_MEMBER as HASH_MEMBER  # defined beside the models; public here as before
from events.models import SCHEMA_VERSION, ZERO_HASH, EventBase
from events.parsing import decode_sealed, parse_event

E = TypeVar("E", bound=EventBase)


# Same output as json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False); one
# reusable encoder without the circularity check (event data is a tree) is a tenth cheaper.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, check_circular=False)


def canonical_json(data: Mapping[str, Any]) -> bytes:
    """The canonical UTF-8 JSON bytes of a JSON-mode mapping: keys sorted, separators `(",", ":")`,
    non-ASCII characters unescaped; the same bytes as `json.dumps` with those options (the form a
    version 1 event's hash is over)."""
    return _CANONICAL.encode(data).encode("utf-8")


# -- version 2: the hash is over the bytes written ---------------------------------------------

SUFFIX_BYTES = len(HASH_MEMBER) + 64 + 2
"""Length of the wire's hash suffix: `,"hash":"` + 64 hex + `"}` (75 bytes)."""

_SUFFIX = re.compile(rb',"hash":"([0-9a-f]{64})"\}\Z')


def split_wire(data: bytes) -> tuple[bytes, str] | None:
    """A version 2 event's wire bytes as (body, hash carried): the body is what was hashed, the wire
    without its last 75 bytes and with its closing `}` back. None when the bytes do not end with
    the hash member as the producer writes it (then nothing in them can be verified)."""
    if len(data) <= SUFFIX_BYTES or (match := _SUFFIX.search(data, len(data) - SUFFIX_BYTES)) is None:
        return None
    return data[:-SUFFIX_BYTES] + b"}", match.group(1).decode("ascii")


def _default(value: Any) -> Any:
    # What orjson does not write itself: models, bytes, sets; anything else as its text, so an
    # odd argument value still leaves a record.
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, set | frozenset):
        return list(value)
    return str(value)


def dumps(data: Mapping[str, Any]) -> bytes:
    """Compact UTF-8 JSON of an event's fields, in their order (orjson; datetimes as RFC 3339 with
    `Z`). What orjson refuses (integers beyond 64 bits, text with a lone surrogate) takes the
    standard library's road, non-ASCII escaped, so every value still makes valid UTF-8 JSON."""
    try:
        return orjson.dumps(data, default=_default, option=orjson.OPT_UTC_Z)
    except TypeError:
        return json.dumps(data, separators=(",", ":"), default=_default).encode("ascii")


def _v2_body(event: EventBase) -> bytes:
    # A version 2 event held without its bytes (built in Python, never sealed or read): the body is
    # its own JSON without hash. Sealed and read events carry their bytes and never come here.
    return event.__pydantic_serializer__.to_json(event, exclude={"hash"})


def event_hash(event: EventBase | SealedEvent | Mapping[str, Any]) -> str:
    """The hash an event must carry, recomputed from its content.

    Version 2: SHA-256 hex of the body of the bytes it was sealed as or read from ("" when those
    bytes do not end with the hash member: nothing matches it). Version 1: SHA-256 hex of its
    canonical JSON without `hash`. A decoded mapping of a version 2 event has lost its bytes:
    `ValueError`.
    """
    wire: bytes | None
    if isinstance(event, SealedEvent):
        wire = event.data
    elif isinstance(event, EventBase):
        if event.schema_version < 2:
            data = event.model_dump(mode="json")
            data.pop("hash", None)
            return hashlib.sha256(canonical_json(data)).hexdigest()
        wire = event._wire
        if wire is None:
            return hashlib.sha256(_v2_body(event)).hexdigest()
    else:
        data = dict(event)
        if isinstance(version := data.get("schema_version"), int) and version >= 2:
            raise ValueError("a version 2 event's hash is over its bytes; a decoded mapping cannot be verified")
        data.pop("hash", None)
        return hashlib.sha256(canonical_json(data)).hexdigest()
    split = split_wire(wire)
    return "" if split is None else hashlib.sha256(split[0]).hexdigest()


def new_producer_id() -> str:
    """A random producer id (one per gate instance)."""
    return os.urandom(16).hex()


def new_event_id() -> str:
    """A UUIDv7 (RFC 9562) in its canonical text form: 48 bits of Unix milliseconds, then the
    sub-millisecond fraction in the 12 bits after the version (the RFC's method 3), then 62 bits
    from the operating system's random source. Ids sort by time to a quarter of a microsecond and
    cannot be guessed from one another, across gates and processes."""
    ms, fraction = divmod(time.time_ns(), 1_000_000)
    head = (ms << 16 | 0x7000 | fraction * 4096 // 1_000_000).to_bytes(8).hex()
    tail = (int.from_bytes(os.urandom(8)) & 0x3FFF_FFFF_FFFF_FFFF | 0x8000_0000_0000_0000).to_bytes(8).hex()
    return f"{head[:8]}-{head[8:12]}-{head[12:]}-{tail[:4]}-{tail[4:]}"


class SealedEvent:
    """An event as its producer sealed it: the wire bytes (`data`, hash included), the envelope
    fields sinks route by, and the typed event decoded from those bytes on first use (`event`).

    What sinks receive: a sink that ships bytes (JSONL, Kafka) never decodes them. Any other
    attribute is the typed event's (`sealed.args`, `sealed.decisions`), so a sink written against
    the models reads it the same way.
    """

    __slots__ = ("_event", "data", "event_id", "gate", "hash", "prev_hash", "producer_id", "seq", "time", "type")

    schema_version = SCHEMA_VERSION

    def __init__(
        self,
        data: bytes,
        hash: str,
        event_id: str,
        type: str,
        producer_id: str,
        seq: int,
        prev_hash: str,
        gate: str,
        time: datetime,
    ) -> None:
        self.data = data
        self.hash = hash
        self.event_id = event_id
        self.type = type
        self.producer_id = producer_id
        self.seq = seq
        self.prev_hash = prev_hash
        self.gate = gate
        self.time = time
        self._event: EventBase | None = None

    @property
    def event(self) -> EventBase:
        """The typed event these bytes decode to (decoded once; raises `EventParseError` if they
        are not a valid event, which would be a bug in the code that built it)."""
        if self._event is None:
            self._event = decode_sealed(self.data)
        return self._event

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.event, name)

    def __repr__(self) -> str:
        return f"SealedEvent({self.type} seq={self.seq} of {self.producer_id}, {len(self.data)} bytes)"


def typed(event: EventBase | SealedEvent) -> EventBase:
    """The typed event, whether given the model or the sealed event."""
    return event.event if isinstance(event, SealedEvent) else event


class Producer:
    """Seals events in order: assigns `seq` and `prev_hash`, serializes once, hashes those bytes.

    Safe from any number of threads and tasks: sealing holds a lock, so sequence numbers have no
    gaps and every `prev_hash` is the hash of the event sealed just before. `schema_version=1`
    seals events the way older producers did (for tests and measurements of old stores).
    """

    def __init__(
        self, producer_id: str | None = None, *, schema_version: int = SCHEMA_VERSION, collect_leaves: bool = False
    ) -> None:
        if schema_version not in (1, SCHEMA_VERSION):
            raise ValueError(f"schema_version must be 1 or {SCHEMA_VERSION}, got {schema_version!r}")
        self.producer_id = producer_id or new_producer_id()
        self.schema_version = schema_version
        self._lock = threading.Lock()
        self._seq = 0
        self._prev = ZERO_HASH
        # With `collect_leaves`, the producer's RFC 6962 Merkle tree over its events' hashes, kept
        # as its frontier (`events.merkle.MerkleTree`). Sealing only appends the event's digest to
        # `_pending` (a list append under the lock it holds anyway); `tree_root` folds them in one
        # batch, off the call path: hashing each leaf as it was sealed cost 1.3 µs per event
        # there, 5 to 8 % of an audited call (bench/gate_overhead.py); the batch costs less.
        self._tree: MerkleTree | None = MerkleTree() if collect_leaves else None
        self._pending: list[bytes] = []
        self._tree_lock = threading.Lock()  # held across a fold: folds happen in seq order
        self._head = b'{"schema_version":%d,"producer_id":%s,"seq":' % (SCHEMA_VERSION, orjson.dumps(self.producer_id))

    @property
    def seq(self) -> int:
        """The last sequence number handed out (0 before the first event)."""
        return self._seq

    def tree_root(self) -> tuple[int, bytes]:
        """(the last seq, the Merkle tree root over the hashes of events 1..seq), atomically; for a
        producer built with `collect_leaves=True`. Folds the hashes sealed since the last call into
        the tree (about 1 µs each), holding the sealing lock only to take them: call it at least
        every few thousand events (the `Checkpointer` does) or they wait in memory, 32 bytes each.
        Safe from several threads."""
        tree = self._tree
        if tree is None:
            raise ValueError("this producer keeps no tree (collect_leaves=False)")
        with self._tree_lock:
            with self._lock:
                seq, pending = self._seq, self._pending
                self._pending = []
            # Outside the sealing lock: the call path never waits for the fold.
            tree.extend(pending)
            return seq, tree.root()

    def seal_fields(self, type_: str, fields: dict[str, Any]) -> SealedEvent:
        """Seal an event of wire type `type_` from `fields` (JSON-ready values and datetimes;
        everything but `schema_version`, `producer_id`, `seq`, `prev_hash`, `hash` and `type`,
        with at least `event_id`, `time` and `gate`): serialized once, hashed, linked.

        Not validated against the model (the gate's builders are; `seal` validates): the bytes are
        what every sink gets and every reader checks. Raises `TypeError` for a value JSON cannot
        hold, before the chain advances.
        """
        fields["type"] = type_
        rest = dumps(fields)
        with self._lock:
            seq = self._seq + 1
            prev = self._prev
            body = b'%s%d,"prev_hash":"%s",%s' % (self._head, seq, prev.encode(), rest[1:])
            raw = hashlib.sha256(body).digest()
            digest = raw.hex()
            self._seq, self._prev = seq, digest
            if self._tree is not None:
                self._pending.append(raw)
        return SealedEvent(
            body[:-1] + HASH_MEMBER + digest.encode() + b'"}',
            digest,
            fields["event_id"],
            type_,
            self.producer_id,
            seq,
            prev,
            fields["gate"],
            fields["time"],
        )

    def seal(self, cls: type[E], fields: dict[str, Any]) -> E:
        """Build a `cls` event from `fields` (everything but the chain fields), validated, sealed
        into the chain; returns the typed event (carrying its bytes).

        Raises pydantic's `ValidationError` if `fields` do not make a valid event (the chain is not
        advanced then). `fields` is consumed.
        """
        fields["producer_id"] = self.producer_id
        fields["seq"] = 1
        fields["prev_hash"] = ZERO_HASH
        fields["schema_version"] = self.schema_version
        event = cls(**fields)
        if self.schema_version == SCHEMA_VERSION:
            data = event.model_dump(mode="json", exclude={"hash", "producer_id", "seq", "prev_hash", "schema_version"})
            kind = data.pop("type")
            sealed = self.seal_fields(kind, data)
            result = sealed.event
            assert isinstance(result, cls)
            return result
        data = event.model_dump(mode="json")
        del data["hash"]
        with self._lock:
            seq = data["seq"] = self._seq + 1
            prev = data["prev_hash"] = self._prev
            digest = hashlib.sha256(canonical_json(data)).hexdigest()
            self._seq, self._prev = seq, digest
        # A frozen model, completed before anyone else can see it.
        object.__setattr__(event, "seq", seq)
        object.__setattr__(event, "prev_hash", prev)
        object.__setattr__(event, "hash", digest)
        return event


@dataclass(frozen=True, slots=True)
class Tampering:
    """One event that fails verification, and why."""

    producer_id: str
    seq: int
    event_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class ChainReport:
    """What `verify_chain` found.

    - `gaps`: per producer, the sequence numbers missing between 1 and the highest seen.
    - `tampered`: events whose hash does not match their content, whose `prev_hash` does not link
      to the previous event, or that conflict with another event of the same producer and seq.
    - `duplicates`: event ids seen more than once with identical content (harmless replays).
    - `ok`: no gaps and nothing tampered.
    """

    producers: dict[str, int] = field(default_factory=dict)
    gaps: dict[str, list[int]] = field(default_factory=dict)
    tampered: list[Tampering] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when every producer's chain is whole and untampered."""
        return not self.gaps and not self.tampered


def verify_chain(events: Iterable[EventBase | SealedEvent | bytes | Mapping[str, Any]]) -> ChainReport:
    """Check every producer's chain in `events`, in any order; never raises for bad content.

    Items may be typed events, sealed events, wire bytes (a JSONL line, a Kafka value) or decoded
    mappings of version 1 events (a version 2 event's hash is over its bytes: a mapping of one is
    reported as tampered). Bytes that are no event at all are reported as tampered too.
    """
    by_producer: dict[str, dict[int, tuple[str, str, str, str]]] = defaultdict(dict)
    seen_ids: dict[str, str] = {}
    tampered: list[Tampering] = []
    duplicates: list[str] = []
    for item in events:
        if isinstance(item, bytes | str):
            try:
                item = parse_event(item)
            except EventParseError as exc:
                tampered.append(Tampering("", 0, "", f"not an event: {exc.reason}"))
                continue
        producer: str
        if isinstance(item, SealedEvent | EventBase):
            producer, seq, event_id, claimed = item.producer_id, item.seq, item.event_id, item.hash
            prev_hash = item.prev_hash
        else:
            data = dict(item)
            producer, seq = str(data.get("producer_id")), int(data.get("seq", 0))
            event_id, claimed = str(data.get("event_id")), str(data.get("hash", ""))
            prev_hash = str(data.get("prev_hash"))
        try:
            actual = event_hash(item)
        except ValueError as exc:
            tampered.append(Tampering(producer, seq, event_id, str(exc)))
            continue
        if event_id in seen_ids:
            if seen_ids[event_id] == actual:
                duplicates.append(event_id)
                continue
            tampered.append(Tampering(producer, seq, event_id, "conflicting duplicate of the same event id"))
            continue
        seen_ids[event_id] = actual
        if claimed != actual:
            tampered.append(Tampering(producer, seq, event_id, "hash does not match the content"))
        slot = by_producer[producer]
        if seq in slot:
            tampered.append(Tampering(producer, seq, event_id, f"conflicts with event {slot[seq][0]} at the same seq"))
            continue
        slot[seq] = (event_id, claimed, str(prev_hash), actual)

    gaps: dict[str, list[int]] = {}
    producers: dict[str, int] = {}
    for producer, slot in by_producer.items():
        top = max(slot)
        producers[producer] = top
        missing = [n for n in range(1, top + 1) if n not in slot]
        if missing:
            gaps[producer] = missing
        for seq in sorted(slot):
            event_id, _, prev_hash, _ = slot[seq]
            if seq == 1:
                expected: str | None = ZERO_HASH
            else:
                before = slot.get(seq - 1)
                expected = before[1] if before else None  # a gap: the link cannot be checked
            if expected is not None and prev_hash != expected:
                tampered.append(Tampering(producer, seq, event_id, "prev_hash does not link to the previous event"))
    tampered.sort(key=lambda t: (t.producer_id, t.seq))
    return ChainReport(producers=producers, gaps=gaps, tampered=tampered, duplicates=duplicates)
