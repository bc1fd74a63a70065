"""A cheaper reader of version 2 wire bytes, for consumers: msgspec validates, pydantic decides the rest.

`read_wire(data)` decodes the bytes with msgspec structs generated from the pydantic models of
`events.models` (same field names, types, defaults, bounds and `extra="forbid"`), then hashes the
body as `events.codec.read_event` does. It answers only when it is sure: whatever it accepts,
`read_event` accepts too, with the same field values; for anything else (a version 1 event, an
invalid one, or one of the inputs where the two parsers could disagree) it returns None and the
caller takes `read_event`'s road, which gives the detailed reasons dead letters keep. Where they
could disagree, the generated structs are stricter than pydantic:

- a JSON integer where a float is wanted is accepted by both; a float where an integer is wanted
  (`1.0`), a string where a number is wanted (`"1"`), `NaN`, numbers beyond 64 bits: pydantic's road;
- `time` only in the RFC 3339 form with up to 6 fraction digits and an offset (msgspec rounds 7 and
  more digits where pydantic truncates; pydantic also reads Unix times and naive times), the
  offset's minutes below 60 (the standard library reads `+00:60` as an hour, pydantic refuses it);
- values nested deeper than `MAX_DEPTH` levels (pydantic's JSON parser refuses nesting deeper than
  about 200 levels, the standard library's about 1,000, msgspec stops at its own depth): pydantic's
  road. Only fields of type `Any` nest deeper than the models' own few levels; their decoded
  values are measured (`_nesting`). A lone surrogate escape (`\\ud800`), which pydantic's road
  reads, msgspec refuses; pairs both read alike.

`tests/events/test_fast_read.py` checks the equivalence on valid events, on every malformed input of
the store's tests and on generated ones. Pure, safe from any thread; imports msgspec.
"""

from __future__ import annotations

import hashlib
import types
import typing
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Final, Literal, Union

import annotated_types
import msgspec
from pydantic import BaseModel

from events.chain import SUFFIX_BYTES
from events.models import EVENT_TYPES, HASH_MEMBER, SCHEMA_VERSION

__all__ = ["MAX_DEPTH", "WireRead", "read_wire"]

MAX_DEPTH: Final = 128
"""Events nested deeper than this (the event's own object is level 1) are left to pydantic's road."""

_INT64_MAX: Final = 2**63 - 1

# RFC 3339 as `events.models` writes `time` (and as pydantic reads it identically): date, `T`, time
# with 0 to 6 fraction digits, `Z` or a numeric offset; ASCII digits only, nothing after. Checked as the
# text's shape, each ASCII digit read as `0`, among the 21 shapes of that form: some 1,700
# instructions an event, where msgspec's `pattern` (the regular expression
# `^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?(Z|[+-][0-9]{2}:[0-9]{2})\Z`,
# which accepts the same texts) took some 5,000.
_DIGITS_TO_ZERO: Final = bytes.maketrans(b"123456789", b"000000000")
_TIME_SHAPES: Final = frozenset(
    b"0000-00-00T00:00:00" + fraction + zone
    for fraction in (b"", *(b"." + b"0" * digits for digits in range(1, 7)))
    for zone in (b"Z", b"+00:00", b"-00:00")
)


_HEX_AT: Final = len(HASH_MEMBER)
"""Where the hash's hex digits start in the suffix."""
_HEX_DIGITS: Final = b"0123456789abcdef"


def _holds_any(annotation: Any) -> bool:
    """Whether values of this annotation may hold values of type `Any` (nesting without a bound)."""
    if annotation is Any:
        return True
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return any(_holds_any(info.annotation) for info in annotation.model_fields.values())
    return any(_holds_any(arg) for arg in typing.get_args(annotation) if arg is not Ellipsis)


def _nesting(value: Any, room: int) -> bool:
    """Whether a decoded JSON value (dict, list, scalar) nests at most `room` levels (a scalar: 0;
    `{}`: 1). Recurses at most `room` calls deep."""
    kind = type(value)
    if kind is dict:
        items = value.values()
    elif kind is list:
        items = value
    else:
        return True
    if room <= 0:
        return False
    for item in items:
        inner = type(item)
        if (inner is dict or inner is list) and not _nesting(item, room - 1):
            return False
    return True


class _Unsupported(Exception):
    """A model field whose pydantic semantics the generated structs do not reproduce."""


def _bounds(metadata: list[Any]) -> dict[str, Any]:
    bounds: dict[str, Any] = {}
    for item in metadata:
        if isinstance(item, annotated_types.Ge):
            bounds["ge"] = item.ge
        elif isinstance(item, annotated_types.Le):
            bounds["le"] = item.le
        elif isinstance(item, annotated_types.Gt):
            bounds["gt"] = item.gt
        elif isinstance(item, annotated_types.Lt):
            bounds["lt"] = item.lt
        else:
            raise _Unsupported(f"constraint {item!r}")
    return bounds


def _translate(annotation: Any, metadata: list[Any], structs: dict[type[BaseModel], Any]) -> Any:
    """The msgspec type accepting a subset of what pydantic accepts for `annotation`, same values."""
    origin = typing.get_origin(annotation)
    if annotation is int:
        bounds = _bounds(metadata)
        # Integers beyond 64 bits are valid for pydantic but not for the store's columns: its road.
        bounds.setdefault("le", _INT64_MAX)
        return Annotated[int, msgspec.Meta(**bounds)]
    if metadata:
        if annotation is not float:
            raise _Unsupported(f"constraints on {annotation!r}")
        return Annotated[float, msgspec.Meta(**_bounds(metadata))]
    if annotation in (str, float, bool) or annotation is Any:
        return annotation
    if annotation is datetime:
        # Only an event's own `time` (`_struct`), which `read_wire` checks and converts.
        raise _Unsupported("a datetime other than an event's time")
    if origin is Literal:
        if not all(isinstance(value, str) for value in typing.get_args(annotation)):
            raise _Unsupported(f"non-text literal {annotation!r}")
        return annotation
    if origin in (Union, types.UnionType):
        members = typing.get_args(annotation)
        others = [m for m in members if m is not type(None)]
        if len(members) != 2 or len(others) != 1:
            raise _Unsupported(f"union {annotation!r}")
        if others[0] is datetime:
            raise _Unsupported("optional datetime")
        return _translate(others[0], [], structs) | None
    if origin is tuple:
        args = typing.get_args(annotation)
        if len(args) != 2 or args[1] is not Ellipsis:
            raise _Unsupported(f"tuple {annotation!r}")
        return tuple[_translate(args[0], [], structs), ...]  # type: ignore[misc]
    if origin is dict:
        key, value = typing.get_args(annotation)
        if key is not str:
            raise _Unsupported(f"dict keys {key!r}")
        return dict[str, _translate(value, [], structs)]  # type: ignore[misc]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return _struct(annotation, structs)
    raise _Unsupported(f"type {annotation!r}")


def _struct(model: type[BaseModel], structs: dict[type[BaseModel], Any], tag: str | None = None) -> Any:
    if model in structs:
        return structs[model]
    decorators = model.__pydantic_decorators__
    if any((decorators.validators, decorators.field_validators, decorators.root_validators,
            decorators.model_validators)):  # fmt: skip
        raise _Unsupported(f"{model.__name__} has validators")
    fields: list[tuple[str, Any, Any]] = []
    for name, info in model.model_fields.items():
        if info.alias not in (None, name) or info.validation_alias not in (None, name):
            raise _Unsupported(f"{model.__name__}.{name} has an alias")
        if tag is not None and name == "type":
            continue  # the union's tag
        if info.annotation is datetime and name == "time" and tag is not None and not info.metadata:
            kind: Any = str  # decoded as text; `read_wire` checks its shape and makes it a datetime
        else:
            kind = _translate(info.annotation, list(info.metadata), structs)
        if info.is_required():
            fields.append((name, kind, msgspec.NODEFAULT))
        elif info.default_factory is not None:
            fields.append((name, kind, msgspec.field(default_factory=info.default_factory)))  # type: ignore[arg-type]
        else:
            fields.append((name, kind, info.default))
    options: dict[str, Any] = {}
    if tag is not None:
        options = {"tag_field": "type", "tag": tag, "namespace": {"type": tag}}
    # A model that ignores or keeps unknown fields would take them; forbidding them is only stricter.
    # Untracked by the cyclic collector (`gc=False`): decoded values hold no reference cycles, and
    # tracking every struct cost a quarter of the decoding (3.7 µs an event against 2.9).
    struct = msgspec.defstruct(
        f"Wire{model.__name__}",
        [(n, k) if d is msgspec.NODEFAULT else (n, k, d) for n, k, d in fields],
        kw_only=True,
        forbid_unknown_fields=True,
        gc=False,
        **options,
    )
    structs[model] = struct
    return struct


def _decoders() -> tuple[msgspec.json.Decoder[Any] | None, dict[bytes, msgspec.json.Decoder[Any]]]:
    """The decoder of the union of the event types, and one decoder per type keyed by the member that
    precedes the hash member in wire bytes of that type (`_TYPE_MEMBER`); (None, {}) when a model
    cannot be translated."""
    structs: dict[type[BaseModel], Any] = {}
    try:
        members = tuple(_struct(model, structs, tag=name) for name, model in EVENT_TYPES.items())
    except _Unsupported:
        return None, {}  # every read takes pydantic's road: slower, never wrong
    by_type = {
        _TYPE_MEMBER + name.encode() + b'"': msgspec.json.Decoder(member)
        for name, member in zip(EVENT_TYPES, members, strict=True)
    }
    return msgspec.json.Decoder(Union[members]), by_type  # noqa: UP007 (a union built at run time)


def _any_fields() -> dict[str, tuple[str, ...]] | None:
    """Per event type, its fields whose values may nest without a bound: the ones holding `Any`,
    all at the event's top level. None when a nested model holds `Any` too: then the depth of an
    event is bounded by its count of brackets instead (`_bracket_depth`)."""
    fields: dict[str, tuple[str, ...]] = {}
    for name, model in EVENT_TYPES.items():
        deep: list[str] = []
        for field_name, info in model.model_fields.items():
            annotation = info.annotation
            if not _holds_any(annotation):
                continue
            members = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
            if typing.get_origin(annotation) in (Union, types.UnionType):
                annotation = members[0] if len(members) == 1 else annotation
            # `Any`, or a dict or list of `Any`: measured as decoded; anything else, by brackets.
            if not (annotation is Any or typing.get_args(annotation)[-1:] == (Any,)):
                return None
            deep.append(field_name)
        fields[name] = tuple(deep)
    return fields


_TYPE_MEMBER: Final = b',"type":"'
"""How the `type` member starts where `events.codec` writes it: last before the hash member."""
_DECODERS: Final = _decoders()
_DECODER: Final = _DECODERS[0]
_BY_TYPE: Final = _DECODERS[1]
_ANY_FIELDS: Final = _any_fields()


def _deep(data: bytes, event: Any) -> bool:
    """Whether the event nests deeper than `MAX_DEPTH`: its `Any` values measured as decoded (a
    field's value is at level 2), or, without `_ANY_FIELDS`, every `[` and `{` byte counted as a level
    (an over-count: brackets in strings too)."""
    if _ANY_FIELDS is None:
        return data.count(b"[") + data.count(b"{") > MAX_DEPTH
    # A loop rather than `all()` over a generator, and scalars (most values) not measured: 0.9 µs an
    # event against 1.3.
    for name in _ANY_FIELDS[event.type]:
        value = getattr(event, name)
        kind = type(value)
        if (kind is dict or kind is list) and not _nesting(value, MAX_DEPTH - 1):
            return True
    return False


@dataclass(slots=True)
class WireRead:
    """What `read_wire` gives: the event's fields (`event`, a msgspec struct with the attributes of
    the pydantic model, `type` included, `time` a datetime), as `events.codec.ReadEvent` has them.
    Not frozen: one is made per event a store reads, and a frozen dataclass's constructor costs
    some 0.5 µs more; nothing changes one after `read_wire` made it."""

    event: Any
    content_hash: str
    """SHA-256 hex of the body of the bytes ("" when they do not end with the hash member)."""
    wire: bytes
    """The wire bytes as received, without a final line break: valid UTF-8 (msgspec checked it)."""

    @property
    def normalized(self) -> str:
        """The wire bytes as received, as text (what a store keeps)."""
        return self.wire.decode("utf-8")


def read_wire(data: bytes) -> WireRead | None:
    """The event in version 2 wire bytes, or None when only `events.codec.read_event` can tell
    (see the module's docstring). Never raises."""
    if _DECODER is None:
        return None
    wire = data.rstrip(b"\r\n")
    end = len(wire) - SUFFIX_BYTES
    # `_SUFFIX` (`,"hash":"`, 64 lowercase hex digits, `"}`) in plain byte operations: the regular
    # expression took 0.6 µs an event, these 0.2.
    sealed = (
        end > 0
        and wire.startswith(HASH_MEMBER, end)
        and wire.endswith(b'"}')
        and not wire[end + _HEX_AT : -2].translate(None, _HEX_DIGITS)
    )
    decoder = _DECODER
    if sealed and (start := wire.rfind(_TYPE_MEMBER, 0, end)) > 0:
        # The type's own struct when `type` is the member before the hash, as `events.codec` writes
        # it: 13 % fewer instructions than the union's decode. In bytes that decode as JSON, a final
        # `,"hash":"…"}` is a member of the outermost object, and so is a `,"type":"Name"` right
        # before it (a quote inside a string is escaped), so the union would pick the same struct;
        # the struct still checks every other `type` member against its tag, as the union does.
        decoder = _BY_TYPE.get(wire[start:end], _DECODER)
    try:
        event = decoder.decode(data)
        text = event.time
        if (
            event.schema_version != SCHEMA_VERSION
            or text.encode().translate(_DIGITS_TO_ZERO) not in _TIME_SHAPES
            # An offset's minutes past 59 (`+00:60`): `fromisoformat` reads them, pydantic does not.
            or (text[-1] != "Z" and text[-2] > "5")
            or _deep(data, event)
        ):
            return None
        event.time = datetime.fromisoformat(text)
    except (msgspec.ValidationError, msgspec.DecodeError, ValueError, RecursionError):
        # RecursionError: nesting past msgspec's own depth (about 1,000 levels).
        return None
    if sealed:
        # `split_wire`'s body without copying it: the wire up to its hash member, then the `}`.
        digest = hashlib.sha256(memoryview(wire)[:end])
        digest.update(b"}")
        content_hash = digest.hexdigest()
    else:
        content_hash = ""
    return WireRead(event, content_hash, wire)
