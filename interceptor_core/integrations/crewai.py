"""CrewAI through the gate: `gate_tools` wraps CrewAI tools so that every call an agent makes of
them passes the chain before the tool runs.

```python
tools = gate_tools([write_file, delete_file], gate=gate, agent="writer", run=RunContext(tenant="acme"))
writer = crewai.Agent(role="writer", goal="...", backstory="...", llm=llm, tools=tools)
crewai.Crew(agents=[writer], tasks=[...]).kickoff()
```

Each `GatedTool` is a CrewAI `BaseTool` showing the model what the original shows (name,
description, the same `args_schema` class); the tools are registered in `gate.agent(agent)` (one
`ToolsRegistered` event) before `gate_tools` returns. CrewAI parses the model's action and
validates its input against `args_schema` first, as it does ungated (invalid input never reaches
the gate); the gate then decides, and only an allowed call runs the original's `_run` (sync, or
awaited when it is a coroutine function).

What CrewAI reports is what it would report ungated:

- a denial (and a failing interceptor, which fails closed) is the tool's observation: the model
  reads the denial's message in its next prompt, and CrewAI does not cache it;
- whatever the original raises is raised to CrewAI once the gate has recorded the call (a
  `ToolUse` with outcome "error"): CrewAI's own handling follows, which invokes the tool again
  (twice per attempt, three attempts) and then shows the model its error text; each invocation
  passes the gate, as each would run the tool ungated;
- a failure of the gate's own (a timeout, an after-interceptor or output check that failed) is the
  observation text, never a retry;
- `Block` ends the kickoff with `ToolBlockedError`, and `RequireApproval` with no
  `approval_handler` with `ToolApprovalRequiredError` (recorded as `Blocked`, cause
  "approval_required"). CrewAI catches every exception a tool raises, retries and turns it into
  text, then retries a failed task up to the agent's `max_retry_limit`; so the stopping error is
  kept by the executor's copy of the tool, raised again (without asking the gate) to CrewAI's
  retries, raised past them when CrewAI next reads the tool, and it spends what is left of the
  agent's retry budget (CrewAI's `Agent._times_executed`, which CrewAI never refills), so no
  model call follows the block. With `max_execution_time`, CrewAI wraps it in its own
  `RuntimeError` (the block is its `__cause__`). Under delegation the block ends the coworker's
  task, but CrewAI's own "Delegate work to coworker" tool (not a gated one) turns that into text
  for the delegating agent, whose run goes on.

`refuse_ungated_tools(gate)` adds a process-wide hook that refuses every CrewAI tool that is not
a `GatedTool` and records it as `Unmediated`, so the coverage check holds for every crew.

CrewAI 1.6's agents speak ReAct text: a tool call has no id, so the events' `call_id` is the
gate's own. The agent a call belongs to comes from CrewAI's process-wide before-tool-call hook,
which this module registers once (`crewai.hooks.register_before_tool_call_hook`); the hook never
refuses a call and never raises. The gate itself runs inside the tool, so a hook registry cleared
by someone else loses only the retry budget above, never the gate.

The `RunContext` of a call is `run`: a fixed one, or a function of CrewAI's hook context of the
call (`ToolCallHookContext`: `agent`, `task`, `crew`; None when the hook did not run, as for a
direct `GatedTool.run`), else a default one. The chain runs
on an event loop of the calling thread (CrewAI calls tools from sync code); a sync original runs
in that thread with no loop visible to it, as ungated, so `timeout_s` cannot interrupt it.

Needs `crewai` (1.6); importing `interceptor_core` does not load it.
"""

from __future__ import annotations

import asyncio
import atexit
import contextvars
import functools
import inspect
import threading
from asyncio import events as _loops
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar, assert_never

import pydantic_core

# crewai is no dependency of the dev extra (it holds back packages the other integrations use), so
# the type check runs with and without it: these ignores are for the run without it.
from crewai.hooks.tool_hooks import (  # type: ignore[import-not-found, unused-ignore]
    ToolCallHookContext,
    get_before_tool_call_hooks,
    register_before_tool_call_hook,
    unregister_before_tool_call_hook,
)
from crewai.tools import BaseTool  # type: ignore[import-not-found, unused-ignore]
from crewai.tools.structured_tool import CrewStructuredTool  # type: ignore[import-not-found, unused-ignore]
from pydantic import PrivateAttr

from interceptor_core.context import RunContext, ToolContext
from interceptor_core.exceptions import ToolApprovalRequiredError, ToolBlockedError
from interceptor_core.gate import AgentScope, Gate, Workflow
from interceptor_core.integrations._schema import SchemaArgs, schema_model
from interceptor_core.results import ToolResult
from interceptor_core.tools import Tool

__all__ = ["GatedTool", "gate_name", "gate_tools", "refuse_ungated_tools"]

T = TypeVar("T")

_STOPPING = (ToolBlockedError, ToolApprovalRequiredError)


def gate_name(name: str) -> str:
    """The gate's name for a CrewAI tool: CrewAI's name with every character the gate does not take
    in a tool name (spaces, quotes...) replaced by '_'. The events carry this name."""
    return "".join(c if c.isalnum() or c in "_-." else "_" for c in name.strip()) or "_"


# -- what the gate's tool body runs --------------------------------------------------------------


@dataclass(slots=True)
class _Pending:
    """CrewAI's side of one call, for the gate tool's body (run in a copy of the caller's context)."""

    parsed: dict[str, Any]
    """The arguments as CrewAI validated them (`args_schema`), what the original gets."""
    sent: Any
    """The same as JSON, as the gate got them: the body compares them with what it is given."""
    raised: Exception | None = None
    """What the original raised: raised again to CrewAI once the gate has recorded it."""


_pending: contextvars.ContextVar[_Pending | None] = contextvars.ContextVar("callgate_crewai_call", default=None)


def _outside_loop(fn: Callable[..., T], **kwargs: Any) -> T:
    """Call a sync original as CrewAI would, with no event loop running in the thread: the chain's
    loop is paused in this call, and a tool that starts a loop of its own (`asyncio.run`, as many
    CrewAI tools do) must not find it."""
    loop = _loops._get_running_loop()
    _loops._set_running_loop(None)
    try:
        return fn(**kwargs)
    finally:
        _loops._set_running_loop(loop)


def _gate_tool(original: BaseTool, name: str, timeout_s: float | None) -> Tool[Any, Any]:
    """The gate's tool for `original`: its description and `args_schema`'s JSON Schema, shown as is,
    with no schema check of its own (CrewAI validated the input already; a rewrite is validated by
    `args_schema` in the body, as CrewAI would)."""
    shown = schema_model(name, original.args_schema.model_json_schema())
    model = type(shown.__name__, (shown,), {"__module__": shown.__module__, "validate_schema": None})
    schema = original.args_schema
    run_original = original._run
    is_async = inspect.iscoroutinefunction(run_original)

    async def body(args: SchemaArgs, _ctx: ToolContext) -> Any:
        pending = _pending.get()
        if pending is None:
            raise RuntimeError(f"tool {name!r} of gate_tools was called outside CrewAI")
        if args.__pydantic_extra__ == pending.sent:
            kwargs = pending.parsed
        else:
            kwargs = schema.model_validate(args.model_dump()).model_dump()
        try:
            if is_async:
                return await run_original(**kwargs)
            output = _outside_loop(run_original, **kwargs)
            if inspect.iscoroutine(output):  # a sync `_run` handing back a coroutine, as CrewAI allows
                output = await output
            return output
        except Exception as exc:
            pending.raised = exc
            raise

    body.__annotations__ = {"args": model, "_ctx": ToolContext, "return": Any}
    body.__qualname__ = body.__name__ = f"{name}_via_crewai"
    return Tool(body, name=name, description=original.description, timeout_s=timeout_s)


# -- running the chain from CrewAI's sync code ---------------------------------------------------------

_idle_loops: list[asyncio.AbstractEventLoop] = []


def _run_sync(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run the coroutine `make()` builds to its end from sync code, and return its result.

    Where no loop runs in this thread (CrewAI's executor threads), on an idle event loop taken
    from a pool and given back (CrewAI starts threads per task and per crew: a loop per thread
    would die with it unclosed). Where one runs, on a worker thread with this thread's context,
    while this thread waits, as any sync call made there does.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return _on_idle_loop(make)
    return _offload().submit(contextvars.copy_context().run, _on_idle_loop, make).result()


def _on_idle_loop(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    try:
        loop = _idle_loops.pop()  # atomic: several threads share the pool without a lock
    except IndexError:
        loop = asyncio.new_event_loop()
    try:
        task = loop.create_task(make())
        # One turn of the loop runs the task's first step: a call whose chain never waits (sync
        # interceptors, a tool that does not suspend) is done then, which spares run_until_complete's
        # second turn.
        loop.call_soon(loop.stop)
        loop.run_forever()
        return task.result() if task.done() else loop.run_until_complete(task)
    finally:
        _idle_loops.append(loop)


@atexit.register
def _close_loops() -> None:
    while _idle_loops:
        _idle_loops.pop().close()


@functools.cache
def _offload() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(thread_name_prefix="callgate-crewai")


# -- the tools -----------------------------------------------------------------------------------------


class _Gating(NamedTuple):
    """What a `GatedTool` holds besides CrewAI's fields."""

    original: BaseTool
    scope: AgentScope
    name: str
    """The tool's name in the gate (`gate_name` of CrewAI's)."""
    run: RunSource
    default_run: RunContext


RunSource = RunContext | Callable[[ToolCallHookContext | None], RunContext] | None
"""Where the `RunContext` of a call comes from: a fixed one, a function of CrewAI's hook context of
the call (None where the hook did not run; what it raises fails the call before the gate, and
CrewAI handles it as a tool's error), or None (a default one)."""


def _run_of(gating: _Gating, context: ToolCallHookContext | None) -> RunContext:
    source = gating.run
    if isinstance(source, RunContext):
        return source
    if source is not None:
        return source(context)
    return gating.default_run


class _Marked(str):
    """Observation text the gate wrote (a denial, the gate's own failure): never cached by CrewAI."""

    __slots__ = ()


def _observation(result: ToolResult) -> Any:
    match result.kind:
        case "ok" | "substituted":
            return result.value
        case "denied" | "error":
            return _Marked(result.to_model_text())
        case _:
            assert_never(result.kind)


def _call(gating: _Gating, args: dict[str, Any], context: ToolCallHookContext | None) -> Any:
    """One call through the gate: CrewAI's validated `args` in, the observation (or the original's
    exception) out. Raises `ToolBlockedError` / `ToolApprovalRequiredError`."""
    sent = pydantic_core.to_jsonable_python(args)
    run = _run_of(gating, context)
    pending = _Pending(args, sent)
    token = _pending.set(pending)
    try:
        result = _run_sync(lambda: gating.scope.call(gating.name, sent, run=run))
    finally:
        _pending.reset(token)
    if pending.raised is not None:
        raise pending.raised
    return _observation(result)


class _ExecutorTool(CrewStructuredTool):  # type: ignore[misc, unused-ignore]
    """The copy of a `GatedTool` that one CrewAI agent executor calls (CrewAI makes one per task
    execution). Keeps the error that stopped the run, and raises it again to CrewAI's retries."""

    def __init__(self, gated: GatedTool) -> None:
        self._stopped: BaseException | None = None
        self._answer: bool = gated.result_as_answer
        self.hooked: ToolCallHookContext | None = None
        """CrewAI's hook context of the call in flight (its agent, task, crew), set by the hook."""
        super().__init__(
            name=gated.name,
            description=gated.description,
            args_schema=gated.args_schema,
            func=self._through_gate,
            result_as_answer=gated.result_as_answer,
            max_usage_count=gated.max_usage_count,
            current_usage_count=gated.current_usage_count,
        )
        self._original_tool = gated
        self._gating = gated._gating

    @property
    def result_as_answer(self) -> bool:
        # CrewAI reads this right after the tool's observation, outside the handlers that turn a
        # tool's exception into text: a stopped run ends here.
        if self._stopped is not None:
            raise self._stopped
        return self._answer

    @result_as_answer.setter
    def result_as_answer(self, value: bool) -> None:
        self._answer = value

    def cache_function(self, args: Any, result: Any) -> bool:
        """Whether CrewAI's cache may keep `result`: a tool's result, as ungated (CrewAI 1.6 caches
        every result of its executor's tools), never the gate's text, so a denied call is asked
        again rather than answered from the cache."""
        return not isinstance(result, _Marked)

    def _through_gate(self, **args: Any) -> Any:
        stopped = self._stopped
        if stopped is not None:
            raise stopped
        try:
            return _call(self._gating, args, self.hooked)
        except _STOPPING as exc:
            self._stopped = exc
            _spend_retries(getattr(self.hooked, "agent", None))
            raise


def _spend_retries(agent: Any) -> None:
    """Leave CrewAI no retry of the failed task, which would run the model again."""
    limit = getattr(agent, "max_retry_limit", None)
    if isinstance(limit, int) and isinstance(getattr(agent, "_times_executed", None), int):
        agent._times_executed = max(agent._times_executed, limit)


class GatedTool(BaseTool):  # type: ignore[misc, unused-ignore]
    """A CrewAI tool whose every call passes the gate before the original runs (see the module
    docstring). Built by `gate_tools`; CrewAI sees the original's name, description (as CrewAI
    rendered it), `args_schema` (the same class), `result_as_answer`, `max_usage_count` and
    `env_vars`; `scope` is the gate's agent scope. Calling `run` directly passes the gate too
    (then a block is raised as such). Safe from several threads and crews at once.
    """

    _gating: _Gating = PrivateAttr()

    @classmethod
    def wrap(
        cls,
        original: BaseTool,
        scope: AgentScope,
        name: str,
        run: RunSource = None,
        default_run: RunContext | None = None,
    ) -> GatedTool:
        """`original` gated by `scope`, where it is registered as `name`; `run` as for `gate_tools`,
        `default_run` for calls `run` says nothing about."""
        gated = cls(
            name=original.name,
            description=original.description,
            args_schema=original.args_schema,
            env_vars=original.env_vars,
            result_as_answer=original.result_as_answer,
            max_usage_count=original.max_usage_count,
            current_usage_count=original.current_usage_count,
        )
        # BaseTool renders its description ("Tool Name: ... Tool Arguments: ...") when built: the
        # original's was rendered already, and is what the model reads ungated.
        gated.description = original.description
        gated._gating = _Gating(original, scope, name, run, default_run or RunContext())
        return gated

    @property
    def scope(self) -> AgentScope:
        """The agent scope the tool is registered in."""
        return self._gating.scope

    @property
    def original(self) -> BaseTool:
        """The tool this one gates (never hand it to an agent: its calls would bypass the gate)."""
        return self._gating.original

    def _run(self, **kwargs: Any) -> Any:
        return _call(self._gating, self.args_schema.model_validate(kwargs).model_dump(), None)

    def to_structured_tool(self) -> CrewStructuredTool:
        _register_hook()
        return _ExecutorTool(self)


# -- CrewAI's before-tool-call hook ---------------------------------------------------------------


def _note_agent(context: ToolCallHookContext) -> None:
    """Tell a gated tool which agent, task and crew call it. Never refuses, never raises (CrewAI
    would log it and run the tool anyway)."""
    try:
        tool = context.tool
        if isinstance(tool, _ExecutorTool):
            tool.hooked = context
    except Exception:  # noqa: S110 - a hook must not fail; the gate decides in the tool itself
        pass


_hook_lock = threading.Lock()


def _register_hook() -> None:
    if _note_agent in get_before_tool_call_hooks():
        return
    with _hook_lock:
        if _note_agent not in get_before_tool_call_hooks():
            register_before_tool_call_hook(_note_agent)


class _RefuseUngated:
    """The before-tool-call hook of `refuse_ungated_tools`."""

    def __init__(self, gate: Gate, allow: frozenset[str]) -> None:
        self.gate = gate
        self.allow = allow

    def __call__(self, context: ToolCallHookContext) -> bool | None:
        try:
            if isinstance(context.tool, _ExecutorTool) or context.tool_name in self.allow:
                return None
            name = str(context.tool_name)
            # The gate's public record of a tool reached around it: a guard bound to no tool.
            around = self.gate.guard(_Ungated(name), name=f"crewai tool {name}", tools=())
            around.call()
        except Exception:  # noqa: S110 - UnmediatedAccessError, or anything else: refuse either way
            pass
        return False


class _Ungated:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def call(self) -> None:  # pragma: no cover - the guard refuses before it is reached
        raise RuntimeError(f"CrewAI tool {self.name!r} reached around the gate")


def refuse_ungated_tools(gate: Gate, *, allow: Sequence[str] = ()) -> Callable[[], None]:
    """Refuse every CrewAI tool call in this process whose tool is not a `GatedTool` (CrewAI's
    hooks are process-wide: every crew is covered), so no tool runs unmediated: the tool does not
    run, the model reads CrewAI's fixed text for a hooked-off call ("Tool execution blocked by
    hook. Tool: NAME"), and `gate` records an `Unmediated` event (resource "crewai tool NAME") that
    `gate.coverage()` and `callgate coverage` report. `allow`: CrewAI tool names let through
    ungated (CrewAI's own delegation tools, say). The hook never raises, and refuses when it fails.
    Returns a function that removes the hook."""
    hook = _RefuseUngated(gate, frozenset(allow))
    register_before_tool_call_hook(hook)

    def stop() -> None:
        unregister_before_tool_call_hook(hook)

    return stop


def gate_tools(
    tools: Sequence[BaseTool],
    *,
    gate: Gate | Workflow,
    agent: str = "crewai",
    run: RunSource = None,
    interceptors: Sequence[object] = (),
    timeout_s: float | None = None,
) -> list[GatedTool]:
    """Wrap CrewAI `tools` so their calls pass the gate; registers them in `gate.agent(agent)` (one
    `ToolsRegistered` event, each under `gate_name` of its CrewAI name) before returning. Raises
    `ConfigurationError` for names or schemas the gate cannot take (two tools whose gate names
    are the same, say). Hand only the returned tools to CrewAI agents. `run`: the calls'
    `RunContext`, or a function of CrewAI's hook context of each call (see the module docstring)."""
    names = [gate_name(t.name) for t in tools]
    scope = gate.agent(
        agent, tools=[_gate_tool(t, n, timeout_s) for t, n in zip(tools, names, strict=True)], interceptors=interceptors
    )
    _register_hook()
    default_run = RunContext()
    return [GatedTool.wrap(t, scope, n, run, default_run) for t, n in zip(tools, names, strict=True)]
