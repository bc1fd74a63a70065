"""What a call knows about itself: the run it belongs to, its scope path, its id."""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from interceptor_core.tools import Tool


_id_prefix = os.urandom(8).hex()
_id_counter = itertools.count(1)


def _reseed_ids() -> None:
    global _id_prefix, _id_counter
    _id_prefix = os.urandom(8).hex()
    _id_counter = itertools.count(1)


os.register_at_fork(after_in_child=_reseed_ids)


def new_id() -> str:
    """A unique 32-hex-digit id for runs and calls: a random per-process prefix and a counter.

    Cheaper than a UUID4 on the call path, unique across processes (the prefix is re-drawn in a
    forked child) and safe from several threads (`next` on a count is atomic).
    """
    return f"{_id_prefix}{next(_id_counter):016x}"


class RunContext(BaseModel):
    """Who an agent run acts for. Built once per run and passed to every call; immutable.

    The gate keeps no per-run state: two calls with the same `RunContext` are mediated
    independently.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    tenant: str | None = Field(default=None, description="The tenant the run acts for.")
    principal: str | None = Field(default=None, description="The user or service the run acts for.")
    run_id: str = Field(default_factory=new_id, description="Identifies one agent run.")
    thread_id: str | None = Field(default=None, description="A conversation spanning several runs.")
    metadata: Mapping[str, Any] = Field(default_factory=dict, description="Free-form, for interceptors.")


@dataclass(frozen=True, slots=True)
class ScopePath:
    """Where a call was made: application (gate), workflow, agent, tool."""

    gate: str
    workflow: str | None
    agent: str | None
    tool: str

    def __str__(self) -> str:
        return "/".join(part for part in (self.gate, self.workflow, self.agent, self.tool) if part)


@dataclass(slots=True)
class ToolContext:
    """Given to a tool that asks for it (a parameter annotated `ToolContext`).

    `call_id` is stable for the call: a tool with side effects uses it as its idempotency key.
    `report_cost` may be called from any thread the tool runs in.
    """

    run: RunContext
    call_id: str
    scope: ScopePath
    cost_usd: float = field(default=0.0)
    gate_id: int = field(default=0, repr=False)
    """Identifies the gate running the call (guards only accept their own gate's calls)."""

    @property
    def tool_name(self) -> str:
        """The name of the tool being called."""
        return self.scope.tool

    @property
    def scope_path(self) -> ScopePath:
        """The same as `scope`: gate, workflow, agent, tool."""
        return self.scope

    def report_cost(self, usd: float) -> None:
        """Add `usd` to what this call cost (the agent loop sums it into the run's budget)."""
        if usd < 0:
            raise ValueError(f"report_cost takes a non-negative amount, got {usd!r}")
        self.cost_usd += usd


class ToolCall:
    """What an interceptor receives: one call, its current arguments, its run and scope path.

    `args` is a read-only mapping of the validated arguments, current after every rewrite: change
    them by returning `Rewrite(...)`, never in place. `args_model` is the same as the input model's
    instance.
    """

    __slots__ = ("_args", "args_model", "call_id", "run", "scope", "tool")

    def __init__(
        self, tool: Tool[Any, Any], args_model: BaseModel, run: RunContext, call_id: str, scope: ScopePath
    ) -> None:
        self.tool = tool
        self.args_model = args_model
        self._args: Mapping[str, Any] | None = None
        self.run = run
        self.call_id = call_id
        self.scope = scope

    def _replace_args(self, args_model: BaseModel) -> None:
        self.args_model = args_model
        self._args = None

    @property
    def tool_name(self) -> str:
        """The called tool's name."""
        return self.tool.name

    @property
    def args(self) -> Mapping[str, Any]:
        """The validated arguments as a read-only mapping (built on first use)."""
        if self._args is None:
            self._args = MappingProxyType(self.args_model.model_dump())
        return self._args

    @property
    def scope_path(self) -> ScopePath:
        """The same as `scope`: gate, workflow, agent, tool."""
        return self.scope

    @property
    def workflow(self) -> str | None:
        """The workflow scope's name, if the call came through one."""
        return self.scope.workflow

    @property
    def agent(self) -> str | None:
        """The agent scope's name, if the call came through one."""
        return self.scope.agent

    def __repr__(self) -> str:
        return f"ToolCall(tool={self.tool.name!r}, call_id={self.call_id!r}, scope='{self.scope}')"
