"""Helpers for testing interceptors and gates: no broker, no model, no network.

- `check_before(interceptor, tool, args)` / `check_after(interceptor, tool, args, output)` run one
  interceptor's handler exactly as the gate would call it, without a gate, and hand back what it
  returned (`None` becomes `Allow()`); whatever it raises propagates, so a test sees it.
- `RecordingInterceptor` records every call it sees and returns a decision you choose.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from interceptor_core.context import RunContext, ScopePath, ToolCall, new_id
from interceptor_core.decisions import Allow, Decision
from interceptor_core.exceptions import ConfigurationError
from interceptor_core.interceptors import bind_interceptor
from interceptor_core.tools import Tool


def make_call(
    tool: Tool[Any, Any],
    args: Mapping[str, Any] | BaseModel,
    *,
    run: RunContext | None = None,
    call_id: str | None = None,
    gate: str = "test",
    workflow: str | None = None,
    agent: str | None = None,
) -> ToolCall:
    """A `ToolCall` as an interceptor would receive it; `args` are validated against the tool's model."""
    model = args if isinstance(args, tool.input_model) else tool.input_model.model_validate(args)
    return ToolCall(
        tool,
        model,
        run if run is not None else RunContext(),
        call_id or new_id(),
        ScopePath(gate, workflow, agent, tool.name),
    )


async def check_before(
    interceptor: object,
    tool: Tool[Any, Any],
    args: Mapping[str, Any] | BaseModel,
    *,
    run: RunContext | None = None,
    **scope: Any,
) -> Decision | object:
    """Run `interceptor.before_tool_call` on a call of `tool` with `args`; return its decision
    (`Allow()` for `None`, anything else as returned, so a test can catch a non-decision)."""
    bound = bind_interceptor(interceptor, "application")
    if bound.before is None:
        raise ConfigurationError(f"interceptor {bound.name!r} has no before_tool_call", interceptor=bound.name)
    result = bound.before(make_call(tool, args, run=run, **scope))
    if inspect.isawaitable(result):
        result = await result
    return Allow() if result is None else result


async def check_after(
    interceptor: object,
    tool: Tool[Any, Any],
    args: Mapping[str, Any] | BaseModel,
    output: Any,
    *,
    run: RunContext | None = None,
    **scope: Any,
) -> Any:
    """Run `interceptor.after_tool_call` on `output` of a call of `tool`; return the new output."""
    bound = bind_interceptor(interceptor, "application")
    if bound.after is None:
        raise ConfigurationError(f"interceptor {bound.name!r} has no after_tool_call", interceptor=bound.name)
    result = bound.after(make_call(tool, args, run=run, **scope), output)
    if inspect.isawaitable(result):
        result = await result
    return result


@dataclass(frozen=True, slots=True)
class SeenCall:
    """One call a `RecordingInterceptor` saw: which handler, the tool, the args as it saw them."""

    phase: str
    interceptor: str
    tool: str
    call_id: str
    args: dict[str, Any]
    output: Any = None


class RecordingInterceptor:
    """Records every call it sees, in order, and returns `decision` (default: allow).

    `log` may be shared between several recorders to capture their relative order. Safe from
    several tasks and threads.
    """

    def __init__(
        self,
        name: str = "recorder",
        *,
        decision: Decision | None = None,
        log: list[SeenCall] | None = None,
        mandatory: bool = False,
        after: bool = True,
    ) -> None:
        self.name = name
        self.decision = decision
        self.mandatory = mandatory
        self.log: list[SeenCall] = log if log is not None else []
        self._lock = threading.Lock()
        if not after:
            # No after handler at all, so the gate sees a before-only interceptor.
            self.after_tool_call = None  # type: ignore[assignment]

    def before_tool_call(self, call: ToolCall) -> Decision | None:
        with self._lock:
            self.log.append(SeenCall("before", self.name, call.tool_name, call.call_id, dict(call.args)))
        return self.decision

    def after_tool_call(self, call: ToolCall, output: Any) -> Any:
        with self._lock:
            self.log.append(SeenCall("after", self.name, call.tool_name, call.call_id, dict(call.args), output))
        return output

    @property
    def calls(self) -> list[SeenCall]:
        """What this recorder saw (a shared log filtered to it)."""
        return [seen for seen in self.log if seen.interceptor == self.name]
