"""`CallgateMiddleware`: LangChain v1 agent middleware that passes every tool call through the gate.

Public as `interceptor_core.integrations.langchain.CallgateMiddleware`; it lives here because it
subclasses `langchain.agents.middleware.AgentMiddleware`, whose import (it loads langgraph) only
the middleware's users should pay for.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import ToolMessage
from langchain_core.tools import BaseTool
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command

from interceptor_core.approvals import ApprovalHandler
from interceptor_core.context import RunContext
from interceptor_core.gate import AgentScope, Gate, Workflow
from interceptor_core.integrations._langchain_calls import (
    PENDING,
    RETRY_TAG,
    AnsweredFailure,
    PendingCall,
    attempt_call_id,
    call_through_gate,
    gate_tool,
    outside_loop,
    run_of,
    run_sync,
)
from interceptor_core.results import ToolResult

__all__ = ["CallgateMiddleware"]

Reply = ToolMessage | Command[Any]

_ATTEMPTS = "_callgate_attempts"


class ToolErrorMessage(AnsweredFailure):
    """The tool ran and LangChain answered with an error `ToolMessage` (the tool raised and its
    `handle_tool_error` or the ToolNode handled it, or the arguments were invalid): the call's
    outcome is an error, and the model reads LangChain's message."""


class _HandlerCall(PendingCall):
    """One `wrap_tool_call`: LangChain's request and the handler that runs the tool."""

    __slots__ = ("failed", "handler", "message", "request")

    def __init__(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Reply] | Callable[[ToolCallRequest], Awaitable[Reply]],
        *,
        sync: bool,
    ) -> None:
        super().__init__(request.tool_call["name"], sync=sync)
        self.request = request
        self.handler = handler
        self.message: ToolMessage | None = None
        self.failed: ToolMessage | None = None

    async def execute(self, args: dict[str, Any]) -> Any:
        request = self.request
        if args != request.tool_call["args"]:
            request = request.override(tool_call={**request.tool_call, "args": args})
        if self.sync:
            reply = outside_loop(self.handler, request)
        else:
            reply = await self.handler(request)  # type: ignore[misc]
        if isinstance(reply, ToolMessage):
            if reply.status == "error":
                self.failed = reply
                raise ToolErrorMessage(str(reply.content))
            self.message = reply
            return reply.content
        return reply  # a Command (or a list of them): the chain and the audit see it as it is

    def reply(self, result: ToolResult) -> Any:
        """What goes back to the ToolNode for the gate's `result`."""
        if self.escaped is not None:
            raise self.escaped
        call = self.request.tool_call
        match result.kind:
            case "ok":
                message, value = self.message, result.value
                if message is None:
                    return value
                if value is message.content:
                    return message
                content = value if isinstance(value, str | list) else result.to_model_text()
                return message.model_copy(update={"content": content})
            case "substituted":
                return ToolMessage(result.to_model_text(), tool_call_id=call["id"], name=call["name"])
            case "error" if self.failed is not None:
                return self.failed  # LangChain's own text for the failure, as the model would read it ungated
            case "error" | "denied":
                return ToolMessage(result.to_model_text(), tool_call_id=call["id"], name=call["name"], status="error")


class CallgateMiddleware(AgentMiddleware):
    """Agent middleware that passes every tool call of a `create_agent` agent through the gate.

    `create_agent(model, tools=tools, middleware=[CallgateMiddleware(tools, gate=gate)])` is the
    whole wiring: `tools` are registered in `gate.agent(agent)` (one `ToolsRegistered` event) when
    the middleware is built, and each tool call the model makes passes the chain, with the model's
    `tool_call` id as the events' `call_id`, before LangChain runs the tool. A tool call of a name
    not among `tools` is an unknown tool to the gate (an error the model reads); the tools
    themselves stay `create_agent`'s (the middleware adds none).

    What the ToolNode gets back: the tool's own `ToolMessage` or `Command` for an allowed call
    (with an after-interceptor's change of its content); a `ToolMessage` with `status="error"` for
    a denial (the denial text), a failure LangChain answered (the tool's `handle_tool_error`), or
    invalid arguments; the substitute as the content of a `ToolMessage`; `Block` raises
    `ToolBlockedError`, which ends the run unless the ToolNode was told to handle every error. A
    tool's own exception means what it means ungated: the gate records the call's error outcome,
    then the exception goes on (the run raises, unless the tool's `handle_tool_error` answers it).
    A retry middleware listed before this one (`ToolRetryMiddleware`) retries a gated tool's
    exception; each attempt passes the chain and is its own call (`<id>#N` from the second).
    LangGraph's `interrupt()` inside a tool goes on as an interrupt (the call is recorded as an
    error; resuming calls the tool again, a new call).
    `RequireApproval` with no `approval_handler` on the gate pauses the run with `interrupt()`
    and `Command(resume=...)` answers it (the module docstring of
    `interceptor_core.integrations.langchain` gives the payload and the answer); the agent needs
    a checkpointer (`create_agent(..., checkpointer=...)`), else the call fails closed with
    `ToolApprovalRequiredError`. With `desk` (a `RemoteApprovals`), the run may also be resumed
    with `Command(resume={"approval_id": ...})`: the decision is then the reviewers' (console,
    command line, read API), fetched, checked and claimed by `desk` (see `DeskResume`).

    The `RunContext` of a call: the config's `configurable["callgate_run"]`, else the agent's
    `context=` when it is a `RunContext`, else `run`. Sync (`invoke`) and async (`ainvoke`) agents
    both work; from sync code the chain runs on a pooled event loop (`run_sync`).
    """

    def __init__(
        self,
        tools: Sequence[BaseTool],
        *,
        gate: Gate | Workflow,
        agent: str = "langchain",
        run: RunContext | None = None,
        interceptors: Sequence[object] = (),
        timeout_s: float | None = None,
        desk: ApprovalHandler | None = None,
    ) -> None:
        super().__init__()
        self.scope: AgentScope = gate.agent(
            agent, tools=[gate_tool(t, timeout_s) for t in tools], interceptors=interceptors
        )
        """The agent scope the tools are registered in."""
        self._default_run = run if run is not None else RunContext()
        self.desk = desk
        """What a resume that defers to the reviewers' desk (`{"approval_id": ...}`) asks for the
        decision: a `RemoteApprovals` (None: that answer is not accepted)."""

    @staticmethod
    def _call_id(request: ToolCallRequest) -> str | None:
        """The model's tool call id; from the second time the same request passes here (a retry
        middleware around this one, `ToolRetryMiddleware`, runs its handler again), `<id>#N`, so
        each attempt is its own call. Counted on the request itself: nothing outlives it."""
        attempt = getattr(request, _ATTEMPTS, 0) + 1
        object.__setattr__(request, _ATTEMPTS, attempt)  # ToolCallRequest warns on plain assignment
        return attempt_call_id(request.tool_call["id"], (f"{RETRY_TAG}{attempt}",) if attempt > 1 else None)

    def _run_of(self, request: ToolCallRequest) -> RunContext:
        runtime = request.runtime
        return run_of(getattr(runtime, "config", None), self._default_run, getattr(runtime, "context", None))

    def wrap_tool_call(self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], Reply]) -> Reply:
        """The sync path (`agent.invoke`, `stream`): the chain, then `handler` if allowed."""
        call = _HandlerCall(request, handler, sync=True)
        tool_call = request.tool_call
        run = self._run_of(request)
        call_id = self._call_id(request)
        token = PENDING.set(call)
        try:
            result = run_sync(
                lambda: call_through_gate(
                    self.scope, tool_call["name"], tool_call["args"], run=run, call_id=call_id, desk=self.desk
                )
            )
        finally:
            PENDING.reset(token)
        reply: Reply = call.reply(result)
        return reply

    async def awrap_tool_call(
        self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], Awaitable[Reply]]
    ) -> Reply:
        """The async path (`agent.ainvoke`, `astream`): the chain, then `handler` if allowed."""
        call = _HandlerCall(request, handler, sync=False)
        tool_call = request.tool_call
        token = PENDING.set(call)
        try:
            result = await call_through_gate(
                self.scope,
                tool_call["name"],
                tool_call["args"],
                run=self._run_of(request),
                call_id=self._call_id(request),
                desk=self.desk,
            )
        finally:
            PENDING.reset(token)
        reply: Reply = call.reply(result)
        return reply
