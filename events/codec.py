"""Wire form of events: `encode_event`, `parse_event`, and `read_event` for consumers."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from events.chain import SealedEvent, event_hash, split_wire
from events.models import SCHEMA_VERSION, EventBase
from events.parsing import ADAPTER as _ADAPTER
from events.parsing import decode_sealed, parse_event, wire_of

__all__ = ["ReadEvent", "decode_sealed", "encode_event", "event_json_schema", "parse_event", "read_event"]


def encode_event(event: EventBase | SealedEvent) -> bytes:
    """The event's wire bytes: its JSON, `hash` included (UTF-8, one line).

    A sealed event, or a version 2 event read from bytes, gives exactly those bytes (its hash is
    over them). A version 2 event built in Python gives its JSON without `hash`, then the hash
    member last, the form `events.event_hash` hashes. A version 1 event gives its JSON: readers
    verify it by recomputing the canonical form from the parsed event.
    """
    if isinstance(event, SealedEvent):
        return event.data
    if event.schema_version >= 2:
        return event._wire_bytes()
    return event.model_dump_json().encode("utf-8")


@dataclass(frozen=True, slots=True)
class ReadEvent:
    """An event read off the wire, with what a consumer stores beside it."""

    event: EventBase
    content_hash: str
    """`event_hash(event)`: recomputed from the content; differs from `event.hash` when tampered."""
    normalized: str
    """What a store keeps: for version 2, the wire bytes as received (their hash is over them); for
    version 1, `event.model_dump_json()`, the form `encode_event` writes, whatever form the wire had."""


def read_event(data: bytes) -> ReadEvent:
    """`parse_event(data)`, the event's `event_hash` and the JSON a store keeps, in one pass.

    Same results and same errors as those calls in a row (`EventParseError` for anything that is
    not a valid event; whatever `event_hash` raises). Valid wire bytes go through pydantic's own
    JSON parser once; a version 2 event is then hashed as received, with nothing re-serialized.
    Anything else takes `parse_event`'s road (both, for bytes that fail the first). Pure, safe from
    any thread.
    """
    event: EventBase | None
    try:
        event = _ADAPTER.validate_json(data)
    except ValueError:
        event = None
    if event is not None and event.schema_version >= 2:
        # Parsed, so valid UTF-8: kept as received, hashed as received.
        wire = wire_of(data)
        event._wire = wire
        split = split_wire(wire)
        return ReadEvent(event, "" if split is None else hashlib.sha256(split[0]).hexdigest(), wire.decode("utf-8"))
    normalized = b""
    if event is not None:
        try:
            # What `encode_event` writes, without its copy to str and back.
            normalized = event.__pydantic_serializer__.to_json(event)
        except ValueError:  # PydanticSerializationError: the general road decides
            event = None
    # Byte-equal to its own re-encoding, the wire decodes (json.loads) to exactly the event's JSON
    # values, so parse_event would have built an equal event: the round trip encode_event ->
    # parse_event is the identity. Any other input (invalid, another encoder's spacing or key
    # order, a newer schema_version, which validation alone lets through) takes the general road,
    # which also gives the detailed reasons the dead letters keep.
    if event is None or normalized != data or event.schema_version > SCHEMA_VERSION:
        event = parse_event(data)
        if event.schema_version >= 2:
            # Valid, but in a form pydantic's parser refused (another text encoding): its bytes
            # are kept when they are UTF-8, its JSON otherwise; its hash is over the bytes.
            wire = wire_of(data)
            try:
                text = wire.decode("utf-8")
            except UnicodeDecodeError:
                text = event.model_dump_json()
            return ReadEvent(event, event_hash(event), text)
        return ReadEvent(event, event_hash(event), event.model_dump_json())
    return ReadEvent(event, event_hash(event), normalized.decode("utf-8"))


def event_json_schema() -> dict[str, Any]:
    """The JSON Schema of every event type (what `callgate schema` prints)."""
    return _ADAPTER.json_schema(mode="serialization")
