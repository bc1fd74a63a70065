"""The frameworks' own approvals, recorded by the gate.

A framework may ask a human about a call by itself (Pydantic AI's `requires_approval=True`, the
OpenAI Agents SDK's `needs_approval=True`), whatever the gate's chain says. So that such a request
and its answer are recorded as the gate records its own (`ApprovalRequested`, `ApprovalResolved`,
then the call's one outcome), each integration adds `FrameworkApproval` to the agent scope of its
tools: it requires approval of a call while `framework_asks(reason)` is in effect around it, and
decides nothing otherwise. Being a `RequireApproval`, it lets the rest of the chain run first, so a
call the chain denies or blocks is not put to a human.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager

from interceptor_core.context import ToolCall
from interceptor_core.decisions import RequireApproval

__all__ = ["FrameworkApproval", "framework_asks"]

_asked: contextvars.ContextVar[str | None] = contextvars.ContextVar("callgate_framework_asks", default=None)
"""Why the framework asks about the call in flight (None: it does not)."""


class FrameworkApproval:
    """Requires approval of a call while its framework asks for one (see the module docstring).

    Its `name` (say "pydantic-ai-approval") is what the events' `requested_by` carries. Stateless;
    safe from many tasks."""

    def __init__(self, framework: str) -> None:
        self.name = f"{framework}-approval"

    def before_tool_call(self, call: ToolCall) -> RequireApproval | None:
        reason = _asked.get()
        return None if reason is None else RequireApproval(reason)


@contextmanager
def framework_asks(reason: str | None) -> Iterator[None]:
    """Within the block, `FrameworkApproval` requires approval of the calls made from this task
    (and the tasks it starts), for `reason`; None leaves the chain alone."""
    token = _asked.set(reason)
    try:
        yield
    finally:
        _asked.reset(token)
