"""`ToolResult`: what a call returns, and the decision trail that led to it."""

from __future__ import annotations

from typing import Any, Literal, NamedTuple, assert_never

import pydantic_core

ResultKind = Literal["ok", "error", "denied", "substituted"]
TRUNCATION_MARK = "…[truncated]"


class DecisionRecord(NamedTuple):
    """One step of a call's decision trail.

    `interceptor` is the interceptor's name (or "validation", "approval", "output" for the gate's
    own steps), `scope` the level it was registered at ("application", "workflow", "agent",
    "tool", or "gate" for the gate's own steps), `kind` the decision ("allow", "rewrite", "deny",
    "substitute", "block", "require_approval", "error" for an interceptor that failed, or "skipped"
    for an after-interceptor the call never reached because the tool or an earlier one failed),
    `duration_s` how long it took, `error` why it failed (or, for a policy, which conditions
    failed and were counted fail-closed). A policy's record also carries `policy_version` (the
    SHA-256 of its file) and `rules`: the ids of the rules that matched, each with its decision.
    `enforced` is False for a shadow decision: recorded, never applied.
    """

    interceptor: str
    scope: str
    kind: str
    duration_s: float
    phase: Literal["before", "after", "approval", "validation"] = "before"
    error: str | None = None
    policy_version: str | None = None
    rules: tuple[tuple[str, str], ...] = ()
    enforced: bool = True
    """False for a shadow decision: recorded, never applied."""


class ToolResult(NamedTuple):
    """The outcome of one mediated call. Never raised: tool failures are `kind="error"`.

    Immutable. (A named tuple rather than a frozen dataclass: one is built per call, and a frozen
    dataclass's field-by-field `__init__` costs four times as much.)

    - "ok": the tool ran; `value` is its (transformed, validated) output.
    - "error": invalid arguments, the tool raised or timed out, or an after-interceptor failed;
      `message` says which and why (the exception's type and text, or the timeout).
    - "denied": a `Deny`, a failed interceptor, or a refused approval; `message` is what the model
      reads.
    - "substituted": an interceptor's `Substitute`; `value` stands in for the output.
    """

    kind: ResultKind
    value: Any = None
    message: str | None = None
    tool_name: str = ""
    call_id: str = ""
    decided_by: str | None = None
    decisions: tuple[DecisionRecord, ...] = ()
    truncated: bool = False
    cost_usd: float = 0.0
    max_chars: int | None = None
    """The tool's `max_result_chars`, applied by `to_model_text`."""

    @property
    def ok(self) -> bool:
        """True when the tool ran and its output came back."""
        return self.kind == "ok"

    def to_model_text(self) -> str:
        """What a model reads: the value (text as is, anything else as JSON), "Tool error: ...",
        or the denial message. Cut to the tool's `max_result_chars`."""
        match self.kind:
            case "ok" | "substituted":
                value = self.value
                text = value if isinstance(value, str) else pydantic_core.to_json(value).decode()
            case "error":
                text = f"Tool error: {self.message}"
            case "denied":
                text = self.message or "Tool call denied."
            case _:
                assert_never(self.kind)
        limit = self.max_chars
        if limit is not None and len(text) > limit:
            return text[:limit] + TRUNCATION_MARK
        return text
