"""`Agent`: a small agent loop whose every tool call goes through a scope's chain.

Each turn: the before-turn interceptors run on the conversation; the model sees the scope's tools
and answers; the tool calls of one turn run concurrently through `scope.call`; one tool message per
call follows, in the order of the calls, carrying `ToolResult.to_model_text()`. A turn without tool
calls ends the run.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, assert_never

from interceptor_core.context import RunContext, ToolContext
from interceptor_core.decisions import Allow, Block, Deny, RequireApproval, Rewrite, Substitute
from interceptor_core.exceptions import (
    CallgateError,
    ConfigurationError,
    LimitExceededError,
    ToolBlockedError,
    TurnDeniedError,
)
from interceptor_core.messages import Message, Model, ModelTurn, ToolCallRequest, Usage
from interceptor_core.results import DecisionRecord, ToolResult
from interceptor_core.tools import Tool

if TYPE_CHECKING:
    from interceptor_core.gate import AgentScope


@dataclass(frozen=True, slots=True)
class ToolCallRecord:
    """One tool call of a run: what the model asked (`request`) and what came back (`result`)."""

    request: ToolCallRequest
    result: ToolResult


@dataclass(frozen=True, slots=True)
class AgentResult:
    """The outcome of `Agent.run`: the final text, the whole conversation, every tool call, usage."""

    output: str | None
    messages: list[Message]
    tool_calls: list[ToolCallRecord]
    usage: Usage = field(default_factory=Usage)
    turns: int = 0
    cost_usd: float = 0.0


@dataclass(frozen=True, slots=True)
class _BoundTurnInterceptor:
    name: str
    handler: Any
    is_async: bool


def _bind_turn_interceptor(obj: object) -> _BoundTurnInterceptor:
    name = getattr(obj, "name", None) or type(obj).__name__
    handler = getattr(obj, "before_turn", None)
    if not callable(handler):
        raise ConfigurationError(
            f"before-turn interceptor {name!r} has no before_turn(messages) method", interceptor=name
        )
    return _BoundTurnInterceptor(str(name), handler, inspect.iscoroutinefunction(handler))


class Agent:
    """Drives `model` through `scope`'s tools.

    - `instructions`: the system message, if any.
    - `max_tool_calls`: tool calls requested over the run (denied ones count); a turn that would go
      past it runs none of its calls and ends the run with `LimitExceededError`.
    - `max_turns`: model turns; past it, `LimitExceededError`.
    - `max_cost_usd`: what tools reported (`ctx.report_cost`) plus what the model's usage says it
      cost; once spent, the run stops before the next model call with `LimitExceededError`.
    - `before_turn`: interceptors with `name` and `before_turn(messages)` (sync or async) returning
      `Allow()`/`None`, `Rewrite(messages)` (the model sees the replacement), `Deny(reason)` (the
      run ends with `TurnDeniedError`) or `Substitute(final_output)` (no model call; that is the
      final output). One that raises, times out or returns anything else fails closed, like a
      tool interceptor (`TurnDeniedError`, or `ToolBlockedError` when the gate blocks on errors).

    `run` raises `ToolBlockedError` when a call is blocked and lets `ToolApprovalRequiredError`
    through. An agent is reusable; runs do not share state.
    """

    def __init__(
        self,
        scope: AgentScope,
        model: Model,
        *,
        instructions: str = "",
        max_tool_calls: int = 20,
        max_turns: int = 50,
        max_cost_usd: float | None = None,
        before_turn: Sequence[object] = (),
    ) -> None:
        if max_tool_calls < 0 or max_turns < 1:
            raise ConfigurationError("max_tool_calls must be >= 0 and max_turns >= 1")
        self.scope = scope
        self.model = model
        self.instructions = instructions
        self.max_tool_calls = max_tool_calls
        self.max_turns = max_turns
        self.max_cost_usd = max_cost_usd
        self._before_turn = tuple(_bind_turn_interceptor(obj) for obj in before_turn)

    async def run(self, prompt: str | Sequence[Message], *, run: RunContext | None = None) -> AgentResult:
        """Run the conversation to its final answer (see the class docstring for how it ends)."""
        run = run if run is not None else RunContext()
        messages: list[Message] = []
        if self.instructions:
            messages.append(Message("system", self.instructions))
        if isinstance(prompt, str):
            messages.append(Message("user", prompt))
        else:
            messages.extend(prompt)
        tools = self.scope.definitions(run)
        records: list[ToolCallRecord] = []
        usage = Usage()
        cost = 0.0
        requested = 0
        for turn_no in range(1, self.max_turns + 1):
            if self.max_cost_usd is not None and cost >= self.max_cost_usd:
                raise LimitExceededError(
                    f"run budget spent: {cost:.4f} USD of max_cost_usd={self.max_cost_usd}", tool=None
                )
            seen, final = await self._run_before_turn(messages, run, turn_no)
            if final is not None:
                messages.append(Message("assistant", final))
                return AgentResult(final, messages, records, usage, turn_no, cost)
            turn = await self.model.complete(seen, tools)
            if not isinstance(turn, ModelTurn):
                raise TypeError(f"the model returned {type(turn).__name__}, not a ModelTurn")
            if turn.usage is not None:
                usage = usage + turn.usage
                cost += turn.usage.cost_usd
            messages.append(Message("assistant", turn.text, tool_calls=tuple(turn.tool_calls)))
            if not turn.tool_calls:
                return AgentResult(turn.text, messages, records, usage, turn_no, cost)
            if requested + len(turn.tool_calls) > self.max_tool_calls:
                raise LimitExceededError(
                    f"the model asked for {len(turn.tool_calls)} more tool calls after {requested}; "
                    f"max_tool_calls={self.max_tool_calls}"
                )
            requested += len(turn.tool_calls)
            outcomes = await asyncio.gather(
                *(self.scope.call(req.name, req.args, run=run) for req in turn.tool_calls), return_exceptions=True
            )
            stop: BaseException | None = None
            for req, outcome in zip(turn.tool_calls, outcomes, strict=True):
                if isinstance(outcome, BaseException):
                    # Every call of the turn has finished (and left its event); the first error
                    # that stops the run is raised once they all have.
                    stop = stop or outcome
                    continue
                records.append(ToolCallRecord(req, outcome))
                cost += outcome.cost_usd
                messages.append(Message("tool", outcome.to_model_text(), tool_call_id=req.id, name=req.name))
            if stop is not None:
                raise stop
        raise LimitExceededError(f"no final answer within max_turns={self.max_turns}")

    async def _run_before_turn(
        self, messages: list[Message], run: RunContext, turn_no: int
    ) -> tuple[list[Message], str | None]:
        """The messages the model sees and, on `Substitute`, the final output instead."""
        if not self._before_turn:
            return list(messages), None
        gate = self.scope.gate
        timeout = gate.interceptor_timeout_s
        seen = list(messages)
        trail: list[DecisionRecord] = []
        outcome, decided_by, reason = "allow", None, None
        final: str | None = None
        failure: tuple[str, str] | None = None
        for bound in self._before_turn:
            started = time.perf_counter()
            try:
                decision = bound.handler(list(seen))
                if bound.is_async or inspect.isawaitable(decision):
                    async with asyncio.timeout(timeout):
                        decision = await decision
                elapsed = time.perf_counter() - started
                if elapsed > timeout:
                    raise TimeoutError(f"ran {elapsed:.3f} s, past interceptor_timeout_s={timeout}")
            except Exception as exc:
                text = f"{type(exc).__name__}: {exc}" if str(exc) else f"no decision within {timeout} s"
                trail.append(
                    DecisionRecord(bound.name, "agent", "error", time.perf_counter() - started, "before", text)
                )
                failure = (bound.name, text)
                break
            elapsed = time.perf_counter() - started
            if decision is None:
                decision = Allow()
            if not isinstance(decision, Allow | Rewrite | Deny | Substitute | Block | RequireApproval):
                text = f"returned {type(decision).__name__}, not a decision"
                trail.append(DecisionRecord(bound.name, "agent", "error", elapsed, "before", text))
                failure = (bound.name, text)
                break
            trail.append(DecisionRecord(bound.name, "agent", decision.kind, elapsed))
            match decision:
                case Allow():
                    continue
                case Rewrite(args=replacement):
                    if not isinstance(replacement, list | tuple) or not all(
                        isinstance(m, Message) for m in replacement
                    ):
                        trail[-1] = DecisionRecord(
                            bound.name, "agent", "error", elapsed, "before", "rewrote the turn into non-messages"
                        )
                        failure = (bound.name, "rewrote the turn into something that is not a list of Message")
                        break
                    seen = list(replacement)
                    outcome, decided_by = "rewrite", bound.name
                case Deny(message=message):
                    outcome, decided_by, reason = "deny", bound.name, message
                    break
                case Substitute(result=result):
                    outcome, decided_by, final = "substitute", bound.name, str(result)
                    break
                case Block() | RequireApproval():
                    text = f"returned {decision.kind}, which a before-turn interceptor cannot return"
                    trail[-1] = DecisionRecord(bound.name, "agent", "error", elapsed, "before", text)
                    failure = (bound.name, text)
                    break
                case _:
                    assert_never(decision)
        if failure is not None:
            outcome, decided_by, reason = "error", failure[0], failure[1]
        audit = gate._audit
        if audit is not None:
            audit.turn_decision(self.scope, run, turn_no, outcome, decided_by, reason, trail, len(seen))
        if failure is not None:
            name, text = failure
            if gate.on_interceptor_error == "block":
                raise ToolBlockedError(
                    f"before-turn interceptor {name!r} failed ({text}); failing closed", interceptor=name
                )
            raise TurnDeniedError(f"before-turn interceptor {name!r} failed; failing closed ({text})", interceptor=name)
        if outcome == "deny":
            raise TurnDeniedError(f"the model call was denied: {reason}", interceptor=decided_by)
        return seen, final

    def as_tool(self, name: str, description: str, *, timeout_s: float | None = None) -> Tool[Any, Any]:
        """This agent as a tool of another scope: it takes a `prompt` and returns the agent's final
        output. The inner agent's calls go through its own scope's chain, in the same run, and
        their events name the outer call as parent."""
        agent = self

        async def ask(prompt: str, ctx: ToolContext) -> str:
            result = await agent.run(prompt, run=ctx.run)
            ctx.report_cost(result.cost_usd)
            return result.output or ""

        ask.__doc__ = description
        return Tool(ask, name=name, description=description, timeout_s=timeout_s)


__all__ = ["Agent", "AgentResult", "CallgateError", "ToolCallRecord"]
