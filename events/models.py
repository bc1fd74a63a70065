"""The event contract: one frozen pydantic model per wire `type`, and their discriminated union.

Every decision the gate takes leaves exactly one outcome event per call (`ToolUse`, `ToolDenied`,
`Substitute` or `Blocked`), preceded by `ApprovalRequested` and `ApprovalResolved` when a human was
asked. `Unmediated` records a guarded resource used around the gate; `ToolsRegistered` an agent
scope's tools and their interceptor chains.

Each event carries the envelope (ids, integrity chain, scope path, run, trace) and the decision
trail. How `hash` is computed depends on `schema_version` (see `events.chain`): version 2 hashes
the exact bytes the producer wrote, version 1 the canonical JSON of the event without `hash`. Bump
`SCHEMA_VERSION` on any change a consumer must know about.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Annotated, Any, Literal, Self, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

SCHEMA_VERSION = 2
"""The schema this code writes, and the newest it reads; `parse_event` refuses newer ones."""

OLDEST_SCHEMA_VERSION = 1
"""The oldest schema this code reads (and verifies)."""

ZERO_HASH = "0" * 64
"""`prev_hash` of a producer's first event."""

HASH_MEMBER = b',"hash":"'
"""What precedes the 64 hex digits of the hash at the end of a version 2 event's wire bytes."""


def _absent(value: object) -> bool:
    # Fields added after events were first written are left out while unset, so an event that
    # never had them keeps its canonical JSON, and its hash, byte for byte.
    return value is None or value == () or value == {}


class RuleMatch(BaseModel):
    """A rule of a policy file that matched a call, and the decision it stands for."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(description="The rule's id in its policy file.")
    decision: str = Field(description="allow, rewrite, deny, block, require_approval or substitute.")


class DecisionStep(BaseModel):
    """One step of the decision trail: an interceptor (or the gate's own validation/approval step)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    interceptor: str = Field(description="Interceptor name, or validation / approval / output / registry.")
    scope: str = Field(description="application, workflow, agent, tool, or gate for the gate's own steps.")
    kind: str = Field(
        description="allow, rewrite, deny, substitute, block, require_approval, error, or skipped (an "
        "after-interceptor the call never reached: the tool or an earlier one failed)."
    )
    phase: Literal["before", "after", "approval", "validation"] = "before"
    duration_ms: float = Field(description="How long the step took, in milliseconds.")
    error: str | None = Field(default=None, description="Why the step failed (it then failed closed).")
    policy_version: str | None = Field(
        default=None,
        exclude_if=_absent,
        description="For a policy file: the SHA-256 hex of the file's bytes that decided.",
    )
    rules: tuple[RuleMatch, ...] = Field(
        default=(), exclude_if=_absent, description="For a policy file: the rules that matched."
    )
    enforced: bool | None = Field(
        default=None,
        exclude_if=_absent,
        description="Set on every step of a call that had a shadow decision: false for the shadow "
        "steps (recorded, never applied), true for the others. Absent: the step was enforced.",
    )


class EventBase(BaseModel):
    """The envelope every event carries."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    event_id: str = Field(
        description="Unique id of the event (deduplication key downstream); new events' ids are "
        "UUIDv7: time-ordered, with 74 random bits."
    )
    schema_version: int = Field(
        default=SCHEMA_VERSION,
        ge=OLDEST_SCHEMA_VERSION,
        le=SCHEMA_VERSION,
        description="Version of this schema: 2 hashes the exact bytes written, 1 their canonical form.",
    )
    time: datetime = Field(description="When the decision was taken (UTC).")
    producer_id: str = Field(description="The gate instance that wrote the event.")
    seq: int = Field(ge=1, description="1, 2, 3 ... per producer, no gaps.")
    prev_hash: str = Field(description="hash of the producer's previous event; 64 zeros for seq 1.")
    hash: str = Field(
        default="",
        description="SHA-256 hex of the event without hash: for schema_version 2 of the bytes the "
        "producer wrote (docs/events.md), for 1 of the canonical JSON.",
    )
    gate: str = Field(description="Application scope (the Gate's name).")
    workflow: str | None = None
    agent: str | None = None
    tool: str | None = None
    call_id: str | None = None
    parent_call_id: str | None = Field(default=None, description="The call of an enclosing agent-as-tool.")
    run_id: str | None = None
    thread_id: str | None = None
    tenant: str | None = None
    principal: str | None = None
    trace_id: str | None = Field(default=None, description="W3C trace id (32 hex) of the call's span, if traced.")
    span_id: str | None = Field(default=None, description="W3C span id (16 hex) of the call's span, if traced.")
    decisions: tuple[DecisionStep, ...] = Field(default=(), description="The decision trail, in order.")

    # The bytes this event was read from (or sealed as), when it has them: a version 2 event's
    # hash is over those bytes, which no re-serialization reproduces. Not a field: never
    # serialized, not compared, dropped by a copy that changes anything.
    _wire: bytes | None = PrivateAttr(default=None)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self.__dict__ == other.__dict__

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        copy = super().model_copy(update=update, deep=deep)
        if update:
            copy._wire = None
        return copy

    def _wire_bytes(self) -> bytes:
        """A version 2 event's wire bytes (`events.encode_event`): the bytes it was sealed as or read
        from, else its JSON without `hash` followed by the hash member, last. Only for version 2."""
        if self._wire is not None:
            return self._wire
        body = self.__pydantic_serializer__.to_json(self, exclude={"hash"})
        return body[:-1] + HASH_MEMBER + self.hash.encode() + b'"}'

    def model_dump_json(self, **options: Any) -> str:
        """Without options, a version 2 event's JSON is its wire form (`events.encode_event`), the only form
        its hash can be checked against: `parse_event(event.model_dump_json())` verifies whenever the
        event does. With any option, and for version 1 events, pydantic's own serialization."""
        if not options and self.schema_version >= 2:
            try:
                return self._wire_bytes().decode("utf-8")
            except UnicodeDecodeError:  # read from JSON in another encoding: no wire form to give
                pass
        return super().model_dump_json(**options)


CrossingKind: TypeAlias = Literal["resource", "prompt", "sampling", "elicitation", "roots"]
"""What crossed an MCP gateway when it was not a tool call: a resource read, a prompt get (client
to server), or a sampling, elicitation or roots request (server to client)."""


class CallEvent(EventBase):
    """An event about one call: carries the arguments as redacted before leaving the process."""

    args: dict[str, Any] | None = Field(
        default=None, description="Redacted arguments; None when redaction failed (the raw args never leave)."
    )
    redacted_paths: tuple[str, ...] = Field(default=(), description="JSON pointers of the replaced values.")
    args_truncated: bool = Field(default=False, description="The args were oversized and cut.")
    redaction_error: str | None = Field(default=None, description="Why redaction failed, when it did.")
    shadow_outcome: Literal["allowed", "denied", "blocked", "substituted", "approval"] | None = Field(
        default=None,
        exclude_if=_absent,
        description="What the call would have had if every shadow decision had been enforced "
        "(only on calls with a shadow decision).",
    )
    divergent: bool | None = Field(
        default=None, exclude_if=_absent, description="shadow_outcome differs from what happened."
    )
    shadow_decided_by: str | None = Field(
        default=None, exclude_if=_absent, description="The shadow interceptor that decided shadow_outcome."
    )
    shadow_rule: str | None = Field(
        default=None, exclude_if=_absent, description="The policy rule behind shadow_outcome, for a policy file."
    )
    crossing: CrossingKind | None = Field(
        default=None,
        exclude_if=_absent,
        description="Set when the call was an MCP crossing other than a tool call (resource, prompt, "
        "sampling, elicitation, roots); absent for a tool call. `args` then hold the request's params.",
    )


class ToolUseEvent(CallEvent):
    """The tool ran (possibly after approval)."""

    type: Literal["ToolUse"] = "ToolUse"
    outcome: Literal["ok", "error", "timeout", "cancelled"]
    error: str | None = Field(default=None, description="The tool's error or the output problem (redacted).")
    duration_ms: float = Field(description="Wall time of the tool body.")
    cancelled: bool | None = Field(
        default=None,
        exclude_if=_absent,
        description="The caller was cancelled while the body ran. With outcome ok or error: a sync body, "
        "which cannot be stopped, ran to the end and that is its real outcome. With outcome "
        "cancelled: an async body was cut short after it had started.",
    )
    output_digest: str | None = Field(default=None, description="SHA-256 of the output's JSON as returned.")
    output_truncated: bool = False
    args_rewritten: bool = Field(default=False, description="An interceptor rewrote the arguments.")
    cost_usd: float = 0.0


class ToolDeniedEvent(CallEvent):
    """The tool did not run: a Deny, an interceptor that failed closed, a refused approval, invalid
    arguments, or an unknown tool."""

    type: Literal["ToolDenied"] = "ToolDenied"
    message: str = Field(description="What the model read.")
    decided_by: str = Field(description="The interceptor, or validation / approval / registry.")
    cause: Literal["deny", "interceptor_error", "approval_refused", "validation", "unknown_tool", "interrupted"]


class SubstituteEvent(CallEvent):
    """An interceptor answered in place of the tool."""

    type: Literal["Substitute"] = "Substitute"
    decided_by: str
    result_digest: str | None = Field(default=None, description="SHA-256 of the synthetic result's JSON.")
    error: str | None = Field(default=None, description="Why the result was withheld (an after-interceptor failed).")


class BlockedEvent(CallEvent):
    """The run was stopped at this call."""

    type: Literal["Blocked"] = "Blocked"
    reason: str
    decided_by: str
    cause: Literal["block", "interceptor_error", "approval_required", "audit_unavailable"]


class ApprovalRequestedEvent(CallEvent):
    """A human was asked about this call: a durable request, bound to the exact call.

    A reviewer's decision holds only for this `approval_id`, which is derived from the call id, the
    digest of the arguments and the policy version: the same call asked again (resumed in another
    process) asks for the same id, a call with other arguments or under another policy for a new one.
    """

    type: Literal["ApprovalRequested"] = "ApprovalRequested"
    reason: str
    requested_by: tuple[str, ...] = ()
    approval_id: str | None = Field(
        default=None,
        exclude_if=_absent,
        description="The request's id (32 hex): SHA-256 of call id, args digest and policy version, cut.",
    )
    args_digest: str | None = Field(
        default=None,
        exclude_if=_absent,
        description="SHA-256 hex of the canonical JSON of the validated arguments the tool would receive "
        "(before redaction).",
    )
    policy_version: str | None = Field(
        default=None, exclude_if=_absent, description="The policy file's version that asked, for a policy file."
    )
    rule: str | None = Field(default=None, exclude_if=_absent, description="The policy rule (or rules) that asked.")
    expires_at: str | None = Field(
        default=None,
        exclude_if=_absent,
        description="RFC 3339 UTC time after which no decision is honoured (the call is then refused).",
    )


class ApprovalResolvedEvent(EventBase):
    """The human's answer (or its absence).

    Written by the gate (its `approval_handler` answered, or nobody did in time), or by the reviewer's
    desk (`callgate approvals`, the read API, the console) when a reviewer decided a durable request:
    then `by` is the reviewer's authenticated subject and `approval_id`, `args_digest` and
    `policy_version` repeat the request's, which is all a waiting gate honours.
    """

    type: Literal["ApprovalResolved"] = "ApprovalResolved"
    approved: bool
    by: str | None = None
    note: str | None = None
    waited_ms: float
    error: str | None = Field(default=None, description="No answer in time, or the handler failed.")
    approval_id: str | None = Field(default=None, exclude_if=_absent, description="The request decided.")
    args_digest: str | None = Field(
        default=None, exclude_if=_absent, description="The request's args_digest, repeated."
    )
    policy_version: str | None = Field(
        default=None, exclude_if=_absent, description="The request's policy_version, repeated."
    )
    signature: str | None = Field(
        default=None,
        exclude_if=_absent,
        description="The desk's signature of the decision: the signature lines of a C2SP signed note "
        "(`events.decisions.sign_decision`), which gates given the desk's public key check.",
    )


class UnmediatedEvent(EventBase):
    """A guarded resource was used outside a mediated call of the tools it is bound to."""

    type: Literal["Unmediated"] = "Unmediated"
    resource: str
    attribute: str
    bound_tools: tuple[str, ...]
    site: str = Field(description="file:line in function of the use.")
    active_tool: str | None = Field(default=None, description="The tool being called at the time, if any.")
    thread: str | None = None


class TurnDecisionEvent(EventBase):
    """The before-turn chain's decision on one model call of an agent run."""

    type: Literal["TurnDecision"] = "TurnDecision"
    turn: int = Field(ge=1, description="The model turn of the run, from 1.")
    decision: Literal["allow", "rewrite", "deny", "substitute", "error"]
    decided_by: str | None = Field(default=None, description="The interceptor that decided (None: all allowed).")
    reason: str | None = Field(default=None, description="The Deny reason, or why an interceptor failed.")
    message_count: int = Field(ge=0, description="Messages the model was (or would have been) shown.")


class RegisteredTool(BaseModel):
    """One tool of an agent scope as registered: its schema hash and effective chain."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    description: str = ""
    input_schema_sha256: str
    interceptors: tuple[str, ...] = Field(description="Effective chain, outer scope first.")
    excluded: tuple[str, ...] = Field(default=(), description="Outer interceptors an inner scope excluded.")
    shadow: tuple[str, ...] = Field(
        default=(), exclude_if=_absent, description="Shadow interceptors on the chain (recorded, never applied)."
    )
    policies: dict[str, str] = Field(
        default_factory=dict,
        exclude_if=_absent,
        description="The policy files on the chain: interceptor name -> policy version (SHA-256 of the file).",
    )


class ToolsRegisteredEvent(EventBase):
    """An agent scope was created with these tools."""

    type: Literal["ToolsRegistered"] = "ToolsRegistered"
    tools: tuple[RegisteredTool, ...]


class CheckpointEvent(EventBase):
    """A signed statement of the producer's chain so far: the RFC 6962 Merkle tree root over the
    hashes of its events 1..`tree_size`, signed with the gate's Ed25519 key (docs/events.md,
    *Checkpoints*). Emitted every `checkpoint_events` events or `checkpoint_s` after the first
    event it has not covered, when the gate closes (`closing`), and every `heartbeat_s` while idle,
    so silence is provable."""

    type: Literal["Checkpoint"] = "Checkpoint"
    tree_size: int = Field(ge=0, description="The seq it covers: events 1..tree_size of this producer.")
    root: str = Field(description="Hex of the RFC 6962 tree root; each leaf is the 32 bytes of one event's hash.")
    closing: bool = Field(default=False, description="The producer's last checkpoint: its gate closed.")
    heartbeat_s: float = Field(description="The producer checkpoints at least this often while idle.")
    key_id: str = Field(description="C2SP key hash (8 hex) of the signing key.")
    note: str = Field(
        description="The C2SP signed note: the checkpoint body (origin callgate/<producer_id>, tree_size, "
        "base64 root, extension lines) and the Ed25519 signature line."
    )


Event: TypeAlias = Annotated[
    ToolUseEvent
    | ToolDeniedEvent
    | SubstituteEvent
    | BlockedEvent
    | ApprovalRequestedEvent
    | ApprovalResolvedEvent
    | UnmediatedEvent
    | ToolsRegisteredEvent
    | TurnDecisionEvent
    | CheckpointEvent,
    Field(discriminator="type"),
]
"""Any event, discriminated on `type`."""

EVENT_TYPES: dict[str, type[EventBase]] = {
    "ToolUse": ToolUseEvent,
    "ToolDenied": ToolDeniedEvent,
    "Substitute": SubstituteEvent,
    "Blocked": BlockedEvent,
    "ApprovalRequested": ApprovalRequestedEvent,
    "ApprovalResolved": ApprovalResolvedEvent,
    "Unmediated": UnmediatedEvent,
    "ToolsRegistered": ToolsRegisteredEvent,
    "TurnDecision": TurnDecisionEvent,
    "Checkpoint": CheckpointEvent,
}
"""Wire `type` -> model class."""

OUTCOME_TYPES = frozenset({"ToolUse", "ToolDenied", "Substitute", "Blocked"})
"""The types of which each call leaves exactly one."""
