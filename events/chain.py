"""The integrity chain: canonical JSON, hashes, sealing events in order, and verifying a stream.

Each gate is a producer: its events carry `seq` 1, 2, 3 ... with no gaps and `prev_hash` linking
each to the one before. `hash` is the SHA-256 hex of the canonical JSON of the event without
`hash`: `model_dump(mode="json")`, keys sorted, separators `(",", ":")`, non-ASCII characters
written as UTF-8 (not escaped).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from events.models import ZERO_HASH, EventBase

E = TypeVar("E", bound=EventBase)


# Same output as json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False); one
# reusable encoder without the circularity check (event data is a tree) is a tenth cheaper.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, check_circular=False)


def canonical_json(data: Mapping[str, Any]) -> bytes:
    """The canonical UTF-8 JSON bytes of a JSON-mode mapping: keys sorted, separators `(",", ":")`,
    non-ASCII characters unescaped; the same bytes as `json.dumps` with those options."""
    return _CANONICAL.encode(data).encode("utf-8")


def event_hash(event: EventBase | Mapping[str, Any]) -> str:
    """The hash an event must carry: SHA-256 hex over its canonical JSON without `hash`."""
    data = event.model_dump(mode="json") if isinstance(event, EventBase) else dict(event)
    data.pop("hash", None)
    return hashlib.sha256(canonical_json(data)).hexdigest()


def new_producer_id() -> str:
    """A random producer id (one per gate instance)."""
    return os.urandom(16).hex()


class Producer:
    """Seals events in order: assigns `seq` and `prev_hash`, computes `hash`.

    Safe from any number of threads and tasks: sealing holds a lock, so sequence numbers have no
    gaps and every `prev_hash` is the hash of the event sealed just before.
    """

    def __init__(self, producer_id: str | None = None) -> None:
        self.producer_id = producer_id or new_producer_id()
        self._lock = threading.Lock()
        self._seq = 0
        self._prev = ZERO_HASH

    @property
    def seq(self) -> int:
        """The last sequence number handed out (0 before the first event)."""
        return self._seq

    def seal(self, cls: type[E], fields: dict[str, Any]) -> E:
        """Build a `cls` event from `fields` (everything but the chain fields), sealed into the chain.

        Raises pydantic's `ValidationError` if `fields` do not make a valid event (a bug in the
        caller; the chain is not advanced then). `fields` is consumed.
        """
        fields["producer_id"] = self.producer_id
        fields["seq"] = 1
        fields["prev_hash"] = ZERO_HASH
        # Validated construction is cheaper than model_construct here (measured: 5 against 13 µs),
        # and it happens outside the lock; only the chain fields are set under it.
        event = cls(**fields)
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


def verify_chain(events: Iterable[EventBase | Mapping[str, Any]]) -> ChainReport:
    """Check every producer's chain in `events`, in any order; never raises for bad content."""
    by_producer: dict[str, dict[int, tuple[str, str, str, str]]] = defaultdict(dict)
    seen_ids: dict[str, str] = {}
    tampered: list[Tampering] = []
    duplicates: list[str] = []
    for event in events:
        data = event.model_dump(mode="json") if isinstance(event, EventBase) else dict(event)
        producer, seq = str(data.get("producer_id")), int(data.get("seq", 0))
        event_id, claimed = str(data.get("event_id")), str(data.get("hash", ""))
        actual = event_hash(data)
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
        slot[seq] = (event_id, claimed, str(data.get("prev_hash")), actual)

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
