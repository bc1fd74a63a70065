"""The event schema: parse_event, its errors, and the JSON Schema kept in docs/."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from events import (
    EVENT_TYPES,
    SCHEMA_VERSION,
    EventParseError,
    Producer,
    encode_event,
    event_json_schema,
    parse_event,
)
from events.models import EventBase

SCHEMA_FILE = Path(__file__).resolve().parents[2] / "docs" / "events.schema.json"

CALL = {"gate": "shop", "workflow": "support", "agent": "desk", "tool": "refund", "call_id": "c-1", "run_id": "r-1"}
EXAMPLES: dict[str, dict[str, Any]] = {
    "ToolUse": {**CALL, "outcome": "ok", "duration_ms": 1.5, "args": {"order_id": "A-1"}},
    "ToolDenied": {**CALL, "message": "not yours", "decided_by": "tenant-orders", "cause": "deny"},
    "Substitute": {**CALL, "decided_by": "cache", "result_digest": "ab" * 32},
    "Blocked": {**CALL, "reason": "DROP TABLE", "decided_by": "sql", "cause": "block"},
    "ApprovalRequested": {**CALL, "reason": "above limit", "requested_by": ("limit",)},
    "ApprovalResolved": {**CALL, "approved": True, "by": "lead", "waited_ms": 1200.0},
    "Unmediated": {
        "gate": "shop",
        "resource": "payments",
        "attribute": "refund",
        "bound_tools": ("refund",),
        "site": "app.py:10 in main",
    },
    "TurnDecision": {
        "gate": "shop",
        "agent": "desk",
        "turn": 2,
        "decision": "deny",
        "decided_by": "pii",
        "message_count": 5,
    },
    "ToolsRegistered": {
        "gate": "shop",
        "agent": "desk",
        "tools": [{"name": "refund", "input_schema_sha256": "cd" * 32, "interceptors": ("a", "b")}],
    },
    "Checkpoint": {
        "gate": "shop",
        "tree_size": 7,
        "root": "ef" * 32,
        "heartbeat_s": 60.0,
        "key_id": "c74f20a3",
        "note": "callgate/p\n7\n7+8=\n\n— shop x7yz\n",
    },
}


def sealed(kind: str, producer: Producer | None = None) -> EventBase:
    fields = {"event_id": f"e-{kind}", "time": datetime(2026, 11, 30, 8, 0, tzinfo=UTC), **EXAMPLES[kind]}
    return (producer or Producer()).seal(EVENT_TYPES[kind], fields)


class TestParseEvent:
    @pytest.mark.parametrize("kind", sorted(EVENT_TYPES))
    def test_every_type_round_trips(self, kind: str) -> None:
        """encode_event then parse_event gives back an equal typed event of the same class."""
        event = sealed(kind)
        back = parse_event(encode_event(event))
        assert type(back) is EVENT_TYPES[kind]
        assert back == event
        assert back.model_dump(mode="json") == event.model_dump(mode="json")

    def test_text_and_mappings_are_accepted(self) -> None:
        """parse_event takes str and an already decoded mapping as well as bytes."""
        event = sealed("ToolUse")
        wire = encode_event(event)
        assert parse_event(wire.decode()) == event == parse_event(json.loads(wire))

    def test_unknown_type(self) -> None:
        """An unknown type is an EventParseError naming it, keeping the raw input."""
        with pytest.raises(EventParseError, match="unknown event type 'ToolExploded'") as caught:
            parse_event(b'{"type": "ToolExploded"}')
        assert caught.value.raw == b'{"type": "ToolExploded"}'

    def test_newer_schema_version(self) -> None:
        """A schema_version newer than this reader is refused, not half-read."""
        data = json.loads(encode_event(sealed("ToolUse")))
        data["schema_version"] = SCHEMA_VERSION + 1
        with pytest.raises(EventParseError, match="newer"):
            parse_event(json.dumps(data))

    def test_missing_field(self) -> None:
        """A missing required field is named in the error."""
        data = json.loads(encode_event(sealed("ToolDenied")))
        del data["message"]
        with pytest.raises(EventParseError, match="invalid ToolDenied event: message: Field required"):
            parse_event(json.dumps(data))

    @pytest.mark.parametrize("raw", [b"\xff\xfe", b"not json", b"[1, 2]", b""])
    def test_garbage(self, raw: bytes) -> None:
        """Undecodable bytes are one clear error type."""
        with pytest.raises(EventParseError):
            parse_event(raw)

    def test_events_are_frozen(self) -> None:
        """An event cannot be changed after it is sealed."""
        event = sealed("ToolUse")
        with pytest.raises(ValueError, match="frozen"):
            event.tool = "other"  # type: ignore[misc]


class TestSchemaDocument:
    def test_docs_schema_matches_the_models(self) -> None:
        """docs/events.schema.json is what `callgate schema` prints; regenerate it when models change."""
        current = json.dumps(event_json_schema(), indent=2, sort_keys=True) + "\n"
        assert SCHEMA_FILE.read_text() == current, "run: .venv/bin/callgate schema > docs/events.schema.json"

    def test_schema_names_every_type(self) -> None:
        """The schema's discriminator maps every wire type."""
        mapping = event_json_schema()["discriminator"]["mapping"]
        assert set(mapping) == set(EVENT_TYPES)
