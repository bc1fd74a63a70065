"""Decisions are values an interceptor returns; the gate `match`es on them.

Each is built with one positional argument. `None` from an interceptor means `Allow()`.
`kind` is a class-level tag, the same string the decision trail and the events record.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal


@dataclass(frozen=True, slots=True)
class Allow:
    """Let the call continue to the next interceptor (and, at the end, to the tool)."""

    kind: ClassVar[Literal["allow"]] = "allow"


@dataclass(frozen=True, slots=True)
class Rewrite:
    """Replace the arguments (tool calls) or the messages (before-turn) and continue.

    Rewritten tool arguments (a mapping or an instance of the input model) are validated again
    against the tool's input model; later interceptors and the tool see the new arguments. A rewrite
    never switches off a later deny.
    """

    args: Any
    kind: ClassVar[Literal["rewrite"]] = "rewrite"

    @property
    def messages(self) -> Any:
        """The same value, under the name a before-turn interceptor uses."""
        return self.args


@dataclass(frozen=True, slots=True)
class Deny:
    """Refuse this call; `message` is what the model reads, so say what it can do instead."""

    message: str
    kind: ClassVar[Literal["deny"]] = "deny"


@dataclass(frozen=True, slots=True)
class Substitute:
    """Skip the tool; `result` stands in for its output (after-interceptors still run on it)."""

    result: Any
    kind: ClassVar[Literal["substitute"]] = "substitute"


@dataclass(frozen=True, slots=True)
class Block:
    """Stop the whole run: the call raises `ToolBlockedError` carrying `reason`."""

    reason: str
    kind: ClassVar[Literal["block"]] = "block"


@dataclass(frozen=True, slots=True)
class RequireApproval:
    """Ask a human before the tool runs; asked only once the whole chain has run without ending."""

    reason: str
    kind: ClassVar[Literal["require_approval"]] = "require_approval"


Decision = Allow | Rewrite | Deny | Substitute | Block | RequireApproval
"""Everything a before-interceptor may return (or `None`, meaning `Allow()`)."""


@dataclass(frozen=True, slots=True)
class PolicyDecision:
    """What a policy (`interceptor_core.policy.Policy`) returns: a decision with its provenance.

    - `decision`: what the policy decided (never a `Rewrite`: rewritten arguments go in `args`).
    - `args`: the arguments after the policy's rewrites, an instance of the tool's input model
      (validated), or None when no rewrite applied. The gate puts them in place before acting on
      `decision`, so an approval or a later interceptor sees them.
    - `policy_version`, `rules` (the ids of the rules that matched, each with its decision) and
      `error` (conditions that failed, counted as the issue's fail-closed rule says) go into the
      call's decision record.
    """

    decision: Decision
    args: Any = None
    policy_version: str = ""
    rules: tuple[tuple[str, str], ...] = ()
    error: str | None = None
    decided_by: str | None = None
    """The rule whose decision won (None: the default)."""
    shadow: Decision | None = None
    """What the call would get with the policy's shadow rules enforced too (None: none matched).
    Recorded in the trail as a step that is not enforced; never applied."""
    shadow_rules: tuple[tuple[str, str], ...] = ()
    shadow_decided_by: str | None = None

    @property
    def kind(self) -> str:
        """The trail's kind: "rewrite" for arguments rewritten and then allowed, else the decision's."""
        if self.args is not None and type(self.decision) is Allow:
            return "rewrite"
        return self.decision.kind
