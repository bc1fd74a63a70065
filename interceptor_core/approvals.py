"""Asking a human: what the approval handler receives and may answer."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

from interceptor_core.context import RunContext


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    """One call waiting for a human. `args` are the arguments as the tool would get them."""

    tool: str
    args: Mapping[str, Any]
    reason: str
    run: RunContext
    call_id: str
    requested_by: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Approval:
    """A reviewer's answer: `approved`, who answered (`by`), and a `note` (shown to the model on refusal)."""

    approved: bool
    by: str | None = None
    note: str | None = None


ApprovalHandler: TypeAlias = Callable[[ApprovalRequest], "Awaitable[bool | Approval] | bool | Approval"]
"""An async callable (sync is accepted too) that answers an `ApprovalRequest`."""
