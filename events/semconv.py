"""Attribute, span and span-event names that `events.otel.OtelSink` writes, as plain strings.

The `gen_ai.*` names follow the OpenTelemetry GenAI semantic conventions for tool execution
(`execute_tool` spans). They are spelled out here rather than imported from
`opentelemetry-semantic-conventions`, whose `gen_ai` constants are marked deprecated/incubating
and would turn into warnings; this module is the one place they are written. Importing it loads
nothing.

The `callgate.*` names are this project's own; they are stable: dashboards and collector rules
match on them.
"""

from __future__ import annotations

from typing import Final

# -- OpenTelemetry semantic conventions ----------------------------------------------------------

GEN_AI_OPERATION_NAME: Final = "gen_ai.operation.name"
"""Always `EXECUTE_TOOL` on a call's span."""
GEN_AI_TOOL_NAME: Final = "gen_ai.tool.name"
GEN_AI_TOOL_CALL_ID: Final = "gen_ai.tool.call.id"
"""The gate's `call_id` of the call."""
GEN_AI_TOOL_TYPE: Final = "gen_ai.tool.type"
"""Always `TOOL_TYPE_FUNCTION`: callgate tools are functions the application runs."""
GEN_AI_AGENT_NAME: Final = "gen_ai.agent.name"
GEN_AI_TOOL_CALL_ARGUMENTS: Final = "gen_ai.tool.call.arguments"
"""JSON of the redacted arguments; only with `OtelSink(capture_args=True)`."""
GEN_AI_TOOL_CALL_RESULT: Final = "gen_ai.tool.call.result"
"""`sha256:<hex>` of the output (events hold no raw output); only with `capture_results=True`."""
ERROR_TYPE: Final = "error.type"
"""One of the `ERROR_*` values below, on spans whose status is ERROR."""
THREAD_NAME: Final = "thread.name"

EXECUTE_TOOL: Final = "execute_tool"
TOOL_TYPE_FUNCTION: Final = "function"
SPAN_NAME_PREFIX: Final = "execute_tool "
"""A call's span is named `execute_tool {tool}`."""

# -- callgate: the call's scope and run (set when the span starts) -------------------------------

GATE: Final = "callgate.gate"
WORKFLOW: Final = "callgate.workflow"
TENANT: Final = "callgate.tenant"
PRINCIPAL: Final = "callgate.principal"
RUN_ID: Final = "callgate.run_id"

# -- callgate: the call's outcome (set when the span ends) ---------------------------------------

DECISION: Final = "callgate.decision"
"""What the gate decided: one of the `DECISION_*` values below."""
DECIDED_BY: Final = "callgate.decided_by"
"""The interceptor (or validation / approval / registry / gate) that denied, substituted or blocked."""
EVENT_ID: Final = "callgate.event_id"
"""`event_id` of the call's outcome event: the join key to the audit store."""
OUTCOME: Final = "callgate.outcome"
"""For allowed calls, the `ToolUse` outcome: ok, error, timeout or cancelled."""
CAUSE: Final = "callgate.cause"
"""For denied and blocked calls, the event's `cause` (deny, validation, approval_refused, ...)."""
MESSAGE: Final = "callgate.message"
"""For denied calls only: the (redacted) message the model read."""
REASON: Final = "callgate.reason"
"""For blocked calls only: the (redacted) reason the run stopped."""

DECISION_ALLOWED: Final = "allowed"
"""`ToolUse`: the tool ran (whatever its outcome)."""
DECISION_DENIED: Final = "denied"
"""`ToolDenied`: the tool did not run; the model read a message."""
DECISION_SUBSTITUTED: Final = "substituted"
"""`Substitute`: an interceptor answered in place of the tool."""
DECISION_BLOCKED: Final = "blocked"
"""`Blocked`: the run was stopped at this call."""

# -- error.type values ---------------------------------------------------------------------------

ERROR_DENIED: Final = "denied"
"""A `ToolDenied` outcome, except an interrupted call (`callgate.cause` says which denial)."""
ERROR_BLOCKED: Final = "blocked"
"""A `Blocked` outcome (`callgate.cause` says which)."""
ERROR_TOOL: Final = "tool_error"
"""The tool raised, or its output did not match its declared type."""
ERROR_TIMEOUT: Final = "timeout"
"""The tool ran past its `timeout_s`."""
ERROR_INTERRUPTED: Final = "interrupted"
"""The call was cut short: cancelled, or an unexpected error in the gate."""
ERROR_OUTPUT_WITHHELD: Final = "output_withheld"
"""An after-interceptor failed, so the output (or a substitute) was withheld."""
ERROR_EVENT_MISSING: Final = "callgate.event_missing"
"""The gate could not build the call's outcome event; the span ends without its attributes."""
ERROR_UNEXPECTED_EVENT: Final = "callgate.unexpected_event"
"""The call ended with an event that is not an outcome type (a bug in the caller)."""
ERROR_UNMEDIATED: Final = "unmediated_access"
"""On `callgate.unmediated` spans."""

# -- span events: one per decision-trail step ----------------------------------------------------

DECISION_EVENT: Final = "callgate.decision"
"""Name of the span event written for each step of the decision trail, in order."""
STEP_INTERCEPTOR: Final = "callgate.interceptor"
STEP_SCOPE: Final = "callgate.scope"
STEP_KIND: Final = "callgate.kind"
"""allow, rewrite, deny, substitute, block, require_approval or error."""
STEP_PHASE: Final = "callgate.phase"
STEP_DURATION_MS: Final = "callgate.duration_ms"
STEP_ERROR: Final = "callgate.error"
"""Only when the step failed (it then failed closed)."""

# -- span events: approvals ----------------------------------------------------------------------

APPROVAL_REQUESTED_EVENT: Final = "callgate.approval.requested"
APPROVAL_RESOLVED_EVENT: Final = "callgate.approval.resolved"
APPROVAL_REASON: Final = "callgate.approval.reason"
APPROVAL_REQUESTED_BY: Final = "callgate.approval.requested_by"
APPROVAL_APPROVED: Final = "callgate.approval.approved"
APPROVAL_BY: Final = "callgate.approval.by"
APPROVAL_WAITED_MS: Final = "callgate.approval.waited_ms"
APPROVAL_ERROR: Final = "callgate.approval.error"

# -- the `callgate.unmediated` span --------------------------------------------------------------

UNMEDIATED_SPAN: Final = "callgate.unmediated"
"""A zero-duration span, status ERROR, for a guarded resource used outside a mediated call."""
CALL_ID: Final = "callgate.call_id"
"""On `callgate.unmediated` spans: the call that was active at the time, if any."""
RESOURCE: Final = "callgate.resource"
ATTRIBUTE: Final = "callgate.attribute"
BOUND_TOOLS: Final = "callgate.bound_tools"
SITE: Final = "callgate.site"
ACTIVE_TOOL: Final = "callgate.active_tool"
