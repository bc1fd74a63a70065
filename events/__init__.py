"""callgate's event contract: typed decision events, the integrity chain, redaction and sinks.

Importing this package loads neither aiokafka nor opentelemetry: `events.kafka` and `events.otel`
are imported only when used.
"""

from events.chain import ChainReport, Producer, Tampering, canonical_json, event_hash, verify_chain
from events.codec import encode_event, event_json_schema, parse_event
from events.errors import EventError, EventParseError
from events.models import (
    EVENT_TYPES,
    OUTCOME_TYPES,
    SCHEMA_VERSION,
    ApprovalRequestedEvent,
    ApprovalResolvedEvent,
    BlockedEvent,
    DecisionStep,
    Event,
    EventBase,
    RegisteredTool,
    RuleMatch,
    SubstituteEvent,
    ToolDeniedEvent,
    ToolsRegisteredEvent,
    ToolUseEvent,
    TurnDecisionEvent,
    UnmediatedEvent,
)
from events.redaction import REDACTED, Detector, RedactedArgs, Redactor, RegexDetector
from events.sinks import BackgroundSink, JsonlSink, MemorySink, Sink, SinkStats, read_jsonl

__all__ = [
    "EVENT_TYPES",
    "OUTCOME_TYPES",
    "REDACTED",
    "SCHEMA_VERSION",
    "ApprovalRequestedEvent",
    "ApprovalResolvedEvent",
    "BackgroundSink",
    "BlockedEvent",
    "ChainReport",
    "DecisionStep",
    "Detector",
    "Event",
    "EventBase",
    "EventError",
    "EventParseError",
    "JsonlSink",
    "MemorySink",
    "Producer",
    "RedactedArgs",
    "Redactor",
    "RegexDetector",
    "RegisteredTool",
    "RuleMatch",
    "Sink",
    "SinkStats",
    "SubstituteEvent",
    "Tampering",
    "ToolDeniedEvent",
    "ToolUseEvent",
    "ToolsRegisteredEvent",
    "TurnDecisionEvent",
    "UnmediatedEvent",
    "canonical_json",
    "encode_event",
    "event_hash",
    "event_json_schema",
    "parse_event",
    "read_jsonl",
    "verify_chain",
]
