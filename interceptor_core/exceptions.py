"""Every error callgate raises. All derive from `CallgateError`.

Errors are for the caller's mistakes (`ConfigurationError`) and for stopping a run
(`ToolBlockedError`, `ToolApprovalRequiredError`, `LimitExceededError`). A tool's own failure is
never raised: it comes back as a `ToolResult` of kind "error".
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from interceptor_core.guard import CoverageReport


class CallgateError(Exception):
    """Root of every callgate error.

    Carries, where there is one, the tool, the call id and the interceptor that decided, so the
    person reading the traceback knows where to look.
    """

    def __init__(
        self,
        message: str,
        *,
        tool: str | None = None,
        call_id: str | None = None,
        interceptor: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.tool = tool
        self.call_id = call_id
        self.interceptor = interceptor

    def __str__(self) -> str:
        where = [
            f"{label}={value}"
            for label, value in (
                ("tool", self.tool),
                ("call_id", self.call_id),
                ("interceptor", self.interceptor),
            )
            if value is not None
        ]
        return f"{self.message} [{', '.join(where)}]" if where else self.message


class ConfigurationError(CallgateError):
    """A scope, tool or interceptor was built wrong; raised when it is built, never per call."""


class ToolBlockedError(CallgateError):
    """An interceptor returned `Block`: the whole run must stop. `reason` says why."""

    def __init__(self, reason: str, **where: Any) -> None:
        super().__init__(f"Run blocked: {reason}", **where)
        self.reason = reason


class ToolApprovalRequiredError(CallgateError):
    """A call needs a human's approval and the gate has no `approval_handler` to ask one."""

    def __init__(self, reason: str, **where: Any) -> None:
        super().__init__(f"Approval required and no approval handler is configured: {reason}", **where)
        self.reason = reason


class LimitExceededError(CallgateError):
    """A run went past one of its limits (tool calls, turns, cost)."""


class TurnDeniedError(CallgateError):
    """A before-turn interceptor denied the next model call; the run ends."""


class UnmediatedAccessError(CallgateError):
    """A guarded resource was used outside a mediated call of one of the tools it is bound to."""

    def __init__(self, message: str, *, resource: str, attribute: str, **where: Any) -> None:
        super().__init__(message, **where)
        self.resource = resource
        self.attribute = attribute


class CoverageError(CallgateError):
    """`Gate.assert_coverage()` found a violation; `report` holds the whole picture."""

    def __init__(self, report: CoverageReport) -> None:
        super().__init__(report.summary())
        self.report = report
