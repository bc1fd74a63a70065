"""callgate's gate: one mediated path between an agent and every tool it can reach.

Importing this package loads no transport (Kafka, DuckDB, OpenTelemetry, Streamlit).
"""

from typing import Any

from interceptor_core.agent import Agent, AgentResult, ToolCallRecord
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
from interceptor_core.interceptors import Interceptor, after_tool_call, before_tool_call, shadow
from interceptor_core.messages import Message, Model, ModelTurn, ScriptedModel, ToolCallRequest, Usage
from interceptor_core.results import DecisionRecord, ToolResult
from interceptor_core.tools import Tool, tool

__all__ = [
    "Agent",
    "AgentResult",
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
    "Message",
    "Model",
    "ModelTurn",
    "OpenAIChatModel",
    "RequireApproval",
    "Rewrite",
    "RunContext",
    "ScopePath",
    "ScriptedModel",
    "Substitute",
    "Tool",
    "ToolApprovalRequiredError",
    "ToolBlockedError",
    "ToolCall",
    "ToolCallRecord",
    "ToolCallRequest",
    "ToolContext",
    "ToolResult",
    "TurnDeniedError",
    "UnmediatedAccess",
    "UnmediatedAccessError",
    "Usage",
    "Workflow",
    "after_tool_call",
    "before_tool_call",
    "shadow",
    "tool",
]


def __getattr__(name: str) -> Any:
    # OpenAIChatModel needs httpx: loaded only when asked for.
    if name == "OpenAIChatModel":
        from interceptor_core.openai_model import OpenAIChatModel

        return OpenAIChatModel
    raise AttributeError(f"module 'interceptor_core' has no attribute {name!r}")
