"""read_event: the consumer's one-pass read agrees with parse_event, event_hash and encode_event."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from events import (
    EventParseError,
    MemorySink,
    Producer,
    ToolUseEvent,
    encode_event,
    event_hash,
    parse_event,
    verify_chain,
)
from events.codec import read_event
from events.models import EventBase

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


def sealed(args: dict[str, Any] | None = None, duration_ms: float = 0.05, version: int = 2) -> EventBase:
    return Producer(schema_version=version).seal(
        ToolUseEvent,
        {
            "event_id": uuid.uuid4().hex,
            "time": datetime.now(UTC),
            "gate": "g",
            "tool": "t",
            "outcome": "ok",
            "duration_ms": duration_ms,
            "args": args if args is not None else {"n": 1, "text": "héllo ✓"},
            "decisions": [{"interceptor": "a", "scope": "application", "kind": "allow", "duration_ms": 0.01}],
        },
    )


def assert_same_as_the_three_calls(wire: bytes) -> None:
    read = read_event(wire)
    event = parse_event(wire)
    assert read.event == event
    assert type(read.event) is type(event)
    assert read.content_hash == event_hash(event)
    if event.schema_version >= 2:
        assert read.normalized == wire.decode("utf-8")  # kept as received: its hash is over it
    else:
        assert read.normalized == event.model_dump_json()


def reason(call: Any, wire: bytes) -> str:
    with pytest.raises(EventParseError) as caught:
        call(wire)
    return caught.value.reason


VERSIONS = pytest.mark.parametrize("version", [2, 1])


class TestReadEvent:
    @VERSIONS
    def test_our_own_wire(self, version: int) -> None:
        """What encode_event writes reads back as the event, its hash verifies, and it is its own normal form."""
        event = sealed(version=version)
        wire = encode_event(event)
        read = read_event(wire)
        assert read.event == event
        assert read.content_hash == event.hash
        assert read.normalized.encode("utf-8") == wire

    @settings(max_examples=200, deadline=None)
    @given(
        args=st.dictionaries(st.text(max_size=8), JSON_VALUES, max_size=5),
        duration=st.floats(0, 1e300),
        version=st.sampled_from([2, 1]),
    )
    def test_agrees_with_parse_event_for_any_args(self, args: dict[str, Any], duration: float, version: int) -> None:
        """For any JSON arguments (huge integers, lone surrogates) and any float (tiny, huge, in
        exponent form), one pass gives what three calls give, and the hash verifies."""
        event = sealed(args, duration, version)
        wire = encode_event(event)
        assert_same_as_the_three_calls(wire)
        assert read_event(wire).content_hash == event.hash

    @settings(max_examples=100, deadline=None)
    @given(args=st.dictionaries(st.text(max_size=8), JSON_VALUES, max_size=5), version=st.sampled_from([2, 1]))
    def test_agrees_with_parse_event_for_another_encoders_form(self, args: dict[str, Any], version: int) -> None:
        """Sorted keys, spaces, escaped non-ASCII: not our form, still the same event, hash and
        normal form as the three calls (for version 2, a hash that no longer verifies)."""
        event = sealed(args, version=version)
        data = json.loads(encode_event(event))
        for wire in (
            json.dumps(data, sort_keys=True).encode(),
            json.dumps(data, indent=2, ensure_ascii=True).encode(),
            json.dumps(data).encode("utf-16"),
        ):
            if version == 2 and wire.startswith(b"{"):
                assert_same_as_the_three_calls(wire)
            else:
                read, event = read_event(wire), parse_event(wire)
                assert (read.event, read.content_hash) == (event, event_hash(event))
            assert (read_event(wire).content_hash == event.hash) is (version == 1)

    def test_a_changed_byte_anywhere_is_caught(self) -> None:
        """Version 2: changing any one byte of the body changes the recomputed hash."""
        wire = encode_event(sealed({"order": {"id": "A-1", "items": [1, 2]}}))
        body_end = len(wire) - 75
        for at in range(1, body_end, 7):
            changed = wire[:at] + bytes([wire[at] ^ 0x01]) + wire[at + 1 :]
            try:
                read = read_event(changed)
            except EventParseError:
                continue  # no longer an event at all: a dead letter
            assert read.content_hash != read.event.hash, at

    def test_a_changed_value_anywhere_is_caught(self) -> None:
        """Version 1: changing any one value of a sealed event, in the wire's own form, changes the recomputed hash."""
        event = sealed({"order": {"id": "A-1", "items": [1, 2]}}, version=1)
        for path, value in (
            (("gate",), "other"),
            (("seq",), 2),
            (("duration_ms",), 0.06),
            (("args", "order", "items"), [1, 3]),
            (("decisions", 0, "kind"), "deny"),
            (("time",), "2020-01-01T00:00:00Z"),
        ):
            data = json.loads(encode_event(event))
            target = data
            for key in path[:-1]:
                target = target[key]
            target[path[-1]] = value
            wire = parse_event(data).model_dump_json().encode()
            read = read_event(wire)
            assert read.normalized.encode() == wire
            assert read.content_hash != read.event.hash, path

    @pytest.mark.parametrize(
        "wire",
        [
            b"not json",
            b"\xff\xfe\x00garbage",
            b"[1, 2]",
            b"null",
            b'{"type": "ToolExploded"}',
            b"{}",
        ],
    )
    def test_errors_are_parse_events(self, wire: bytes) -> None:
        """Whatever parse_event refuses, read_event refuses with the same reason."""
        assert reason(read_event, wire) == reason(parse_event, wire)

    def test_invalid_field_and_newer_schema_in_our_own_form(self) -> None:
        """A missing field or a newer schema_version in encode_event's form gets parse_event's reason."""
        data = json.loads(encode_event(sealed()))
        del data["outcome"]
        missing = json.dumps(data, separators=(",", ":")).encode()
        data = json.loads(encode_event(sealed()))
        data["schema_version"] = 99
        newer = json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()
        for wire in (missing, newer):
            assert reason(read_event, wire) == reason(parse_event, wire)
        assert "newer" in reason(read_event, newer)

    def test_a_lone_surrogate_fails_as_event_hash_does(self) -> None:
        """Version 1: text no UTF-8 encoder takes fails the hash in read_event as in event_hash
        (the store dead-letters it)."""
        data = json.loads(encode_event(sealed(version=1)))
        data["args"] = {"x": "\ud800"}
        wire = json.dumps(data).encode()
        with pytest.raises(UnicodeEncodeError):
            event_hash(parse_event(wire))
        with pytest.raises(UnicodeEncodeError):
            read_event(wire)

    def test_a_lone_surrogate_is_written_escaped_and_verifies(self) -> None:
        """Version 2: the producer escapes what UTF-8 cannot hold, so the event is written, read and verified."""
        event = sealed({"x": "\ud800", "big": 2**70})
        wire = encode_event(event)
        wire.decode("utf-8")
        read = read_event(wire)
        assert read.content_hash == event.hash
        assert read.event.args == {"x": "\ud800", "big": 2**70}

    def test_bytes_that_are_not_utf8_say_so(self) -> None:
        """The dead-letter reason names the encoding problem."""
        assert reason(read_event, b'{"type":"ToolUse","x":"\xff"}').startswith("not UTF-8")


class TestModelDumpJson:
    """Every event round-trips through its model: `parse_event(event.model_dump_json())` verifies."""

    @staticmethod
    def a_run() -> list[EventBase]:
        """One run of a real gate with every outcome: allowed, denied, substituted, approved, refused
        and blocked calls (and the scope's ToolsRegistered)."""
        from interceptor_core import (
            Approval,
            Block,
            Deny,
            Gate,
            RequireApproval,
            RunContext,
            Substitute,
            ToolBlockedError,
            before_tool_call,
            tool,
        )

        @tool
        def refund(order_id: str, amount_cents: int) -> str:
            """Refunds an order."""
            return f"refunded {amount_cents} on {order_id}"

        decisions = [None, Deny("not yours"), Substitute({"cached": "é ✓"}), RequireApproval("big"), Block("stop")]

        @before_tool_call(name="mix")
        def mix(call: Any) -> Any:
            return decisions[call.args["amount_cents"]]

        async def answer(request: Any) -> Approval:
            return Approval(approved=request.args["order_id"] == "A-3", by="lead", note="ok")

        sink = MemorySink()
        agent = Gate("shop", interceptors=[mix], sinks=[sink], approval_handler=answer).agent("desk", tools=[refund])

        async def run() -> None:
            context = RunContext(tenant="acme", principal="u-1")
            for n in range(4):
                await agent.call("refund", {"order_id": f"A-{n}", "amount_cents": n}, run=context)
            await agent.call("refund", {"order_id": "B-3", "amount_cents": 3}, run=context)
            with pytest.raises(ToolBlockedError):
                await agent.call("refund", {"order_id": "A-4", "amount_cents": 4}, run=context)

        asyncio.run(run())
        return list(sink.events)

    def test_every_event_of_a_run_verifies_after_model_dump_json(self) -> None:
        """Each event of a run with every outcome, Substitute included, re-serialized with pydantic's
        `model_dump_json()` and parsed back, is the same event and its chain verifies whole."""
        run = self.a_run()
        assert {e.type for e in run} >= {"ToolUse", "ToolDenied", "Substitute", "Blocked", "ApprovalResolved"}
        again = [parse_event(event.model_dump_json()) for event in run]
        assert again == run
        report = verify_chain(again)
        assert report.ok, report.tampered
        assert report.producers == {run[0].producer_id: len(run)}

    def test_an_event_built_in_python_round_trips_too(self) -> None:
        """A version 2 event never sealed (built from its fields) keeps its hash through
        `model_dump_json()`: the JSON ends with the hash member its hash is over."""
        event = sealed()
        built = ToolUseEvent(**event.model_dump())
        text = built.model_dump_json()
        assert text.endswith(f',"hash":"{built.hash}"}}')
        assert event_hash(parse_event(text)) == event_hash(built)

    def test_options_give_pydantic_s_own_json(self) -> None:
        """With an option (`indent`, `exclude`...), `model_dump_json` is pydantic's serialization."""
        event = sealed()
        assert json.loads(event.model_dump_json(indent=2)) == event.model_dump(mode="json")
        assert "hash" not in json.loads(event.model_dump_json(exclude={"hash"}))
