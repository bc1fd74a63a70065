"""Reading events from their wire form: `parse_event` and `decode_sealed`.

Below `events.chain` (a sealed event decodes its bytes here, `verify_chain` parses what it is given)
and `events.codec` (which re-exports `parse_event` beside `encode_event` and `read_event`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic import TypeAdapter, ValidationError

from events.errors import EventParseError
from events.models import EVENT_TYPES, SCHEMA_VERSION, Event, EventBase

__all__ = ["decode_sealed", "parse_event", "wire_of"]

ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)
"""Validates any event type (the discriminated union), from Python values or JSON."""


def wire_of(data: bytes | str) -> bytes:
    """The bytes a version 2 event's hash is over: `data` as UTF-8, without a line's end."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    return raw.rstrip(b"\r\n")


def parse_event(data: bytes | str | Mapping[str, Any]) -> EventBase:
    """Turn wire bytes (or text, or an already decoded mapping) back into the typed event.

    Raises `EventParseError` for anything that is not a valid event: undecodable bytes, unknown
    `type`, a `schema_version` newer than this code reads, missing or malformed fields. The error
    says which, in a form fit for a dead-letter table.
    """
    raw = data if isinstance(data, bytes | str) else None
    if isinstance(data, bytes | str):
        try:
            decoded = json.loads(data)
        except UnicodeDecodeError as exc:
            raise EventParseError(f"not UTF-8: {exc}", raw) from exc
        except json.JSONDecodeError as exc:
            raise EventParseError(f"not JSON: {exc}", raw) from exc
    else:
        decoded = dict(data)
    if not isinstance(decoded, dict):
        raise EventParseError(f"expected a JSON object, got {type(decoded).__name__}", raw)
    kind = decoded.get("type")
    if kind not in EVENT_TYPES:
        raise EventParseError(f"unknown event type {kind!r}", raw)
    version = decoded.get("schema_version")
    if isinstance(version, int) and version > SCHEMA_VERSION:
        raise EventParseError(
            f"schema_version {version} is newer than {SCHEMA_VERSION}, the newest this reader knows", raw
        )
    try:
        event: EventBase = ADAPTER.validate_python(decoded)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'][1:]) or '(event)'}: {err['msg']}"
            for err in exc.errors(include_url=False)
        )
        raise EventParseError(f"invalid {kind} event: {problems}", raw) from exc
    if raw is not None and event.schema_version >= 2:
        event._wire = wire_of(raw)
    return event


def decode_sealed(data: bytes) -> EventBase:
    """The typed event of bytes a producer sealed: pydantic's JSON parser in one pass (the bytes
    keep with it); anything it refuses gets `parse_event`'s detailed `EventParseError`."""
    try:
        event: EventBase = ADAPTER.validate_json(data)
    except ValueError:
        return parse_event(data)
    event._wire = data
    return event
