"""Wire form of events: `encode_event` and `parse_event`."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic import TypeAdapter, ValidationError

from events.errors import EventParseError
from events.models import EVENT_TYPES, SCHEMA_VERSION, Event, EventBase

_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)


def encode_event(event: EventBase) -> bytes:
    """The event's wire bytes: its JSON, `hash` included (UTF-8, one line).

    Not the canonical form: readers verify `hash` by recomputing the canonical JSON from the parsed
    event (`events.event_hash`), so the wire only has to carry the same values, and pydantic's own
    serializer does that five times faster than sorting keys in Python.
    """
    return event.model_dump_json().encode("utf-8")


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
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
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
        event: EventBase = _ADAPTER.validate_python(decoded)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'][1:]) or '(event)'}: {err['msg']}"
            for err in exc.errors(include_url=False)
        )
        raise EventParseError(f"invalid {kind} event: {problems}", raw) from exc
    return event


def event_json_schema() -> dict[str, Any]:
    """The JSON Schema of every event type (what `callgate schema` prints)."""
    return _ADAPTER.json_schema(mode="serialization")
