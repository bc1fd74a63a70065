"""What travels with an event: its id, its Kafka envelope and the schema's version bounds."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import uuid
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from events import EventParseError, MemorySink, parse_event
from events.chain import new_event_id
from events.kafka import _headers, _spool_key
from interceptor_core import Gate, RunContext, tool

SCHEMA_FILE = Path(__file__).resolve().parents[2] / "docs" / "events.schema.json"

# RFC 3986's characters of a URI (unreserved, reserved and percent-encodings), nothing else.
URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:(?:[A-Za-z0-9\-._~!$&'()*+,;=:@/?]|%[0-9A-F]{2})*")


@tool
async def ping() -> str:
    return "pong"


def gate_events(name: str, calls: int = 3) -> list[object]:
    sink = MemorySink()
    gate = Gate(name, sinks=[sink])
    desk = gate.agent("desk", tools=[ping])

    async def work() -> None:
        for _ in range(calls):
            await desk.call("ping", {}, run=RunContext(tenant="acme"))

    asyncio.run(work())
    return list(sink.sealed)


class TestEventIds:
    def test_ids_are_uuid7_and_time_ordered(self) -> None:
        ids = [new_event_id() for _ in range(2000)]
        assert all(uuid.UUID(i).version == 7 and uuid.UUID(i).variant == uuid.RFC_4122 for i in ids)
        assert len(set(ids)) == len(ids)
        # Time-ordered: the 48-bit millisecond prefix never goes back.
        stamps = [uuid.UUID(i).int >> 80 for i in ids]
        assert stamps == sorted(stamps)

    def test_two_gates_of_one_process_share_no_id_pattern(self) -> None:
        """Ids used to be a process prefix plus a counter, the same across gates: now each is
        random beyond its timestamp, so one gate's id tells nothing of the next or another gate's."""
        first = [e.event_id for e in gate_events("a")]  # type: ignore[attr-defined]
        second = [e.event_id for e in gate_events("b")]  # type: ignore[attr-defined]
        assert not set(first) & set(second)
        tails = [uuid.UUID(i).int & ((1 << 62) - 1) for i in first + second]
        assert len(set(tails)) == len(tails)
        # No two consecutive ids differ by a small step, as a counter's would.
        assert all(abs(a - b) > 1 << 32 for a, b in itertools.pairwise(tails))


class TestKafkaEnvelope:
    def test_ce_source_is_a_uri_whatever_the_gate_is_called(self) -> None:
        """A gate named with spaces, a colon and a non-ASCII letter still gives a valid URI, the
        name percent-encoded and recoverable, and the producer id after it."""
        sealed = gate_events("billing desk: ü", calls=1)[-1]
        _, headers = _headers(_spool_key(sealed), 0)  # type: ignore[arg-type]
        source = dict(headers)["ce_source"].decode("ascii")
        assert URI.fullmatch(source), source
        assert urlsplit(source).scheme == "urn"
        prefix, _, producer = source.rpartition(":")
        assert producer == sealed.producer_id  # type: ignore[attr-defined]
        assert unquote(prefix.removeprefix("urn:callgate:producer:")) == "billing desk: ü"

    def test_two_gates_of_one_name_have_different_sources(self) -> None:
        one, two = gate_events("shop", calls=1)[-1], gate_events("shop", calls=1)[-1]
        sources = {dict(_headers(_spool_key(e), 0)[1])["ce_source"] for e in (one, two)}  # type: ignore[arg-type]
        assert len(sources) == 2

    def test_ce_id_and_ce_type_are_the_events(self) -> None:
        sealed = gate_events("shop", calls=1)[-1]
        key, headers = _headers(_spool_key(sealed), 0)  # type: ignore[arg-type]
        named = dict(headers)
        assert key == sealed.producer_id.encode()  # type: ignore[attr-defined]
        assert named["ce_id"] == sealed.event_id.encode()  # type: ignore[attr-defined]
        assert named["ce_type"] == b"dev.callgate." + sealed.type.encode()  # type: ignore[attr-defined]


class TestSchemaVersion:
    def test_the_published_schema_bounds_schema_version_to_what_the_parser_reads(self) -> None:
        schema = json.loads(SCHEMA_FILE.read_text())
        versions = [
            definition["properties"]["schema_version"]
            for definition in schema["$defs"].values()
            if "schema_version" in definition.get("properties", {})
        ]
        assert len(versions) >= 9  # every event type
        bounds = {(v["minimum"], v["maximum"]) for v in versions}
        assert bounds == {(1, 2)}

    @pytest.mark.parametrize("version", [0, 3, -1])
    def test_versions_outside_the_bounds_are_refused(self, version: int) -> None:
        data = json.loads(gate_events("shop", calls=1)[-1].data)  # type: ignore[attr-defined]
        data["schema_version"] = version
        with pytest.raises(EventParseError):
            parse_event(json.dumps(data))

    @pytest.mark.parametrize("version", [1, 2])
    def test_versions_inside_the_bounds_are_read(self, version: int) -> None:
        data = json.loads(gate_events("shop", calls=1)[-1].data)  # type: ignore[attr-defined]
        data["schema_version"] = version
        assert parse_event(json.dumps(data)).schema_version == version
