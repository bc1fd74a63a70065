"""callgate's gate: one mediated path between an agent and every tool it can reach.

Importing this package loads no transport (Kafka, DuckDB, OpenTelemetry, Streamlit).
"""

from interceptor_core.approvals import Approval, ApprovalHandler, ApprovalRequest
from interceptor_core.context import RunContext, ScopePath, ToolCall, ToolContext
from interceptor_core.decisions import Allow, Block, Decision, Deny, RequireApproval, Rewrite, Substitute
from interceptor_core.exceptions import (
    CallgateError,
    ConfigurationError,
    CoverageError,
    LimitExceededError,
    ToolApprovalRequiredError,
    ToolBlockedError,
    TurnDeniedError,
    UnmediatedAccessError,
)
from interceptor_core.gate import AgentScope, Gate, Workflow
from interceptor_core.guard import CoverageReport, UnmediatedAccess
from interceptor_core.interceptors import Interceptor, after_tool_call, before_tool_call
from interceptor_core.results import DecisionRecord, ToolResult
from interceptor_core.tools import Tool, tool

__all__ = [
    "AgentScope",
    "Allow",
    "Approval",
    "ApprovalHandler",
    "ApprovalRequest",
    "Block",
    "CallgateError",
    "ConfigurationError",
    "CoverageError",
    "CoverageReport",
    "Decision",
    "DecisionRecord",
    "Deny",
    "Gate",
    "Interceptor",
    "LimitExceededError",
    "RequireApproval",
    "Rewrite",
    "RunContext",
    "ScopePath",
    "Substitute",
    "Tool",
    "ToolApprovalRequiredError",
    "ToolBlockedError",
    "ToolCall",
    "ToolContext",
    "ToolResult",
    "TurnDeniedError",
    "UnmediatedAccess",
    "UnmediatedAccessError",
    "Workflow",
    "after_tool_call",
    "before_tool_call",
    "tool",
]
