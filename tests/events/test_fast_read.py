"""read_wire: whatever it accepts, read_event accepts with the same fields, hash and kept JSON."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from events import EventParseError, Producer, encode_event
from events.codec import read_event
from events.fast_read import MAX_DEPTH, read_wire
from events.models import (
    ApprovalRequestedEvent,
    ApprovalResolvedEvent,
    BlockedEvent,
    CheckpointEvent,
    EventBase,
    SubstituteEvent,
    ToolDeniedEvent,
    ToolsRegisteredEvent,
    ToolUseEvent,
    TurnDecisionEvent,
    UnmediatedEvent,
)

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)

STEP = {"interceptor": "a", "scope": "application", "kind": "allow", "duration_ms": 0.01}
POLICY_STEP = {
    **STEP,
    "policy_version": "p" * 64,
    "rules": [{"id": "r1", "decision": "deny"}],
    "enforced": False,
    "phase": "after",
}
CALL = {"tool": "t", "call_id": "c-1", "args": {"n": 1, "text": "héllo ✓"}, "decisions": [STEP, POLICY_STEP]}
SHADOW = {"shadow_outcome": "denied", "divergent": True, "shadow_decided_by": "p", "shadow_rule": "r1"}
KINDS: list[tuple[type[EventBase], dict[str, Any]]] = [
    (ToolUseEvent, {**CALL, **SHADOW, "outcome": "ok", "duration_ms": 1.5, "cancelled": True}),
    (ToolDeniedEvent, {**CALL, "message": "no", "decided_by": "p", "cause": "deny"}),
    (SubstituteEvent, {**CALL, **SHADOW, "decided_by": "p", "error": "withheld"}),
    (BlockedEvent, {**CALL, "reason": "stop", "decided_by": "p", "cause": "block"}),
    (ApprovalRequestedEvent, {**CALL, "reason": "ask", "requested_by": ["p"]}),
    (ApprovalResolvedEvent, {"call_id": "c-1", "approved": False, "by": "bob", "waited_ms": 3}),
    (UnmediatedEvent, {"resource": "db", "attribute": "execute", "bound_tools": ["t"], "site": "a.py:1 in f"}),
    (
        ToolsRegisteredEvent,
        {
            "tools": [
                {"name": "t", "input_schema_sha256": "s" * 64, "interceptors": ["a"], "policies": {"p": "v"}},
                {"name": "u", "input_schema_sha256": "s" * 64, "interceptors": [], "shadow": ["x"]},
            ]
        },
    ),
    (TurnDecisionEvent, {"turn": 1, "decision": "deny", "reason": "r", "message_count": 3}),
    (
        CheckpointEvent,
        {"tree_size": 2, "root": "r" * 64, "heartbeat_s": 60, "key_id": "k" * 8, "note": "n", "closing": True},
    ),
]


def wires(fields: list[tuple[type[EventBase], dict[str, Any]]] = KINDS) -> list[bytes]:
    producer = Producer()
    return [
        encode_event(
            producer.seal(kind, {"event_id": uuid.uuid4().hex, "time": datetime.now(UTC), "gate": "g", **values})
        )
        for kind, values in fields
    ]


def same(model: Any, other: Any) -> bool:
    """Every field of the pydantic value equals the struct's, recursively, with the same Python types."""
    if isinstance(model, BaseModel):
        return all(same(getattr(model, name), getattr(other, name)) for name in type(model).model_fields)
    if isinstance(model, tuple):
        return isinstance(other, tuple) and len(model) == len(other) and all(map(same, model, other))
    if isinstance(model, datetime):
        return isinstance(other, datetime) and model == other and model.utcoffset() == other.utcoffset()
    return type(model) is type(other) and model == other


def assert_agrees(wire: bytes) -> bool:
    """read_wire either declines or gives exactly what read_event gives; True when it answered."""
    fast = read_wire(wire)
    if fast is None:
        return False
    slow = read_event(wire)  # raises if read_wire accepted what pydantic refuses
    assert same(slow.event, fast.event)
    assert fast.event.type == slow.event.type  # type: ignore[attr-defined]
    assert (fast.content_hash, fast.normalized) == (slow.content_hash, slow.normalized)
    return True


def with_field(wire: bytes, name: str, value: Any) -> bytes:
    """The wire with one member replaced (or added) in place, the producer's spacing kept."""
    data = json.loads(wire)
    data[name] = value
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()


class TestValidEvents:
    def test_every_type_is_read_as_pydantic_reads_it(self) -> None:
        """Each event type, with its optional fields set, is answered by read_wire with read_event's fields."""
        for wire in wires():
            assert assert_agrees(wire), wire

    def test_a_version_1_event_is_left_to_read_event(self) -> None:
        """Version 1 hashes a canonical form that only the models rebuild: read_wire declines."""
        event = Producer(schema_version=1).seal(
            ToolUseEvent,
            {"event_id": "e", "time": datetime.now(UTC), "gate": "g", "outcome": "ok", "duration_ms": 1.0},
        )
        assert read_wire(encode_event(event)) is None

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(args=st.dictionaries(st.text(max_size=8), JSON_VALUES, max_size=5), duration=st.floats(0, 1e9))
    def test_generated_arguments_agree(self, args: dict[str, Any], duration: float) -> None:
        """Any JSON arguments and durations: read_wire declines or agrees (most of them it answers)."""
        (wire,) = wires([(ToolUseEvent, {**CALL, "args": args, "outcome": "ok", "duration_ms": duration})])
        assert_agrees(wire)

    def test_a_tampered_event_has_the_same_content_hash(self) -> None:
        """A field changed after sealing: both readers recompute the same (mismatching) hash."""
        (wire,) = wires(KINDS[:1])
        forged = wire.replace(b'"tool":"t"', b'"tool":"x"')
        assert assert_agrees(forged)
        fast = read_wire(forged)
        assert fast is not None
        assert fast.content_hash != fast.event.hash

    def test_a_hash_member_out_of_its_place_is_read_as_read_event_reads_it(self) -> None:
        """The body is hashed only when the bytes end with `,"hash":"` + 64 lowercase hex + `"}`; for
        every other ending both readers agree (the same content hash, or both decline)."""
        (wire,) = wires(KINDS[:1])
        digest = json.loads(wire)["hash"]
        member = b',"hash":"' + digest.encode() + b'"'
        assert b',"output_digest":null' in wire
        variants = {
            "upper-case hex": wire.replace(digest.encode(), digest.upper().encode()),
            "first member": b'{"hash":"' + digest.encode() + b'",' + wire[1:].replace(member, b""),
            "space before the brace": wire[:-1] + b" }",
            "63 digits": wire.replace(digest.encode(), digest[:-1].encode()),
            # Another 64-digit member after the hash: the ending's digits are hex, its name is not `hash`.
            "a digest last": wire.replace(b',"output_digest":null', b"")[:-1]
            + b',"output_digest":"'
            + b"e" * 64
            + b'"}',
        }
        answered = {name: assert_agrees(variant) for name, variant in variants.items()}
        for name in ("first member", "a digest last"):
            moved = read_wire(variants[name])
            assert moved is not None, (name, answered)
            assert moved.content_hash == "", (name, answered)
        sealed = read_wire(wire)
        assert sealed is not None
        assert sealed.content_hash == digest


# Values pydantic refuses, or reads in a way the structs do not reproduce, for some field.
MALFORMED: list[tuple[str, Any]] = [
    ("seq", 0),
    ("seq", 1.0),
    ("seq", "1"),
    ("seq", 2**63),
    ("seq", None),
    ("schema_version", 3),
    ("schema_version", 1),
    ("schema_version", "2"),
    ("type", "Teleported"),
    ("type", None),
    ("time", "2026-12-01T12:00:00"),
    ("time", "2026-12-01T12:00:00.1234567Z"),
    ("time", "1700000000"),
    ("time", 1700000000),
    ("time", "2026-12-01T24:00:00Z"),
    ("time", "2026-02-30T12:00:00Z"),
    ("time", "2026-12-01T12:00:00Z\n"),
    ("time", "٢٠٢٦-12-01T12:00:00Z"),
    ("time", "2026-12-01T12:00:00+24:00"),
    ("event_id", 7),
    ("producer_id", None),
    ("outcome", "exploded"),
    ("duration_ms", "1.5"),
    ("duration_ms", True),
    ("args", [1, 2]),
    ("args", "x"),
    ("decisions", [{"interceptor": "a"}]),
    ("decisions", [{**STEP, "extra": 1}]),
    ("decisions", [{**STEP, "phase": "during"}]),
    ("decisions", [{**STEP, "rules": [{"id": "r"}]}]),
    ("decisions", {"a": 1}),
    ("redacted_paths", [1]),
    ("args_truncated", 1),
    ("unexpected", 1),
    ("shadow_outcome", "maybe"),
]


class TestMalformed:
    @pytest.mark.parametrize(("name", "value"), MALFORMED, ids=[f"{n}={v!r}" for n, v in MALFORMED])
    def test_whatever_read_wire_accepts_read_event_accepts_alike(self, name: str, value: Any) -> None:
        """A field with a refused (or differently read) value: read_wire declines, or agrees."""
        (wire,) = wires(KINDS[:1])
        changed = with_field(wire, name, value)
        if not assert_agrees(changed):
            return
        assert name in ("time",), f"read_wire accepted {name}={value!r}"

    @pytest.mark.parametrize(
        "wire",
        [
            b"{not json",
            b"[1, 2]",
            b'"ToolUse"',
            b"42",
            b"{}",
            b'{"type": "ToolUse", "note": "caf\xe9"}',
            b"[" * 100_000,
            b"\xef\xbb\xbf{}",
        ],
    )
    def test_not_events_are_declined(self, wire: bytes) -> None:
        """What is not an event at all is left to read_event, which gives the dead letter's reason."""
        assert read_wire(wire) is None
        with pytest.raises((EventParseError, RecursionError)):
            read_event(wire)

    def test_a_missing_field_is_declined(self) -> None:
        """Each required field of a ToolUse event, removed: read_wire declines."""
        (wire,) = wires(KINDS[:1])
        for name in ("event_id", "time", "producer_id", "seq", "prev_hash", "gate", "outcome", "duration_ms"):
            data = json.loads(wire)
            del data[name]
            assert read_wire(json.dumps(data).encode()) is None, name

    def test_deep_nesting_is_left_to_pydantic(self) -> None:
        """Nesting deeper than MAX_DEPTH (pydantic's JSON parser refuses about 200 levels, msgspec about
        1,000) takes read_event's road; MAX_DEPTH levels, and many brackets side by side, are read."""
        (wire,) = wires(KINDS[:1])

        def nested(levels: int) -> Any:
            return json.loads("[" * levels + "]" * levels)

        # The event's object is level 1, `args` level 2, its member "k" level 3 and below.
        assert assert_agrees(with_field(wire, "args", {"k": nested(MAX_DEPTH - 2)}))
        assert read_wire(with_field(wire, "args", {"k": nested(MAX_DEPTH - 1)})) is None
        assert assert_agrees(with_field(wire, "args", {"k": [{"a": nested(MAX_DEPTH - 4)}]}))
        assert read_wire(with_field(wire, "args", {"k": [{"a": nested(MAX_DEPTH - 3)}]})) is None
        assert read_wire(with_field(wire, "args", {"k": nested(250)})) is None
        deeper = wire.replace(b'"args":{', b'"args":{"k":' + b"[" * 5000 + b"]" * 5000 + b",", 1)
        assert b"[" * 5000 in deeper
        assert read_wire(deeper) is None
        assert assert_agrees(with_field(wire, "args", {"k": [[]] * (4 * MAX_DEPTH), "l": [{}] * MAX_DEPTH}))

    @settings(max_examples=200, deadline=None)
    @given(units=st.lists(st.integers(0xD700, 0xE000) | st.integers(0, 0xFFFF), min_size=1, max_size=3))
    def test_surrogate_escapes_are_declined_or_read_alike(self, units: list[int]) -> None:
        """Escaped UTF-16 code units, lone surrogates and pairs among them, in a field and in the args:
        read_wire declines (msgspec refuses lone ones) or reads what pydantic reads."""
        (wire,) = wires(KINDS[:1])
        escaped = "".join(f"\\u{unit:04x}" for unit in units).encode()
        assert_agrees(wire.replace(b'"tool":"t"', b'"tool":"' + escaped + b'"'))
        assert_agrees(wire.replace(b'"n":1', b'"n":"' + escaped + b'"'))
        if any(0xD800 <= unit < 0xE000 for unit in units) and len(units) == 1:
            assert read_wire(wire.replace(b'"tool":"t"', b'"tool":"' + escaped + b'"')) is None

    def test_the_type_member_is_read_alike_wherever_it_stands(self) -> None:
        """Where `events.codec` writes `type` (last before the hash) read_wire decodes with that type's
        own struct; moved first, or naming another type there, the event is read or declined as
        read_event reads it."""
        for wire in wires():
            kind = json.loads(wire)["type"]
            member = b',"type":"' + kind.encode() + b'"'
            assert member + b',"hash":"' in wire
            moved = b'{"type":"' + kind.encode() + b'",' + wire[1:].replace(member, b"", 1)
            assert assert_agrees(wire), kind
            assert assert_agrees(moved), kind
            for other in ("Blocked", "ToolUse"):
                renamed = wire.replace(member + b',"hash"', b',"type":"' + other.encode() + b'","hash"')
                assert assert_agrees(renamed) == (other == kind), (kind, other)

    def test_duplicate_members_agree(self) -> None:
        """A member given twice: read_wire declines or takes the last one as pydantic does."""
        (wire,) = wires(KINDS[:1])
        for member in (b',"tool":"other"', b',"seq":5', b',"type":"Blocked"', b',"type":"ToolUse"'):
            assert_agrees(wire[:-1] + member + b"}")
            assert_agrees(wire[:1] + member[1:] + b"," + wire[1:])


TIMES = st.from_regex(
    r"\A[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?(Z|[+-][0-9]{2}:[0-9]{2})\Z"
)


class TestTimes:
    @settings(max_examples=300, deadline=None)
    @given(text=TIMES | st.text(max_size=40))
    def test_any_time_text_is_declined_or_read_alike(self, text: str) -> None:
        """Every `time` read_wire accepts is the instant (and offset) pydantic reads."""
        (wire,) = wires(KINDS[:1])
        assert_agrees(with_field(wire, "time", text))

    def test_an_offset_of_sixty_minutes_or_more_is_declined(self) -> None:
        """`+00:60` has the strict form's shape; `fromisoformat` reads it as an hour, pydantic refuses it."""
        (wire,) = wires(KINDS[:1])
        for zone in ("+00:60", "-00:60", "+01:99"):
            odd = with_field(wire, "time", "2026-01-01T00:00:00" + zone)
            assert read_wire(odd) is None
            with pytest.raises(EventParseError):
                read_event(odd)
        assert assert_agrees(with_field(wire, "time", "2026-01-01T00:00:00+23:59"))

    @settings(max_examples=300, deadline=None)
    @given(
        when=st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30)),
        digits=st.integers(0, 6),
        minutes=st.integers(-23 * 60 - 59, 23 * 60 + 59),
        zulu=st.booleans(),
    )
    def test_every_time_of_the_strict_form_is_answered(
        self, when: datetime, digits: int, minutes: int, zulu: bool
    ) -> None:
        """The strict form (0 to 6 fraction digits, `Z` or an offset of either sign) is checked by its
        shape: none of its texts is declined."""
        fraction = "." + f"{when.microsecond:06d}"[:digits] if digits else ""
        sign = "-" if minutes < 0 else "+"
        zone = "Z" if zulu else f"{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"
        text = (
            f"{when.year:04d}-{when.month:02d}-{when.day:02d}T{when.hour:02d}:{when.minute:02d}:{when.second:02d}"
            + fraction
            + zone
        )
        (wire,) = wires(KINDS[:1])
        assert assert_agrees(with_field(wire, "time", text)), text

    @settings(max_examples=100, deadline=None)
    @given(
        when=st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30)),
        minutes=st.integers(-23 * 60 - 59, 23 * 60 + 59),
    )
    def test_written_times_are_read(self, when: datetime, minutes: int) -> None:
        """Times with any offset, as a producer writes them, are answered."""
        (wire,) = wires(KINDS[:1])
        text = when.replace(tzinfo=timezone(timedelta(minutes=minutes))).isoformat()
        assert assert_agrees(with_field(wire, "time", text))
