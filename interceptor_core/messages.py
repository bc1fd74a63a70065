"""The model side of the agent loop: messages, turns, the `Model` protocol and `ScriptedModel`.

OpenAI-shaped and small. A `Model` gets the conversation and the tool definitions a scope exposes,
and answers with a `ModelTurn`: text, tool calls, or both.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeAlias, runtime_checkable

from interceptor_core.context import new_id
from interceptor_core.exceptions import CallgateError

Role: TypeAlias = Literal["user", "assistant", "tool", "system"]


@dataclass(frozen=True, slots=True)
class ToolCallRequest:
    """One tool call a model asked for: its id (echoed in the tool message), name and arguments."""

    id: str
    name: str
    args: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Message:
    """One message of the conversation.

    `tool_calls` only on assistant messages; `tool_call_id` only on tool messages (the id of the
    request it answers).
    """

    role: Role
    content: str | None = None
    tool_calls: Sequence[ToolCallRequest] = ()
    tool_call_id: str | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        # Accept a list for convenience; keep the frozen value immutable.
        if not isinstance(self.tool_calls, tuple):
            object.__setattr__(self, "tool_calls", tuple(self.tool_calls))


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens a model turn consumed, and its cost if the model knows it."""

    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cost_usd + other.cost_usd,
        )


@dataclass(frozen=True, slots=True)
class ModelTurn:
    """What a model answered: text, tool calls (run concurrently by the loop), usage."""

    text: str | None = None
    tool_calls: Sequence[ToolCallRequest] = ()
    usage: Usage | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.tool_calls, tuple):
            object.__setattr__(self, "tool_calls", tuple(self.tool_calls))


@runtime_checkable
class Model(Protocol):
    """Anything that can take a turn: `complete(messages, tools) -> ModelTurn`.

    `tools` are `Tool.definition()` dicts. May raise; the agent loop lets the error end the run.
    """

    async def complete(self, messages: list[Message], tools: list[dict[str, Any]]) -> ModelTurn: ...


ScriptStep: TypeAlias = (
    "ModelTurn | Callable[[list[Message]], ModelTurn] | Callable[[list[Message]], Awaitable[ModelTurn]]"
)


class ScriptExhaustedError(CallgateError):
    """A `ScriptedModel` was asked for more turns than its script has."""


class ScriptedModel:
    """A deterministic model: one script entry per turn, for tests and demos.

    An entry is a `ModelTurn`, or a callable (sync or async) that gets the messages so far and
    returns one (so a script can react to tool results). `calls` records what each turn saw.
    Raises `ScriptExhaustedError` past the end of the script.
    """

    def __init__(self, script: Sequence[Any]) -> None:
        self.script = list(script)
        self.calls: list[tuple[list[Message], list[dict[str, Any]]]] = []

    async def complete(self, messages: list[Message], tools: list[dict[str, Any]]) -> ModelTurn:
        index = len(self.calls)
        self.calls.append((list(messages), list(tools)))
        if index >= len(self.script):
            raise ScriptExhaustedError(f"the script has {len(self.script)} turns; turn {index + 1} was asked for")
        step = self.script[index]
        turn = step(list(messages)) if callable(step) else step
        if inspect.isawaitable(turn):
            turn = await turn
        if not isinstance(turn, ModelTurn):
            raise TypeError(f"script entry {index} gave {type(turn).__name__}, not a ModelTurn")
        return turn


def call(name: str, args: dict[str, Any] | None = None, *, id: str | None = None) -> ToolCallRequest:
    """Shorthand for a `ToolCallRequest` with a fresh id (handy in scripts)."""
    return ToolCallRequest(id=id or f"call_{new_id()[-12:]}", name=name, args=dict(args or {}))
